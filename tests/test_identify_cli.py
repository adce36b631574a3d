"""`monitor identify`: answers printed, each one charged to the reference ledger, refusal when it is spent."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monitor.budget import ReferenceLedger
from monitor.cli import main


@pytest.fixture
def setup(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "features:\n  - {name: a, min: 0, max: 10}\n  - {name: b, min: 0, max: 10}\n"
        "budget:\n  reference_epsilon: 1.0\n  reference_ledger: ref.sqlite\n",
        encoding="utf-8",
    )
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(5, 0.3, (200, 2)), [[9.5, 0.5]]])
    ref = tmp_path / "ref.csv"
    ref.write_text("a,b\n" + "".join(f"{x:.4f},{y:.4f}\n" for x, y in X), encoding="utf-8")
    return tmp_path, cfg, ref, X


def _args(cfg, ref, *extra):
    return ["identify", "--config", str(cfg), "--reference", str(ref), "--beta", "4", "--radius", "0.05", *extra]


def test_one_record_is_answered_and_charged(setup, capsys):
    tmp, cfg, ref, X = setup
    record = json.dumps({"a": round(X[-1, 0], 4), "b": round(X[-1, 1], 4), "id": "p1"})
    rc = main(_args(cfg, ref, "--record", record, "--epsilon", "0.3", "--sensitive", "1", "--json", "--seed", "1"))
    assert rc == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(out) == 1 and out[0]["mechanism"] == "identify_sensitive" and out[0]["sensitive_k"] == 1
    assert out[0]["answer"] is True  # isolated reference record: its SP answer is right with probability ~1
    with ReferenceLedger(tmp / "ref.sqlite", 1.0) as ledger:
        entries = ledger.entries()
        assert [(e.purpose, e.epsilon, e.notion) for e in entries] == [("identify", 0.3, "sensitive:k=1")]
        assert "beta=4" in entries[0].note and "k=1" in entries[0].note
        # A sensitive-privacy answer is not epsilon-DP: it never spends the DP total of the fit.
        assert ledger.spent() == (0.0, 0.0) and ledger.spent("sensitive:k=1") == (0.3, 0.0)


def test_budget_reports_each_notion_apart(setup, capsys):
    tmp, cfg, ref, X = setup
    record = json.dumps({"a": 5.0, "b": 5.0})
    assert main(_args(cfg, ref, "--record", record, "--epsilon", "0.2", "--seed", "1")) == 0
    assert main(_args(cfg, ref, "--record", record, "--epsilon", "0.3", "--sensitive", "2", "--seed", "1")) == 0
    capsys.readouterr()
    assert main(["budget", "--config", str(cfg), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["reference"]
    assert report["epsilon_spent"] == pytest.approx(0.2)
    assert report["notions"]["dp"]["epsilon_spent"] == pytest.approx(0.2)
    assert report["notions"]["sensitive:k=2"]["epsilon_spent"] == pytest.approx(0.3)


def test_batch_stops_plainly_when_the_ledger_is_spent(setup, capsys):
    tmp, cfg, ref, X = setup
    batch = tmp / "records.jsonl"
    batch.write_text("".join(json.dumps({"a": float(a), "b": float(b)}) + "\n" for a, b in X[:5]), encoding="utf-8")
    rc = main(_args(cfg, ref, "--records", str(batch), "--epsilon", "0.4", "--seed", "2"))
    captured = capsys.readouterr()
    assert rc == 2
    assert "reference budget exhausted" in captured.err and "answered 2 of 5" in captured.err
    assert "Traceback" not in captured.err
    assert captured.out.count("anomaly") == 2 + 1  # two rows plus the title's "anomaly?"
    with ReferenceLedger(tmp / "ref.sqlite", 1.0) as ledger:
        assert ledger.spent()[0] == pytest.approx(0.8)
    # Nothing left for even one answer: refused before anything is computed or printed.
    rc = main(_args(cfg, ref, "--records", str(batch), "--epsilon", "0.4", "--json"))
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == "" and "answered 0 of 5" in captured.err


def test_csv_batch_and_table_output(setup, capsys):
    tmp, cfg, ref, X = setup
    batch = tmp / "records.csv"
    batch.write_text("b,a\n1,9\n5,5\n", encoding="utf-8")
    assert main(_args(cfg, ref, "--records", str(batch), "--epsilon", "0.2", "--include-record", "--seed", "3")) == 0
    out = capsys.readouterr().out
    assert "0.2-DP" in out and "spent 0.2" not in out and "spent 0.4 of 1 epsilon, 0.6 left" in out


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--record", '{"a": 1}', "--epsilon", "0.1"], "missing feature(s) ['b']"),
        (["--record", '{"a": 1, "b": "x"}', "--epsilon", "0.1"], "feature 'b' must be a finite number"),
        (["--record", "[1, 2]", "--epsilon", "0.1"], "expected a JSON object"),
        (["--record", '{"a": 1, "b": 2}', "--epsilon", "0"], "--epsilon must be a positive number"),
        (["--record", '{"a": 1, "b": 2}', "--epsilon", "0.1", "--sensitive", "0"], "--sensitive must be an integer >= 1"),
    ],
)
def test_user_errors_are_named(setup, capsys, extra, message):
    tmp, cfg, ref, _ = setup
    assert main(_args(cfg, ref, *extra)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp / "ref.sqlite").exists() or ReferenceLedger(tmp / "ref.sqlite", 1.0).spent()[0] == 0
