"""GridKNN: estimator behaviour, scoring, defaults, high dimensions."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.model import GridKNN
from monitor.model._defaults import feature_groups
from monitor.model._grid import NoisyGrid, neighbour_offsets

B2 = [(0.0, 100.0), (0.0, 100.0)]


def cluster(n=2000, d=2, seed=0):
    return np.random.default_rng(seed).normal(50, 5, size=(n, d))


def test_fit_returns_self_and_learned_state():
    m = GridKNN(bounds=B2, random_state=0)
    assert m.fit(cluster()) is m
    # d = 2, about 1,500 grid rows: the "tail" rule's one fine joint grid (bins^2 <= n eps / 4:
    # 18 x 18); 5 % of epsilon for the noisy size, the rest to the grid.
    assert [g.features for g in m.grids_] == [(0, 1)]
    assert m.grid_bins_ == (18,) and m.grid_epsilons_ == pytest.approx([0.95])
    # The rule before it: one coarse joint 2-D grid (5 x 5) and two fine one-feature grids.
    v4 = GridKNN(bounds=B2, random_state=0, layout_rule="v4").fit(cluster())
    assert [g.features for g in v4.grids_] == [(0, 1), (0,), (1,)]
    assert v4.grid_bins_ == (5, 32, 32) and v4.grid_epsilons_ == pytest.approx([0.95 / 3] * 3)
    assert m.epsilon_spent_ == 1.0 and m.size_epsilon_ == pytest.approx(0.05)
    assert abs(m.n_estimate_ - 2000) < 400  # Laplace(20): a miss of 400 has probability e^-20


@pytest.mark.parametrize("weighted", [False, True])
def test_far_points_score_higher_than_cluster(weighted):
    m = GridKNN(bounds=B2, weighted=weighted, random_state=1).fit(cluster())
    s = m.score_samples([[50, 50], [60, 40], [95, 5], [2, 98]])
    assert s[0] < s[2] and s[0] < s[3] and s[1] < s[2]


def test_score_samples_is_vectorised_consistently():
    m = GridKNN(bounds=[(0, 100)] * 5, random_state=2).fit(cluster(d=5))
    Y = np.random.default_rng(3).uniform(0, 100, (300, 5))
    batch = m.score_samples(Y)
    one_by_one = np.array([m.score_samples(y[None, :])[0] for y in Y])
    np.testing.assert_allclose(batch, one_by_one)


def test_values_outside_bounds_are_clipped():
    m = GridKNN(bounds=B2, random_state=4).fit(cluster())
    np.testing.assert_allclose(m.score_samples([[-500, 1e6]]), m.score_samples([[0, 100]]))


def test_predict_uses_explicit_threshold():
    m = GridKNN(bounds=B2, threshold=0.0, random_state=5).fit(cluster())
    assert m.threshold_ == 0.0
    s = m.score_samples([[50, 50], [95, 5]])
    assert m.predict([[50, 50], [95, 5]]).tolist() == (s > 0).astype(int).tolist()


def test_contamination_threshold_flags_about_that_rate_of_inliers():
    # Spread over many cells: scores are constant inside a cell, so a sample packed into
    # a few cells has atoms and no quantile can flag exactly 5 % of it.
    X = np.random.default_rng(6).normal(50, 15, (20000, 4))
    m = GridKNN(bounds=[(0, 100)] * 4, contamination=0.05, epsilon=2.0, random_state=6).fit(X)
    rate = m.predict(np.random.default_rng(7).normal(50, 15, (20000, 4))).mean()
    assert 0.03 < rate < 0.08
    assert m.predict([[99, 1, 99, 1]])[0] == 1


def test_predict_without_threshold_raises():
    m = GridKNN(bounds=B2, random_state=0).fit(cluster())
    with pytest.raises(ValueError, match="threshold"):
        m.predict([[1, 2]])


@pytest.mark.parametrize("kwargs, match", [
    ({"bounds": None}, "bounds"),
    ({"bounds": [(1, 0), (0, 1)]}, "max must be greater"),
    ({"bounds": B2, "epsilon": 0}, "epsilon"),
    ({"bounds": B2, "bins": 1}, "bins"),
    ({"bounds": B2, "contamination": 0.7}, "contamination"),
    ({"bounds": B2, "feature_names": ["a", "a"]}, "feature_names"),
])
def test_parameters_are_validated_in_fit(kwargs, match):
    m = GridKNN(**kwargs)  # construction never validates (scikit-learn convention)
    with pytest.raises(ValueError, match=match):
        m.fit(cluster())


def test_unfitted_model_refuses_to_score():
    with pytest.raises(RuntimeError, match="not fitted"):
        GridKNN(bounds=B2).score_samples([[1, 2]])


def test_v1_disjoint_groups_still_available():
    assert feature_groups(5, 2) == ((0, 1), (2, 3), (4,))
    assert sorted(i for g in feature_groups(31, 3) for i in g) == list(range(31))


def test_neighbour_offsets_are_the_l1_ball():
    offs = neighbour_offsets(2, 2)
    assert len(offs) == 13 and np.all(np.abs(offs).sum(axis=1) <= 2)
    assert len(neighbour_offsets(30, 1)) == 61  # no 3^30 enumeration


def test_algorithm1_basic_on_hand_made_grid():
    # 1-D grid of 4 cells; mass 3 in cell 0 and 10 in cell 2. Query 0.3 sits in cell 1,
    # 0.3 cells left of its centre: centres at distance 0.3 (own), 0.7 (cell 0), 1.3
    # (cell 2); reaches (+ half a cell) 0.8, 1.2, 1.8. With k = 5: Q = 3 after cell 0,
    # reaches 5 two tenths into cell 2's ring [1.2, 1.8]: radius 1.32 cells.
    g = NoisyGrid((0,), 4, np.array([0, 2]), np.array([3.0, 10.0]))
    assert g.score(np.array([[0.3]]), k=5, depth=1, weighted=False)[0] == pytest.approx(1.32 / 4)
    # Weighted: 3 units over [0.8, 1.2] (mean 1.0), 2 units over [1.2, 1.32] (mean 1.26).
    assert g.score(np.array([[0.3]]), k=5, depth=1, weighted=True)[0] == pytest.approx((3 * 1.0 + 2 * 1.26) / 5 / 4)
    # k never reached within depth 1 (13 < 20): search radius + missing fraction of k.
    assert g.score(np.array([[0.3]]), k=20, depth=1, weighted=False)[0] == pytest.approx((1.8 + 7 / 20) / 4)


def test_thirty_dimensions_dense_and_one_big_sparse_grid():
    rng = np.random.default_rng(8)
    X = rng.normal(0.5, 0.05, (3000, 30))
    b30 = [(0, 1)] * 30
    m = GridKNN(bounds=b30, random_state=8).fit(X)
    # 3,000 rows (about 2,250 in the grids): n * epsilon affords 79 grids of 27 cells. The tail
    # rule wants each of 30 features in about 3 joint grids (at most 24) and no one-feature grid;
    # the v4 rule 16 joint grids (about 2 a feature) and 16 one-feature grids.
    assert len(m.grids_) == 24 and sum(len(g) == 3 for g in m.groups_) == 24
    v4 = GridKNN(bounds=b30, random_state=8, layout_rule="v4").fit(X)
    assert len(v4.grids_) == 32 and sum(len(g) == 3 for g in v4.groups_) == 16
    s = m.score_samples(np.vstack([np.full(30, 0.5), np.full(30, 0.02)]))
    assert s[0] < s[1]
    # One 30-D grid of 2^30 cells: only the sparse simulation can fit it.
    X = rng.normal(0.3, 0.05, (3000, 30))  # about half the records in the all-low corner cell
    big = GridKNN(bounds=b30, group_size=30, bins=2, max_depth=1, n_grids=1, marginals=0, random_state=9).fit(X)
    assert big.grids_[0].n_cells == 2**30 and big.grids_[0].keys.size < 10_000
    s = big.score_samples(np.vstack([np.full(30, 0.3), np.full(30, 0.9)]))
    assert s[0] < s[1]
