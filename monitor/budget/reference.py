"""The reference data's ledger: a total (not rolling) epsilon budget for fit and queries.

The reference inliers are a fixed data set, so every query against them (``monitor
fit``, each ``monitor identify`` answer) spends from one total that never refills.
Charges compose by basic composition: epsilons add up, deltas are recorded and summed.

>>> import tempfile, pathlib
>>> ref = ReferenceLedger(pathlib.Path(tempfile.mkdtemp()) / "ref.sqlite", epsilon_limit=5.0)
>>> ref.charge("fit", 4.5, note="grid-kNN, 8 bins")
>>> ref.charge("identify", 1.0)
Traceback (most recent call last):
...
monitor.errors.BudgetExhausted: reference budget exhausted: spent 4.5 of 5.0, this query needs 1.0
>>> ref.spent(), ref.remaining()
((4.5, 0.0), 0.5)
>>> ref.close()
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from monitor.budget._sqlite import Transactions, open_ledger
from monitor.budget.composition import within
from monitor.errors import BudgetExhausted

__all__ = ["ReferenceLedger", "ReferenceCharge"]

_SCHEMA = [
    """CREATE TABLE charges (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        charged_at REAL NOT NULL,
        purpose    TEXT NOT NULL,
        epsilon    REAL NOT NULL CHECK (epsilon >= 0),
        delta      REAL NOT NULL CHECK (delta >= 0),
        note       TEXT NOT NULL DEFAULT ''
    )"""
]


@dataclass(frozen=True)
class ReferenceCharge:
    """One recorded query against the reference data."""

    id: int
    charged_at: float
    purpose: str
    epsilon: float
    delta: float
    note: str


def _num(x: float) -> str:
    # 4.8 rather than 4.800000000000001 or 4.8e+00 in a message meant for people.
    return str(round(x, 6))


class ReferenceLedger:
    """Durable total budget of the reference data (SQLite WAL, fsync at commit).

    The limit is given when opening, not stored: raising it in the config raises it
    here, and what was spent is never forgotten.
    """

    def __init__(self, path: str | Path, epsilon_limit: float) -> None:
        if not (epsilon_limit > 0 and math.isfinite(epsilon_limit)):
            raise ValueError(f"epsilon_limit must be positive and finite, got {epsilon_limit}")
        self.path = Path(path)
        self.epsilon_limit = float(epsilon_limit)
        self._tx = Transactions(open_ledger(self.path, kind="reference", schema=_SCHEMA))

    def close(self) -> None:
        self._tx.close()

    def __enter__(self) -> "ReferenceLedger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _totals(conn) -> tuple[float, float]:
        rows = conn.execute("SELECT epsilon, delta FROM charges").fetchall()
        return math.fsum(r[0] for r in rows), math.fsum(r[1] for r in rows)

    def charge(self, purpose: str, epsilon: float, delta: float = 0.0, note: str = "") -> None:
        """Record a query of (epsilon, delta), or raise BudgetExhausted and record nothing.

        Call it BEFORE answering the query: a crash after the charge wastes budget,
        a crash before it would have answered for free.
        """
        if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta < 1):
            raise ValueError(f"a charge needs epsilon >= 0 and 0 <= delta < 1, got ({epsilon}, {delta})")
        with self._tx.write() as conn:
            spent, _ = self._totals(conn)
            if not within(spent + epsilon, self.epsilon_limit):
                raise BudgetExhausted(
                    f"reference budget exhausted: spent {_num(spent)} of {_num(self.epsilon_limit)}, "
                    f"this query needs {_num(epsilon)}"
                )
            conn.execute(
                "INSERT INTO charges (charged_at, purpose, epsilon, delta, note) VALUES (?, ?, ?, ?, ?)",
                (time.time(), purpose, float(epsilon), float(delta), note),
            )

    def spent(self) -> tuple[float, float]:
        """(total epsilon, total delta) charged so far."""
        with self._tx.read() as conn:
            return self._totals(conn)

    def remaining(self) -> float:
        """Epsilon left (never negative)."""
        return max(0.0, self.epsilon_limit - self.spent()[0])

    def entries(self) -> list[ReferenceCharge]:
        """Every charge, oldest first."""
        with self._tx.read() as conn:
            rows = conn.execute("SELECT id, charged_at, purpose, epsilon, delta, note FROM charges ORDER BY id").fetchall()
        return [ReferenceCharge(*r) for r in rows]
