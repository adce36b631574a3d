"""Graded weights (docs/design.md#graded-weights) keep the alarm's guarantee, floats cannot widen it, the
threshold keeps the stated false-page rate at any scale, and a degenerate baseline is announced."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from monitor.alarm import RESOLUTION, BaselineEstimate, SurgeAlarm
from monitor.alarm.calibrate import (
    alarm_visibility,
    baseline_problem,
    false_page_threshold,
    false_pages_per_30_days,
    graded_weights,
    weight_units,
)
from monitor.config import AlarmSettings
from svt_exact import log_prob as _log_prob

EPS_T, EPS_P = 0.5, 1.0


def _base(rate: float, events: float = 10.0) -> BaselineEstimate:
    return BaselineEstimate(rate=rate, events_per_window=events, span_start=0, span_end=1, span_windows=1, epsilon=0.1)


def _outcomes(units_per_window: list[int], events: int, runs: int, seed: int) -> Counter:
    """How often each outcome of one AboveThreshold run occurs: the index of its first page
    (the run stops there, having paid epsilon_threshold + epsilon_page), or -1 for none."""
    alarm = SurgeAlarm(EPS_T, EPS_P, threshold=1.0, z=0.0, hold_windows=0, rng=np.random.default_rng(seed))
    base = _base(0.3, events)
    counts: Counter = Counter()
    for _ in range(runs):
        alarm.open_run(1, base)
        outcome = -1
        for i, u in enumerate(units_per_window):
            if alarm.answer_units(u, events, base).state == "fired":
                outcome = i
                break
        alarm.close_run()
        counts[outcome] += 1
    return counts


def _max_log_ratio(a: Counter, b: Counter, runs: int, min_count: int = 400) -> float:
    worst = 0.0
    for k in set(a) | set(b):
        if a[k] >= min_count and b[k] >= min_count:
            worst = max(worst, abs(math.log(a[k] / runs) - math.log(b[k] / runs)))
    return worst


def test_graded_weights_on_neighbouring_streams_stay_within_the_runs_epsilon():
    """Statistical check (seeded): one person added to a stream, weighing fully in the quiet
    windows (the largest upward move, which the threshold noise must absorb) and nothing in
    the last one (the farthest from a page). Every outcome's probability moves by at most
    exp(epsilon_threshold + epsilon_page); a person whose weight escaped the clip (3 per
    event) moves them visibly more, so the check sees the move it bounds."""
    runs, events = 20_000, 10
    # Nine people's scores per window (graded levels 0 and 1): two windows well below the
    # threshold, then one well above it.
    crowd = [np.full(9, 0.2), np.full(9, 0.2), np.full(9, 1.0)]
    person = [5.0, 5.0, -2.0]  # weight 1 (clipped from 5) in the quiet windows, 0 in the last one

    def units(with_person: bool, clip: bool) -> list[int]:
        out = []
        for scores, s in zip(crowd, person):
            u = int(weight_units(scores, 0.0, 1.0, RESOLUTION).sum())
            if with_person:
                u += int(weight_units(np.array([s]), 0.0, 1.0, RESOLUTION)[0]) if clip else int(max(s, 0.0) * 0.6 * RESOLUTION)
            out.append(u)
        return out

    # The person's event counts in the stream's events too (n + 1): tau n moves by tau.
    here = _outcomes(units(False, True), events - 1, runs, seed=1)
    there = _outcomes(units(True, True), events, runs, seed=2)
    assert len([k for k in here if here[k] >= 400]) >= 3, here  # several outcomes are measured
    loss = _max_log_ratio(here, there, runs)
    assert loss <= EPS_T + EPS_P + 0.1
    broken = _outcomes(units(True, False), events, runs, seed=3)
    assert _max_log_ratio(here, broken, runs) > loss + 0.3, (here, there, broken)


@pytest.mark.parametrize("scores_quiet, score_page, within", [
    (1.0, 0.0, True),       # the extreme weights
    (0.37, 0.91, True),     # graded, in between
    (7.0, -3.0, True),      # out of [t_lo, t_hi]: clipped to 1 and 0
])
def test_exact_loss_of_a_graded_run_is_within_its_charge(scores_quiet, score_page, within):
    """Exact privacy loss of "287 quiet windows, then a page" (the outcome closest to the worst
    case when the threshold is cheap and pages dear) between a stream at the threshold and
    the same stream with one more person whose graded weights come from ``weight_units``."""
    eps_t, eps_p = 0.1, 2.0
    alarm = SurgeAlarm(eps_t, eps_p, threshold=0.0, rng=0)
    m = round(0.02 * RESOLUTION)
    w_q = int(weight_units(np.array([scores_quiet]), 0.0, 1.0, RESOLUTION)[0])
    w_p = int(weight_units(np.array([score_page]), 0.0, 1.0, RESOLUTION)[0])
    here = [(0, False, 287), (0, True, 1)]
    there = [(w_q - m, False, 287), (w_p - m, True, 1)]
    loss = abs(_log_prob(here, alarm.svt.threshold_scale, alarm.svt.query_scale)
               - _log_prob(there, alarm.svt.threshold_scale, alarm.svt.query_scale))
    assert loss <= eps_t + eps_p + 1e-9
    # Without the clip the same person (weight 7, then -3) would lose far more than charged.
    unclipped = [(7 * RESOLUTION - m, False, 287), (-3 * RESOLUTION - m, True, 1)]
    if scores_quiet == 7.0:
        raw = abs(_log_prob(here, alarm.svt.threshold_scale, alarm.svt.query_scale)
                  - _log_prob(unclipped, alarm.svt.threshold_scale, alarm.svt.query_scale))
        assert raw > eps_t + eps_p + 1.0


@pytest.mark.parametrize("t_lo, t_hi", [(0.0, 1.0), (1.0, 1.0), (2.0, 1.0), (0.0, 1e-300), (-1e308, 1e308), (0.1, 0.1 + 1e-15)])
def test_weight_units_are_integers_in_zero_resolution_whatever_the_floats(t_lo, t_hi):
    scores = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0, 0.5, 1e308, -1e308, 5e-324, 0.1 + 5e-16, 2.0])
    u = weight_units(scores, t_lo, t_hi, RESOLUTION)
    assert u.dtype == np.int64
    assert np.all((u >= 0) & (u <= RESOLUTION))
    # One event adds at most RESOLUTION units, so the statistic moves within width 1 (in events).
    assert int(u.max()) - int(u.min()) <= RESOLUTION
    w = graded_weights(scores[3:], t_lo, t_hi)
    assert np.all((w >= 0) & (w <= 1))


def test_graded_units_follow_the_weights_and_the_plain_flag_is_the_degenerate_case():
    s = np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.5])
    assert weight_units(s, 0.0, 1.0, 4).tolist() == [0, 1, 2, 3, 4, 4]
    # Equal levels: the plain strict flag at the upper level (what the alarm counted before).
    assert weight_units(s, 1.0, 1.0, 4).tolist() == [0, 0, 0, 0, 0, 4]


def test_the_derived_threshold_keeps_the_stated_false_page_rate():
    """Monte Carlo of quiet windows (binomial flags, the run's two Laplace noises) at a
    false-page rate high enough to measure: the rate the threshold implies is what happens."""
    n, tau, eps_t, eps_p = 1500, 0.05, 0.6, 0.5
    target = 300.0  # per 30 days of 5-minute windows: 3.5 % of windows
    T = false_page_threshold(rate=tau, events=n, rate_error=0.0, epsilon_threshold=eps_t, epsilon_page=eps_p,
                             false_pages_per_30_days=target, window_seconds=300)
    rng = np.random.default_rng(11)
    m = 400_000
    stat = rng.binomial(n, tau, m) - tau * n + rng.laplace(0, 1 / eps_p, m) - rng.laplace(0, 1 / eps_t, m)
    measured = float(np.mean(stat >= T)) * 8640
    assert 0.85 * target <= measured <= 1.15 * target, (T, measured)
    # And the implied rate of that threshold is the target (the function the CLI prints).
    assert false_pages_per_30_days(T, rate=tau, events=n, rate_error=0.0, epsilon_threshold=eps_t, epsilon_page=eps_p,
                                   window_seconds=300) == pytest.approx(target, rel=1e-3)


def test_at_one_false_page_a_month_the_threshold_counts_the_skew_of_rare_flags():
    """At the shipped rate (1 per 30 days: one window in 8,640) the tail of a count of rare
    flags is heavier than a normal one: 20 million simulated quiet windows (binomial flags,
    next to no sparse-vector noise, so the count's own tail decides) page at most at the
    stated rate with the derived threshold, where a normal tail's threshold pages 1.6 times as
    often."""
    from scipy.stats import norm

    n, tau = 1500, 0.02
    kw = dict(rate=tau, events=n, rate_error=0.0, epsilon_threshold=1e3, epsilon_page=1e3, window_seconds=300)
    T = false_page_threshold(false_pages_per_30_days=1.0, **kw)
    rng = np.random.default_rng(26)
    excess = np.concatenate([rng.binomial(n, tau, 5_000_000) for _ in range(4)]) - tau * n
    per_30_days = lambda t: float(np.mean(excess >= t)) * 8640  # noqa: E731
    assert 0.5 <= per_30_days(T) <= 1.1, (T, per_30_days(T))
    normal_T = math.sqrt(n * tau) * norm.isf(1 / 8640)
    assert per_30_days(normal_T) >= 1.6, (normal_T, per_30_days(normal_T))


def test_a_prediction_adds_spread_but_no_skew_and_the_threshold_still_keeps_the_rate():
    """The rhythm reference's statistic is the window's weights minus a combination of earlier
    windows' (its shipped coefficients: the last hour, the same hour on two days, the hour before
    those). The prediction widens the spread by 1 + sum c^2 but its terms enter the third
    cumulant cubed and with the opposite sign, so the skew is the window's own over the wider
    spread: 2 million simulated quiet windows of rare binomial flags (next to no sparse-vector
    noise) page at most at the stated rate with the derived threshold, nearer to it than with
    the prediction's share counted as skew too, and a normal tail pages twice as often."""
    from scipy.stats import norm

    n, tau = 1500, 0.02
    c = np.concatenate([np.full(12, 1 / 12), np.full(10, 1 / 10), np.full(24, -1 / 24)])
    factor = 1.0 + float(c @ c)
    kw = dict(rate=tau, events=n, rate_error=0.0, epsilon_threshold=1e3, epsilon_page=1e3, window_seconds=300)
    T = false_page_threshold(false_pages_per_30_days=1.0, variance_factor=factor, **kw)
    skewed_too = false_page_threshold(false_pages_per_30_days=1.0, kappa=factor, **kw)
    normal_T = math.sqrt(n * tau * factor) * norm.isf(1 / 8640)
    rng = np.random.default_rng(5)
    flags = [rng.binomial(n, tau, (250_000, 1 + c.size)) - n * tau for _ in range(8)]
    excess = np.concatenate([f[:, 0] - f[:, 1:] @ c for f in flags])
    per_30_days = lambda t: float(np.mean(excess >= t)) * 8640  # noqa: E731
    assert 0.6 <= per_30_days(T) <= 1.1, (T, per_30_days(T))
    assert T < skewed_too and per_30_days(skewed_too) < per_30_days(T)
    assert per_30_days(normal_T) >= 2.0, (normal_T, per_30_days(normal_T))


def test_a_bridged_prediction_that_adds_skew_is_counted():
    """Where a bridge left the hour before yesterday's with one window of weight -1 (the rest
    paged), the prediction's cubes sum to about -0.95 and nearly double the statistic's third
    cumulant: 2 million simulated windows of 10,000 rare flags page 1.5 times a month with the
    threshold that leaves the prediction out of the skew, and at most once with the one that counts it
    (``Comparison.skew_factor``)."""
    n, tau = 10_000, 0.002
    c = np.concatenate([np.full(12, 1 / 12), np.full(5, 1 / 5), [-1.0]])
    kw = dict(rate=tau, events=n, rate_error=0.0, epsilon_threshold=1e3, epsilon_page=1e3, window_seconds=300,
              variance_factor=1.0 + float(c @ c), false_pages_per_30_days=1.0)
    counted = false_page_threshold(skew_factor=1.0 - float((c ** 3).sum()), **kw)
    left_out = false_page_threshold(**kw)
    rng = np.random.default_rng(5)
    flags = [rng.binomial(n, tau, (250_000, 1 + c.size)) - n * tau for _ in range(8)]
    excess = np.concatenate([f[:, 0] - f[:, 1:] @ c for f in flags])
    per_30_days = lambda t: float(np.mean(excess >= t)) * 8640  # noqa: E731
    assert per_30_days(counted) <= 1.1 < 1.3 <= per_30_days(left_out), (per_30_days(counted), per_30_days(left_out))


def test_the_baseline_error_and_the_traffic_swing_raise_the_threshold():
    kw = dict(rate=0.02, events=10_000, epsilon_threshold=0.6, epsilon_page=0.5, false_pages_per_30_days=1.0, window_seconds=300)
    plain = false_page_threshold(rate_error=0.0, **kw)
    assert false_page_threshold(rate_error=0.001, **kw) > plain + 5
    assert false_page_threshold(rate_error=0.0, swing=0.3, **kw) > plain


def test_the_threshold_is_scale_free_and_says_what_it_can_see():
    a = AlarmSettings()
    small, large = (alarm_visibility(a, 300, rate=0.03, events_per_window=n) for n in (300, 10_000))
    # No absolute count: the threshold grows with the spread (about sqrt(n)), not with n.
    assert small.threshold < large.threshold < small.threshold * math.sqrt(10_000 / 300)
    # A small fleet needs a larger share to page within one window 95 % of the time.
    assert large.smallest_surge_share < 0.015 < 0.05 < small.smallest_surge_share < 0.2
    for v in (small, large):
        assert v.false_pages_per_30_days == pytest.approx(a.false_pages_per_30_days, rel=0.01)


def test_a_degenerate_baseline_is_announced_and_not_used():
    assert "fewer than" in baseline_problem(0.02, 5.0)
    assert "share is 0" in baseline_problem(0.0, 500.0)
    assert baseline_problem(0.02, 500.0) is None
    alarm = SurgeAlarm(EPS_T, EPS_P, threshold=None, rng=0)
    answer = alarm.answer_units(10 * RESOLUTION, 100, _base(0.0, 500.0), problem=baseline_problem(0.0, 500.0))
    assert answer.state == "warming_up" and "share is 0" in answer.problem and answer.epsilon == 0.0


def test_the_releaser_announces_a_baseline_from_too_little_traffic(tmp_path):
    from monitor.budget import BudgetAccountant, WindowLedger
    from monitor.config import parse_config
    from monitor.data.vitals import VITAL_FEATURES, simulate_vitals
    from monitor.model import GridKNN
    from monitor.release import WindowReleaser
    from monitor.pipeline.windows import ClosedWindow
    import json

    cfg = parse_config({"features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
                        # events counted precisely (noise 0.2): the 5 events a window are what the releaser sees
                        "alarm": {"baseline_warmup_seconds": 600, "epsilon_baseline_events": 5.0},
                        "budget": {"ledger": str(tmp_path / "l.sqlite")}})
    _, R, _ = simulate_vitals(2000, rng=1)
    model = GridKNN(epsilon=1.0, bounds=cfg.bounds, contamination=0.05, random_state=0, feature_names=cfg.feature_names).fit(R)
    ledger = WindowLedger(cfg.budget.ledger)
    acc = BudgetAccountant(ledger, 12.0, 1e-6, 86400, "basic")
    rel = WindowReleaser(cfg, acc, model, rng=0)
    _, X, _ = simulate_vitals(40, rng=2)
    records = []
    for i in range(6):
        w = ClosedWindow(i * 300.0, (i + 1) * 300.0, X[i * 5:(i + 1) * 5], np.zeros(0, bool), (), ())
        records.append(json.loads(rel.release(w, (i + 1) * 300.0).entry.payload))
    later = records[2:]
    assert all(r["baseline_in_use"] is not None for r in later)
    assert all(r["alarm_detail"]["state"] == "warming_up" and "events per window" in r["alarm_detail"]["problem"]
               for r in later)
    assert not any(c["kind"] == "alarm_run" for r in records for c in r["charges"])
    ledger.close()


def test_what_the_plan_states_is_the_threshold_the_alarm_uses():
    from monitor.alarm.calibrate import window_threshold

    from monitor.alarm import RhythmReference
    from monitor.alarm.reference import Comparison

    a = AlarmSettings(follow_rhythm=False)
    alarm = SurgeAlarm(a.epsilon_threshold, a.epsilon_page, None, hold_windows=0, rng=0,
                       false_pages_per_30_days=a.false_pages_per_30_days, window_seconds=300, kappa=0.6,
                       traffic_swing=a.traffic_swing)
    base = BaselineEstimate(0.03, 1500.0, 0, 1, 36, 0.27, rate_error=0.002)
    assert alarm.window_threshold(base) == pytest.approx(window_threshold(a, 300, 0.03, 1500.0, 0.002, 0.6), rel=1e-6)
    for load in (0.6, 1.7):  # the plain statistic at an hour of a released profile
        assert alarm.window_threshold(base, load=load) == pytest.approx(
            window_threshold(a, 300, 0.03, 1500.0, 0.002, 0.6, load), rel=1e-6)
    # Against the rhythm reference (the default): the run's interval, the prediction's variance, the hour's load.
    r = AlarmSettings()
    ref = RhythmReference(300, r.recent_windows, r.seasonal_windows, r.rhythm_slack)
    alarm.open_run(1, base, slack_units=ref.slack_units)
    for load in (None, 0.6, 1.7):
        assert alarm.window_threshold(base, Comparison(0, "rhythm", ref.rhythm_variance - 1.0), load) == pytest.approx(
            window_threshold(r, 300, 0.03, 1500.0, 0.002, 0.6, load), rel=1e-6)
