"""The window ledger: one durable row per scheduled window, released or suppressed.

The ledger is what makes "a window is released at most once" true across crashes
(docs/design.md#the-budget). The stream service records a window's alert record here *before* it
publishes it; after a crash it republishes the stored bytes (``unpublished()``),
never a fresh draw of noise, and the budget is never charged twice because the
window start is the primary key and a second record of the same window is a no-op.

>>> import tempfile, pathlib
>>> ledger = WindowLedger(pathlib.Path(tempfile.mkdtemp()) / "ledger.sqlite")
>>> e = ledger.record_release(0.0, 60.0, 1.0, 1e-6, '{"value": 3.2}')
>>> e.status, e.payload, e.published
('released', '{"value": 3.2}', False)
>>> ledger.record_release(0.0, 60.0, 1.0, 1e-6, '{"value": 9.9}').payload  # already there: unchanged
'{"value": 3.2}'
>>> [w.window_start for w in ledger.unpublished()]
[0.0]
>>> ledger.mark_published(0.0); ledger.unpublished()
[]
>>> ledger.close()
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, Sequence

from monitor.budget._sqlite import Transactions, open_ledger

__all__ = ["WindowLedger", "LedgerEntry", "Charge"]

_SCHEMA = [
    """CREATE TABLE windows (
        window_start REAL PRIMARY KEY,
        window_end   REAL NOT NULL,
        status       TEXT NOT NULL CHECK (status IN ('released', 'suppressed')),
        epsilon      REAL NOT NULL,
        delta        REAL NOT NULL,
        payload      BLOB,            -- the alert record's UTF-8 bytes, exactly as published
        reason       TEXT,            -- why a window was suppressed
        recorded_at  REAL NOT NULL,   -- the window's scheduled publication time (public), never the wall clock
        published    INTEGER NOT NULL DEFAULT 0,
        CHECK ((status = 'released') = (payload IS NOT NULL))
    )""",
    # Covering index: the accountant's per-period GROUP BY never touches the payloads.
    "CREATE INDEX windows_by_end ON windows (window_end, status, epsilon, delta)",
]
# Charges that cover a span of windows rather than one: an alarm run (one charge for
# every window it answers) and a baseline estimate (one release over many windows).
# Each counts in every budget period its span touches.
_CHARGES = [
    """CREATE TABLE charges (
        charge_id   INTEGER PRIMARY KEY AUTOINCREMENT,
        kind        TEXT NOT NULL,
        span_start  REAL NOT NULL,
        span_end    REAL NOT NULL CHECK (span_end >= span_start),
        epsilon     REAL NOT NULL CHECK (epsilon >= 0),
        delta       REAL NOT NULL CHECK (delta >= 0 AND delta < 1),
        recorded_at REAL NOT NULL   -- the span's start (public), never the wall clock
    )""",
    "CREATE INDEX charges_by_span ON charges (span_end, span_start, epsilon, delta)",
]
_SCHEMA += _CHARGES

_COLUMNS = "window_start, window_end, status, epsilon, delta, payload, reason, recorded_at, published"


@dataclass(frozen=True)
class LedgerEntry:
    """One window as the ledger holds it. ``payload`` is None for suppressed windows."""

    window_start: float
    window_end: float
    status: Literal["released", "suppressed"]
    epsilon: float
    delta: float
    payload: str | None
    published: bool
    reason: str | None = None
    recorded_at: float = 0.0

    @property
    def released(self) -> bool:
        return self.status == "released"


class Charge(NamedTuple):
    """What a released window cost, without its payload (what the accountant reads)."""

    window_end: float
    epsilon: float
    delta: float


def _entry(row: tuple) -> LedgerEntry:
    start, end, status, eps, delta, payload, reason, recorded_at, published = row
    return LedgerEntry(
        window_start=start,
        window_end=end,
        status=status,
        epsilon=eps,
        delta=delta,
        payload=None if payload is None else bytes(payload).decode("utf-8"),
        published=bool(published),
        reason=reason,
        recorded_at=recorded_at,
    )


def _check_window(window_start: float, window_end: float) -> None:
    if not (math.isfinite(window_start) and math.isfinite(window_end) and window_end > window_start):
        raise ValueError(f"window must have finite start < end, got [{window_start}, {window_end})")


class WindowLedger:
    """Durable record of every scheduled window (SQLite WAL, fsync at commit).

    Safe for one writer process (several threads) and any number of concurrent
    readers in other processes, such as ``monitor budget``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._tx = Transactions(open_ledger(self.path, kind="window", schema=_SCHEMA, upgrades={2: _CHARGES}))

    def close(self) -> None:
        self._tx.close()

    def transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """Hold the write lock across several calls of this ledger; they commit (and
        are fsynced) together, or vanish together if the block raises or the process dies."""
        return self._tx.write()

    def __enter__(self) -> "WindowLedger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, window_start: float) -> LedgerEntry | None:
        """The stored entry of the window starting at ``window_start``, or None."""
        with self._tx.read() as conn:
            return self._get(conn, window_start)

    @staticmethod
    def _get(conn: sqlite3.Connection, window_start: float) -> LedgerEntry | None:
        row = conn.execute(f"SELECT {_COLUMNS} FROM windows WHERE window_start = ?", (window_start,)).fetchone()
        return None if row is None else _entry(row)

    def _insert_once(
        self, window_start: float, window_end: float, status: str, eps: float, delta: float, payload: bytes | None,
        reason: str | None, recorded_at: float | None = None,
    ) -> LedgerEntry:
        # recorded_at is a scheduled time, not time.time(): how long a release took
        # depends on the data, and the ledger is readable by whoever runs `monitor budget`.
        # Insert-or-return-existing under one write lock: whatever was stored first wins,
        # so a window is never charged twice, even if the caller retries after a crash.
        with self._tx.write() as conn:
            conn.execute(
                f"INSERT INTO windows ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0) ON CONFLICT (window_start) DO NOTHING",
                (window_start, window_end, status, eps, delta, payload, reason,
                 window_end if recorded_at is None else float(recorded_at)),
            )
            entry = self._get(conn, window_start)
        assert entry is not None
        return entry

    def record_release(self, window_start: float, window_end: float, epsilon: float, delta: float, payload: str | bytes,
                       recorded_at: float | None = None) -> LedgerEntry:
        """Store a released window and its alert record; return the stored entry.

        ``recorded_at``: the window's scheduled publication time (public); its end if None.

        If the window is already in the ledger (released or suppressed), nothing is
        written and the existing entry is returned: check ``entry.payload`` against
        what you were about to publish, and publish the stored one.
        """
        _check_window(window_start, window_end)
        if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta < 1):
            raise ValueError(f"window cost must have epsilon >= 0 and 0 <= delta < 1, got ({epsilon}, {delta})")
        data = payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)
        data.decode("utf-8")  # refuse non-UTF-8 now rather than at republish time
        return self._insert_once(window_start, window_end, "released", float(epsilon), float(delta), data, None, recorded_at)

    def record_suppressed(self, window_start: float, window_end: float, reason: str = "budget") -> LedgerEntry:
        """Store a window that was not released (costs nothing); idempotent like ``record_release``."""
        _check_window(window_start, window_end)
        return self._insert_once(window_start, window_end, "suppressed", 0.0, 0.0, None, reason)

    def mark_published(self, window_start: float) -> None:
        """Note that the window's alert record reached the alerts topic."""
        with self._tx.write() as conn:
            conn.execute("UPDATE windows SET published = 1 WHERE window_start = ? AND status = 'released'", (window_start,))

    def unpublished(self) -> list[LedgerEntry]:
        """Released windows whose alert record may not have been published (oldest first)."""
        with self._tx.read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM windows WHERE status = 'released' AND published = 0 ORDER BY window_end"
            ).fetchall()
        return [_entry(r) for r in rows]

    def last_window_end(self) -> float | None:
        """End of the latest window recorded (released or suppressed): where the service resumes."""
        with self._tx.read() as conn:
            return conn.execute("SELECT max(window_end) FROM windows").fetchone()[0]

    def last_released(self) -> LedgerEntry | None:
        """The latest released window, or None if none was released yet."""
        with self._tx.read() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM windows WHERE status = 'released' ORDER BY window_end DESC LIMIT 1"
            ).fetchone()
        return None if row is None else _entry(row)

    def entries(self, since: float | None = None) -> list[LedgerEntry]:
        """All windows with ``window_end > since`` (all if None), oldest first."""
        with self._tx.read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM windows WHERE window_end > ? ORDER BY window_end",
                (-math.inf if since is None else since,),
            ).fetchall()
        return [_entry(r) for r in rows]

    def charges(self, after: float, upto: float, paid_only: bool = False) -> list[Charge]:
        """Costs of released windows with ``after < window_end <= upto``, oldest first
        (``paid_only``: without the free windows, most of a quiet stream)."""
        paid = " AND (epsilon > 0 OR delta > 0)" if paid_only else ""
        with self._tx.read() as conn:
            rows = conn.execute(
                "SELECT window_end, epsilon, delta FROM windows "
                f"WHERE status = 'released' AND window_end > ? AND window_end <= ?{paid} ORDER BY window_end",
                (after, upto),
            ).fetchall()
        return [Charge(*r) for r in rows]

    def charge_counts(self, after: float, upto: float) -> dict[tuple[float, float], int]:
        """Number of charges per (epsilon, delta) cost that touch the interval (after, upto].

        Released windows with ``after < window_end <= upto`` and span charges whose span
        overlaps the interval; free windows (cost 0) are left out. The multiset of costs
        is all that composition needs; grouping in SQLite keeps a period of ten thousand
        windows cheap to read.
        """
        counts, apart = self.split_charge_counts(after, upto, ())
        assert not apart
        return counts

    def split_charge_counts(self, after: float, upto: float, apart_kinds: Sequence[str]
                            ) -> tuple[dict[tuple[float, float], int], dict[tuple[float, float], int]]:
        """``charge_counts``, with the span charges of ``apart_kinds`` counted in a second mapping."""
        with self._tx.read() as conn:
            rows = conn.execute(
                "SELECT epsilon, delta, count(*) FROM windows "
                "WHERE window_end > ? AND window_end <= ? AND status = 'released' AND (epsilon > 0 OR delta > 0) "
                "GROUP BY epsilon, delta",
                (after, upto),
            ).fetchall()
            spans = conn.execute(
                "SELECT epsilon, delta, kind, count(*) FROM charges "
                "WHERE span_end > ? AND span_start < ? AND (epsilon > 0 OR delta > 0) GROUP BY epsilon, delta, kind",
                (after, upto),
            ).fetchall()
        counts: dict[tuple[float, float], int] = {}
        apart: dict[tuple[float, float], int] = {}
        for eps, delta, n in rows:
            counts[(eps, delta)] = counts.get((eps, delta), 0) + n
        for eps, delta, kind, n in spans:
            into = apart if kind in apart_kinds else counts
            into[(eps, delta)] = into.get((eps, delta), 0) + n
        return counts, apart

    def total_epsilon(self) -> float:
        """Sum of the epsilons of everything the ledger ever charged (released windows and
        span charges): a privacy unit present throughout has lost at most this much."""
        with self._tx.read() as conn:
            windows = conn.execute("SELECT total(epsilon) FROM windows WHERE status = 'released'").fetchone()[0]
            spans = conn.execute("SELECT total(epsilon) FROM charges").fetchone()[0]
        return math.fsum((windows, spans))

    def add_charge(self, kind: str, span_start: float, span_end: float, epsilon: float, delta: float = 0.0) -> int:
        """Record a charge over the windows of [span_start, span_end); returns its id.

        Call it inside the ``transaction()`` that decided it fits, before the release it
        pays for is stored.
        """
        if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta < 1):
            raise ValueError(f"a charge needs epsilon >= 0 and 0 <= delta < 1, got ({epsilon}, {delta})")
        with self._tx.write() as conn:
            cur = conn.execute(
                "INSERT INTO charges (kind, span_start, span_end, epsilon, delta, recorded_at) VALUES (?, ?, ?, ?, ?, ?)",
                (kind, float(span_start), float(span_end), float(epsilon), float(delta), float(span_start)),
            )
            return int(cur.lastrowid)

    def end_charge(self, charge_id: int, span_end: float) -> None:
        """Shorten a span charge to end at ``span_end`` (an alarm run that stopped early).

        A span is recorded at its longest possible length first, so a crash can only
        leave it too long (charged in more periods than needed), never too short.
        """
        with self._tx.write() as conn:
            conn.execute(
                "UPDATE charges SET span_end = max(span_start, min(span_end, ?)) WHERE charge_id = ?",
                (float(span_end), int(charge_id)),
            )

    def extend_charge(self, charge_id: int, span_end: float) -> None:
        """Lengthen a span charge to end at ``span_end`` (a quiet alarm run that goes on).

        Call it inside the ``transaction()`` of the window that decided it, so that the
        longer span is durable before anything the run answers under it is published.
        """
        with self._tx.write() as conn:
            conn.execute("UPDATE charges SET span_end = max(span_end, ?) WHERE charge_id = ?", (float(span_end), int(charge_id)))

    def span_charges(self, kind: str | None = None, after: float = -math.inf) -> list[tuple[int, str, float, float, float, float]]:
        """(charge_id, kind, span_start, span_end, epsilon, delta) of span charges ending after ``after``."""
        with self._tx.read() as conn:
            rows = conn.execute(
                "SELECT charge_id, kind, span_start, span_end, epsilon, delta FROM charges "
                "WHERE span_end > ? AND (? IS NULL OR kind = ?) ORDER BY charge_id",
                (after, kind, kind),
            ).fetchall()
        return [tuple(r) for r in rows]

    def counts(self, after: float, upto: float) -> dict[str, int]:
        """Number of windows per status with ``after < window_end <= upto``."""
        with self._tx.read() as conn:
            rows = conn.execute(
                "SELECT status, count(*) FROM windows WHERE window_end > ? AND window_end <= ? GROUP BY status",
                (after, upto),
            ).fetchall()
        return {"released": 0, "suppressed": 0, **dict(rows)}
