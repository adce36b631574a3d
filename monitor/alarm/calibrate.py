"""The surge alarm on the user's own scale (docs/design.md#graded-weights): graded weights, a threshold from a
stated false-page rate, and what that threshold lets one see.

Graded weights. Each event weighs w = clip((score - t_lo) / (t_hi - t_lo), 0, 1) between
two calibrated score levels: 0 below the level that a share ``contamination_graded`` of
normal events exceeds, 1 above the level that a share ``contamination`` exceeds. One
privacy unit (one event per window) still moves the window's sum of weights by an
amount in [0, 1], so the statistic a_i = sum w - tau n_i moves within [-tau, 1 - tau]:
an interval of width 1, and the AboveThreshold argument is unchanged. Weights are integers in
[0, RESOLUTION] (:func:`weight_units`), clipped as integers: no rounding can widen the interval.

Threshold. Under normal traffic a_i is the sum of n_i weights minus tau_hat n_i. Its
spread comes from (1) the weights' own variation, n (tau kappa - tau^2) with kappa =
E[w^2] / E[w] <= 1 (w^2 <= w), (2) the baseline's estimation error sd_tau n (sampling
and Laplace noise, :func:`baseline_rate_error`), and (3) the sparse-vector noise
(one-sided, ``AboveThreshold``: E_q of scale 1/epsilon_page on each query, minus E_t of
scale 1/epsilon_threshold on the threshold, both non-negative). The threshold T is the
smallest number of excess events with

    windows per 30 days x P[X + E_q - E_t >= T] <= false_pages_per_30_days,

where X has variance n (tau kappa - tau^2) + (sd_tau n)^2 and the right skew of a sum of weights in
[0, 1] (third cumulant at most n tau kappa): a shifted gamma variable, since a normal one
understates the tail of a count of rare events. A prediction of the window from earlier ones
(the rhythm reference) multiplies the variance by its ``variance_factor`` but not the third
cumulant: its terms enter that cubed and with the opposite sign, which only lowers it
(``_normal_spread``). T is a function of public numbers only (the config, the released
baseline, the model's public calibration), so everything here is post-processing; the
statistic's privacy: docs/proofs/alarm-run.md. T grows like sqrt(n): scale-free; with the
baseline's error averaged into the tail the rate holds over days of good and bad baselines.

>>> T = false_page_threshold(rate=0.02, events=10_000, rate_error=0.0005, epsilon_threshold=0.6,
...                          epsilon_page=0.5, false_pages_per_30_days=1.0, window_seconds=300)
>>> 50 < T < 80
True
>>> v = visibility(T, rate=0.02, events=10_000, epsilon_page=0.5, epsilon_threshold=0.6)
>>> 0.005 < v < 0.01
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaincc, ndtr

from monitor.alarm.units import BAND_UNITS, RESOLUTION, rhythm_interval

__all__ = [
    "alarm_levels",
    "level_ladder",
    "fleet_rung",
    "rung_levels",
    "rung_units",
    "normal_weight_moments",
    "is_graded",
    "graded_weights",
    "weight_units",
    "baseline_rate_error",
    "false_page_threshold",
    "false_pages_per_30_days",
    "LEVEL_REACH",
    "level_line",
    "visibility",
    "AlarmVisibility",
    "alarm_visibility",
    "baseline_problem",
    "baseline_misfit",
    "at_hour",
    "span_flag_cap",
    "span_windows",
    "window_threshold",
    "visibility_for",
    "normal_weight_rate",
    "normal_weight_kappa",
    "kappa_estimate",
    "kappa_raised",
    "MIN_BASELINE_EVENTS_PER_WINDOW",
]

SECONDS_30_DAYS = 30 * 86400.0

# Below this many events per window (mean over the baseline's span) the alarm has too
# little traffic to tell a surge from chance, and a rate estimated from it is mostly noise.
MIN_BASELINE_EVENTS_PER_WINDOW = 20.0


# A report's event count this far (as a ratio, beyond the traffic's swing) from the baseline's
# events per window, and by more than twice its own 95 % interval, says the baseline no longer
# fits; a partial window or a noisy count alone must not cost a new warm-up.
MISFIT_RATIO = 2.0


def baseline_misfit(event_count: float, accuracy: float, events_per_window: float, swing: float) -> "str | None":
    """Why a released report's event count says the baseline in use no longer fits the traffic
    (a warm-up over mostly empty windows, a fleet that grew or shrank), or None. Public: both
    numbers are released, and the rule is fixed.

    >>> baseline_misfit(300.0, 100.0, 71.0, 0.3)
    'a report counted 300 +- 100 events in a window where the baseline expects 71 (+-30% over the day)'
    >>> baseline_misfit(90.0, 100.0, 71.0, 0.3) is None
    True
    """
    expected = max(float(events_per_window), 1.0)
    lo, hi = expected * (1.0 - swing) / MISFIT_RATIO, expected * (1.0 + swing) * MISFIT_RATIO
    if lo <= event_count <= hi or abs(event_count - expected) <= 2.0 * accuracy:
        return None
    return (f"a report counted {event_count:.0f} +- {accuracy:.0f} events in a window where the baseline expects "
            f"{events_per_window:.0f} (+-{swing:.0%} over the day)")


def span_windows(seconds: float, window_seconds: float) -> int:
    """Windows a span of ``seconds`` covers (at least 1): the count that sets a baseline's
    sensitivities. The 1e-9 keeps a span of exactly k windows at k in floats.

    >>> span_windows(86400, 300), span_windows(86400.0000000001, 300), span_windows(10, 300)
    (288, 288, 1)
    """
    return max(1, int(math.ceil(seconds / window_seconds - 1e-9)))


def alarm_levels(model, settings, levels: "tuple[float, float | None] | None" = None) -> tuple[float, float]:
    """The alarm's two calibrated levels (t_lo, t_hi): public post-processing of the model.

    An event weighs 0 at or below t_lo, 1 above t_hi (where ``settings.contamination`` of
    normal events lie), linearly between; without ``contamination_graded`` both are t_hi.
    ``levels``: another (contamination, contamination_graded) pair, a rung of ``level_ladder``.
    """
    upper, graded = (settings.contamination, settings.contamination_graded) if levels is None else levels
    t_hi = float(model.threshold_for(upper))
    t_lo = float(model.threshold_for(graded)) if graded else t_hi
    return t_lo, t_hi


# Normal events a window above the alarm's upper level that see the most surges, on the shared
# sets at 1,500 and at 10,000 people (docs/benchmarks/alarm-rhythm.md, the ceiling and the large
# fleet): the shipped 1 % at 1,500 people; at 10,000, 0.2 % (a fifth of the count 1 % gives).
BEST_NORMAL_ABOVE_UPPER = 15
# The rungs' pairs, as factors of the configured one: a small fleet keeps its levels, a large one
# weighs events at 0.2 % / 2 % from the shipped pair.
LADDER_FACTORS = (1.0, 0.5, 0.2)
# A rung in use is kept while the best share is within this factor of its own: a fleet that
# grows or shrinks a little does not move the levels (each move restarts the day's comparison).
RUNG_TOLERANCE = 2.0


def level_ladder(settings) -> "tuple[tuple[float, float | None], ...]":
    """The rungs of the alarm's levels, each named by its sparsest (contamination,
    contamination_graded) pair (public: the config): with ``levels_follow_fleet`` the configured
    pair and its ``LADDER_FACTORS``; the configured pair alone without it or with an absolute
    ``threshold`` (a count at those levels). A rung above the first weighs each event at its own
    pair (``rung_levels``).

    >>> from monitor.config import AlarmSettings
    >>> [tuple(round(x, 6) for x in rung) for rung in level_ladder(AlarmSettings())]
    [(0.01, 0.1), (0.005, 0.05), (0.002, 0.02)]
    """
    follow = getattr(settings, "levels_follow_fleet", False) and getattr(settings, "threshold", None) is None
    factors = LADDER_FACTORS if follow else (1.0,)
    graded = settings.contamination_graded
    return tuple((settings.contamination * f, None if graded is None else graded * f) for f in factors)


def rung_levels(model, settings, shares: "tuple[float, float | None] | None" = None
                ) -> "tuple[tuple[float, float], ...]":
    """The (t_lo, t_hi) score levels of a rung of ``level_ladder``: the configured pair's, or the
    rung's own pair alone when it is sparser. Why alone: on the shared sets at 10,000 people
    (stationary traffic, 3 seeds) the sparse pair pages 101 surges in their first window where
    the exact detector at its best single level pages 135, against 82 for the mean of both
    pairs' weights; on the vitals simulator 0.93 against 0.90 (10 days). The mean was the choice
    while the model read rare levels by counting alone: they often landed at the top of the
    score range, and the sparse pair alone then saw little (docs/model.md, "Rare rates")."""
    return (alarm_levels(model, settings, shares),)


def rung_units(scores: "np.ndarray", levels: "Sequence[tuple[float, float]]", resolution: int) -> np.ndarray:
    """Each event's weight at a rung's ``levels`` (``rung_levels``) in integer units: the floor of
    the mean of its ``weight_units`` at each pair, so still in [0, resolution].

    >>> rung_units(np.array([0.0, 1.5, 2.5, 9.0]), [(1.0, 2.0), (2.0, 3.0)], 4096).tolist()
    [0, 1024, 3072, 4096]
    """
    total = sum(weight_units(scores, lo, hi, resolution) for lo, hi in levels)
    return np.asarray(total, dtype=np.int64) // len(levels)


def fleet_rung(ladder: "Sequence[tuple[float, float | None]]", events_per_window: float,
               current: "int | None" = None) -> int:
    """The rung of ``ladder`` for a fleet of ``events_per_window`` events a window (public: a
    released count): the one whose upper share puts nearest ``BEST_NORMAL_ABOVE_UPPER`` normal
    events a window above it (on a log scale); ``current`` is kept while the best share is within
    ``RUNG_TOLERANCE`` of its own.

    >>> ladder = ((0.01, 0.1), (0.005, 0.05), (0.002, 0.02))
    >>> fleet_rung(ladder, 1_500), fleet_rung(ladder, 3_000), fleet_rung(ladder, 10_000), fleet_rung(ladder, 300)
    (0, 1, 2, 0)
    >>> fleet_rung(ladder, 4_000, current=2), fleet_rung(ladder, 3_000, current=2)
    (2, 1)
    """
    target = BEST_NORMAL_ABOVE_UPPER / max(float(events_per_window), 1e-9)
    gap = [abs(math.log(upper / target)) for upper, _ in ladder]
    if current is not None and 0 <= current < len(ladder) and gap[current] <= math.log(RUNG_TOLERANCE):
        return int(current)
    return int(np.argmin(gap))


def is_graded(t_lo: float, t_hi: float) -> bool:
    """Whether weights are graded between the levels, rather than the plain flag score > t_hi.

    Graded weights make kappa = E[w^2] / E[w] of normal events less than 1 and worth
    learning from the traffic: the baseline then releases its flagged total in two parts.
    """
    return t_lo < t_hi


def graded_weights(scores: "np.ndarray", t_lo: float, t_hi: float) -> np.ndarray:
    """Each event's weight in [0, 1]: 0 at or below ``t_lo``, 1 above ``t_hi``, linear between.

    With ``t_hi <= t_lo`` it is the plain flag ``score > t_hi`` (0 or 1).

    >>> graded_weights(np.array([0.0, 1.0, 1.5, 2.0, 3.0]), 1.0, 2.0).tolist()
    [0.0, 0.0, 0.5, 1.0, 1.0]
    """
    s = np.asarray(scores, dtype=float)
    if not is_graded(t_lo, t_hi):
        return (s > t_hi).astype(float)
    with np.errstate(invalid="ignore", over="ignore"):
        w = np.clip((s - t_lo) / (t_hi - t_lo), 0.0, 1.0)
    # A NaN (a NaN score, or inf / inf on extreme levels) weighs nothing.
    return np.where(np.isnan(w), 0.0, w)


def weight_units(scores: "np.ndarray", t_lo: float, t_hi: float, resolution: int) -> np.ndarray:
    """Weights as integers in [0, resolution] (floor of w x resolution; 0 for a NaN score).

    The clip is on the integers, so whatever the float rounding, one event adds at most
    ``resolution`` units: the width the AboveThreshold proof needs.

    >>> weight_units(np.array([0.0, 1.25, 9.0]), 1.0, 2.0, 4096).tolist()
    [0, 1024, 4096]
    """
    w = graded_weights(scores, t_lo, t_hi) * resolution
    units = np.floor(np.nan_to_num(w, nan=0.0, posinf=float(resolution), neginf=0.0))
    return np.clip(units, 0, resolution).astype(np.int64)


def baseline_rate_error(rate: float, events_per_window: float, span_windows: int, epsilon_flagged: float,
                        epsilon_events: float, flagged_sensitivity: float, events_sensitivity: float,
                        flagged_parts: int = 1) -> float:
    """Standard deviation of a released baseline rate around the true normal rate (public).

    Sampling (the span's weights vary: at most rate / events over the span) plus the two
    Laplace releases' noise carried through the ratio (first order); the flagged total is
    the sum of ``flagged_parts`` noisy parts (2 when it is released split for kappa). Only
    public numbers: the config and the released estimate.
    """
    total = max(events_per_window * span_windows, 1.0)
    rate = min(max(rate, 0.0), 1.0)
    sampling = rate / total
    flagged_noise = 2.0 * flagged_parts * (flagged_sensitivity / epsilon_flagged) ** 2 / total ** 2
    events_noise = 2.0 * (rate * events_sensitivity / epsilon_events) ** 2 / total ** 2
    return math.sqrt(sampling + flagged_noise + events_noise)


# A later span's flag cap keeps its Laplace noise at this share of a window's own spread.
CAP_NOISE_SHARE = 1.0 / 6.0


def span_flag_cap(floor: int, epsilon_flagged: float, span_windows: int, events_per_window: float, rate: float) -> int:
    """The flag cap of a baseline span after the warm-up (public): the largest whose Laplace
    noise on the flagged total is ``CAP_NOISE_SHARE`` of one window's own spread at the last
    released traffic, sqrt(2) cap / (epsilon_flagged W) <= sqrt(n tau) / 6; never below
    ``floor`` (``alarm.baseline_flag_cap``, which the warm-up span uses).

    Why it grows with the fleet: a cap clips the weight of people online all day whose
    readings stay unusual, which lowers the rate by a share of n tau, while the window's
    spread grows only like sqrt(n tau). On the simulator at 10,000 people a cap of 16
    clipped 3.5 to 7 % of the normal weight and gave 6 false pages in 30 days; 32 clips
    under 0.05 %. At 1,000 people the rule gives the floor. A function of the config and
    the released estimate only.

    >>> span_flag_cap(16, 0.08, 288, 1000, 0.016), span_flag_cap(16, 0.08, 288, 10_000, 0.016)
    (16, 34)
    """
    grow = CAP_NOISE_SHARE * epsilon_flagged * span_windows * math.sqrt(max(events_per_window * rate, 0.0)) / math.sqrt(2.0)
    return int(max(int(floor), math.floor(grow)))


def _svt_noise_density(x: np.ndarray, b_query: float, b_threshold: float) -> np.ndarray:
    """Density of E_q - E_t, two independent exponential variables of scales b_query,
    b_threshold: the alarm's folded discrete Laplace noises (``AboveThreshold``) in events.
    At the alarm's resolution (scales of thousands of units) the fold's tail, 2 q^k / (1 + q),
    is the exponential's q^k within a relative 1 / (2 scale): far below what a rate of
    pages per 30 days can tell."""
    a, b = float(b_query), float(b_threshold)
    return np.where(x >= 0, np.exp(-np.maximum(x, 0.0) / a), np.exp(np.minimum(x, 0.0) / b)) / (a + b)


@lru_cache(maxsize=64)
def _svt_grid(b_query: float, b_threshold: float) -> tuple[np.ndarray, np.ndarray, float]:
    span = 40.0 * max(b_query, b_threshold) + 1e-9
    # 1,001 points: thresholds agree with 4,001 to 4 decimals (0.0001 event), in a quarter of the time.
    x = np.linspace(-span, span, 1001)
    return x, _svt_noise_density(x, b_query, b_threshold), float(x[1] - x[0])


@lru_cache(maxsize=4096)
def _tail(threshold: float, sd: float, b_query: float, b_threshold: float, skew: float = 0.0) -> float:
    """P[X + E_q - E_t >= threshold], by quadrature over the noises' difference, where X has
    mean 0, standard deviation ``sd`` and skewness ``skew``: a shifted gamma variable (a
    normal one for skew 0). A count of rare weighted events is skewed to the right: at
    1,500 people a normal tail put the false pages at a third of what a simulation of the
    weights gave (at 3.8 sd), at 12,500 at two thirds."""
    x, dens, dx = _svt_grid(b_query, b_threshold)
    if sd <= 0:
        tail = (x >= threshold).astype(float)
    elif skew < 1e-3:
        tail = ndtr((x - threshold) / sd)
    else:
        shape = 4.0 / skew ** 2
        scale = sd * skew / 2.0
        y = (threshold - x) / scale + shape  # X >= t - x  <=>  Gamma(shape, 1) >= y
        tail = np.where(y > 0, gammaincc(shape, np.maximum(y, 0.0)), 1.0)
    return float(min(1.0, max(0.0, np.sum(dens * tail) * dx)))


def _normal_spread(rate: float, events: float, rate_error: float, kappa: float,
                   factor: float = 1.0, skew_factor: float = 1.0) -> tuple[float, float]:
    """(standard deviation, skewness) of a_i under normal traffic: the weights' own variation
    (variance n (tau kappa - tau^2): E[w^2] - E[w]^2, a flag's binomial n tau (1 - tau) at kappa 1),
    ``factor`` times it with a prediction's (the rhythm reference's variance factor), and the
    baseline's error (normal: no skew). The third cumulant is the window's own, n E[w^3] <= n tau
    kappa (w^3 <= w^2), at most: a prediction's terms enter it
    with their coefficients cubed and the opposite sign: where the cubes sum to a positive number
    (0.015 with two days of the rhythm, 0.04 with one, 0.12 for the first day's 10-window trend)
    they take a little skew off, and where a bridge piled the hour before's negative weight on a
    few windows they add ``skew_factor`` - 1 times it (``Comparison.skew_factor``)."""
    n = max(float(events), 0.0)
    rate = min(max(rate, 0.0), 1.0)
    third = n * rate * kappa
    var = n * max(0.0, rate * kappa - rate * rate) * factor + (rate_error * n) ** 2
    if var <= 0:
        return 0.0, 0.0
    return math.sqrt(var), third * skew_factor / var ** 1.5


# Phases of the daily traffic profile the false-page rate is averaged over.
_PHASES = np.sin(2 * np.pi * (np.arange(16) + 0.5) / 16)


def false_pages_per_30_days(threshold: float, *, rate: float, events: float, rate_error: float, epsilon_threshold: float,
                            epsilon_page: float, window_seconds: float, kappa: float = 1.0, swing: float = 0.0,
                            variance_factor: float = 1.0, skew_factor: float = 1.0) -> float:
    """Expected false pages per 30 days (quiet traffic) of a threshold of ``threshold``
    excess events, at a mean of ``events`` per window swinging by +-``swing`` over the day
    (the spread grows with the traffic: the peak windows make most false pages) and a
    normal weight share ``rate``; ``variance_factor``, ``skew_factor``: the statistic's normal
    variance and third cumulant over the window's own (a prediction's share, ``_normal_spread``)."""
    per_window = 0.0
    for phase in (_PHASES if swing > 0 else (0.0,)):
        sd, skew = _normal_spread(rate, events * (1.0 + swing * phase), rate_error, kappa, variance_factor, skew_factor)
        per_window += _tail(round(float(threshold), 6), round(sd, 6), 1.0 / epsilon_page, 1.0 / epsilon_threshold,
                            round(skew, 4))
    per_window /= len(_PHASES) if swing > 0 else 1
    return per_window * SECONDS_30_DAYS / window_seconds


_expected_false_pages = false_pages_per_30_days


def false_page_threshold(*, rate: float, events: float, rate_error: float, epsilon_threshold: float, epsilon_page: float,
                         false_pages_per_30_days: float, window_seconds: float, kappa: float = 1.0,
                         swing: float = 0.0, variance_factor: float = 1.0, skew_factor: float = 1.0) -> float:
    """The smallest threshold (excess events per window) whose expected false pages per 30
    days stay within ``false_pages_per_30_days`` (see the module docstring). Public."""
    if not false_pages_per_30_days > 0:
        raise ValueError(f"false_pages_per_30_days must be positive, got {false_pages_per_30_days!r}")
    kw = dict(rate=rate, events=events, rate_error=rate_error, epsilon_threshold=epsilon_threshold,
              epsilon_page=epsilon_page, window_seconds=window_seconds, kappa=kappa, swing=swing,
              variance_factor=variance_factor, skew_factor=skew_factor)

    def excess(threshold: float) -> float:
        return _expected_false_pages(threshold, **kw) - false_pages_per_30_days

    lo, hi = 0.0, 1.0
    while excess(hi) > 0:
        lo, hi = hi, hi * 4.0
        if hi > 1e12:
            return hi
    if excess(lo) <= 0:
        return lo
    # Brent's method on the smooth, falling rate: 6 to 9 evaluations where halving took 17 (the
    # level line derives 5 to 17 thresholds per hour and fleet, the replay's first day dozens).
    # Then up to the side that keeps the promise, within 1e-6 of the root: far below the
    # comparison's own step (1 / RESOLUTION of an event) in a threshold of tens.
    hi = brentq(excess, lo, hi, xtol=1e-7 * hi, rtol=1e-9)
    while excess(hi) > 0:
        hi *= 1.0 + 1e-6
    return hi


# Flagged levels, as multiples of the expected one, that a threshold following the level covers
# (``level_line``): from none to four times it, past the goal's daily swing of 2.5 x. Beyond,
# the line stays near the threshold where the prediction's own error makes it straight.
LEVEL_REACH = (0.0, 0.5, 1.0, 2.0, 4.0)


def level_line(levels: Sequence[float], thresholds: Sequence[float], expected: float) -> tuple[float, float]:
    """(slope, intercept) of the line intercept + slope F that is at or above every
    (``levels[k]``, ``thresholds[k]``) and lowest at the ``expected`` level: a threshold that
    rises with the window's flagged level F (public: from public thresholds). Its slope is
    never negative.

    >>> level_line([0.0, 1.0, 2.0], [2.0, 3.0, 5.0], 1.0)   # convex: the chord, above the middle point
    (1.5, 2.0)
    >>> level_line([0.0, 1.0, 4.0], [2.0, 3.0, 3.5], 1.0)   # concave: a line through the middle point
    (0.16666666666666666, 2.8333333333333335)
    """
    f = np.asarray(levels, dtype=float)
    t = np.asarray(thresholds, dtype=float)
    slopes = {0.0} | {float((t[j] - t[i]) / (f[j] - f[i])) for i in range(f.size) for j in range(i + 1, f.size)
                      if f[j] > f[i] and t[j] > t[i]}
    # Ties (the expected level on the points' upper hull): the smallest slope, which adds the least
    # of the prediction's spread to the statistic.
    best = min(((float(np.max(t - b * f)), b) for b in slopes), key=lambda ab: (round(ab[0] + ab[1] * expected, 9), ab[1]))
    return best[1], best[0]


def visibility(threshold: float, *, rate: float, events: float, epsilon_page: float, epsilon_threshold: float,
               power: float = 0.95, kappa: float = 1.0, variance_factor: float = 1.0) -> float:
    """The smallest surge, as a share of the people online, that pages in its first window
    with probability ``power``, if every surge event weighs 1 (scores above the upper level).

    A surge share s replaces s n normal events (weight tau on average) by anomalous ones:
    the statistic rises by s n (1 - tau). It pages when that, plus the normal spread and
    the sparse-vector noise, clears ``threshold``.
    """
    n = max(float(events), 1.0)
    tau = min(max(rate, 0.0), 1.0)
    sd, skew = _normal_spread(tau, n, 0.0, kappa, variance_factor)  # this window's own spread: the baseline error is already in the threshold
    b_q, b_t = 1.0 / epsilon_page, 1.0 / epsilon_threshold
    # Find the excess x with P[x + noise >= threshold] >= power.
    lo, hi = 0.0, max(1.0, 2 * threshold + 10 * (sd + b_q + b_t))
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if _tail(round(threshold - mid, 6), round(sd, 6), b_q, b_t, round(skew, 4)) >= power:
            hi = mid
        else:
            lo = mid
    return min(1.0, hi / (n * max(1.0 - tau, 1e-9)))


@dataclass(frozen=True)
class AlarmVisibility:
    """What the alarm can see at a given traffic (public: from the config and released values).

    ``threshold``: excess weighted events per window that page; ``smallest_surge_share``:
    the share of people online whose anomalies page in the first window 95 % of the time;
    ``false_pages_per_30_days``: what the threshold implies on quiet traffic.
    """

    events_per_window: float
    rate: float
    threshold: float
    smallest_surge_share: float
    false_pages_per_30_days: float


def at_hour(events: float, rate_error: float, swing: float, load: float | None) -> tuple[float, float, float]:
    """(events, rate error, swing) a threshold is derived at: with a released daily profile's
    ``load`` (``baseline.profile_load``) the hour's expected count, volume and make-up together,
    the rate's error kept at the day's count, and no swing left; without one the day's mean and
    the traffic's swing.

    >>> at_hour(1000.0, 0.002, 0.3, None), at_hour(1000.0, 0.002, 0.3, 2.0)
    ((1000.0, 0.002, 0.3), (2000.0, 0.001, 0.0))
    """
    return (events, rate_error, swing) if load is None else (events * load, rate_error / load, 0.0)


def _terms(settings, rate: float, events: float, rate_error: float, kappa: float, load: float | None) -> dict:
    """The threshold's inputs as the alarm derives them (``SurgeAlarm._derive``): against the
    rhythm reference (``alarm.follow_rhythm``) in its rhythm mode, the run's slack widens the
    pages' noise, the prediction adds its variance and the baseline's rate error drops out; with a
    profile ``load`` the hour's expected count replaces the day's swing."""
    eps_t, eps_p = settings.epsilon_threshold, _page_epsilon(settings)
    events, rate_error, swing = at_hour(events, rate_error, settings.traffic_swing, load)
    if not (getattr(settings, "follow_rhythm", False) and settings.threshold is None):
        return dict(rate=rate, events=events, rate_error=rate_error, epsilon_threshold=eps_t, epsilon_page=eps_p,
                    kappa=kappa, swing=swing, variance_factor=1.0)
    from monitor.alarm.reference import rhythm_variance

    # The run's interval (``SurgeAlarm.open_run``): [-(top of the tau band + slack), 1], no drift.
    width, reach = rhythm_interval(rate, math.ceil(settings.rhythm_slack * RESOLUTION))
    return dict(rate=rate, events=events, rate_error=0.0,
                epsilon_threshold=settings.epsilon_threshold * RESOLUTION / reach,
                epsilon_page=settings.epsilon_page * RESOLUTION / width,
                kappa=kappa, swing=swing,
                variance_factor=rhythm_variance(settings.recent_windows, settings.seasonal_windows))


def alarm_visibility(settings, window_seconds: float, rate: float, events_per_window: float,
                     rate_error: float = 0.0, kappa: float = 1.0, load: float | None = None) -> AlarmVisibility:
    """The threshold the alarm uses at ``events_per_window`` and a normal weight share
    ``rate``, the smallest surge it pages on within one window 95 % of the time, and its
    false-page rate. ``settings`` is the config's ``alarm`` block. For ``monitor budget``
    and the start-up plan (before any baseline, pass the model's calibrated share).

    >>> from monitor.config import AlarmSettings
    >>> v = alarm_visibility(AlarmSettings(), 300, rate=0.03, events_per_window=1500)
    >>> 0.01 < v.smallest_surge_share < 0.1, round(v.false_pages_per_30_days, 2) <= 1.0
    (True, True)
    """
    thr = window_threshold(settings, window_seconds, rate, events_per_window, rate_error, kappa, load)
    t = _terms(settings, rate, events_per_window, rate_error, kappa, load)
    share = visibility(thr, rate=rate, events=t["events"], epsilon_page=t["epsilon_page"],
                       epsilon_threshold=t["epsilon_threshold"], kappa=t["kappa"],
                       variance_factor=t["variance_factor"])
    fp = false_pages_per_30_days(thr, window_seconds=window_seconds, **t)
    return AlarmVisibility(t["events"], rate, thr, share, fp)


def _page_epsilon(settings) -> float:
    """The epsilon a page's query noise is drawn at: epsilon_page, with the noise widened by the
    run's tau band (``SurgeAlarm``: 1 + TAU_BAND times the plain scale)."""
    return settings.epsilon_page * RESOLUTION / (RESOLUTION + BAND_UNITS)


def window_threshold(settings, window_seconds: float, rate: float, events_per_window: float,
                     rate_error: float = 0.0, kappa: float = 1.0, load: float | None = None) -> float:
    """T in excess (weighted) events per window, public: from ``alarm.false_pages_per_30_days``,
    or, where the config still sets the absolute ``alarm.threshold``, threshold + z sd +
    rate_margin x expected (the pre-issue-26 rule, kept for configs that pin it)."""
    expected = max(0.0, rate * events_per_window)
    if settings.threshold is not None:
        return settings.threshold + (settings.z or 0.0) * math.sqrt(expected) + (settings.rate_margin or 0.0) * expected
    return false_page_threshold(false_pages_per_30_days=settings.false_pages_per_30_days, window_seconds=window_seconds,
                                **_terms(settings, rate, events_per_window, rate_error, kappa, load))


KAPPA_FLOOR = 0.25  # a noisy calibration must not shrink the normal spread below a quarter of the flag bound


def normal_weight_kappa(model, t_lo: float, t_hi: float) -> float:
    """kappa = E[w^2] / E[w] of normal events' graded weights, from the model's calibrated
    share of normal scores above each level (``model.normal_share_above``: public
    post-processing of the fit). 1 (the bound w^2 <= w, exact for a plain flag) where the
    model has no calibration; never below KAPPA_FLOOR.

    E[w] = int_0^1 S(t_lo + u (t_hi - t_lo)) du and E[w^2] = int_0^1 2u S(...) du, with S
    the share of normal scores above a level.
    """
    if not t_hi > t_lo:
        return 1.0
    u = (np.arange(128) + 0.5) / 128
    try:
        share = np.asarray(model.normal_share_above(t_lo + u * (t_hi - t_lo)), dtype=float)
    except (AttributeError, ValueError):
        return 1.0
    mean = float(share.mean())
    if not mean > 0:
        return 1.0
    return float(min(1.0, max(KAPPA_FLOOR, float((2 * u * share).mean()) / mean)))


def kappa_estimate(squared: float, flagged: float, scale: float) -> "tuple[float, float] | None":
    """kappa = E[w^2] / E[w] from a released pair (post-processing): ``squared`` (sum w^2) and
    ``flagged`` (sum w), each part with Laplace noise of ``scale``. Returns (the ratio, in [0, 1],
    the standard deviation of its noise, first order), or None when the total is not positive
    (nothing to go by).

    >>> [round(x, 4) for x in kappa_estimate(5_000.0, 10_000.0, 64.0)]
    [0.5, 0.0064]
    """
    if not flagged > 0:
        return None
    k = min(1.0, max(0.0, squared / flagged))
    # k = S / (S + R): dk/dS = (1 - k) / total, dk/dR = -k / total; each part's variance 2 scale^2
    return k, math.sqrt(2.0) * scale * math.hypot(1.0 - k, k) / flagged


def kappa_raised(kappa: float, error: float) -> float:
    """An upper estimate of kappa: ``kappa`` plus one standard deviation ``error`` (``kappa_estimate``, or
    an average of such, ``baseline._average_kappa``), in [KAPPA_FLOOR, 1]. What the threshold uses: an
    underestimate would shrink its normal spread and bring false pages.

    >>> round(kappa_raised(*kappa_estimate(5_000.0, 10_000.0, 64.0)), 3), kappa_raised(0.0, 0.01)
    (0.506, 0.25)
    """
    return float(min(1.0, max(KAPPA_FLOOR, kappa + error)))


def normal_weight_rate(model, t_lo: float, t_hi: float, fallback: float) -> float:
    """E[w] of normal events' graded weights from the model's calibrated score shares
    (public post-processing); ``fallback`` (e.g. the configured contamination) for an
    uncalibrated model."""
    u = (np.arange(128) + 0.5) / 128
    levels = t_lo + u * (t_hi - t_lo) if t_hi > t_lo else np.array([t_hi])
    try:
        return float(np.mean(model.normal_share_above(levels)))
    except (AttributeError, ValueError):
        return float(fallback)


def normal_weight_moments(model, levels: "Sequence[tuple[float, float]]", fallback: float) -> tuple[float, float]:
    """(E[w], kappa) of normal events' weights at a rung's ``levels`` (``rung_units``), from the
    model's calibrated score shares (public post-processing): ``normal_weight_rate`` and
    ``normal_weight_kappa`` for one pair; for a mean of pairs, w(s) is monotone in the score, so
    E[w] = int S(s) dw(s) and E[w^2] = int 2 w(s) S(s) dw(s), with S the share of normal scores
    above s. ``fallback`` (and kappa 1) for an uncalibrated model."""
    if len(levels) == 1:
        (t_lo, t_hi), = levels
        return normal_weight_rate(model, t_lo, t_hi, fallback), normal_weight_kappa(model, t_lo, t_hi)
    lo, hi = min(p[0] for p in levels), max(p[1] for p in levels)
    s = np.linspace(lo, hi, 1025) if hi > lo else np.array([lo, lo + 1e-9])
    w = np.mean([graded_weights(s, a, b) for a, b in levels], axis=0)
    mid = 0.5 * (s[1:] + s[:-1])
    try:
        share = np.asarray(model.normal_share_above(mid), dtype=float)
    except (AttributeError, ValueError):
        return float(fallback), 1.0
    dw = np.diff(w)
    mean = float(np.sum(share * dw))
    if not mean > 0:
        return mean, 1.0
    second = float(np.sum(2.0 * 0.5 * (w[1:] + w[:-1]) * share * dw))
    return mean, float(min(1.0, max(KAPPA_FLOOR, second / mean)))


def visibility_for(config, model, events_per_window: float, warmup: bool = True) -> AlarmVisibility:
    """What the shipped alarm can see at ``events_per_window`` people per window, before any
    baseline (for ``monitor budget`` and the start-up plan): the rate and kappa from the
    model's calibration, the baseline error of the warm-up estimate (``warmup``) or of a
    daily one at that traffic. Public: the config, the model file and a traffic figure.

    >>> from monitor.config import parse_config
    >>> cfg = parse_config({"features": [{"name": "x", "min": 0, "max": 1}]})
    >>> class Uncalibrated:
    ...     def threshold_for(self, c): return 1.0 - c
    >>> v = visibility_for(cfg, Uncalibrated(), 1500)
    >>> 0.01 < v.smallest_surge_share < 0.06
    True
    """
    a = config.alarm
    size = config.window.size_seconds
    ladder = level_ladder(a)  # the levels that traffic would move the alarm to
    levels = rung_levels(model, a, ladder[fleet_rung(ladder, events_per_window)])
    rate, kappa = normal_weight_moments(model, levels, a.contamination)
    span = a.baseline_warmup_seconds if warmup else a.baseline_refresh_seconds
    w = span_windows(span, size)
    capped = config.stream.entity_field is not None
    eps_flagged = a.epsilon_baseline_warmup if warmup else a.epsilon_baseline_flagged
    cap = a.baseline_flag_cap if warmup else span_flag_cap(a.baseline_flag_cap, eps_flagged, w, events_per_window, rate)
    err = baseline_rate_error(rate, events_per_window, w, eps_flagged, a.epsilon_baseline_events,
                              min(cap, w) if capped else 1, w if capped else 1,
                              flagged_parts=2 if is_graded(*levels[0]) else 1)
    return alarm_visibility(a, size, rate, events_per_window, err, kappa)


def baseline_problem(rate: float, events_per_window: float) -> str | None:
    """Why a released baseline cannot be used as it is (public), or None.

    A rate of 0 (nothing flagged, or noise larger than the count) would make every
    flagged event look like a surge; too few events per window make any rate mostly noise.
    The releaser announces it and keeps the alarm warming up.
    """
    if events_per_window < MIN_BASELINE_EVENTS_PER_WINDOW:
        return (f"the baseline saw {events_per_window:.1f} events per window (fewer than {MIN_BASELINE_EVENTS_PER_WINDOW:g}): "
                "too little traffic to tell a surge from chance")
    if rate <= 0.0:
        return ("the baseline's normal share is 0 (no event weighed above the lower level, or its noise was larger than "
                "the count): a longer baseline_warmup_seconds or more epsilon_baseline_warmup is needed")
    return None
