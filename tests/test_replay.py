"""`monitor replay` as a user runs it: a JSON-lines file in, one alert record per window out.

Real processes (`monitor fit`, `monitor replay`), real files and real ledgers: the
replay must page on a clustered surge, send a malformed line to the dead letters with
its reason, draw each backtest afresh in a ledger of its own by default, charge a given
ledger once however often the same range is replayed, refuse a ledger a running monitor
holds, and never leave a partial output file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from monitor.budget import WindowLedger
from monitor.data.traffic import Surge, Traffic

REPO = Path(__file__).resolve().parent.parent
T0 = 1_700_000_050.0  # not on the window grid: the first whole window starts at 1_700_000_100
WINDOW = 300.0
WINDOWS = 20
SURGE_AT = 15  # window index from T0's first whole window
FIRST = 1_700_000_100.0


def _monitor(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monitor", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("replay")
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["alarm"].update(baseline_warmup_seconds=12 * WINDOW)
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    fit = _monitor("fit", "--reference", str(REPO / "monitor/data/reference-vitals.csv"), "--seed", "1", cwd=tmp)
    assert fit.returncode == 0, fit.stderr
    traffic = Traffic(people=500, days=1, seed=3)
    surge = Surge(start=SURGE_AT, windows=2, share=0.3, kind="clustered", center=(84.0, 150.0))
    rng = np.random.default_rng(3)
    first = np.ceil(T0 / WINDOW) * WINDOW
    with open(tmp / "events.jsonl", "w") as f:
        f.write('{"device_id": "broken", "ts": "not a time"}\n')
        for i in range(WINDOWS):
            X, entities, _ = traffic.window(i, [surge])
            for x, e in zip(X, entities):
                event = {"device_id": e, "ts": float(first + i * WINDOW + rng.uniform(0, WINDOW - 1)),
                         **dict(zip(traffic.sim.feature_names, map(float, x)))}
                f.write(json.dumps(event) + "\n")
    return tmp


def _run(workdir: Path, out: str, *extra: str, start: str = str(T0), end: str = str(T0 + (WINDOWS + 1) * WINDOW)):
    return _monitor("replay", "--input", "events.jsonl", "--start", start, "--end", end, "--output", out, *extra, cwd=workdir)


def _replay(workdir: Path, out: str, *extra: str, **times: str) -> list[dict]:
    res = _run(workdir, out, *extra, **times)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in (workdir / out).read_text().splitlines()]


@pytest.fixture(scope="module")
def records(workdir) -> list[dict]:
    return _replay(workdir, "alerts.jsonl", "--ledger", "monitor-ledger.sqlite")


def test_replay_writes_every_window_in_order_and_pages_on_the_surge(workdir, records):
    starts = [r["window_start"] for r in records]
    assert len(records) == WINDOWS and starts == sorted(starts) and all(b - a == WINDOW for a, b in zip(starts, starts[1:]))
    assert all(isinstance(r["alarm"], bool) for r in records)
    states = [r["alarm_detail"]["state"] for r in records]
    assert states[:11] == ["warming_up"] * 11 and "fired" not in states[:SURGE_AT]
    assert states[SURGE_AT] == "fired" and records[SURGE_AT]["report"]["reason"] == "alarm"
    dead = (workdir / "alerts.jsonl.dead-letter.jsonl").read_text().splitlines()
    assert len(dead) == 1 and json.loads(dead[0])["line"] == 1 and json.loads(dead[0])["reason"] == "missing_field"


def test_replaying_the_same_range_into_a_given_ledger_charges_nothing_and_writes_what_was_stored(workdir, records):
    with WindowLedger(workdir / "monitor-ledger.sqlite") as led:
        before = led.charge_counts(-1e12, 1e12)
    again = _replay(workdir, "again.jsonl", "--ledger", "monitor-ledger.sqlite")
    assert again == records
    with WindowLedger(workdir / "monitor-ledger.sqlite") as led:
        assert led.charge_counts(-1e12, 1e12) == before


def test_a_backtest_gets_its_own_fresh_ledger_takes_iso_times_and_ends_with_a_summary(workdir, records):
    """Issue 29.2: `--start 2023-11-14T22:14:10Z` is accepted and echoed as written; a re-run draws
    afresh in OUTPUT.ledger.sqlite (the config's ledger untouched) and ends with a summary table."""
    config_ledger = workdir / "monitor-ledger.sqlite"
    mtime = config_ledger.stat().st_mtime_ns
    start, end = "2023-11-14T22:14:10Z", "2023-11-14T23:59:10+00:00"  # T0 and T0 + 21 windows
    res = _run(workdir, "bt.jsonl", start=start, end=end)
    assert res.returncode == 0, res.stderr
    assert "[2023-11-14T22:14:10Z, 2023-11-14T23:59:10Z)" in res.stderr and "e+09" not in res.stderr + res.stdout
    assert "fresh backtest ledger" in res.stderr and "bt.jsonl.ledger.sqlite" in res.stderr
    out = " ".join(res.stdout.split())
    assert "outside [--start, --end)" in out and " 0 outside" in out, out
    assert f"windows {WINDOWS} of 300 s, {WINDOWS} written" in out, out
    assert "pages 1" in out or "pages 2" in out, out
    assert "epsilon charged" in out and "detailed reports" in out and "bt.jsonl.ledger.sqlite" in out, out
    first = [json.loads(x) for x in (workdir / "bt.jsonl").read_text().splitlines()]
    assert [r["window_start"] for r in first] == [r["window_start"] for r in records]
    assert first != records  # drawn afresh, not the given ledger's stored records
    assert config_ledger.stat().st_mtime_ns == mtime
    with WindowLedger(workdir / "bt.jsonl.ledger.sqlite") as led:
        assert len(led.entries()) == WINDOWS
    charged = float(out.split("epsilon charged ")[1].split()[0])
    assert charged == pytest.approx(sum(r["epsilon"] for r in first), rel=1e-3)
    # the same backtest again: a fresh ledger again, so drawn afresh, not "already in the ledger"
    again = _replay(workdir, "bt.jsonl", start=start, end=end)
    assert again != first and len(again) == WINDOWS


def test_epoch_milliseconds_for_start_get_a_hint(workdir):
    res = _run(workdir, "ms.jsonl", start=str(int(T0 * 1000)))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "looks like milliseconds" in res.stderr and str(int(T0)) in res.stderr, res.stderr
    assert not (workdir / "ms.jsonl").exists()


def test_replay_over_windows_the_ledger_holds_as_suppressed_does_not_crash(workdir, records):
    """After a restart a ledger holds a `catch_up` span (no payload); replaying over it crashed."""
    ledger = workdir / "restarted.sqlite"
    with WindowLedger(ledger) as led:
        led.record_suppressed(FIRST + 2 * WINDOW, FIRST + 6 * WINDOW, reason="catch_up")
        led.record_suppressed(FIRST + 8 * WINDOW, FIRST + 9 * WINDOW, reason="budget")
    res = _run(workdir, "restarted.jsonl", "--ledger", str(ledger))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    written = [json.loads(x)["window_start"] for x in (workdir / "restarted.jsonl").read_text().splitlines()]
    skipped = {FIRST + i * WINDOW for i in (2, 3, 4, 5, 8)}
    assert len(written) == WINDOWS - 5 and not skipped & set(written)
    assert "5 suppressed in the ledger" in " ".join(res.stdout.split()), res.stdout


def test_replay_refuses_a_ledger_a_running_monitor_holds(workdir):
    """Replay into a live ledger spent that monitor's budget without a word."""
    from monitor.lockfile import LedgerLock

    ledger = workdir / "live.sqlite"
    (workdir / "live-out.jsonl").write_text("earlier output\n")
    with LedgerLock(ledger):  # as `monitor run` holds it
        res = _run(workdir, "live-out.jsonl", "--ledger", str(ledger))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"pid {os.getpid()}" in res.stderr and "running monitor" in res.stderr and "Leave out --ledger" in res.stderr
    assert (workdir / "live-out.jsonl").read_text() == "earlier output\n"
    assert not ledger.exists()


def test_a_failed_replay_leaves_no_partial_output(workdir, monkeypatch):
    from monitor.config import load_config
    from monitor.release import WindowReleaser
    from monitor.stream.replay import replay

    calls = []
    real = WindowReleaser.release

    def failing(self, window, released_at):
        calls.append(window.start)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        return real(self, window, released_at)

    monkeypatch.setattr(WindowReleaser, "release", failing)
    out = workdir / "failed.jsonl"
    with pytest.raises(OSError):
        replay(load_config(workdir / "config.yaml"), workdir / "events.jsonl", T0, T0 + (WINDOWS + 1) * WINDOW, out,
               workdir / "failed.dead.jsonl", rng=1)
    assert len(calls) == 5 and not out.exists()
    # neither the partial file nor the backtest ledger (the lock file stays, as for every ledger)
    assert not [p for p in workdir.glob("*failed.jsonl*") if not p.name.endswith(".lock")]
