"""Private releases of the count and the top-h subspaces."""

import dataclasses
import math

import numpy as np
import pytest

from monitor.dp import Release
from monitor.outliers import (
    CountRelease,
    ParameterError,
    choose_mechanism,
    count_outliers,
    global_sensitivity_bound,
    private_count,
    private_top_subspaces,
    smooth_sensitivity,
)
from monitor.outliers.mechanisms import _smooth_params, student_t_float_loss


@pytest.fixture(scope="module")
def window():
    rng = np.random.default_rng(0)
    return np.vstack([0.5 + 0.03 * rng.standard_normal((400, 3)), rng.random((8, 3))]).clip(0, 1)


def test_release_is_frozen_and_hides_sensitivity(window):
    rel = private_count(window, k=3, r=0.05, epsilon=1.0, delta=1e-6, mechanism="laplace", rng=0)
    assert isinstance(rel, CountRelease) and isinstance(rel, Release)
    fields = {f.name for f in dataclasses.fields(rel)}
    assert fields == {"value", "epsilon", "delta", "mechanism", "accuracy", "subspace"}
    assert rel.accuracy is None  # the smooth bound's scale follows the window: never published
    with pytest.raises(dataclasses.FrozenInstanceError):
        rel.value = 0.0
    assert rel.as_dict()["mechanism"] == "laplace_smooth"


@pytest.mark.parametrize(
    "mechanism, name, delta_spent",
    [("global", "laplace_global", 0.0), ("laplace", "laplace_smooth", 1e-6),
     ("gaussian", "gaussian_smooth", 1e-6), ("student_t", "student_t_smooth_snapped", 0.0)],
)
def test_each_mechanism_is_centred_with_the_documented_spread(window, mechanism, name, delta_spent):
    k, r, eps, delta = 3, 0.05, 1.0, 1e-6
    rel = private_count(window, k, r, eps, delta, subspace=(0, 1), mechanism=mechanism, rng=1)
    assert (rel.mechanism, rel.delta, rel.subspace) == (name, delta_spent, (0, 1))
    q = count_outliers(window, k, r, (0, 1))
    gs = global_sensitivity_bound(k, 2)
    if mechanism == "global":
        std = math.sqrt(2) * gs / eps
    else:
        beta, div = _smooth_params(mechanism, eps, delta)
        s = min(smooth_sensitivity(window, k, r, beta, (0, 1)), gs)
        std = {"laplace": math.sqrt(2), "gaussian": 1.0, "student_t": math.sqrt(3)}[mechanism] * s / div
    values = np.array([private_count(window, k, r, eps, delta, (0, 1), mechanism, rng=seed).value for seed in range(300)])
    assert abs(np.median(values) - q) < 0.25 * std
    assert 0.6 * std < values.std() < 1.6 * std


def test_paper_gaussian_is_much_noisier_than_laplace_smooth():
    beta_l, div_l = _smooth_params("laplace", 1.0, 0.01)
    beta_g, div_g = _smooth_params("gaussian", 1.0, 0.01)
    # Noise per unit of S at eps = 1, delta = 0.01: smooth Laplace 2.83, the paper's Gaussian 16.3.
    assert math.sqrt(2) / div_l == pytest.approx(2.83, abs=0.01)
    assert 1.0 / div_g == pytest.approx(16.3, abs=0.1)
    assert beta_l == pytest.approx(0.094, abs=0.001) and beta_g == pytest.approx(0.040, abs=0.001)


def test_student_t_parameters_satisfy_bun_steinke():
    eps = 0.7
    beta, s = _smooth_params("student_t", eps, 0.0)
    nu = 3
    # Bun & Steinke's epsilon plus the charged float loss of the snapped release.
    loss = student_t_float_loss(eps)[0]
    assert (nu + 1) * beta + (nu + 1) * s / (2 * math.sqrt(nu)) + loss == pytest.approx(eps, rel=1e-12)


def test_auto_depends_on_public_parameters_only(window):
    other = np.random.default_rng(9).random((50, 3))
    for eps, delta, sub in [(1.0, 1e-6, None), (0.1, 1e-6, (0,)), (1.0, 0.0, (0, 1)), (2.0, 1e-3, None)]:
        a = private_count(window, 3, 0.05, eps, delta, sub, rng=0).mechanism
        b = private_count(other, 3, 0.05, eps, delta, sub, rng=0).mechanism
        assert a == b
    assert choose_mechanism(1.0, 1e-6, k=3, dim=1) == "global"
    assert choose_mechanism(1.0, 1e-6, k=3, dim=8) != "global"
    # With delta = 0 only the pure mechanisms are candidates.
    assert choose_mechanism(1.0, 0.0, k=3, dim=8) in ("global", "student_t")
    assert private_count(window, 3, 0.05, 1.0, 0.0, rng=0).delta == 0.0


def test_empty_window_releases_noise_around_zero():
    rel = private_count(np.zeros((0, 2)), 3, 0.05, 1.0, 1e-6, mechanism="laplace", rng=0)
    assert math.isfinite(rel.value)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(epsilon=0.0, delta=1e-6), "epsilon"),
        (dict(epsilon=1.0, delta=1.0), "delta"),
        (dict(epsilon=1.0, delta=0.0, mechanism="laplace"), "delta"),
        (dict(epsilon=1.0, delta=1e-6, mechanism="cauchy"), "mechanism"),
    ],
)
def test_private_count_validates(window, kwargs, match):
    # A MonitorError: the CLI prints it without a traceback.
    with pytest.raises(ParameterError, match=match):
        private_count(window, 3, 0.05, **kwargs)


def test_production_noise_path_runs_without_seed(window):
    rel = private_count(window, 3, 0.05, 1.0, 1e-6, mechanism="student_t")
    assert math.isfinite(rel.value)


def _synthetic2(rng):
    X = rng.standard_normal((500, 10))
    X[490:, :2] = 20 + 10 * rng.standard_normal((10, 2))
    return X


def test_top_subspaces_find_the_planted_columns():
    rng = np.random.default_rng(3)
    X = _synthetic2(rng)  # unscaled, with the paper's r = 0.13 (Table 2)
    hits = 0
    for seed in range(40):
        picks = private_top_subspaces(X, k=3, r=0.13, h=2, epsilon=3.2, subspaces=1, rng=seed)
        assert len(picks) == 2 and len(set(picks)) == 2
        hits += len({(0,), (1,)} & set(picks))
    # Random picks would average 16 of 80; utilities differ by only ~1.5 here (as in the paper).
    assert hits >= 30


def test_top_subspaces_explicit_candidates_and_validation():
    X = np.random.default_rng(0).random((100, 3))
    cands = [(0,), (1, 2)]
    assert set(private_top_subspaces(X, 3, 0.05, 2, 1.0, cands, rng=0)) == set(cands)
    with pytest.raises(ValueError, match="h must"):
        private_top_subspaces(X, 3, 0.05, 3, 1.0, cands, rng=0)
    with pytest.raises(ValueError, match="repeat"):
        private_top_subspaces(X, 3, 0.05, 1, 1.0, [(0,), (0,)], rng=0)
    with pytest.raises(ValueError, match="epsilon"):
        private_top_subspaces(X, 3, 0.05, 1, -1.0, 1, rng=0)
