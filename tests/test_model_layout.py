"""The default layout and post-processing thresholds (docs/model.md)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from monitor.model import GridKNN, ModelFileError, default_layout, set_file_threshold
from monitor.model._defaults import EPSILON_CAP, K_MIN, MANY_D, MAX_MARGINALS, SIZE_SHARE, feature_groups, min_grids
from monitor.model.file import _canonical


def _fit(X, eps, seed, **kw):
    return GridKNN(bounds=[(0.0, 1.0)] * X.shape[1], epsilon=eps, random_state=seed, **kw).fit(X)


@pytest.mark.parametrize("d, eps", [(3, 0.1), (6, 1.0), (10, 0.5), (32, 2.0)])
def test_layout_is_a_function_of_public_settings_and_the_noisy_size_only(d, eps):
    # Two unrelated data sets of the same size, d, epsilon and bounds, and the same noise
    # seed: the same noisy size, so the same grids, bins, k and depth. Only the noisy
    # cell values may differ. Any data set: the layout is default_layout of the release.
    A = np.random.default_rng(1).uniform(0, 1, (500, d))
    B = np.random.default_rng(2).normal(0.2, 0.05, (500, d)) ** 2
    a, b = _fit(A, eps, 3), _fit(B, eps, 3)
    assert a.n_estimate_ == b.n_estimate_
    assert a.groups_ == b.groups_ and a.grid_bins_ == b.grid_bins_
    assert (a.k_, a.max_depth_) == (b.k_, b.max_depth_)
    c = _fit(np.random.default_rng(4).uniform(0, 1, (3000, d)), eps, 5)
    for m in (a, c):
        lay = default_layout(d, eps * (1 - SIZE_SHARE), m.grid_rows_estimate_)  # the grids get the rows not held apart
        assert (m.groups_, m.grid_bins_, m.k_, m.max_depth_) == (lay.groups, lay.bins, lay.k, lay.depth)
        assert [g.features for g in m.grids_] == list(m.groups_)


def test_size_release_is_drawn_by_the_noise_source_and_charged():
    # The size is the only new release: centred on the row count, Laplace(1 / (0.05 eps)).
    X = np.random.default_rng(6).uniform(0, 1, (400, 4))
    # The size is released before any split (calibration_share 0 skips the histograms: faster)
    est = np.array([_fit(X, 2.0, s, calibration_share=0.0).n_estimate_ for s in range(300)])
    assert abs(np.median(est) - 400) < 3 and np.mean(np.abs(est - 400)) == pytest.approx(10, rel=0.15)


def test_every_feature_is_in_a_joint_grid_and_three_features_share_one():
    lay = default_layout(3, 1.0, n=1000)
    assert lay.groups[0] == (0, 1, 2)  # the first rule split 3 features 2 + 1
    for d in (4, 9, 21, 64):
        lay = default_layout(d, 1.0, n=5000)
        joint = [g for g in lay.groups if len(g) > 1]
        if len(joint) * 3 >= d:
            assert sorted({f for g in joint for f in g}) == list(range(d))
        # a fine one-feature grid for every feature (up to MAX_MARGINALS); from MANY_D features the
        # joint grids only (single-feature rarity is common among normal rows there)
        assert len([g for g in lay.groups if len(g) == 1]) == (min(d, MAX_MARGINALS) if d < MANY_D else 0)
        v4 = default_layout(d, 1.0, n=5000, rule="v4")
        assert len([g for g in v4.groups if len(g) == 1]) == min(d, MAX_MARGINALS)
    assert sorted({f for g in feature_groups(40, 3, 30) for f in g}) == list(range(40))


def test_joint_grids_keep_declared_neighbours_together_then_mix_distant_features():
    groups = feature_groups(32, 3, 16)
    # the first cover: windows of consecutive features in the public order
    assert groups[:11] == tuple(tuple(sorted({(s + t) % 32 for t in range(3)})) for s in range(0, 32, 3))
    # the rest: bagged, so features far apart in that order share a grid (letter, docs/model.md)
    assert any(max(g) - min(g) > 3 for g in groups[11:])
    assert len(set(groups)) == len(groups)
    # few combinations (d = 4): no grid repeats while another combination is left
    assert sorted(feature_groups(4, 3, 4)) == [(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)]
    assert feature_groups(4, 3, 5)[:4] == feature_groups(4, 3, 4)  # then a repeat: nothing else is left
    assert feature_groups(32, 3, 16) == groups  # from public settings only: the same every time


@pytest.mark.parametrize("d", [1, 2, 8, 30, 64])
@pytest.mark.parametrize("n", [20, 300, 5000, 100000])
def test_more_budget_never_coarsens_the_layout_and_it_is_fixed_above_the_cap(d, n):
    # For a given size, more epsilon gives at least as many grids and bins at least as fine
    # (so more budget can only add detail on top of less noise), and above the cap the
    # same layout: there more budget only lowers the noise.
    # Under the "tail" rule a larger budget may trade the coarse grids for ONE fine joint
    # grid over every feature (d <= 4): then its bins are at least the joint grids' before.
    lays = [default_layout(d, e, n) for e in (0.05, 0.1, 0.2, 0.5, 1.0)]
    for lo, hi in zip(lays, lays[1:]):
        if len(hi.groups) == 1 and len(hi.groups[0]) == d > 1:
            assert hi.bins[0] >= lo.bins[0]
            continue
        assert len(hi.groups) >= len(lo.groups) and min(hi.bins) >= min(lo.bins)
    v4 = [default_layout(d, e, n, rule="v4") for e in (0.05, 0.1, 0.2, 0.5, 1.0)]
    for lo, hi in zip(v4, v4[1:]):
        assert len(hi.groups) >= len(lo.groups) and min(hi.bins) >= min(lo.bins)
    assert min(lay.k for lay in lays) >= K_MIN
    assert default_layout(d, EPSILON_CAP, n) == default_layout(d, 5.0, n) == default_layout(d, 50.0, n)


def test_small_budget_or_small_size_gives_few_coarse_grids_that_all_keep_cells():
    # The first rule: at eps 0.1 on 166 features, 83 grids and k = 830 left 11 grids empty.
    # Every grid's average cell count is at least one noise scale: none is left empty.
    X = np.random.default_rng(5).normal(0.5, 0.1, (3000, 166))
    m = _fit(X, 0.1, 6)
    assert len(m.grids_) * 27 <= max(m.grid_rows_estimate_, 1) * 0.095 or len(m.grids_) == 3
    assert all(g.keys.size > 0 for g in m.grids_)
    s = m.score_samples(np.vstack([np.full(166, 0.5), np.full(166, 0.98)]))
    assert s[0] < s[1]
    assert [len(g) for g in default_layout(13, 1.0, n=60).groups] == [3, 3, 3]  # 95 wine records: 3 grids


def test_min_grids_bounds_every_layout_so_the_report_cost_is_known_before_the_fit():
    # config.report_cost charges the report's grid part when the model has more than one
    # grid; the count depends on the noisy size, but never drops below min_grids(d).
    # The "tail" rule's one fine joint grid (2 <= d <= 4, large n) is one grid: the config
    # then charges a grid part that such a model never releases (safe: more, never less).
    for d in (1, 2, 3, 5, 40):
        counts = [len(default_layout(d, e, n, rule="v4").groups) for e in (0.01, 0.3, 5.0) for n in (-50, 1, 80, 10**6)]
        assert min(counts) == min_grids(d)
        assert (min_grids(d) > 1) == (d > 1)
        tail = [default_layout(d, e, n) for e in (0.01, 0.3, 5.0) for n in (-50, 1, 80, 10**6)]
        assert all(len(t.groups) >= min_grids(d) or (len(t.groups) == 1 and len(t.groups[0]) == d) for t in tail)


@pytest.mark.parametrize("d, eps", [(1, 0.3), (7, 1.0), (30, 0.2), (64, 5.0)])
def test_epsilons_add_up_to_the_model_epsilon(d, eps, tmp_path):
    # Basic composition: the size release and the per-grid budgets sum to the fit's
    # epsilon, in the model and in the file (whose loader checks it).
    m = _fit(np.random.default_rng(7).uniform(0, 1, (200, d)), eps, 8)
    assert len(m.grid_epsilons_) == len(m.grids_)
    assert sum(m.grid_epsilons_) + m.size_epsilon_ == pytest.approx(eps, rel=1e-12)
    m.save(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    private = doc["private"]
    assert (sum(g["epsilon"] for g in private["grids"]) + private["size"]["epsilon"]
            == pytest.approx(private["privacy"]["epsilon"]))
    assert private["privacy"]["delta"] == 0.0


def test_model_file_holds_no_raw_count(tmp_path):
    # Integer-valued data in few cells: raw counts would be integers; every stored value is
    # a noisy (non-integer) mass, the size is noisy too, and no other field carries
    # per-cell numbers.
    X = np.random.default_rng(9).integers(0, 3, (2000, 4)).astype(float) / 2
    m = _fit(X, 1.0, 10, contamination=0.05)
    m.save(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    cal = doc["private"]["calibration"]  # the held-apart rows' score histograms: noisy too
    values = np.concatenate([g["values"] for g in doc["private"]["grids"]] + [[doc["private"]["size"]["value"]]]
                            + [h["values"] for h in [cal["score"], *cal["grids"]]])
    assert values.size > 0 and not np.any(np.isclose(values, np.round(values), rtol=0.0, atol=1e-9))
    assert set(doc["private"]["grids"][0]) == {"features", "bins", "epsilon", "keys", "values"}
    assert "count" not in json.dumps(doc).lower()


# -- thresholds are post-processing ---------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    X = np.random.default_rng(11).normal(0.5, 0.1, (3000, 3))
    m = _fit(X, 1.0, 12, contamination=0.05)
    path = tmp_path / "m.json"
    m.save(path)
    return m, path


def test_set_file_threshold_rewrites_only_the_scoring_part(saved):
    m, path = saved
    before = json.loads(path.read_text())
    m2 = set_file_threshold(path, threshold=0.123)
    after = json.loads(path.read_text())
    assert after["private"] == before["private"] and after["sha256"] == before["sha256"]
    assert after["scoring"]["threshold"] == 0.123 and m2.threshold_ == 0.123
    assert GridKNN.load(path).threshold_ == 0.123
    # Back to a contamination rate: the same threshold as the fit computed (deterministic).
    assert set_file_threshold(path, contamination=0.05).threshold_ == pytest.approx(m.threshold_)
    with pytest.raises(ModelFileError, match="contamination"):
        set_file_threshold(path, contamination=0.7)


def test_threshold_edited_by_hand_loads_but_grids_edited_are_refused(saved):
    _, path = saved
    doc = json.loads(path.read_text())
    doc["scoring"]["threshold"] = 2.5
    path.write_text(json.dumps(doc))
    assert GridKNN.load(path).threshold_ == 2.5
    doc["private"]["grids"][0]["values"][0] += 1.0
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match="checksum"):
        GridKNN.load(path)


def test_contamination_flags_about_that_rate_with_overlapping_grids():
    # 8 features: joint grids overlap and one-feature grids repeat features; the synthetic
    # sample must still follow the model's mass, or the rate would be far off.
    rng = np.random.default_rng(13)
    Z = rng.normal(0, 1, (20000, 3))
    X = np.clip(0.5 + 0.12 * np.c_[Z, Z[:, :2] + 0.5 * rng.normal(0, 1, (20000, 2)), rng.normal(0, 1, (20000, 3))],
                0, 1)
    m = _fit(X, 2.0, 14, contamination=0.05)
    Z = rng.normal(0, 1, (20000, 3))
    Y = np.clip(0.5 + 0.12 * np.c_[Z, Z[:, :2] + 0.5 * rng.normal(0, 1, (20000, 2)), rng.normal(0, 1, (20000, 3))],
                0, 1)
    assert 0.02 < m.predict(Y).mean() < 0.10


def test_version_1_file_still_loads_with_the_same_ranking(tmp_path):
    # A v1 file (one checksum over everything, threshold in unit-cube distance) from a
    # model with one 2-D grid: same scores up to the unit, threshold converted.
    X = np.random.default_rng(15).normal(0.5, 0.1, (2000, 2))
    m = _fit(X, 1.0, 16, bins=6, marginals=0, threshold=0.4)
    g = m.grids_[0]
    content = {"features": [{"name": "x0", "min": 0.0, "max": 1.0}, {"name": "x1", "min": 0.0, "max": 1.0}],
               "parameters": {"bins": 6, "k": m.k_, "max_depth": 2, "weighted": False, "group_size": 2,
                              "contamination": None},
               "privacy": {"epsilon": 1.0, "delta": 0.0, "mechanism": "laplace_grid", "unit": "x"},
               "threshold": 0.4 / 6,
               "grids": [{"features": [0, 1], "bins": 6, "keys": g.keys.tolist(), "values": g.values.tolist()}]}
    doc = {"format": "dp-grid-knn", "version": 1, "sha256": hashlib.sha256(_canonical(content)).hexdigest(),
           "content": content}
    (tmp_path / "v1.json").write_text(json.dumps(doc))
    old = GridKNN.load(tmp_path / "v1.json")
    Y = np.random.default_rng(17).uniform(0, 1, (300, 2))
    np.testing.assert_allclose(old.score_samples(Y), m.score_samples(Y))
    assert old.threshold_ == pytest.approx(0.4)
    with pytest.raises(ModelFileError, match="refit"):
        set_file_threshold(tmp_path / "v1.json", threshold=1.0)
