"""The reference data's ledger: a total (not rolling) epsilon budget for fit and queries.

The reference inliers are a fixed data set, so every query against them (``monitor
fit``, each ``monitor identify`` answer) spends from one total that never refills.
Charges compose by basic composition: epsilons add up, deltas are recorded and summed.

Each charge records its privacy notion: ``"dp"`` (differential privacy: the fit, DP
identify answers) or ``"sensitive:k=K"`` ((epsilon, K)-sensitive privacy answers, a
weaker guarantee on another neighbour graph). Epsilons of different notions are not
comparable, so each notion has its own total and its own limit, and nothing adds them up.

>>> import tempfile, pathlib
>>> ref = ReferenceLedger(pathlib.Path(tempfile.mkdtemp()) / "ref.sqlite", epsilon_limit=5.0)
>>> ref.charge("fit", 4.5, note="grid-kNN, 8 bins")
>>> ref.charge("identify", 1.0)
Traceback (most recent call last):
...
monitor.errors.BudgetExhausted: reference budget exhausted: spent 4.5 of 5.0, this query needs 1.0
>>> ref.spent(), ref.remaining()
((4.5, 0.0), 0.5)
>>> ref.charge("identify", 1.0, notion="sensitive:k=1")  # its own total
>>> ref.spent("sensitive:k=1"), ref.spent()
((1.0, 0.0), (4.5, 0.0))
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
        note       TEXT NOT NULL DEFAULT '',
        notion     TEXT NOT NULL DEFAULT 'dp'
    )"""
]
_UPGRADES = {2: ["ALTER TABLE charges ADD COLUMN notion TEXT NOT NULL DEFAULT 'dp'"]}


@dataclass(frozen=True)
class ReferenceCharge:
    """One recorded query against the reference data."""

    id: int
    charged_at: float
    purpose: str
    epsilon: float
    delta: float
    note: str
    notion: str = "dp"


def _num(x: float) -> str:
    # 4.8 rather than 4.800000000000001 or 4.8e+00 in a message meant for people.
    return str(round(x, 6))


class ReferenceLedger:
    """Durable total budget of the reference data (SQLite WAL, fsync at commit).

    The limits are given when opening, not stored: raising one in the config raises it
    here, and what was spent is never forgotten. ``epsilon_limit`` bounds the DP
    charges; ``sensitive_epsilon_limit`` (default: the same number) bounds each
    sensitive-privacy notion's own total.
    """

    def __init__(self, path: str | Path, epsilon_limit: float, sensitive_epsilon_limit: float | None = None) -> None:
        for name, value in (("epsilon_limit", epsilon_limit), ("sensitive_epsilon_limit", sensitive_epsilon_limit)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be positive and finite, got {value}")
        self.path = Path(path)
        self.epsilon_limit = float(epsilon_limit)
        self.sensitive_epsilon_limit = float(sensitive_epsilon_limit if sensitive_epsilon_limit is not None else epsilon_limit)
        self._tx = Transactions(open_ledger(self.path, kind="reference", schema=_SCHEMA, upgrades=_UPGRADES))

    def close(self) -> None:
        self._tx.close()

    def __enter__(self) -> "ReferenceLedger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _totals(conn, notion: str) -> tuple[float, float]:
        rows = conn.execute("SELECT epsilon, delta FROM charges WHERE notion = ?", (notion,)).fetchall()
        return math.fsum(r[0] for r in rows), math.fsum(r[1] for r in rows)

    def limit(self, notion: str = "dp") -> float:
        """The epsilon limit of one notion's total."""
        _check_notion(notion)
        return self.epsilon_limit if notion == "dp" else self.sensitive_epsilon_limit

    def charge(self, purpose: str, epsilon: float, delta: float = 0.0, note: str = "", notion: str = "dp") -> None:
        """Record a query of (epsilon, delta) under ``notion``, or raise BudgetExhausted and record nothing.

        Call it BEFORE answering the query: a crash after the charge wastes budget,
        a crash before it would have answered for free.
        """
        if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta < 1):
            raise ValueError(f"a charge needs epsilon >= 0 and 0 <= delta < 1, got ({epsilon}, {delta})")
        limit = self.limit(notion)
        with self._tx.write() as conn:
            spent, _ = self._totals(conn, notion)
            if not within(spent + epsilon, limit):
                what = "reference budget" if notion == "dp" else f"reference budget for {notion} answers"
                raise BudgetExhausted(
                    f"{what} exhausted: spent {_num(spent)} of {_num(limit)}, this query needs {_num(epsilon)}"
                )
            conn.execute(
                "INSERT INTO charges (charged_at, purpose, epsilon, delta, note, notion) VALUES (?, ?, ?, ?, ?, ?)",
                (time.time(), purpose, float(epsilon), float(delta), note, notion),
            )

    def spent(self, notion: str = "dp") -> tuple[float, float]:
        """(total epsilon, total delta) charged so far under ``notion``."""
        _check_notion(notion)
        with self._tx.read() as conn:
            return self._totals(conn, notion)

    def remaining(self, notion: str = "dp") -> float:
        """Epsilon left under ``notion`` (never negative)."""
        return max(0.0, self.limit(notion) - self.spent(notion)[0])

    def notions(self) -> list[str]:
        """The notions charged so far, "dp" first."""
        with self._tx.read() as conn:
            found = {r[0] for r in conn.execute("SELECT DISTINCT notion FROM charges")}
        return sorted(found | {"dp"}, key=lambda n: (n != "dp", n))

    def entries(self) -> list[ReferenceCharge]:
        """Every charge, oldest first."""
        with self._tx.read() as conn:
            rows = conn.execute(
                "SELECT id, charged_at, purpose, epsilon, delta, note, notion FROM charges ORDER BY id"
            ).fetchall()
        return [ReferenceCharge(*r) for r in rows]


def _check_notion(notion: str) -> None:
    if notion != "dp" and not (notion.startswith("sensitive:k=") and notion[len("sensitive:k="):].isdigit()):
        raise ValueError(f"notion must be 'dp' or 'sensitive:k=K', got {notion!r}")
