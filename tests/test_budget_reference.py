"""ReferenceLedger: a total budget that refuses, plainly, once it would be exceeded."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.budget import ReferenceLedger
from monitor.errors import BudgetExhausted, MonitorError


def test_charges_add_up_and_refuse_when_exhausted(tmp_path: Path) -> None:
    with ReferenceLedger(tmp_path / "ref.sqlite", epsilon_limit=5.0) as ref:
        ref.charge("fit", 1.0, note="grid-kNN")
        for _ in range(38):
            ref.charge("identify", 0.1, delta=1e-7)
        assert ref.spent() == (pytest.approx(4.8), pytest.approx(3.8e-6))
        with pytest.raises(BudgetExhausted) as err:
            ref.charge("identify", 0.5)
        assert str(err.value) == "reference budget exhausted: spent 4.8 of 5.0, this query needs 0.5"
        assert isinstance(err.value, MonitorError)
        assert len(ref.entries()) == 39  # the refused query was not recorded
        ref.charge("identify", 0.2)  # exactly up to the limit is allowed
        assert ref.remaining() == pytest.approx(0.0)
        with pytest.raises(BudgetExhausted):
            ref.charge("identify", 1e-6)


def test_spend_persists_and_limit_comes_from_the_caller(tmp_path: Path) -> None:
    path = tmp_path / "ref.sqlite"
    with ReferenceLedger(path, epsilon_limit=2.0) as ref:
        ref.charge("fit", 2.0, note="first fit")
    with ReferenceLedger(path, epsilon_limit=2.0) as ref:
        with pytest.raises(BudgetExhausted):
            ref.charge("fit", 0.5)
    with ReferenceLedger(path, epsilon_limit=3.0) as ref:  # a raised limit in the config
        ref.charge("fit", 0.5)
        first, second = ref.entries()
        assert (first.purpose, first.epsilon, first.note) == ("fit", 2.0, "first fit")
        assert second.epsilon == 0.5 and second.charged_at >= first.charged_at
        assert ref.remaining() == pytest.approx(0.5)


def test_rejects_invalid_charges(tmp_path: Path) -> None:
    with ReferenceLedger(tmp_path / "ref.sqlite", epsilon_limit=1.0) as ref:
        for eps, delta in [(-0.1, 0.0), (float("nan"), 0.0), (0.1, 1.0)]:
            with pytest.raises(ValueError):
                ref.charge("identify", eps, delta)
        assert ref.entries() == []


def test_each_privacy_notion_has_its_own_total_and_limit(tmp_path):
    with ReferenceLedger(tmp_path / "ref.sqlite", epsilon_limit=2.0, sensitive_epsilon_limit=1.0) as ref:
        ref.charge("fit", 1.5)
        ref.charge("identify", 0.8, notion="sensitive:k=1")
        # A sensitive-privacy answer never spends the DP total, and the reverse.
        assert ref.spent() == (1.5, 0.0) and ref.spent("sensitive:k=1") == (0.8, 0.0)
        with pytest.raises(BudgetExhausted, match="sensitive:k=1"):
            ref.charge("identify", 0.3, notion="sensitive:k=1")
        ref.charge("identify", 0.5)  # still fits the DP total
        assert ref.notions() == ["dp", "sensitive:k=1"]
        assert [c.notion for c in ref.entries()] == ["dp", "sensitive:k=1", "dp"]
        with pytest.raises(ValueError, match="notion"):
            ref.charge("identify", 0.1, notion="renyi")


def test_a_version_1_reference_ledger_keeps_its_charges_as_dp(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE charges (id INTEGER PRIMARY KEY AUTOINCREMENT, charged_at REAL NOT NULL, purpose TEXT NOT NULL, "
                 "epsilon REAL NOT NULL, delta REAL NOT NULL, note TEXT NOT NULL DEFAULT '')")
    conn.execute("INSERT INTO charges (charged_at, purpose, epsilon, delta) VALUES (1.0, 'fit', 1.0, 0.0)")
    conn.execute("PRAGMA application_id=1146114609")  # "DPR1"
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    with ReferenceLedger(path, epsilon_limit=5.0) as ref:
        assert ref.spent() == (1.0, 0.0) and ref.entries()[0].notion == "dp"
