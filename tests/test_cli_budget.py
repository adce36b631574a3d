"""`monitor budget | less`: the latest windows as a user reads them (issue 29.7).

A paging window's row in the ledger holds only its own share (the report, 0.45) while its
record says what the window charged in all (the page and the report, 0.95); the window
that opened a run holds 0 in its row. The table shows the record's whole charge and the
alarm state, and piped output keeps every timestamp whole.
"""

from __future__ import annotations

import json
import re

from monitor.budget import WindowLedger
from tests.test_first_hour import monitor, workdir  # noqa: F401 - fixture

START = 1_763_700_000.0


def _record(start: float, state: str, epsilon: float, report=None) -> str:
    return json.dumps({"window_start": start, "window_end": start + 2, "released_at": start + 2.5, "alarm": state == "fired",
                       "alarm_detail": {"state": state}, "report": report, "epsilon": epsilon, "delta": 0.0})


def test_latest_windows_show_the_whole_charge_the_alarm_state_and_whole_timestamps(workdir):  # noqa: F811
    with WindowLedger(workdir / "ledger.sqlite") as led:
        led.add_charge("alarm_run", START, START + 2, 0.6)
        led.record_release(START, START + 2, 0.0, 0.0, _record(START, "quiet", 0.6))  # opened the run
        led.add_charge("alarm_page", START + 2, START + 4, 0.5)
        led.record_release(START + 2, START + 4, 0.45, 0.0, _record(START + 2, "fired", 0.95, {"reason": "alarm"}))
        led.record_suppressed(START + 4, START + 6, reason="budget")
    res = monitor("budget", cwd=workdir)  # stdout is a pipe here, as with `| less`
    assert res.returncode == 0, res.stderr
    rows = {m.group(1): line for line in res.stdout.splitlines() if (m := re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", line))}
    quiet, fired, suppressed = (rows.get(f"2025-11-21T04:40:0{s}Z") for s in (0, 2, 4))
    assert quiet and fired and suppressed, res.stdout
    assert "quiet" in quiet.split() and "0.6" in quiet.split(), quiet
    assert "fired" in fired.split() and "0.95" in fired.split() and "0.45" not in fired.split(), fired
    assert "budget" in suppressed and "0" in suppressed.split(), suppressed
    assert "2025-11-21T04:40:04Z" in fired  # the end time, whole
    recent = json.loads(monitor("budget", "--json", cwd=workdir).stdout)["stream"]["recent"]
    assert [(w["alarm"], w["epsilon"]) for w in recent] == [("quiet", 0.6), ("fired", 0.95), (None, 0.0)]


def test_budget_shows_what_a_person_lost_since_the_ledger_began(workdir):  # noqa: F811
    # The period budget bounds one rolling period; a person present all along lost the sum.
    with WindowLedger(workdir / "ledger.sqlite") as led:
        for day in range(3):
            led.add_charge("alarm_run", START + day * 86400, START + day * 86400 + 2, 0.6)
            led.record_release(START + day * 86400, START + day * 86400 + 2, 0.45, 0.0, _record(START + day * 86400, "quiet", 1.05))
    res = monitor("budget", cwd=workdir)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "since the ledger began" in ln)
    assert "3.15" in line and "lifetime_epsilon" in line, line
    life = json.loads(monitor("budget", "--json", cwd=workdir).stdout)["stream"]["all_time"]
    assert abs(life["epsilon_spent"] - 3.15) < 1e-9 and life["epsilon_limit"] is None
