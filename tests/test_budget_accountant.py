"""BudgetAccountant: rolling period, basic vs PLD, release() as one step."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.budget import BudgetAccountant, Decision, WindowLedger, basic_spend, pld_epsilon

WINDOW = 60.0


def _payload(d: Decision) -> str:
    return json.dumps({"window_start": d.window_start, "budget": d.budget_record()})


def _run(acc: BudgetAccountant, n: int, cost=(1.0, 1e-6), start: float = 0.0) -> str:
    """Release n consecutive windows; return their statuses as 'R'/'S'."""
    out = ""
    for i in range(n):
        s = start + i * WINDOW
        out += "R" if acc.release(s, s + WINDOW, cost, _payload).entry.released else "S"
    return out


@pytest.fixture
def ledger(tmp_path: Path):
    with WindowLedger(tmp_path / "ledger.sqlite") as led:
        yield led


def test_rolling_period_frees_budget_as_windows_age(ledger: WindowLedger) -> None:
    # Room for 3 windows per 300 s: a window ending at e is released iff fewer than 3
    # released windows end in (e - 300, e).
    acc = BudgetAccountant(ledger, epsilon=3.0, delta=1e-5, period_seconds=300.0)
    assert _run(acc, 10) == "RRRSSRRRSS"
    assert acc.spent(180.0) == (3.0, pytest.approx(3e-6))
    assert acc.remaining(180.0) == 0.0
    assert acc.remaining(700.0) == 1.0  # released ends in (400, 700]: 420 and 480
    assert acc.spent(1e6) == (0.0, 0.0)
    suppressed = ledger.get(180.0)
    assert suppressed.status == "suppressed" and suppressed.reason == "budget" and suppressed.epsilon == 0.0


def test_delta_limit_binds_too(ledger: WindowLedger) -> None:
    acc = BudgetAccountant(ledger, epsilon=100.0, delta=1e-5, period_seconds=86400.0)
    assert _run(acc, 10, cost=(0.1, 3e-6)) == "RRRSSSSSSS"


def test_decision_reports_spend_after_the_decision(ledger: WindowLedger) -> None:
    acc = BudgetAccountant(ledger, epsilon=2.0, delta=1e-5, period_seconds=3600.0)
    first = acc.release(0.0, 60.0, (1.5, 0.0), _payload)
    assert first.decision.released and first.decision.epsilon_spent == 1.5
    record = json.loads(first.entry.payload)["budget"]
    assert record == {"accountant": "basic", "period_seconds": 3600.0, "epsilon_spent": 1.5, "epsilon_remaining": 0.5, "delta_limit": 1e-5,
                      "epsilon_lifetime_spent": 1.5, "epsilon_lifetime_limit": None}
    second = acc.release(60.0, 120.0, (1.5, 0.0), _payload)
    assert not second.decision.released
    assert second.decision.epsilon_spent == 1.5 and second.decision.windows_in_period == 1


def test_release_replays_a_recorded_window_without_drawing(ledger: WindowLedger) -> None:
    acc = BudgetAccountant(ledger, epsilon=10.0, delta=1e-5, period_seconds=3600.0)
    first = acc.release(0.0, 60.0, (1.0, 1e-6), lambda d: '{"noise": 1}')

    def must_not_draw(d: Decision) -> str:
        raise AssertionError("a recorded window was drawn again")

    again = acc.release(0.0, 60.0, (1.0, 1e-6), must_not_draw)
    assert again.replayed and again.entry == first.entry
    assert acc.spent(60.0) == (1.0, 1e-6)


def test_failed_draw_records_nothing(ledger: WindowLedger) -> None:
    acc = BudgetAccountant(ledger, epsilon=10.0, delta=1e-5, period_seconds=3600.0)

    def broken(d: Decision) -> str:
        raise RuntimeError("noise sampler failed")

    with pytest.raises(RuntimeError):
        acc.release(0.0, 60.0, (1.0, 1e-6), broken)
    assert ledger.get(0.0) is None and acc.spent(60.0) == (0.0, 0.0)
    assert acc.release(0.0, 60.0, (1.0, 1e-6), _payload).entry.released


def test_pld_admits_strictly_more_than_basic_on_infra_example(tmp_path: Path) -> None:
    # INFRA.md: events of (0.1, 1e-8) under (4, 1e-5): 40 by basic composition, 88 by PLD
    # (windows of a cost fixed by the calendar: the only charges PLD composes).
    counts = {}
    for kind in ("basic", "pld"):
        with WindowLedger(tmp_path / f"{kind}.sqlite") as led:
            acc = BudgetAccountant(led, epsilon=4.0, delta=1e-5, period_seconds=1e9, accountant=kind, fixed_schedule=True)
            counts[kind] = _run(acc, 100, cost=(0.1, 1e-8)).count("R")
            assert acc.spent(100 * WINDOW)[0] <= 4.0
    assert counts["basic"] == 40
    assert 80 <= counts["pld"] <= 95 and counts["pld"] > counts["basic"]


@pytest.mark.parametrize("cost, limit", [((1.0, 1.2e-6), (10.0, 1e-5)), ((0.5, 0.0), (10.0, 1e-5)), ((2.0, 1e-7), (10.0, 0.0))])
def test_pld_never_admits_fewer_than_basic(tmp_path: Path, cost, limit) -> None:
    counts = {}
    for kind in ("basic", "pld"):
        with WindowLedger(tmp_path / f"{kind}.sqlite") as led:
            acc = BudgetAccountant(led, *limit, period_seconds=1e9, accountant=kind, fixed_schedule=True)
            counts[kind] = _run(acc, 40, cost=cost).count("R")
    assert counts["pld"] >= counts["basic"]
    if cost[1] > 0 and limit[1] == 0:
        assert counts["basic"] == counts["pld"] == 0  # any delta > 0 exceeds a zero delta limit


def test_pld_heterogeneous_costs_compose_between_bounds() -> None:
    mixed = {(0.1, 1e-8): 30, (0.3, 0.0): 10, (0.05, 1e-9): 7}
    eps = pld_epsilon(mixed, 1e-5)
    basic_eps, _ = basic_spend(mixed)
    assert 0.3 < eps < basic_eps
    # Order and grouping of the same multiset do not matter.
    assert pld_epsilon(dict(reversed(list(mixed.items()))), 1e-5) == eps
    assert pld_epsilon({}, 1e-5) == 0.0
    assert math.isinf(pld_epsilon({(1.0, 1e-6): 20}, 1e-5))


# Window indices in any order, with repeats: out-of-order arrival and replays.
@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=40), st.sampled_from(["basic", "pld"]))
def test_every_period_within_budget_in_any_order(indices, kind) -> None:
    period, limit = 300.0, (2.5, 1e-5)
    cost = (1.0, 1e-6)
    with tempfile.TemporaryDirectory() as d, WindowLedger(Path(d) / "l.sqlite") as led:
        acc = BudgetAccountant(led, *limit, period_seconds=period, accountant=kind)
        first_status = {}
        for i in indices:
            out = acc.release(i * WINDOW, (i + 1) * WINDOW, cost, _payload)
            first_status.setdefault(i, out.entry.status)
            assert out.entry.status == first_status[i]
        released_ends = [e.window_end for e in led.entries() if e.released]
        # The worst interval ends at a released window's end.
        for end in released_ends:
            n = sum(1 for e in released_ends if end - period < e <= end)
            assert n <= 2
        assert len(led.entries()) == len(set(indices))


def _spend_at(led: WindowLedger, t: float, period: float) -> float:
    """Brute force: the epsilon of every charge touching (t - period, t]."""
    windows = sum(c.epsilon for c in led.charges(t - period, t))
    spans = sum(eps for _, _, s, e, eps, _ in led.span_charges() if s < t and e > t - period)
    return windows + spans


# Charges that reach back (an alarm page over its run) must fit every period they touch
# that has already ended, not only the trailing one.
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 8), st.sampled_from([0.5, 1.0, 2.0])), max_size=12),
       st.integers(0, 20), st.integers(1, 20), st.sampled_from([0.5, 1.0, 2.0]))
def test_fits_span_is_exact_over_every_period_the_charge_reaches(spans, span_start, length, cost) -> None:
    period, limit = 5 * WINDOW, 4.0
    with tempfile.TemporaryDirectory() as d, WindowLedger(Path(d) / "l.sqlite") as led:
        acc = BudgetAccountant(led, limit, 1e-5, period_seconds=period)
        for start, n, eps in spans:  # span charges, and released windows (point charges) at their ends
            led.add_charge("alarm_run", start * WINDOW, (start + n) * WINDOW, eps)
            if n % 2:
                led.record_release(start * WINDOW, (start + 1) * WINDOW, eps / 2, 0.0, "{}")
        s, now = span_start * WINDOW, (span_start + length) * WINDOW
        # Every period end t in (s, now], on a grid finer than any charge boundary.
        ts = [s + k * WINDOW / 4 for k in range(1, 4 * length + 1)]
        expected = all(_spend_at(led, t, period) + cost <= limit + 1e-9 for t in ts)
        assert acc.fits_span(s, now, (cost, 0.0)) == expected
