"""`monitor demo`: its configuration, its burst verdict, and a real end-to-end run."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from monitor.config import load_config
from monitor.stream.demo import ReleaseBoard, burst_verdict, write_demo_config
from monitor.stream.simulate import SimulationStats

REPO_CONFIG = "config.yaml"


def test_demo_config_is_valid_and_matches_the_repository_features(tmp_path):
    from pathlib import Path

    cfg = load_config(write_demo_config(tmp_path, "127.0.0.1:1234", window_seconds=2.0))
    assert cfg.stream.bootstrap_servers == "127.0.0.1:1234"
    assert cfg.window.size_seconds == 2.0
    assert cfg.model.path == tmp_path / "model.json"
    assert cfg.budget.ledger.parent == tmp_path
    repo = load_config(Path(__file__).resolve().parent.parent / REPO_CONFIG)
    assert cfg.features == repo.features
    # No window of a demo run may be suppressed: a full minute of windows fits the budget.
    eps, _ = cfg.release.window_cost(len(cfg.features))
    assert eps * 60 / cfg.window.size_seconds < cfg.budget.epsilon


def _record(start: float, flagged: float, outliers: float, top: list[str]) -> dict:
    return {
        "window_start": start, "window_end": start + 3.0,
        "outlier_count": {"value": outliers}, "flagged_count": {"value": flagged},
        "top_subspaces": [{"features": [f], "count": {"value": 1.0}} for f in top],
        "budget": {"epsilon_spent": 1.0, "epsilon_remaining": 9.0},
    }


def test_burst_verdict_compares_burst_windows_with_the_rest():
    stats = SimulationStats(first_ts=100.0, last_ts=130.0, burst_from=112.0, burst_to=118.0)
    records = [_record(t, 20.0 if 112 <= t < 118 else 7.0, 9.0 if 112 <= t < 118 else 1.0,
                       ["spo2", "heart_rate"] if 112 <= t < 118 else ["activity"]) for t in range(100, 133, 3)]
    v = burst_verdict(records, stats, epsilon_flagged=0.5)
    assert v.burst_windows == 2          # [112, 115) and [115, 118)
    assert v.other_windows == 8          # [100, 103) ... [127, 130); [130, 133) lies after the last event
    assert v.visible and v.flagged_in_burst == 20.0 and v.flagged_outside == 7.0
    assert v.burst_subspaces == ["spo2", "heart_rate"]
    # Within three noise standard deviations of the difference of means
    # (3 * sqrt(2) / 0.5 * sqrt(1/2 + 1/8) = 6.7) is not "visible": here 10.7 vs 6.3.
    quiet = [dict(r, flagged_count={"value": r["flagged_count"]["value"] / 3 + 4}) for r in records]
    assert not burst_verdict(quiet, stats, epsilon_flagged=0.5).visible


def test_release_board_line_marks_burst_windows():
    board = ReleaseBoard(burst_of=lambda s, e: 1.0 if s >= 112 else (0.25 if s >= 109 else 0.0))
    line = board.line(_record(112.0, 20.0, 9.0, ["spo2"]), 4)
    assert "flagged   20.0" in line and "spo2 (1.0)" in line and line.endswith("<- burst injected (whole window)")
    assert board.line(_record(109.0, 9.0, 2.0, []), 3).endswith("<- burst injected (25 % of it)")
    assert "burst" not in board.line(_record(100.0, 7.0, 1.0, []), 1)


@pytest.mark.broker
@pytest.mark.slow
def test_monitor_demo_runs_end_to_end_without_a_terminal(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "demo", "--duration", "12", "--no-live", "--workdir", str(tmp_path), "--seed", "3"],
        capture_output=True, text=True, timeout=90,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    released = int(re.search(r"windows released: (\d+)", out).group(1))
    assert released >= 3, out
    assert len(re.findall(r"^window +\d+ ", out, re.M)) == released
    assert "suppressed: 0" in out
    sent = re.search(r"events sent: (\d+) \((\d+) malformed on purpose\)", out)
    assert int(sent.group(1)) == 2400
    # Every malformed message went to the dead-letter topic, and nothing else did.
    dead = int(re.search(r"(\d+) dead letters", out).group(1))
    assert dead == int(sent.group(2)), out
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "model.json").exists()
