"""`monitor budget`: both ledgers as tables or JSON; plain words when nothing was spent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.budget import BudgetAccountant, ReferenceLedger, WindowLedger
from monitor.cli import main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "features: [{name: hr, min: 30, max: 220}]\n"
        "report: {top_h: 0, epsilon_count: 0.8, epsilon_flagged: 0.2, delta_count: 1.0e-6}\n"
        "budget: {period_seconds: 600, epsilon: 3.0, delta: 1.0e-5, accountant: basic,\n"
        "         ledger: ledgers/windows.sqlite, reference_epsilon: 5.0, reference_ledger: ledgers/reference.sqlite}\n"
    )
    return path


def test_missing_ledgers_say_nothing_spent(config_path: Path, capsys) -> None:
    assert main(["budget", "--config", str(config_path)]) == 0
    out = capsys.readouterr().out
    assert "nothing has been spent" in out and out.count("nothing has been spent") == 2
    assert not (config_path.parent / "ledgers" / "windows.sqlite").exists()  # reading creates nothing


def _fill(config_path: Path) -> None:
    ledgers = config_path.parent / "ledgers"
    with WindowLedger(ledgers / "windows.sqlite") as led:
        acc = BudgetAccountant(led, 3.0, 1e-5, 600.0)
        for i in range(6):
            acc.release(i * 60.0, i * 60.0 + 60, (1.0, 1e-6), lambda d: "{}")
        led.mark_published(0.0)
    with ReferenceLedger(ledgers / "reference.sqlite", 5.0) as ref:
        ref.charge("fit", 1.0, note="grid")
        ref.charge("identify", 0.25)


def test_json_report_of_both_ledgers(config_path: Path, capsys) -> None:
    _fill(config_path)
    assert main(["budget", "--config", str(config_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    s, r = report["stream"], report["reference"]
    assert s["at"] == 360.0 and s["accountant"] == "basic"
    assert s["in_period"] == {"released": 3, "suppressed": 3}
    assert s["epsilon_spent"] == 3.0 and s["epsilon_remaining"] == 0.0
    assert set(s["costs"]) == {"alarm_run", "alarm_page", "baseline", "report"} and s["costs"]["alarm_run"]["delta"] == 0.0
    assert s["unpublished"] == 2 and len(s["recent"]) == 6
    assert r["epsilon_spent"] == 1.25 and r["epsilon_remaining"] == 3.75
    assert [c["purpose"] for c in r["charges"]] == ["fit", "identify"]
    # A later point in time: the first windows have left the rolling period.
    assert main(["budget", "--config", str(config_path), "--json", "--at", "700"]) == 0
    later = json.loads(capsys.readouterr().out)["stream"]
    assert later["in_period"] == {"released": 2, "suppressed": 3} and later["epsilon_remaining"] == 1.0


def test_tables_through_the_real_entry_point(config_path: Path) -> None:
    _fill(config_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "monitor", "budget", "--config", str(config_path)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "3 / 3 in the period" in out.stdout
    assert "spent 1.25 of 5, 3.75 left" in out.stdout
    assert "suppressed (budget)" in out.stdout


def test_bad_config_exits_2(tmp_path: Path, capsys) -> None:
    assert main(["budget", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err
