"""What each window publishes: the alarm answer, and sometimes a detailed report (docs/design.md#the-alarm).

Broker-free on purpose: the service (``monitor run``) and ``monitor replay`` both hand
their closed windows, in order, to one :class:`WindowReleaser`, and the tests call it
with no Kafka at all.

Every window's alert record holds:

- ``alarm``: the private surge answer (``monitor.alarm.SurgeAlarm``): each epoch-aligned
  AboveThreshold run pays for its threshold when it opens and for each page when it is
  given, never for a quiet window;
- ``baseline``: on the baseline's public schedule, the released normal flagged rate;
- ``report``: on a page (and on ``report.every_seconds``' public schedule), a detailed
  report of the window (:func:`release_report`), each part with its own share;
- the charges made with this window, and the budget after them.

Whether a charge is made depends on public things (the calendar, the config, the ledger)
and on the alarm's published answer, never on the data directly.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from monitor.alarm import RESOLUTION, AlarmAnswer, BaselineEstimate, BaselineTracker, Comparison, SurgeAlarm
from monitor.alarm.reference import WEEK_DAYS, reference_for, today_alike
from monitor.alarm.baseline import profile_level, profile_load, profile_spread, profile_straight
from monitor.alarm.calibrate import (baseline_misfit, baseline_problem, is_graded, level_ladder, normal_weight_moments,
                                     rung_levels, rung_units)
from monitor.alarm.slack import SLACK_STEP
from monitor.alarm.units import rhythm_interval
from monitor.budget.run_state import forget_run, load_run, run_state_path, save_run
from monitor.config import MonitorConfig
from monitor.dp import noise_source
from monitor.features import scale_to_unit
from monitor.report import (ReportHistory, candidate_parts, grid_unusual, normal_part_shares, part_of, release_report,
                            released_parts_scale)
from monitor.pipeline.windows import ClosedWindow

log = logging.getLogger("monitor.stream")

__all__ = ["release_report", "WindowReleaser", "ReleasedWindow"]

# How far, relatively, the model's own guess of a part's normal may be off: without bound.
# On the vitals simulator it gave activity a seventh of normal flags where live traffic put
# more than half, so until the baseline releases the parts a feature is named only when it
# holds more than the whole normal weight (docs/report.md).
MODEL_PARTS_ERROR = math.inf


@dataclass(frozen=True)
class ReleasedWindow:
    """What ``WindowReleaser.release`` stored: the ledger entry, and whether it was new."""

    entry: Any
    replayed: bool


class WindowReleaser:
    """Decide, draw and record each window's alert record, in window order.

    One instance per process, fed every scheduled window once, oldest first. It keeps the
    alarm's and the baseline's state between windows; after a restart it resumes from
    the ledger (the last published baseline) and goes on with a quiet run still open, whose
    threshold noise it kept beside the ledger (``monitor.budget.run_state``); a run that paged,
    or whose state the ledger does not confirm, is closed and a new run is charged.

    Parameters
    ----------
    config:
        The validated configuration.
    accountant:
        The stream's ``BudgetAccountant`` (its ledger records everything).
    model:
        The fitted ``GridKNN``: its flags feed the alarm and the reports.
    rng:
        None in production (OpenDP noise); a seed for tests.
    audit:
        TESTS AND BENCHMARKS ONLY: called with each window and its TRUE statistics
        (events, alarm-flagged events): inside the trust boundary, never published.
    """

    def __init__(self, config: MonitorConfig, accountant, model, rng=None, audit=None) -> None:
        self.config = config
        self._audit = audit
        self.accountant = accountant
        self.ledger = accountant.ledger
        self.model = model
        self._noise = noise_source(rng)
        a = config.alarm
        # The alarm's calibrated levels (docs/design.md#graded-weights) at each rung they may move
        # to as the fleet's size shows (``rung_levels``); kappa = E[w^2] / E[w] of normal events.
        self.level_shares = level_ladder(a)
        self.rungs = [rung_levels(model, a, shares) for shares in self.level_shares]
        self.rung = 0  # the rung the alarm and the reference weigh at (``_use_rung``)
        self.level_lo, self.level_hi = self.rungs[0][0]  # the configured pair's
        # The rhythm reference: each window against the same people's recent and day-ago windows.
        self.reference = reference_for(a, config.window.size_seconds)
        # The daily baselines' released rates, (levels, day, rate), for ``reference.days_alike`` (``_note_day_rate``).
        self._day_rates: list[tuple] = []
        self._last_full = False
        self.alarm = SurgeAlarm(a.epsilon_threshold, a.epsilon_page, a.threshold, a.z or 0.0, a.hold_windows,
                                a.rate_margin or 0.0, rng=self._noise, false_pages_per_30_days=a.false_pages_per_30_days,
                                window_seconds=config.window.size_seconds,
                                kappa=normal_weight_moments(model, self.levels, a.contamination)[1],
                                traffic_swing=a.traffic_swing,
                                trend_hold_windows=(a.trend_hold if a.follow_rhythm and a.threshold is None else None),
                                slack_units=None if self.reference is None else self.reference.slack_units)
        # Public post-processing of the model: each grid's own threshold at the alarm's rate
        # (which grid's flags rose is what a report points at).
        # The report's parts: the model's grids, or the features of its joint grids (``report_parts``).
        part_features = model.report_parts() if hasattr(model, "report_parts") else [
            tuple(int(f) for f in g.features) for g in getattr(model, "grids_", ())]
        self.n_grids = len(part_features)
        self.grid_names = model.part_names(config.feature_names) if self.n_grids > 1 else []
        self.grid_thresholds = model.part_thresholds(a.contamination) if self.n_grids > 1 else None
        self.grid_features = part_features if self.n_grids > 1 else None
        # The report's parts; the baseline also learns how normal traffic's weight spreads over them.
        self.parts = candidate_parts(self.grid_features, self.n_grids) if self.n_grids > 1 else []
        eps_parts = config.normal_parts_epsilon(self.n_grids) or None
        self.baseline = BaselineTracker(a.epsilon_baseline_flagged, a.epsilon_baseline_events, config.window.size_seconds,
                                        a.baseline_warmup_seconds, a.baseline_refresh_seconds,
                                        flag_cap=a.baseline_flag_cap if config.stream.entity_field else None,
                                        epsilon_warmup=a.epsilon_baseline_warmup, epsilon_parts=eps_parts,
                                        n_parts=len(self.parts) if eps_parts else 0,
                                        release_kappa=is_graded(self.level_lo, self.level_hi),
                                        profile_bins=a.profile_bins if self.reference is not None else 0,
                                        levels=self.level_shares if len(self.level_shares) > 1 else None, rng=self._noise)
        self.report_cost = config.report.cost(len(config.features), self.n_grids)
        # Scheduled reports already published say what normal traffic puts in each part, this hour.
        self.report_history = (ReportHistory([self.grid_names[c] for c in self.parts], config.report.epsilon_grids)
                               if self.parts and config.report.every_seconds else None)
        # The open run's charged span: [its first window - its reach, its end) (``_run_start``).
        self._run_span = (-math.inf, -math.inf)
        # The open run's charge in the ledger; the alarm publishes the run's number instead
        # (1, 2, ... on a fresh ledger: charge ids count baselines too).
        self._run_charge_id: int | None = None
        # Where the open run's state is kept for a restart (secret: its threshold noise).
        self._run_file = run_state_path(self.ledger.path)
        self._resume()

    # -- start-up ---------------------------------------------------------------------
    def _resume(self) -> None:
        last = self.ledger.last_released()
        if last is None:
            forget_run(self._run_file)
            return
        kept = self._resumable_run(last.window_end)
        for kind in ("alarm_run", "alarm_page"):
            for charge_id, *_ in self.ledger.span_charges(kind, after=last.window_end):
                if kept is None or charge_id != kept["charge_id"]:
                    self.ledger.end_charge(charge_id, last.window_end)
        if self.report_history is not None:  # the scheduled reports published within its span
            for entry in self.ledger.entries(since=last.window_end - self.report_history.span_seconds):
                report = json.loads(entry.payload).get("report") if entry.payload else None
                if report and report.get("reason") == "schedule" and report.get("where"):
                    self.report_history.add(entry.window_end, report)
        self._resume_baseline(last.window_end)
        if kept is not None and not self._go_on_with(kept):
            self.ledger.end_charge(kept["charge_id"], last.window_end)
            forget_run(self._run_file)

    def _go_on_with(self, kept: dict) -> bool:
        """Take the saved run as the open one; False where it cannot go on: no baseline was resumed (a
        new warm-up, which no run answers), the levels moved since (its weights are on the old scale),
        or its state is not one this process could have saved."""
        if self.baseline.estimate is None or kept.get("rung") != self.rung:
            return False
        try:
            reach, first = (None, None) if kept["reference"] is None else (int(kept["reference"][0]), int(kept["reference"][1]))
            self.alarm.resume_run(kept)
        except (KeyError, TypeError, ValueError, IndexError) as err:
            self.alarm.close_run()
            log.warning("the open alarm run's state %s does not describe a run (%s): a new run opens", self._run_file, err)
            return False
        self._run_span, self._run_charge_id = (kept["span"][0], kept["span"][1]), kept["charge_id"]
        if self.reference is not None:
            self.reference.run_reach_windows, self.reference.run_first_index = reach, first
        return True

    def _resumable_run(self, last_end: float) -> "dict | None":
        """The saved state of the run still open at ``last_end``, where the ledger confirms it can go
        on (public checks; else None, and the file is removed): its charge is the one open run, no page
        was charged over its span (a run that paged ends at its boundary, its pages charged up to it),
        and the alarm's epsilons and kind of statistic are the config's."""
        state = load_run(self._run_file)
        runs = self.ledger.span_charges("alarm_run", after=last_end)
        pages = self.ledger.span_charges("alarm_page", after=last_end)
        a = self.config.alarm
        try:
            ok = (state is not None and len(runs) == 1 and not pages and runs[0][0] == state["charge_id"]
                  and runs[0][2] == state["span"][0] and state["epsilons"] == [a.epsilon_threshold, a.epsilon_page]
                  and (state["reference"] is None) == (self.reference is None))
        except (KeyError, TypeError, IndexError):
            ok = False
        if not ok:
            forget_run(self._run_file)
            return None
        return {**state, "span": (runs[0][2], runs[0][3])}

    def _keep_run(self) -> None:
        """Save the run this window opened, after its commit (``monitor.budget.run_state``). Where the
        file cannot be written the run still answers; a restart then opens a new one."""
        ref = self.reference
        try:
            save_run(self._run_file, {"charge_id": self._run_charge_id, "span": list(self._run_span), "rung": self.rung,
                                      "epsilons": [self.config.alarm.epsilon_threshold, self.config.alarm.epsilon_page],
                                      "reference": None if ref is None else [ref.run_reach_windows, ref.run_first_index],
                                      **self.alarm.run_state()})
        except OSError as err:
            forget_run(self._run_file)
            log.warning("the open alarm run's state cannot be kept in %s (%s): a restart will open a new run",
                        self._run_file, err)

    def _end_run(self) -> None:
        """Close the open run; its saved state goes with it."""
        self.alarm.close_run()
        forget_run(self._run_file)

    def _resume_baseline(self, last_end: float) -> None:
        """From the baselines the ledger's records say were in use (public): note again the daily rates
        of the last week, so a restart keeps the week's comparison (``_note_day_rate``), and resume the
        newest estimate of the last two refreshes, so a restart needs no new warm-up."""
        since = last_end - self.config.alarm.baseline_refresh_seconds * 2
        week = (last_end - (WEEK_DAYS + 1) * self.reference.period * self.reference.window_seconds
                if self.reference is not None and self.reference.period is not None else None)
        in_use = [(entry.window_end, base) for entry in self.ledger.entries(since=since if week is None else min(since, week))
                  if entry.payload and (base := json.loads(entry.payload).get("baseline_in_use"))]
        if week is not None:
            noted: set = set()
            for end, base in in_use:
                if end > week and base.get("span_end") not in noted:  # each release is in use for many windows
                    noted.add(base.get("span_end"))
                    self._note_day_rate(BaselineEstimate.from_dict(base))
        newest = next((base for end, base in reversed(in_use) if end > since), None)
        if newest is None:
            return
        est = BaselineEstimate.from_dict(newest)
        if len(self.level_shares) > 1 and est.levels is None:
            # Released before the levels followed the fleet: at the configured pair.
            est = dataclasses.replace(est, levels=self.level_shares[0])
        if len(self.level_shares) > 1 and est.levels not in self.level_shares:
            return  # weights at levels the config no longer has: a new warm-up
        self.baseline.resume(est)
        self._use_rung(self.baseline.rung)

    def rebuild(self, windows: "Iterable[ClosedWindow]", since: "float | None" = None) -> int:
        """Learn the rhythm reference's history from windows already released before a restart (their
        events, re-read from what the trust boundary still holds: the input topic's last days),
        oldest first, without releasing or charging anything. Returns how many were learnt.

        Only windows the ledger holds as released are learnt, each marked as its published answer
        says (paged or held), so the reference is the one the process had before it stopped, up to
        the events re-read. Privacy: nothing is published here; the runs opened after the restart
        read this history within their reach, which their charge covers
        ([docs/budget.md](../docs/budget.md#what-a-run-reads)). Windows outside the reach are
        forgotten at once. ``since`` (public: the span the ledger says was released) is where the
        history may begin, whichever windows the topic still held; None: the first window learnt."""
        if self.reference is None:
            return 0
        if since is not None:
            self.reference.history_start(self.reference.window_index(since))
        learnt = 0
        for window in windows:
            entry = self.ledger.get(window.start)
            if entry is None or entry.payload is None:
                continue
            record = json.loads(entry.payload)
            scores = self.model.score_samples(window.X) if window.n_events else np.zeros(0)
            units = rung_units(scores, self.levels, RESOLUTION)
            self.reference.learn_one(self.reference.window_index(window.start), units, window.entities,
                                     paged=bool(record.get("alarm")), scores=scores)
            learnt += 1
        return learnt

    @property
    def levels(self) -> "tuple[tuple[float, float], ...]":
        """The (t_lo, t_hi) score levels of the rung in use (``calibrate.rung_levels``)."""
        return self.rungs[self.rung]

    def _use_rung(self, rung: int, window: "ClosedWindow | None" = None) -> None:
        """Weigh at the ladder's ``rung`` from now on (public: the baseline in use chose it from
        its released count). The open run ends where it stopped answering (a new one opens on the
        new scale) and the rhythm reference re-weighs its history at the new levels."""
        if rung == self.rung:
            return
        self.rung = rung
        self.alarm.kappa = normal_weight_moments(self.model, self.levels, self.config.alarm.contamination)[1]
        if self.alarm.run is not None and window is not None:
            self.ledger.end_charge(self._run_charge_id, window.start)
            self._end_run()
        if self.reference is not None:
            self.reference.relevel(lambda scores: rung_units(scores, self.levels, RESOLUTION))

    # -- one window ---------------------------------------------------------------------
    def release(self, window: ClosedWindow, released_at: float) -> ReleasedWindow:
        """Release (or find in the ledger) the alert record of ``window``.

        Everything is one ledger transaction: the window's row, the charges it makes and
        the alert record commit together, or not at all (a crash before the commit leaves
        nothing, and the window is released afresh after the restart).
        """
        # The alarm's and the baseline's state change while the record is drawn; if the
        # transaction fails (a full disk, a locked ledger) the ledger rolls back, and so
        # must they, or a retry would publish answers whose charges were rolled back (a
        # "held" with no page paid, a run whose charge is gone).
        state = self._snapshot()
        try:
            with self.ledger.transaction():
                existing = self.ledger.get(window.start)
                if existing is not None:
                    return ReleasedWindow(existing, replayed=True)
                record, cost = self._record(window, released_at)
                entry = self.ledger.record_release(window.start, window.end, *cost, json.dumps(record),
                                                   recorded_at=released_at)
        except BaseException:
            self._restore(state)
            raise
        kinds = {c["kind"] for c in record["charges"] if not c.get("carried_on")}
        if "alarm_page" in kinds:
            forget_run(self._run_file)  # a run that paged ends at its boundary: no restart goes on with it
        elif "alarm_run" in kinds:
            self._keep_run()
        return ReleasedWindow(entry, replayed=False)

    def _snapshot(self) -> dict:
        # Deep copies, except the noise source: a retry draws fresh noise (nothing drawn
        # before the failure was published).
        memo = {id(self._noise): self._noise}
        # (and the alarm's thresholds already derived: a cache of a pure function of public numbers)
        memo[id(self.alarm._derived)] = self.alarm._derived
        return copy.deepcopy({"alarm": self.alarm.__dict__, "baseline": self.baseline.__dict__,
                              "run_span": self._run_span, "run_charge_id": self._run_charge_id, "rung": self.rung,
                              "reference": self.reference, "report_history": self.report_history,
                              "day_rates": (self._day_rates, self._last_full)}, memo)

    def _restore(self, state: dict) -> None:
        for obj, saved in ((self.alarm, state["alarm"]), (self.baseline, state["baseline"])):
            obj.__dict__.clear()
            obj.__dict__.update(saved)
        self.rung = state["rung"]
        self._run_span = state["run_span"]
        self._run_charge_id = state["run_charge_id"]
        self.reference = state["reference"]
        self.report_history = state["report_history"]
        self._day_rates, self._last_full = state["day_rates"]

    def _fits(self, window: ClosedWindow, cost: tuple[float, float], reserve: Sequence[tuple[float, float]] = (),
              kind: str = "window") -> bool:
        # The window's own row is written last; span charges made so far are already in
        # the ledger (same transaction), so decide() sees them.
        costs = [cost, *reserve]
        total = (math.fsum(c[0] for c in costs), math.fsum(c[1] for c in costs))
        return self.accountant.decide(window.start, window.end, total, kind).released

    def _record(self, window: ClosedWindow, released_at: float) -> tuple[dict, tuple[float, float]]:
        cfg = self.config
        X = window.X
        n = window.n_events
        scores = self.model.score_samples(X) if n else np.zeros(0)
        # Each event's weight at every rung of the levels; the baseline keeps every rung's totals.
        every = np.stack([rung_units(scores, levels, RESOLUTION) for levels in self.rungs])
        charges: list[dict] = []
        index = None if self.reference is None else self.reference.window_index(window.start)

        # How unusual each weighted event is by each grid: the baseline's parts and a report's
        # 'where' both read it (computed once, for the few events weighted at the densest rung).
        unusual = self._weighted_unusual(X, every[0]) if self.baseline.n_parts else None

        # Baseline: accumulate, and release on its public schedule.
        self.baseline.learn_one(window.start, window.end, every / RESOLUTION, window.entities if self.baseline.flag_cap else (),
                                parts=part_of(unusual, self.parts) if unusual is not None else None)
        released_baseline = None
        if self.baseline.due(window.end):
            span_start, _ = self.baseline.span_bounds()
            cost = (self.baseline.epsilon, 0.0)
            # The estimate covers its whole span: every period the span touches must pay.
            if self._fits(window, cost) and self.accountant.fits_span(span_start, window.end, cost, "baseline"):
                # What it costs follows its released count: a span with too little traffic releases
                # the count alone (``BaselineTracker.release``), at most the cost admitted.
                released_baseline = self.baseline.release(window.end)
                self._note_day_rate(released_baseline)
                paid = (released_baseline.epsilon, 0.0)
                self.ledger.add_charge("baseline", span_start, window.end, *paid)
                charges.append({"kind": "baseline", "epsilon": paid[0], "delta": 0.0, "span": [span_start, window.end]})
            else:  # not paid: the next span starts afresh, the old estimate stays in use
                self.baseline.skip()
        self._use_rung(self.baseline.rung, window)
        units = every[self.rung]
        alarm_units = int(units.sum())
        if self._audit is not None:  # the exact values, for tests and benchmarks only
            self._audit(window, {"events": n, "alarm_flagged": int(np.count_nonzero(scores > self.level_hi)),
                                 "alarm_weight": alarm_units / RESOLUTION})

        # Alarm: open (and charge) a run when one is needed, then answer if a page could be paid.
        answer: AlarmAnswer
        a = cfg.alarm
        if not a.enabled:
            answer = AlarmAnswer("off", None, 0.0, None, None)
        else:
            if self.alarm.run is not None and window.end > self._run_span[1]:
                self._carry_or_close_run(window, charges)
            if self.alarm.run is not None and not self.alarm.accepts(self.baseline.estimate):
                # The refreshed baseline left the run's tau band: the run answers no more
                # windows (its own charge ends here), and a new run opens around the new rate.
                self.ledger.end_charge(self._run_charge_id, window.start)
                self._end_run()
            # Whether the open run could pay a page: asked once a window (a ledger scan), again only
            # where another run opens below.
            run_before = self.alarm.run
            pays = run_before is not None and self._run_can_page(window)
            if (run_before is not None and not self.alarm.holding and not pays
                    and self._run_reach(window, self._with_page((a.epsilon_threshold, 0.0))) is not None):
                # The open run's charge reaches back into periods that pages have spent, and it could
                # never page again; a run opening now is charged from later on and can.
                self.ledger.end_charge(self._run_charge_id, window.start)
                self._end_run()
            # A degenerate baseline (rate 0, too little traffic) is announced in the answer and
            # not used: no run is opened on it (docs/alarm.md).
            est = self.baseline.estimate
            problem = None if est is None else baseline_problem(est.rate, est.events_per_window)
            if est is not None and problem is None and self.alarm.needs_run():
                cost = (a.epsilon_threshold, 0.0)
                span_start = self._run_start(window, cost)
                if span_start is not None:
                    self._run_span = (span_start, _run_end(window.end, a.run_seconds))
                    self._run_charge_id = self.ledger.add_charge("alarm_run", *self._run_span, *cost)
                    # The run's noise covers the reference's wider interval (its slack).
                    self.alarm.open_run(len(self.ledger.span_charges("alarm_run")), est, self._slack_for(index, est))
                    charges.append(self._run_charge("alarm_run", cost[0]))
            # The filter: ask only if a page could be paid over the whole run (a page's
            # noise shift covers every window the run answers, earlier ones included).
            can_page = self.alarm.run is not None and (pays if self.alarm.run == run_before else self._run_can_page(window))
            comparison = None
            load = profile_load(est, window.start)
            if self.reference is not None and est is not None and problem is None and self.alarm.run is not None:
                slope, margin = 0.0, 0
                # The line covers every level from 0 to 4 times the hour's: it lies lowest at the best estimate.
                level_load = (profile_level(est, window.start) if a.threshold_follows_level else None) or load
                steady_line, (mode, coefficients, relative_error, cubes, prediction) = self._outline(
                    index, est, window.start, level_load)
                if mode != "baseline":
                    load = level_load
                    if a.threshold_follows_level:
                        slope = self.alarm.level_line(est, coefficients, relative_error, load, cubes, prediction=prediction)[0]
                if mode == "recent" or steady_line:
                    # The first day's level overrules its trend only a whole threshold below it; the guards
                    # hold a steady line within a tenth of it.
                    bar = self.alarm.window_threshold(
                        est, Comparison(0, mode, coefficients, relative_error, slope, cubes, prediction), load)
                    margin = math.ceil(bar * RESOLUTION)
                comparison = self.reference.compare(index, units, window.entities, self.alarm.run_rate_units(est),
                                                    self.alarm.low_units, level_slope=slope, level_margin=margin,
                                                    steady_line=steady_line)
            answer = self.alarm.answer_units(alarm_units, n, self.baseline.estimate, can_page=can_page, problem=problem,
                                             comparison=comparison, load=load)
            if answer.state == "fired":
                self.ledger.add_charge("alarm_page", *self._run_span, a.epsilon_page, 0.0)
                charges.append(self._run_charge("alarm_page", a.epsilon_page))

        if self.reference is not None:
            # Every window, warm-up included. A window that paged or held is marked, so the
            # day-old sets fill or bridge it (a surge is not the next day's normal; a ramp stays a ramp).
            self.reference.learn_one(index, units, window.entities, paged=answer.alarm, scores=scores)

        # Detailed report: on a page, or on its public schedule, if the budget allows it
        # and still leaves room for the next alarm run and report.reserve_pages pages.
        reason = None
        if answer.state == "fired" and cfg.report.on_alarm:
            reason = "alarm"
        elif cfg.report.every_seconds and _on_schedule(window.start, window.end, cfg.report.every_seconds):
            reason = "schedule"
        report = None
        window_cost = (0.0, 0.0)
        if reason is not None:
            reserve = [(a.epsilon_threshold, 0.0)] + [(a.epsilon_page, 0.0)] * cfg.report.reserve_pages if a.enabled else []
            if self._fits(window, self.report_cost, reserve):
                # "Flagged" in a report means what the alarm counts, so a report's flagged
                # count and rate compare with the baseline's.
                report = {"reason": reason, **self._report(window, units, reason, unusual)}
                window_cost = self.report_cost
                charges.append({"kind": "report", "epsilon": window_cost[0], "delta": window_cost[1]})
                self._check_fit(report)
            else:
                report = {"reason": reason, "suppressed": "budget"}

        # The budget after this window: its span charges are in the ledger already, its own
        # row (the report's cost) is about to be.
        decision = self.accountant.decide(window.start, window.end, window_cost)
        record = {
            "window_start": window.start,
            "window_end": window.end,
            "released_at": released_at,
            "alarm": answer.alarm,
            "alarm_detail": answer.as_dict(),
            "baseline": None if released_baseline is None else released_baseline.as_dict(),
            "baseline_in_use": None if self.baseline.estimate is None else self.baseline.estimate.as_dict(),
            "baseline_refit": self.baseline.refit_reason,
            "report": report,
            "charges": charges,
            "epsilon": math.fsum(c["epsilon"] for c in charges),
            "delta": math.fsum(c["delta"] for c in charges),
            "budget": decision.budget_record(),
        }
        return record, window_cost

    def _check_fit(self, report: dict) -> None:
        """A report's released event count far from the baseline's traffic: re-estimate over
        the next warm-up span instead of keeping the estimate for a day (post-processing)."""
        est, count = self.baseline.estimate, report.get("event_count")
        if est is None or self.baseline.refit_reason is not None or not count:
            return
        reason = baseline_misfit(count["value"], count["accuracy"], est.events_per_window, self.config.alarm.traffic_swing)
        if reason is not None:
            self.baseline.refit(reason)

    def _note_day_rate(self, est: "BaselineEstimate | None") -> None:
        """Keep a released daily baseline's rate (public) and tell the reference whether the days it
        compares the next day with are a guide to it (``reference.today_alike``: the last days' rates
        at the same levels, and the same weekday's a week before), a warm-up's short span left out."""
        if self.reference is None or est is None or self.reference.period is None:
            return
        # A day's span whose clip was sized on a warm-up's rate (the first after it) is left out too:
        # its rate is clipped lower than the next days' (``BaselineTracker.span_cap``); so is a span with
        # too little traffic, whose release carries the rate before it (``baseline_problem``).
        full = (est.span_windows * 2 >= self.reference.period and est.rate > 0
                and baseline_problem(est.rate, est.events_per_window) is None)
        after_full, self._last_full = self._last_full, full
        if not (full and after_full):
            return
        day = self.reference.window_index(est.span_end) // self.reference.period - 1  # the day the span ended
        rates = [r for r in self._day_rates if r[0] == est.levels and day - WEEK_DAYS < r[1] < day]
        self._day_rates = rates + [(est.levels, day, float(est.rate))]
        self.reference.days_alike = today_alike({d: r for _, d, r in self._day_rates}, day + 1)

    def _outline(self, index: int, est: BaselineEstimate, window_start: float, load: "float | None"
                 ) -> tuple[bool, tuple]:
        """How window ``index`` is compared (``RhythmReference.outline``), and whether the steady line comes
        first in the rhythm mode (its ``steady_line``): where the released profile is straight over the
        line's span (``profile_straight``) and the line's threshold at the window's ``load`` is the lower.
        Public inputs only."""
        a = self.config.alarm
        plain = self.reference.outline(index)
        if (plain[0] != "rhythm" or not a.steady_windows
                or not profile_straight(est, window_start, a.steady_windows, self.config.window.size_seconds)):
            return False, plain
        steady = self.reference.outline(index, steady_line=True)
        if steady == plain:
            return False, plain
        if self._outline_threshold(est, steady, load) < self._outline_threshold(est, plain, load):
            return True, steady
        return False, plain

    def _outline_threshold(self, est: BaselineEstimate, outline: tuple, load: "float | None",
                           interval: "tuple[int, int] | None" = None) -> float:
        """The threshold of a window compared as ``outline`` (``RhythmReference.outline``) at the profile's
        ``load``, at the run's interval or ``interval``: where it follows the level, the level line's at the
        expected level (``SurgeAlarm.level_line``). Public."""
        mode, squares, relative_error, cubes, prediction = outline
        if self.config.alarm.threshold_follows_level:
            return self.alarm.level_line(est, squares, relative_error, load, cubes, interval, prediction)[2]
        return self.alarm.window_threshold(est, Comparison(0, mode, squares, relative_error, 0.0, cubes, prediction), load,
                                           interval)

    def _slack_for(self, index: "int | None", est: BaselineEstimate) -> "int | None":
        """The slack (1 / RESOLUTION) of a run that opens at window ``index`` on ``est``: None without the
        rhythm reference; with ``alarm.rhythm_slack_follows``, the one up to ``alarm.rhythm_slack`` whose
        thresholds at the quietest, middle and busiest parts of the released profile's day (``profile_spread``;
        without a profile, at the baseline's own rate), the clip's expected lift counted (``SurgeAlarm.level_line``),
        are lowest on average;
        ``alarm.rhythm_slack`` before the reference compares with the days before. Public inputs only: the
        guarantee is the run's interval's, whatever it is."""
        if self.reference is None:
            return None
        a = self.config.alarm
        most = self.reference.slack_units
        outline = self.reference.outline(index)
        if not a.rhythm_slack_follows or outline[0] != "rhythm":
            # The first day's trend puts 0.4 of its weight on the last window, and its lift is the
            # model's least sure: with persistent people a narrower first-day slack paged a switch
            # (docs/benchmarks/alarm-rhythm.md, "Trial history").
            return most
        # The run lasts the day, and the lift grows with the level: a slack chosen at midnight's level
        # alone was the narrowest there and doubled the threshold by day (a day/night switch:
        # docs/benchmarks/alarm-rhythm.md, "Trial history"). So the mean threshold at the
        # profile's quietest, middle and busiest parts decides; without a profile, the baseline's own rate.
        # The rhythm prediction's lift decides it: the steady line comes first only where the profile is straight.
        spread = profile_spread(est) if a.threshold_follows_level else ()
        loads = list(spread or profile_spread(est, level=False)) or [None]
        # Narrower slacks, from the configured one down, while the threshold falls: the noise's part
        # falls in proportion, the lift's rises faster and faster.
        step = round(SLACK_STEP * RESOLUTION)
        best = (math.inf, most)
        for slack in [most, *range((most - 1) // step * step, 0, -step)]:
            interval = rhythm_interval(est.rate, slack)
            threshold = sum(self._outline_threshold(est, outline, at, interval) for at in loads) / len(loads)
            if round(threshold, 6) >= best[0]:
                break
            best = (round(threshold, 6), slack)
        return best[1]

    def _carry_or_close_run(self, window: ClosedWindow, charges: list[dict]) -> None:
        """At its calendar boundary a run that has not paged goes on to the next one; one
        that has paged ends there.

        Every page of a run is charged over the run's whole span (its noise shift covers
        every window the run answers), so a run that pages must end soon, but a quiet run
        that goes on pays its threshold once in every rolling period it touches, where a
        new run at each boundary would put two thresholds in the periods that straddle it.
        Going on is paid like a new run (the periods the span now reaches get the
        threshold); where the budget cannot pay, the run ends. It also ends where it could no
        longer pay a page: its span reaches back into a day whose pages spent the budget, and
        going on would keep every later window suppressed, where a new run's span starts now.
        """
        a = self.config.alarm
        cost = (a.epsilon_threshold, 0.0)
        if self.alarm.has_paged or not self._run_can_page(window) or not self._fits(window, cost, kind="alarm_run"):
            self._end_run()  # its charges cover no later window
            return
        self._run_span = (self._run_span[0], _run_end(window.end, a.run_seconds))
        self.ledger.extend_charge(self._run_charge_id, self._run_span[1])
        charges.append({**self._run_charge("alarm_run", cost[0]), "carried_on": True})

    def _run_start(self, window: ClosedWindow, cost: tuple[float, float]) -> "float | None":
        """Where the charge of a run opening at ``window`` begins, or None if the budget cannot pay one.

        Each query of the run reads the rhythm reference's memory: a person's windows up to its
        reach before the query's own (``RhythmReference.reach_windows``). So the run is charged
        from its first window less that reach, in periods already past, which must still pay
        (docs/budget.md, "What a run reads"), but not before the oldest window the history holds
        (``held_windows``: a first start, a restart's two rebuilt days). Where they cannot (a day of
        pages spent them), the run reads less: two days only (nothing further back, which also needs
        room for ``report.reserve_pages`` more pages), the recent windows only, or its own windows
        (``reach_choices``), the longest over which the budget pays the threshold and a page (else
        the threshold alone). A public choice: the ledger and the calendar."""
        if not self._fits(window, cost, kind="alarm_run"):
            return None
        reach = self._run_reach(window, self._with_page(cost))
        reach = self._run_reach(window, cost) if reach is None else reach
        if reach is None:
            return None
        if self.reference is not None:
            self.reference.run_reach_windows = reach
            self.reference.run_first_index = self.reference.window_index(window.start)
            return window.start - reach * self.reference.window_seconds
        return window.start

    def _with_page(self, cost: tuple[float, float]) -> tuple[float, float]:
        return (cost[0] + self.config.alarm.epsilon_page, cost[1])

    def _run_reach(self, window: ClosedWindow, need: tuple[float, float]) -> "int | None":
        """The longest reach (in windows) over which a run opening at ``window`` could be charged
        ``need``, or None (the plain statistic's reach is 0: it reads its own window only)."""
        if self.reference is None:
            return 0 if self.accountant.fits_span(window.start, window.end, need, "alarm_run") else None
        # The week-old set only where the budget keeps room for report.reserve_pages pages after it: its
        # charge counts in a week of periods, which a day of many pages would otherwise fill for the runs
        # after it (docs/budget.md, "What a run reads").
        spare = self.config.report.reserve_pages * self.config.alarm.epsilon_page
        # No charge before what the history holds: a run reads nothing there (a first start, a restart).
        held = self.reference.held_windows(self.reference.window_index(window.start))
        for reach in dict.fromkeys(min(r, held) for r in self.reference.reach_choices()):
            cost = (need[0] + spare, need[1]) if self.reference.reads_far(reach) else need
            if self.accountant.fits_span(window.start - reach * self.reference.window_seconds, window.end, cost, "alarm_run"):
                return reach
        return None

    def _run_can_page(self, window: ClosedWindow) -> bool:
        """Could the budget pay a page over the open run's span up to this window?"""
        return self.accountant.fits_span(self._run_span[0], window.end, (self.config.alarm.epsilon_page, 0.0), "alarm_page")

    def _run_charge(self, kind: str, epsilon: float) -> dict:
        """The alert record's entry for a charge over the open run's span (pure DP)."""
        return {"kind": kind, "run": self.alarm.run, "epsilon": epsilon, "delta": 0.0, "span": list(self._run_span)}

    def _weighted_unusual(self, X: np.ndarray, units: np.ndarray) -> np.ndarray:
        """``grid_unusual`` of each weighted event, shape (events, grids); zero rows where the
        weight is 0 (never read; their part comes out 0). Only weighted events are scored by
        grid: a few percent."""
        out = np.zeros((len(units), self.n_grids))
        on = units > 0
        if on.any():
            out[on] = grid_unusual(self.model, X[on], self.grid_thresholds)
        return out

    def _normal_where(self) -> tuple[float, "Sequence[float] | None", float]:
        """What normal traffic weighs, how it spreads over the parts, and how far the parts'
        normals may be off, relatively (public): the baseline's released rate and parts;
        before a baseline has released parts, the model's own guess (its calibration and its
        sample: post-processing, computed once), which is not relied on to name a part
        (MODEL_PARTS_ERROR)."""
        est = self.baseline.estimate
        cfg = self.config
        share = est.rate if est is not None else normal_weight_moments(self.model, self.levels, cfg.alarm.contamination)[0]
        if not self.parts:
            return share, None, 0.0
        if est is not None and est.normal_parts is not None and len(est.normal_parts) == len(self.parts):
            return share, est.normal_parts, 0.0
        if getattr(self, "_model_parts", None) is None:
            self._model_parts = normal_part_shares(
                self.model, lambda s: rung_units(s, self.levels, RESOLUTION), self.grid_thresholds, self.parts)
        return share, self._model_parts, MODEL_PARTS_ERROR

    def _report(self, window: ClosedWindow, units: np.ndarray, reason: str | None = None,
                unusual: "np.ndarray | None" = None) -> dict:
        """The window's detailed report on the alarm's own graded weights (integer units):
        "flagged" means what the alarm counted, and compares with the baseline's rate."""
        cfg = self.config
        X = scale_to_unit(window.X, cfg.bounds) if window.n_events else np.zeros((0, len(cfg.features)))
        if self.parts and unusual is None:
            unusual = self._weighted_unusual(window.X, units)
        normal_share, normal_parts, normal_error = self._normal_where()
        # The baseline's own noise (its released shares' and its rate's) counts in which
        # parts stand out; a guessed normal counts its error whole instead (docs/report.md).
        est = self.baseline.estimate
        parts_scale = share_sd = 0.0
        if est is not None:
            share_sd = est.rate_error
            if normal_error == 0.0 and normal_parts is not None:
                parts_scale = released_parts_scale(est.flag_cap, self.baseline.epsilon_parts, est.rate,
                                                   est.events_per_window, est.span_windows)
        recent = self.report_history.normal(window.start) if self.report_history is not None else None
        if recent is not None:  # the last hours' scheduled reports: this hour's normal, less noise
            (normal_share, normal_parts, parts_scale), normal_error, share_sd = recent, 0.0, 0.0
        report = release_report(X, units, cfg.report, cfg.feature_names, rng=self._noise,
                                grid_unusual=unusual, grid_names=self.grid_names, grid_features=self.grid_features,
                                normal_share=normal_share, normal_parts=normal_parts, normal_error=normal_error,
                                reason=reason, resolution=RESOLUTION, normal_parts_scale=parts_scale,
                                normal_share_sd=share_sd)
        if reason == "schedule" and self.report_history is not None:
            self.report_history.add(window.end, report)
        return report


def _run_end(window_end: float, run_seconds: float) -> float:
    """End of the epoch-aligned run that holds a window ending at ``window_end`` (public)."""
    return math.ceil(window_end / run_seconds - 1e-12) * run_seconds


def _on_schedule(start: float, end: float, every: float) -> bool:
    """True for the window that holds a multiple of ``every`` (epoch-aligned, public)."""
    return math.floor((end - 1e-9) / every) > math.floor((start - 1e-9) / every)
