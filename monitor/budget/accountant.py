"""The stream's budget: may this window be released, given what the rolling period spent?

Every charge (a window's own row, an alarm run, a baseline estimate) has a cost fixed by
the config, and the decision looks only at the calendar (window times), the ledger and
the alarm's published answers, never at the data directly (docs/design.md).

Guarantee. For every interval (t - period, t], the windows released with their end in
it compose (basic sums, or PLD) to within (epsilon, delta) per privacy unit.

Which charges PLD may compose. PLD composition is proven for a sequence of mechanisms
whose privacy parameters are fixed in advance; a charge whose existence (or span, or cost)
depends on earlier released answers makes the sequence adaptively stopped, which needs a
privacy-filter theorem, and none is proven for PLD. Basic composition is a valid filter
(Rogers, Roth, Ullman, Vadhan 2016). Every charge the stream makes is of that adaptive
sort (``BASIC_KINDS``), so under ``pld`` they add up exactly as under ``basic``; PLD
composes only fixed-cost windows on a calendar (``fixed_schedule=True``).

Why checking the trailing interval is enough. The set of windows ending in an interval
only grows when a window is added, and composition is monotone (a subset of the events
never costs more). Adding window W (end e_W) changes only the intervals that contain
e_W; when windows are released in time order, every window in such an interval ends at
or before e_W, so its set is a subset of the trailing set (e_W - period, e_W]. If the
trailing set plus W is within budget, so is every other interval. Should a window ever
arrive out of order, ``decide`` also checks the trailing interval of every later
released window within one period, so the guarantee does not rest on the ordering.

>>> import tempfile, pathlib
>>> from monitor.budget.ledger import WindowLedger
>>> ledger = WindowLedger(pathlib.Path(tempfile.mkdtemp()) / "l.sqlite")
>>> acc = BudgetAccountant(ledger, epsilon=2.0, delta=1e-5, period_seconds=3600)
>>> [acc.release(t, t + 60, (1.0, 1e-6), lambda d: '{"n": 1}').entry.status for t in (0, 60, 120)]
['released', 'released', 'suppressed']
>>> acc.spent(180.0), acc.remaining(180.0)
((2.0, 2e-06), 0.0)
>>> acc.remaining(3600.0 + 61)  # the first window (end 60) has left the period
1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from monitor.budget.composition import AccountantKind, Cost, fits, spend, within
from monitor.budget.ledger import LedgerEntry, WindowLedger

__all__ = ["BudgetAccountant", "Decision", "ReleaseOutcome", "BASIC_KINDS"]

# Charges composed by basic composition whatever the accountant: whether each is made
# depends on earlier released answers, so no PLD theorem covers them (see composition.spend).
# An alarm run and its pages are charged as its outputs come; a report exists only after a
# page, or, when scheduled, only if the budget those pages left still admits it; a
# baseline exists only if that budget admits it, and its span and cost follow the
# estimates released before it (a repeated warm-up). "report" is the window row's kind.
BASIC_KINDS = ("alarm_run", "alarm_page", "baseline", "report")


def _plus_one(counts: dict[Cost, int], cost: Cost) -> dict[Cost, int]:
    return {**counts, cost: counts.get(cost, 0) + 1}


@dataclass(frozen=True)
class Decision:
    """Whether a window may be released, and the period's spend after the decision.

    ``epsilon_spent`` / ``delta_spent`` cover the released windows ending in
    (window_end - period, window_end], this one included if it is released. With the
    PLD accountant and a ``fixed_schedule`` the spend is (epsilon at delta_limit,
    delta_limit); otherwise it is the sums.
    """

    released: bool
    window_start: float
    window_end: float
    cost: Cost
    epsilon_spent: float
    delta_spent: float
    windows_in_period: int
    epsilon_limit: float
    delta_limit: float
    period_seconds: float
    accountant: AccountantKind
    epsilon_lifetime_spent: float = 0.0
    epsilon_lifetime_limit: float | None = None

    @property
    def epsilon_remaining(self) -> float:
        return max(0.0, self.epsilon_limit - self.epsilon_spent)

    def budget_record(self) -> dict[str, Any]:
        """The ``budget`` object of the alert record (DEVELOPERS.md)."""
        return {
            "accountant": self.accountant,
            "period_seconds": self.period_seconds,
            "epsilon_spent": self.epsilon_spent,
            "epsilon_remaining": self.epsilon_remaining,
            "delta_limit": self.delta_limit,
            "epsilon_lifetime_spent": self.epsilon_lifetime_spent,
            "epsilon_lifetime_limit": self.epsilon_lifetime_limit,
        }


@dataclass(frozen=True)
class ReleaseOutcome:
    """What ``BudgetAccountant.release`` did.

    ``entry`` is what the ledger holds for the window (publish ``entry.payload`` if
    ``entry.released``). ``decision`` is None when the window was already in the
    ledger: then nothing was decided, drawn or charged (``replayed`` is True).
    """

    entry: LedgerEntry
    decision: Decision | None

    @property
    def replayed(self) -> bool:
        return self.decision is None


class BudgetAccountant:
    """Per-privacy-unit (epsilon, delta) budget over a rolling period, kept in a WindowLedger.

    ``accountant="basic"`` sums epsilons and deltas; ``"pld"`` composes privacy-loss
    distributions (dp-accounting), which admits more charges for the same guarantee, but
    only for charges whose existence and cost are fixed by the calendar: every charge of
    ``BASIC_KINDS`` (all the stream's: alarm runs, pages, baselines, reports) is added by
    basic composition under either accountant, so for the stream ``"pld"`` spends and
    admits exactly what ``"basic"`` does.

    ``fixed_schedule``: the window rows are a fixed cost per scheduled window, decided by
    the calendar alone (``release`` with one cost, no span charge in the ledger); only
    then does ``"pld"`` compose them. False (the default): a window row is a report and
    adds like the other adaptive charges.

    ``lifetime_epsilon``: an optional cap on the sum of every epsilon the ledger ever
    charged. The rolling period alone bounds what one period reveals; a person present
    for 30 days can lose 30 periods' worth, so deployments that must bound a person's
    whole loss set this (basic composition over the ledger's history; once reached,
    nothing more is released from this ledger).
    """

    def __init__(
        self, ledger: WindowLedger, epsilon: float, delta: float, period_seconds: float, accountant: AccountantKind = "basic",
        lifetime_epsilon: float | None = None, fixed_schedule: bool = False,
    ) -> None:
        if not (epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"epsilon must be positive and finite, got {epsilon}")
        if not 0 <= delta < 1:
            raise ValueError(f"delta must be in [0, 1), got {delta}")
        if not period_seconds > 0:
            raise ValueError(f"period_seconds must be positive, got {period_seconds}")
        if accountant not in ("basic", "pld"):
            raise ValueError(f"accountant must be 'basic' or 'pld', got {accountant!r}")
        self.ledger = ledger
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.period_seconds = float(period_seconds)
        self.accountant: AccountantKind = accountant
        if lifetime_epsilon is not None and not (lifetime_epsilon > 0 and math.isfinite(lifetime_epsilon)):
            raise ValueError(f"lifetime_epsilon must be positive and finite, got {lifetime_epsilon}")
        self.lifetime_epsilon = None if lifetime_epsilon is None else float(lifetime_epsilon)
        self.fixed_schedule = bool(fixed_schedule)

    def _apart(self, kind: str) -> bool:
        """Does a charge of ``kind`` add by basic composition (rather than by the accountant's)?"""
        return kind in BASIC_KINDS or (kind == "window" and not self.fixed_schedule)

    def _held(self, after: float, upto: float) -> tuple[dict[Cost, int], dict[Cost, int]]:
        """(charges the accountant composes, charges it adds) touching (after, upto]."""
        counts, apart = self.ledger.split_charge_counts(after, upto, BASIC_KINDS)
        if not self.fixed_schedule:
            for cost, n in counts.items():
                apart[cost] = apart.get(cost, 0) + n
            return {}, apart
        if apart and self.accountant == "pld":
            # A window's release would then depend on adaptive charges: PLD would compose an
            # adaptively stopped sequence, which no theorem here covers.
            raise ValueError("fixed_schedule is for ledgers of fixed-cost windows only; this one holds adaptive span charges")
        return counts, apart

    @classmethod
    def from_settings(cls, ledger: WindowLedger, budget) -> "BudgetAccountant":
        """The accountant the ``budget`` block of the config describes."""
        return cls(ledger, budget.epsilon, budget.delta, budget.period_seconds, budget.accountant, budget.lifetime_epsilon)

    def _within_lifetime(self, cost: Cost) -> bool:
        return self.lifetime_epsilon is None or within(self.ledger.total_epsilon() + cost[0], self.lifetime_epsilon)

    def decide(self, window_start: float, window_end: float, cost: Cost, kind: str = "window") -> Decision:
        """May the window [window_start, window_end) costing ``cost`` be released?

        ``kind``: what the cost pays for; one of ``BASIC_KINDS`` composes by basic
        composition (as it will once it is in the ledger), and so does ``"window"`` (the
        window's row) unless ``fixed_schedule``. Looks only at window times and the ledger.
        Does not record anything.
        """
        cost = (float(cost[0]), float(cost[1]))
        period = self.period_seconds
        lim = (self.accountant, self.epsilon, self.delta)
        basic_new = self._apart(kind)
        if basic_new and self.fixed_schedule and self.accountant == "pld":
            raise ValueError(f"fixed_schedule is for ledgers of fixed-cost windows only, not for {kind!r} charges")

        def with_cost(counts: dict[Cost, int], basic: dict[Cost, int]) -> tuple[dict[Cost, int], dict[Cost, int]]:
            return (counts, _plus_one(basic, cost)) if basic_new else (_plus_one(counts, cost), basic)

        def held(end: float) -> tuple[dict[Cost, int], dict[Cost, int]]:
            return self._held(end - period, end)

        in_period, basic = held(window_end)
        counts_now, basic_now = with_cost(in_period, basic)
        released = fits(counts_now, *lim, basic=basic_now) and self._within_lifetime(cost)
        # Only if windows were released out of order: every later released window's
        # trailing period that would also contain this one must stay within budget.
        later = self.ledger.charges(window_end, math.nextafter(window_end + period, -math.inf))
        for end in sorted({c.window_end for c in later}):
            if not released:
                break
            counts, basic_later = with_cost(*held(end))
            released = fits(counts, *lim, basic=basic_later)
        if released:
            in_period, basic = counts_now, basic_now
        eps, delta = spend(in_period, self.accountant, self.delta, basic)
        return Decision(
            released=released,
            window_start=window_start,
            window_end=window_end,
            cost=cost,
            epsilon_spent=eps,
            delta_spent=delta,
            windows_in_period=sum(in_period.values()) + sum(basic.values()),
            epsilon_limit=self.epsilon,
            delta_limit=self.delta,
            period_seconds=period,
            accountant=self.accountant,
            epsilon_lifetime_spent=self.ledger.total_epsilon() + (cost[0] if released else 0.0),
            epsilon_lifetime_limit=self.lifetime_epsilon,
        )

    def fits_span(self, span_start: float, window_end: float, cost: Cost, kind: str = "alarm_page") -> bool:
        """May a charge of ``cost`` over a span that began at ``span_start`` be added at ``window_end``?

        For a charge that reaches back in time (an alarm page pays over its whole run, a
        baseline estimate over its span), every period (t - period, t] it touches with
        span_start < t <= window_end must stay within budget; periods ending later are
        checked by the later decisions, which see it. A period's charges change only when
        one enters (t reaches a window's end, or passes a span's start), so checking
        t = window_end and each such entry point is exact. ``kind`` as in ``decide``.
        """
        cost = (float(cost[0]), float(cost[1]))
        if not self._within_lifetime(cost):
            return False
        period = self.period_seconds
        lo = math.nextafter(span_start, math.inf)  # the first period end the new charge touches
        # (enters at, leaves when t - period reaches, (cost, composed apart)): a window counts for t in [end, end + period).
        windows_apart = self._apart("window")
        held = [(c.window_end, c.window_end, ((c.epsilon, c.delta), windows_apart))
                for c in self.ledger.charges(span_start - period, window_end, paid_only=True)]
        held += [(math.nextafter(s, math.inf), e, ((eps, d), self._apart(k)))
                 for _, k, s, e, eps, d in self.ledger.span_charges(after=span_start - period)
                 if s < window_end and (eps > 0 or d > 0)]
        ends = np.array(sorted({window_end} | {max(enter, lo) for enter, _, _ in held if enter <= window_end}))
        # A charge counts in the period ending at t iff enter <= t and leave > t - period.
        # No charge has left by a t it has not entered (leave + period > enter), so per cost
        # that is #(enter <= t) - #(leave <= t - period): two sorted searches instead of a
        # pass over the charges per t (a quiet alarm run can go on for weeks, and this runs
        # every window).
        costs = sorted({c for _, _, c in held})
        counts = np.zeros((ends.size, len(costs)), dtype=np.int64)
        for j, c in enumerate(costs):
            enter = np.sort([e for e, _, cc in held if cc == c])
            leave = np.sort([x for _, x, cc in held if cc == c])
            counts[:, j] = np.searchsorted(enter, ends, side="right") - np.searchsorted(leave, ends - period, side="right")
        new = (cost, self._apart(kind))
        if self.fixed_schedule and self.accountant == "pld" and (new[1] or any(apart for _, _, (_, apart) in held)):
            raise ValueError("fixed_schedule is for ledgers of fixed-cost windows only, without adaptive span charges")
        for row in np.unique(counts, axis=0):  # periods holding the same charges compose alike (PLD is slow)
            held_now = {c: int(m) for c, m in zip(costs, row) if m}
            held_now[new] = held_now.get(new, 0) + 1
            composed = {c: m for (c, apart), m in held_now.items() if not apart}
            apart = {c: m for (c, apart), m in held_now.items() if apart}
            if not fits(composed, self.accountant, self.epsilon, self.delta, basic=apart):
                return False
        return True

    def release(
        self, window_start: float, window_end: float, cost: Cost, payload_fn: Callable[[Decision], str | bytes]
    ) -> ReleaseOutcome:
        """Decide, draw and record one window as a single durable step.

        - Window already in the ledger (e.g. after a crash): return its stored entry;
          ``payload_fn`` is not called, nothing is charged.
        - Budget allows it: call ``payload_fn(decision)`` (draw the noise, build the
          alert record with ``decision.budget_record()``) and store the result.
        - Otherwise: record the window as suppressed (reason ``budget``).

        Everything happens under the ledger's write lock and commits at the end: if
        the process dies before the commit, nothing is stored and nothing was
        published, so the window is simply decided again after the restart (any noise
        drawn before the crash never left the process). After the commit, the service
        publishes ``entry.payload`` and calls ``ledger.mark_published``.
        """
        with self.ledger.transaction():
            existing = self.ledger.get(window_start)
            if existing is not None:
                return ReleaseOutcome(existing, None)
            decision = self.decide(window_start, window_end, cost)
            if decision.released:
                entry = self.ledger.record_release(window_start, window_end, *decision.cost, payload_fn(decision))
            else:
                entry = self.ledger.record_suppressed(window_start, window_end, reason="budget")
        return ReleaseOutcome(entry, decision)

    def spent(self, at: float) -> tuple[float, float]:
        """(epsilon, delta) spent by the charges touching (at - period, at]."""
        counts, basic = self._held(at - self.period_seconds, at)
        return spend(counts, self.accountant, self.delta, basic)

    def remaining(self, at: float) -> float:
        """Epsilon left in the period ending at ``at`` (never negative)."""
        return max(0.0, self.epsilon - self.spent(at)[0])
