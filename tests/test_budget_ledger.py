"""WindowLedger: one row per window, first write wins, payloads stored byte for byte."""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.budget import LedgerError, ReferenceLedger, WindowLedger
from monitor.errors import MonitorError


@pytest.fixture
def ledger(tmp_path: Path):
    with WindowLedger(tmp_path / "ledger.sqlite") as led:
        yield led


def test_empty_ledger_is_created_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.sqlite"
    with WindowLedger(path) as led:
        assert led.get(0.0) is None
        assert led.last_window_end() is None
        assert led.entries() == [] and led.unpublished() == []
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2


def test_payload_round_trips_byte_for_byte(ledger: WindowLedger) -> None:
    payload = json.dumps({"value": 3.7000000000000002, "note": "spo\u2082 \u00e9", "x": [1e-300]}, ensure_ascii=False) + "  \n"
    ledger.record_release(1763700000.0, 1763700060.0, 1.0, 1.2e-6, payload)
    stored = ledger.get(1763700000.0)
    assert stored is not None and stored.payload == payload
    assert stored.payload.encode("utf-8") == payload.encode("utf-8")
    raw = b'{"a":1}'
    assert ledger.record_release(60.0, 120.0, 1.0, 0.0, raw).payload.encode() == raw


def test_second_record_of_a_window_changes_nothing(ledger: WindowLedger) -> None:
    first = ledger.record_release(0.0, 60.0, 1.0, 1e-6, '{"n": 1}')
    again = ledger.record_release(0.0, 60.0, 2.0, 2e-6, '{"n": 2}')
    suppressed_later = ledger.record_suppressed(0.0, 60.0, "budget")
    assert again == first and suppressed_later == first
    assert [(e.epsilon, e.payload) for e in ledger.entries()] == [(1.0, '{"n": 1}')]

    s = ledger.record_suppressed(60.0, 120.0, "budget")
    assert ledger.record_release(60.0, 120.0, 1.0, 1e-6, "{}") == s
    assert (s.status, s.epsilon, s.payload, s.reason) == ("suppressed", 0.0, None, "budget")


def test_unpublished_and_mark_published(ledger: WindowLedger) -> None:
    ledger.record_release(0.0, 60.0, 1.0, 0.0, "a")
    ledger.record_suppressed(60.0, 120.0, "budget")
    ledger.record_release(120.0, 180.0, 1.0, 0.0, "c")
    assert [e.window_start for e in ledger.unpublished()] == [0.0, 120.0]
    ledger.mark_published(0.0)
    ledger.mark_published(0.0)
    assert [e.window_start for e in ledger.unpublished()] == [120.0]
    assert ledger.get(0.0).published and not ledger.get(120.0).published
    assert ledger.last_window_end() == 180.0
    assert [e.window_start for e in ledger.entries(since=120.0)] == [120.0]
    assert ledger.counts(0.0, 180.0) == {"released": 2, "suppressed": 1}
    assert ledger.counts(60.0, 180.0) == {"released": 1, "suppressed": 1}


def test_entries_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with WindowLedger(path) as led:
        led.record_release(0.0, 60.0, 0.5, 1e-7, "x")
    with WindowLedger(path) as led:
        assert led.get(0.0).payload == "x" and led.get(0.0).epsilon == 0.5


def test_rejects_bad_windows_and_costs(ledger: WindowLedger) -> None:
    with pytest.raises(ValueError):
        ledger.record_release(60.0, 60.0, 1.0, 0.0, "x")
    with pytest.raises(ValueError):
        ledger.record_release(0.0, 60.0, -1.0, 0.0, "x")
    with pytest.raises(ValueError):
        ledger.record_release(0.0, 60.0, 1.0, 0.0, b"\xff")
    assert ledger.entries() == []


def test_refuses_foreign_corrupt_and_newer_files(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE users (name)")
    with pytest.raises(LedgerError, match="not a window ledger"):
        WindowLedger(other)

    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(MonitorError, match="cannot be opened"):
        WindowLedger(garbage)

    window = tmp_path / "window.sqlite"
    WindowLedger(window).close()
    with pytest.raises(LedgerError, match="not a reference ledger"):
        ReferenceLedger(window, 5.0)

    conn = sqlite3.connect(window)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    with pytest.raises(LedgerError, match="newer"):
        WindowLedger(window)


# Operations on a handful of window slots, so that re-records are frequent.
_ops = st.lists(
    st.tuples(st.sampled_from(["release", "suppress", "publish"]), st.integers(0, 5), st.floats(0.01, 2.0), st.text(max_size=8)),
    max_size=30,
)


@settings(max_examples=40, deadline=None)
@given(_ops)
def test_never_charged_twice_property(ops) -> None:
    model: dict[float, tuple[str, float, str | None]] = {}
    with tempfile.TemporaryDirectory() as d, WindowLedger(Path(d) / "l.sqlite") as led:
        for op, slot, eps, text in ops:
            start = slot * 60.0
            if op == "release":
                entry = led.record_release(start, start + 60, eps, 1e-7, text)
                model.setdefault(start, ("released", eps, text))
            elif op == "suppress":
                entry = led.record_suppressed(start, start + 60, "budget")
                model.setdefault(start, ("suppressed", 0.0, None))
            else:
                led.mark_published(start)
                continue
            assert (entry.status, entry.epsilon, entry.payload) == model[start]
        stored = {e.window_start: (e.status, e.epsilon, e.payload) for e in led.entries()}
        assert stored == model
        charged = sum(e.epsilon for e in led.charges(-1.0, 1e9))
        assert charged == pytest.approx(sum(v[1] for v in model.values()))


def test_last_released_skips_later_suppressed_windows(ledger: WindowLedger) -> None:
    assert ledger.last_released() is None
    ledger.record_release(0.0, 60.0, 1.0, 0.0, "a")
    ledger.record_suppressed(60.0, 120.0, "budget")
    last = ledger.last_released()
    assert (last.window_start, last.payload) == (0.0, "a")


def test_a_version_1_window_ledger_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE windows (window_start REAL PRIMARY KEY, window_end REAL NOT NULL, status TEXT NOT NULL, "
                 "epsilon REAL NOT NULL, delta REAL NOT NULL, payload BLOB, reason TEXT, recorded_at REAL NOT NULL, "
                 "published INTEGER NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO windows VALUES (0, 60, 'released', 1.0, 0.0, X'7B7D', NULL, 1.0, 1)")
    conn.execute("PRAGMA application_id=1146115889")  # "DPW1"
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    with WindowLedger(path) as led:
        assert led.charge_counts(-1, 61) == {(1.0, 0.0): 1}
        led.add_charge("alarm_run", 60, 3660, 0.8)
        assert led.charge_counts(-1, 120) == {(1.0, 0.0): 1, (0.8, 0.0): 1}


def test_a_span_charge_counts_in_every_period_it_touches_and_can_only_shrink(ledger: WindowLedger) -> None:
    run = ledger.add_charge("alarm_run", 100.0, 1000.0, 0.8)
    assert ledger.charge_counts(0, 150) == {(0.8, 0.0): 1}      # it started in the period
    assert ledger.charge_counts(900, 2000) == {(0.8, 0.0): 1}   # it still runs in the period
    assert ledger.charge_counts(1000, 2000) == {}               # it ended before the period
    ledger.end_charge(run, 400.0)
    assert ledger.charge_counts(500, 2000) == {}
    ledger.end_charge(run, 5000.0)  # never lengthened
    assert ledger.span_charges()[0][3] == 400.0
    ledger.record_release(0.0, 60.0, 0.0, 0.0, "{}")  # a free window costs nothing
    assert ledger.charge_counts(0, 150) == {(0.8, 0.0): 1}
