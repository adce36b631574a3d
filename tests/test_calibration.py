"""Calibrated flag rates (docs/model.md): the held-apart part, its histogram's guarantee, the file."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from monitor.dp import noise_source
from monitor.model import GridKNN, ModelFileError
from monitor.model._defaults import SIZE_SHARE
from monitor.model.calibration import (ScoreHistogram, bin_index, laplace_sum_accuracy, public_edges, score_edges,
                                       split_rows)
from monitor.model.file import _canonical

BOUNDS = [(0.0, 100.0)] * 3


def _normal(n, seed):
    return np.random.default_rng(seed).normal(50, 12, (n, 3))


# -- the split -----------------------------------------------------------------------------
def test_split_depends_on_each_row_only_so_a_neighbour_moves_no_other_row():
    X = np.random.default_rng(0).integers(0, 4, (3000, 2)).astype(float)  # many identical rows
    held = split_rows(X, 0.25, 0)
    assert 0.2 < held.mean() < 0.3  # identical rows are split too, not sent to one part together

    def parts(X, held):
        return sorted((tuple(r), bool(h)) for r, h in zip(X.tolist(), held))

    base = parts(X, held)
    for extra in (X[17], np.array([99.0, -0.0]), X[0]):  # a copy of an existing row, a new row, another copy
        X2 = np.insert(X, 5, extra, axis=0)  # inserted in the middle: positions shift
        p2 = parts(X2, split_rows(X2, 0.25, 0))
        for item in base:  # every old (row, part) pair is still there ...
            p2.remove(item)
        assert len(p2) == 1 and p2[0][0] == tuple(extra.tolist())  # ... and only the added row is new
    X3 = np.delete(X, 100, axis=0)
    p3 = parts(X3, split_rows(X3, 0.25, 0))
    left = list(base)
    for item in p3:
        left.remove(item)
    assert len(left) == 1 and left[0][0] == tuple(X[100].tolist())
    assert parts(X[::-1], split_rows(X[::-1], 0.25, 0)) == base  # the row order does not matter
    assert not np.array_equal(split_rows(X, 0.25, 1), held)  # the public seed does


def test_held_apart_rows_are_disjoint_from_the_grids_rows():
    X = _normal(4000, 1)
    m = GridKNN(epsilon=1e6, bounds=BOUNDS, marginals=3, random_state=0).fit(X)  # noise negligible
    from monitor.features import scale_to_unit

    held = split_rows(scale_to_unit(X, np.array(BOUNDS)), m.calibration_share_, 0)
    assert 800 < held.sum() < 1200
    for g in m.grids_:  # every grid counts exactly the rows not held apart
        assert abs(g.values.sum() - (~held).sum()) < 1.0
    assert abs(m.calibration_.score.total - held.sum()) < 1.0
    for h in m.calibration_.grids:
        assert abs(h.counts.sum() - held.sum()) < 1.0


# -- the histogram's guarantee ---------------------------------------------------------------
DEGENERATE = np.array([0.0, -0.0, -1e-300, 5e-324, 1.0, 2.25, 4.0, 4.0 + 1e-12, 1e308, np.nextafter(1.0, 0.0)])


def test_every_float_falls_in_exactly_one_bin_edges_included():
    edges = score_edges(4.0, 4)  # [0, 0.25, 1, 2.25, 4]
    idx = bin_index(DEGENERATE, edges)
    assert idx.tolist() == [0, 0, 0, 0, 2, 3, 3, 3, 3, 1]
    assert np.bincount(idx, minlength=4).sum() == DEGENERATE.size


@pytest.mark.parametrize("extra", DEGENERATE.tolist())
def test_neighbouring_score_sets_give_output_densities_within_e_epsilon(extra):
    eps = 0.7
    scores = np.random.default_rng(2).gamma(2.0, 0.4, 300)
    edges = public_edges(4.0, np.random.default_rng(3).gamma(2.0, 0.4, 5000))
    true = np.bincount(bin_index(scores, edges), minlength=len(edges) - 1)
    true2 = np.bincount(bin_index(np.r_[scores, extra], edges), minlength=len(edges) - 1)
    assert np.abs(true2 - true).sum() == 1  # one row moves one bin by one: sensitivity 1
    worst = 0.0
    for seed in range(200):
        out = ScoreHistogram.release(scores, edges, eps, noise_source(seed)).counts
        # log density ratio of the Laplace outputs under the two neighbours
        ratio = eps * (np.abs(out - true2).sum() - np.abs(out - true).sum())
        worst = max(worst, abs(ratio))
    assert worst <= eps + 1e-9
    assert worst > 0.5 * eps  # the bound is approached, so the check could fail


def test_every_bin_gets_noise_from_the_noise_source_even_empty_ones():
    edges = score_edges(4.0, 16)
    h = ScoreHistogram.release(np.zeros(50), edges, 1.0, noise_source(0))
    assert np.all(h.counts[1:] != 0.0)  # empty bins are noisy too, or occupancy would leak
    h_prod = ScoreHistogram.release(np.zeros(50), edges, 1.0, noise_source(None))  # OpenDP
    assert h_prod.counts.shape == (16,) and np.all(np.isfinite(h_prod.counts))


@pytest.mark.parametrize("j", [1, 2, 3, 5, 10, 40, 200])
def test_rank_accuracy_bounds_the_noise_of_a_tail_count(j):
    draws = np.abs(np.random.default_rng(j).laplace(0.0, 1.3, (40000, j)).sum(axis=1))
    assert np.quantile(draws, 0.95) <= laplace_sum_accuracy(j, 1.3)
    assert np.quantile(draws, 0.95) >= 0.85 * laplace_sum_accuracy(j, 1.3)  # and is not loose


def test_shares_are_monotone_and_thresholds_invert_them():
    s = np.random.default_rng(4).gamma(3.0, 0.3, 20000)
    h = ScoreHistogram.release(s, public_edges(4.4, s[:5000]), 1.0, noise_source(5))
    t = np.linspace(-1, 6, 500)
    share = h.share_above(t)
    assert np.all(np.diff(share) <= 1e-12) and share[0] == 1.0 and share[-1] == 0.0
    for c in (0.001, 0.01, 0.05, 0.2, 0.5):
        thr = h.threshold_for(c)
        assert h.share_above(thr) == pytest.approx(c, abs=1e-9)
        assert abs((s > thr).mean() - c) < max(0.2 * c, 0.0015)


def _small_parts(seeds, rows=600):
    """Histograms of a small held-apart part (as on the shared sets: 600 rows, epsilon 0.71) of a
    gamma-tailed score, with a large sample of the same scores to measure the realised shares."""
    edges = public_edges(4.4, np.random.default_rng(100).gamma(2.0, 0.15, 20000))
    fresh = np.random.default_rng(101).gamma(2.0, 0.15, 400_000)
    parts = [ScoreHistogram.release(np.random.default_rng(seed).gamma(2.0, 0.15, rows), edges, 0.71,
                                    noise_source(seed)) for seed in seeds]
    return parts, fresh


def test_rare_shares_of_a_small_part_follow_a_fitted_tail_not_the_noise():
    # 0.2 % of 600 rows is 1.2 rows under a tail noise of about +-10: counting alone put the
    # threshold where the noise of the empty top bins lay, flagging no normal event at all.
    parts, fresh = _small_parts(range(30))
    for c in (0.002, 0.005):
        fitted = np.array([(fresh > h.threshold_for(c)).mean() / c for h in parts])
        counted = []
        for h in parts:
            bare = ScoreHistogram(h.edges, h.counts, h.epsilon)
            object.__setattr__(bare, "tail_", None)
            counted.append((fresh > bare.threshold_for(c)).mean() / c)
        counted = np.array(counted)
        assert all(h.tail_ is not None for h in parts)
        assert 0.5 <= np.median(fitted) <= 2.0, np.median(fitted)
        assert np.mean((fitted >= 0.25) & (fitted <= 4.0)) >= 0.8, fitted
        assert np.mean(counted < 0.25) > 0.3 and np.mean(fitted < 0.25) < 0.1  # counted: often next to none


def test_the_fitted_tail_is_continuous_monotone_and_inverted_exactly():
    parts, _ = _small_parts(range(5))
    for h in parts:
        a, s = h.tail_
        anchor = h.edges[a]
        assert h.count_above(anchor) == pytest.approx(h.count_above(np.nextafter(anchor, np.inf)), rel=1e-9)
        t = np.linspace(anchor - 0.5, h.edges[-1] + 1.0, 2001)
        share = h.share_above(t)
        assert np.all(np.diff(share) <= 0)
        assert h.share_above(h.edges[-1]) == 0.0  # nothing scores at or above the score's largest value
        for c in (0.0005, 0.002, 0.005, 0.01):
            thr = h.threshold_for(c)
            if thr < h.edges[-1]:
                assert h.share_above(thr) == pytest.approx(c, rel=1e-9)
        again = ScoreHistogram.from_dict(json.loads(json.dumps(h.as_dict())))
        assert again.threshold_for(0.002) == h.threshold_for(0.002)  # derived, so a file needs nothing new


def test_a_part_large_enough_to_count_every_share_keeps_the_counted_tail():
    # With no edge untrusted below the last one there is nothing to model; with none trusted
    # (noise only) there is nothing to anchor on.
    edges = score_edges(4.0, 4)
    big = ScoreHistogram(edges, np.array([4e6, 3e6, 2e6, 1e6]), 1.0)
    assert big.tail_ is None and big.threshold_for(0.1) == pytest.approx(2.25)
    noise = ScoreHistogram(edges, np.array([3.0, 0.5, 1.0, 2.0]), 0.5)
    assert noise.tail_ is None


# -- the model -------------------------------------------------------------------------------
def test_contamination_flags_that_share_of_unseen_normal_data():
    m = GridKNN(epsilon=1.0, bounds=BOUNDS, random_state=0).fit(_normal(20000, 6))
    Y = _normal(50000, 7)
    s = m.score_samples(Y)
    for c in (0.01, 0.05):
        acc = m.rate_accuracy(c)
        assert acc.enough, acc
        assert c / 2 <= (s > m.threshold_for(c)).mean() <= 2 * c
        assert m.normal_share_above(m.threshold_for(c)) == pytest.approx(c, abs=1e-9)
    # Each grid's own histogram has a quarter of the budget split over the grids: noisier.
    flagged = m.grid_scores(Y) > m.grid_thresholds(0.05)[None, :]
    assert np.all((flagged.mean(axis=0) > 0.0125) & (flagged.mean(axis=0) < 0.1))


def test_epsilon_of_each_part_adds_up_to_the_model_epsilon():
    m = GridKNN(epsilon=2.0, bounds=BOUNDS, random_state=0).fit(_normal(3000, 8))
    assert m.size_epsilon_ == pytest.approx(2.0 * SIZE_SHARE)
    assert m.size_epsilon_ + sum(m.grid_epsilons_) == pytest.approx(2.0)
    assert m.size_epsilon_ + m.calibration_.epsilon == pytest.approx(2.0)
    assert len(m.calibration_.grids) == len(m.grids_)


def test_a_small_reference_set_is_said_too_small_for_a_rare_rate():
    m = GridKNN(epsilon=1.0, bounds=BOUNDS, random_state=0).fit(_normal(400, 9))
    acc = m.rate_accuracy(0.01)
    assert not acc.enough and acc.rows_needed > acc.rows
    assert m.rate_accuracy(0.3).enough or m.rate_accuracy(0.3).rows_needed < acc.rows_needed


def test_uncalibrated_model_keeps_the_old_thresholds_and_refuses_shares():
    m = GridKNN(epsilon=1.0, bounds=BOUNDS, calibration_share=0.0, contamination=0.05, random_state=0).fit(_normal(3000, 10))
    assert m.calibration_ is None and m.threshold_ > 0 and m.rate_accuracy(0.05) is None
    with pytest.raises(ValueError, match="refit"):
        m.normal_share_above(1.0)


# -- the file ---------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    m = GridKNN(epsilon=1.0, bounds=BOUNDS, contamination=0.05, random_state=0).fit(_normal(3000, 11))
    path = tmp_path / "model.json"
    m.save(path)
    return m, path


def test_calibration_round_trips_through_the_file(saved):
    m, path = saved
    m2 = GridKNN.load(path)
    doc = json.loads(path.read_text())
    assert doc["version"] == 4 and doc["private"]["calibration"]["share"] == m.calibration_share_
    assert doc["private"]["calibration"]["mechanism"] == "laplace_histogram"
    assert m2.threshold_ == m.threshold_
    np.testing.assert_array_equal(m2.grid_thresholds(0.02), m.grid_thresholds(0.02))
    assert m2.normal_share_above(0.7) == m.normal_share_above(0.7)
    assert m2.rate_accuracy(0.05) == m.rate_accuracy(0.05)


def _rewrite(path, edit):
    doc = json.loads(path.read_text())
    edit(doc)
    doc["sha256"] = hashlib.sha256(_canonical(doc["private"])).hexdigest()
    path.write_text(json.dumps(doc))


def test_version_3_file_loads_uncalibrated(saved):
    m, path = saved

    def to_v3(doc):
        doc["version"] = 3
        del doc["private"]["calibration"]

    _rewrite(path, to_v3)
    old = GridKNN.load(path)
    assert old.calibration_ is None and old.threshold_ is not None


def test_calibration_that_overspends_is_refused(saved):
    m, path = saved
    _rewrite(path, lambda doc: doc["private"]["calibration"]["score"].update(epsilon=5.0))
    with pytest.raises(ModelFileError, match="held-apart rows"):
        GridKNN.load(path)


def test_estimator_and_file_do_not_import_each_other():
    root = Path(__file__).resolve().parent.parent / "monitor" / "model"

    def imports(name):
        tree = ast.parse((root / name).read_text())
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}

    assert "monitor.model.file" not in imports("estimator.py")
    assert "monitor.model.estimator" not in imports("_format.py")
    assert "monitor.model.file" not in imports("_format.py")


def test_a_public_prior_keeps_a_tiny_held_apart_part_from_flagging_on_noise_alone():
    # 8 held-apart rows: the histogram is mostly noise. The prior (shares of a public sample)
    # counts as many pseudo-rows as the total's noise bound, so the shares stay sane; on a
    # large part it changes little.
    edges = public_edges(4.0, np.random.default_rng(0).gamma(2.0, 0.3, 20000))
    public = np.random.default_rng(1).gamma(2.0, 0.3, 20000)
    with_prior, without = [], []
    for seed in range(20):
        rows = np.random.default_rng(seed).gamma(2.0, 0.3, 8)
        tiny = ScoreHistogram.release(rows, edges, 0.7, noise_source(seed), public)
        bare = ScoreHistogram.release(rows, edges, 0.7, noise_source(seed))
        with_prior.append(float((public > tiny.threshold_for(0.05)).mean()))
        without.append(float((public > bare.threshold_for(0.05)).mean()))
    assert max(with_prior) <= 0.1 and max(without) > 0.3  # noise alone once flagged over half
    s = np.random.default_rng(2).gamma(2.0, 0.3, 20000)
    wrong = np.random.default_rng(3).gamma(2.0, 0.6, 20000)  # a prior twice too wide
    big = ScoreHistogram.release(s, edges, 0.7, noise_source(4), wrong)
    assert big.prior_rows < 20 and abs(float((s > big.threshold_for(0.05)).mean()) - 0.05) < 0.005
    again = ScoreHistogram.from_dict(json.loads(json.dumps(big.as_dict())))
    assert again.threshold_for(0.05) == big.threshold_for(0.05)
