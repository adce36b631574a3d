"""What a window's flagged weight is compared with: the same people's recent windows and
the same hours of the days before (docs/alarm.md#traffic-with-a-daily-rhythm).

Against one daily rate every evening of rhythmic traffic looks like a surge, so each window is
predicted person by person. For privacy unit u and window j let A_uj = w_uj - tau x_uj (its
weight, minus the released rate if it sent an event; 0 when it sent none). The prediction is a
linear combination of u's own earlier values, its coefficients chosen from public facts only
(the mode, the calendar, the settings, which windows paged):

    B_ui = mean_{T_i} A_u + mean_d (mean_{Y_di} A_u - mean_{YT_di} A_u)   ("rhythm", a day of history)
    B_ui = sum_{j in TT_i} c_ij A_uj                  ("recent", less than a day, or paged today)
    B_ui = 0                                                      ("baseline", no history yet)

T_i: the last ``recent_windows``; Y_di: ``seasonal_windows`` centred on i, d days back (the last
SEASONAL_DAYS days), YT_di the recent windows before those. The recent mode's line through
``steady_windows`` is held by the line through ``trend_windows`` and that line by the level,
each within a public margin; from the second day the steady line comes first where the
release asks (``steady_line``); each mode is held from above by the other's prediction, the recent
mode also by the rhythm prediction from each of d = 1, 2, 3, 7 alone where kept. Marked windows are
bridged or filled (``_bridged``). Reasons and figures: docs/benchmarks/alarm-rhythm.md ("Trial history").

The statistic is a_i = sum_u clip(A_ui - B_ui - beta P_ui, -L, 1) in integer units of
1 / RESOLUTION (``A - B`` rounded, then clipped): L is the top of the run's tau band plus its
slack, fixed when the run opens (``SurgeAlarm.open_run``, ``monitor.alarm.slack``); with a
threshold that follows the level, beta P_ui is the level line's slope times the same
combination of u's weights (``compare(level_slope=beta)``, ``SurgeAlarm.level_line``).

Guarantee: adding or removing u adds or removes exactly u's term, which lies in [-L, 1]
whatever B is; the lower (or higher) of two such statistics moves within it too. So every
query of a run moves within one interval of width 1 + L that contains 0, and AboveThreshold's
argument holds (page noise (1 + L) / (1 + TAU_BAND) times the plain run's, the same threshold
noise); the comparison costs no epsilon. u's data in window j moves only the queries of
windows j to j + the run's reach (at most ``reach_windows``). Proof: docs/proofs/rhythm-interval.md.

>>> ref = RhythmReference(window_seconds=300, recent_windows=2, seasonal_windows=1)
>>> for i in range(3):
...     ref.learn_one(i, units=np.array([4096, 0]), entities=("a", "b"))
>>> c = ref.compare(3, units=np.array([4096, 4096]), entities=("a", "b"), m=0, low_units=2048)
>>> c.mode, c.statistic   # b is flagged for the first time; a is as usual
('recent', 4096)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np

from monitor.alarm.units import RESOLUTION

# A guard holds the steady line within a tenth of the margin the level needs (the window's threshold):
# at 0 the guard's own noise took the steady line's smaller spread back, and a fifth did no better
# (docs/benchmarks/alarm-rhythm.md, "Trial history").
GUARD_DIVISOR = 10

__all__ = ["RhythmReference", "reference_for", "Comparison", "ReferenceMode", "prediction_factors", "rhythm_variance",
           "today_alike", "trend_coefficients"]

ReferenceMode = Literal["baseline", "recent", "rhythm"]
# A prediction: parts of (windows, their coefficients), summed.
Prediction = list[tuple[list[int], np.ndarray]]

# Days of history the rhythm mode averages the day's shape over (as many as there are).
SEASONAL_DAYS = 2
# The daily baselines' released rates (public) of consecutive days differing by more than this
# factor say the traffic changed its make-up lately (a weekend, a holiday): the days the rhythm
# mode would compare with are then no guide, and the first day's predictions are used instead
# (``days_alike``). Day-to-day noise of a day's rate is a few per cent at 1,500 people.
DAYS_CHANGE_RATIO = 1.3
DAYS_CHANGE_DAYS = 3  # the days compared with, and the one before them
WEEK_DAYS = 7  # a week: the same weekday's released rate says whether today will differ from the days before
# On a day unlike the days before, the recent mode is held from above by the rhythm prediction from each
# of these days back on its own: the Monday after a weekend is Friday's shape (3) or last Monday's (7),
# the Tuesday Monday's (1), not the mean of Monday's and Sunday's (docs/benchmarks/alarm-rhythm.md).
SINGLE_DAYS = (1, 2, 3, WEEK_DAYS)


@dataclass(frozen=True)
class Comparison:
    """One window's statistic against the reference (private: never published) and how it
    was formed (public). ``coefficients``: the sum of the prediction's squared coefficients;
    ``relative_error``: how far the prediction itself may be off, as a share of the normal
    count; ``level_slope``: the share of the predicted flagged weight taken off the statistic
    (``SurgeAlarm.level_line``: the threshold follows the level); ``prediction``: its coefficient on
    each window it uses (what the clip's lift depends on, ``monitor.alarm.slack``)."""

    statistic: int
    mode: ReferenceMode
    coefficients: float = 0.0
    relative_error: float = 0.0
    level_slope: float = 0.0
    cubes: float = 0.0
    prediction: tuple[float, ...] = ()

    @property
    def variance_factor(self) -> float:
        """The statistic's normal variance relative to the window's own (``prediction_factors``)."""
        return prediction_factors(self.level_slope, self.coefficients, self.cubes)[0]

    @property
    def skew_factor(self) -> float:
        """The statistic's third cumulant over the window's own, at most (``prediction_factors``)."""
        return prediction_factors(self.level_slope, self.coefficients, self.cubes)[1]

    @property
    def follows_level(self) -> bool:
        """The statistic has the slope's share of the predicted level taken off: it is compared
        with the level line's intercept (``SurgeAlarm.level_line``)."""
        return self.mode != "baseline" and self.level_slope > 0


def rhythm_variance(recent_windows: int, seasonal_windows: int, days: int = SEASONAL_DAYS) -> float:
    """1 + the sum of the rhythm mode's squared coefficients, every window kept, with
    ``days`` days of history.

    >>> round(rhythm_variance(12, 13, 1), 3), round(rhythm_variance(12, 13, 2), 3)
    (1.244, 1.163)
    """
    return 1.0 + 1.0 / recent_windows + (1.0 / seasonal_windows + 1.0 / recent_windows) / days


class RhythmReference:
    """Each unit's recent and day-ago windows, kept to predict the next window.

    Parameters
    ----------
    window_seconds, period_seconds:
        The window grid and the rhythm's period (a day); the seasonal mode needs a period
        of a whole number of windows.
    recent_windows:
        Windows in T_i, the recent level (and in YT_i). Before a day of history, the trend
        through them (at least half of them).
    seasonal_windows:
        Windows in Y_di, centred on the same hour a period earlier (odd; an even number is
        made odd by one). Few: a centred mean smears a ramp's kink (a shift change at 10,000
        people: 13 windows put 1.6 ramp steps, 240 events, into the prediction; 5 put 0.6).
        At least half of Y_di and of YT_di must have been released for a day to count.
    slack:
        How far below -tau a unit's term may go (L = tau + slack, tau the top of the run's
        band). The low end must sit below the busiest hour's share too (tau is the day's):
        0.5 covers a share weighed several times the day's mean (docs/alarm.md). The most a run
        uses: each chooses its own, where the clip's lift allows (``monitor.alarm.slack``).
    trend_error:
        How far the recent mode's trend may miss the rhythm, as a share of the normal count
        (public): the threshold counts it like a baseline's error. On the shared sets' smooth daily
        waves of up to 2.8 x the trend through 10 windows misses the aggregate by at most 0.028
        of the normal count (root mean square 0.012); a shift change within the hour by up to
        1.35, which no margin covers (``bench_alarm_rhythm.py --trend-error``).
    trend_windows:
        Windows the recent mode's trend goes through (None: ``recent_windows``). Fewer follow a
        shift change sooner: a one-hour ramp is missed by up to 0.18 of its rise through 12
        windows and 0.11 through 6, at a spread (1 + the squared coefficients) of 1.87 instead of 1.38.
    steady_windows:
        Windows the recent mode's steady line goes through (0: none; more than ``trend_windows``),
        once at least half of them were kept. Its statistic comes first (the threshold is its own:
        through 36 windows a spread of 1.12 where the short line's is 1.47), held within a tenth of the
        level's margin of the short line's, from above and from below (from the second day, of the
        rhythm mode's, and only where ``compare`` is asked for it: ``steady_line``): through 3 hours a
        line misses a wave's bend, lags a shift change by hours and overshoots the flat after it, where
        the short line and the rhythm mode's prediction do not.
    resolution:
        Integer units per event weight.
    """

    def __init__(self, window_seconds: float, recent_windows: int = 12, seasonal_windows: int = 5,
                 slack: float = 0.5, period_seconds: float = 86400.0, trend_error: float = 0.02,
                 resolution: int = RESOLUTION, weekend_days: Sequence[int] = (), trend_windows: "int | None" = None,
                 steady_windows: int = 0) -> None:
        if int(recent_windows) != recent_windows or recent_windows < 1:
            raise ValueError(f"recent_windows must be a positive integer, got {recent_windows!r}")
        if int(seasonal_windows) != seasonal_windows or seasonal_windows < 1:
            raise ValueError(f"seasonal_windows must be a positive integer, got {seasonal_windows!r}")
        if not (math.isfinite(slack) and 0.0 < slack <= 1.0):
            raise ValueError(f"slack must be in (0, 1], got {slack!r}")
        if trend_windows is not None and (int(trend_windows) != trend_windows or trend_windows < 2):
            raise ValueError(f"trend_windows must be an integer of at least 2, got {trend_windows!r}")
        self.window_seconds = float(window_seconds)
        self.recent_windows = int(recent_windows)
        self.trend_windows = self.recent_windows if trend_windows is None else int(trend_windows)
        if int(steady_windows) != steady_windows or not (steady_windows == 0 or steady_windows > self.trend_windows):
            raise ValueError(f"steady_windows must be 0 (none) or an integer above trend_windows ({self.trend_windows}), "
                             f"got {steady_windows!r}")
        self.steady_windows = int(steady_windows)
        self.half_seasonal = int(seasonal_windows) // 2
        self.slack = float(slack)
        self.trend_error = float(trend_error)
        self.resolution = int(resolution)
        if any(int(d) != d or not 0 <= d <= 6 for d in weekend_days):
            raise ValueError(f"weekend_days must be weekdays 0 (Monday) to 6 (Sunday), got {list(weekend_days)!r}")
        self.weekend_days = frozenset(int(d) for d in weekend_days)
        ratio = float(period_seconds) / self.window_seconds
        # A period of a whole number of windows, longer than what it is compared with.
        self.period = round(ratio) if abs(ratio - round(ratio)) < 1e-9 and round(ratio) > self.recent_windows + self.half_seasonal else None
        # The open run's reach (``reach_choices``) and first window: compare(i) and outline(i) read
        # windows from the run's first window less its reach on only (the run is charged from there),
        # and never more than ``reach_windows`` before i. None: ``reach_windows`` before i; without a
        # first window, ``run_reach_windows`` before i.
        self.run_reach_windows: int | None = None
        self.run_first_index: int | None = None
        # The oldest window this process's history may hold (public: the first window learnt, or the
        # span a restart rebuilt, ``history_start``): a run reads nothing before it (``held_windows``).
        self.history_from: int | None = None
        self._floor = -math.inf  # the oldest window the current comparison may read (``_sets``)
        # Whether the last days' released rates were alike (``days_alike``; set by the releaser from
        # public values): where not, the rhythm mode gives way to the first day's predictions.
        self.days_alike = True
        self._ids: dict[str, int] = {}
        # window index -> (unit ids, weight units, paged); arrays are never changed in place.
        self._windows: dict[int, tuple[np.ndarray, np.ndarray, bool]] = {}
        # window index -> the events' model scores, to weigh them again at other levels (``relevel``).
        self._scores: dict[int, np.ndarray] = {}
        # Units fit in 16 bits (a weight is at most the resolution): a day's history is two
        # thirds of 64-bit units' size at 10,000 people, scores included.
        self._unit_dtype = np.int16 if self.resolution < 2 ** 14 else np.int64

    @property
    def slack_units(self) -> int:
        """The slack in 1 / resolution: what the alarm's runs add to their interval's width."""
        return math.ceil(self.slack * self.resolution)

    @property
    def reach_windows(self) -> int:
        """How many windows before window i ``compare(i)`` may read (public: the settings alone).

        A query that reads a person's earlier windows depends on their data there, so its charge
        must count in every period those windows are in (docs/budget.md, "What a run reads").
        The first day's fits look back at most 4 x their window count (``_last``), then bridge a
        marked window across up to ``recent_windows`` more; the rhythm mode's day-old sets reach
        ``SEASONAL_DAYS`` periods and the hour before them back, a fill moves the first day's onto
        the second's, and a bridge there ``recent_windows`` further; the recent mode's week-old set
        (``WEEK_DAYS``) reaches as far before its own day. The history keeps exactly this much
        (``learn_one``), so no comparison can read further.

        >>> RhythmReference(300, recent_windows=12, seasonal_windows=5, steady_windows=36).reach_windows
        2040
        """
        return max(self._recent_reach, self._days_reach(WEEK_DAYS))

    def _days_reach(self, days: int) -> int:
        # A day-old set reaches max(recent, half_seasonal) before its day, its bridges recent further.
        if self.period is None:
            return 0
        return days * self.period + self.recent_windows + max(self.recent_windows, self.half_seasonal)

    @property
    def rebuilt_windows(self) -> int:
        """How many windows before the next a restart rebuilds (``monitor.pipeline.history``): the two
        days' reach (the shorter one a run may read, ``reach_choices``), not the week's, so that the re-read of 10,000 people's history stays within its
        time limit. Runs are then charged over what the history holds (``held_windows``), and the
        3-day-old and week-old sets come back 3 days and a week after the restart.

        >>> RhythmReference(300, recent_windows=12, seasonal_windows=5, steady_windows=36).rebuilt_windows
        600
        """
        return max(self._recent_reach, self._days_reach(SEASONAL_DAYS))

    def reads_far(self, reach: int) -> bool:
        """Whether a run of this reach (``reach_choices``, ``held_windows``) may read further back than
        the two days a restart rebuilds: the 3-day-old set, and the week-old one."""
        return reach > self.rebuilt_windows

    def held_windows(self, index: int) -> int:
        """How many windows before ``index`` this process's history may hold (public, ``history_from``):
        a run opening at ``index`` reads no further back, so its charge need not begin earlier. On a
        first start that is the windows since it; after a restart, the two days it rebuilt and the
        windows since, until the history has filled its reach again.

        >>> ref = RhythmReference(300, recent_windows=12, seasonal_windows=5, steady_windows=36)
        >>> ref.history_start(10_000 - ref.rebuilt_windows); ref.held_windows(10_000)
        600
        """
        return 0 if self.history_from is None else max(0, int(index) - self.history_from)

    def history_start(self, index: int) -> None:
        """The history may hold windows from ``index`` on (a restart's rebuilt span, from the ledger; each
        window learnt)."""
        self.history_from = int(index) if self.history_from is None else min(self.history_from, int(index))

    @property
    def _recent_reach(self) -> int:
        # The first day's fits look back 4 x their windows (``_last``) and bridge recent_windows more.
        return 4 * max(self.recent_windows, self.trend_windows, self.steady_windows) + self.recent_windows

    def reach_choices(self) -> tuple[int, ...]:
        """The reaches a run may read over before its first window, longest first: every window the
        reference keeps, the two days back only (no week-old set), the recent windows only (the first
        day's predictions, whatever history there is), or none (the plain statistic until the run has
        answered windows of its own, ``_oldest_read``). A run takes the longest whose charge the budget pays (the releaser, from
        the ledger: public), and sets ``run_reach_windows`` and ``run_first_index``.

        >>> RhythmReference(300, recent_windows=12, seasonal_windows=5, steady_windows=36).reach_choices()
        (2040, 600, 156, 0)
        """
        return tuple(sorted({self.reach_windows, self.rebuilt_windows, self._recent_reach, 0}, reverse=True))

    def _oldest_read(self, index: int) -> int:
        """The oldest window a query at ``index`` may read: ``reach_windows`` back, but not before the
        open run's first window less its reach, where its charge begins. A run that reads less
        (``reach_choices``) so still reads the windows it has answered itself: a run whose budget paid
        no reach at all compares with the first day's trend from its own sixth window on, where the
        plain statistic would have followed no rhythm for the rest of the run."""
        if self.run_reach_windows is None:
            return index - self.reach_windows
        first = index if self.run_first_index is None else min(int(self.run_first_index), index)
        return max(index - self.reach_windows, first - self.run_reach_windows)

    @property
    def rebuilt_seconds(self) -> float:
        """``rebuilt_windows`` in seconds: how far before the next window a restart re-reads."""
        return self.rebuilt_windows * self.window_seconds

    @property
    def reach_seconds(self) -> float:
        """``reach_windows`` in seconds: how far before a run's first window its charge begins."""
        return self.reach_windows * self.window_seconds

    @property
    def rhythm_variance(self) -> float:
        """The rhythm mode's variance factor with every window kept (public)."""
        return rhythm_variance(self.recent_windows, 2 * self.half_seasonal + 1)

    def window_index(self, window_start: float) -> int:
        """The window's place on the epoch-aligned grid (public)."""
        return int(math.floor(window_start / self.window_seconds + 1e-9))

    # -- history ----------------------------------------------------------------------
    def learn_one(self, index: int, units: np.ndarray, entities: Sequence[str | None], paged: bool = False,
                  scores: "np.ndarray | None" = None) -> None:
        """Remember window ``index`` after it was answered; ``paged`` (public): it paged or held,
        and the day-old sets should leave it out (``_day_shape``); ``scores``, the events' model
        scores, lets ``relevel`` weigh the window again."""
        units = np.asarray(units).reshape(-1)
        if units.size and (units.min() < 0 or units.max() > self.resolution):
            raise ValueError(f"weight units must be in [0, {self.resolution}]")
        units = units.astype(self._unit_dtype)
        self.history_start(index)
        self._windows[int(index)] = (self._unit_ids(entities, units.size), units, bool(paged))
        if scores is not None:
            self._scores[int(index)] = np.asarray(scores, dtype=np.float32).reshape(units.shape)
        keep_from = int(index) + 1 - self.reach_windows  # what compare(index + 1) may read, no more
        for old in [k for k in self._windows if k < keep_from]:
            del self._windows[old]
        # Scores only over the two days' reach: after a relevel the week-old set waits a week for windows
        # at the new levels, and a week's history is half the size (32-bit unit ids too).
        scores_from = int(index) + 1 - self.rebuilt_windows
        for old in [k for k in self._scores if k < scores_from]:
            del self._scores[old]
        if len(self._ids) > 4 * max(1, sum(v[0].size for v in self._windows.values())) + 1024:
            self._compact()

    def relevel(self, to_units: "Callable[[np.ndarray], np.ndarray]") -> None:
        """Weigh the history again at new levels (``to_units`` maps scores to weight units): the
        alarm's levels moved with the fleet (docs/alarm.md). Windows learnt without scores are
        forgotten: their weights are on the old scale."""
        self._windows = {k: (ids, np.asarray(to_units(self._scores[k].astype(float))).astype(self._unit_dtype), p)
                         for k, (ids, _, p) in self._windows.items() if k in self._scores}

    def _unit_ids(self, entities: Sequence[str | None], n: int) -> np.ndarray:
        if not entities or any(e is None for e in entities):
            return np.full(n, -1, dtype=np.int32)  # each event its own unit
        if len(entities) != n:
            raise ValueError("one entity per event is needed")
        get = self._ids.setdefault
        return np.fromiter((get(e, len(self._ids)) for e in entities), dtype=np.int32, count=n)

    def _compact(self) -> None:
        """Renumber the units still in the history (units that left long ago are forgotten)."""
        alive = sorted({int(u) for ids, _, _ in self._windows.values() for u in ids if u >= 0})
        new = {old: i for i, old in enumerate(alive)}
        names = {i: e for e, i in self._ids.items()}
        self._ids = {names[old]: i for old, i in new.items()}
        lookup = np.full(max(alive, default=-1) + 2, -1, dtype=np.int64)
        for old, i in new.items():
            lookup[old] = i
        self._windows = {k: (np.where(ids >= 0, lookup[ids], -1).astype(np.int32), u, p)
                         for k, (ids, u, p) in self._windows.items()}

    def __deepcopy__(self, memo: dict) -> "RhythmReference":
        # The releaser snapshots state before each window; the stored arrays are never
        # changed in place, so copying the containers is a deep copy.
        out = object.__new__(RhythmReference)
        out.__dict__.update(self.__dict__)
        out._ids = dict(self._ids)
        out._windows = dict(self._windows)
        out._scores = dict(self._scores)
        return out

    # -- the comparison ---------------------------------------------------------------
    def _has(self, j: int) -> bool:
        """Window ``j`` was kept and lies within the comparison's reach (``_sets`` sets the floor)."""
        return j >= self._floor and j in self._windows

    def _last(self, before: int, count: int) -> list[int]:
        """The last ``count`` windows kept before ``before``, looking back at most 4 ``count``
        windows (public: the calendar and when the monitor ran)."""
        out = [j for j in range(before - 1, before - 1 - 4 * count, -1) if self._has(j)][:count]
        return out[::-1]

    def _day_shape(self, day: int, fills: Sequence[int] = ()) -> "tuple[tuple[list[int], np.ndarray], tuple[list[int], np.ndarray]] | None":
        """The means over the windows around ``day`` and over the hour before them, a day-old
        hour, each as (windows, coefficients) (``_bridged``, marked windows filled from ``fills``
        first), or None when too few were kept (the monitor was not running)."""
        same = [j for j in range(day - self.half_seasonal, day + self.half_seasonal + 1) if self._has(j)]
        before = [j for j in range(day - self.recent_windows, day) if self._has(j)]
        if 2 * len(same) < 2 * self.half_seasonal + 1 or 2 * len(before) < self.recent_windows:
            return None
        return self._bridged(same, fills=fills), self._bridged(before, fills=fills)

    def _bridged(self, windows: list[int], coefficients: "np.ndarray | None" = None,
                 keep_newest: bool = False, fills: Sequence[int] = ()) -> tuple[list[int], np.ndarray]:
        """The combination ``coefficients`` of ``windows`` (their mean by default) as coefficients
        on kept windows, each window that paged or held replaced by the same hour of another day
        kept (``fills``: the shifts to it, in windows, tried in turn) where that one did not, else
        by the straight line between the nearest windows on either side that did not (within
        ``recent_windows``; the one side where the other has none; the window itself where neither
        has). A surge that paged is then not a later day's normal, and a ramp that paged (a shift
        change the first day's trend could not follow) stays a ramp: leaving such windows out
        instead moved a set's centre off the ramp and paged there every day. The other day's hour
        comes first because a line cuts a ramp's corner where pages and holds mark a long span
        around it (the top of the morning ramp then paged day after day, each day's pages marking
        the top again). ``keep_newest`` (the first day's trend): a window with no unpaged one after
        it yet is kept as it is, not moved onto the one before: those are the newest windows, and
        whether they were a surge or the start of a ramp is not known yet."""
        coefficients = (np.full(len(windows), 1.0 / len(windows)) if coefficients is None
                        else np.asarray(coefficients, dtype=float))
        coef: dict[int, float] = {}

        def unpaged(steps: "Sequence[int]") -> "int | None":
            return next((k for k in steps if self._has(k) and not self._windows[k][2]), None)

        for j, share in zip(windows, coefficients):
            lo = hi = None
            if self._windows[j][2]:
                other = unpaged([j + shift for shift in fills])
                if other is not None:
                    coef[other] = coef.get(other, 0.0) + share
                    continue
                lo = unpaged(range(j - 1, j - 1 - self.recent_windows, -1))
                hi = unpaged(range(j + 1, j + 1 + self.recent_windows))
            if (lo is None and hi is None) or (keep_newest and hi is None):
                coef[j] = coef.get(j, 0.0) + share
            elif lo is None or hi is None:
                side = hi if lo is None else lo
                coef[side] = coef.get(side, 0.0) + share
            else:
                t = (j - lo) / (hi - lo)
                coef[lo] = coef.get(lo, 0.0) + share * (1.0 - t)
                coef[hi] = coef.get(hi, 0.0) + share * t
        keys = sorted(coef)
        return keys, np.array([coef[k] for k in keys])

    def _kind(self, index: int) -> bool:
        """Whether window ``index`` falls on one of ``weekend_days`` (UTC; public: the calendar)."""
        if not self.weekend_days:
            return False
        day = math.floor(index * self.window_seconds / 86400.0 + 1e-9)
        return (day + 3) % 7 in self.weekend_days  # 1970-01-01, day 0, was a Thursday (3)

    def _sets(self, index: int, steady_line: bool = False) -> tuple[ReferenceMode, list[Prediction], bool, int]:
        """The mode, its predictions, each a list of parts (windows, their coefficients), whether
        the first is the steady line, which its guards hold from both sides, and how many of the last
        are single days back (``SINGLE_DAYS``): public (the calendar, which windows the monitor
        released and ``steady_line``, as in ``outline``). The first prediction is the mode's own and gives the
        threshold; the others guard it (``compare`` takes the lowest statistic, each guard's with its
        margin): in the rhythm mode the day's own trend, in the recent mode the days before where
        there are any, the level, and each single day back where it was kept."""
        self._floor = self._oldest_read(index)
        paged_today = self._paged_today(index)
        # Neither mode reads the days before after a page today.
        days_before = None if paged_today else self._days_before(index)
        # The recent level and its trend, extrapolated to this window (least squares over the last
        # trend_windows windows), so a rising hour is not a surge.
        recent = self._last(index, self.trend_windows)
        trend = (self._first_day_part(recent, trend_coefficients(recent, index))
                 if 2 * len(recent) >= self.trend_windows and len(recent) >= 2 else None)  # a line needs two windows
        if days_before is not None and self.days_alike:
            # The steady line first where it has its windows, this prediction holding it; the day's own
            # trend over it: a day whose morning rises sooner or faster than the days before did is not a surge.
            steady = self._steady_part(index) if steady_line else None
            predictions = ([[steady]] if steady else []) + [days_before] + ([[trend]] if trend else [])
            return "rhythm", predictions, steady is not None, 0
        # Less than a day of history, days that are no guide, or a day that paged: the first day's
        # predictions. On days that are no guide the days before (where there are any) hold them, as the
        # trend holds the rhythm mode's; not after a page today, whose day the days before did not foretell
        # (on steady traffic they then held down 3 % of the day's later surges).
        if trend is None:
            return "baseline", [], False, 0
        predictions = [[trend]] + ([days_before] if days_before is not None else [])
        predictions.append([self._first_day_part(recent, np.full(len(recent), 1.0 / len(recent)))])
        # The steady line first (the smallest spread on steady traffic; the short line guards its
        # bends), once at least half of its windows were kept.
        steady = self._steady_part(index)
        if steady:
            predictions.insert(0, [steady])
        # Each single day back (SINGLE_DAYS) holds them all from above, last (``compare``): the Monday after a
        # weekend is Friday's or last Monday's shape, which the line through its last hours misses at every bend.
        singles = [] if paged_today else [p for p in (self._days_before(index, [d]) for d in SINGLE_DAYS) if p is not None]
        return "recent", predictions + singles, steady is not None, len(singles)

    def _days_before(self, index: int, days: "Sequence[int] | None" = None) -> "Prediction | None":
        """The rhythm mode's prediction of window ``index``: the level of the last ``recent_windows``
        plus the shape, at this hour minus the hour before, averaged over the days there are (a surge
        one day weighs half as much with two); None before a day of history (module docstring).
        ``days``: how many days back to look (default: the last SEASONAL_DAYS of the same kind)."""
        recent = self._last(index, self.recent_windows)
        if self.period is None or len(recent) < self.recent_windows:
            return None
        if days is None:
            # Only days of the same kind (weekday or weekend, when they differ): Saturday is not
            # Friday with another shape.
            kind = self._kind(index)
            days = [d for d in range(1, SEASONAL_DAYS + 1) if self._kind(index - d * self.period) == kind]
        # A marked window of one day-old set is filled from the same hour of the other days kept, nearest first.
        shapes = [p for p in (self._day_shape(index - d * self.period,
                                              [(d - e) * self.period for e in sorted(days, key=lambda e: abs(e - d)) if e != d])
                              for d in days) if p]
        if not shapes:
            return None
        parts = [(recent, np.full(len(recent), 1.0 / len(recent)))]
        for (same, c_same), (before, c_before) in shapes:
            parts += [(same, c_same / len(shapes)), (before, -c_before / len(shapes))]
        return parts

    def _paged_today(self, index: int) -> bool:
        """Whether a window of window ``index``'s UTC day before it paged or held (public). A day whose
        shape the days before do not foretell (the first Saturday after a week of weekdays, a holiday)
        pages again and again against their hours; after its first page the day's own recent windows
        predict the rest of it, as on the first day."""
        start = index - index % self.period
        return any(self._windows[j][2] for j in range(start, index) if j in self._windows)

    def _steady_part(self, index: int) -> "tuple[list[int], np.ndarray] | None":
        """The steady line through the last ``steady_windows`` windows as a prediction part
        (``_first_day_part``), once at least half of them were kept; None without (0: none)."""
        windows = self._last(index, self.steady_windows) if self.steady_windows else []
        if not windows or 2 * len(windows) < self.steady_windows:
            return None
        return self._first_day_part(windows, trend_coefficients(windows, index))

    def _first_day_part(self, windows: list[int], coefficients: np.ndarray) -> tuple[list[int], np.ndarray]:
        """A fit through the last windows (the first day's predictions, and the steady line's on the days
        after): bridged over its windows that paged, unless they are most of its set, a ramp it must learn
        (module docstring)."""
        if 2 * sum(self._windows[j][2] for j in windows) > len(windows):
            return windows, coefficients
        return self._bridged(windows, coefficients, keep_newest=True)

    def outline(self, index: int, steady_line: bool = False
                ) -> tuple[ReferenceMode, float, float, float, tuple[float, ...]]:
        """How window ``index`` will be compared (public: the calendar, which windows were
        released and ``steady_line``): the mode, the sum of the prediction's squared coefficients,
        the prediction's relative error (``trend_error`` in the recent mode), the sum of its
        coefficients cubed (``Comparison.skew_factor``) and its coefficient on each window
        (``Comparison.prediction``).

        ``steady_line``: in the rhythm mode, the steady line (``steady_windows``) comes first, held by the
        rhythm prediction (``compare``); the release asks for it where the released profile is straight
        over the line's span (``baseline.profile_straight``). Without it the rhythm prediction alone."""
        mode, predictions, _, _ = self._sets(int(index), steady_line)
        squares, cubes, prediction = _described(predictions)
        return mode, squares, self.trend_error if mode == "recent" else 0.0, cubes, prediction

    def compare(self, index: int, units: np.ndarray, entities: Sequence[str | None], m: int,
                low_units: int, level_slope: float = 0.0, level_margin: int = 0,
                steady_line: bool = False) -> Comparison:
        """Window ``index``'s statistic, in integer units, for the baseline rate ``m`` (tau in
        1 / resolution), each unit's term clipped to the run's interval [-``low_units``,
        resolution] (``SurgeAlarm.low_units``). Private: only the alarm's noisy answer about it
        is published.

        ``level_slope`` (public, beta): each unit's term also loses beta times its predicted
        weight (the prediction's coefficients on its weights), inside the clip, so the
        statistic is a - beta F_hat with F_hat the window's predicted flagged weight: compared
        with a fixed number, it is a compared with a threshold that rises with the level
        (``SurgeAlarm.level_line``). The interval, and so the guarantee, is unchanged.

        In the recent mode, the lower of the trend's statistic and the level's plus
        ``level_margin`` (public, in units; the release passes the window's threshold): the level
        overrules the trend only where it puts the window that far lower, as at the end of a
        falling hour, and not through its own noise on steady traffic (module docstring). With a
        steady line (``steady_windows``), its statistic held within a tenth of ``level_margin``
        (``GUARD_DIVISOR``) of the trend's, and the level's plus ``level_margin`` where lower. In
        the rhythm mode, with ``steady_line`` (public, as in ``outline``), the steady line's
        statistic held within that tenth of the rhythm prediction's. Over them, the other mode's
        own prediction plus that tenth, where lower: the trend's in the rhythm mode (a morning that
        rises sooner than the days before did), the days before's in the recent mode (a step at the
        hour the days before had it, on a day whose rates differ), and in the recent mode the same
        weekday a week back's, and each of the last three days' on its own, plus that tenth, where lower
        and kept (the Monday after a weekend, a day the days before do not foretell and Friday or last
        week's same day does). Each of these is a minimum or
        maximum of statistics that one person moves within the run's interval, plus public
        margins, so it moves within that interval too."""
        units = np.asarray(units, dtype=np.int64).reshape(-1)
        m = int(m)
        slope = float(level_slope)
        if not (math.isfinite(slope) and slope >= 0):
            raise ValueError(f"level_slope must be a non-negative number, got {level_slope!r}")
        if int(level_margin) != level_margin or level_margin < 0:
            raise ValueError(f"level_margin must be a non-negative integer, got {level_margin!r}")
        mode, predictions, steady, singles = self._sets(int(index), steady_line)
        if not predictions:
            return Comparison(int(units.sum()) - m * int(units.size), "baseline")
        first, *others = self._statistics(predictions, units, entities, m, low_units, slope)
        single_days, others = others[len(others) - singles:], others[:len(others) - singles]
        # The level (last) counts where it is lower by the margin; the short line under the steady one
        # where it is lower by a share of it (at 0 its own noise took the steady line's smaller spread back).
        guard_margin = int(level_margin) // GUARD_DIVISOR
        if mode == "rhythm":
            if steady:
                # The rhythm prediction holds the steady line from both sides: the line lags the day's ramps and
                # overshoots their ends, where the days before predict them.
                rhythm, *others = others
                first = min(max(first, rhythm - guard_margin), rhythm + guard_margin)
            margins = [guard_margin] * len(others)  # the day's own trend
        else:
            if steady:
                # The short line (and the days before) hold the steady line from below too: after a bend (3 hours
                # after a ramp, the line through the ramp and the flat overshoots) it stood under the lower guard
                # and missed the surges there (docs/benchmarks/alarm-rhythm.md, "Trial history").
                first = max(first, min(others[:-1]) - guard_margin)
            margins = [guard_margin] * (len(others) - 1) + [int(level_margin)]
        statistic = min([first] + [s + margin for s, margin in zip(others, margins)] + [s + guard_margin for s in single_days])
        squares, cubes, prediction = _described(predictions)
        return Comparison(statistic, mode, squares, self.trend_error if mode == "recent" else 0.0, slope, cubes, prediction)

    def _statistics(self, predictions: list[Prediction], units: np.ndarray,
                    entities: Sequence[str | None], m: int, low_units: int, slope: float) -> list[int]:
        """The statistic against each prediction (``compare``)."""
        lo, hi = -int(low_units), self.resolution
        ids_now = self._unit_ids(entities, units.size)
        n_units = len(self._ids)
        # Events without an entity are units of their own: each term on its own, clipped.
        now_own = int(np.clip(units[ids_now < 0] - m, lo, hi).sum())
        a_now = np.bincount(ids_now[ids_now >= 0], weights=(units[ids_now >= 0] - m).astype(float), minlength=n_units)
        # Each window's weights are counted once, into every prediction that uses it.
        uses: dict[int, list[tuple[int, float]]] = {}
        for k, parts in enumerate(predictions):
            for ws, coef in parts:
                for j, c in zip(ws, coef):
                    uses.setdefault(j, []).append((k, float(c)))
        totals = [now_own] * len(predictions)
        preds = [np.zeros(n_units) for _ in predictions]
        for j, shares in uses.items():
            ids, u, _ = self._windows[j]
            own = ids < 0
            # A unit's prediction of its term, and beta times its predicted weight.
            weighed = (1.0 + slope) * u - m
            named = np.bincount(ids[~own], weights=weighed[~own], minlength=n_units) if n_units and not own.all() else None
            unnamed = weighed[own] if own.any() else None
            for k, c in shares:
                if unnamed is not None:
                    totals[k] += int(np.clip(np.rint(-c * unnamed), lo, hi).sum())
                if named is not None:
                    preds[k] += c * named
        if n_units:
            totals = [t + int(np.clip(np.rint(a_now - p), lo, hi).sum(dtype=np.int64)) for t, p in zip(totals, preds)]
        return totals


def reference_for(settings, window_seconds: float) -> "RhythmReference | None":
    """The rhythm reference the alarm settings (``config.alarm``) ask for, or None (the plain
    statistic: ``follow_rhythm`` off, or an absolute ``threshold``). The releaser compares with
    it; the budget plan reads its reach from it."""
    if not settings.follow_rhythm or settings.threshold is not None:
        return None
    return RhythmReference(window_seconds, settings.recent_windows, settings.seasonal_windows, settings.rhythm_slack,
                           trend_error=settings.trend_error, weekend_days=settings.weekend_days,
                           trend_windows=settings.trend_windows, steady_windows=settings.steady_windows)


def trend_coefficients(windows: Sequence[int], index: int) -> np.ndarray:
    """The least-squares line through ``windows`` (their indices), extrapolated to ``index``, as
    coefficients on their values (summing to 1).

    >>> trend_coefficients([0, 1, 2], 3).round(3).tolist()
    [-0.667, 0.333, 1.333]
    """
    x = np.asarray(windows, dtype=float)
    dx = x - x.mean()
    return 1.0 / x.size + dx * (index - x.mean()) / float(np.dot(dx, dx))


def prediction_factors(level_slope: float, squares: float, cubes: float) -> tuple[float, float]:
    """(variance factor, skew factor): a statistic that takes a prediction and ``level_slope``
    times its weights off the window, over the window's own normal variance and third cumulant
    (``calibrate._normal_spread``). Its windows enter with coefficients (1 + level_slope) c: the
    variance by 1 + (1 + level_slope)^2 ``squares``; the third cumulant cubed and with the
    opposite sign, so by 1 wherever ``cubes`` is positive (every prediction whose positive
    coefficients outweigh its negative ones), more where a bridge piled the hour before's
    negative weight on a few windows.

    >>> [round(x, 3) for x in prediction_factors(0.0, 0.225, 0.015) + prediction_factors(0.0, 1.28, -0.95)]
    [1.225, 1.0, 2.28, 1.95]
    """
    share = 1.0 + level_slope
    return 1.0 + share ** 2 * squares, 1.0 + max(0.0, -share ** 3 * cubes)


def _squares(predictions: list[Prediction]) -> float:
    """The sum of the first prediction's squared coefficients (the threshold's: the statistic is
    never above that prediction's, but where both guards hold a steady line up)."""
    return sum(float(np.dot(c, c)) for _, c in predictions[0]) if predictions else 0.0


def _described(predictions: list[Prediction]) -> tuple[float, float, tuple[float, ...]]:
    """What the threshold knows of the first prediction (public): the sum of its squared coefficients
    (``_squares``), of its coefficients cubed, each window's parts added up first (a bridge may move a
    day-old window's share onto one that another part holds), and its coefficient on each window."""
    merged = tuple(_merged(predictions).values())
    return _squares(predictions), float(sum(c ** 3 for c in merged)), merged


def _merged(predictions: list[Prediction]) -> dict[int, float]:
    """The first prediction's coefficient on each window, its parts added up."""
    merged: dict[int, float] = {}
    for windows, coefficients in (predictions[0] if predictions else []):
        for j, c in zip(windows, coefficients):
            merged[j] = merged.get(j, 0.0) + float(c)
    return merged


def days_alike(rates: Sequence[float], ratio: float = DAYS_CHANGE_RATIO) -> bool:
    """Whether consecutive days' released baseline rates (public, oldest first, at one level) stay
    within ``ratio`` of each other: where one day's make-up differs from the day before (a weekend
    after a week), the days the rhythm mode compares with are no guide to today, nor to the day after
    (which would compare with the day that differed and the one before it).

    >>> days_alike([0.03, 0.031, 0.029]), days_alike([0.03, 0.012, 0.011]), days_alike([])
    (True, False, True)
    """
    r = [float(x) for x in rates]
    return all(min(a, b) > 0 and max(a, b) / min(a, b) <= ratio for a, b in zip(r, r[1:]))


def today_alike(rates: "dict[int, float]", today: int, ratio: float = DAYS_CHANGE_RATIO) -> bool:
    """Whether the days the rhythm mode compares day ``today`` with are a guide to it, from the daily
    baselines' released rates by day number (public, at one level): the last DAYS_CHANGE_DAYS days
    kept alike (``days_alike``) and, where the same weekday a week before was kept, that day alike
    with each of the two days before ``today``. The last days cannot say that a Saturday follows a
    week of weekdays (Friday and Thursday were alike); last Saturday's rate against them can.
    Without that day, every day kept in the last week alike: after a change of make-up (a first
    weekend) the days of the new kind say nothing of the day after them (the Monday after two
    alike weekend days), until the same weekday a week back can.

    >>> week = {d: 0.03 for d in range(7)} | {5: 0.015, 6: 0.014}    # a weekend of half the rate
    >>> week |= {7: 0.03, 8: 0.031, 9: 0.029, 10: 0.03, 11: 0.03}     # the next week's weekdays
    >>> today_alike(week, 11), today_alike(week, 12)   # Friday compares with Thursday: Saturday not
    (True, False)
    >>> first = {2: 0.03, 3: 0.031, 4: 0.03, 5: 0.015, 6: 0.014, 7: 0.015}   # a deployment's first week
    >>> today_alike(first, 5), today_alike(first, 8)   # Friday, and the day after three weekend-like days
    (True, False)
    """
    kept = sorted(d for d in rates if d < today)
    if not days_alike([rates[d] for d in kept[-DAYS_CHANGE_DAYS:]], ratio):
        return False
    week_ago = rates.get(today - WEEK_DAYS)
    if week_ago is None:
        return days_alike([rates[d] for d in kept if d > today - WEEK_DAYS], ratio)
    return all(days_alike([week_ago, rates[d]], ratio) for d in (today - 1, today - 2) if d in rates)
