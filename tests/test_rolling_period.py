"""The rolling-period bound with the rhythm reference's memory (docs/budget.md, "What a run reads").

A run's queries read a person's windows from one and two days back. The review that found it
streamed three days through the real releaser with one person X present on the first
day only, and found the third day's run moved by X although its charge touched no period that
held X's events. Here the same: the statistics of every run with and without X, every released
value held equal (the second stream is replayed into a reference of its own with the first's
public choices), the exact loss of each run's first-page outcomes, and the periods its charges
count in."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from monitor.alarm.reference import reference_for
from monitor.budget import BudgetAccountant, WindowLedger
from monitor.config import parse_config
from monitor.data.traffic import Surge, Traffic
from monitor.data.vitals import VITAL_FEATURES
from monitor.pipeline.windows import ClosedWindow
from monitor.release import WindowReleaser
from svt_exact import log_tail

W = 900.0  # 15-minute windows: 96 a day
DAY = 96
X_WINDOWS = range(24, 80)  # X is online 06:00 to 20:00 on day 0 only: within one period
X_READING = [200.0, 75.0, 41.0, 38.0, 9.0]  # far from normal: weighed fully whenever present


def _config(tmp_path, epsilon: float):
    return parse_config({
        "features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
        "stream": {"entity_field": "device_id"},
        "window": {"size_seconds": W},
        "alarm": {"baseline_warmup_seconds": 3600, "run_seconds": 86400},
        "report": {"on_alarm": False},
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "epsilon": epsilon, "accountant": "basic"},
    })


def _first_page_losses(queries) -> float:
    """max over first-page outcomes (negatives up to k, a positive at k; or none) of the exact
    |log P[o | with X] - log P[o | without X]| of one AboveThreshold run (the noises as
    ``tests/svt_exact.py`` has them: folded discrete Laplace), every query's threshold public."""
    scale_t, scale_q = queries[0][3], queries[0][4]
    assert all(q[3:5] == (scale_t, scale_q) for q in queries)  # one run, one pair of scales
    t, tq = 1.0 / scale_t, 1.0 / scale_q
    rho = np.arange(0, int(40 * scale_t) + 1)
    log_p = np.where(rho == 0, math.log(math.tanh(t / 2)), math.log(math.tanh(t / 2)) + math.log(2.0) - t * rho)

    def outcomes(xs):
        quiet = log_p.copy()
        out = []
        with np.errstate(divide="ignore"):
            for x in xs:
                up = log_tail(rho - x, tq)
                out.append(np.logaddexp.reduce(quiet + up))
                quiet = quiet + np.log(-np.expm1(up))
        out.append(np.logaddexp.reduce(quiet))
        return np.array(out)

    with_x = outcomes([q[0] - q[2] for q in queries])
    without = outcomes([q[1] - q[2] for q in queries])
    return float(np.max(np.abs(with_x - without)))


def test_a_person_present_in_one_period_loses_at_most_what_that_period_was_charged(tmp_path, vitals_model):
    config = _config(tmp_path, epsilon=50.0)
    b = config.budget
    ledger = WindowLedger(b.ledger)
    accountant = BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant)
    releaser = WindowReleaser(config, accountant, vitals_model, rng=11)
    ref = releaser.reference

    # Record every call the releaser makes into its reference, and every query its runs ask.
    calls, queries, last = [], [], {}
    learn_one, compare, relevel = ref.learn_one, ref.compare, ref.relevel

    def recording_learn(index, units, entities, paged=False, scores=None):
        calls.append(("learn", index, np.array(units), tuple(entities), paged, None if scores is None else np.array(scores)))
        return learn_one(index, units, entities, paged=paged, scores=scores)

    def recording_compare(index, units, entities, m, low_units, **kw):
        c = compare(index, units, entities, m, low_units, **kw)
        calls.append(("compare", index, np.array(units), tuple(entities), (m, low_units, kw),
                      (ref.run_reach_windows, ref.run_first_index)))
        last["statistic"], last["index"] = c.statistic, index
        return c

    def recording_relevel(to_units):
        calls.append(("relevel", to_units))
        return relevel(to_units)

    ref.learn_one, ref.compare, ref.relevel = recording_learn, recording_compare, recording_relevel
    svt = releaser.alarm.svt
    test_one = svt.test_one

    def recording_test(query, threshold):
        fired = test_one(query, threshold)
        assert query == last["statistic"]  # the rhythm statistic is what the run asks about
        queries.append((releaser.alarm.run, last["index"], int(query), int(threshold), svt.threshold_scale,
                        svt.query_scale, fired))
        return fired

    svt.test_one = recording_test

    traffic = Traffic(people=300, days=3, seed=3, window_seconds=W)
    surge = Surge(start=DAY + 48, windows=3, share=0.2, kind="clustered", center=(84.0, 150.0))  # noon, day 1
    details = []
    for i in range(3 * DAY):
        X, entities, _ = traffic.window(i, [surge])
        if i in X_WINDOWS:
            X, entities = np.vstack([X, X_READING]), [*entities, "X"]
        w = ClosedWindow(i * W, (i + 1) * W, X, np.zeros(0, bool), (), tuple(entities))
        details.append(json.loads(releaser.release(w, released_at=(i + 1) * W).entry.payload)["alarm_detail"])
    assert any(d["state"] == "fired" for d in details[DAY:2 * DAY])  # the surge's run ends at midnight
    assert len({q[0] for q in queries}) >= 2

    # The neighbouring stream, without X, through a reference of its own: the same public choices
    # (the run's reach, rate, interval, margins, which windows paged), only X's terms missing.
    other = reference_for(config.alarm, W)
    without = {}
    for call in calls:
        if call[0] == "relevel":
            other.relevel(call[1])
            continue
        _, index, units, entities, *rest = call
        keep = [k for k, e in enumerate(entities) if e != "X"]
        units, entities = units[keep], tuple(entities[k] for k in keep)
        if call[0] == "learn":
            paged, scores = rest
            other.learn_one(index, units, entities, paged=paged, scores=None if scores is None else scores[keep])
        else:
            (m, low_units, kw), (other.run_reach_windows, other.run_first_index) = rest
            without[index] = other.compare(index, units, entities, m, low_units, **kw).statistic

    # Each run's exact loss, and the periods its charges count in.
    runs = sorted({q[0] for q in queries})
    run_charges = ledger.span_charges("alarm_run")
    loss, moved = {}, []
    for run in runs:
        asked = [(q[2], without[q[1]], q[3], q[4], q[5]) for q in queries if q[0] == run]
        loss[run] = _first_page_losses(asked)
        if any(a != o for a, o, *_ in asked):
            moved.append(run)
    last_run_day = {q[0]: int(q[1]) // DAY for q in queries}
    # X's memory reaches the third day's run, which no window of X's own day belongs to.
    assert any(last_run_day[r] == 2 and min(q[1] for q in queries if q[0] == r) >= 2 * DAY for r in moved)
    assert all(loss[r] > 0 for r in moved)

    # Every period that holds all of X's events must count every run X moved, and its pages.
    first, last_end = X_WINDOWS[0] * W, (X_WINDOWS[-1] + 1) * W
    period = b.period_seconds
    for t in (last_end, last_end + 3600.0, first + period):
        for run in moved:
            _, _, start, end, eps, _ = run_charges[run - 1]
            assert start < t and end > t - period, f"run {run} (span {start}..{end}) is not counted in the period ending {t}"
        charged = sum(run_charges[r - 1][4] + sum(p[4] for p in ledger.span_charges("alarm_page")
                                                  if (p[2], p[3]) == run_charges[r - 1][2:4]) for r in moved)
        assert sum(loss[r] for r in moved) <= charged + 1e-9
        assert charged <= accountant.spent(t)[0] + 1e-9 <= b.epsilon + 1e-9


# -- the reach: derived from the settings in one place, against the windows the reference reads

class _Unbounded:
    """A reference that forgets nothing, to see what ``_sets`` would read without the history's bound."""

    @staticmethod
    def make(**kw):
        from monitor.alarm.reference import RhythmReference

        class Unbounded(RhythmReference):
            reach_windows = property(lambda self: 10 ** 9)

        return RhythmReference(**kw), Unbounded(**kw)


def _read(ref, index: int, steady_line: bool) -> set[int]:
    _, predictions, _, _ = ref._sets(index, steady_line)
    return {j for parts in predictions for windows, _ in parts for j in windows}


SETTINGS = [dict(recent_windows=4, seasonal_windows=3), dict(recent_windows=4, seasonal_windows=5, trend_windows=3),
            dict(recent_windows=3, seasonal_windows=7, steady_windows=8),
            dict(recent_windows=2, seasonal_windows=1, trend_windows=2, steady_windows=5)]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("seed", range(3))
def test_the_reference_reads_nothing_beyond_its_reach_and_keeps_all_it_reads(settings, seed):
    """Random histories with gaps (the monitor not running), marked windows (pages, holds) and days
    alike or not (the week back read where not): every window any comparison reads lies within
    ``reach_windows`` before it, and the reference that forgets beyond its reach reads exactly what
    one that forgets nothing does."""
    rng = np.random.default_rng(seed)
    period = 24
    bounded, unbounded = _Unbounded.make(window_seconds=300, period_seconds=300 * period, **settings)
    reach = bounded.reach_windows
    deepest, week_back = 0, 0
    for i in range(10 * period):
        if i % period == 0:
            bounded.days_alike = unbounded.days_alike = bool(rng.random() < 0.5)
        for steady_line in (False, True):
            read = _read(unbounded, i, steady_line)
            assert read == _read(bounded, i, steady_line)
            week_back += bounded._sets(i, steady_line)[3]
            if read:
                deepest = max(deepest, i - min(read))
                assert i - min(read) <= reach, (i, sorted(read)[:3], reach)
        if rng.random() < 0.85:  # kept; often marked
            units, paged = rng.integers(0, 65, size=5), bool(rng.random() < 0.4)
            for ref in (bounded, unbounded):
                ref.learn_one(i, units, tuple(f"p{k}" for k in range(5)), paged=paged)
    assert deepest > 7 * period and week_back > 0  # the week-old set was read


def test_the_rhythm_reach_is_attained_where_bridges_and_fills_go_furthest():
    """Marked windows around the day-old sets' hour before, on both days: the fill from the other
    day is marked too, so the bridge reaches recent_windows below the second day's hour before,
    2 periods and 2 x recent_windows back: the two days' reach (``reach_choices``), and no less. On
    a day unlike the days before, the week-old set's bridge reaches recent_windows below its hour
    before: 7 periods and 2 x recent_windows, the reach."""
    period, recent = 24, 4
    ref, _ = _Unbounded.make(window_seconds=300, period_seconds=300 * period, recent_windows=recent, seasonal_windows=3)
    i = 8 * period
    marked = (set(range(i - 2 * period - 2 * recent + 1, i - 2 * period)) | set(range(i - period - 2 * recent + 1, i - period))
              | set(range(i - 7 * period - 2 * recent + 1, i - 7 * period)))
    for j in range(i):
        ref.learn_one(j, np.array([1]), ("p",), paged=j in marked)
    assert ref.reach_choices()[:2] == (7 * period + 2 * recent, 2 * period + 2 * recent)
    assert i - min(_read(ref, i, False)) == 2 * period + 2 * recent
    ref.days_alike = False
    assert ref.reach_windows == 7 * period + 2 * recent == i - min(_read(ref, i, False))


def test_a_run_that_reads_less_is_charged_less_far_back(tmp_path, vitals_model):
    """Where the periods its full reach touches cannot pay, a run reads the recent windows only
    (or none) and is charged from there: what it reads is what it is charged for."""
    from monitor.alarm.reference import RhythmReference

    ref = RhythmReference(300, recent_windows=4, seasonal_windows=3, period_seconds=300 * 24)
    for j in range(3 * 24):
        ref.learn_one(j, np.array([64, 0]), ("a", "b"))
    full, days, recent, none = ref.reach_choices()
    assert full == ref.reach_windows > days > recent > none == 0
    for reach in ref.reach_choices():
        ref.run_reach_windows = reach
        read = _read(ref, 3 * 24, False)
        assert not read or 3 * 24 - min(read) <= reach
        assert ref.outline(3 * 24)[0] == {full: "rhythm", days: "rhythm", recent: "recent", 0: "baseline"}[reach]


@pytest.mark.parametrize("settings", SETTINGS)
def test_a_run_that_reads_less_goes_on_to_read_the_windows_it_has_answered(settings):
    """A run opened where its budget paid less than the full reach reads, at every query, nothing before
    its first window less its reach (where its charge begins) nor beyond ``reach_windows``; as it answers,
    the windows since its first become its history, so a run that could pay no reach leaves the plain
    statistic for the first day's trend once it has answered enough windows, and reads a whole
    day of its own once it has gone on that long. A run opened later reads from its own first window."""
    from monitor.alarm.reference import RhythmReference

    period = 24
    ref = RhythmReference(300, period_seconds=300 * period, **settings)
    first = 3 * period
    for j in range(first):
        ref.learn_one(j, np.array([64, 0]), ("a", "b"))
    for reach in ref.reach_choices():
        probe = RhythmReference(300, period_seconds=300 * period, **settings)
        probe._windows, probe._ids = dict(ref._windows), dict(ref._ids)
        probe.run_reach_windows, probe.run_first_index = reach, first
        modes = []
        for i in range(first, first + 2 * period + 4):
            read = _read(probe, i, False) | _read(probe, i, True)
            assert not read or (min(read) >= first - reach and i - min(read) <= probe.reach_windows)
            modes.append(probe.outline(i)[0])
            probe.learn_one(i, np.array([64, 0]), ("a", "b"))
        if reach == 0:
            assert modes[0] == "baseline" and "recent" in modes and modes[-1] == "rhythm"
    ref.run_reach_windows, ref.run_first_index = 0, first + 10  # a run that opens later: nothing before it
    assert not _read(ref, first, False)


def test_a_run_the_budget_paid_no_reach_compares_with_its_own_windows(tmp_path, vitals_model):
    """Through the releaser, every run made to read no reach (as where the periods before are spent): each
    is charged from its own first window, reads nothing before it, and from its sixth window compares with
    the first day's trend through the windows it has answered, not with the plain statistic for the rest
    of the run."""
    config = _config(tmp_path, epsilon=50.0)
    ledger = WindowLedger(config.budget.ledger)
    releaser = WindowReleaser(config, BudgetAccountant(ledger, 50.0, 0.0, config.budget.period_seconds, "basic"),
                              vitals_model, rng=4)
    releaser._run_reach = lambda window, need: 0
    ref, compare, read = releaser.reference, releaser.reference.compare, {}

    def recording(index, *args, **kwargs):
        c = compare(index, *args, **kwargs)
        read[index] = (c.mode, min(_read(ref, index, kwargs.get("steady_line", False)), default=index), ref.run_first_index)
        return c

    ref.compare = recording
    traffic = Traffic(people=300, days=2, seed=5, window_seconds=W)
    for i in range(2 * DAY):
        X, entities, _ = traffic.window(i, [])
        releaser.release(ClosedWindow(i * W, (i + 1) * W, X, np.zeros(0, bool), (), tuple(entities)), released_at=(i + 1) * W)
    runs = ledger.span_charges("alarm_run")
    assert runs and all(start == first * W for (_, _, start, *_), first in zip(runs, sorted({f for *_, f in read.values()})))
    assert all(oldest >= first for _, oldest, first in read.values())
    modes = [mode for index, (mode, _, first) in sorted(read.items()) if index >= first + 5]
    assert modes and "baseline" not in modes and "recent" in modes


def test_a_run_reads_the_week_back_only_where_the_budget_keeps_room_for_more_pages(tmp_path, vitals_model):
    """A run whose charge reaches a week back counts in a week of periods; it is opened with that reach only
    where those periods still pay its threshold, a page and ``report.reserve_pages`` pages more, else with two
    days' (the shorter reach's periods holding the same spend but for the week-old ones)."""
    config = _config(tmp_path, epsilon=12.0)
    ledger = WindowLedger(config.budget.ledger)
    releaser = WindowReleaser(config, BudgetAccountant(ledger, 12.0, 0.0, config.budget.period_seconds, "basic"),
                              vitals_model, rng=0)
    ref, a = releaser.reference, config.alarm
    t = 10 * DAY * W
    window = ClosedWindow(t, t + W, np.zeros((0, len(VITAL_FEATURES))), np.zeros(0, bool), (), ())
    ref.history_start(ref.window_index(t) - 10 * DAY)  # ten days of history
    need = releaser._with_page((a.epsilon_threshold, 0.0))
    assert ref.reads_far(ref.reach_windows) and releaser._run_reach(window, need) == ref.reach_windows
    spare = config.report.reserve_pages * a.epsilon_page
    five_days_back = t - 5 * DAY * W
    ledger.add_charge("alarm_page", five_days_back, five_days_back + W, 12.0 - need[0] - spare - 0.01)
    assert releaser._run_reach(window, need) == ref.reach_windows  # room for the spare pages, just
    ledger.add_charge("alarm_page", five_days_back, five_days_back + W, 0.02)
    days = ref.reach_choices()[1]
    assert not ref.reads_far(days) and releaser._run_reach(window, need) == days


# -- a restart: the reference's history rebuilt from the windows already released

def _released(tmp_path, model, days: int, n_windows: int, surges=()):
    """The config, ledger, accountant, releaser and traffic of a process that released the first
    ``n_windows`` windows of ``days`` days of traffic, and those windows."""
    config = _config(tmp_path, epsilon=50.0)
    b = config.budget
    ledger = WindowLedger(b.ledger)
    accountant = BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant)
    releaser = WindowReleaser(config, accountant, model, rng=2)
    traffic = Traffic(people=200, days=days, seed=4, window_seconds=W)
    windows = []
    for i in range(n_windows):
        X, entities, _ = traffic.window(i, list(surges))
        windows.append(ClosedWindow(i * W, (i + 1) * W, X, np.zeros(0, bool), (), tuple(entities)))
        releaser.release(windows[-1], released_at=(i + 1) * W)
    return config, ledger, accountant, releaser, traffic, windows


def test_a_restart_rebuilds_the_references_history_without_a_release(tmp_path, vitals_model):
    """After a restart the releaser learns the history again from the windows it already
    released (their events re-read), as its published answers marked them, and charges nothing:
    the rebuilt reference is the one the stopped process had."""
    surge = Surge(start=DAY + 20, windows=3, share=0.2, kind="clustered", center=(84.0, 150.0))
    config, ledger, accountant, before, _, windows = _released(tmp_path, vitals_model, 2, DAY + 40, [surge])
    after = WindowReleaser(config, accountant, vitals_model, rng=3)  # the restart: no history
    assert not after.reference._windows
    charges = ledger.span_charges()  # the open run ended at the restart
    assert after.rebuild(windows) == len(windows)
    assert ledger.span_charges() == charges  # nothing charged, nothing released
    assert ledger.get(windows[-1].end) is None

    def history(ref):
        names = {i: e for e, i in ref._ids.items()}
        return {k: (sorted(zip((names[int(u)] for u in ids), units.tolist())), paged)
                for k, (ids, units, paged) in ref._windows.items()}

    assert history(after.reference) == history(before.reference)
    assert any(paged for _, paged in history(after.reference).values())  # the surge's page is marked
    index = before.reference.window_index(windows[-1].end)
    assert after.reference.outline(index) == before.reference.outline(index)


def test_a_run_after_a_restart_is_charged_from_the_rebuilt_days_not_a_week_back(tmp_path, vitals_model):
    """A restart rebuilds two days (``rebuilt_windows``); the run it opens reads nothing older, so
    its charge begins where the rebuilt span does (public: the ledger's released windows), not a
    whole reach (a week and two hours) back, and its queries read no further."""
    config, ledger, accountant, _, traffic, windows = _released(tmp_path, vitals_model, 4, 3 * DAY)
    after = WindowReleaser(config, accountant, vitals_model, rng=3)
    ref = after.reference
    rebuilt = windows[-ref.rebuilt_windows:]
    assert after.rebuild(rebuilt, since=rebuilt[0].start) == len(rebuilt)
    i = 3 * DAY
    X, entities, _ = traffic.window(i, [])
    after.release(ClosedWindow(i * W, (i + 1) * W, X, np.zeros(0, bool), (), tuple(entities)), released_at=(i + 1) * W)
    (_, _, start, _, _, _) = ledger.span_charges("alarm_run")[-1]
    assert start == rebuilt[0].start > i * W - ref.reach_windows * W
    assert ref.run_reach_windows == ref.rebuilt_windows and not ref.reads_far(ref.run_reach_windows)
    assert ref._oldest_read(i + DAY) == ref.window_index(rebuilt[0].start)  # a day on: still nothing older
