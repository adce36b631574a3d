"""The alarm's rhythm reference (monitor.alarm.reference): one person's reach, the modes,
and that it follows a daily rhythm the plain daily rate does not."""

from __future__ import annotations

from typing import Callable

import json
import math

import numpy as np
import pytest

from monitor.alarm import RESOLUTION, BaselineEstimate, BaselineTracker, RhythmReference, SurgeAlarm
from monitor.alarm.reference import (DAYS_CHANGE_RATIO, GUARD_DIVISOR, WEEK_DAYS, Comparison, days_alike,
                                     trend_coefficients)
from monitor.alarm.baseline import profile_load
from monitor.alarm.units import band_around
from monitor.budget import BudgetAccountant, WindowLedger
from monitor.budget.plan import visibility_report
from monitor.config import parse_config
from monitor.data.traffic import Surge, Traffic
from monitor.data.vitals import VITAL_FEATURES
from monitor.release import WindowReleaser
from monitor.pipeline.windows import ClosedWindow
from svt_exact import log_prob as _log_prob

R = RESOLUTION


def _history(rng, n_people, n_windows, p_present=0.8, p_flag=0.1, heavy=()):
    """Per window: (entities, units). ``heavy`` people weigh fully whenever present."""
    out = []
    for _ in range(n_windows):
        ents, units = [], []
        for p in range(n_people):
            if rng.random() < p_present:
                ents.append(f"p{p}")
                if p in heavy:
                    units.append(R)
                elif rng.random() < p_flag:
                    units.append(int(rng.choice([R, R // 2, 1, R - 1, int(rng.integers(0, R + 1))])))
                else:
                    units.append(0)
        out.append((tuple(ents), np.array(units, dtype=np.int64)))
    return out


def _without(window, person):
    ents, units = window
    keep = [i for i, e in enumerate(ents) if e != person]
    return tuple(ents[i] for i in keep), units[keep]


def _statistic(history, index, now, m, paged=(), level_slope=0.0, margin=0, alike=True, **kw):
    ref = RhythmReference(window_seconds=300, period_seconds=300 * 8, **kw)
    ref.days_alike = alike
    for j, (ents, units) in enumerate(history):
        ref.learn_one(j, units, ents, paged=j in paged)
    return ref.compare(index, now[1], now[0], m, m + ref.slack_units, level_slope=level_slope, level_margin=margin)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("m", [0, 1, 164, R // 2, R])
@pytest.mark.parametrize("paged", [(), (4, 5, 6, 7, 13)])
@pytest.mark.parametrize("level_slope", [0.0, 0.37, 1.0])
@pytest.mark.parametrize("margin, alike", [(0, True), (900, True), (900, False)])
def test_one_person_moves_the_statistic_within_its_interval(seed, m, paged, level_slope, margin, alike):
    """Removing one person (all of their events, in every window) moves the statistic by an
    integer in the run's interval [-(m + slack), R]: heavy people, partial weights, absences,
    every mode, windows that paged (filled from the other day or bridged in the day-old sets, public
    marks), a threshold that follows the level (``level_slope``: taken off inside each person's clip),
    and the guards' public margins (the rhythm mode's lowest of its prediction and the day's trend; the
    days before over the first day's predictions where the days are no guide, ``days_alike`` False)."""
    rng = np.random.default_rng(seed)
    kw = dict(recent_windows=4, seasonal_windows=3, slack=0.25)
    slack = RhythmReference(300, **kw).slack_units
    history = _history(rng, 12, 22, heavy=(0, 3))
    now = _history(rng, 12, 1, heavy=(0,))[0]
    modes = set()
    for index in (1, 6, 14, 22):  # baseline, recent, rhythm over one day and two (a period of 8 windows)
        full = _statistic(history[:index], index, now, m, paged, level_slope, margin, alike, **kw)
        modes.add(full.mode)
        for person in [f"p{p}" for p in range(12)]:
            less = _statistic([_without(w, person) for w in history[:index]], index, _without(now, person), m, paged,
                              level_slope, margin, alike, **kw)
            # The mode and the prediction's coefficients (what a run's slack is chosen by) are the
            # calendar's and the public marks', not the data's.
            assert less.mode == full.mode and less.prediction == full.prediction
            move = full.statistic - less.statistic
            assert isinstance(move, int)
            assert -(m + slack) <= move <= R, (index, person, move)
    assert modes == ({"baseline", "recent", "rhythm"} if alike else {"baseline", "recent"})


def test_events_without_an_entity_are_their_own_units():
    """Without an entity field the combination of window totals equals the per-unit sum
    with every event its own unit (no clip can bind), so the reach is the same."""
    rng = np.random.default_rng(5)
    kw = dict(recent_windows=4, seasonal_windows=3, slack=0.25)
    windows = [np.array(rng.integers(0, R + 1, size=int(rng.integers(5, 20))) * (rng.random(1) < 0.5)) for _ in range(14)]
    anon = RhythmReference(300, period_seconds=2400, **kw)
    named = RhythmReference(300, period_seconds=2400, **kw)
    for j, u in enumerate(windows):
        anon.learn_one(j, u, ())
        named.learn_one(j, u, tuple(f"w{j}e{i}" for i in range(u.size)))
    now = np.array(rng.integers(0, R + 1, size=9))
    a = anon.compare(14, now, (), m=300, low_units=1324)
    b = named.compare(14, now, tuple(f"now{i}" for i in range(now.size)), m=300, low_units=1324)
    assert a.mode == b.mode == "rhythm"
    assert abs(a.statistic - b.statistic) <= 40  # rounding per unit against rounding once


def test_modes_need_history_and_a_lasting_change_is_learnt():
    """Without enough history the reference falls back to the daily rate; a person's new
    level is their normal within the hour, and yesterday's shape at this hour moves today's
    prediction."""
    ref = RhythmReference(300, recent_windows=4, seasonal_windows=3, period_seconds=2400)
    ref.learn_one(0, np.array([R]), ("a",))
    assert ref.compare(1, np.array([0]), ("a",), 0, 2048).mode == "baseline"  # 1 window of 4: too few
    for j in range(1, 4):
        ref.learn_one(j, np.array([R]), ("a",))
    assert ref.compare(4, np.array([R]), ("a",), 0, 2048).statistic == 0  # a's full weight is its new normal
    ref = RhythmReference(300, recent_windows=4, seasonal_windows=5, period_seconds=2400)
    for j in range(17):
        ref.learn_one(j, np.array([R if j in (8, 9) else 0]), ("a",))  # heavy yesterday around this hour
    c = ref.compare(17, np.array([0]), ("a",), 0, 2048)
    assert c.mode == "rhythm"
    # Yesterday's hour is windows 7..11 (2 R / 5) and the hour before it 5..8 (R / 4): a light
    # window now is below a's prediction by their difference.
    assert c.statistic == -round(2 * R / 5 - R / 4)


# Pages on the first day and at the second's last window: a day that paged compares the rest of it in the recent mode.
@pytest.mark.parametrize("paged", [(), (30, 31, 32, 150, 151, 152, 153, 154, 575)])
def test_the_outline_counts_the_predictions_cubes_window_by_window(paged):
    """The threshold counts a prediction's share of the statistic's third cumulant from the sum of
    its coefficients cubed, each window's parts added up first (``Comparison.skew_factor``). Over
    three days at the shipped settings that sum is positive (the prediction takes skew off)
    until a bridge piles the hour before's negative weight on a few windows; then the statistic
    says so, and its skew factor is above 1."""
    ref = RhythmReference(300)
    negative = 0
    for j in range(3 * 288):
        if j > 20:
            mode, predictions, _, _ = ref._sets(j)
            merged: dict[int, float] = {}
            for windows, coefficients in predictions[0] if predictions else ():
                for w, c in zip(windows, coefficients):
                    merged[w] = merged.get(w, 0.0) + float(c)
            cubes = sum(c ** 3 for c in merged.values())
            assert ref.outline(j)[3] == pytest.approx(cubes, abs=1e-12)
            comparison = ref.compare(j, np.array([0, R]), ("a", "b"), 0, 2048, level_slope=0.3)
            assert comparison.cubes == pytest.approx(cubes, abs=1e-12)
            assert comparison.skew_factor == pytest.approx(1.0 + max(0.0, -1.3 ** 3 * cubes))
            negative += cubes < 0
        ref.learn_one(j, np.array([0, R]), ("a", "b"), paged=j in paged)
    assert (negative > 0) == bool(paged), negative


def test_follows_a_daily_rhythm_the_daily_rate_misses():
    """A flagged share that swings 2.5x over the day: the reference's statistic stays near 0
    at every hour; the plain f - tau n swings by far more than its own spread."""
    rng = np.random.default_rng(0)
    P, people = 48, 600
    ref = RhythmReference(300, recent_windows=6, seasonal_windows=5, slack=0.25, period_seconds=300 * P)
    rates = 0.02 * np.exp(0.6 * np.sin(2 * np.pi * np.arange(3 * P) / P))
    tau_units = round(float(rates.mean()) * R)
    ents = tuple(f"p{i}" for i in range(people))
    against, plain = [], []
    for j, rate in enumerate(rates):
        units = (rng.random(people) < rate).astype(np.int64) * R
        if j >= 2 * P:
            c = ref.compare(j, units, ents, tau_units, tau_units + 1024)
            assert c.mode == "rhythm"
            against.append(c.statistic / R)
            plain.append(float(units.sum() - tau_units * people) / R)
        ref.learn_one(j, units, ents)
    spread = np.sqrt(people * rates.mean())
    assert abs(np.mean(against)) < 0.5 * spread
    assert np.std(against) < 1.6 * spread
    assert np.std(plain) > 1.5 * spread


def test_surge_alarm_noise_covers_the_run_interval():
    """Each run's noise is sized for one interval [-(top of its tau band + slack), 1], fixed
    when it opens, with no drift; the plain statistic's interval lies inside it."""
    base = BaselineEstimate(rate=0.04, events_per_window=1500, span_start=0, span_end=86400, span_windows=288,
                            epsilon=0.1, rate_error=0.001)
    wide, narrow = RhythmReference(300).slack_units, RhythmReference(300, slack=0.2).slack_units
    assert wide == R // 2 and narrow == math.ceil(0.2 * R)
    alarm = SurgeAlarm(0.6, 0.5, None, rng=1)
    plain = alarm.window_threshold(base)
    alarm.open_run(1, base, slack_units=wide)
    top = band_around(base.rate)[1]
    assert alarm.svt.width == R + top + wide and alarm.svt.drift == 0 and alarm.low_units == top + wide
    assert alarm.window_threshold(base) > plain
    m = alarm.run_rate_units(base)
    assert -alarm.low_units <= -m and R - m <= R  # the plain statistic's interval fits
    alarm.close_run()
    alarm.open_run(2, base)
    assert alarm.svt.width == R and alarm.svt.drift > 0  # a plain run, as before


@pytest.mark.parametrize("direction", ["added", "removed"])
def test_threshold_noise_covers_the_reach_and_page_noise_the_width(direction):
    """Exact loss of the worst outcomes for the interval [-L, 1] (L < 1): the person moves
    every quiet answer by +1 and the page by -L (or the reverse, when removed). Threshold
    noise of scale max(1, L) / epsilon_threshold and page noise of (1 + L) / epsilon_page keep
    every outcome within epsilon_threshold + epsilon_page; a threshold noise sized for half
    the largest upward move does not."""
    res, eps_t, eps_p = 64, 0.1, 2.0  # a cheap threshold: its shift dominates the loss
    low = 37  # L = 0.58, as for tau 0.03 with slack 0.5
    up, down = (res, -low) if direction == "added" else (low, -res)
    alarm = SurgeAlarm(eps_t, eps_p, threshold=0.0, rng=0)
    base = BaselineEstimate(rate=0.03, events_per_window=1500, span_start=0, span_end=86400, span_windows=288,
                            epsilon=0.1)
    alarm.open_run(1, base, slack_units=math.ceil(0.5 * R))
    assert alarm.svt.reach == R and alarm.svt.width == R + alarm.low_units

    def worst(reach):
        losses = []
        for quiet in (1, 50, 287):
            here = [(0, False, quiet), (0, True, 1)]
            there = [(up, False, quiet), (down, True, 1)]
            losses.append(abs(_log_prob(here, reach / eps_t, (res + low) / eps_p)
                              - _log_prob(there, reach / eps_t, (res + low) / eps_p)))
        return max(losses)

    assert worst(max(res, low)) <= eps_t + eps_p + 1e-9
    assert worst(up // 2) > eps_t + eps_p + 0.05  # half the largest upward move: loss beyond the charge


def test_a_page_of_the_first_days_trend_holds_until_the_trend_has_gone_through_it():
    """The first day's trend cannot tell a surge from a shift that starts, and lags a ramp until
    it has gone through it: a page in the "recent" mode holds for trend_hold_windows (the releaser
    gives trend_windows), with no query and no cost; a page against the day's shape holds for
    hold_windows. Without the longer hold a day/night switch paged again after the short one."""
    base = BaselineEstimate(rate=0.03, events_per_window=1500, span_start=0, span_end=86400, span_windows=288,
                            epsilon=0.1)
    for mode, hold in (("recent", 10), ("rhythm", 3)):
        alarm = SurgeAlarm(0.6, 0.5, threshold=20.0, hold_windows=3, trend_hold_windows=10, rng=2)
        alarm.open_run(1, base, slack_units=R // 2)
        states = [alarm.answer_units(0, 1500, base, comparison=Comparison(statistic=s, mode=mode)).state
                  for s in [10_000 * R] * (hold + 2)]
        assert states == ["fired"] + ["held"] * hold + ["fired"], mode
        assert alarm.svt.positives == 2  # held windows ask nothing and pay nothing
    assert SurgeAlarm(0.6, 0.5, threshold=20.0, hold_windows=4).trend_hold_windows == 4  # none given: the same hold
    # The config's default: the longer of hold_windows and trend_windows.
    alarm = lambda **kw: parse_config({"features": [{"name": "x", "min": 0, "max": 1}], "alarm": kw}).alarm  # noqa: E731
    assert alarm().trend_hold == 10 and alarm(hold_windows=12).trend_hold == 12 and alarm(trend_hold_windows=2).trend_hold == 2
    with pytest.raises(ValueError, match="trend_hold_windows"):
        SurgeAlarm(0.6, 0.5, threshold=20.0, trend_hold_windows=-1)


def test_slack_and_margin_are_checked():
    with pytest.raises(ValueError, match="slack"):
        RhythmReference(300, recent_windows=2, slack=0.0)
    ref = RhythmReference(300, recent_windows=2)
    for bad in (-1, 2.5):
        with pytest.raises(ValueError, match="level_margin"):
            ref.compare(3, np.array([R]), ("a",), 0, 2048, level_margin=bad)


def _cells(tracker):
    """The two histograms the tracker would release: the total as (sum w^2, sum w - w^2), and
    the clipped sum w per part of the day (the profile)."""
    return np.array([tracker._totals[0].squared, tracker._totals[0].flagged - tracker._totals[0].squared]), tracker._totals[0].bins.copy()


@pytest.mark.parametrize("seed", range(4))
def test_profile_histogram_has_the_flagged_totals_sensitivity(seed):
    """One person's clipped weight is split over the cells of each released histogram (the total's
    two parts, the parts of the day): removing them moves each by at most the span's cap in L1, however their flags fall (heavy all
    day, partial weights, a cap reached mid-day)."""
    rng = np.random.default_rng(seed)
    people = [f"p{i}" for i in range(30)]
    days = []
    for w in range(96):  # a day of 15-minute windows
        ents = [p for p in people if rng.random() < 0.7]
        weights = np.where(rng.random(len(ents)) < 0.3, rng.choice([1.0, 0.5, 0.25, 1e-9, 0.999], len(ents)), 0.0)
        if "p0" in ents:
            weights[ents.index("p0")] = 1.0  # heavy: reaches the cap before noon
        days.append((ents, weights))
    cap = 16
    for gone in ("p0", "p1", "p7"):
        full = BaselineTracker(1.0, 1.0, 900, 86400, 86400, flag_cap=cap, release_kappa=True, profile_bins=24, rng=0)
        less = BaselineTracker(1.0, 1.0, 900, 86400, 86400, flag_cap=cap, release_kappa=True, profile_bins=24, rng=0)
        for w, (ents, weights) in enumerate(days):
            full.learn_one(w * 900, (w + 1) * 900, weights, ents)
            keep = [i for i, e in enumerate(ents) if e != gone]
            less.learn_one(w * 900, (w + 1) * 900, weights[keep], [ents[i] for i in keep])
        for here, there in zip(_cells(full), _cells(less)):  # each histogram: the total's sensitivity
            assert np.abs(here - there).sum() <= cap + 1e-9
            assert np.all(here >= -1e-12) and np.all(there >= -1e-12)
    total, profile = _cells(full)
    assert total.sum() == pytest.approx(full._totals[0].flagged) and profile.sum() == pytest.approx(full._totals[0].flagged)


def test_released_profile_follows_the_day():
    """A flagged share three times higher by day than by night: the released profile (a daily
    estimate, after the warm-up) says so, hour by hour, and the alarm's threshold is higher by
    day than by night."""
    rng = np.random.default_rng(1)
    t = BaselineTracker(0.5, 0.5, 300, 3600, 86400, release_kappa=True, profile_bins=24, rng=2)
    day_rate = lambda w: 0.06 if 96 <= (w % 288) < 240 else 0.02  # 08:00 to 20:00 by day
    w = 0
    while t.estimate is None or t.estimate.profile is None:
        t.learn_one(w * 300, (w + 1) * 300, (rng.random(2000) < day_rate(w)).astype(float))
        if t.due((w + 1) * 300):
            t.release((w + 1) * 300)
        w += 1
    est = t.estimate
    noon, night = profile_load(est, 12 * 3600), profile_load(est, 2 * 3600)
    assert noon > 1.3 > 0.8 > night
    alarm = SurgeAlarm(0.6, 0.5, None, rng=1)
    assert alarm.window_threshold(est, load=noon) > alarm.window_threshold(est, load=night)


def test_profiles_of_several_days_are_averaged_and_their_noise_shrinks():
    """The same day three times: each release averages its profile with the days before (up to
    PROFILE_DAYS at equal weight), so the stated error shrinks like 1 / sqrt(days) and the
    shape stays on the day's; a restart that resumes the published estimate goes on averaging."""
    from monitor.alarm.baseline import PROFILE_DAYS

    rng = np.random.default_rng(3)
    day_rate = lambda w: 0.06 if 96 <= (w % 288) < 240 else 0.02
    # Each event its own unit (sensitivity 1 in every span): one day's noise is the same every day.
    t = BaselineTracker(0.005, 0.02, 300, 3600, 86400, release_kappa=True, profile_bins=24, rng=4)
    released = []
    for w in range(12 + 4 * 288):
        t.learn_one(w * 300, (w + 1) * 300, (rng.random(1500) < day_rate(w)).astype(float))
        if t.due((w + 1) * 300):
            released.append(t.release((w + 1) * 300))
            if len(released) == 3:  # a restart: the tracker resumes from the published estimate
                resumed = BaselineTracker(0.005, 0.02, 300, 3600, 86400, release_kappa=True, profile_bins=24, rng=5)
                resumed.resume(BaselineEstimate.from_dict(json.loads(json.dumps(t.estimate.as_dict()))))
                resumed._span_start, t = None, resumed
    daily = [e for e in released if e.profile_shape is not None]
    assert [e.profile_days for e in daily] == [1, 2, 3, 3][:len(daily)] and len(daily) >= 3
    # (each day's own error moves a little with its noisy total)
    assert daily[1].profile_error == pytest.approx(daily[0].profile_error / math.sqrt(2), rel=0.1)
    assert daily[2].profile_error == pytest.approx(daily[0].profile_error / math.sqrt(PROFILE_DAYS), rel=0.1)
    truth = np.array([1.5 if 8 <= h < 20 else 0.5 for h in range(24)])
    truth = truth / truth.mean()
    for e in daily:  # the loads: each part's and its neighbours' largest shape, raised by the error
        shape = np.array(e.profile_shape)
        wide = np.maximum.reduce([shape, np.roll(shape, 1), np.roll(shape, -1)])
        assert np.allclose(e.profile, np.clip(wide + e.profile_error, 0.25, 8.0))
    # The averaged shape is nearer the day's (3 harmonics of a square day: within its own smoothing).
    err = [np.abs(np.array(e.profile_shape) - truth).mean() for e in daily]
    assert err[2] < 0.35


def test_a_baseline_that_no_longer_fits_is_re_estimated_within_hours(tmp_path, vitals_model):
    """A warm-up over a few devices, then the fleet: the first released report's event count
    (public) is far from the baseline's, the record says so, and a new estimate follows one
    warm-up span later instead of a day later, with the fleet's traffic."""


    config = parse_config({
        "features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
        "stream": {"entity_field": "device_id"},
        "window": {"size_seconds": 300},
        "alarm": {"baseline_warmup_seconds": 3600},
        "report": {"every_seconds": 3600},
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "epsilon": 50.0, "accountant": "basic"},
    })
    b = config.budget
    releaser = WindowReleaser(config, BudgetAccountant(WindowLedger(b.ledger), b.epsilon, b.delta, b.period_seconds,
                                                       b.accountant), vitals_model, rng=3)
    traffic = Traffic(people=600, days=1, seed=2)
    records = []
    for i in range(48):
        Xw, entities, _ = traffic.window(i, [])
        keep = 40 if i < 12 else len(entities)  # the first hour: a few devices
        w = ClosedWindow(i * 300.0, (i + 1) * 300.0, Xw[:keep], np.zeros(0, bool), (), tuple(entities[:keep]))
        records.append(json.loads(releaser.release(w, released_at=(i + 1) * 300.0).entry.payload))
    baselines = [(i, r["baseline"]) for i, r in enumerate(records) if r["baseline"]]
    assert baselines[0][1]["events_per_window"] < 80
    refits = [i for i, r in enumerate(records) if r["baseline_refit"]]
    assert refits and "events" in records[refits[0]]["baseline_refit"]
    later = [(i, est) for i, est in baselines if i > refits[0]]
    assert later, "no new estimate within hours"
    i, est = later[0]
    assert est["events_per_window"] > 300 and est["span_start"] >= records[refits[0]]["window_end"]
    assert records[i]["baseline_refit"] is None  # answered


def test_budget_says_what_the_baseline_follows_and_the_quietest_and_busiest_hour(vitals_model):
    """`monitor budget`'s sentence (the plan's visibility report): the alarm follows the rhythm,
    and it sees a smaller surge share at the busiest hour of the released profile than at
    the quietest (more events per window)."""
    model = vitals_model
    config = parse_config({"features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES]})
    profile = [0.5] * 12 + [1.5] * 12
    base = {"rate": 0.03, "events_per_window": 1500.0, "rate_error": 0.001, "kappa": 0.5, "profile": profile}
    out = visibility_report(config, {"baseline_in_use": base}, model=model)
    assert "follows the traffic's daily rhythm" in out["verbose"] and "at the busiest" in out["verbose"]
    assert "predicted flagged weight" in out["verbose"]
    assert "a page then holds for 10 windows" in out["verbose"]  # the first day's trend (alarm.trend_hold_windows)
    assert "or its level, where that is lower by a whole threshold" in out["verbose"]
    fixed = parse_config({"features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
                          "alarm": {"threshold_follows_level": False}})
    assert "predicted flagged weight" not in visibility_report(fixed, {"baseline_in_use": base}, model=model)["verbose"]
    quiet, busy = out["hours"]["quietest"], out["hours"]["busiest"]
    assert quiet["events_per_window"] < busy["events_per_window"]
    assert busy["threshold"] > quiet["threshold"]
    off = parse_config({"features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
                        "alarm": {"follow_rhythm": False}})
    assert "rhythm" not in visibility_report(off, {"baseline_in_use": base}, model=model)["verbose"]


def test_budget_says_which_levels_a_large_fleet_weighs_at_or_advises_them(vitals_model):
    """At 10,000 events a window the shipped 1 % puts 100 normal events above the upper level.
    A baseline released at the ladder's sparser rung is said in the plan, with no advice; with the
    ladder off, the plan says which levels see more surges (about 15 above it). Nothing at 1,500."""
    features = [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES]
    config = parse_config({"features": features})
    small = {"rate": 0.03, "events_per_window": 1500.0, "rate_error": 0.001, "kappa": 0.5, "levels": [0.01, 0.1]}
    out = visibility_report(config, {"baseline_in_use": small}, model=vitals_model)
    assert out["levels_advice"] is None and "sparser" not in out["verbose"] and "levels_follow_fleet" not in out["verbose"]
    large = dict(small, rate=0.006, events_per_window=10_000.0, levels=[0.002, 0.02])
    out = visibility_report(config, {"baseline_in_use": large}, model=vitals_model)
    assert out["levels_advice"] is None
    assert "at the levels 2 % / 0.2 % of normal events exceed" in out["verbose"]
    fixed = parse_config({"features": features, "alarm": {"levels_follow_fleet": False}})
    out = visibility_report(fixed, {"baseline_in_use": dict(large, rate=0.03, levels=None)}, model=vitals_model)
    assert "alarm.contamination 0.002 and alarm.contamination_graded 0.02" in out["verbose"]


@pytest.mark.parametrize("level_slope", [0.0, 0.3])
@pytest.mark.parametrize("mode,margin,steady", [("rhythm", 0, 0), ("rhythm", 20, 6), ("recent", 0, 0), ("recent", 20, 0),
                                               ("recent", 20, 6)])
def test_exact_loss_of_a_run_against_the_reference_is_within_its_charge(level_slope, mode, margin, steady):
    """Exact privacy loss (the folded discrete Laplace noises, summed over exactly) of every outcome of a
    run answering rhythm-mode windows (with ``steady``, the steady line's statistic held within a tenth of
    ``margin`` of the rhythm prediction's) or the first day's (the lower of the trend's statistic
    and the level's plus ``margin``, and the steady line's first with ``steady``, held by the trend's), between a
    stream and the same stream without one
    adversarial person: heavy through yesterday's hour and the last hour, absent now, then
    heavy again. Within epsilon_threshold + epsilon_page for every first-page outcome, while
    the clip binds (unclipped, the person would move the statistic beyond the run's interval),
    with and without a threshold that follows the level (``level_slope``, inside the clip).
    A resolution of 64 units keeps the exact sums small; the run's noise is sized as
    ``SurgeAlarm.open_run`` sizes it (one interval, no drift)."""
    res, eps_t, eps_p = 64, 0.5, 1.0
    m, top = 3, 6  # tau = 0.05 and the top of its band of width 0.1, in 1 / 64
    slack = RhythmReference(300, resolution=res).slack_units
    width = res + top + slack
    crowd = [f"c{i}" for i in range(20)]
    heavy = [j < 16 or j in (17, 18) for j in range(22)]
    present = [j not in (16, 19, 20, 21) for j in range(22)]
    stats = {}
    for case, low in (("with", top + slack), ("without", top + slack), ("too wide", 3 * res)):
        period = 2400 if mode == "rhythm" else 300 * 1000  # a day of 8 windows, or none yet
        ref = RhythmReference(300, recent_windows=4, seasonal_windows=3, period_seconds=period, resolution=res,
                              trend_windows=4, steady_windows=steady)
        rng = np.random.default_rng(7)
        stats[case] = []
        for j in range(22):
            ents, units = list(crowd), list((rng.random(20) < 0.1) * res)
            if case != "without" and present[j]:
                ents.append("p")
                units.append(res if heavy[j] else 0)
            units = np.array(units, dtype=np.int64)
            if j >= 16:
                c = ref.compare(j, units, tuple(ents), m, low, level_slope=level_slope, level_margin=margin,
                                steady_line=bool(steady))
                assert c.mode == mode and ref._sets(j, steady_line=True)[2] == bool(steady)
                stats[case].append(c.statistic)
            ref.learn_one(j, units, tuple(ents))
    T = int(np.median(stats["without"]))

    def outcome(statistics, first_page):
        groups = [(q - T, False, 1) for q in statistics[:first_page]]
        return groups + ([(statistics[first_page] - T, True, 1)] if first_page < len(statistics) else [])

    reach = max(res, top + slack)  # as SurgeAlarm.open_run sizes the threshold's noise

    def loss(case):
        return max(abs(_log_prob(outcome(stats[case], k), reach / eps_t, width / eps_p)
                       - _log_prob(outcome(stats["without"], k), reach / eps_t, width / eps_p))
                   for k in range(len(stats["without"]) + 1))

    moves = np.array(stats["with"]) - np.array(stats["without"])
    assert moves.min() == -(top + slack)  # the clip binds: the person's term sits at the interval's low end
    assert loss("with") <= eps_t + eps_p + 1e-9
    # Unclipped, the same person would move the statistic beyond the interval the noise covers.
    assert (np.array(stats["too wide"]) - np.array(stats["without"])).min() < -(top + slack)


def _vitals_releaser(tmp_path, vitals_model, epsilon: float) -> WindowReleaser:
    """A releaser on 15-minute windows of vital signs, a 1-hour warm-up, no reports, basic
    accounting at ``epsilon`` a day (seeded noise)."""
    config = parse_config({
        "features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
        "stream": {"entity_field": "device_id"},
        "window": {"size_seconds": 900},
        "alarm": {"baseline_warmup_seconds": 3600, "run_seconds": 86400},
        "report": {"on_alarm": False},
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "epsilon": epsilon, "accountant": "basic"},
    })
    b = config.budget
    accountant = BudgetAccountant(WindowLedger(b.ledger), b.epsilon, b.delta, b.period_seconds, b.accountant)
    return WindowReleaser(config, accountant, vitals_model, rng=5)


def _release_days(releaser: WindowReleaser, days: int, surges) -> list[dict]:
    """Every window of ``days`` days of 400 people through ``releaser``: each alarm_detail."""
    traffic = Traffic(people=400, days=days, seed=3, window_seconds=900)
    details = []
    for i in range(days * 96):
        X, entities, _ = traffic.window(i, surges)
        w = ClosedWindow(i * 900.0, (i + 1) * 900.0, X, np.zeros(0, bool), (), tuple(entities))
        details.append(json.loads(releaser.release(w, released_at=(i + 1) * 900.0).entry.payload)["alarm_detail"])
    return details


def test_a_day_that_spent_the_budget_does_not_silence_the_days_after(tmp_path, vitals_model):
    """A day of surges spends the budget; the quiet run open at its end could never pay a page
    again (its span reaches back into that day), so it ends at the next boundary and a new run
    answers the day after instead of every window staying suppressed."""
    releaser = _vitals_releaser(tmp_path, vitals_model, epsilon=4.0)
    surges = [Surge(start=w, windows=1, share=0.3, kind="clustered", center=(84.0, 150.0)) for w in range(8, 96, 6)]
    states = [d["state"] for d in _release_days(releaser, 3, surges)]
    assert "suppressed" in states[:96]  # the first day's pages spent the budget
    assert {"quiet", "fired"} & set(states[2 * 96:])  # the third day is answered again


def test_every_window_that_paged_or_held_is_marked_for_the_day_old_sets(tmp_path, vitals_model):
    """Pages of the first day (the trend, before the day's shape is known) and of later days alike
    are marked, so the day-old sets bridge them; quiet windows are not."""
    releaser = _vitals_releaser(tmp_path, vitals_model, epsilon=40.0)
    marked = {}
    learn = releaser.reference.learn_one

    def spy(index, units, entities, paged=False, scores=None):
        marked[index] = paged
        return learn(index, units, entities, paged=paged, scores=scores)

    releaser.reference.learn_one = spy
    surges = [Surge(start=w, windows=1, share=0.3, kind="clustered", center=(84.0, 150.0)) for w in (30, 60, 130, 170)]
    details = _release_days(releaser, 2, surges)
    paging = {i: d["compared_with"] for i, d in enumerate(details) if d["state"] in ("fired", "held")}
    assert {"recent", "rhythm"} <= set(paging.values())  # pages before and after the day's shape was known
    assert all(marked[i] for i in paging)
    assert not any(marked[i] for i in range(len(details)) if i not in paging)


def test_a_day_old_page_is_bridged_by_the_straight_line_between_its_neighbours():
    """A surge that paged yesterday at this hour is not today's normal, and a ramp stays a ramp:
    the day-old sets replace marked windows by the line between their unmarked neighbours, so a
    spike on a linear ramp, marked, predicts what the ramp alone predicts (and, unmarked, does not)."""
    kw = dict(recent_windows=4, seasonal_windows=3, period_seconds=3000)  # a "day" of 10 windows
    refs = {case: RhythmReference(300, **kw) for case in ("ramp", "marked", "unmarked")}
    for j in range(14):
        spike = j in (3, 4, 5)
        refs["ramp"].learn_one(j, np.array([40 * j]), ["a"])
        refs["marked"].learn_one(j, np.array([4096 if spike else 40 * j]), ["a"], paged=spike)
        refs["unmarked"].learn_one(j, np.array([4096 if spike else 40 * j]), ["a"])
    got = {case: ref.compare(14, np.array([40 * 14]), ["a"], m=0, low_units=4096) for case, ref in refs.items()}
    assert {c.mode for c in got.values()} == {"rhythm"}
    assert got["marked"].statistic == got["ramp"].statistic != got["unmarked"].statistic


def test_a_day_old_page_is_filled_from_the_other_days_same_hour_where_that_one_did_not_page():
    """Pages and holds around a shift change mark a long span, and the line between its unmarked
    neighbours cuts the change's corner (the top of the morning ramp then paged every day). Where
    the other day kept has the same hour unmarked, the marked window is filled from it: the
    prediction is the unmarked days' own; with that hour marked on both days, the line is all there is."""
    kw = dict(recent_windows=4, seasonal_windows=3, period_seconds=3000)  # a "day" of 10 windows
    step = lambda j: 400 if j % 10 < 5 else 4000  # noqa: E731  a shift change at the fifth window
    cases = {"none": set(), "one day": set(range(13, 18)), "both days": set(range(13, 18)) | set(range(3, 8))}
    got = {}
    for case, marked in cases.items():
        ref = RhythmReference(300, **kw)
        for j in range(25):
            ref.learn_one(j, np.array([step(j)]), ["a"], paged=j in marked)
        got[case] = ref.compare(25, np.array([step(25)]), ["a"], m=0, low_units=4096)
    assert {c.mode for c in got.values()} == {"rhythm"}
    assert got["one day"].statistic == got["none"].statistic
    assert got["both days"].statistic > got["none"].statistic + 400  # the line from 400 to 4000 across the corner


def _trend_ref(paged: "set[int]", level: "Callable[[int], int]", windows: int = 10) -> RhythmReference:
    ref = RhythmReference(300, recent_windows=12, seasonal_windows=5, trend_windows=windows)
    for j in range(20):
        ref.learn_one(j, np.array([level(j)]), ["a"], paged=j in paged)
    return ref


def test_the_first_days_trend_bridges_a_page_it_has_seen_the_end_of():
    """A surge that paged in the trend's first windows and is over: its windows are replaced by
    the line between their unmarked neighbours, so the predictions are what the flat level
    predicts; unmarked, the surge moves both (the trend's first windows weigh negatively: it paged
    again as it left; the level's mean rises and would hide a surge now)."""
    flat = _trend_ref(set(), lambda j: 400)
    surge = {10, 11, 12, 13}  # the page and its hold, in the trend's first windows
    marked = _trend_ref(surge, lambda j: 4096 if j in surge else 400)
    unmarked = _trend_ref(set(), lambda j: 4096 if j in surge else 400)
    got = {name: ref.compare(20, np.array([400]), ["a"], m=0, low_units=4096)
           for name, ref in (("flat", flat), ("marked", marked), ("unmarked", unmarked))}
    assert {c.mode for c in got.values()} == {"recent"}
    assert got["marked"].statistic == got["flat"].statistic == 0
    ref = unmarked
    trend, level = ref._statistics(ref._sets(20)[1], np.array([400]), ["a"], 0, 4096, 0.0)
    assert trend > 400 and level < -400  # the echo and the hiding the bridge removes
    assert got["unmarked"].statistic == level


def test_the_first_days_statistic_is_the_lower_of_the_trend_and_the_level():
    """Where a falling hour levels off, the trend's line goes on falling and a flat window sits
    above it (at 10,000 people such overshoots paged at the end of the evening's shift change);
    the level, still above the traffic, does not. On a steady rise the level lags and the trend
    is the lower: the statistic follows the rise."""
    fall = lambda j: max(1000, 4000 - 300 * max(0, j - 8))  # noqa: E731  falls until window 18
    ref = _trend_ref(set(), fall)
    x = np.arange(10, 20)
    line = np.polyval(np.polyfit(x, [fall(j) for j in x], 1), 20)
    assert 1000 - line > 300  # the trend alone: an overshoot of about a surge's size
    c = ref.compare(20, np.array([1000]), ["a"], m=0, low_units=4096)
    level = 1000 - round(np.mean([fall(j) for j in x]))
    assert c.mode == "recent" and c.statistic == level < 0
    # With a margin the level overrules the trend only that far below it.
    assert ref.compare(20, np.array([1000]), ["a"], m=0, low_units=4096, level_margin=500).statistic == level + 500
    assert ref.compare(20, np.array([1000]), ["a"], m=0, low_units=4096, level_margin=4096).statistic > 300
    rise = lambda j: 400 + 150 * j  # noqa: E731
    c = _trend_ref(set(), rise).compare(20, np.array([rise(20)]), ["a"], m=0, low_units=4096)
    assert c.statistic == 0  # the trend's line is exact; the level would say 1,575 above


def test_on_steady_traffic_the_level_with_its_margin_leaves_the_trend_alone():
    """The release passes the window's threshold as the level's margin: on steady traffic the
    two predictions differ by their noise only (sd about 0.6 of the window's), so the statistic
    is the trend's in every window; without the margin the level's noise lowers it."""
    rng = np.random.default_rng(3)
    people, share = 2000, 0.02
    ents = tuple(f"p{i}" for i in range(people))
    ref = RhythmReference(300, trend_windows=10)
    m = round(share * R)
    spread = math.sqrt(people * share) * R
    lowered = 0
    for j in range(120):
        units = (rng.random(people) < share).astype(np.int64) * R
        if j >= 12:
            trend, level = ref._statistics(ref._sets(j)[1], units, ents, m, m + ref.slack_units, 0.0)
            margin = math.ceil(4 * spread)  # about the threshold at this scale
            c = ref.compare(j, units, ents, m, m + ref.slack_units, level_margin=margin)
            assert c.statistic == trend
            lowered += level < trend
        ref.learn_one(j, units, ents)
    assert lowered > 30


def test_the_first_days_steady_line_gives_the_threshold_and_the_short_line_guards_its_bends():
    """With a steady line (36 windows) the first day's outline is its spread (0.116, against the
    short line's 0.467 through 10 windows): on steady traffic its statistic stands. Where the traffic
    bends (a ramp that started 8 windows ago) the line through 3 hours lags by several ramp steps, and
    the statistic is the short line's plus a tenth of the level's margin. After a bend the line
    overshoots the flat, and the short line holds it from below: its statistic minus that tenth. With
    fewer windows than half the steady line's, the short line alone."""
    def ref_for(level, windows=40):
        ref = RhythmReference(300, recent_windows=12, seasonal_windows=5, trend_windows=10, steady_windows=36)
        for j in range(windows):
            ref.learn_one(j, np.array([level(j)]), ["a"])
        return ref

    steady = trend_coefficients(range(36), 36)
    assert (round(steady @ steady, 3), round(steady[-1], 3)) == (0.116, 0.111)
    flat = ref_for(lambda j: 400)
    mode, squares, *_ = flat.outline(40)
    assert mode == "recent" and squares == pytest.approx(0.116, abs=0.001)
    assert flat.compare(40, np.array([400]), ["a"], m=0, low_units=4096, level_margin=200).statistic == 0
    turn = lambda j: 400 + 40 * max(0, j - 32)  # noqa: E731  a ramp that starts 8 windows ago
    ref = ref_for(turn)
    now = np.array([turn(40)])
    line36, line, level = ref._statistics(ref._sets(40)[1], now, ["a"], 0, 4096, 0.0)
    assert line36 > 3 * 40 > 40 > line  # the steady line lags the turn by three ramp steps and more
    assert ref.compare(40, now, ["a"], m=0, low_units=4096, level_margin=200).statistic == line + 20
    # After the bend (a ramp over windows 4 to 20, flat since): the line through 3 hours overshoots the
    # flat, so its statistic stands far under the short line's, which holds it a tenth of the margin under its own.
    ended = lambda j: 400 + 40 * min(16, max(0, j - 4))  # noqa: E731
    ref = ref_for(ended)
    now = np.array([ended(40)])
    line36, line, level = ref._statistics(ref._sets(40)[1], now, ["a"], 0, 4096, 0.0)
    assert line36 < line - 100 and level + 200 > line
    assert ref.compare(40, now, ["a"], m=0, low_units=4096, level_margin=200).statistic == line - 20
    # Fewer windows than half the steady line's: the short line alone; at half, the steady line.
    assert ref_for(lambda j: 400, windows=17).outline(17)[1] == pytest.approx(0.467, abs=0.001)
    half = trend_coefficients(range(18), 18)
    assert ref_for(lambda j: 400, windows=18).outline(18)[1] == pytest.approx(half @ half)


def test_from_the_second_day_the_steady_line_comes_first_and_the_rhythm_prediction_holds_it():
    """With a day of history the steady line (36 windows) comes first where the release asks for it
    (``steady_line``: the released profile is straight there), and its spread gives the threshold
    (0.116, where the rhythm prediction's is 0.23). The rhythm prediction holds it within a tenth of
    the level's margin from both sides. The line lags a daily ramp that the days before predict, and the
    statistic is then the rhythm prediction's plus that tenth. It overshoots the ramp's end, and the statistic
    is then the rhythm prediction's minus it."""
    def ref_for(level, upto):
        ref = RhythmReference(300, recent_windows=12, seasonal_windows=5, trend_windows=10, steady_windows=36)
        for j in range(upto):
            ref.learn_one(j, np.array([level(j)]), ["a"])
        return ref

    flat = ref_for(lambda j: 400, 626)
    mode, squares, *_ = flat.outline(626, steady_line=True)
    assert mode == "rhythm" and flat._sets(626, steady_line=True)[2] and squares == pytest.approx(0.116, abs=0.001)
    assert flat.compare(626, np.array([400]), ["a"], m=0, low_units=4096, level_margin=200,
                        steady_line=True).statistic == 0
    # Without it (the release found the profile bent there) the rhythm prediction alone.
    assert not flat._sets(626)[2] and flat.outline(626)[1] == pytest.approx(1 / 12 + (1 / 5 + 1 / 12) / 2)
    ramp = lambda j: 400 + 40 * min(20, max(0, j % 288 - 100))  # noqa: E731  every day, windows 100 to 120
    for index, side in ((576 + 108, 1), (576 + 130, -1)):  # on the ramp; 10 windows after its end
        ref = ref_for(ramp, index)
        now = np.array([ramp(index)])
        line36, rhythm, trend = ref._statistics(ref._sets(index, steady_line=True)[1], now, ["a"], 0, 4096, 0.0)
        assert rhythm == 0 and side * line36 > 100  # the days before know the ramp; the line lags it, then overshoots
        assert ref.compare(index, now, ["a"], m=0, low_units=4096, level_margin=200,
                           steady_line=True).statistic == side * 20
        assert ref.compare(index, now, ["a"], m=0, low_units=4096, level_margin=200).statistic == 0
    # Without a steady line, the rhythm prediction alone, as before.
    plain = RhythmReference(300, recent_windows=12, seasonal_windows=5, trend_windows=10)
    for j in range(626):
        plain.learn_one(j, np.array([400]), ["a"])
    assert not plain._sets(626, steady_line=True)[2] and plain.outline(626, steady_line=True)[1] == pytest.approx(1 / 12 + (1 / 5 + 1 / 12) / 2)


def _level_is_lower(statistics: list[int], margin: int) -> bool:
    """Whether the level's statistic (last) plus ``margin`` is the lowest, as ``compare`` weighs them
    (the short line under the steady one with a tenth of the margin)."""
    others = [statistics[0]] + [s + margin // GUARD_DIVISOR for s in statistics[1:-1]]
    return statistics[-1] + margin < min(others)


@pytest.mark.parametrize("steady_windows", [0, 8])
@pytest.mark.parametrize("seed", range(4))
def test_one_person_moves_the_lower_of_two_statistics_within_the_interval(seed, steady_windows):
    """The recent mode's minimum of the trend's statistic and the level's plus a margin (and, with
    a steady line, of its statistic first, held by the trend's from both sides): removing one person
    moves it within [-(m + slack), R] whether or not
    the lower one changes sides, or the floor starts or stops holding (both cases occur)."""
    rng = np.random.default_rng(100 + seed)
    kw = dict(recent_windows=6, seasonal_windows=3, slack=0.25, trend_windows=6, steady_windows=steady_windows)
    m, sides, floors = 164, set(), set()
    n = 10 if steady_windows else 6  # the steady line's windows apart from the short line's
    for _ in range(30):
        history = _history(rng, 8, n, p_flag=0.3, heavy=(int(rng.integers(8)),))
        now = _history(rng, 8, 1, p_flag=0.3)[0]
        ref = RhythmReference(300, period_seconds=300 * 1000, **kw)  # no day of history
        for j, (ents, units) in enumerate(history):
            ref.learn_one(j, units, ents)
        margin = int(rng.integers(0, R))
        full = ref.compare(n, now[1], now[0], m, m + ref.slack_units, level_margin=margin)
        assert full.mode == "recent"
        for person in [f"p{p}" for p in range(8)]:
            less_ref = RhythmReference(300, period_seconds=300 * 1000, **kw)
            for j, w in enumerate(history):
                ents, units = _without(w, person)
                less_ref.learn_one(j, units, ents)
            less_now = _without(now, person)
            less = less_ref.compare(n, less_now[1], less_now[0], m, m + ref.slack_units, level_margin=margin)
            assert -(m + ref.slack_units) <= full.statistic - less.statistic <= R
            before = ref._statistics(ref._sets(n)[1], now[1], now[0], m, m + ref.slack_units, 0.0)
            after = less_ref._statistics(less_ref._sets(n)[1], less_now[1], less_now[0], m, m + ref.slack_units, 0.0)
            assert len(before) == 2 + bool(steady_windows)
            sides.add((_level_is_lower(before, margin), _level_is_lower(after, margin)))
            if steady_windows:  # whether the short line held the steady line from below
                floors.add((before[0] < min(before[1:-1]) - margin // GUARD_DIVISOR,
                            after[0] < min(after[1:-1]) - margin // GUARD_DIVISOR))
    assert len(sides) >= 3  # the lower one changed sides for some person
    assert not steady_windows or {(True, False), (False, True)} & floors  # and the floor, for some


def test_the_first_days_trend_keeps_its_newest_pages_and_learns_a_ramp_that_paged():
    """A ramp that starts: its first windows paged and held, and no window after them has been
    answered quietly yet. They count as they are, so the trend follows the ramp; moved onto the
    window before (the flat night), the trend stayed flat and the next window paged again (460
    events over a threshold of 68 at a day/night switch). Where more than half of the trend's
    windows paged, every window counts as it is."""
    ramp = lambda j: 400 + max(0, j - 14) * 300  # noqa: E731
    for paged in ({15, 16, 17, 18, 19}, {11, 12, 13, 14, 15, 16, 17, 18, 19}):
        marked, plain = _trend_ref(paged, ramp), _trend_ref(set(), ramp)
        now = np.array([ramp(20)])
        a = marked.compare(20, now, ["a"], m=0, low_units=4096)
        b = plain.compare(20, now, ["a"], m=0, low_units=4096)
        assert a.statistic == b.statistic and a.coefficients == pytest.approx(b.coefficients)
    # Fewer than half marked and the newest of them followed by a quiet window: bridged.
    bridged = _trend_ref({15, 16, 17, 18}, ramp)
    mode, coefficients, *_ = bridged.outline(20)
    assert mode == "recent" and coefficients != pytest.approx(_trend_ref(set(), ramp).outline(20)[1])


def test_a_refresh_whose_rate_is_unusable_keeps_the_previous_estimate_in_use():
    """A small fleet's daily span can release a rate of 0 (its noise larger than the count): the
    estimate in use stays the previous usable one instead of the alarm warming up for a day.
    The released estimate is still what the refresh returns (it is published)."""
    rng = np.random.default_rng(0)
    kept = 0
    for seed in range(40):
        tracker = BaselineTracker(0.02, 1.0, 900, 3600, 86400, flag_cap=16, epsilon_warmup=5.0, release_kappa=True,
                                  profile_bins=24, rng=seed)
        for w in range(4 + 96):
            ents = [f"p{i}" for i in range(60)]
            weights = (rng.random(60) < 0.02).astype(float)
            tracker.learn_one(w * 900, (w + 1) * 900, weights, ents)
            if tracker.due((w + 1) * 900):
                before = tracker.estimate
                released = tracker.release((w + 1) * 900)
                if before is not None and before.rate > 0 and released.rate == 0.0:
                    assert tracker.estimate is before and not tracker.warming_up
                    kept += 1
                else:
                    assert tracker.estimate is released
    assert kept >= 3  # the case happened, and each time the usable estimate stayed


def test_weekend_days_are_compared_only_with_days_of_their_own_kind():
    """With ``weekend_days`` a Saturday is not predicted from Friday's shape: it follows the last
    hour's trend, as a first day does; Sunday is compared with Saturday alone; Monday, whose
    weekdays lie beyond the two days kept, follows the trend again. Without it every day alike."""
    days = {"Thu": 0, "Fri": 1, "Sat": 2, "Sun": 3, "Mon": 4}  # 1970-01-01 was a Thursday
    people = [f"p{i}" for i in range(20)]
    rng = np.random.default_rng(3)
    refs = {w: RhythmReference(3600, recent_windows=4, seasonal_windows=3, weekend_days=w) for w in ((), (5, 6))}
    noon = {i * 24 + 12: d for d, i in days.items() if i >= 1}
    modes: dict = {w: {} for w in refs}
    for j in range(5 * 24):
        units = (rng.random(len(people)) < 0.2) * 4096
        for w, ref in refs.items():
            if j in noon:  # compared as it comes, before it is learnt
                modes[w][noon[j]] = ref.compare(j, units, people, 0, 2048)
            ref.learn_one(j, units, people)
    assert {d: c.mode for d, c in modes[()].items()} == {"Fri": "rhythm", "Sat": "rhythm", "Sun": "rhythm", "Mon": "rhythm"}
    weekend = modes[(5, 6)]
    assert {d: c.mode for d, c in weekend.items()} == {"Fri": "rhythm", "Sat": "recent", "Sun": "rhythm", "Mon": "recent"}
    assert weekend["Sun"].variance_factor > modes[()]["Sun"].variance_factor  # one day of its kind, not two
    with pytest.raises(ValueError, match="weekend_days"):
        RhythmReference(3600, weekend_days=(7,))


def test_budget_says_which_days_are_compared_only_with_their_own_kind(vitals_model):
    features = [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES]
    base = {"rate": 0.03, "events_per_window": 1500.0, "rate_error": 0.001, "kappa": 0.5}
    plain = visibility_report(parse_config({"features": features}), {"baseline_in_use": base}, model=vitals_model)
    assert "weekend_days" not in plain["verbose"]
    weekly = parse_config({"features": features, "alarm": {"weekend_days": [5, 6]}})
    out = visibility_report(weekly, {"baseline_in_use": base}, model=vitals_model)
    assert "weekend days (UTC weekdays 5, 6; 0 = Monday) only with days of their own kind" in out["verbose"]


def _profiled(shape, error: "float | None" = None) -> BaselineEstimate:
    """A daily baseline whose released profile is ``shape`` (24 parts) with ``profile_error`` ``error``."""
    return BaselineEstimate(0.02, 1000.0, 0.0, 1.0, 1, 0.1, profile_shape=tuple(shape), profile_error=error)


def _smoothed(values: np.ndarray) -> np.ndarray:
    """``values`` per part of the day kept to PROFILE_HARMONICS harmonics, as a released profile is."""
    from monitor.alarm.baseline import PROFILE_HARMONICS

    spectrum = np.fft.rfft(values, axis=-1)
    spectrum[..., PROFILE_HARMONICS + 1:] = 0.0
    return np.fft.irfft(spectrum, n=values.shape[-1], axis=-1)


def test_a_lines_miss_of_the_profile_is_its_curves_and_its_noise_the_profiles():
    """``profile_bend``: on a daily wave, what a least-squares line through the 36 windows before misses at
    each window, the wave evaluated at the windows' middles (between the profile's parts), checked against
    numpy's polyfit; on flat traffic nothing; and its stated standard deviation is that of the miss over
    released profiles' noise (each part's own, kept to 3 harmonics; profile_error is each part's after it)."""
    from monitor.alarm.baseline import profile_bend

    wave = lambda hours: 1.0 + 0.5 * np.sin(2 * np.pi * hours / 24.0) + 0.2 * np.cos(6 * np.pi * hours / 24.0)  # noqa: E731
    parts = (np.arange(24) + 0.5)  # each part's value is its middle's
    est = _profiled(wave(parts), 0.1)
    for start in (0.0, 3 * 3600.0 + 1500.0, 7 * 3600.0, 19.5 * 3600.0):
        middles = (start + 150.0 - 300.0 * np.arange(36, -1, -1)) / 3600.0
        slope, intercept = np.polyfit(middles[:-1], wave(middles[:-1]), 1)
        assert profile_bend(est, start, 36, 300.0)[0] == pytest.approx(abs(wave(middles[-1]) - slope * middles[-1] - intercept),
                                                                       abs=1e-9)
    flat = _profiled((1.0,) * 24, 0.1)
    assert all(profile_bend(flat, h * 1800.0, 36, 300.0)[0] < 1e-12 for h in range(48))
    rng = np.random.default_rng(11)
    noise = _smoothed(rng.normal(0.0, 0.1, size=(4000, 24)))
    stated = profile_bend(_profiled((1.0,) * 24, float(noise.std())), 5 * 3600.0, 36, 300.0)[1]
    misses = [profile_bend(_profiled(1.0 + n), 5 * 3600.0, 36, 300.0)[0] for n in noise]
    assert float(np.sqrt(np.mean(np.square(misses)))) == pytest.approx(stated, rel=0.06)


def test_the_profile_is_straight_where_the_day_is_flat_and_bent_all_day_at_a_shift_change():
    """``profile_straight``: a flat day is straight at every window, and after its noise at most windows;
    a day/night switch within the hour (0.6 by night, 1.4 by day), kept to 3 harmonics as released, with
    the noise of a large fleet's profile, is bent at every window of the day, flat night and flat day
    included: the release then compares with the rhythm prediction alone, which knows the switch, instead
    of a line through the last 3 hours, which lags it."""
    from monitor.alarm.baseline import profile_straight

    def straight(shape, error):
        return [profile_straight(_profiled(shape, error), w * 300.0, 36, 300.0) for w in range(288)]

    assert all(straight(np.ones(24), 0.1))
    rng = np.random.default_rng(5)
    noise = _smoothed(rng.normal(0.0, 1.0 / math.sqrt(7 / 24), size=(20, 24)))  # each part's sd 1 once smoothed
    assert np.mean([straight(1.0 + 0.1 * n, 0.1) for n in noise]) > 0.5
    hours = np.arange(24) + 0.5
    day = np.clip(hours - 7.0, 0.0, 1.0) * (1.0 - np.clip(hours - 19.0, 0.0, 1.0))
    switch = _smoothed(0.6 + 0.8 * day)
    switch /= switch.mean()
    assert not any(any(straight(switch + 0.02 * n, 0.02)) for n in noise)


def test_the_release_puts_the_steady_line_first_only_from_the_second_day_and_where_the_profile_is_straight(
        tmp_path, vitals_model):
    """Three days of steady traffic through a releaser: on the first day the reference has no rhythm mode
    and the release never asks for the steady line there; from the second day it asks at some windows and
    not at others, and only where the released profile is straight over the line's span
    (``profile_straight``, public)."""
    from monitor.alarm.baseline import profile_straight

    releaser = _vitals_releaser(tmp_path, vitals_model, epsilon=6.0)
    asked: dict[int, bool] = {}
    compare = releaser.reference.compare

    def recording(index, *args, **kwargs):
        asked[int(index)] = kwargs.get("steady_line", False)
        straight = profile_straight(releaser.baseline.estimate, index * 900.0, releaser.config.alarm.steady_windows, 900.0)
        assert not kwargs.get("steady_line") or straight
        return compare(index, *args, **kwargs)

    releaser.reference.compare = recording
    _release_days(releaser, 3, [])
    assert not any(v for i, v in asked.items() if i < 96)
    later = [v for i, v in asked.items() if i >= 96]
    assert any(later) and not all(later)


def test_days_whose_rates_differ_give_way_to_the_first_days_predictions():
    """Where the last days' released rates differ (``days_alike`` False, set by the releaser from
    public values), the reference compares as on a first day (``recent``), over the same windows and
    interval; where they are alike, with the days before (``rhythm``)."""
    people = [f"p{i}" for i in range(20)]
    rng = np.random.default_rng(4)
    ref = RhythmReference(3600, recent_windows=4, seasonal_windows=3)
    for j in range(3 * 24):
        ref.learn_one(j, (rng.random(len(people)) < 0.2) * 4096, people)
    units = (rng.random(len(people)) < 0.2) * 4096
    assert ref.outline(3 * 24)[0] == "rhythm" and ref.compare(3 * 24, units, people, 0, 2048).mode == "rhythm"
    ref.days_alike = False
    assert ref.outline(3 * 24)[0] == "recent" and ref.compare(3 * 24, units, people, 0, 2048).mode == "recent"
    assert days_alike([0.03, 0.035, 0.032]) and not days_alike([0.03, 0.012]) and not days_alike([0.03, 0.0])


def _one_person(level: Callable[[int], int], upto: int, **kw) -> RhythmReference:
    ref = RhythmReference(300, recent_windows=12, seasonal_windows=5, trend_windows=10, **kw)
    for j in range(upto):
        ref.learn_one(j, np.array([level(j)]), ["a"])
    return ref


def test_a_morning_that_rises_sooner_than_the_days_before_is_not_a_surge():
    """In the rhythm mode the day's own trend (the 10-window line) guards the prediction from above,
    within a tenth of the margin: a ramp that starts 10 windows sooner than on the days before (a
    Monday after a weekend, a morning of a real demand curve) stands 200 units over what the days
    before predict, and its trend follows it exactly. A jump at the hour the days before had it is
    above the trend and not above them: the lower of the two (the surge test below)."""
    day = 288
    ramp = lambda start: (lambda j: 400 + 40 * min(20, max(0, j % day - start)))  # noqa: E731
    usual = ramp(100)
    today = lambda j: usual(j) if j < 2 * day else ramp(90)(j)  # noqa: E731
    index = 2 * day + 100
    ref = _one_person(today, index)
    now = np.array([today(index)])
    rhythm, trend = ref._statistics(ref._sets(index)[1], now, ["a"], 0, 4096, 0.0)
    assert ref.outline(index)[0] == "rhythm" and rhythm > 200 and trend == 0
    assert ref.compare(index, now, ["a"], m=0, low_units=4096, level_margin=200).statistic == 20
    # A surge stands above both: its statistic is the rhythm prediction's (the threshold's).
    surge, high = _one_person(usual, index), np.array([usual(index) + 3000])
    rhythm, trend = surge._statistics(surge._sets(index)[1], high, ["a"], 0, 4096, 0.0)
    assert rhythm > 2900 and trend > rhythm
    assert surge.compare(index, high, ["a"], m=0, low_units=4096, level_margin=200).statistic == rhythm


def test_days_that_are_no_guide_still_guard_the_first_days_trend():
    """Where the days before are no guide to the day as a whole (``days_alike`` False), the first
    day's predictions compare, and the days before hold them from above within a tenth of the
    margin, as the trend holds the rhythm mode: a step at the hour it came on the days before stands
    far above the trend but within the days before's own error."""
    day = 288
    step = lambda j: 400 if j % day < 100 else 2400  # noqa: E731
    index = 2 * day + 100
    ref = _one_person(step, index)
    ref.days_alike = False
    now = np.array([step(index)])
    trend, days_before, level, *one_day = ref._statistics(ref._sets(index)[1], now, ["a"], 0, 4096, 0.0)
    assert ref.outline(index)[0] == "recent" and trend == level == 2000 and days_before < 1000
    assert one_day == [days_before] * 2  # each day alone: the same step at the same hour
    assert ref.compare(index, now, ["a"], m=0, low_units=4096, level_margin=200).statistic == days_before + 20
    ref.days_alike = True
    assert ref.compare(index, now, ["a"], m=0, low_units=4096, level_margin=200).statistic == days_before


def test_the_same_weekday_a_week_back_holds_a_day_the_days_before_do_not_foretell():
    """A step at the hour the same weekday had it a week back, on a day whose rates differ from the
    days before (the Monday after a weekend): neither the day's own trend and level nor the days
    before, together or each alone, foretell it; last week's same day does, and holds the statistic
    from above within a tenth of the margin. A run that reads two days back only (its budget paid no
    more) does not see it."""
    day = 288
    step = lambda j: 2400 if (j // day) % 7 == 0 and j % day >= 100 else 400  # noqa: E731  (every 7th day)
    index = 7 * day + 100
    ref = _one_person(step, index)
    ref.days_alike = False
    now = np.array([step(index)])
    mode, predictions, _, singles = ref._sets(index)
    assert mode == "recent" and singles == 4  # 1, 2, 3 and 7 days back
    trend, days_before, level, *one_day, week_before = ref._statistics(predictions, now, ["a"], 0, 4096, 0.0)
    assert trend == days_before == level == 2000 and one_day == [2000] * 3
    assert week_before == 800  # 2400 - (400 + 1600 - 400)
    assert ref.compare(index, now, ["a"], m=0, low_units=4096, level_margin=200).statistic == 800 + 20
    ref.run_reach_windows, ref.run_first_index = ref.reach_choices()[1], index  # two days and two hours
    assert ref.reach_choices()[0] == ref.reach_windows and ref._sets(index)[3] == 2  # 1 and 2 days back only
    assert ref.compare(index, now, ["a"], m=0, low_units=4096, level_margin=200).statistic == 2000


def test_the_day_before_a_weekend_holds_the_monday_after_it_in_the_first_week():
    """The first week has no week-old day: the Monday after a weekend (days 1 and 2 here) is held by the
    day three back on its own, Friday, whose step the weekend days and their mean do not have."""
    day = 288
    step = lambda j: 400 if (j // day) in (1, 2) or j % day < 100 else 2400  # noqa: E731
    index = 3 * day + 100
    ref = _one_person(step, index)
    ref.days_alike = False
    now = np.array([step(index)])
    mode, predictions, _, singles = ref._sets(index)
    assert mode == "recent" and singles == 3
    trend, days_before, level, one, two, three = ref._statistics(predictions, now, ["a"], 0, 4096, 0.0)
    assert trend == days_before == level == one == two == 2000 and three == 800
    assert ref.compare(index, now, ["a"], m=0, low_units=4096, level_margin=200).statistic == 800 + 20


def test_a_day_that_paged_is_not_held_by_the_days_before():
    """After a page today the days before did not foretell the day, so they no longer hold its
    first day's predictions: the same step as above, on days alike, is compared with the day's own
    trend and level only (on steady traffic the days before's hold cost 4 % of the later surges of a
    day that had paged)."""
    day = 288
    step = lambda j: 400 if j % day < 100 else 2400  # noqa: E731
    index = 2 * day + 100
    ref = RhythmReference(300, recent_windows=12, seasonal_windows=5, trend_windows=10)
    for j in range(index):
        ref.learn_one(j, np.array([step(j)]), ["a"], paged=j == 2 * day + 40)
    now = np.array([step(index)])
    mode, predictions, _, _ = ref._sets(index)
    trend, level = ref._statistics(predictions, now, ["a"], 0, 4096, 0.0)
    assert mode == "recent" and trend == level == 2000
    assert ref.compare(index, now, ["a"], m=0, low_units=4096, level_margin=200).statistic == 2000


def test_a_day_that_paged_compares_its_other_windows_with_its_own_recent_hours():
    """After a page (or a window held) the rest of that UTC day is compared as on a first day
    (``recent``): a day whose shape the days before do not foretell pages against their hours
    again and again. A page yesterday, or one later in the day, changes nothing before it, and the
    next day compares with the days before again."""
    people = [f"p{i}" for i in range(20)]
    rng = np.random.default_rng(5)
    ref = RhythmReference(3600, recent_windows=4, seasonal_windows=3)
    day = 24

    def learn(j: int, paged: bool = False) -> None:
        ref.learn_one(j, (rng.random(len(people)) < 0.2) * 4096, people, paged=paged)

    for j in range(2 * day + 8):
        learn(j, paged=j == 2 * day - 3)  # a page on the evening before
    units = (rng.random(len(people)) < 0.2) * 4096
    assert ref.outline(2 * day + 8)[0] == "rhythm" and ref.compare(2 * day + 8, units, people, 0, 2048).mode == "rhythm"
    learn(2 * day + 8, paged=True)  # 08:00 pages
    assert ref.outline(2 * day + 7)[0] == "rhythm"  # a window before the page: as it was
    for j in range(2 * day + 9, 3 * day):
        assert ref.outline(j)[0] == "recent" and ref.compare(j, units, people, 0, 2048).mode == "recent", j
        learn(j)
    assert ref.outline(3 * day)[0] == "rhythm"  # the next day


def test_releaser_notes_whether_the_last_days_rates_were_alike():
    """The releaser keeps the daily baselines' released rates (full days after a full day, at one
    level) and falls back where consecutive ones of the last three differ by more than DAYS_CHANGE_RATIO, and
    after such a change until the same weekday a week before can say whether the next day is of its kind."""
    rel = object.__new__(WindowReleaser)
    rel.reference, rel._day_rates, rel._last_full = RhythmReference(300), [], False
    day = rel.reference.period
    days = iter(range(1, 100))

    def est(rate, windows=day, levels=(0.01, 0.1)):
        end = next(days) * day * 300.0  # each release ends a day later, at midnight
        return BaselineEstimate(rate, 1500.0, end - windows * 300.0, end, windows, 0.1, levels=levels)

    for e in (est(0.03, 36), est(0.02), est(0.03), est(0.031)):  # a warm-up, the day sized on it, two days
        rel._note_day_rate(e)
    assert rel.reference.days_alike
    up = DAYS_CHANGE_RATIO * 1.1
    rel._note_day_rate(est(0.031 * up))  # a day that differs: it and the next day fall back
    assert not rel.reference.days_alike
    rel._note_day_rate(est(0.032 * up))
    assert not rel.reference.days_alike
    rel._note_day_rate(est(0.033 * up))  # two days of its kind, but the first week: still not
    assert not rel.reference.days_alike
    for rate in (0.032, 0.031, 0.033):  # until the same weekday a week back is of the new kind too
        rel._note_day_rate(est(rate * up))
        assert not rel.reference.days_alike
    rel._note_day_rate(est(0.032 * up))
    assert rel.reference.days_alike
    rel._note_day_rate(est(0.01, levels=(0.002, 0.02)))  # another level's rate starts afresh
    assert rel.reference.days_alike
    kept = list(rel._day_rates)
    # A span with too little traffic carries the rate before it: neither it nor the day sized after it counts.
    end = next(days) * day * 300.0
    rel._note_day_rate(BaselineEstimate(0.05, 5.0, end - day * 300.0, end, day, 0.1, levels=(0.002, 0.02)))
    rel._note_day_rate(est(0.05, levels=(0.002, 0.02)))
    assert rel.reference.days_alike and rel._day_rates == kept


def _weeks_of_day_rates(period: int, days: range, window: float = 300.0) -> list[BaselineEstimate]:
    """One released daily baseline a day, the weekend (days 5 and 6 of each week) at half the rate."""
    return [BaselineEstimate((0.015 if d % 7 in (5, 6) else 0.03) * (1 + 0.02 * np.sin(d)), 1500.0, d * period * window,
                             (d + 1) * period * window, period, 0.1, levels=(0.01, 0.1)) for d in days]


def test_a_weekday_that_differed_a_week_ago_falls_back_before_it_comes():
    """Once a week of daily rates is kept, the day whose same weekday a week before differed from the
    days the rhythm mode compares with falls back (Saturday after a week of weekdays), though the last
    three days were alike; a weekday whose week-ago twin was like them does not. Public values only."""
    rel = object.__new__(WindowReleaser)
    rel.reference, rel._day_rates, rel._last_full = RhythmReference(300), [], True
    alike = {}
    for est in _weeks_of_day_rates(rel.reference.period, range(1, 20)):
        rel._note_day_rate(est)
        alike[round(est.span_end / 86400)] = rel.reference.days_alike  # what the next day is compared by
    # The first week has no week-ago day: the first weekend day (5) is compared with the weekdays.
    assert alike[5]
    # From the second week the weekend's first day falls back before it comes, the Friday before it does not;
    # the days after a change fall back as before (their last three days differ).
    assert not alike[12] and not alike[19] and alike[11] and alike[18]
    assert not alike[13] and not alike[14] and not alike[15]
    assert alike[17] and alike[18]
    # Rates of other days stay out: only the last week is kept.
    assert len(rel._day_rates) == WEEK_DAYS and {d for _, d, _ in rel._day_rates} == set(range(13, 20))


def test_a_restart_keeps_the_weeks_daily_rates(tmp_path, vitals_model):
    """The daily rates come back from the ledger's released records (public) at start-up, so the day after
    a restart is compared as it would have been without one."""
    config = parse_config({
        "features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
        "stream": {"entity_field": "device_id"},
        "window": {"size_seconds": 300},
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "epsilon": 50.0, "accountant": "basic"},
    })
    b = config.budget
    ledger = WindowLedger(b.ledger)
    accountant = BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant)
    first = WindowReleaser(config, accountant, vitals_model, rng=1)
    first._last_full = True
    for est in _weeks_of_day_rates(first.reference.period, range(1, 12)):  # up to a Friday's baseline
        first._note_day_rate(est)
        for k in range(3):  # each release is in use for the windows after it
            start = est.span_end + 300.0 * k
            ledger.record_release(start, start + 300.0, 0.1, 0.0, json.dumps({"baseline_in_use": est.as_dict()}))
    assert not first.reference.days_alike  # Saturday comes: last Saturday differed
    again = WindowReleaser(config, accountant, vitals_model, rng=2)
    assert again._day_rates == first._day_rates and again.reference.days_alike is False
    ledger.close()
