"""The normal flagged rate the surge alarm measures against, estimated privately.

The alarm's statistic is f - tau n, so tau must follow the normal flagged rate: live data never
match the model's reference exactly, and the rate drifts. On a public schedule the tracker
releases the totals of the windows since its last estimate with Laplace noise; tau = flagged /
events, kappa = E[w^2] / E[w], the day's profile and their averages over days are
post-processing. ``learn_one`` takes each event's weight in [0, 1] (docs/design.md#graded-weights).

Sensitivity: one privacy unit keeps at most one event per window, so over a span of W windows
it moves the event total by at most W; its weights are clipped at a public cap per span
(``flag_cap`` for the warm-up, then ``calibrate.span_flag_cap`` from the last released
traffic), so it moves the flagged total by at most min(cap, W). Every flagged release is a
histogram whose cells split that clipped weight, so each has the total's L1 sensitivity:
``release_kappa``'s two parts sum(w^2) and sum(w - w^2); the profile over the parts of the day
(``profile_bins``); the normal traffic's parts for the report (``epsilon_parts``, daily
estimates only). With ``levels`` (a ladder of level pairs) the event count is released first,
the rung chosen from it (``calibrate.fleet_rung``), and only that rung's totals are released.

Guarantee: each estimate is (epsilon_flagged + epsilon_events [+ epsilon_parts], 0)-DP for
add/remove neighbours (the warm-up's flagged epsilon is its own). Proof:
docs/proofs/baseline.md. Without an entity field each event is its own unit.

>>> import numpy as np
>>> t = BaselineTracker(epsilon_flagged=1.0, epsilon_events=1.0, window_seconds=60, warmup_seconds=120,
...                     refresh_seconds=3600, rng=0)
>>> for start in (0, 60):
...     t.learn_one(start, start + 60, flagged=np.arange(1000) < 30)
>>> t.due(120)
True
>>> est = t.release(120)
>>> round(est.rate, 2), est.span_windows, est.epsilon
(0.03, 2, 2.0)
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from monitor.alarm.calibrate import (MIN_BASELINE_EVENTS_PER_WINDOW, baseline_problem, baseline_rate_error, fleet_rung,
                                     kappa_estimate, kappa_raised, span_flag_cap, span_windows)
from monitor.dp import noise_source

__all__ = ["BaselineEstimate", "BaselineTracker", "profile_bend", "profile_level", "profile_load", "profile_spread",
           "profile_straight", "PROFILE_HARMONICS"]

# Harmonics of the day a released profile keeps: a day and night, two shifts, three meals.
PROFILE_HARMONICS = 3
# The range of a part's load, as a share of the day's mean (``profile_load``, ``profile_level``).
_LOAD_RANGE = (0.25, 8.0)
# The share of a span's flagged epsilon spent on its profile; the rest releases the total (a
# total summed from the profile's cells would carry the noise of all of them). Against the rhythm
# reference the threshold's count at each hour comes from the profile alone, so it gets most.
PROFILE_SHARE = 0.75
# Days of released profiles averaged (equal weights; older days then decay): the shape of a
# day repeats, its noise does not.
PROFILE_DAYS = 3
# Each day the kappas released before weigh this much less (their precision, ``_average_kappa``):
# the average's noise settles at 0.45 of one day's and follows a change of make-up within days.
KAPPA_KEEP = 2.0 / 3.0
# ``profile_straight``: a line's miss of the released profile beyond this many standard deviations of
# the profile's noise is a bend, checked at every STRAIGHT_STEP-th window of the line's span.
STRAIGHT_Z = 2.5
STRAIGHT_STEP = 6


@dataclass(frozen=True)
class BaselineEstimate:
    """A released estimate of the normal flagged rate (public: it is DP).

    ``rate`` is the flagged share of events (the mean weight, with graded weights),
    ``events_per_window`` the mean number of events per window, both over [span_start,
    span_end); ``epsilon`` is what the release cost (pure DP). ``rate_error`` is the
    standard deviation of ``rate`` around the true normal rate (sampling and noise; a
    function of public numbers only: post-processing), which the alarm's threshold
    counts so that the baseline's own error does not turn into false pages.
    ``normal_parts`` are the shares of the flagged weight per report part (summing to 1),
    released with this estimate or carried from the last one that had them; None before any.
    ``flag_cap`` is the span's per-unit clip of the flagged total (None: each event a unit).
    ``kappa`` is an upper estimate of E[w^2] / E[w] (``kappa_mean`` plus one standard deviation,
    ``kappa_error``, in [KAPPA_FLOOR, 1]); None when not released. ``kappa_mean``: the released
    ratios of this span and the days before at the same levels, weighed by their precision, the
    older days' decaying (``_average_kappa``: kappa is the traffic's, its noise is each day's own);
    ``kappa_weight``: that average's precision, what the next day's release is weighed against.
    ``profile``: the normal flagged weight per window in each equal part of the day (UTC, from
    midnight) relative to the day's mean, each raised by one standard deviation of its noise
    (an upper estimate: the alarm's threshold scales its spread by it); None when not released.
    ``profile_shape``, ``profile_error``, ``profile_days``: the same before the raise, averaged
    over the last days' releases, its standard deviation, and how many days it averages.
    ``levels``: with a ladder of levels (``BaselineTracker(levels=...)``), the rung the weights
    were taken at, named by its (contamination, contamination_graded) pair
    (``calibrate.level_ladder``); None without a ladder.
    """

    rate: float
    events_per_window: float
    span_start: float
    span_end: float
    span_windows: int
    epsilon: float
    delta: float = 0.0
    mechanism: str = "laplace_global"
    rate_error: float = 0.0
    normal_parts: "tuple[float, ...] | None" = None
    flag_cap: "int | None" = None
    kappa: "float | None" = None
    kappa_mean: "float | None" = None
    kappa_error: "float | None" = None
    kappa_weight: float = 0.0
    profile: "tuple[float, ...] | None" = None
    profile_shape: "tuple[float, ...] | None" = None
    profile_error: "float | None" = None
    profile_days: int = 0
    levels: "tuple[float, float | None] | None" = None

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "BaselineEstimate":
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for key in ("normal_parts", "profile", "profile_shape"):
            if fields.get(key) is not None:
                fields[key] = tuple(float(x) for x in fields[key])
        if fields.get("levels") is not None:
            fields["levels"] = tuple(None if x is None else float(x) for x in fields["levels"])
        return cls(**fields)


class _UnitTotals(Counter):
    """Each unit's clipped weight in the span. The releaser snapshots its state before each
    window (to restore it if the ledger transaction fails); a generic deepcopy walks this
    counter entry by entry (38 s a day at 10,000 people), and its values are numbers, so a
    plain copy is a deep one."""

    def __deepcopy__(self, memo: dict) -> "_UnitTotals":
        return _UnitTotals(self)


class _SpanTotals:
    """One rung's clipped totals over the span being accumulated (private state)."""

    def __init__(self, n_parts: int, profile_bins: int) -> None:
        self.flagged = 0.0
        self.squared = 0.0  # the clipped weight's sum(w^2) part (w times each counted share)
        self.parts = np.zeros(n_parts)
        self.bins = np.zeros(profile_bins)  # per part of the day: the clipped sum w
        self.per_unit: Counter = _UnitTotals()

    def add(self, w: np.ndarray, entities: "Sequence[str | None]", parts: "np.ndarray | None", cap: "int | None",
            profile_bin: "int | None") -> None:
        """Add one window's weights, each unit's clipped at ``cap`` over the span (None: each
        event its own unit); ``parts``, each event's part (read where the weight is positive);
        the window's clipped additions go to its part of the day, so a unit's clipped weight is
        split over the parts and the profile's L1 sensitivity is the flagged total's."""
        before = self.flagged
        on = np.flatnonzero(w > 0)
        if cap is None:
            self.flagged += float(w.sum())
            self.squared += float(np.dot(w, w))
            if parts is not None:
                np.add.at(self.parts, parts[on], w[on])
        else:
            for i in on:
                e = entities[i]
                room = cap - self.per_unit[e]
                if room > 0:
                    add = min(float(w[i]), room)
                    self.per_unit[e] += add
                    self.flagged += add
                    self.squared += add * float(w[i])  # in [0, add]: the pair's parts stay non-negative
                    if parts is not None:
                        self.parts[parts[i]] += add
        if profile_bin is not None:
            self.bins[profile_bin] += self.flagged - before


class BaselineTracker:
    """Accumulates flagged and event totals window by window; releases them on schedule.

    The first estimate comes ``warmup_seconds`` after the first window, later ones every
    ``refresh_seconds``; both are public, so when a release happens says nothing about
    the data. The totals are private state, never published except through ``release``.
    """

    def __init__(self, epsilon_flagged: float, epsilon_events: float, window_seconds: float,
                 warmup_seconds: float, refresh_seconds: float, flag_cap: int | None = None,
                 epsilon_warmup: float | None = None, epsilon_parts: float | None = None, n_parts: int = 0,
                 release_kappa: bool = False, profile_bins: int = 0,
                 levels: "Sequence[tuple[float, float | None]] | None" = None, rng=None) -> None:
        epsilon_warmup = epsilon_flagged if epsilon_warmup is None else epsilon_warmup
        checked = [("epsilon_flagged", epsilon_flagged), ("epsilon_events", epsilon_events), ("epsilon_warmup", epsilon_warmup)]
        for name, value in checked + ([("epsilon_parts", epsilon_parts)] if epsilon_parts is not None else []):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if epsilon_parts is not None and n_parts < 2:
            raise ValueError(f"epsilon_parts needs at least 2 parts, got n_parts={n_parts!r}")
        self.epsilon_parts = None if epsilon_parts is None else float(epsilon_parts)
        self.n_parts = int(n_parts) if epsilon_parts is not None else 0
        self.epsilon_flagged = float(epsilon_flagged)
        self.epsilon_events = float(epsilon_events)
        self.epsilon_warmup = float(epsilon_warmup)
        self.window_seconds = float(window_seconds)
        self.warmup_seconds = float(warmup_seconds)
        self.refresh_seconds = float(refresh_seconds)
        if flag_cap is not None and (int(flag_cap) != flag_cap or flag_cap < 1):
            raise ValueError(f"flag_cap must be a positive integer or None, got {flag_cap!r}")
        self.flag_cap = None if flag_cap is None else int(flag_cap)
        self.release_kappa = bool(release_kappa)
        if int(profile_bins) != profile_bins or profile_bins < 0 or (profile_bins and 86400 % profile_bins):
            raise ValueError(f"profile_bins must be 0 or a divisor of 86400, got {profile_bins!r}")
        # A daily profile needs spans of whole days, so that every part of the day is covered alike.
        whole_days = abs(self.refresh_seconds / 86400 - round(self.refresh_seconds / 86400)) < 1e-9
        self.profile_bins = int(profile_bins) if whole_days else 0
        self.levels = None if levels is None else tuple(tuple(rung) for rung in levels)
        if self.levels is not None and not self.levels:
            raise ValueError("levels needs at least one rung")
        self._noise = noise_source(rng)
        self.estimate: BaselineEstimate | None = None
        self.refit_reason: str | None = None  # why the next span is a warm-up again (public)
        self._released = 0  # estimates released by this process
        self._span_start: float | None = None
        self._events = 0
        self._totals = self._empty_totals()

    @property
    def n_rungs(self) -> int:
        return 1 if self.levels is None else len(self.levels)

    @property
    def rung(self) -> int:
        """The ladder's rung of the estimate in use (public); 0 before any, or without a ladder."""
        est = self.estimate
        if self.levels is None or est is None or est.levels not in self.levels:
            return 0
        return self.levels.index(est.levels)

    def _empty_totals(self) -> "list[_SpanTotals]":
        return [_SpanTotals(self.n_parts, self.profile_bins) for _ in range(self.n_rungs)]

    @property
    def _next_epsilon_flagged(self) -> float:
        # The first estimate's flagged total gets epsilon_warmup: its span holds few
        # windows, so its noise weighs more per window.
        return self.epsilon_warmup if self.warming_up else self.epsilon_flagged

    @property
    def warming_up(self) -> bool:
        """No usable estimate yet: none released, or the first one is degenerate
        (``baseline_problem``: rate 0, too little traffic). Then the next span is a warm-up
        span again, so an alarm whose first estimate came too early (before the traffic
        started) tries again after ``warmup_seconds``, not a whole refresh later. Once only:
        a fleet too small for the alarm would otherwise pay a warm-up every few hours for
        an alarm that never runs. A function of the released estimates only (public)."""
        if self.estimate is None or self.refit_reason is not None:
            return True
        return self._released <= 1 and baseline_problem(self.estimate.rate, self.estimate.events_per_window) is not None

    def refit(self, reason: str) -> None:
        """Re-estimate soon: the estimate in use does not fit the traffic (the caller saw it
        in released values: ``calibrate.baseline_misfit``). The span accumulated so far is
        dropped unreleased (it mixes the old traffic with the new) and the next one is a
        warm-up span, at the warm-up's epsilon. The estimate stays in use until then."""
        self.refit_reason = str(reason)
        self.skip()

    @property
    def _releases_parts(self) -> bool:
        return self.epsilon_parts is not None and not self.warming_up

    @property
    def epsilon(self) -> float:
        """What the next estimate costs."""
        return self._next_epsilon_flagged + self.epsilon_events + (self.epsilon_parts if self._releases_parts else 0.0)

    def span_length(self) -> float:
        """Length of the span the next estimate covers (public)."""
        return self.warmup_seconds if self.warming_up else self.refresh_seconds

    def span_cap(self, rung: "int | None" = None) -> int | None:
        """The current span's per-unit clip of ``rung``'s flagged total (the rung in use by
        default; public: the config and the released estimates): ``flag_cap`` while warming up,
        then ``span_flag_cap`` at the last estimate's traffic, its rate scaled to the rung's
        upper share. Fixed for the whole span (the estimate changes only at release)."""
        if self.flag_cap is None or self.warming_up:
            return self.flag_cap
        windows = span_windows(self.refresh_seconds, self.window_seconds)
        rate = self.estimate.rate
        if rung is not None and self.levels is not None:
            rate *= self.levels[rung][0] / self.levels[self.rung][0]
        # At the whole flagged epsilon, though the total gets a quarter of it beside a profile: a
        # cap sized for the quarter clipped most people by the afternoon, and the profile's evening
        # came out empty (docs/benchmarks/alarm-rhythm.md, "Trial history").
        return span_flag_cap(self.flag_cap, self.epsilon_flagged, windows, self.estimate.events_per_window, rate)

    def span_bounds(self) -> tuple[float, float] | None:
        """[start, scheduled end) of the span being accumulated, or None before the first window."""
        if self._span_start is None:
            return None
        return self._span_start, self._span_start + self.span_length()

    def learn_one(self, window_start: float, window_end: float, flagged: "np.ndarray | Sequence[bool] | Sequence[float]",
                  entities: "Sequence[str | None]" = (), parts: "np.ndarray | None" = None) -> None:
        """Add one window's events to the current span: ``flagged`` per event (a flag, or a
        weight in [0, 1]; with ``levels``, one row per rung); with ``flag_cap`` set, each event's
        entity (to clip a unit's total weight at ``span_cap()``); with ``epsilon_parts`` set,
        each event's part (an index below ``n_parts``; read only where the weight is positive)."""
        if self._span_start is None:
            self._span_start = float(window_start)
        w = np.asarray(flagged)
        w = w.reshape(1, -1) if w.ndim < 2 else w
        if w.ndim != 2 or w.shape[0] != self.n_rungs:
            raise ValueError(f"one row of weights per rung is needed ({self.n_rungs}), got {w.shape[0]}")
        # A weight outside [0, 1] (or NaN) would break the sensitivity: clip it here, whatever the caller did.
        w = np.clip(np.nan_to_num(w.astype(float), nan=0.0), 0.0, 1.0)
        n = w.shape[1]
        self._events += int(n)
        p = None
        if self.n_parts:
            if parts is None or np.shape(parts) != (n,):
                raise ValueError("epsilon_parts needs one part per event")
            p = np.asarray(parts)
            used = p[(w > 0).any(axis=0)]
            if used.size and (used.min() < 0 or used.max() >= self.n_parts):
                raise ValueError(f"a flagged event's part is outside [0, {self.n_parts})")
        if self.flag_cap is not None and len(entities) != n:
            raise ValueError("flag_cap needs one entity per event")
        profile_bin = (int((float(window_start) % 86400.0) // (86400.0 / self.profile_bins))
                       if self.profile_bins else None)
        for rung, totals in enumerate(self._totals):
            cap = None if self.flag_cap is None else self.span_cap(rung)
            totals.add(w[rung], entities, p, cap, profile_bin)

    @property
    def _releases_profile(self) -> bool:
        return self.profile_bins > 0 and not self.warming_up

    def due(self, window_end: float) -> bool:
        """Has the current span reached its scheduled length (a function of time only)?"""
        bounds = self.span_bounds()
        return bounds is not None and window_end >= bounds[1] - 1e-9

    def release(self, window_end: float) -> BaselineEstimate:
        """Release the span's totals with Laplace noise and start a new span.

        Guarantee: (``epsilon`` as read before the call, 0)-DP for neighbours that differ by
        one privacy unit contributing at most one event per window of the span (or by
        one event, without ``flag_cap``): the event count, then one rung's flagged total and
        its profile over the day (with ``profile_bins``), each a Laplace release of
        sensitivity ``span_windows`` (the count) or the rung's span cap, at epsilons that add
        up to ``epsilon``. The rung is a function of the released count and the estimate in
        use (post-processing), and every rung's totals have the same kind of sensitivity, so
        releasing the chosen one costs what a single rung's release does.

        Returns the released estimate; it becomes ``estimate``, the one in use, unless its rate
        is unusable where the previous one's was not (``_keeps_previous``).
        """
        assert self._span_start is not None, "release() before any window"
        # Scheduled windows, not the windows seen: a gap (downtime) must not lower the
        # sensitivity below what a unit present in every window could contribute.
        w = span_windows(window_end - self._span_start, self.window_seconds)
        epsilon, eps_flagged = self.epsilon, self._next_epsilon_flagged
        events_sensitivity = 1 if self.flag_cap is None else w
        events = self._noise.laplace(events_sensitivity / self.epsilon_events, center=float(self._events))
        per_window = max(0.0, events / w)
        if per_window < MIN_BASELINE_EVENTS_PER_WINDOW:
            return self._release_count_only(window_end, w, per_window)
        # The count comes first: it chooses the rung whose totals are released.
        rung = self._choose_rung(per_window if events >= w else None)
        levels = None if self.levels is None else self.levels[rung]
        totals = self._totals[rung]
        cap = self.span_cap(rung)
        flagged_sensitivity = 1 if cap is None else min(cap, w)
        # What the released values are averaged with or fall back on: the estimate in use, at
        # the same levels only (another rung's weights are another scale).
        previous = self.estimate if self.estimate is not None and self.estimate.levels == levels else None
        kappa = k_mean = k_error = None
        k_weight = 0.0
        profile = previous.profile if previous is not None else None
        p_shape, p_error, p_days = ((previous.profile_shape, previous.profile_error, previous.profile_days)
                                    if previous is not None else (None, None, 0))
        # Two histograms, each of L1 sensitivity the flagged total's (a unit's clipped weight is
        # split over its cells): the total as (sum w^2, sum w - w^2), for kappa, and with a
        # profile the total per part of the day, at the rest of the epsilon (PROFILE_SHARE).
        eps_total = eps_flagged * (1.0 - PROFILE_SHARE) if self._releases_profile else eps_flagged
        scale = flagged_sensitivity / eps_total
        cells = np.array([totals.squared, totals.flagged - totals.squared])
        if not self.release_kappa:
            cells = cells.sum(keepdims=True)
        noisy = np.atleast_1d(self._noise.laplace(scale, center=cells))
        flagged = float(noisy.sum())
        estimate = kappa_estimate(float(noisy[0]), flagged, scale) if self.release_kappa else None
        if estimate is not None:
            # After a refit the traffic is not the one the earlier kappas came from.
            k_mean, k_error, k_weight = _average_kappa(*estimate, None if self.refit_reason else previous)
            kappa = kappa_raised(k_mean, k_error)
        if self._releases_profile:
            # Post-processing: the day's shape up to PROFILE_HARMONICS harmonics (most of the
            # noise is in the rest), raised by one standard deviation of what noise is left.
            scale_profile = flagged_sensitivity / (eps_flagged - eps_total)
            per_bin = np.atleast_1d(self._noise.laplace(scale_profile, center=totals.bins.copy()))
            keep = min(PROFILE_HARMONICS, self.profile_bins // 2)
            spectrum = np.fft.rfft(per_bin)
            spectrum[keep + 1:] = 0.0
            smooth = np.fft.irfft(spectrum, n=self.profile_bins)
            left = math.sqrt(min(1.0, (2 * keep + 1) / self.profile_bins))
            # Over the total's mean per part: the threshold's count at an hour, tau n_bar load,
            # is then the profile's own (per window of the part), whatever the total's noise.
            mean = flagged / self.profile_bins
            if mean > 0:
                p_shape, p_error, p_days = _average_days(smooth / mean, scale_profile * math.sqrt(2.0) * left / mean,
                                                         previous)
                profile = _upper_loads(np.asarray(p_shape), p_error)
        normal_parts = previous.normal_parts if previous is not None else None
        if self._releases_parts:
            # One histogram: a unit's shares over the parts sum to its clipped weight (at most the
            # cap), so the L1 sensitivity is the flagged total's.
            part_noise = self._noise.laplace(flagged_sensitivity / self.epsilon_parts, center=totals.parts.astype(float))
            normal_parts = _shares(np.atleast_1d(part_noise)) or normal_parts
        # Post-processing: a rate in [0, 1]; with (almost) no traffic keep the previous one.
        if events >= w:
            rate = min(1.0, max(0.0, flagged / events))
        else:
            rate = previous.rate if previous is not None else 0.0
        error = baseline_rate_error(rate, per_window, w, eps_total, self.epsilon_events, flagged_sensitivity,
                                    events_sensitivity, flagged_parts=int(noisy.size))
        released = BaselineEstimate(
            rate=rate, events_per_window=per_window, span_start=self._span_start, span_end=float(window_end),
            span_windows=w, epsilon=epsilon, rate_error=error, normal_parts=normal_parts, flag_cap=cap, kappa=kappa,
            kappa_mean=k_mean, kappa_error=k_error, kappa_weight=k_weight, profile=profile, profile_shape=p_shape,
            profile_error=p_error, profile_days=p_days, levels=levels,
        )
        if not self._keeps_previous(released):
            self.estimate = released
        self._released += 1
        self.refit_reason = None
        self.skip()
        return released

    def _choose_rung(self, events_per_window: "float | None") -> int:
        """The rung whose totals the release publishes (public: the released count, the estimate
        in use); the rung in use when the count says nothing (almost no traffic)."""
        current = self.rung if self.estimate is not None else None
        if self.levels is None or len(self.levels) == 1:
            return 0
        if events_per_window is None:
            return current or 0
        return fleet_rung(self.levels, events_per_window, current)

    def _release_count_only(self, window_end: float, w: int, per_window: float) -> BaselineEstimate:
        """The released count says the span had too little traffic for any rate (``baseline_problem``):
        its flagged totals are not released, and the estimate costs the count's epsilon alone
        (``epsilon_events``; a choice from a released value: post-processing). It carries the
        previous rate, so the alarm stays warming up, and the next span is a warm-up span again."""
        previous = self.estimate
        released = BaselineEstimate(
            rate=previous.rate if previous is not None else 0.0, events_per_window=per_window,
            span_start=float(self._span_start), span_end=float(window_end), span_windows=w, epsilon=self.epsilon_events,
            rate_error=previous.rate_error if previous is not None else 0.0,
            levels=previous.levels if previous is not None else (None if self.levels is None else self.levels[0]))
        if not self._keeps_previous(released):
            self.estimate = released
        self.refit_reason = None
        self.skip()
        return released

    def _keeps_previous(self, released: BaselineEstimate) -> bool:
        """A refresh whose rate came out unusable (0: its noise was larger than the count, which
        a small fleet's daily span can give) while the traffic is still there leaves the previous
        usable estimate in use, rather than silencing the alarm until the next refresh (public:
        released values only)."""
        old = self.estimate
        return (old is not None and baseline_problem(old.rate, old.events_per_window) is None
                and baseline_problem(released.rate, released.events_per_window) is not None
                and baseline_problem(old.rate, released.events_per_window) is None)

    def skip(self) -> None:
        """Drop the current span unreleased (the budget could not pay for it)."""
        self._span_start, self._events = None, 0
        self._totals = self._empty_totals()

    def resume(self, estimate: BaselineEstimate | None) -> None:
        """Continue from a published estimate (after a restart): no warm-up again."""
        self.estimate = estimate


def _shares(noisy: np.ndarray) -> "tuple[float, ...] | None":
    """Noisy part totals as shares of their sum (post-processing): negatives are 0; None
    when nothing is left."""
    clipped = np.maximum(noisy, 0.0)
    total = float(clipped.sum())
    if not total > 0:
        return None
    return tuple(float(x) for x in clipped / total)


def _upper_loads(shape: np.ndarray, error: float) -> "tuple[float, ...]":
    """Each part's load for the threshold (post-processing): the largest of its own shape and its
    two neighbours' (a shift change may come an hour early or late, and 3 harmonics round a
    switch's edges, so the hour after a switch to day would keep the night's threshold), raised
    by one standard deviation, in [0.25, 8].

    >>> _upper_loads(np.array([1.0, 1.0, 2.0, 1.0]), 0.1)
    (1.1, 2.1, 2.1, 2.1)
    """
    wide = np.maximum(shape, np.maximum(np.roll(shape, 1), np.roll(shape, -1)))
    return tuple(float(x) for x in np.clip(wide + error, *_LOAD_RANGE))


def _average_days(shape: np.ndarray, error: float, previous: "BaselineEstimate | None"
                  ) -> "tuple[tuple[float, ...], float, int]":
    """The day's shape (each part's flagged weight over the day's mean) averaged with the shapes
    released on the days before, up to PROFILE_DAYS at equal weight, then the older ones
    decaying (post-processing of released values): one day's noise at 1,500 people is about 40 %
    of each part's count, three days' about 23 %, and the decaying average settles at 0.45 times
    one day's. Returns (shape, its standard deviation, days averaged)."""
    prev = None if previous is None else previous.profile_shape
    if prev is None or len(prev) != len(shape) or previous.profile_error is None:
        return tuple(float(x) for x in shape), float(error), 1
    days = min(previous.profile_days + 1, PROFILE_DAYS)
    new = 1.0 / days
    mixed = new * np.asarray(shape) + (1.0 - new) * np.asarray(prev)
    sd = math.hypot(new * error, (1.0 - new) * previous.profile_error)
    return tuple(float(x) for x in mixed), sd, days


def _average_kappa(kappa: float, error: float, previous: "BaselineEstimate | None") -> tuple[float, float, float]:
    """A span's released kappa (``calibrate.kappa_estimate``: ratio, standard deviation) averaged
    with those released before at the same levels (post-processing of released values), each
    weighed by its precision, 1 / error^2, the older ones times KAPPA_KEEP per release: a warm-up's
    noisy ratio counts little against a day's, and the average's noise settles at 0.45 of one day's.
    Returns (mean, its standard deviation, its precision).

    The standard deviation is that of the weighted mean, sum p_i^2 e_i^2 / (sum p_i)^2 with p_i
    the weights: carried as the precision sum S1 = sum p_i and S2 = sum p_i^2 e_i^2 = error^2 S1^2.

    >>> m, e, w = _average_kappa(0.6, 0.1, None)
    >>> prev = BaselineEstimate(0.03, 1000.0, 0.0, 1.0, 1, 0.1, kappa_mean=m, kappa_error=e, kappa_weight=w)
    >>> [round(x, 4) for x in _average_kappa(0.7, 0.1, prev)]   # one day at 2/3 of its weight
    [0.66, 0.0721, 166.6667]
    """
    new = 1.0 / max(error, 1e-12) ** 2
    if previous is None or previous.kappa_mean is None or previous.kappa_error is None or not previous.kappa_weight > 0:
        return float(kappa), float(error), new
    old = KAPPA_KEEP * previous.kappa_weight
    weight = old + new
    mean = (old * previous.kappa_mean + new * kappa) / weight
    # S2 = sum p_i^2 e_i^2: the earlier ones' shrink with their weight, squared.
    spread = KAPPA_KEEP ** 2 * (previous.kappa_error * previous.kappa_weight) ** 2 + new ** 2 * error ** 2
    return float(mean), float(math.sqrt(spread) / weight), float(weight)


def profile_load(estimate: "BaselineEstimate | None", window_start: float) -> "float | None":
    """The released profile's factor for the part of the day holding ``window_start`` (public);
    None without a profile."""
    return None if estimate is None else _part_of_day(estimate.profile, window_start)


def profile_level(estimate: "BaselineEstimate | None", window_start: float) -> "float | None":
    """The released profile's own shape at the part of the day holding ``window_start``, in the
    loads' [0.25, 8] but without what ``profile_load`` adds (its neighbours' and a standard
    deviation of its noise; public). A threshold that follows the level is a line that covers
    every flagged level from 0 to 4 times the hour's expected one (``SurgeAlarm.level_line``):
    where the level stands is the statistic's own business, so the line needs the hour's best
    estimate to lie lowest there, not an upper one. None without a profile."""
    shape = None if estimate is None else _part_of_day(estimate.profile_shape, window_start)
    return None if shape is None else float(np.clip(shape, *_LOAD_RANGE))


def profile_spread(estimate: "BaselineEstimate | None", level: bool = True) -> "tuple[float, ...]":
    """The quietest, the middle and the busiest part of the released profile's day, as
    ``profile_level`` (``level``) or ``profile_load`` gives them (public); () without a profile. A
    run lasts the day, and what its slack costs grows with the level (``WindowReleaser._slack_for``);
    on flat traffic the noise of the busiest and of the quietest part cancel out.

    >>> profile_spread(BaselineEstimate(0.02, 1000.0, 0.0, 1.0, 1, 0.1, profile=(1.2, 1.0, 0.8), profile_shape=(1.4, 0.1, 1.0)))
    (0.25, 1.0, 1.4)
    """
    parts = None if estimate is None else (estimate.profile_shape if level else estimate.profile)
    if not parts:
        return ()
    ordered = np.sort(np.clip(np.asarray(parts, dtype=float), *_LOAD_RANGE))
    return tuple(float(x) for x in (ordered[0], ordered[len(ordered) // 2], ordered[-1]))


def profile_bend(estimate: "BaselineEstimate | None", window_start: float, windows: int, window_seconds: float
                 ) -> "tuple[float, float] | None":
    """How far the least-squares line through the released profile's curve over the ``windows``
    windows before ``window_start``, extrapolated to that window, misses the curve there, as a share of
    the day's mean flagged weight, and the standard deviation of that miss from the profile's noise
    (public: post-processing of the profile). The profile keeps PROFILE_HARMONICS harmonics, so its
    parts are samples of a smooth curve, evaluated between them exactly, and the miss is a linear
    function of the parts: what a line through the last hours misses where the day bends (a shift
    change), and on flat traffic only the profile's noise. None without a profile.

    >>> flat = BaselineEstimate(0.02, 1000.0, 0.0, 1.0, 1, 0.1, profile_shape=(1.0,) * 24, profile_error=0.1)
    >>> [round(x, 3) for x in profile_bend(flat, 43200.0, 36, 300.0)]
    [0.0, 0.027]
    """
    shape = None if estimate is None else estimate.profile_shape
    if not shape:
        return None
    weights, noise = _miss_weights(len(shape), float(window_start) % 86400.0, int(windows), float(window_seconds))
    return float(abs(weights @ np.asarray(shape, dtype=float))), float(estimate.profile_error or 0.0) * noise


def profile_straight(estimate: "BaselineEstimate | None", window_start: float, windows: int, window_seconds: float
                     ) -> bool:
    """Whether the released profile is straight over the ``windows`` windows before ``window_start`` and
    that window (public): at that window and at every STRAIGHT_STEP-th window before it, back to the
    span's start, a line through the ``windows`` windows before misses the profile's curve by at most
    STRAIGHT_Z standard deviations of the miss's noise (``profile_bend``). A line through the span
    then follows the traffic as far as the profile can tell. The profile keeps 3 harmonics, so a shift
    change that takes an hour shows as a curve that bends all day, and its flat hours are not taken
    for straight; a curve's inflection is straight at one point only. False without a profile.

    >>> flat = BaselineEstimate(0.02, 1000.0, 0.0, 1.0, 1, 0.1, profile_shape=(1.0,) * 24, profile_error=0.1)
    >>> profile_straight(flat, 43200.0, 36, 300.0), profile_straight(None, 43200.0, 36, 300.0)
    (True, False)
    """
    bends = [profile_bend(estimate, window_start - back * window_seconds, windows, window_seconds)
             for back in range(0, int(windows) + 1, STRAIGHT_STEP)]
    if bends[0] is None:
        return False
    return all(miss <= STRAIGHT_Z * noise for miss, noise in bends)


@lru_cache(maxsize=4096)
def _miss_weights(parts: int, time_of_day: float, windows: int, window_seconds: float) -> "tuple[np.ndarray, float]":
    """``profile_bend``'s weights on the profile's parts, and the standard deviation of the miss per unit
    of ``profile_error``: a function of the calendar alone, the same every day."""
    spectra = np.fft.rfft(np.eye(parts), axis=1) / parts
    step = window_seconds * parts / 86400.0
    now = time_of_day * parts / 86400.0 + step / 2.0 - 0.5  # part k's value is its middle's
    x = now - step * np.arange(windows, -1, -1, dtype=float)
    k = np.arange(spectra.shape[1])
    weight = np.where((k == 0) | (2 * k == parts), 1.0, 2.0)
    curves = ((np.exp(2j * np.pi * np.outer(x, k) / parts) * weight) @ spectra.T).real  # (points, parts)
    before = x[:-1] - x[:-1].mean()
    line = 1.0 / before.size + before * (x[-1] - x[:-1].mean()) / float(before @ before)
    miss = curves[-1] - line @ curves[:-1]
    # Each part's noise before smoothing is profile_error over the share of it the kept harmonics keep.
    keep = min(PROFILE_HARMONICS, parts // 2)
    kept = np.fft.rfft(miss)
    kept[keep + 1:] = 0.0
    noise = float(np.linalg.norm(np.fft.irfft(kept, n=parts))) / math.sqrt(min(1.0, (2 * keep + 1) / parts))
    miss.setflags(write=False)
    return miss, noise


def _part_of_day(parts: "tuple[float, ...] | None", window_start: float) -> "float | None":
    if not parts:
        return None
    return parts[int((float(window_start) % 86400.0) // (86400.0 / len(parts)))]
