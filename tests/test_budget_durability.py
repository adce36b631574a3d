"""Crash safety and concurrency of the ledgers, with real processes.

This file is also the child program: run as a script it records windows (or reference
charges) in a loop until it is killed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monitor.budget import BudgetAccountant, Decision, ReferenceLedger, WindowLedger
from monitor.errors import BudgetExhausted

REPO = Path(__file__).resolve().parent.parent
WINDOW = 60.0
COST = (1.0, 1e-6)
# 10 windows per period, room for 5: the pattern mixes releases and suppressions.
BUDGET = dict(epsilon=5.0, delta=1e-5, period_seconds=600.0)


def _spawn(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, env=env)


# ----------------------------------------------------------------------- children


def _windows_child(ledger_path: str, log_path: str, max_windows: int) -> None:
    """The stream service's ledger protocol: republish, then decide-draw-record-publish."""
    ledger = WindowLedger(ledger_path)
    acc = BudgetAccountant(ledger, **BUDGET)
    rng = random.Random()
    with open(log_path, "a", encoding="utf-8") as log:

        def publish(entry) -> None:
            log.write(f"{entry.window_start}\t{entry.payload}\n")
            log.flush()
            ledger.mark_published(entry.window_start)

        for entry in ledger.unpublished():
            publish(entry)
        print("ready", flush=True)

        def payload(d: Decision) -> str:
            # Random padding: a torn write would show as a payload of the wrong length.
            return json.dumps({"window_start": d.window_start, "n": d.windows_in_period, **d.budget_record(), "pad": "x" * rng.randint(0, 3000)})

        start = ledger.last_window_end() or 0.0
        while start < max_windows * WINDOW:
            out = acc.release(start, start + WINDOW, COST, payload)
            if out.entry.released:
                publish(out.entry)
            start += WINDOW
    print("done", flush=True)


def _reference_child(ledger_path: str) -> None:
    ref = ReferenceLedger(ledger_path, epsilon_limit=5.0)
    n = 0
    try:
        while True:
            ref.charge("identify", 0.1, note=str(os.getpid()))
            n += 1
    except BudgetExhausted:
        print(n, flush=True)


# -------------------------------------------------------------------------- tests


def _check_window_ledger(ledger_path: Path, log_path: Path) -> int:
    with WindowLedger(ledger_path) as led:
        entries = led.entries()
        acc = BudgetAccountant(led, **BUDGET)
        # Every scheduled window exactly once, none skipped.
        assert [e.window_start for e in entries] == [i * WINDOW for i in range(len(entries))]
        released = [e for e in entries if e.released]
        for e in released:
            record = json.loads(e.payload)  # a partial row would not parse
            assert record["window_start"] == e.window_start
            n = sum(1 for r in released if e.window_end - 600.0 < r.window_end <= e.window_end)
            # The spend recorded at release equals the count of windows in its period:
            # a window charged twice would push it above.
            assert record["n"] == n <= 5
            assert record["epsilon_spent"] == pytest.approx(n * COST[0])
            assert (e.epsilon, e.delta) == COST
        if entries:
            end = entries[-1].window_end
            n_last = sum(1 for r in released if end - 600.0 < r.window_end <= end)
            assert acc.spent(end) == pytest.approx((n_last * COST[0], n_last * COST[1]))
        # Only the window in flight at the kill may be unpublished.
        unpublished = led.unpublished()
        assert len(unpublished) <= 1
        if unpublished:
            assert unpublished[0] == released[-1]
    # Whatever reached the "topic" is the stored record, byte for byte (republished or not).
    stored = {e.window_start: e.payload for e in released}
    lines = log_path.read_text(encoding="utf-8").split("\n")[:-1] if log_path.exists() else []
    for line in lines:
        start, payload = line.split("\t", 1)
        assert stored[float(start)] == payload
    return len(entries)


@pytest.mark.slow
def test_ledger_consistent_after_repeated_sigkill(tmp_path: Path) -> None:
    ledger_path, log_path = tmp_path / "ledger.sqlite", tmp_path / "published.log"
    rng = random.Random(4)
    sizes = []
    for _ in range(6):
        child = _spawn("windows", str(ledger_path), str(log_path), "1000000")
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.5))
        child.send_signal(signal.SIGKILL)
        child.wait()
        sizes.append(_check_window_ledger(ledger_path, log_path))
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0] > 0
    # A final clean run republishes the last in-flight window and continues.
    child = _spawn("windows", str(ledger_path), str(log_path), str(sizes[-1] + 20))
    assert child.communicate(timeout=60)[0].split() == ["ready", "done"]
    assert _check_window_ledger(ledger_path, log_path) == sizes[-1] + 20
    with WindowLedger(ledger_path) as led:
        assert led.unpublished() == []


def test_reader_sees_consistent_snapshots_while_a_process_writes(tmp_path: Path) -> None:
    ledger_path, log_path = tmp_path / "ledger.sqlite", tmp_path / "published.log"
    WindowLedger(ledger_path).close()
    child = _spawn("windows", str(ledger_path), str(log_path), "1500")
    seen = []
    with WindowLedger(ledger_path) as reader:
        while child.poll() is None:
            seen.append(len(reader.entries()))
            assert [e.window_start for e in reader.entries()][: seen[-1]] == [i * WINDOW for i in range(seen[-1])]
    assert child.wait() == 0
    assert seen == sorted(seen) and len(set(seen)) > 2
    assert _check_window_ledger(ledger_path, log_path) == 1500


def test_two_processes_charging_the_reference_ledger_never_overspend(tmp_path: Path) -> None:
    path = tmp_path / "reference.sqlite"
    ReferenceLedger(path, 5.0).close()
    children = [_spawn("reference", str(path)) for _ in range(2)]
    counts = [int(c.communicate(timeout=60)[0]) for c in children]
    assert sum(counts) == 50
    with ReferenceLedger(path, 5.0) as ref:
        assert len(ref.entries()) == 50
        assert ref.spent()[0] == pytest.approx(5.0)
        assert ref.remaining() == pytest.approx(0.0)


if __name__ == "__main__":
    if sys.argv[1] == "windows":
        _windows_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        _reference_child(sys.argv[2])
