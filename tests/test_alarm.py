"""The private surge alarm: its guarantee checked on neighbouring streams, not only its noise."""

from __future__ import annotations

import math
from collections import Counter
from itertools import product

import numpy as np
import pytest

from monitor.alarm import RESOLUTION, AboveThreshold, BaselineEstimate, BaselineTracker, SurgeAlarm
from monitor.alarm.calibrate import span_flag_cap
from svt_exact import log_prob

EPS_T, EPS_Q = 0.5, 0.5
WIDTH = 4


def _answers(queries, threshold, seed, stop_after=1):
    # A run asked in order until its ``stop_after``-th positive answer.
    run = AboveThreshold(EPS_T, EPS_Q, width=WIDTH, rng=seed)
    run.start()
    out = []
    for q in queries:
        if run.positives >= stop_after:
            break
        out.append(run.test_one(int(q), threshold))
    return tuple(out)


def _check_ratios(a: Counter, b: Counter, n: int, bound_of) -> int:
    """Log-ratio of every frequent outcome within its bound plus 4 standard errors; returns how many were checked."""
    checked = 0
    for outcome in set(a) | set(b):
        if min(a[outcome], b[outcome]) < 400:  # too rare to estimate a ratio
            continue
        checked += 1
        slack = 4 * math.sqrt(1 / a[outcome] + 1 / b[outcome])
        log_ratio = math.log(a[outcome] / b[outcome])
        assert abs(log_ratio) <= bound_of(outcome) + slack, (outcome, a[outcome] / n, b[outcome] / n)
    return checked


@pytest.mark.slow
@pytest.mark.parametrize("shift", ["up", "down", "mixed"])
def test_output_distributions_of_neighbouring_streams_are_within_e_to_the_epsilon(shift):
    # Neighbouring streams: one unit moves every query by an amount in [-m, WIDTH - m] (m = 1
    # here, like -tau n for tau = 1/4). A run stopped at its first page must be (EPS_T + EPS_Q)-DP.
    base = np.array([0, 2, 5, 7, 9, 6])
    threshold = 8
    moves = {"up": np.full(6, WIDTH - 1), "down": np.full(6, -1), "mixed": np.array([3, -1, 3, -1, 3, -1])}[shift]
    neighbour = base + moves
    n = 30_000
    a = Counter(_answers(base, threshold, seed) for seed in range(n))
    b = Counter(_answers(neighbour, threshold, n + seed) for seed in range(n))
    assert _check_ratios(a, b, n, lambda outcome: EPS_T + EPS_Q) >= 3


@pytest.mark.slow
def test_each_outcome_costs_the_threshold_plus_one_share_per_page():
    # Pay-as-you-go: an outcome with k pages may differ between neighbours by at most
    # exp(EPS_T + k EPS_Q), however many quiet answers it holds. Strict per-outcome
    # bounds (no page: EPS_T alone) are what lets the releaser charge pages as they come.
    base = np.array([9, 2, 10, 3, 9, 8])
    threshold = 8
    neighbour = base + np.array([3, -1, 3, -1, 3, -1])
    n = 30_000
    a = Counter(_answers(base, threshold, seed, stop_after=2) for seed in range(n))
    b = Counter(_answers(neighbour, threshold, n + seed, stop_after=2) for seed in range(n))
    bounds = {}
    checked = _check_ratios(a, b, n, lambda outcome: bounds.setdefault(outcome, EPS_T + sum(outcome) * EPS_Q))
    assert checked >= 6 and {sum(o) for o in bounds} == {0, 1, 2}


def test_a_run_pays_only_for_its_positive_answers():
    run = AboveThreshold(0.3, 0.7, width=1, rng=0)
    run.start()
    assert run.epsilon_spent == pytest.approx(0.3)
    answers = [run.test_one(q, 100) for q in [0] * 500 + [10_000, 0, 10_000]]
    assert answers.count(True) == 2 and run.epsilon_spent == pytest.approx(0.3 + 2 * 0.7)
    run.stop()
    with pytest.raises(RuntimeError, match="no active run"):
        run.test_one(0, 100)


def test_noise_scales_follow_the_stated_guarantee():
    run = AboveThreshold(0.2, 0.4, width=RESOLUTION)
    assert run.threshold_scale == pytest.approx(RESOLUTION / 0.2)
    assert run.query_scale == pytest.approx(RESOLUTION / 0.4)


def test_the_statistic_is_an_exact_integer_whatever_the_rate():
    # tau is snapped to a multiple of 1/RESOLUTION, so RESOLUTION f - m n is an integer and the
    # comparison with the noisy threshold is exact: no float rounding can break the coupling.
    alarm = SurgeAlarm(1.0, 1.0, threshold=10, z=0, hold_windows=0, rng=3)
    alarm.open_run(1)
    seen = []
    alarm.svt.test_one = lambda q, t: seen.append((q, t)) or False  # record what the run is asked
    base = BaselineEstimate(rate=0.1 + 1e-13, events_per_window=1000, span_start=0, span_end=1, span_windows=1, epsilon=1)
    alarm.answer_one(113, 1001, base)
    q, t = seen[0]
    assert isinstance(q, int) and isinstance(t, int)
    assert q == RESOLUTION * 113 - round(0.1 * RESOLUTION) * 1001


def test_baseline_clips_each_entity_and_uses_the_scheduled_span_for_sensitivity():
    t = BaselineTracker(1.0, 1.0, window_seconds=60, warmup_seconds=600, refresh_seconds=600, flag_cap=3, rng=0)
    for i in range(10):  # one entity flagged in every window: only 3 of its flags count
        t.learn_one(i * 60, i * 60 + 60, np.arange(31) == 0, ["heavy", *(f"p{i}-{k}" for k in range(30))])
    assert t._totals[0].flagged == 3 and t._events == 310
    est = t.release(600)
    assert est.span_windows == 10 and est.epsilon == 2.0


def test_a_later_spans_cap_grows_with_the_released_traffic_and_sets_its_sensitivity():
    # Clipping a busy unit lowers tau by a share of n tau, a window's spread is sqrt(n tau):
    # after the warm-up the cap follows the released traffic, and the release's noise is
    # calibrated to the cap that clipped (not to the configured floor).
    t = BaselineTracker(1e6, 1e6, window_seconds=60, warmup_seconds=120, refresh_seconds=600, flag_cap=3, rng=0)
    assert t.span_cap() == 3
    for i in range(2):
        t.learn_one(i * 60, i * 60 + 60, np.arange(20_000) < 2_000, [f"p{j}" for j in range(20_000)])
    first = t.release(120)
    assert first.flag_cap == 3
    cap = t.span_cap()
    assert cap == span_flag_cap(3, 1e6, 10, first.events_per_window, first.rate) and cap > 10  # all 10 windows
    for i in range(2, 12):  # one entity flagged in every window of the 10-window span: all 10 count
        t.learn_one(i * 60, i * 60 + 60, np.arange(31) == 0, ["heavy", *(f"q{i}-{k}" for k in range(30))])
    assert t._totals[0].flagged == 10
    assert t.release(720).flag_cap == cap
    small = BaselineTracker(1.0, 1.0, window_seconds=60, warmup_seconds=120, refresh_seconds=600, flag_cap=3, rng=0)
    for i in range(2):
        small.learn_one(i * 60, i * 60 + 60, np.arange(100) < 3, [f"p{j}" for j in range(100)])
    small.release(120)
    assert small.span_cap() == 3  # a small fleet keeps the floor


def test_a_span_with_a_profile_sizes_its_cap_at_the_whole_flagged_epsilon():
    # The total gets a quarter of the flagged epsilon beside the profile, but the cap that clips
    # both is the whole epsilon's: sized for the quarter (16 at 10,000 people) it clipped most
    # people by the afternoon and the profile's evening came out empty.
    kw = dict(window_seconds=300, warmup_seconds=600, refresh_seconds=86400, flag_cap=16, rng=0)
    with_profile = BaselineTracker(0.08, 0.02, profile_bins=24, **kw)
    plain = BaselineTracker(0.08, 0.02, **kw)
    for t in (with_profile, plain):
        for i in range(2):
            t.learn_one(i * 300, i * 300 + 300, np.arange(10_000) < 400, [f"p{j}" for j in range(10_000)])
        t.release(600)
    assert with_profile.span_cap() == plain.span_cap() > 30


def test_baseline_without_entities_treats_each_event_as_a_unit():
    t = BaselineTracker(1e6, 1e6, window_seconds=60, warmup_seconds=120, refresh_seconds=120, flag_cap=None, rng=0)
    t.learn_one(0, 60, np.arange(100) < 5)
    t.learn_one(60, 120, np.arange(100) < 7)
    est = t.release(120)
    assert est.rate == pytest.approx(12 / 200, abs=1e-4) and est.events_per_window == pytest.approx(100, abs=0.01)


def test_threshold_grows_with_the_expected_count():
    alarm = SurgeAlarm(1.0, 1.0, threshold=15, z=3, rate_margin=0.1)
    small = BaselineEstimate(0.01, 1000, 0, 1, 1, 1.0)
    large = BaselineEstimate(0.01, 100_000, 0, 1, 1, 1.0)
    assert alarm.window_threshold(small) == pytest.approx(15 + 3 * math.sqrt(10) + 1)
    assert alarm.window_threshold(large) > alarm.window_threshold(small) + 100


def test_a_degenerate_first_baseline_is_retried_once_at_the_warm_up_length():
    # The first span saw no traffic (the producer started later): its released count says so,
    # so only the count is released and paid, and the next span is a warm-up span again, not a
    # whole refresh later, as often as the count says too little traffic (each costs the count's
    # epsilon alone). A released rate that is degenerate (0) is retried once at the warm-up
    # length; a second one (a fleet too small) falls back to the refresh schedule.
    t = BaselineTracker(1.0, 0.5, window_seconds=60, warmup_seconds=120, refresh_seconds=3600, flag_cap=None, rng=0)
    for span in range(3):  # no traffic, then 3 events a window: the count alone, each time
        for start in (span * 120, span * 120 + 60):
            t.learn_one(start, start + 60, np.zeros(3 * span, bool))
        est = t.release(span * 120 + 120)
        assert est.events_per_window < 20 and est.epsilon == 0.5 and t.warming_up
        assert t.span_length() == 120 and t.epsilon == 1.5  # a warm-up's cost again, if the count allows
    for span in (3, 4):  # enough traffic, nothing flagged: a rate of 0 (or its noise), released in full
        for start in (span * 120, span * 120 + 60):
            t.learn_one(start, start + 60, np.zeros(50, bool))
        est = t.release(span * 120 + 120)
        assert est.events_per_window >= 20 and est.epsilon == 1.5
        assert t.warming_up == (span == 3 and est.rate <= 0)  # a degenerate rate: once more
        if not t.warming_up:
            break
    assert t.span_length() == 3600


def _exact_losses(base, moves, scale_t, scale_q, threshold_noise="folded"):
    """(log-ratio, positives) of every answer sequence of a run asked ``len(base)`` queries
    (paying as it goes: it goes on after a positive), between a stream and its neighbour."""
    out = []
    for answers in product((False, True), repeat=len(base)):
        here = [(int(x), a, 1) for x, a in zip(base, answers)]
        there = [(int(x + d), a, 1) for x, d, a in zip(base, moves, answers)]
        loss = abs(log_prob(here, scale_t, scale_q, threshold_noise) - log_prob(there, scale_t, scale_q, threshold_noise))
        out.append((loss, sum(answers)))
    return out


def test_every_outcome_of_a_run_with_one_sided_noise_is_within_its_charge():
    """Exhaustive and exact: the one-sided noises (``AboveThreshold``: |Z| on the threshold and on
    each query) keep every answer sequence of a 4-query run within epsilon_threshold + k
    epsilon_positive, k its positives, for every pattern of extreme moves of an interval
    [-m, W - m]. A threshold noise with a lower tail instead (-|Z|) breaks it: the proof's
    shift of the threshold is upwards, and there nothing is left to shift into."""
    eps_t, eps_q, width, m = 0.5, 0.5, 8, 3
    run = AboveThreshold(eps_t, eps_q, width=width, reach=width - m, rng=0)
    base = np.array([0, -2, 3, 1])
    worst, broken = 0.0, 0.0
    for moves in product((-m, 0, width - m), repeat=4):
        for loss, k in _exact_losses(base, moves, run.threshold_scale, run.query_scale):
            worst = max(worst, loss - (eps_t + k * eps_q))
        for loss, k in _exact_losses(base, moves, run.threshold_scale, run.query_scale, "negated"):
            broken = max(broken, loss - (eps_t + k * eps_q))
    assert worst <= 1e-9
    assert broken > 0.1
