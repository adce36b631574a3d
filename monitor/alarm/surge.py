"""The continual private surge alarm (docs/design.md#the-alarm): one yes/no answer per window.

Statistic of window i: a_i = f_i - tau n_i, with f_i the sum of the events' weights
(graded, ``monitor.alarm.calibrate.weight_units``: each in [0, 1]; a plain flag is 0 or
1), n_i the events, and tau the released baseline rate, the normal mean weight
(``monitor.alarm.baseline``). With one event per privacy unit per window, one unit
moves every a_i by an amount in [-tau, 1 - tau]: an interval of width 1. Traffic swings
cancel out in a_i, so n_i is never released.

The answer "is a_i above T_i?" comes from AboveThreshold runs (``AboveThreshold``). T_i
is derived from a stated false-page rate (``false_pages_per_30_days``: the statistic's
normal spread at the released traffic n_bar, the baseline's own ``rate_error`` and this
alarm's noise, ``monitor.alarm.calibrate``), or, with an absolute ``threshold``,
threshold + z sqrt(tau n_bar) + rate_margin tau n_bar: public numbers only either way. A run's threshold is paid when it opens, each page when it is
given; quiet windows are free. A positive answer pages; the alarm then holds for
``hold_windows`` windows (answered "alarm" without a query, so a surge pages once and
pays once) and resumes with the same run. The caller decides how long a run lasts (the
releaser: a quiet run goes on, one that has paged ends at its calendar boundary).

Exactness: tau is rounded to a multiple of 1 / RESOLUTION (post-processing) and each weight
is an integer number of 1 / RESOLUTION, so RESOLUTION a_i is an integer, and so is every
comparison. One tau band per run: a run fixes, when it opens, a public band of width TAU_BAND
around its baseline's rate, clamps the rate it uses into it and widens the pages' noise by it
(each page still costs exactly epsilon_page); ``accepts`` tells the caller when a new baseline
has left the band, so that it ends the run (a tau that moved freely would cost more per page).

Guarantee: a run that pages k times is (epsilon_threshold + k epsilon_page, 0)-DP for
entity-level neighbours over all the windows it answers, for every outcome (see
``AboveThreshold``). The caller charges epsilon_threshold over the run's span (from its first
window less the reference's reach: docs/budget.md) when it opens, epsilon_page over the same span
with each page, and asks (``can_page``) only when its budget could pay. Proof: docs/proofs/alarm-run.md.

>>> alarm = SurgeAlarm(epsilon_threshold=1.0, epsilon_page=1.0, threshold=20, z=3.0, hold_windows=2, rng=1)
>>> base = BaselineEstimate(rate=0.01, events_per_window=1000, span_start=0, span_end=60, span_windows=1, epsilon=0.2)
>>> alarm.open_run(run_id=1, baseline=base)
>>> [alarm.answer_one(f, 1000, base).state for f in (9, 12, 80, 85, 90, 10)]
['quiet', 'quiet', 'fired', 'held', 'held', 'quiet']
>>> alarm.svt.epsilon_spent  # the threshold and one page
2.0
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, Sequence

from monitor.alarm.above_threshold import AboveThreshold
from monitor.alarm.baseline import BaselineEstimate
from monitor.alarm.calibrate import LEVEL_REACH, at_hour, false_page_threshold, level_line
from monitor.alarm.reference import Comparison, prediction_factors
from monitor.alarm.slack import expected_lift
from monitor.alarm.units import BAND_UNITS as _BAND_UNITS
from monitor.alarm.units import RESOLUTION, TAU_BAND, band_around, rate_units, rhythm_interval

# Thresholds kept: a day's profile has 24 parts, each with a line per prediction the reference uses.
_DERIVED_KEPT = 2048
# The threshold's line is derived per twentieth of the prediction's squared coefficients (``SurgeAlarm.level_line``).
LINE_STEPS = 20

__all__ = ["SurgeAlarm", "AlarmAnswer", "RESOLUTION", "TAU_BAND", "AlarmState"]


AlarmState = Literal["fired", "held", "quiet", "warming_up", "suppressed", "off"]


@dataclass(frozen=True)
class AlarmAnswer:
    """One window's alarm answer, as published (every field is public).

    ``state``: "fired" (a positive answer: page), "held" (within ``hold_windows`` after
    one: still paging, no query), "quiet" (a negative answer), "warming_up" (no baseline
    yet: no query), "suppressed" (the budget could not pay for a run or for a page: no
    query), "off" (``alarm.enabled`` is false). ``epsilon``: what the answering run has
    cost so far, this answer's page included (pure DP). ``slack``: the answering run's slack
    against the rhythm reference (its interval is [-(top of the tau band + slack), 1]; the
    ``WindowReleaser`` chooses it from public numbers before the run's first query); None without
    the reference or an open run.
    """

    state: AlarmState
    run: int | None
    epsilon: float
    threshold: float | None
    baseline_rate: float | None
    delta: float = 0.0
    mechanism: str = "above_threshold"
    problem: str | None = None  # why the released baseline is not used (warming_up): announced, never silent
    compared_with: str | None = None  # the rhythm reference's mode ("baseline", "recent", "rhythm"); None without one
    slack: float | None = None

    @property
    def alarm(self) -> bool:
        return self.state in ("fired", "held")

    def as_dict(self) -> dict:
        return asdict(self)


class SurgeAlarm:
    """AboveThreshold runs over the surge statistic, with a hold after each page.

    Parameters
    ----------
    epsilon_threshold, epsilon_page:
        A run's privacy (see ``AboveThreshold``): its threshold costs epsilon_threshold,
        each page epsilon_page.
    threshold:
        Excess (weighted) events per window (above tau n) that count as a surge; None:
        derived from ``false_pages_per_30_days`` (``monitor.alarm.calibrate``).
    z:
        Extra margin in standard deviations of the natural (binomial) variation of the
        flagged count, sqrt(tau n_bar): large windows fluctuate more.
    rate_margin:
        Extra margin as a share of the expected flagged count tau n_bar: the normal rate
        moves within a day (who is online) more than a daily baseline follows.
    hold_windows:
        Windows answered "alarm" after a positive, with no query and no cost.
    trend_hold_windows:
        The hold after a positive whose comparison was the first day's trend (mode "recent"):
        that trend cannot tell a surge from a shift that starts and lags the change until it
        has gone through it (the releaser gives ``alarm.trend_hold``). None: ``hold_windows``.
    false_pages_per_30_days, window_seconds:
        With ``threshold`` None: the expected false pages per 30 days of quiet traffic the
        derived threshold allows, and the window length that turns it into a per-window rate.
    traffic_swing:
        Daily swing of the traffic around the baseline's mean (public): the false-page rate
        is averaged over it.
    kappa:
        E[w^2] / E[w] of normal events' weights (public, from the model's calibration;
        1 is the safe bound, exact for plain flags): scales the normal spread. A baseline
        that released its own (``BaselineEstimate.kappa``, from the traffic) replaces it.
    slack_units:
        The configured slack against the rhythm reference (``alarm.rhythm_slack``, in 1 / RESOLUTION): a
        run that opens narrower counts in its thresholds what the narrowing adds to the clip's lift
        (``level_line``). None: no rhythm reference.
    rng:
        None in production (OpenDP); a seed for tests.
    """

    def __init__(self, epsilon_threshold: float, epsilon_page: float, threshold: float | None, z: float = 3.0,
                 hold_windows: int = 3, rate_margin: float = 0.0, rng=None, false_pages_per_30_days: float = 1.0,
                 window_seconds: float = 300.0, kappa: float = 1.0, traffic_swing: float = 0.0,
                 trend_hold_windows: "int | None" = None, slack_units: "int | None" = None) -> None:
        if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
            raise ValueError(f"threshold must be a non-negative number or None, got {threshold!r}")
        if not (math.isfinite(false_pages_per_30_days) and false_pages_per_30_days > 0):
            raise ValueError(f"false_pages_per_30_days must be a positive number, got {false_pages_per_30_days!r}")
        if not (math.isfinite(kappa) and 0 < kappa <= 1):
            raise ValueError(f"kappa must be in (0, 1], got {kappa!r}")
        if not (math.isfinite(z) and z >= 0):
            raise ValueError(f"z must be a non-negative number, got {z!r}")
        if not (math.isfinite(rate_margin) and rate_margin >= 0):
            raise ValueError(f"rate_margin must be a non-negative number, got {rate_margin!r}")
        if int(hold_windows) != hold_windows or hold_windows < 0:
            raise ValueError(f"hold_windows must be a non-negative integer, got {hold_windows!r}")
        self.svt = AboveThreshold(epsilon_threshold, epsilon_page, width=RESOLUTION, drift=_BAND_UNITS, rng=rng)
        self.threshold = None if threshold is None else float(threshold)
        self.false_pages_per_30_days = float(false_pages_per_30_days)
        self.window_seconds = float(window_seconds)
        self.kappa = float(kappa)
        self.traffic_swing = float(traffic_swing)
        self._derived: dict[tuple, float] = {}
        self.z = float(z)
        self.rate_margin = float(rate_margin)
        self.hold_windows = int(hold_windows)
        if trend_hold_windows is not None and (int(trend_hold_windows) != trend_hold_windows or trend_hold_windows < 0):
            raise ValueError(f"trend_hold_windows must be a non-negative integer or None, got {trend_hold_windows!r}")
        self.trend_hold_windows = self.hold_windows if trend_hold_windows is None else int(trend_hold_windows)
        if slack_units is not None:
            _check_slack(slack_units)
        self.configured_slack_units = None if slack_units is None else int(slack_units)
        self.run: int | None = None
        self._hold_left = 0
        self._band: tuple[int, int] | None = None  # the open run's [m_lo, m_hi], in 1 / RESOLUTION
        self.slack_units: int | None = None  # the open run's slack (``open_run``)

    @property
    def holding(self) -> bool:
        return self._hold_left > 0

    def needs_run(self) -> bool:
        """True when the next query needs a new (charged) run."""
        return not self.holding and not self.svt.active

    @property
    def low_units(self) -> int:
        """How far below 0 one unit's term may go in the open run (its interval is
        [-low_units, RESOLUTION]; the rhythm reference clips to it), fixed when it opened."""
        return self.svt.width - RESOLUTION

    def open_run(self, run_id: int, baseline: BaselineEstimate | None = None, slack_units: int | None = None) -> None:
        """Start run ``run_id``: call only after its charge is recorded. Its tau band is
        centred on ``baseline``'s rate (on the first answered window's, if None).

        ``slack_units`` (with the rhythm reference, which needs ``baseline``): the run's
        interval is [-(m_hi + slack_units), RESOLUTION], m_hi the top of its tau band, for
        every query it answers: the reference's clipped terms, and the plain statistic's
        [-m, RESOLUTION - m] for any m in the band. One interval for the whole run, so its
        noise needs no drift; the threshold's noise covers the interval's reach,
        max(RESOLUTION, m_hi + slack_units), the pages' its width (``AboveThreshold``).
        """
        if slack_units is not None:
            _check_slack(slack_units)
            if baseline is None:
                raise ValueError("a run with a slack needs the baseline it opens on")
            width, reach = rhythm_interval(baseline.rate, int(slack_units))
            self.svt.width, self.svt.drift, self.svt.reach = width, 0, reach
        else:
            self.svt.width, self.svt.drift, self.svt.reach = RESOLUTION, _BAND_UNITS, RESOLUTION
        self.slack_units = None if slack_units is None else int(slack_units)
        self.svt.start()
        self.run = int(run_id)
        self._band = None if baseline is None else band_around(baseline.rate)

    def run_state(self) -> dict:
        """What ``resume_run`` needs to go on with the open run in another process: its number, its
        interval and tau band, and its threshold noise (SECRET: ``monitor.budget.run_state``)."""
        svt = self.svt
        return {"run": self.run, "rho": svt._rho, "width": svt.width, "drift": svt.drift, "reach": svt.reach,
                "band": None if self._band is None else list(self._band), "slack_units": self.slack_units}

    def resume_run(self, state: dict) -> None:
        """Go on with a quiet run a stopped process opened (its charge still open in the ledger):
        the same threshold noise, interval and band, so its answers stay one AboveThreshold run."""
        width, drift, reach = int(state["width"]), int(state["drift"]), int(state["reach"])
        if state["slack_units"] is not None:
            _check_slack(state["slack_units"])
        self.svt.width, self.svt.drift, self.svt.reach = width, drift, reach
        self.svt.resume(state["rho"])
        self.run = int(state["run"])
        self._band = None if state["band"] is None else (int(state["band"][0]), int(state["band"][1]))
        self.slack_units = None if state["slack_units"] is None else int(state["slack_units"])
        self._hold_left = 0

    def accepts(self, baseline: BaselineEstimate | None) -> bool:
        """Can the open run use ``baseline``'s rate without clamping it (public)?

        False once a refreshed baseline has left the run's band: the caller should end the
        run and open a new one, or the clamped tau would bias the statistic.
        """
        if self._band is None or baseline is None:
            return True
        return self._band[0] <= rate_units(baseline.rate) <= self._band[1]

    def run_rate_units(self, baseline: BaselineEstimate) -> int:
        """The m of a_i = (RESOLUTION f - m n) / RESOLUTION the open run uses with ``baseline``."""
        if self._band is None:
            self._band = band_around(baseline.rate)
        lo, hi = self._band
        return min(max(rate_units(baseline.rate), lo), hi)

    @property
    def has_paged(self) -> bool:
        """The open run has given a page (its pages are charged over its whole span)."""
        return self.svt.active and self.svt.positives > 0

    def close_run(self) -> None:
        """Forget the run (its span ended, its tau band was left, or a restart)."""
        self.svt.stop()
        self.run = None
        self._band = None
        self.slack_units = None

    def window_threshold(self, baseline: BaselineEstimate, comparison: Comparison | None = None,
                         load: float | None = None, interval: "tuple[int, int] | None" = None) -> float:
        """T_i in events: public, from the config, the released baseline (``load``: its daily
        profile's factor at this window's hour, ``baseline.profile_load``; where the comparison
        follows the level, the profile's own shape there, ``baseline.profile_level``, the line's
        anchor) and the reference's public mode (``comparison.mode`` and ``variance_factor``) only. ``interval``:
        as in ``level_line``, which also says how the clip's lift is counted."""
        expected = max(0.0, baseline.rate * baseline.events_per_window)
        if self.threshold is not None:
            return self.threshold + self.z * math.sqrt(expected) + self.rate_margin * expected
        # This alarm's own noise scales, in events (the pages' noise is widened by the tau band).
        # A baseline is released once a day and the reference has three modes: few thresholds to derive.
        against = comparison is not None and comparison.mode != "baseline"
        if against and comparison.follows_level:
            return self._line_for(baseline, comparison, load, interval)[2]
        factor = comparison.variance_factor if against else 1.0
        skew = comparison.skew_factor if against else 1.0
        # Against the rhythm reference the baseline's rate enters only through n_i minus its
        # prediction, so its error is left out; the prediction's own error takes its place.
        rate_error = comparison.relative_error * baseline.rate if against else baseline.rate_error
        prediction = self._counted(baseline, comparison.prediction if against else (), interval)
        key = (baseline.rate, baseline.events_per_window, rate_error, baseline.kappa, round(factor, 9), round(skew, 9), load,
               self._scales(interval), prediction)
        if key not in self._derived:
            if len(self._derived) > _DERIVED_KEPT:
                self._derived.clear()
            self._derived[key] = (self._derive(baseline, factor, rate_error, load, skew_factor=skew, scales=self._scales(interval))
                                  + self._lift(baseline, prediction, baseline.rate * (load or 1.0), 0.0, interval))
        return self._derived[key]

    def level_line(self, baseline: BaselineEstimate, coefficients: float, relative_error: float,
                   load: float | None = None, cubes: float = 0.0, interval: "tuple[int, int] | None" = None,
                   prediction: Sequence[float] = ()) -> tuple[float, float, float]:
        """(slope, intercept, threshold at the expected level), in events: the threshold as a line in
        the window's predicted flagged weight F, at or above the one ``false_pages_per_30_days``
        derives at every F from 0 to 4 times the expected rate x events (``calibrate.LEVEL_REACH``).
        Public: from the released baseline, the profile's ``load`` (the caller passes the hour's
        own shape, ``baseline.profile_level``: the line is lowest there, and covers any level the
        hour really has within the reach) and the reference's public ``outline``
        (``coefficients``: the sum of the prediction's squared coefficients; ``cubes``: of its
        coefficients cubed, ``Comparison.skew_factor``).

        The reference takes slope x F off its statistic (``RhythmReference.compare``), so the
        alarm compares it with the intercept: a flagged level the released rate did not expect
        (a warm-up at night, a shift that starts, new firmware) meets the threshold that level
        needs, with no release. Taking slope x F off adds (1 + slope)^2 times the coefficients to
        the statistic's spread, so the slope is found again with it. ``interval``: the (width, reach) of
        a run about to open (``rhythm_interval``); None: the open run's.

        ``prediction`` (``RhythmReference.outline``: its coefficient on each window): the threshold at
        each level also counts what the clip at the interval's low end adds to the statistic there on
        average (``monitor.alarm.slack.expected_lift``), which grows with the level and with the slope:
        a narrow interval pays for itself where the level is high, not in false pages."""
        # Coefficient sums rounded up to a twentieth: a first day's trend bridges the windows that
        # paged, and each pattern of them would cost a derivation of its own.
        coefficients = math.ceil(round(coefficients * LINE_STEPS, 6)) / LINE_STEPS
        # Only a negative sum of cubes moves the threshold (``Comparison.skew_factor``): rare, and rounded to a
        # twentieth away from 0, as the squares are.
        cubes = -math.ceil(round(-cubes * LINE_STEPS, 6)) / LINE_STEPS if cubes < 0 else 0.0
        scales = self._scales(interval)
        prediction = self._counted(baseline, prediction, interval)
        key = ("line", baseline.rate, baseline.events_per_window, baseline.kappa, coefficients, cubes, relative_error, load,
               scales, prediction)
        if key not in self._derived:
            if len(self._derived) > _DERIVED_KEPT:
                self._derived.clear()
            expected = at_hour(baseline.events_per_window, 0.0, 0.0, load)[0] * baseline.rate
            levels = [k * expected for k in LEVEL_REACH]

            def thresholds(slope: float, reach: "tuple[float, ...]" = LEVEL_REACH) -> list[float]:
                # At each level, with the spread of a statistic that takes slope x F off.
                factor, skew = prediction_factors(slope, coefficients, cubes)
                return [self._derive(baseline, factor, relative_error * k * baseline.rate, load, k * baseline.rate, skew,
                                     scales) + self._lift(baseline, prediction, k * baseline.rate * (load or 1.0), slope, interval)
                        for k in reach]

            # The thresholds are found at a slope a little above the one they give, so the spread
            # they assume covers the statistic's; where it does not, once more, then that slope.
            # The first guess: the chord from the expected level to the top of the reach.
            low, high = thresholds(0.0, (1.0, LEVEL_REACH[-1]))
            guess = 1.1 * max(0.0, (high - low) / ((LEVEL_REACH[-1] - 1.0) * max(expected, 1e-9))) + 0.01
            for attempt in range(2):
                at = thresholds(guess)
                slope, intercept = level_line(levels, at, expected)
                if slope <= guess:
                    break
                if attempt:  # the slope the thresholds were found at, with an intercept above them all
                    slope, intercept = guess, max(t - guess * f for t, f in zip(at, levels))
                else:
                    guess = 1.1 * slope
            self._derived[key] = (slope, intercept, intercept + slope * expected)
        return self._derived[key]

    def _line_for(self, baseline: BaselineEstimate, comparison: Comparison, load: float | None,
                  interval: "tuple[int, int] | None" = None) -> tuple[float, float, float]:
        line = self.level_line(baseline, comparison.coefficients, comparison.relative_error, load, comparison.cubes, interval,
                               comparison.prediction)
        if not math.isclose(line[0], comparison.level_slope, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError("the comparison's level_slope is not this alarm's (level_line) for its baseline and hour")
        return line

    def _low_ends(self, baseline: BaselineEstimate, interval: "tuple[int, int] | None") -> tuple[int, int]:
        """(the low end of ``interval``, None: of the open run's; that of the configured slack), in 1 / RESOLUTION."""
        low = (self.svt.width if interval is None else interval[0]) - RESOLUTION
        return low, band_around(baseline.rate)[1] + (self.configured_slack_units or 0)

    def _counted(self, baseline: BaselineEstimate, prediction: Sequence[float],
                 interval: "tuple[int, int] | None") -> tuple[float, ...]:
        """The prediction whose lift the threshold counts (rounded: few derivations), () where it counts none:
        no rhythm reference, or an interval as wide as the configured slack's."""
        if self.configured_slack_units is None or not prediction:
            return ()
        low, configured = self._low_ends(baseline, interval)
        return _rounded(prediction) if low < configured else ()

    def _lift(self, baseline: BaselineEstimate, prediction: Sequence[float], level: float, slope: float,
              interval: "tuple[int, int] | None") -> float:
        """What the clip at the low end of ``interval`` (None: the open run's) adds on average to a
        statistic against this ``prediction`` (``_counted``: () where nothing is counted) at a share
        ``level`` weighed, beyond what the clip at the configured slack adds, in events
        (``monitor.alarm.slack.expected_lift``; the busiest hour's people: the traffic's swing added).
        The configured slack's own was measured on the replays, with a margin: it is what the slack of
        0.5 was chosen by (docs/alarm.md)."""
        if not prediction:
            return 0.0
        low, configured = self._low_ends(baseline, interval)
        kappa = self.kappa if baseline.kappa is None else baseline.kappa
        events = baseline.events_per_window * (1.0 + self.traffic_swing)
        return max(0.0, expected_lift(prediction, level, kappa, events, low / RESOLUTION, slope)
                   - expected_lift(prediction, level, kappa, events, configured / RESOLUTION, slope))

    def _scales(self, interval: "tuple[int, int] | None") -> tuple[float, float]:
        """(threshold noise scale, page noise scale) in 1 / RESOLUTION: the open run's, or those of a run
        with the rhythm ``interval`` (width, reach)."""
        if interval is None:
            return self.svt.threshold_scale, self.svt.query_scale
        width, reach = interval
        return reach / self.svt.epsilon_threshold, width / self.svt.epsilon_positive

    def _derive(self, baseline: BaselineEstimate, variance_factor: float, rate_error: float, load: float | None,
                rate: "float | None" = None, skew_factor: float = 1.0,
                scales: "tuple[float, float] | None" = None) -> float:
        kappa = self.kappa if baseline.kappa is None else baseline.kappa
        events, rate_error, swing = at_hour(baseline.events_per_window, rate_error, self.traffic_swing, load)
        threshold_scale, query_scale = self._scales(None) if scales is None else scales
        return false_page_threshold(
            rate=baseline.rate if rate is None else rate, events=events, rate_error=rate_error,
            epsilon_threshold=RESOLUTION / threshold_scale, epsilon_page=RESOLUTION / query_scale,
            false_pages_per_30_days=self.false_pages_per_30_days, window_seconds=self.window_seconds,
            kappa=kappa, swing=swing, variance_factor=variance_factor, skew_factor=skew_factor)

    def answer_one(self, flagged: int, events: int, baseline: BaselineEstimate | None, can_page: bool = True) -> AlarmAnswer:
        """Answer one window, in window order, from its count of flagged events (weight 1
        each). ``can_page``: the budget could pay for a page (a public fact); without it no
        query is asked."""
        return self.answer_units(RESOLUTION * int(flagged), events, baseline, can_page)

    def answer_units(self, units: int, events: int, baseline: BaselineEstimate | None, can_page: bool = True,
                     problem: str | None = None, comparison: Comparison | None = None,
                     load: float | None = None) -> AlarmAnswer:
        """Answer one window from its weight units (the sum over its events of integers in
        [0, RESOLUTION]: ``calibrate.weight_units``). ``problem``: the caller found the
        baseline unusable (``calibrate.baseline_problem``): no query, and the answer says why.
        ``comparison``: the window against the rhythm reference (``RhythmReference.compare``
        at this run's rate units); its statistic replaces units - m n, which needs
        ``slack_units`` of at least the reference's. ``load``: the baseline's profile factor
        at this window's hour (public)."""
        if baseline is None or problem is not None:
            return AlarmAnswer("warming_up", None, 0.0, None, None, problem=problem)
        threshold = self.window_threshold(baseline, comparison, load)
        mode = None if comparison is None else comparison.mode
        slack = None if self.slack_units is None else self.slack_units / RESOLUTION
        if self.holding:
            self._hold_left -= 1
            return AlarmAnswer("held", self.run, self.svt.epsilon_spent, threshold, baseline.rate, compared_with=mode,
                               slack=slack)
        if not self.svt.active or not can_page:
            return AlarmAnswer("suppressed", self.run, self.svt.epsilon_spent if self.svt.active else 0.0, threshold,
                               baseline.rate, compared_with=mode, slack=slack)
        bar = threshold
        if comparison is None:
            statistic = int(units) - self.run_rate_units(baseline) * int(events)
        else:
            statistic = int(comparison.statistic)
            if comparison.follows_level:
                bar = self._line_for(baseline, comparison, load)[1]  # the statistic has slope x F taken off
        fired = self.svt.test_one(statistic, math.ceil(bar * RESOLUTION))
        if fired:
            self._hold_left = self.trend_hold_windows if mode == "recent" else self.hold_windows
        return AlarmAnswer("fired" if fired else "quiet", self.run, self.svt.epsilon_spent, threshold, baseline.rate,
                           compared_with=mode, slack=slack)




def _rounded(prediction: Sequence[float]) -> tuple[float, ...]:
    # The lift depends on the coefficients as a multiset; rounded, so that few lines are derived.
    return tuple(sorted(round(float(c), 4) for c in prediction))


def _check_slack(slack_units: int) -> None:
    if int(slack_units) != slack_units or not 0 <= slack_units <= RESOLUTION:
        raise ValueError(f"slack_units must be an integer in [0, {RESOLUTION}], got {slack_units!r}")
