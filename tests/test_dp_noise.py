"""The noise sources: seeded reproducibility, the production path's distributions, selection."""

import math

import numpy as np
import pytest
from scipy import stats

from monitor.dp import NoiseSource, laplace_count, noise_source


def test_seeded_sources_reproduce_and_production_does_not_claim_to():
    a, b = noise_source(11), noise_source(11)
    assert a.seeded and b.seeded
    assert a.laplace(1.0, 5).tolist() == b.laplace(1.0, 5).tolist()
    assert not noise_source(None).seeded
    src = noise_source(3)
    assert noise_source(src) is src


def test_rng_of_the_wrong_type_is_refused():
    with pytest.raises(TypeError, match="rng must be"):
        noise_source("seed")
    with pytest.raises(TypeError):
        noise_source(True)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, math.nan])
def test_bad_scales_are_refused(scale):
    with pytest.raises(ValueError, match="scale"):
        noise_source(1).laplace(scale)


# The production path (OpenDP, OS randomness) cannot be seeded, so its checks are
# goodness-of-fit tests at a significance level that makes a false failure negligible.
ALPHA = 1e-6


def test_production_laplace_has_the_laplace_distribution():
    x = noise_source(None).laplace(2.5, 20000)
    assert stats.kstest(x, stats.laplace(scale=2.5).cdf).pvalue > ALPHA


def test_production_gaussian_has_the_normal_distribution():
    x = noise_source(None).gaussian(3.0, 20000)
    assert stats.kstest(x, stats.norm(scale=3.0).cdf).pvalue > ALPHA


def test_production_student_t_has_the_t_distribution():
    x = noise_source(None).student_t(3, 1.5, 20000)
    assert stats.kstest(x, stats.t(df=3, scale=1.5).cdf).pvalue > ALPHA


def test_seeded_student_t_has_the_t_distribution():
    x = noise_source(5).student_t(4, 2.0, 20000)
    assert stats.kstest(x, stats.t(df=4, scale=2.0).cdf).pvalue > ALPHA


@pytest.mark.parametrize("seed", [None, 4])
def test_folded_discrete_laplace_has_its_one_sided_distribution(seed):
    # |Z|, Z discrete Laplace: P(0) = (1 - q) / (1 + q), P(k) = 2 (1 - q) q^k / (1 + q). The
    # sparse vector alarm's noise: never negative, and one step up costs exactly exp(1 / scale).
    src, scale, n = noise_source(seed), 3.0, 6000
    x = np.array([src.folded_discrete_laplace(scale) for _ in range(n)])
    assert x.dtype.kind == "i" and x.min() == 0
    q = math.exp(-1.0 / scale)
    edges = 12
    pmf = np.array([(1 - q) / (1 + q)] + [2 * (1 - q) * q**k / (1 + q) for k in range(1, edges)])
    expected = np.append(pmf, 1.0 - pmf.sum()) * n
    observed = np.append(np.bincount(np.minimum(x, edges), minlength=edges + 1)[:edges], np.sum(x >= edges))
    assert stats.chisquare(observed, expected).pvalue > ALPHA


def _first_pick_counts(src, scores, scale, n):
    return np.bincount([src.top_k(scores, 1, scale)[0] for _ in range(n)], minlength=len(scores))


def test_seeded_top_k_draws_the_same_distribution_as_opendp():
    scores = [0.0, 1.0, 2.0]
    prod = _first_pick_counts(noise_source(None), scores, 1.0, 4000)
    seeded = _first_pick_counts(noise_source(7), scores, 1.0, 4000)
    assert stats.chi2_contingency(np.vstack([prod, seeded])).pvalue > ALPHA


@pytest.mark.parametrize("rng", [None, 8])
def test_top_k_respects_its_privacy_bound_on_neighbouring_scores(rng):
    """Scores that each move by at most 1 change every pick's probability by at most e^(2/scale)."""
    src, scale, n = noise_source(rng), 2.0, 6000
    a = _first_pick_counts(src, [0.0, 1.0, 2.0], scale, n) / n
    b = _first_pick_counts(src, [1.0, 1.0, 1.0], scale, n) / n
    bound = math.exp(2 / scale)
    # Sampling error: every probability here is above 0.15, so 6000 draws give a few % relative error.
    assert np.all(a <= bound * b * 1.15) and np.all(b <= bound * a * 1.15)
    # And the mechanism does prefer the best score.
    assert a[2] > a[1] > a[0]


@pytest.mark.parametrize("rng", [None, 8])
def test_monotone_top_k_is_within_e_to_the_one_over_scale(rng):
    """Counts under adding one person each rise by 0 or 1: the pick's bound halves to e^(1/scale).

    Adversarial pairs: one score up alone (its pick grows most), all up but one (that
    one's pick falls most)."""
    src, scale, n = noise_source(rng), 1.0, 6000
    bound = math.exp(1 / scale)
    for before, after in (([0.0, 0.0, 0.0], [1.0, 0.0, 0.0]), ([0.0, 0.0, 0.0], [0.0, 1.0, 1.0])):
        a = np.bincount([src.top_k(before, 1, scale, monotonic=True)[0] for _ in range(n)], minlength=3) / n
        b = np.bincount([src.top_k(after, 1, scale, monotonic=True)[0] for _ in range(n)], minlength=3) / n
        assert np.all(a <= bound * b * 1.15) and np.all(b <= bound * a * 1.15), (a, b)
        assert np.max(np.maximum(a / b, b / a)) > 1.3  # the neighbour does move the picks


def test_top_k_returns_distinct_indices_best_first_when_noise_is_small():
    src = noise_source(0)
    assert src.top_k([3.0, 10.0, 7.0, -2.0], 3, 1e-6) == [1, 2, 0]
    with pytest.raises(ValueError, match="between 1 and"):
        src.top_k([1.0, 2.0], 3, 1.0)


def test_laplace_count_is_unbiased_with_scale_sensitivity_over_epsilon():
    src = NoiseSource(np.random.default_rng(1))
    values = np.array([laplace_count(40, epsilon=0.5, sensitivity=2.0, rng=src).value for _ in range(4000)])
    assert abs(values.mean() - 40) < 0.5
    # Laplace(b) has standard deviation b * sqrt(2); b = 2 / 0.5 = 4.
    assert values.std() == pytest.approx(4 * math.sqrt(2), rel=0.08)
    r = laplace_count(3, epsilon=1.0, rng=2)
    assert (r.epsilon, r.delta, r.mechanism) == (1.0, 0.0, "laplace_global")
    with pytest.raises(ValueError, match="epsilon"):
        laplace_count(3, epsilon=0.0)


@pytest.mark.parametrize("rng", [None, 4])
def test_the_true_value_goes_into_the_sampler_as_center(rng):
    src = noise_source(rng)
    assert src.laplace(1e-9, center=42.0) == pytest.approx(42.0, abs=1e-6)
    out = src.gaussian(1e-9, center=np.array([1.0, 2.0, 3.0]))
    assert out.shape == (3,) and np.allclose(out, [1.0, 2.0, 3.0], atol=1e-6)
    # An array centre draws one value per entry, each with its own noise.
    # With the OS's randomness this check cannot be seeded: E|x| = scale, and its mean over
    # 2,000 draws has a standard deviation of 0.022, so 0.15 is 6.7 of them (the sample's
    # standard deviation, heavy-tailed for Laplace, missed a 10 % band once in CI).
    spread = src.laplace(1.0, center=np.zeros(2000))
    assert np.abs(spread).mean() == pytest.approx(1.0, abs=0.15)
    assert len(np.unique(spread)) == spread.size
    with pytest.raises(ValueError, match="center has 2 values but size is 3"):
        src.laplace(1.0, 3, center=np.zeros(2))
    with pytest.raises(ValueError, match="center must be finite"):
        src.laplace(1.0, center=math.nan)
