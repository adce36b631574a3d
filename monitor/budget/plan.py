"""The budget plan: how many scheduled windows a period pays for, when releases stop and resume.

Everything here follows from the config, the clock and the ledger's public schedule
(which windows were released when), never from the data, so it can be printed freely.
``monitor run`` logs it at start and ``monitor budget`` shows it.

The forecast assumes every future window costs the configured ``window_cost``, and
counts the windows already in the period as if they cost that too: exact as long as the
release settings have not changed within the period. Under the rolling period a window
is released when fewer than ``affordable`` released windows end in the period before
it, so an over-subscribed schedule releases ``affordable`` windows in a row, suppresses
the rest, and resumes one period after the first of the run.

>>> plan = BudgetPlan(window_seconds=10, period_seconds=86400, lateness_seconds=0, cost=(1.5, 1e-9),
...                   accountant="basic", epsilon=40, delta=1e-5)
>>> plan.scheduled_per_period, plan.affordable, plan.all_fit
(8640, 26, False)
>>> f = plan.forecast(now=1000.0, released_ends=[])
>>> f.stop_window_start - 1000.0, f.resume_window_start - f.stop_window_start
(260.0, 86140.0)
"""

from __future__ import annotations

import datetime
import functools
import math
from collections import deque
from dataclasses import dataclass
from typing import Iterable

from monitor.budget.composition import AccountantKind, Cost, max_windows, spend

__all__ = ["BudgetPlan", "Forecast", "iso", "duration", "plan_from_config", "PLD_DELTA_NOTE"]

PLD_DELTA_NOTE = (
    "under the pld accountant delta is not consumed window by window: the whole period is held to "
    "budget.delta from the first window on (so 'delta spent' equals the limit at once), and epsilon "
    "spent is the smallest epsilon for which all the period's windows together are (epsilon, budget.delta)-DP. "
    "It is epsilon that runs out."
)


def iso(t: float) -> str:
    """Epoch seconds as ISO 8601 UTC, the format of every log line and of `monitor budget`.

    >>> iso(1763700000)
    '2025-11-21T04:40:00Z'
    """
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration(seconds: float) -> str:
    """A short human duration.

    >>> duration(45), duration(260), duration(5400), duration(86400 * 2)
    ('45 s', '4.3 min', '90 min', '2 d')
    """
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.2g} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.2g} h"
    return f"{seconds / 86400:.2g} d"


@dataclass(frozen=True)
class Forecast:
    """The next suppressed window (stop) and the next released one after it (resume), if any."""

    stop_window_start: float | None
    resume_window_start: float | None
    window_seconds: float
    lateness_seconds: float

    def close_time(self, window_start: float) -> float:
        """Wall-clock time at which the window is decided (released or suppressed)."""
        return window_start + self.window_seconds + self.lateness_seconds


@dataclass(frozen=True)
class BudgetPlan:
    """What the configured budget pays for, per rolling period (all public)."""

    window_seconds: float
    period_seconds: float
    lateness_seconds: float
    cost: Cost
    accountant: AccountantKind
    epsilon: float
    delta: float

    @property
    def scheduled_per_period(self) -> int:
        """Windows that end in one rolling period."""
        return math.ceil(self.period_seconds / self.window_seconds - 1e-9)

    @functools.cached_property  # a PLD search composes distributions: do it once
    def affordable(self) -> int:
        """Windows of ``cost`` that one period's budget pays for (counted up to twice the schedule)."""
        return max_windows(self.cost, self.accountant, self.epsilon, self.delta, cap=2 * self.scheduled_per_period)

    @property
    def all_fit(self) -> bool:
        return self.affordable >= self.scheduled_per_period

    def budget_for_all(self) -> tuple[float, float]:
        """About what (epsilon, delta) budget would pay for every scheduled window.

        Exact sums under basic composition. Under PLD, composing tens of thousands of windows
        takes seconds, too slow for a start-up message, so epsilon is an upper bound: the
        smaller of the basic sum (PLD never exceeds it) and a linear scaling of what the
        budget pays for now (PLD epsilon grows at most linearly with the number of windows).
        The windows' deltas add up under either accountant.
        """
        n = self.scheduled_per_period
        eps, delta = spend({self.cost: n}, "basic", self.delta)
        if self.accountant == "pld":
            eps = min(eps, self.epsilon * n / max(self.affordable, 1))
        return eps, delta

    def forecast(self, now: float, released_ends: Iterable[float], first_start: float | None = None) -> Forecast:
        """Simulate the schedule from the first window not yet closed at ``now``.

        ``released_ends``: end times of the released windows of the last period (from the ledger).
        ``first_start``: start of the next window to decide, when the service knows it.
        """
        size, period, cap = self.window_seconds, self.period_seconds, self.affordable
        if first_start is None:
            first_start = float(math.floor((now - self.lateness_seconds) / size) * size)
        ends = deque(sorted(e for e in released_ends if e > first_start + size - period))
        stop = resume = None
        start = first_start
        # Two periods of windows always show a stop and a resume if there is one.
        for _ in range(2 * self.scheduled_per_period + 2):
            end = start + size
            while ends and ends[0] <= end - period:
                ends.popleft()
            if len(ends) < cap:
                ends.append(end)
                if stop is not None:
                    resume = start
                    break
            elif stop is None:
                stop = start
            start = end
        return Forecast(stop, resume, size, self.lateness_seconds)

    def summary(self) -> str:
        """One sentence: cost, schedule, what fits."""
        eps, delta = self.cost
        head = (f"one window costs epsilon {eps:g} (delta {delta:.2g}); {self.scheduled_per_period} windows of "
                f"{duration(self.window_seconds)} are scheduled per {duration(self.period_seconds)} period and the "
                f"budget ({self.accountant}, epsilon {self.epsilon:g}, delta {self.delta:.2g}) pays for ")
        if self.all_fit:
            return head + f"{'at least ' if self.affordable >= 2 * self.scheduled_per_period else ''}{self.affordable}: every window is released"
        return head + f"{self.affordable}: the rest are suppressed"

    def advice(self) -> str:
        """How to make every scheduled window fit (empty when they already do)."""
        if self.all_fit:
            return ""
        eps, delta = self.budget_for_all()
        longer = self.period_seconds / max(self.affordable, 1)
        budget = f"budget.epsilon of {'at most ' if self.accountant == 'pld' else ''}about {eps * 1.01:.3g}"
        if delta > self.delta:
            budget += f" and budget.delta of {delta * 1.01:.3g}"
        return (f"To release every window set {budget}, or window.size_seconds of at least {math.ceil(longer):g}, "
                f"or lower the release epsilons")

    def stop_resume_text(self, forecast: Forecast, now: float) -> str:
        """When releases stop and resume, in words (ISO UTC times)."""
        if forecast.stop_window_start is None:
            return "releases never stop at this schedule"
        stop_at = forecast.close_time(forecast.stop_window_start)
        text = (f"releases stop with the window starting {iso(forecast.stop_window_start)} "
                f"(decided at {iso(stop_at)}, in {duration(max(0.0, stop_at - now))})")
        if forecast.resume_window_start is None:
            return text + " and do not resume within two periods"
        resume_at = forecast.close_time(forecast.resume_window_start)
        return text + (f" and resume with the window starting {iso(forecast.resume_window_start)} "
                       f"(released at {iso(resume_at)}, in {duration(max(0.0, resume_at - now))}), when the first "
                       f"released window leaves the rolling period")


def plan_from_config(config) -> BudgetPlan:
    """The plan of a MonitorConfig."""
    b, w = config.budget, config.window
    return BudgetPlan(window_seconds=w.size_seconds, period_seconds=b.period_seconds, lateness_seconds=w.allowed_lateness_seconds,
                      cost=config.release.window_cost(len(config.features)), accountant=b.accountant,
                      epsilon=b.epsilon, delta=b.delta)
