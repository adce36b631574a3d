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
    # The demo runs at the shipped privacy settings, only on a faster schedule.
    a = cfg.alarm
    assert (a.epsilon_threshold, a.epsilon_page) == (repo.alarm.epsilon_threshold, repo.alarm.epsilon_page)
    assert cfg.report_cost() == repo.report_cost()
    # A minute of windows with two pages fits the budget: one baseline, one run, two pages and reports.
    assert a.epsilon_baseline_warmup + a.epsilon_threshold + 2 * (a.epsilon_page + cfg.report_cost()[0]) < cfg.budget.epsilon


def _record(start: float, state: str, grid: str | None = None) -> dict:
    report = None
    if state == "fired":
        report = {"reason": "alarm", "event_count": {"value": 200.0}, "flagged_count": {"value": 35.0},
                  "outlier_count": {"value": 2.0}, "top_grid": {"grid": grid, "flagged_count": {"value": 30.0}} if grid else None}
    return {
        "window_start": start, "window_end": start + 3.0, "alarm": state in ("fired", "held"),
        "alarm_detail": {"state": state}, "report": report, "charges": [],
        "budget": {"epsilon_spent": 1.0, "epsilon_remaining": 9.0},
    }


def test_burst_verdict_says_when_the_alarm_paged_and_where_the_report_pointed():
    stats = SimulationStats(first_ts=100.0, last_ts=130.0, burst_from=112.0, burst_to=118.0)
    states = {112: "fired", 115: "held"}
    records = [_record(t, states.get(t, "quiet"), "heart_rate+spo2") for t in range(100, 133, 3)]
    v = burst_verdict(records, stats)
    assert v.paged and v.burst_windows == 2 and v.first_page_delay == 3.0 and v.false_pages == 0
    assert v.top_grid == "heart_rate+spo2" and "PAGED 3.0 s after" in v.describe()
    late_false = [_record(t, "fired" if t == 124 else "quiet") for t in range(100, 133, 3)]
    v = burst_verdict(late_false, stats)
    assert not v.paged and v.false_pages == 1 and "NOT paged" in v.describe()


def test_release_board_line_marks_burst_windows_and_pages():
    board = ReleaseBoard(burst_of=lambda s, e: 1.0 if s >= 112 else (0.25 if s >= 109 else 0.0))
    line = board.line(_record(112.0, "fired", "heart_rate+spo2"), 4)
    assert "alarm PAGE" in line and "grid heart_rate+spo2 (30 flagged)" in line
    assert line.endswith("<- burst injected (whole window)")
    assert board.line(_record(109.0, "quiet"), 3).endswith("<- burst injected (25 % of it)")
    assert "burst" not in board.line(_record(100.0, "quiet"), 1)


@pytest.mark.broker
@pytest.mark.slow
def test_monitor_demo_pages_on_the_burst_end_to_end_without_a_terminal(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "demo", "--no-live", "--workdir", str(tmp_path), "--seed", "3"],
        capture_output=True, text=True, timeout=150,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    released = int(re.search(r"windows released: (\d+)", out).group(1))
    assert released >= 10, out
    assert len(re.findall(r"^window +\d+ ", out, re.M)) == released
    # What a user runs the demo for: the private alarm pages on the burst, and says what it cost.
    assert "PAGED" in out and "no false page" in out, out
    assert re.search(r"the alarm path spent epsilon [\d.]+ per person", out)
    sent = re.search(r"events sent: (\d+) \((\d+) malformed on purpose\)", out)
    assert int(sent.group(1)) == 6000  # the default 30 s, what a user runs
    # Every malformed message went to the dead-letter topic, and nothing else did.
    dead = int(re.search(r"(\d+) dead letters", out).group(1))
    assert dead == int(sent.group(2)), out
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "model.json").exists()
    # The showcase is clean: the fit's calibration holds enough rows for the alarm's level,
    # and no publication is called late for being on time.
    assert "warning:" not in out + proc.stderr and "too few held-apart rows" not in out + proc.stderr, out + proc.stderr
    assert "calibration (alarm.contamination 0.02)" in out and "sight: the model can flag" in out, out
    assert "published 0.0 s after" not in out + proc.stderr
