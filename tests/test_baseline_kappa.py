"""The baseline's own kappa (docs/alarm.md): the flagged total released as two parts, sum(w^2)
and sum(w - w^2), at the flagged total's sensitivity and epsilon; the alarm's threshold
reads the traffic's kappa from it instead of the model's coarse guess."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.alarm import BaselineEstimate, BaselineTracker, SurgeAlarm
from monitor.alarm.calibrate import kappa_estimate, kappa_raised


def _tracker(cap: int | None = 2, rng=0, warmup: float = 240.0) -> BaselineTracker:
    return BaselineTracker(1.0, 1.0, window_seconds=60, warmup_seconds=warmup, refresh_seconds=240, flag_cap=cap,
                           release_kappa=True, rng=rng)


def _feed(t: BaselineTracker, windows: int, heavy: "float | None") -> None:
    """Windows of 30 people with a few weights; the unit "heavy" (when given) weighs
    ``heavy`` in every window."""
    for i in range(windows):
        w = np.array([1.0, 0.25, 0.5, 0.0, 1.0, 1 / 4096] + [0.0] * 24 + ([heavy] if heavy is not None else []))
        ents = [f"p{j}" for j in range(30)] + (["heavy"] if heavy is not None else [])
        t.learn_one(60 * i, 60 * (i + 1), w, ents)


@pytest.mark.parametrize("heavy", [1.0, 0.7, 0.5, 1 / 4096, 0.999])
@pytest.mark.parametrize("cap,windows", [(2, 4), (3, 2), (None, 4)])
def test_one_unit_moves_the_pair_by_at_most_the_flagged_totals_sensitivity(heavy, cap, windows):
    # 0.7 x 4 windows at cap 2: the third event is clipped part-way (0.6 of it counted).
    a, b = _tracker(cap), _tracker(cap)
    _feed(a, windows, None)
    _feed(b, windows, heavy)
    pair = lambda t: np.array([t._totals[0].squared, t._totals[0].flagged - t._totals[0].squared])  # noqa: E731
    assert pair(a).min() >= 0 and pair(b).min() >= 0
    moved = np.abs(pair(b) - pair(a)).sum()
    bound = windows if cap is None else min(cap, windows)  # no cap: one event per window, each its own unit
    assert moved == pytest.approx(b._totals[0].flagged - a._totals[0].flagged)  # the two parts hold exactly the flagged total
    assert moved <= bound + 1e-12
    if cap is not None and heavy * windows >= cap:
        assert moved == pytest.approx(cap)  # reached: the bound is tight


def _released_pair(heavy: bool, seed: int, capture: list) -> np.ndarray:
    t = _tracker(cap=2, rng=seed)
    _feed(t, 4, 0.5 if heavy else None)  # the heavy unit: 0.5 of w^2 and 0.5 of w - w^2 a window, 2 in all
    t.release(240)
    return capture[-1]


def test_the_released_pair_of_neighbouring_spans_is_within_e_to_the_epsilon(monkeypatch):
    # Both parts move (by 1 each: L1 = the cap, 2) on spans that differ by one unit: every
    # 2-D bin's probability ratio within e^epsilon, up to sampling error, and the bound
    # nearly reached (too little noise on either part would show).
    import monitor.alarm.baseline as baseline

    capture: list = []
    real = baseline.kappa_estimate
    monkeypatch.setattr(baseline, "kappa_estimate",
                        lambda s, f, scale: (capture.append(np.array([s, f - s])), real(s, f, scale))[1])
    eps, trials = 1.0, 4000
    p0 = np.array([_released_pair(False, 2 * i, capture) for i in range(trials)])
    p1 = np.array([_released_pair(True, 2 * i + 1, capture) for i in range(trials)])
    both = np.concatenate([p0, p1])
    ex, ey = (np.quantile(both[:, j], np.linspace(0, 1, 5)) for j in (0, 1))
    h0, _, _ = np.histogram2d(p0[:, 0], p0[:, 1], [ex, ey])
    h1, _, _ = np.histogram2d(p1[:, 0], p1[:, 1], [ex, ey])
    ok = (h0 >= 80) & (h1 >= 80)
    ratios = np.abs(np.log(h1[ok] / h0[ok]))
    assert ratios.max() <= eps + 0.25
    assert ratios.max() >= 0.5 * eps


def test_the_pair_costs_what_the_flagged_total_cost_and_its_total_is_twice_as_noisy():
    plain = BaselineTracker(1.0, 1.0, 60, 240, 240, flag_cap=2, rng=0)
    split = _tracker(cap=2, rng=0)
    assert plain.epsilon == split.epsilon == 2.0
    for t in (plain, split):
        _feed(t, 4, None)
    a, b = plain.release(240), split.release(240)
    assert a.kappa is None and b.kappa is not None
    assert b.rate_error > a.rate_error  # its flagged noise variance is doubled, and the threshold knows it
    assert BaselineEstimate.from_dict(b.as_dict()) == b  # a restart reads it back from the alert record


def test_the_upper_kappa_covers_the_traffics_own_most_of_the_time():
    # Laplace noise of scale 64 on each part of sum w^2 = 3,000, sum w = 6,000 (kappa 0.5):
    # the estimate plus one sd falls below the truth in about one draw in six, never far.
    rng = np.random.default_rng(5)
    s = 3000 + rng.laplace(0, 64, 20_000)
    r = 3000 + rng.laplace(0, 64, 20_000)
    k = np.array([kappa_raised(*kappa_estimate(a, a + b, 64.0)) for a, b in zip(s, r)])
    below = (k < 0.5).mean()
    assert 0.05 <= below <= 0.22
    assert k.min() > 0.42  # the worst of 20,000 Laplace draws: within 8 sd
    assert kappa_estimate(10.0, -1.0, 64.0) is None
    assert kappa_raised(*kappa_estimate(0.0, 6000.0, 1.0)) == pytest.approx(0.25)  # never below KAPPA_FLOOR


def test_the_threshold_uses_the_baselines_kappa_where_it_has_one():
    alarm = SurgeAlarm(0.6, 0.5, threshold=None)
    common = dict(rate=0.03, events_per_window=10_000, span_start=0, span_end=1, span_windows=36, epsilon=0.27,
                  rate_error=0.0005)
    low, high = BaselineEstimate(**common, kappa=0.3), BaselineEstimate(**common, kappa=0.9)
    none = BaselineEstimate(**common)  # the model's kappa (1 here: the safe bound)
    assert alarm.window_threshold(low) < alarm.window_threshold(high) < alarm.window_threshold(none)


def test_the_pairs_true_values_are_exact_in_floats():
    # docs/design.md#floating-point: the noise is added to the exact values, so a neighbour's pair must differ by
    # exactly its contribution, with no float rounding to widen it. The releaser passes
    # weights as integers of 1/4096 (``weight_units``), so w and w^2 are dyadic and every sum
    # below 2^29 is exact: checked against rational arithmetic on adversarial windows
    # (duplicates, the smallest weight, a weight clipped part-way at the cap, full weights).
    from fractions import Fraction

    from monitor.alarm import RESOLUTION

    rng = np.random.default_rng(11)
    units = np.concatenate([[1, RESOLUTION, RESOLUTION - 1, 2867, 2867, 2867], rng.integers(0, RESOLUTION + 1, 400)])
    ents = ["a", "a", "a", "b", "b", "b"] + [f"p{j % 37}" for j in range(400)]
    t = _tracker(cap=3)
    clipped: dict = {}
    squared = rest = Fraction(0)
    for i in range(5):
        t.learn_one(60 * i, 60 * (i + 1), units / RESOLUTION, ents)
        for u, e in zip(units.tolist(), ents):
            w = Fraction(u, RESOLUTION)
            add = min(w, max(Fraction(3) - clipped.get(e, Fraction(0)), Fraction(0)))
            clipped[e] = clipped.get(e, Fraction(0)) + add
            squared += add * w
            rest += add * (1 - w)
    assert Fraction(t._totals[0].squared) == squared and Fraction(t._totals[0].flagged - t._totals[0].squared) == rest


def _day(t: BaselineTracker, start: int, windows: int, rng: np.random.Generator) -> BaselineEstimate:
    """``windows`` windows of 200 people with graded weights (kappa 0.75: 1 w.p. 0.05, 0.5 w.p. 0.1), released."""
    for i in range(start, start + windows):
        w = rng.choice([0.0, 0.5, 1.0], p=[0.85, 0.1, 0.05], size=200)
        t.learn_one(60 * i, 60 * (i + 1), w, [f"p{j}" for j in range(200)])
    return t.release(60 * (start + windows))


def test_each_days_kappa_is_averaged_with_the_days_before_and_its_error_shrinks():
    # Kappa is the traffic's; its noise is each release's own. Averaged over the releases at the
    # same levels, weighed by their precision, the older ones decaying: the error falls day by day
    # and settles at 0.45 of one day's (precision 3 days', S2 = p / (1 - (2/3)^2)); the warm-up's
    # noisy ratio weighs little.
    t = BaselineTracker(0.2, 1.0, window_seconds=60, warmup_seconds=600, refresh_seconds=2400, flag_cap=8,
                        release_kappa=True, rng=3)
    rng = np.random.default_rng(0)
    warm = _day(t, 0, 10, rng)
    days = [_day(t, 10 + 40 * d, 40, rng) for d in range(6)]
    errors = [warm.kappa_error] + [d.kappa_error for d in days]
    assert all(b < a for a, b in zip(errors, errors[1:4]))
    one_day = days[0].kappa_error  # mostly the first day's own (the warm-up weighs little)
    assert days[-1].kappa_error == pytest.approx(np.sqrt(1.8) / 3.0 * one_day, rel=0.15)
    for d in days:
        assert d.kappa == pytest.approx(min(1.0, max(0.25, d.kappa_mean + d.kappa_error)))
        assert d.kappa_mean == pytest.approx(0.75, abs=4 * d.kappa_error)
    assert BaselineEstimate.from_dict(days[-1].as_dict()) == days[-1]  # a restart reads the average back


def test_the_averaged_kappas_error_is_its_real_spread():
    # The carried standard deviation is that of the weighted mean (not of one day): over many
    # draws of five days' noisy ratios, the means spread as the reported error says, and the
    # average plus one error falls below the truth about one time in six.
    from monitor.alarm.baseline import _average_kappa

    rng = np.random.default_rng(4)
    errors = np.array([0.2, 0.05, 0.06, 0.05, 0.07])  # a warm-up, then days
    means, reported = [], []
    for _ in range(20_000):
        prev = None
        for e in errors:
            m, err, w = _average_kappa(0.5 + rng.normal(0.0, e), e, prev)
            prev = BaselineEstimate(0.03, 100.0, 0.0, 1.0, 1, 0.1, kappa_mean=m, kappa_error=err, kappa_weight=w)
        means.append(m)
        reported.append(err)
    assert np.std(means) == pytest.approx(reported[0], rel=0.03)
    assert np.allclose(reported, reported[0])
    assert reported[0] < errors[1:].min()  # better than any single day
    assert 0.12 <= np.mean(np.array(means) + reported[0] < 0.5) <= 0.2


def test_a_refit_or_other_levels_start_the_kappa_average_afresh():
    t = BaselineTracker(0.2, 1.0, window_seconds=60, warmup_seconds=600, refresh_seconds=2400, flag_cap=8,
                        release_kappa=True, rng=5)
    rng = np.random.default_rng(1)
    _day(t, 0, 10, rng)
    day = _day(t, 10, 40, rng)
    # Averaged: its precision is no longer one release's 1 / error^2 (the warm-up's is in it, decayed).
    assert day.kappa_weight != pytest.approx(1.0 / day.kappa_error ** 2, rel=1e-3)
    t.refit("a step change")
    fresh = _day(t, 50, 10, rng)
    assert fresh.kappa_weight == pytest.approx(1.0 / fresh.kappa_error ** 2)
    assert fresh.kappa_mean != day.kappa_mean


def test_the_normal_spread_is_the_weights_own_variance():
    # n (tau kappa - tau^2) is exactly n Var(w) for any weights with mean tau and E[w^2] = tau kappa:
    # checked against the weights' own moments (a plain flag's binomial at kappa 1).
    from monitor.alarm.calibrate import _normal_spread

    for values, probs in (([0.0, 1.0], [0.97, 0.03]), ([0.0, 0.25, 0.5, 1.0], [0.9, 0.05, 0.03, 0.02])):
        v, p = np.array(values), np.array(probs)
        tau, second = float(v @ p), float(v ** 2 @ p)
        sd, _ = _normal_spread(tau, 1500.0, 0.0, second / tau)
        assert sd ** 2 == pytest.approx(1500.0 * (second - tau ** 2))
        sd2, _ = _normal_spread(tau, 1500.0, 0.0, second / tau, factor=1.4)
        assert sd2 ** 2 == pytest.approx(1.4 * sd ** 2)  # a prediction's share multiplies it
