"""The smooth bound against the paper's exponential algorithm and brute force (miniball)."""

import math

import numpy as np
import pytest

from monitor.outliers import count_outliers, kissing_number_bound, smooth_sensitivity
from monitor.outliers._geometry import BallPacking, degrees, scaled, sq_dist
from monitor.outliers._oracle import (
    count_brute,
    largest_ball_subset,
    local_sensitivity_brute,
    smooth_oracle,
)


def _small_windows(seed, count, dims=(1, 2, 3), n=(4, 12)):
    rng = np.random.default_rng(seed)
    for i in range(count):
        d = int(rng.choice(dims))
        X = rng.random((int(rng.integers(*n)), d))
        if i % 4 == 0:
            X[1] = X[0]  # repeated events happen (discretised sensors)
        yield X, int(rng.integers(1, 4)), float(rng.uniform(0.05, 0.35)), float(rng.uniform(0.1, 1.5))


def test_count_matches_brute_force_and_uses_other_rows_only():
    X = np.array([[0.0], [0.05], [0.5]])
    # 0.0 and 0.05 see each other (one OTHER row each), 0.5 sees none.
    assert count_outliers(X, k=1, r=0.05) == 1
    assert count_outliers(X, k=2, r=0.05) == 3
    for X, k, r, _ in _small_windows(0, 40):
        assert count_outliers(X, k, r) == count_brute(scaled(X, None), k, r)


def test_subspace_distance_is_normalised():
    X = np.array([[0.0, 0.0], [0.1, 0.1]])
    # dist_S = ||x - y|| / sqrt(|S|) = 0.1 in the full space and in each 1-D subspace.
    assert count_outliers(X, k=1, r=0.1) == 0
    assert count_outliers(X, k=1, r=0.099) == 2
    assert count_outliers(X, k=1, r=0.1, subspace=(1,)) == 0


@pytest.mark.parametrize("cap", [3, 40])
@pytest.mark.parametrize("d", [1, 2, 4, 10])
def test_capped_degrees_are_exact_below_the_cap(d, cap):
    rng = np.random.default_rng(d)
    # A dense cluster (cut short by the shortcuts) plus scattered rows.
    X = np.vstack([0.5 + 0.01 * rng.random((3000, d)), rng.random((300, d))])
    Y = scaled(X, None)
    r = 0.05
    exact = np.minimum(_degrees_tree(Y, r), cap)
    assert np.array_equal(degrees(Y, r, cap), exact)


def _degrees_tree(Y, r):
    # The count's predicate on every candidate a generous tree query proposes.
    from scipy.spatial import cKDTree

    lists = cKDTree(Y).query_ball_point(Y, r * 1.01)
    return np.array([np.count_nonzero(sq_dist(Y[c], Y[i][None, :]) <= r * r) - 1 for i, c in enumerate(lists)])


def test_ball_packing_matches_miniball_in_1d_2d_and_bounds_it_beyond():
    rng = np.random.default_rng(5)
    for trial in range(60):
        d = 1 + trial % 4
        P = rng.random((int(rng.integers(1, 11)), d))
        r = float(rng.uniform(0.1, 0.4))
        exact = largest_ball_subset(P, r)
        got = BallPacking(P, r).count(np.ones(len(P), bool))
        if d == 1:
            assert got == exact
        else:
            assert got >= exact


def test_bound_dominates_local_sensitivity_found_by_exhaustive_search():
    for X, k, r, beta in _small_windows(1, 40, n=(3, 10)):
        assert smooth_sensitivity(X, k, r, beta) >= local_sensitivity_brute(X, k, r)


def test_bound_equals_paper_algorithm_in_1d_and_bounds_it_in_2d():
    # 1-D: the exact clique number. 2-D: degeneracy + 1 (the exact angular sweep was not
    # 1-Lipschitz in floats: docs/privacy-count.md), an upper bound that is rarely loose on small windows.
    checked, ratios = 0, []
    for X, k, r, beta in _small_windows(2, 50, dims=(1, 2)):
        ours, paper = smooth_sensitivity(X, k, r, beta), smooth_oracle(X, k, r, beta)
        if X.shape[1] == 1:
            assert ours == pytest.approx(paper, rel=1e-9)
        else:
            assert ours >= paper * (1 - 1e-9)
            ratios.append(ours / paper)
        checked += 1
    assert checked == 50 and np.median(ratios) < 1.1


def test_bound_is_at_least_paper_algorithm_in_3_to_5_dims():
    ratios = []
    for X, k, r, beta in _small_windows(3, 24, dims=(3, 4, 5), n=(4, 11)):
        ours, paper = smooth_sensitivity(X, k, r, beta), smooth_oracle(X, k, r, beta)
        assert ours >= paper - 1e-12
        ratios.append(ours / paper)
    # Degeneracy + 1 is loose only when band rows crowd together; typically close.
    assert np.median(ratios) < 1.5


def test_bound_is_beta_smooth_between_neighbouring_windows():
    rng = np.random.default_rng(4)
    for X, k, r, beta in _small_windows(6, 40):
        s = smooth_sensitivity(X, k, r, beta)
        # Remove each row, and add rows near and far from the window.
        for i in range(len(X)):
            s2 = smooth_sensitivity(np.delete(X, i, axis=0), k, r, beta)
            assert s <= math.exp(beta) * s2 + 1e-9 and s2 <= math.exp(beta) * s + 1e-9
        for extra in (X[rng.integers(len(X))] + rng.normal(0, r / 2, X.shape[1]), rng.random(X.shape[1])):
            s2 = smooth_sensitivity(np.vstack([X, extra]), k, r, beta)
            assert s <= math.exp(beta) * s2 + 1e-9 and s2 <= math.exp(beta) * s + 1e-9


def test_bound_does_not_use_window_size_as_a_cap():
    # Two rows far apart, k = 3: both are outliers and stay so; the bound keeps t + 1
    # growth (up to 1/beta) instead of stopping at N = 2.
    X = np.array([[0.1], [0.9]])
    beta = 0.05
    assert smooth_sensitivity(X, k=3, r=0.01, beta=beta) > 2
    assert smooth_sensitivity(X, k=3, r=0.01, beta=beta) == pytest.approx(smooth_oracle(X, 3, 0.01, beta))


def test_large_window_bound_matches_slow_reference():
    # A window big enough to trigger the dense-region shortcuts and the branch and bound.
    rng = np.random.default_rng(8)
    X = np.vstack([0.5 + 0.05 * rng.standard_normal((4000, 2)), rng.random((40, 2))]).clip(0, 1)
    k, r, beta = 3, 0.02, 0.2
    Y = scaled(X, None)
    deg = _degrees_tree(Y, r)
    T = 60
    rows = deg <= k + T
    packing = BallPacking(Y[rows], r)  # checked against miniball above
    d = deg[rows]
    best = 0.0
    for t in range(T + 1):
        f = max(packing.count((d >= k - t) & (d <= k + t)), packing.count((d >= k - t - 1) & (d <= k + t - 1)))
        best = max(best, math.exp(-beta * t) * (f + t + 1))
    # Nothing past T can win: U_t <= |W| + t + 1.
    assert math.exp(-beta * (T + 1)) * (len(X) + T + 2) < best
    assert smooth_sensitivity(X, k, r, beta) == pytest.approx(best)


def test_kissing_numbers_are_upper_bounds():
    assert [kissing_number_bound(d) for d in (1, 2, 3, 4, 8, 24)] == [2, 6, 12, 24, 240, 196560]
    assert kissing_number_bound(10) == 553
    for d in range(1, 30):
        assert kissing_number_bound(d) <= 3**d - 1
        assert kissing_number_bound(d) >= {5: 40, 6: 72, 7: 126}.get(d, 0)
    with pytest.raises(ValueError, match="dimension"):
        kissing_number_bound(0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(k=0, r=0.1, beta=0.1), "k must"),
        (dict(k=2.5, r=0.1, beta=0.1), "k must"),
        (dict(k=1, r=0.0, beta=0.1), "r must"),
        (dict(k=1, r=0.1, beta=0.0), "beta must"),
        (dict(k=1, r=0.1, beta=0.1, subspace=(5,)), "subspace"),
        (dict(k=1, r=0.1, beta=0.1, subspace=(0, 0)), "distinct"),
    ],
)
def test_invalid_parameters_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        smooth_sensitivity(np.zeros((3, 2)), **kwargs)
