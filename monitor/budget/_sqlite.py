"""Open a ledger database durably: SQLite in WAL mode, fsync at every commit, versioned.

Both ledgers (windows, reference) share this: a commit that returned is on disk
(``synchronous=FULL``), and a crash at any moment leaves either the whole
transaction or none of it. WAL lets the ``monitor budget`` CLI read while the
service writes.

Each kind of ledger has its own ``application_id`` so that pointing the reference
ledger at the window ledger's file (or at any other SQLite file) is refused
instead of silently creating tables in it.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "x.sqlite"
>>> conn = open_ledger(p, kind="window", schema=["CREATE TABLE t (a)"])
>>> conn.execute("PRAGMA journal_mode").fetchone()[0]
'wal'
>>> conn.close()
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from monitor.errors import MonitorError

# Version of each ledger kind's schema; ``upgrades`` bring an older file up to it.
SCHEMA_VERSIONS = {"window": 2, "reference": 2}

# Distinct magic numbers per ledger kind ("DPW1", "DPR1").
APPLICATION_IDS = {"window": 0x44505731, "reference": 0x44505231}


class LedgerError(MonitorError):
    """A ledger file that cannot be used (corrupt, foreign, or from a newer version)."""


def open_ledger(
    path: str | Path, *, kind: str, schema: Sequence[str], upgrades: Mapping[int, Sequence[str]] | None = None
) -> sqlite3.Connection:
    """Open (creating if missing) a ledger of ``kind`` with WAL and synchronous=FULL.

    ``schema`` creates the current version; ``upgrades[v]`` turns version v - 1 into v,
    inside the same transaction, so an old ledger keeps every charge it holds.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so that the check
        # and the insert of a charge happen under one write lock.
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        _ensure_schema(conn, path, kind, schema, upgrades or {})
    except sqlite3.DatabaseError as err:
        raise LedgerError(f"ledger {path} cannot be opened: {err}") from None
    return conn


def _ensure_schema(
    conn: sqlite3.Connection, path: Path, kind: str, schema: Sequence[str], upgrades: Mapping[int, Sequence[str]]
) -> None:
    app_id = APPLICATION_IDS[kind]
    current = SCHEMA_VERSIONS[kind]
    conn.execute("BEGIN IMMEDIATE")
    try:
        found_app = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        n_tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if found_app == 0 and version == 0 and n_tables == 0:
            for stmt in schema:
                conn.execute(stmt)
            conn.execute(f"PRAGMA application_id={app_id}")
            conn.execute(f"PRAGMA user_version={current}")
        elif found_app != app_id:
            raise LedgerError(f"{path} is not a {kind} ledger (it holds other data); point the config at another file")
        elif version > current:
            raise LedgerError(
                f"ledger {path} has schema version {version}, newer than this program understands ({current}); upgrade the monitor"
            )
        else:
            for v in range(version + 1, current + 1):
                for stmt in upgrades.get(v, ()):
                    conn.execute(stmt)
            conn.execute(f"PRAGMA user_version={current}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class Transactions:
    """Serialises a connection's transactions across threads of one process.

    Re-entrant: a ``write()`` or ``read()`` opened inside another one joins the outer
    transaction. That lets a caller hold the write lock across several ledger calls
    (decide, draw noise, record) so that they commit, or vanish, together.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._lock = threading.RLock()
        self._depth = 0

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self.conn
                finally:
                    self._depth -= 1
                return
            self.conn.execute(begin)
            self._depth = 1
            try:
                yield self.conn
            except BaseException:
                self._depth = 0
                self.conn.execute("ROLLBACK")
                raise
            self._depth = 0
            self.conn.execute("COMMIT")

    def write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT: takes the database write lock up front, so a
        read-check-insert sequence cannot interleave with another writer."""
        return self._transaction("BEGIN IMMEDIATE")

    def read(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """One consistent snapshot for several SELECTs."""
        return self._transaction("BEGIN")

    def close(self) -> None:
        with self._lock:
            self.conn.close()
