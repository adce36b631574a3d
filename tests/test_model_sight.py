"""Can the model flag anything? The public probe of a released model (monitor.model.sight)."""

from __future__ import annotations

import csv
from importlib import resources

import numpy as np
import pytest

from monitor.alarm.calibrate import alarm_levels
from monitor.config import AlarmSettings
from monitor.model import GridKNN
from monitor.model.sight import SIGHT_BLIND, model_sight

VITALS_BOUNDS = [(30, 220), (70, 100), (30, 42), (4, 40), (0, 10)]


def vitals() -> np.ndarray:
    with resources.files("monitor.data").joinpath("reference-vitals.csv").open() as fh:
        return np.array(list(csv.reader(fh))[1:], dtype=float)


def fit(rows: int, seed: int) -> GridKNN:
    return GridKNN(epsilon=1.0, bounds=VITALS_BOUNDS, contamination=0.05, random_state=seed).fit(vitals()[:rows])


@pytest.mark.parametrize("seed", [1, 3, 4])
def test_a_few_hundred_rows_are_blind_and_the_bundled_data_is_not(seed):
    small, full = fit(357, seed), fit(4000, seed)
    s_small = model_sight(small, *alarm_levels(small, AlarmSettings()))
    s_full = model_sight(full, *alarm_levels(full, AlarmSettings()))
    assert s_small.blind and s_small.sight < SIGHT_BLIND, s_small
    assert not s_full.blind and s_full.sight > 0.8 and s_full.flagged_share > 0.8, s_full
    # what would be enough: more rows or more epsilon, only for the blind one
    assert s_small.rows_needed > 1000 and s_small.epsilon_needed > 2.0, s_small
    assert s_full.rows_needed is None and s_full.advice() == ""


def test_the_probe_is_public_post_processing_of_the_model_file(tmp_path):
    """The model file alone gives the same measure: only released cells and public seeds go in."""
    m = fit(357, 1)
    m.save(tmp_path / "model.json")
    loaded = GridKNN.load(tmp_path / "model.json")
    levels = alarm_levels(m, AlarmSettings())
    assert alarm_levels(loaded, AlarmSettings()) == levels
    assert model_sight(loaded, *levels) == model_sight(m, *levels)


def test_a_blind_probe_matches_real_far_off_rows():
    """Rows with one feature far outside the normal range: a blind model leaves most of them
    under its upper level, a sighted one flags almost all."""
    rng = np.random.default_rng(7)
    X = vitals()
    far = X[rng.integers(0, 4000, 400)].copy()
    far[:, 3] = rng.uniform(34, 40, 400)  # resp_rate, normal about 12 to 22
    small, full = fit(357, 4), fit(4000, 4)
    t_small = alarm_levels(small, AlarmSettings())[1]
    t_full = alarm_levels(full, AlarmSettings())[1]
    assert (small.score_samples(far) > t_small).mean() < 0.2
    assert (full.score_samples(far) > t_full).mean() > 0.8


def test_data_that_fills_its_public_ranges_is_not_measured_and_not_called_blind(tmp_path, capsys):
    """Nowhere to push an event outside the reference data: the probe measures nothing, and neither the
    fit nor the visibility report (`monitor budget`, the start-up line) may call the model blind."""
    from monitor.budget.plan import visibility_report
    from monitor.cli import main
    from monitor.config import load_config

    # Half the rows spread over the whole cube but a hole around (25, 25, 25), the rest one blob.
    rng = np.random.default_rng(3)
    U = rng.uniform(0, 100, (24000, 3))
    U = U[np.linalg.norm(U - 25, axis=1) > 18][:4000]
    X = np.r_[U, np.clip(rng.normal(65, 8, (4000, 3)), 0, 100)]
    m = GridKNN(epsilon=1.0, bounds=[(0, 100)] * 3, contamination=0.05, random_state=1).fit(X)
    s = model_sight(m, *alarm_levels(m, AlarmSettings()))
    assert s.probed == 0 and not s.has_room and not s.blind, s
    # events in the hole, inside every range, are flagged: the model is not blind
    d = rng.normal(0, 1, (200, 3))
    hole = 25 + d / np.linalg.norm(d, axis=1)[:, None] * rng.uniform(0, 8, (200, 1))
    assert (m.score_samples(hole) > alarm_levels(m, AlarmSettings())[1]).mean() > 0.5

    names = ("a", "b", "c")
    (tmp_path / "ref.csv").write_text("a,b,c\n" + "\n".join(",".join(f"{v:.3f}" for v in row) for row in X) + "\n")
    (tmp_path / "config.yaml").write_text(
        "features:\n" + "".join(f"  - {{name: {n}, min: 0, max: 100}}\n" for n in names)
        + f"model: {{path: {tmp_path / 'model.json'}}}\n"
        + f"budget: {{ledger: {tmp_path / 'l.sqlite'}, reference_ledger: {tmp_path / 'r.sqlite'}}}\n")
    assert main(["fit", "--config", str(tmp_path / "config.yaml"), "--reference", str(tmp_path / "ref.csv"), "--seed", "1"]) == 0
    out, err = capsys.readouterr()
    assert "sight: not measured" in out and "--labels COL" in out, out
    assert "blind" not in err, err
    vis = visibility_report(load_config(tmp_path / "config.yaml"), None)
    assert vis["blind"] is False and vis["sight"]["has_room"] is False, vis
    assert "BLIND" not in vis["summary"] and "weigh fully" in " ".join(vis.get("details", [])), vis
