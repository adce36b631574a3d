"""Float-level privacy of the count releases (docs/design.md#floating-point, docs/privacy-count.md).

A mechanism is private only as implemented: the releases of a window must be values the
neighbouring window can release too, and the smooth bound must be beta-smooth as
computed in floats. Production noise (OpenDP, rng=None) throughout, except where a test
needs the t sampler's inputs.
"""

import math

import mpmath
import numpy as np
import pytest

from monitor.config import ReportSettings
from monitor.dp import noise_source
from monitor.dp.noise import T_RELATIVE_ERROR
from monitor.outliers import count_outliers, private_count
from monitor.outliers.mechanisms import OUTPUT_RANGE, _smooth_params, _t_split, student_t_float_loss

# The settings of the float-safety review (the window release defaults before the alarm): k=5,
# r=0.1, epsilon 0.8, delta 1e-9, where auto picks Student's t.
ISSUE9 = ReportSettings(epsilon_count=0.8, delta_count=1e-9, k=5, radius=0.1)


@pytest.fixture(scope="module")
def neighbours():
    """The issue's pair: W, 200 events near 0.5 in 5 features (q = 0); W' = W plus one
    event at 0.95 everywhere (q = 1)."""
    rng = np.random.default_rng(0)
    W = 0.5 + 0.01 * rng.standard_normal((200, 5))
    W2 = np.vstack([W, np.full(5, 0.95)])
    assert count_outliers(W, ISSUE9.k, ISSUE9.radius) == 0
    assert count_outliers(W2, ISSUE9.k, ISSUE9.radius) == 1
    return W, W2


def _float_reachable(y: float, q: float) -> bool:
    """Is there a float x with fl(q + x) == y? (The issue's check; the candidates
    around y - q are the only ones that can round to y.)"""
    x = y - q
    return any(q + c == y for c in (x, np.nextafter(x, math.inf), np.nextafter(x, -math.inf)))


@pytest.mark.parametrize("mechanism", ["student_t", "global", "laplace", "gaussian", "auto"])
def test_no_release_of_w_is_unreachable_from_the_neighbours_count(neighbours, mechanism):
    W, _ = neighbours
    k, r, eps, delta = ISSUE9.k, ISSUE9.radius, ISSUE9.epsilon_count, ISSUE9.delta_count
    values = np.array([private_count(W, k, r, eps, delta, mechanism=mechanism).value for _ in range(1000)])
    lo, hi = OUTPUT_RANGE
    # The public output set: multiples of 2^-8 in the public range. Every one of them
    # is a possible release of W' (q' = 1) too.
    assert np.all(values == np.rint(values * 256) / 256)
    assert np.all((values >= lo) & (values <= hi))
    unreachable = [y for y in values if not _float_reachable(float(y), 1.0)]
    # Before the fix about 8 % of Student's t releases failed this check.
    assert unreachable == []
    assert np.unique(values).size > 500  # the check saw real noise, not a constant


def test_auto_at_the_shipped_settings_is_the_snapped_t():
    rel = private_count(np.random.default_rng(1).random((50, 5)), ISSUE9.k, ISSUE9.radius,
                        ISSUE9.epsilon_count, ISSUE9.delta_count)
    assert (rel.mechanism, rel.epsilon, rel.delta) == ("student_t_smooth_snapped", ISSUE9.epsilon_count, 0.0)


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.8, 3.0, 20.0])
def test_charged_float_loss_plus_bun_steinke_is_the_stated_epsilon(eps):
    loss, g = student_t_float_loss(eps)
    beta, s = _smooth_params("student_t", eps, 0.0)
    nu = 3
    continuous = (nu + 1) * beta + (nu + 1) * s / (2 * math.sqrt(nu))
    assert continuous + loss == pytest.approx(eps, rel=1e-12)
    assert continuous + loss <= eps * (1 + 1e-12)
    assert 0 < loss < 0.01 * eps + 0.01 and 2.0**-20 <= g <= 1 and math.log2(g).is_integer()
    # The charge is computed at eps, which bounds the slope at the epsilon spent.
    assert _t_split(eps - loss)[1] <= _t_split(eps)[1]


def _exact_t(z):
    with mpmath.workdps(60):
        z = [mpmath.mpf(float(v)) for v in z]
        return z[0] * mpmath.sqrt(len(z) - 1) / mpmath.sqrt(sum(v * v for v in z[1:]))


def test_t_sampler_error_is_within_the_bound_the_proof_uses(monkeypatch):
    # The production sampler's arithmetic on given Gaussians, including the corners the
    # proof treats (tiny, huge, subnormal, mixed magnitudes), against 60-digit arithmetic.
    src = noise_source(None)
    rng = np.random.default_rng(3)
    cases = [rng.standard_normal(4) for _ in range(300)]
    cases += [np.array(c, dtype=float) for c in (
        [1.0, 1e-300, 1e-310, 5e-324], [1e-310, 1e-300, 2.0, 3.0], [1e300, 1e-300, 1e-305, 0.0],
        [-3.0, 1e150, 1e150, 1e150], [2.5, 1e-200, 1e200, 1.0], [-1e-320, 1e-320, 0.0, 0.0])]
    for z in cases:
        monkeypatch.setattr(src, "gaussian", lambda scale, size, z=z: z.copy())
        got = float(src._opendp_t(3, 1)[0])
        exact = _exact_t(z)
        if not math.isfinite(got):
            assert abs(exact) > 1e300  # overflow only where the exact value is huge
            continue
        assert abs(mpmath.mpf(got) - exact) <= T_RELATIVE_ERROR * abs(exact) + mpmath.mpf(2) ** -1070, z


# -- the smooth bound in floats (docs/privacy-count.md, Lemmas 1 and 3) -----------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from monitor.outliers import choose_mechanism, smooth_sensitivity  # noqa: E402
from monitor.outliers._geometry import BallPacking, scaled  # noqa: E402
from monitor.outliers._oracle import largest_ball_subset, local_sensitivity_brute  # noqa: E402


def _degenerate_window(kind: str, d: int, n: int, r: float, seed: int) -> np.ndarray:
    """Raw windows whose scaled pairwise distances sit at (or an ulp from) r and 2r."""
    rng = np.random.default_rng(seed)
    rho = r * math.sqrt(d)  # raw length of a scaled distance r
    c = rng.random(d)
    if kind == "cocircular":  # on one sphere of scaled radius r around c
        u = rng.standard_normal((n, d))
        X = c + rho * u / np.linalg.norm(u, axis=1, keepdims=True)
    elif kind == "colinear":  # spacing exactly r or 2r along one direction
        u = rng.standard_normal(d)
        u /= np.linalg.norm(u)
        X = c + np.outer(np.cumsum(rng.choice([1.0, 2.0], n)) * rho, u)
    elif kind == "axis":  # exactly r, 2r along a coordinate axis
        X = np.tile(c, (n, 1))
        X[:, 0] += rho * rng.choice([0.0, 1.0, 2.0, 3.0], n)
    else:  # duplicates and a cocircular ring around them
        X = np.vstack([np.tile(c, (n // 2, 1)), _degenerate_window("cocircular", d, n - n // 2, r, seed + 1)])
    if rng.random() < 0.5:  # a few ulps of jitter either way
        X = X + rng.integers(-3, 4, X.shape) * np.spacing(X)
    return X


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["cocircular", "colinear", "axis", "duplicates"]), d=st.integers(1, 5),
       n=st.integers(3, 8), k=st.integers(1, 3), r=st.sampled_from([0.1, 0.05, 0.3, 1 / 3]),
       beta=st.sampled_from([0.1, 0.5, 1.0]), seed=st.integers(0, 2**32 - 1))
def test_smooth_bound_is_valid_and_beta_smooth_on_float_degenerate_windows(kind, d, n, k, r, beta, seed):
    X = _degenerate_window(kind, d, n, r, seed)
    s = smooth_sensitivity(X, k, r, beta)
    assert local_sensitivity_brute(X, k, r) <= s
    P = scaled(X, None)
    f = BallPacking(P, r).count(np.ones(n, bool))
    assert f >= largest_ball_subset(P, r)
    for i in range(n):
        rest = np.delete(X, i, axis=0)
        s2 = smooth_sensitivity(rest, k, r, beta)
        # Exactly, with no tolerance: the float S is beta-smooth by construction.
        assert s <= math.exp(beta) * s2 and s2 <= math.exp(beta) * s
        f2 = BallPacking(np.delete(P, i, axis=0), r).count(np.ones(n - 1, bool))
        assert f2 <= f <= f2 + 1


def test_the_reported_cocircular_window_is_smooth():
    # The issue's case: 7 points almost on one circle (raw distance r sqrt 2), k = 1,
    # beta = 0.1: the angular sweep gave F 7 -> 5 and S(W) / S(W - x) = 1.22 > e^beta.
    r, beta = 0.1, 0.1
    angles = np.linspace(0, 2 * math.pi, 7, endpoint=False)
    X = 0.5 + r * math.sqrt(2) * np.c_[np.cos(angles), np.sin(angles)]
    s = smooth_sensitivity(X, 1, r, beta)
    for i in range(7):
        assert s <= math.exp(beta) * smooth_sensitivity(np.delete(X, i, axis=0), 1, r, beta)


def test_auto_never_uses_a_smooth_bound_in_one_or_two_dimensions():
    for eps in (0.05, 0.8, 3.0, 10.0):
        for delta in (0.0, 1e-9, 1e-2):
            for k in (1, 3, 5, 20):
                assert choose_mechanism(eps, delta, k, 1) == "global"
                assert choose_mechanism(eps, delta, k, 2) == "global"
