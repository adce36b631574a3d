"""The budget plan: what a period without a page costs, and how many pages the rest pays for.

The plan follows from the config alone, never from the data, so it can be printed
freely. ``monitor run`` logs it at start and ``monitor budget`` shows it.

Every window is released: the alarm's quiet answers are free; an AboveThreshold run pays
for its threshold when it opens and for each page when it is given. A rolling period
touches the thresholds of the epoch-aligned runs it overlaps (one while no run pages: a
quiet run goes on past its boundary), the baseline estimates of its schedule and the
scheduled reports; each page adds its own share and a detailed report, and may end its
run at the next boundary (one more threshold in the periods that straddle it). When a
period's budget cannot pay for a page, the alarm says ``suppressed`` (and no report is
released) until the oldest charge leaves the rolling period.

``visibility_report`` says what the alarm can see: the smallest surge, as a share
of the people online, that pages within one window 95 % of the time, and the false-page rate
its threshold implies. It reads public things only: the config, the model file (DP) and the
baseline the ledger's last record released (DP); never the events.

>>> plan = BudgetPlan(period_seconds=86400, window_seconds=300, accountant="basic", epsilon=12.0, delta=1e-6,
...                   threshold_cost=(0.4, 0.0), runs_per_period=2, page_cost=(0.4, 0.0), baseline_cost=(0.1, 0.0),
...                   baselines_per_period=1, report_cost=(0.8, 1.1e-9))
>>> round(plan.quiet_epsilon, 2), plan.pages_per_period
(0.5, 9)
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
from dataclasses import dataclass

from monitor.budget.composition import AccountantKind, Cost, fits, spend

__all__ = ["BudgetPlan", "iso", "duration", "plan_from_config", "PLD_DELTA_NOTE", "visibility_report",
           "VISIBILITY_TRAFFIC", "pages_measured"]

PLD_DELTA_NOTE = (
    "under the pld accountant the stream spends exactly what basic composition would: every charge it makes "
    "(alarm runs and pages, baselines, reports) is adaptively triggered, its existence depending on earlier "
    "released answers (a report follows a page; a baseline or a scheduled report is made only if the budget the "
    "pages left admits it), and no PLD privacy-filter theorem covers such charges, so they add up by basic "
    "composition: epsilon and delta spent are sums (docs/budget.md)"
)

# Traffic levels (events per window) stated before any baseline has been released.
VISIBILITY_TRAFFIC = (300, 1_500, 10_000)

# Pages counted at most, per period, when searching what the budget pays for.
_MAX_PAGES = 10_000


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
class BudgetPlan:
    """What the configured budget pays for, per rolling period (all public)."""

    period_seconds: float
    window_seconds: float
    accountant: AccountantKind
    epsilon: float
    delta: float
    threshold_cost: Cost
    runs_per_period: int
    page_cost: Cost
    baseline_cost: Cost
    baselines_per_period: int
    report_cost: Cost
    scheduled_reports_per_period: int = 0
    report_on_page: bool = True
    alarm_enabled: bool = True
    reach_seconds: float = 0.0
    # The shorter reaches a run reads over where the full one's periods cannot pay (``reach_choices``).
    fallback_reach_seconds: tuple[float, ...] = ()
    # Pages a new run that reads the whole reach leaves room for (``report.reserve_pages``; the release's
    # ``_run_reach``): a week of periods is not filled by one day of pages.
    reach_spare_pages: int = 0
    # What a restart's first run reads and is charged from: the history a restart rebuilds
    # (``RhythmReference.rebuilt_windows``, ``held_windows``), not the whole reach.
    restart_reach_seconds: float = 0.0
    run_seconds: float = 86400.0
    warmup_cost: Cost = (0.0, 0.0)
    count_cost: Cost = (0.0, 0.0)
    warmup_seconds: float = 0.0

    def with_reach(self, reach_seconds: float) -> "BudgetPlan":
        """The plan of runs that read ``reach_seconds`` of history."""
        runs = math.ceil((self.period_seconds + reach_seconds) / self.run_seconds - 1e-9) + 1
        return dataclasses.replace(self, reach_seconds=reach_seconds, runs_per_period=runs, fallback_reach_seconds=(),
                                   reach_spare_pages=0)

    @property
    def counted_seconds(self) -> float:
        """How much of the calendar's runs one period counts: a run is charged from its first window
        less ``reach_seconds`` (the history its queries read), so a period counts the runs that answer
        within it or up to ``reach_seconds`` after it."""
        return self.period_seconds + self.reach_seconds

    def runs(self, pages: int) -> int:
        """Alarm runs a period with ``pages`` pages touches at most: a quiet run goes on past
        its boundary, so a period without a page holds one; a run that paged ends at its
        boundary, so each page can bring one more, up to ``runs_per_period``."""
        return min(pages + 1, self.runs_per_period)

    def _charges(self, pages: int) -> tuple[dict[Cost, int], dict[Cost, int]]:
        """(charges the accountant composes, charges it adds: see BASIC_KINDS).

        Every charge of the stream is adaptively triggered, so all are added, under
        either accountant; the first mapping stays empty (PLD composes only fixed-cost
        windows on a calendar, which the stream never makes)."""
        added: dict[Cost, int] = {}
        for cost, n in ((self.threshold_cost, self.runs(pages) if self.alarm_enabled else 0),
                        (self.page_cost, pages if self.alarm_enabled else 0),
                        (self.baseline_cost, self.baselines_per_period if self.alarm_enabled else 0),
                        (self.report_cost, self.scheduled_reports_per_period + (pages if self.report_on_page else 0))):
            if n:
                added[cost] = added.get(cost, 0) + n
        return {}, added

    def _fits(self, pages: int) -> bool:
        composed, added = self._charges(pages)
        return fits(composed, self.accountant, self.epsilon, self.delta, basic=added)

    @property
    def quiet_epsilon(self) -> float:
        """Epsilon of a period without a page: the thresholds of the runs it touches, the baselines, the scheduled reports."""
        composed, added = self._charges(0)
        return spend(composed, self.accountant, self.delta, added)[0]

    @property
    def quiet_fits(self) -> bool:
        return self._fits(0)

    @property
    def one_page_epsilon(self) -> float:
        """Epsilon of a period with one page: the page and its report, and the next run's
        threshold when its run ends within the period."""
        composed, added = self._charges(1)
        return spend(composed, self.accountant, self.delta, added)[0]

    @property
    def page_epsilon(self) -> float:
        """What one more page adds (basic composition: its own share and its report)."""
        return self.page_cost[0] + (self.report_cost[0] if self.report_on_page else 0.0)

    @functools.cached_property  # a PLD search composes distributions: do it once
    def pages_per_period(self) -> int:
        """Pages one period's budget pays for on top of a quiet period (0 if not even that fits)."""
        if not self.alarm_enabled or not self._fits(0):
            return 0
        lo, hi = 0, 1
        while hi < _MAX_PAGES and self._fits(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self._fits(mid) else (lo, mid)
        return lo

    def summary(self) -> str:
        """One sentence: what a quiet period costs and how many pages the budget pays for."""
        head = (f"a {duration(self.period_seconds)} period without a page costs epsilon {self.quiet_epsilon:.3g} "
                f"({self.runs(0)} alarm run threshold(s) of {self.threshold_cost[0]:g}, {self.baselines_per_period} baseline estimate(s) of "
                f"{self.baseline_cost[0]:g}, {self.scheduled_reports_per_period} scheduled report(s) of {self.report_cost[0]:g}); "
                f"each page adds about {self.page_epsilon:.3g}; the budget ({self.accountant}, epsilon {self.epsilon:g}, "
                f"delta {self.delta:.2g}) pays for ")
        if not self.quiet_fits:
            return head + "not even a period without a page: the alarm will be suppressed"
        if self.reach_seconds:
            # Each run's charge reaches back over the history it reads, so the pages one period must pay
            # are those of every run answering up to reach_seconds after it.
            shorter = [self.with_reach(r) for r in self.fallback_reach_seconds]
            less = "; ".join(f"{p.pages_per_period} in any {duration(p.counted_seconds)} where runs read "
                             + (f"{duration(p.reach_seconds)} only" if p.reach_seconds else "their own windows only")
                             for p in shorter)
            return head + (f"{self.pages_per_period} page(s) in any {duration(self.counted_seconds)} (a run is charged "
                           f"from {duration(self.reach_seconds)} before its first window: its queries read that much of "
                           "each person's history" + (f"; a new run reads that far only while {self.reach_spare_pages} more "
                                                      "pages would fit" if self.reach_spare_pages else "")
                           + "); where those periods are spent a new run reads less"
                           + (f" ({less})" if less else "") + ", then the alarm says 'suppressed' until the oldest charge "
                           "leaves the rolling period")
        return head + (f"{self.pages_per_period} page(s) per period; after that the alarm says 'suppressed' until the "
                       "oldest charge leaves the rolling period")

    @property
    def restart_epsilon(self) -> float:
        """What stopping and starting the monitor costs: the open alarm run's noisy threshold
        dies with the process, so the next start opens (and pays for) a new run."""
        return self.threshold_cost[0] if self.alarm_enabled else 0.0

    @property
    def first_day_epsilon(self) -> float:
        """Epsilon of the first period: the warm-up estimate in place of one daily baseline."""
        if not self.alarm_enabled or not self.baselines_per_period:
            return self.quiet_epsilon
        return self.quiet_epsilon - self.baseline_cost[0] + self.warmup_cost[0]

    def first_day_note(self) -> str:
        """One sentence on the first period's cost and a warm-up without traffic (empty without the alarm)."""
        if not self.alarm_enabled or not self.warmup_cost[0]:
            return ""
        return (f"the first {duration(self.period_seconds)} cost epsilon {self.first_day_epsilon:.3g} (the warm-up estimate of "
                f"{self.warmup_cost[0]:g} in place of a daily one); a warm-up whose released event count shows too little "
                f"traffic releases nothing more and costs {self.count_cost[0]:g} (alarm.epsilon_baseline_events), and the next "
                f"warm-up follows {duration(self.warmup_seconds)} later")

    def restart_note(self) -> str:
        """One sentence on the cost of a restart (empty without the alarm)."""
        if not self.restart_epsilon:
            return ""
        back = (f", from {duration(self.restart_reach_seconds)} before the restart on (the history a restart rebuilds "
                "and its queries read; none where the input topic no longer holds it)" if self.restart_reach_seconds else "")
        return (f"each restart (Ctrl-C and start again, a crash, a deploy) goes on with a quiet alarm run (its noisy "
                f"threshold kept in <ledger>.run); after a page it opens a new alarm run: "
                f"epsilon {self.restart_epsilon:g} (alarm.epsilon_threshold) more in the periods it touches{back}")

    def advice(self) -> str:
        """How to afford at least one page per period (empty when the budget already does)."""
        if self.pages_per_period >= 1:
            return ""
        need = self.one_page_epsilon
        return (f"To page at least once per period set budget.epsilon to about {need * 1.01:.3g}, or lower the alarm's "
                "and the reports' epsilons, or schedule fewer baseline estimates and reports")


def plan_from_config(config) -> BudgetPlan:
    """The plan of a MonitorConfig."""
    from monitor.alarm.reference import reference_for

    b, a, r = config.budget, config.alarm, config.report
    reference = reference_for(a, config.window.size_seconds) if a.enabled else None
    reach = 0.0 if reference is None else reference.reach_seconds
    return BudgetPlan(
        period_seconds=b.period_seconds, window_seconds=config.window.size_seconds, accountant=b.accountant,
        epsilon=b.epsilon, delta=b.delta, threshold_cost=(a.epsilon_threshold, 0.0),
        # A rolling period not aligned on the runs (or the baseline spans) overlaps one more of
        # them (runs: once a run has paged and ended at its boundary); a run's charge begins its
        # reach before its first window, so the runs of the reach after the period count too.
        runs_per_period=math.ceil((b.period_seconds + reach) / a.run_seconds - 1e-9) + 1, page_cost=(a.epsilon_page, 0.0),
        baseline_cost=config.baseline_cost(),
        baselines_per_period=math.ceil(b.period_seconds / a.baseline_refresh_seconds - 1e-9) + 1,
        report_cost=config.report_cost(),
        scheduled_reports_per_period=math.ceil(b.period_seconds / r.every_seconds - 1e-9) if r.every_seconds else 0,
        report_on_page=r.on_alarm, alarm_enabled=a.enabled, reach_seconds=reach, run_seconds=a.run_seconds,
        warmup_cost=(a.epsilon_baseline_warmup + a.epsilon_baseline_events, 0.0), count_cost=(a.epsilon_baseline_events, 0.0),
        warmup_seconds=a.baseline_warmup_seconds,
        fallback_reach_seconds=() if reference is None else tuple(
            w * reference.window_seconds for w in reference.reach_choices()[1:]),
        reach_spare_pages=r.reserve_pages if reference is not None and reference.reads_far(reference.reach_windows) else 0,
        restart_reach_seconds=0.0 if reference is None else reference.rebuilt_seconds,
    )


def _share(x: float) -> str:
    """A surge share in percent, 2 significant figures (``1.0`` is "every person": never pages)."""
    return "over 100 %" if x >= 1.0 else f"{100 * x:.2g} %"


RHYTHM_NOTE = ("the alarm follows the traffic's daily rhythm (alarm.follow_rhythm: each window against the same "
               "people's last hour and yesterday's same hour)")


def rhythm_note(settings) -> str:
    """What the rhythm reference compares each window with, weekend days included (public: the config)."""
    days = ", ".join(str(d) for d in sorted(settings.weekend_days))
    level = ("; its threshold rises with each window's predicted flagged weight (alarm.threshold_follows_level)"
             if settings.threshold_follows_level else "")
    # The first prediction, then what guards it: the last hour's trend holds the steady line from both
    # sides (RhythmReference.compare).
    line = (f"the last {settings.steady_windows} windows' line (alarm.steady_windows), held within a tenth of a "
            "threshold of the last hour's trend (a bend the line lags or overshoots), or" if settings.steady_windows
            else "the last hour's trend, or")
    first = (f"; before a day of history it follows {line} its level, where that is lower by a whole "
             f"threshold (an hour that stopped falling), and a page then holds for {settings.trend_hold} "
             "windows, until the trend has gone through the change (alarm.trend_hold_windows)")
    steady = (f"; from the second day, at hours where the released profile is straight, the last {settings.steady_windows} "
              "windows' line comes first, held within a tenth of a threshold of that (alarm.steady_windows)"
              if settings.steady_windows else "")
    return RHYTHM_NOTE + steady + level + first + (f"; weekend days (UTC weekdays {days}; 0 = Monday) only with days of their own kind, "
                          "and a day with none of its kind in the last two (a Saturday, a Monday) following the last hour's trend "
                          "(alarm.weekend_days)" if days else "")


def levels_advice(settings, events_per_window: float, levels: "tuple[float, float | None] | None" = None) -> str | None:
    """A sentence advising sparser levels when the traffic puts far more normal events above the
    upper level (``levels``, the pair in use; the configured one by default) than the count that
    sees the most surges, and the ladder (``alarm.levels_follow_fleet``) cannot reach them (public:
    the config and a released events count); None when the levels in use suit it.

    >>> from monitor.config import AlarmSettings
    >>> levels_advice(AlarmSettings(), 10_000, (0.002, 0.02)) is None
    True
    >>> levels_advice(AlarmSettings(levels_follow_fleet=False), 10_000)[:64]
    'at this traffic sparser levels page more surges: alarm.contamina'
    """
    from monitor.alarm.calibrate import BEST_NORMAL_ABOVE_UPPER

    above = (settings.contamination if levels is None else levels[0]) * events_per_window
    if above < 3 * BEST_NORMAL_ABOVE_UPPER:
        return None
    upper = float(f"{BEST_NORMAL_ABOVE_UPPER / events_per_window:.1g}")
    graded = ("" if not settings.contamination_graded else
              f" and alarm.contamination_graded {upper * settings.contamination_graded / settings.contamination:g}")
    return (f"at this traffic sparser levels page more surges: alarm.contamination {upper:g}{graded} "
            f"(about {BEST_NORMAL_ABOVE_UPPER} normal events a window above the upper level instead of {above:,.0f}; "
            "docs/alarm.md)")


def levels_note(settings, levels: "tuple[float, float | None] | None") -> str:
    """Which levels the alarm weighs at, when the fleet moved them from the configured pair alone
    (``calibrate.rung_levels``: each event weighs at the rung's own pair)."""
    if levels is None or tuple(levels) == (settings.contamination, settings.contamination_graded):
        return ""
    pair = (f"{_share(levels[0])}" if levels[1] is None else f"{_share(levels[1])} / {_share(levels[0])}")
    return (f"; at this fleet's size the alarm weighs each event at the levels {pair} of normal events exceed "
            "instead of the configured ones (alarm.levels_follow_fleet)")


def visibility_report(config, record: dict | None = None, model=None, anomalies=None) -> dict:
    """What the alarm can see: a JSON-ready dict with a one-sentence ``summary``.

    ``record`` is the ledger's last released alert record (its ``baseline_in_use``, when
    there is one, gives the current traffic, rate and rate error: ``alarm_visibility``);
    before any baseline the model's calibration is used at ``VISIBILITY_TRAFFIC``
    (``visibility_for``, with the warm-up estimate's error). ``model`` defaults to the file
    ``config.model.path``; a missing or unreadable file is said in the summary, not raised.
    Public: the config, the model file and released values only.

    ``anomalies``: (rows, labels or None, name) of a file of the user's own anomalies
    (``monitor budget --anomalies FILE``): the smallest surge is then one of such events, at the
    weight the alarm gives them (``monitor.alarm.anomalies``), instead of the synthetic probe's
    guess. Operator-side: exact figures about the operator's own file.
    """
    from monitor.alarm.calibrate import (alarm_visibility, baseline_problem, fleet_rung, level_ladder, normal_weight_moments,
                                         rung_levels, visibility_for)
    from monitor.errors import MonitorError

    a = config.alarm
    rule = (f"alarm.threshold {a.threshold:g}: an absolute count, with alarm.z and alarm.rate_margin" if a.threshold is not None
            else f"alarm.false_pages_per_30_days {a.false_pages_per_30_days:g}")
    out: dict = {"model": str(config.model.path), "rule": rule, "source": None, "baseline_problem": None, "at": []}
    details: list[str] = []
    if not a.enabled:
        out["summary"] = "the alarm is off (alarm.enabled: false): nothing pages"
        return _with_details(out, details)
    if model is None:
        from pathlib import Path

        path = Path(config.model.path)
        if not path.exists():
            out["summary"] = (f"unknown: the model file {path} (model.path) is missing; "
                              "run `monitor fit` first")
            return _with_details(out, details)
        try:
            from monitor.model.file import load_configured

            model = load_configured(config)
        except MonitorError as err:
            out["summary"] = f"unknown: {err}"
            return _with_details(out, details)
    baseline = (record or {}).get("baseline_in_use")
    # The levels the baseline in use was released at (they follow the fleet); the configured ones before.
    levels = tuple(baseline["levels"]) if baseline and baseline.get("levels") else None
    sight = _rung_sight(model, a, levels, anomalies)
    out["sight"] = None if sight is None else sight.as_dict()
    out["blind"] = bool(sight is not None and sight.blind)
    if baseline:
        problem = baseline_problem(float(baseline["rate"]), float(baseline["events_per_window"]))
        out["baseline_problem"] = problem
    if baseline and not out["baseline_problem"]:
        # The traffic's own kappa, if released; else the model's at the baseline's levels.
        kappa = baseline.get("kappa") or normal_weight_moments(model, rung_levels(model, a, levels), a.contamination)[1]
        v = alarm_visibility(a, config.window.size_seconds, float(baseline["rate"]), float(baseline["events_per_window"]),
                             float(baseline.get("rate_error", 0.0)), kappa)
        v = _seen(v, sight)
        out["source"] = "baseline"
        out["at"] = [_visibility_dict(v)]
        hours, headline = "", v.smallest_surge_share
        if a.follow_rhythm and a.threshold is None:
            profile = baseline.get("profile")
            loads = (min(profile), max(profile)) if profile else (1.0 - a.traffic_swing, 1.0 + a.traffic_swing)
            at = [_seen(alarm_visibility(a, config.window.size_seconds, float(baseline["rate"]),
                                         float(baseline["events_per_window"]), float(baseline.get("rate_error", 0.0)),
                                         kappa, load), sight)
                  for load in loads]
            out["hours"] = {"quietest": _visibility_dict(at[0]), "busiest": _visibility_dict(at[1])}
            # The share that pages at any hour leads: replayed, the day's-mean share paged 0.39 to 0.74 of
            # surges in their first window (docs/benchmarks/alarm-real.md, "Sizing from a file of anomalies").
            headline = max(headline, *(x.smallest_surge_share for x in at))
            hours = (f" at any hour ({_share(v.smallest_surge_share)} at the day's mean traffic, "
                     f"{_share(at[1].smallest_surge_share)} at the busiest hour)")
            details.append(rhythm_note(a))
            if not profile:
                details.append(f"the day's profile comes with the first daily baseline; until then alarm.traffic_swing "
                               f"{a.traffic_swing:g} sets the quietest and busiest hours")
        out["smallest_surge_share"] = headline
        out["summary"] = _sight_note(sight) + (
            f"a surge of {_share(headline)} of the people online{_file_note(sight)} pages within one window 95 % of the "
            f"time{hours}, at the current traffic ({v.events_per_window:,.0f} events per window, from the baseline in use); its "
            f"threshold ({v.threshold:.4g} excess events) implies {v.false_pages_per_30_days:.2g} false pages per 30 days "
            f"({rule}{_windows_note(config)})")
        if _flagged(sight) and not _file_note(sight):
            details.append(_flagged(sight).strip(", "))
        if levels_note(a, levels):
            details.append(levels_note(a, levels).lstrip("; "))
        out["levels_advice"] = levels_advice(a, v.events_per_window, levels)
        if out["levels_advice"]:
            out["summary"] += "; " + out["levels_advice"]
        return _with_details(out, details)
    ladder = level_ladder(a)
    sights = {None if levels == ladder[0] else levels: sight}  # one probe per rung the traffic figures reach
    vs = []
    for n in VISIBILITY_TRAFFIC:
        shares = ladder[fleet_rung(ladder, n)]
        shares = None if shares == ladder[0] else shares
        if shares not in sights:
            sights[shares] = _rung_sight(model, a, shares, anomalies)
        vs.append(_seen(visibility_for(config, model, n), sights[shares]))
    out["source"] = "traffic"
    out["at"] = [_visibility_dict(v) for v in vs]
    head = (f"the baseline in use cannot be used ({out['baseline_problem']}); until one can, "
            if out["baseline_problem"] else "before the first baseline, ")
    out["summary"] = (_sight_note(sight) + head + "a surge of " + " / ".join(_share(v.smallest_surge_share) for v in vs)
                      + f" of the people online{_file_note(sight)} pages within one window 95 % of the time at "
                      + " / ".join(f"{v.events_per_window:,.0f}" for v in vs) + " events per window; the thresholds imply "
                      + " / ".join(f"{v.false_pages_per_30_days:.2g}" for v in vs)
                      + f" false pages per 30 days ({rule}{_windows_note(config)})")
    if _flagged(sight) and not _file_note(sight):
        details.append(_flagged(sight).strip(", "))
    if a.follow_rhythm and a.threshold is None:
        details.append(rhythm_note(a))
    return _with_details(out, details)


MEASURED_DAYS = 30  # the promise's own span: the pages of the last 30 days
ANSWERED = ("quiet", "fired", "held")  # the states of a window the alarm answered
# Pages beyond the promise: fewer than 1 % of spans would draw as many false pages at the promised rate (Poisson).
BEYOND_PROMISE_P = 0.01


def pages_measured(windows: "list[tuple[float, str | None]]", at: float, window_seconds: float,
                   promise: float) -> dict:
    """The alarm's pages as it published them, over the last MEASURED_DAYS days before ``at``, against its
    promise of ``promise`` (``alarm.false_pages_per_30_days``). ``windows``: (window_end, alarm state) of
    the released windows. Public: the states are published; a page counts whether a real surge or not,
    so the figure bounds the false pages from above. ``beyond_promise``: fewer than 1 % of spans as long
    would draw as many pages if they were all false pages at the promised rate (docs/alarm.md, "When the
    promise does not hold").

    >>> day = [(300.0 * (i + 1), "quiet") for i in range(288 * 10)]
    >>> day[100] = (day[100][0], "fired")
    >>> m = pages_measured(day, 864000.0, 300, 1.0)
    >>> m["pages"], m["answered_days"], m["per_30_days"], m["beyond_promise"]
    (1, 10.0, 3.0, False)
    >>> pages_measured(day[:100], 30000.0, 300, 1.0)["per_30_days"] is None   # less than a day answered
    True
    """
    from scipy.stats import poisson

    since = at - MEASURED_DAYS * 86400.0
    states = [state for end, state in windows if since < end <= at]
    pages = states.count("fired")
    days = sum(state in ANSWERED for state in states) * window_seconds / 86400.0
    per_30 = pages * MEASURED_DAYS / days if days >= 1.0 else None
    beyond = bool(per_30 is not None and pages
                  and poisson.sf(pages - 1, promise * days / MEASURED_DAYS) < BEYOND_PROMISE_P)
    out = {"days": MEASURED_DAYS, "pages": pages, "answered_days": round(days, 2),
           "per_30_days": None if per_30 is None else round(per_30, 2), "promise": promise, "beyond_promise": beyond}
    if per_30 is None:
        out["summary"] = f"{pages}, in less than a day answered: too little to set against the promise"
    else:
        out["summary"] = (f"{pages} in {days:.3g} days answered ({per_30:.2g} per 30 days; real surges and false pages "
                          f"alike), against a promise of {promise:g} false page(s) per 30 days")
    out["warning"] = (f"the alarm paged {pages} times in {days:.3g} days: more than false pages at the promised "
                      f"{promise:g} per 30 days would draw in 99 % of such spans. Where they were not real surges, this "
                      "traffic changes in ways the alarm does not foresee (docs/alarm.md, \"When the promise does not "
                      "hold\")") if beyond else None
    return out


def _windows_note(config) -> str:
    """Why short windows need larger surges: the false-page promise counts windows (public)."""
    windows = 30 * 86400 / config.window.size_seconds
    return f"; the promise counts windows: {windows:,.0f} of {duration(config.window.size_seconds)} in 30 days"


def _with_details(out: dict, details: list) -> dict:
    """The visibility with its ``details`` (how the alarm compares, the levels), and ``verbose``: the
    summary followed by them (``monitor budget --verbose``)."""
    out["details"] = details
    out["verbose"] = "; ".join([out["summary"], *details])
    return out


def _sight(model, levels):
    """The model's probe at a rung's score levels (``monitor.model.sight``), None for an object
    that is not a fitted GridKNN."""
    from monitor.model.sight import model_sight_at

    try:
        return model_sight_at(model, levels)
    except (AttributeError, TypeError):
        return None


def _rung_sight(model, settings, shares, anomalies=None):
    """The model's probe at one rung of the alarm's levels (``shares``: the rung's sparsest pair,
    None for the configured one); the traffic figures move them. With ``anomalies`` (rows, labels,
    name), what the alarm makes of those rows at that rung instead (``_FileSight``)."""
    from monitor.alarm.calibrate import rung_levels

    if anomalies is not None:
        from monitor.alarm.anomalies import anomaly_sight

        rows, labels, name = anomalies
        return _FileSight(anomaly_sight(model, settings, rows, labels, shares), name)
    return _sight(model, rung_levels(model, settings, shares))


@dataclasses.dataclass(frozen=True)
class _FileSight:
    """A file of the user's anomalies in the place of the synthetic probe: ``sight`` is what one of
    them adds over a normal event (``AnomalySight.excess``); ``blind`` where that is nothing."""

    measured: object
    name: str

    @property
    def sight(self) -> float:
        return self.measured.excess

    @property
    def blind(self) -> bool:
        return self.measured.excess <= 0.0

    @property
    def has_room(self) -> bool:
        """A file's anomalies are always weighed (``Sight.has_room`` is the probe's own)."""
        return True

    def as_dict(self) -> dict:
        return {"file": self.name, **self.measured.as_dict()}


def _seen(v, sight):
    """A visibility for surge events as the model weighs them: an event pushed outside the
    reference bulk brings ``sight`` of excess, not the 1 - rate of an event weighing fully."""
    if sight is None or not sight.has_room:  # the probe had nowhere to push an event: it weighed nothing
        return v
    excess = max(1.0 - v.rate, 1e-9)
    share = 1.0 if sight.sight <= 0 else min(1.0, v.smallest_surge_share * excess / min(sight.sight, excess))
    return dataclasses.replace(v, smallest_surge_share=share)


def _file_note(sight) -> str:
    """What a file of the user's anomalies weighs, for the summary itself (empty for the probe)."""
    return _flagged(sight).rstrip(",") if isinstance(sight, _FileSight) else ""


def _flagged(sight) -> str:
    if isinstance(sight, _FileSight):
        m = sight.measured
        labelled = "" if m.auroc is None else f", AUROC {m.auroc:.3f} against the file's normal rows"
        return (f", made of events like the {m.rows} anomalies of {sight.name} ({100 * m.full_share:.0f} % of them weigh "
                f"fully at the alarm's levels, {m.mean_weight:.2f} on average against {m.normal_weight:.3f} for normal "
                f"events{labelled}),")
    if sight is None:
        return ""
    if not sight.has_room:
        return (", of events that weigh fully (the synthetic probe cannot weigh this model: its reference data fills every "
                "feature's public range, so no event lies outside it; `--anomalies FILE` weighs your own),")
    return f", at the weight the model gives events far outside its reference data ({sight.sight:.2f} each),"


def _sight_note(sight) -> str:
    """The warning that leads the sentence when the model flags almost nothing."""
    if sight is None or not sight.blind:
        return ""
    if isinstance(sight, _FileSight):
        return (f"YOUR ANOMALIES ARE INVISIBLE TO THE ALARM: the {sight.measured.rows} anomalies of {sight.name} weigh "
                f"{sight.measured.mean_weight:.3f} on average at its levels, no more than normal events, so no surge of "
                "them pages; raise alarm.contamination (a lower upper level) or refit with more reference rows; ")
    enough = sight.advice()
    return ("A SYNTHETIC PROBE FINDS THE MODEL NEARLY BLIND: events pushed outside the range of its reference data "
            f"weigh only {sight.sight:.2f} more than normal ones at the alarm's levels ({100 * sight.flagged_share:.0f} % "
            "weigh fully), so a surge of such events will hardly page"
            + (f" (refit on {enough}" if enough else " (refit with more reference rows or a larger model.epsilon")
            + "); real anomalies may be flagged more or less: `monitor score --input FILE` on known anomalies of yours "
            "says which; ")


def _visibility_dict(v) -> dict:
    return {"events_per_window": v.events_per_window, "smallest_surge_share": v.smallest_surge_share,
            "false_pages_per_30_days": v.false_pages_per_30_days, "threshold": v.threshold, "rate": v.rate}
