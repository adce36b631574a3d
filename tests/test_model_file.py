"""The model file and the `monitor fit` / `monitor score` commands."""

from __future__ import annotations

import csv
import hashlib
import json

import numpy as np
import pytest

from monitor.cli import main
from monitor.model import GridKNN, ModelFileError
from monitor.model.file import _canonical

NAMES = ["heart_rate", "spo2", "skin_temp"]
BOUNDS = [(30.0, 220.0), (70.0, 100.0), (30.0, 42.0)]


@pytest.fixture
def model(tmp_path):
    X = np.random.default_rng(0).normal([70, 97, 36], [8, 1.5, 0.5], (3000, 3))
    m = GridKNN(bounds=BOUNDS, feature_names=NAMES, contamination=0.05, random_state=0).fit(X)
    path = tmp_path / "model.json"
    m.save(path)
    return m, path


def test_round_trip_gives_identical_scores_and_records_the_guarantee(model):
    m, path = model
    m2 = GridKNN.load(path)
    Y = np.random.default_rng(1).normal([70, 97, 36], [20, 4, 2], (500, 3))
    np.testing.assert_array_equal(m.score_samples(Y), m2.score_samples(Y))
    np.testing.assert_array_equal(m.predict(Y), m2.predict(Y))
    doc = json.loads(path.read_text())
    assert doc["version"] == 4 and doc["private"]["privacy"]["epsilon"] == 1.0
    assert doc["private"]["size"] == {"value": m.n_estimate_, "epsilon": 0.05, "mechanism": "laplace_global"}
    assert m2.n_estimate_ == m.n_estimate_ and m2.size_epsilon_ == 0.05
    assert doc["private"]["privacy"]["delta"] == 0.0
    assert [f["name"] for f in doc["private"]["features"]] == NAMES
    assert path.stat().st_size < 20_000


def test_check_features_refuses_other_names_or_bounds(model):
    m, path = model
    m2 = GridKNN.load(path)
    m2.check_features(NAMES, BOUNDS)
    with pytest.raises(ModelFileError, match="fitted on features"):
        m2.check_features(["heart_rate", "spo2", "temp"], BOUNDS)
    with pytest.raises(ModelFileError, match=r"spo2: model \[70.0, 100.0\] vs config \[60.0, 100.0\]"):
        m2.check_features(NAMES, [BOUNDS[0], (60.0, 100.0), BOUNDS[2]])


def _rewrite(path, edit, fix_checksum):
    doc = json.loads(path.read_text())
    edit(doc)
    if fix_checksum:
        doc["sha256"] = hashlib.sha256(_canonical(doc["private"])).hexdigest()
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("edit, fix, match", [
    (lambda d: d["private"]["grids"][0]["values"].__setitem__(0, 1e6), False, "checksum"),
    (lambda d: d["private"]["features"][0].__setitem__("max", 250.0), False, "checksum"),
    (lambda d: d.__setitem__("version", 99), False, "version 99"),
    (lambda d: d["private"]["grids"][0].__setitem__("keys", [5, 3]), True, "malformed"),
    (lambda d: d["private"].pop("grids"), True, "malformed"),
    (lambda d: d["private"]["privacy"].__setitem__("delta", 1e-5), True, "pure DP"),
    (lambda d: d["private"]["grids"][0].__setitem__("epsilon", 5.0), True, "add up to privacy.epsilon"),
    (lambda d: d["private"]["size"].__setitem__("epsilon", 0.5), True, "add up to privacy.epsilon"),
    (lambda d: d["private"].pop("size"), True, "malformed: 'size'"),
    (lambda d: d["scoring"].__setitem__("threshold", "high"), False, "threshold"),
    (lambda d: d["scoring"].__setitem__("contamination", 0.9), False, "contamination"),
])
def test_load_refuses_bad_files(model, edit, fix, match):
    _, path = model
    _rewrite(path, edit, fix)
    with pytest.raises(ModelFileError, match=match):
        GridKNN.load(path)


def test_version_2_file_still_loads_and_scores_alike(model):
    # A version 2 file (layout from d and epsilon only, no size release): the grids'
    # epsilons alone add up to privacy.epsilon. It loads and scores as before.
    m, path = model
    def as_v2(d):
        d["version"] = 2
        size = d["private"].pop("size")
        d["private"]["privacy"]["epsilon"] -= size["epsilon"]
    _rewrite(path, as_v2, True)
    old = GridKNN.load(path)
    Y = np.random.default_rng(3).normal([70, 97, 36], [20, 4, 2], (300, 3))
    np.testing.assert_array_equal(old.score_samples(Y), m.score_samples(Y))
    assert old.epsilon_spent_ == pytest.approx(0.95) and getattr(old, "n_estimate_", None) is None


def test_load_refuses_missing_and_non_json(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        GridKNN.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"format": "dp-grid-knn", "vers')
    with pytest.raises(ModelFileError, match="corrupt"):
        GridKNN.load(tmp_path / "bad.json")


# -- CLI ---------------------------------------------------------------------------------
CONFIG = """
features:
  - {name: heart_rate, min: 30, max: 220}
  - {name: spo2, min: 70, max: 100}
  - {name: skin_temp, min: 30, max: 42}
model: {epsilon: 1.0, contamination: 0.05}
"""


def _write_csv(path, X, extra_first_col=True):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id"] + ["skin_temp", "heart_rate", "spo2"])
        for i, r in enumerate(X):
            w.writerow([f"e{i}", r[2], r[0], r[1]])


def _cli_fit(tmp_path, data_seed, noise_seed):
    """`monitor fit` on 2000 vitals rows written to ref.csv; returns the rows and the model path."""
    (tmp_path / "config.yaml").write_text(CONFIG)
    X = np.random.default_rng(data_seed).normal([70, 97, 36], [8, 1.5, 0.5], (2000, 3))
    _write_csv(tmp_path / "ref.csv", X)
    out = tmp_path / "m.json"
    assert main(["fit", "--config", str(tmp_path / "config.yaml"), "--reference", str(tmp_path / "ref.csv"),
                 "--out", str(out), "--seed", str(noise_seed)]) == 0
    return X, out


def test_cli_fit_then_score_csv_and_npz(tmp_path, capsys):
    X, out = _cli_fit(tmp_path, 2, 3)
    m = GridKNN.load(out)
    assert m.feature_names_ == NAMES and m.threshold_ is not None
    Y = np.vstack([X[:5], [[200, 71, 41]]])
    _write_csv(tmp_path / "ev.csv", Y)
    assert main(["score", "--model", str(out), "--input", str(tmp_path / "ev.csv"),
                 "--output", str(tmp_path / "scored.csv"), "--config", str(tmp_path / "config.yaml")]) == 0
    rows = list(csv.reader(open(tmp_path / "scored.csv")))
    assert rows[0] == ["id", "skin_temp", "heart_rate", "spo2", "score", "flag"]
    assert rows[-1][0] == "e5" and rows[-1][-1] == "1"
    np.testing.assert_allclose([float(r[4]) for r in rows[1:]], m.score_samples(Y), rtol=1e-5)
    np.savez(tmp_path / "ev.npz", X=Y[:, [1, 0, 2]], feature_names=np.array(["spo2", "heart_rate", "skin_temp"]))
    capsys.readouterr()
    assert main(["score", "--model", str(out), "--input", str(tmp_path / "ev.npz")]) == 0
    assert "6 events scored" in capsys.readouterr().out


@pytest.mark.parametrize("content, match", [
    ("id,heart_rate,spo2\n1,70,97\n", "header lacks column(s) ['skin_temp']"),
    ("heart_rate,spo2,skin_temp\n70,97,36\n71,abc,36\n", "line 3, column 'spo2': 'abc' is not a number"),
    ("heart_rate,spo2,skin_temp\n70,97,36\n71,97\n", "line 3: 2 fields"),
    ("heart_rate,spo2,skin_temp\n70,nan,36\n", "not a finite number"),
])
def test_cli_fit_reports_malformed_reference(tmp_path, capsys, content, match):
    (tmp_path / "config.yaml").write_text(CONFIG)
    (tmp_path / "ref.csv").write_text(content)
    rc = main(["fit", "--config", str(tmp_path / "config.yaml"), "--reference", str(tmp_path / "ref.csv"),
               "--out", str(tmp_path / "m.json")])
    err = capsys.readouterr().err
    assert rc == 2 and match in err and "ref.csv" in err
    assert not (tmp_path / "m.json").exists()


def test_cli_score_refuses_model_for_other_features(model, tmp_path, capsys):
    _, path = model
    (tmp_path / "config.yaml").write_text(CONFIG.replace("spo2", "o2sat"))
    (tmp_path / "ev.csv").write_text("heart_rate,o2sat,skin_temp\n70,97,36\n")
    rc = main(["score", "--model", str(path), "--input", str(tmp_path / "ev.csv"),
               "--config", str(tmp_path / "config.yaml")])
    assert rc == 2 and "fitted on features" in capsys.readouterr().err


def test_cli_fit_charges_the_reference_ledger_and_stops_when_it_is_spent(tmp_path, capsys):
    from monitor.budget import ReferenceLedger

    # Budget for two fits of epsilon 1.0, not three.
    (tmp_path / "config.yaml").write_text(CONFIG + "budget: {reference_epsilon: 2.5}\n")
    _write_csv(tmp_path / "ref.csv", np.random.default_rng(4).normal([70, 97, 36], [8, 1.5, 0.5], (500, 3)))
    args = ["fit", "--config", str(tmp_path / "config.yaml"), "--reference", str(tmp_path / "ref.csv"), "--seed", "1"]
    assert main(args + ["--out", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert "reference budget: spent 1 of 2.5 (budget.reference_epsilon), 1.5 left: 1 more fit(s)" in out
    assert "model.threshold or model.contamination" in out
    assert main(args + ["--out", str(tmp_path / "b.json")]) == 0
    assert "spent 2 of 2.5" in capsys.readouterr().out
    assert main(args + ["--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "reference budget exhausted" in err and "Traceback" not in err
    # The refusal names the next steps: keep the model and change its threshold (free),
    # a smaller epsilon that fits what is left, or new reference data with a new ledger.
    assert "Next step: keep the model you have" in err and "model.threshold" in err
    assert "model.epsilon at most 0.5" in err and "budget.reference_ledger" in err
    assert not (tmp_path / "c.json").exists()
    with ReferenceLedger(tmp_path / "reference-ledger.sqlite", 2.5) as ledger:
        assert ledger.spent()[0] == pytest.approx(2.0)
        assert [e.purpose for e in ledger.entries()] == ["fit", "fit"]


def test_config_threshold_applies_to_an_existing_model_without_refit(tmp_path, capsys):
    from monitor.config import load_config
    from monitor.model import load_configured

    X, out = _cli_fit(tmp_path, 5, 6)
    fitted = GridKNN.load(out)
    _write_csv(tmp_path / "ev.csv", X[:200])
    ledger = tmp_path / "reference-ledger.sqlite"
    charged = ledger.read_bytes()
    # model.threshold in the config wins over the file's; no charge, no refit.
    (tmp_path / "t.yaml").write_text(CONFIG.replace("{epsilon: 1.0, contamination: 0.05}",
                                                    f"{{epsilon: 1.0, threshold: -1.0, path: {out}}}"))
    capsys.readouterr()
    assert main(["score", "--model", str(out), "--input", str(tmp_path / "ev.csv"), "--config", str(tmp_path / "t.yaml")]) == 0
    assert "flagged (score > -1): 200 (100.00 %)" in capsys.readouterr().out
    m = load_configured(load_config(tmp_path / "t.yaml"))
    assert m.threshold_ == -1.0 and m.grids_[0].values.tolist() == fitted.grids_[0].values.tolist()
    # A different contamination recomputes the threshold from the same noisy cells.
    (tmp_path / "c.yaml").write_text(CONFIG.replace("contamination: 0.05", f"contamination: 0.2, path: {out}"))
    assert load_configured(load_config(tmp_path / "c.yaml")).threshold_ < fitted.threshold_
    # A config that says nothing about the threshold keeps the file's.
    (tmp_path / "n.yaml").write_text(CONFIG.replace("{epsilon: 1.0, contamination: 0.05}", f"{{path: {out}}}"))
    assert load_configured(load_config(tmp_path / "n.yaml")).threshold_ == fitted.threshold_
    assert ledger.read_bytes() == charged


def test_cli_fit_shows_the_calibration_and_warns_when_too_few_rows_are_held_apart(tmp_path, capsys):
    # The user types `monitor fit` on a big and on a small reference file with contamination 0.05.
    (tmp_path / "config.yaml").write_text(CONFIG.replace("contamination: 0.05}", "contamination: 0.05}\nalarm: {contamination: 0.05}"))
    _write_csv(tmp_path / "big.csv", np.random.default_rng(3).normal([70, 90, 36], [8, 3, 0.5], (20000, 3)))
    assert main(["fit", "--config", str(tmp_path / "config.yaml"), "--reference", str(tmp_path / "big.csv"),
                 "--out", str(tmp_path / "big.json"), "--seed", "1"]) == 0
    big = capsys.readouterr()
    assert "calibration (model.contamination 0.05): threshold" in big.out
    assert "rank accuracy +-" in big.out and "should land within [0.025, 0.1]" in big.out
    assert "too few held-apart rows" not in big.err
    X = np.random.default_rng(4).normal([70, 97, 36], [8, 1.5, 0.5], (120, 3))
    _write_csv(tmp_path / "small.csv", X)
    assert main(["fit", "--config", str(tmp_path / "config.yaml"), "--reference", str(tmp_path / "small.csv"),
                 "--out", str(tmp_path / "small.json"), "--seed", "1"]) == 0
    err = capsys.readouterr().err
    assert "warning: calibration (model.contamination 0.05)" in err and "too few held-apart rows" in err
    assert "need about" in err and "model.calibration_share" in err


def test_cli_fit_warns_about_clipping_bounds_and_names_ignored_columns(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text(CONFIG)
    rng = np.random.default_rng(5)
    X = rng.normal([70, 97, 36], [8, 1.5, 0.5], (1000, 3))
    X[:300, 0] = 250.0  # 30 % of heart rates above the configured max of 220
    X[:, 1] = np.minimum(X[:, 1], 99.0)  # spo2 inside its bounds
    _write_csv(tmp_path / "ref.csv", X)  # has an extra "id" column
    assert main(["fit", "--config", str(tmp_path / "config.yaml"), "--reference", str(tmp_path / "ref.csv"),
                 "--out", str(tmp_path / "m.json"), "--seed", "1"]) == 0
    err = capsys.readouterr().err
    assert "clip more than 1 % of the reference rows of 1 feature(s): heart_rate: 30.0 %" in err
    assert "0.0 % below min 30, 30.0 % above max 220" in err and "spo2:" not in err.split("clip")[1].split(".")[0]
    assert "not stored in the model file" in err
    assert "1 column(s) that are not configured features, ignored: id" in err
    doc = json.loads((tmp_path / "m.json").read_text())
    assert "clip" not in json.dumps(doc)  # the exact shares never reach the file
