"""Private release of the outlier count (docs/design.md#outlier-counts; proof: docs/proofs/smooth-count.md).

Mechanisms (the ``mechanism`` argument, and the name recorded in the release):

============  ====================  ============================================  ==========
argument      release name          noise                                         guarantee
============  ====================  ============================================  ==========
"global"      "laplace_global"      Lap((k K_|S| + 1) / eps)                      (eps, 0)
"laplace"     "laplace_smooth"      Lap(S / alpha), alpha = eps/2,                (eps, delta)
                                    beta = eps / (2 ln(2/delta))   (NRS 2007)
"gaussian"    "gaussian_smooth"     N(0, (S/alpha)^2), alpha = eps/(5 sqrt(2 ln(2/delta))),
                                    beta = eps/(4 (1 + ln(2/delta)))  (paper, Thm 2)  (eps, delta)
"student_t"   "student_t_smooth_    (S/s) T_3, snapped to a grid g (power of two)  (eps, 0)
              snapped"              and clamped to [-2^26, 2^27]; beta = eps_t/8,
                                    s = eps_t sqrt(3)/4 (Bun & Steinke 2019:
                                    eps_t = 4 beta + 4 s / (2 sqrt 3)), eps_t = eps
                                    minus the charged float loss (about 1e-3)
"auto"        one of the above      chosen from public parameters only (see below)
============  ====================  ============================================  ==========

S is min(smooth_sensitivity(W, beta), k K_|S| + 1): a constant bound on the local
sensitivity is beta-smooth and so is the minimum of two, so capping keeps every
guarantee and bounds the smooth noise by a constant multiple of the global one.

Floating point (docs/design.md#floating-point, proofs in docs/privacy-count.md). "global", "laplace" and
"gaussian" hand the exact count to OpenDP as the centre, which adds its noise with exact
rounding. No library samples Student's t, so that mechanism builds T from OpenDP
Gaussians in floats; it never publishes that float: it releases min(q, 2^26) plus the
noise rounded to a multiple of a public power of two g, clamped to [-2^26, 2^27], and
the extra privacy loss the float errors can cause on that grid is taken out of its
epsilon (:func:`student_t_float_loss`). Every release, whatever the mechanism, is then
rounded to a multiple of 2^-8 and clamped to that same public range (post-processing),
so every value one window can release is also a value its neighbour can release.

"auto" uses the global mechanism for subspaces of 1 or 2 dimensions at every epsilon (small
kissing numbers). Beyond, it compares each valid mechanism's expected noise at a *typical*
smooth sensitivity from public parameters only (|S|, k, eps, delta), never from the window:
S_typ(beta) = max_t exp(-beta t)(k + 2t + 1) (Theorem 6 at a smooth density), preferring the
global mechanism unless the smooth one is expected to be at least twice as good, since a
window whose S exceeds S_typ can cost the smooth mechanism up to 2x the global noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from monitor.dp import NoiseSource, Release, laplace_accuracy, noise_source
from monitor.dp.noise import T_RELATIVE_ERROR
from monitor.outliers.sensitivity import (
    ParameterError,
    _smooth,
    smooth_floor,
    count_outliers,
    global_sensitivity_bound,
    paper_global_sensitivity_lower_bound,
)

__all__ = [
    "CountRelease", "private_count", "MECHANISMS", "choose_mechanism", "noise_std", "paper_global_gaussian_count",
    "student_t_float_loss", "COUNT_MAX", "OUTPUT_RANGE",
]

MECHANISMS = ("auto", "global", "laplace", "gaussian", "student_t")
_RELEASE_NAME = {
    "global": "laplace_global",
    "laplace": "laplace_smooth",
    "gaussian": "gaussian_smooth",
    "student_t": "student_t_smooth_snapped",
}
# The public output range of every count release, and the largest count released as
# such (a window with more outliers releases noise around 2^26: clamping q is
# 1-Lipschitz, so every sensitivity bound still holds). Both are multiples of every grid.
COUNT_MAX = 2**26
OUTPUT_RANGE = (-(2.0**26), 2.0**27)
# Every release is rounded to a multiple of this (post-processing of the OpenDP paths).
_POST_GRID = 2.0**-8
_T_DOF = 3
# Share of epsilon the Student's t mechanism spends on smoothness ((nu + 1) beta). Where S
# sits near its floor max_t exp(-beta t)(t + 1) ~ 1/(e beta), the noise S/s goes as
# 1/(beta s), smallest at an even split; measured on 5-D and 8-D windows, 0.5 beats 0.4,
# 0.6 and 0.7 at eps 0.1 and 1, and 0.25 by 15-25 %.
_T_BETA_SHARE = 0.5
# The smooth mechanism must be expected to halve the global noise before auto picks it.
_AUTO_MARGIN = 2.0


@dataclass(frozen=True)
class CountRelease(Release):
    """A released outlier count: value, (epsilon, delta), mechanism name and subspace.

    Holds no true count and no smooth sensitivity.
    """

    subspace: tuple[int, ...] | None = None

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["subspace"] = None if self.subspace is None else list(self.subspace)
        return out


def _check_eps_delta(mechanism: str, epsilon: float, delta: float) -> None:
    if not (isinstance(epsilon, (int, float, np.floating)) and epsilon > 0 and math.isfinite(epsilon)):
        raise ParameterError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if mechanism not in MECHANISMS:
        raise ParameterError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    if not (isinstance(delta, (int, float, np.floating)) and 0 <= delta < 1):
        raise ParameterError(f"delta must be in [0, 1), got {delta!r}")
    if mechanism in ("laplace", "gaussian") and delta == 0:
        raise ParameterError(f"mechanism {mechanism!r} needs 0 < delta < 1; use 'student_t' or 'global' for delta = 0")


def _t_split(epsilon: float) -> tuple[float, float]:
    """(beta, s) of the Student's t mechanism that spends ``epsilon`` (Bun & Steinke)."""
    nu = _T_DOF
    return _T_BETA_SHARE * epsilon / (nu + 1), (1 - _T_BETA_SHARE) * epsilon * 2 * math.sqrt(nu) / (nu + 1)


def student_t_float_loss(epsilon: float) -> tuple[float, float]:
    """(eps_float, g): the grid step of the snapped Student's t release and the privacy
    loss its float errors can add beyond Bun & Steinke's continuous guarantee.

    Public arithmetic on epsilon only. With e the largest absolute float error of the
    noise on the clamped range and L the largest slope of the t log-density,
    eps_float = ln((g + 2e) / (g - 2e)) + L (g + 2e) (docs/privacy-count.md, Lemma 2);
    g is the power of two nearest the minimiser 2 sqrt(e / L). The mechanism spends
    epsilon - eps_float on the continuous guarantee, so the release states epsilon.

    Proof (full version: docs/privacy-count.md, Lemma 2). The computed noise N_hat is
    within gamma |N| + tau of the exact N = sigma T of the sampled Gaussians (gamma =
    T_RELATIVE_ERROR). The output y = clip(min(q, 2^26) + g rint(N_hat / g)) is exact after
    N_hat, so y = c iff N_hat lies in a cell A_c of width g (or a half-line at the ends),
    whose ends are at most M = 2^27 + 1 from 0; hence {N in A_c shrunk by e} is inside
    {y = c}, which is inside {N in A_c grown by e}, e = (gamma M + tau)/(1 - gamma). By
    Bun & Steinke the continuous q + sigma T is eps_t-DP on every set, so
    P_W[y = c] <= e^eps_t P_W'[q' + sigma' T in c +- (g/2 + e)]; the log-density of
    q' + sigma' T moves by at most L per unit (L = (nu + 1)/(2 sqrt(nu) sigma'), sigma' >=
    min(floor, 3)/s), so that probability is at most (g + 2e)/(g - 2e) e^{L (g + 2e)} times
    the probability of the shrunk cell, which is at most P_W'[y = c]. Total:
    eps_t + eps_float = epsilon.

    >>> eps_float, g = student_t_float_loss(0.8)
    >>> eps_float < 1e-3, g
    (True, 0.00390625)
    """
    nu = _T_DOF
    beta, s = _t_split(epsilon)
    # S >= min(floor(beta), 3): every smooth bound is at least the floor, and the cap
    # k K_d + 1 is at least 3. A smaller epsilon spent has a smaller s and a larger floor,
    # so this L also bounds the slope at the epsilon actually spent.
    sigma_min = min(smooth_floor(beta), 3.0) / s
    slope = (nu + 1) / (2 * math.sqrt(nu) * sigma_min)
    # |noise cell ends| <= max(HI, COUNT_MAX - LO) + g <= 2^27 + 1; relative error of the
    # noise (sampler + the product by the scale), plus an absolute 2^-900 for underflow.
    reach = OUTPUT_RANGE[1] + 1.0
    err = (T_RELATIVE_ERROR * reach + 2.0**-900) / (1 - T_RELATIVE_ERROR)
    g = 2.0 ** round(math.log2(2 * math.sqrt(err / slope)))
    g = min(max(g, 2.0**-20), 1.0)  # |values| / g < 2^53: the snapped sum stays exact
    loss = math.log1p(4 * err / (g - 2 * err)) + slope * (g + 2 * err)
    return loss * (1 + 1e-9), g  # room for the rounding of this arithmetic itself


def _smooth_params(mechanism: str, epsilon: float, delta: float) -> tuple[float, float]:
    """(beta, divisor): noise = (S / divisor) * Z for the mechanism's standard Z.

    For Student's t these are for the epsilon left after the charged float loss.
    """
    if mechanism == "laplace":
        return epsilon / (2 * math.log(2 / delta)), epsilon / 2
    if mechanism == "gaussian":
        ln = math.log(2 / delta)
        return epsilon / (4 * (1 + ln)), epsilon / (5 * math.sqrt(2 * ln))
    if mechanism == "student_t":
        loss = student_t_float_loss(epsilon)[0]
        if not loss < epsilon / 2:
            raise ParameterError(f"epsilon {epsilon!r} is too large for the snapped Student's t mechanism")
        return _t_split(epsilon - loss)
    raise AssertionError(mechanism)


_STD_OF_Z = {"laplace": math.sqrt(2), "gaussian": 1.0, "student_t": math.sqrt(_T_DOF / (_T_DOF - 2))}


def noise_std(mechanism: str, epsilon: float, delta: float, k: int, dim: int, sensitivity: float | None = None) -> float:
    """Standard deviation of the noise a mechanism adds, for a given (capped) smooth S.

    Public arithmetic only; with ``sensitivity=None`` the smooth mechanisms are
    evaluated at the typical S that "auto" uses.

    >>> round(noise_std("global", 1.0, 0.0, k=3, dim=2), 2)
    26.87
    """
    gs = global_sensitivity_bound(k, dim)
    if mechanism == "global":
        return math.sqrt(2) * gs / epsilon
    beta, div = _smooth_params(mechanism, epsilon, delta)
    s = typical_smooth_sensitivity(k, beta) if sensitivity is None else sensitivity
    return _STD_OF_Z[mechanism] * min(s, gs) / div


def typical_smooth_sensitivity(k: int, beta: float) -> float:
    """max_t exp(-beta t)(k + 2t + 1): the public stand-in for S that "auto" uses."""
    t_star = max(0.0, 1.0 / beta - (k + 1) / 2.0)
    return max(math.exp(-beta * t) * (k + 2 * t + 1) for t in {0, math.floor(t_star), math.ceil(t_star)})


def choose_mechanism(epsilon: float, delta: float, k: int, dim: int) -> str:
    """The mechanism "auto" uses, from public parameters only (never from the data).

    >>> choose_mechanism(1.0, 1e-6, k=3, dim=1), choose_mechanism(1.0, 1e-6, k=3, dim=8)
    ('global', 'student_t')
    """
    _check_eps_delta("auto", epsilon, delta)
    if dim <= 2:
        return "global"
    candidates = ["student_t"] + (["laplace"] if delta > 0 else [])
    smooth = min(candidates, key=lambda m: noise_std(m, epsilon, delta, k, dim))
    if _AUTO_MARGIN * noise_std(smooth, epsilon, delta, k, dim) < noise_std("global", epsilon, delta, k, dim):
        return smooth
    return "global"


def private_count(
    X: np.ndarray,
    k: int,
    r: float,
    epsilon: float,
    delta: float,
    subspace: Sequence[int] | None = None,
    mechanism: str = "auto",
    rng: "None | int | np.random.Generator | NoiseSource" = None,
) -> CountRelease:
    """Release the number of distance-based outliers of window X with differential privacy.

    Guarantee, for add/remove neighbouring windows, as implemented in floating point:
    "global" and "student_t" are (epsilon, 0)-DP; "laplace" and "gaussian" are
    (epsilon, delta)-DP; "auto" picks one of "global", "laplace", "student_t" from
    (|S|, k, epsilon, delta) and has that mechanism's guarantee (the release records
    which). The release's ``delta`` is the delta actually spent (0.0 for the pure
    mechanisms). The value is a multiple of 2^-8 in [-2^26, 2^27] (docs/privacy-count.md).

    >>> import numpy as np
    >>> X = np.random.default_rng(0).random((200, 2))
    >>> rel = private_count(X, k=3, r=0.05, epsilon=1.0, delta=1e-6, rng=1)
    >>> rel.mechanism, rel.delta
    ('laplace_global', 0.0)
    """
    return _private_count(X, k, r, epsilon, delta, subspace, mechanism, rng)


def _private_count(X, k, r, epsilon, delta, subspace, mechanism, rng, known_count: int | None = None) -> CountRelease:
    """:func:`private_count`; ``known_count``, the exact count of this window and subspace
    when the caller has it already, saves recounting it for the global mechanism."""
    _check_eps_delta(mechanism, epsilon, delta)
    X = np.asarray(X, dtype=float)
    dim = X.shape[1] if subspace is None else len(tuple(subspace))
    if mechanism == "auto":
        mechanism = choose_mechanism(epsilon, delta, k, dim)
    source = noise_source(rng)
    sub = None if subspace is None else tuple(int(i) for i in subspace)
    if mechanism == "global":
        q = count_outliers(X, k, r, sub) if known_count is None else int(known_count)
        scale = global_sensitivity_bound(k, dim) / epsilon
        value = source.laplace(scale, center=float(q))
        return CountRelease(_snap(value, _POST_GRID), float(epsilon), 0.0, "laplace_global", sub,
                            accuracy=laplace_accuracy(scale))
    beta, div = _smooth_params(mechanism, epsilon, delta)
    q, s = _smooth(X, k, r, beta, sub)
    # Rounded up: scale * div >= min(S, GS) >= the local sensitivity exactly, and the ratio
    # of two windows' scales stays within exp(beta) (the bound's margin, see sensitivity).
    scale = float(np.nextafter(np.nextafter(min(s, global_sensitivity_bound(k, dim)) / div, math.inf), math.inf))
    if not scale < 2.0**100:  # the t sampler's absolute error bound assumes this
        raise ParameterError(f"k={k} and dimension {dim} give a noise scale beyond 2^100; use fewer dimensions or a smaller k")
    value = _snap(_draw(mechanism, scale, source, center=float(q), epsilon=epsilon), _POST_GRID)
    spent = 0.0 if mechanism == "student_t" else float(delta)
    return CountRelease(value, float(epsilon), spent, _RELEASE_NAME[mechanism], sub)


def _snap(value, grid: float, lo: float = OUTPUT_RANGE[0], hi: float = OUTPUT_RANGE[1]):
    """``value`` rounded to a multiple of the power of two ``grid``, clamped to [lo, hi].

    Exact in floats: the value is first clamped to [-2^28, 2^28] (beyond the range, so
    this changes no result), division and product by a power of two are exact, and
    multiples of ``grid`` >= 2^-20 below 2^33 are representable.
    """
    v = np.clip(np.asarray(value, dtype=float), -_FAR, _FAR)
    out = np.clip(grid * np.rint(v / grid), lo, hi)
    return float(out) if out.ndim == 0 else out


_FAR = 2.0**28


def _draw(mechanism: str, scale: float, source: NoiseSource, size: int | None = None, center: float = 0.0,
          epsilon: float | None = None):
    # The true value goes in as ``center`` so that OpenDP adds the noise with exact rounding.
    if mechanism == "laplace":
        return source.laplace(scale, size, center=center)
    if mechanism == "gaussian":
        return source.gaussian(scale, size, center=center)
    return _snapped_t(center, source.student_t(_T_DOF, scale, size), epsilon)


def _snapped_t(center: float, noise, epsilon: float | None):
    """clamp(min(center, COUNT_MAX) + g rint(noise / g)) with the grid g of ``epsilon``
    (Lemma 2 of docs/privacy-count.md): the float noise is never added to the count
    unrounded. ``center`` is an integer and the snapped noise a multiple of g in
    [-2^28, 2^28], so the sum is exact; noise beyond +-2^28 takes the sum past the range
    for every count <= 2^26, so clamping it there first changes nothing.
    """
    g = student_t_float_loss(epsilon)[1] if epsilon is not None else _POST_GRID
    snapped = _snap(noise, g, -_FAR, _FAR)
    return _snap(min(float(center), float(COUNT_MAX)) + snapped, g)


def paper_global_gaussian_count(
    X: np.ndarray,
    k: int,
    r: float,
    epsilon: float,
    delta: float,
    subspace: Sequence[int] | None = None,
    rng: "None | int | np.random.Generator | NoiseSource" = None,
) -> CountRelease:
    """The paper's global baseline, FOR BENCHMARKS ONLY: NOT differentially private.

    Gaussian noise of standard deviation GS sqrt(2 ln(2/delta)) / epsilon (the paper's
    Theorem 1) with GS = 2|S|k + 1, the paper's LOWER bound on the global sensitivity
    (eq. 18); the true global sensitivity can be as large as k K_|S| + 1.

    >>> paper_global_gaussian_count(np.zeros((3, 2)), 3, 0.1, 1.0, 0.01, rng=0).mechanism
    'gaussian_global_paper'
    """
    _check_eps_delta("gaussian", epsilon, delta)
    X = np.asarray(X, dtype=float)
    sub = None if subspace is None else tuple(int(i) for i in subspace)
    dim = X.shape[1] if sub is None else len(sub)
    std = paper_global_sensitivity_lower_bound(k, dim) * math.sqrt(2 * math.log(2 / delta)) / epsilon
    q = count_outliers(X, k, r, sub)
    return CountRelease(noise_source(rng).gaussian(std, center=float(q)), float(epsilon), float(delta), "gaussian_global_paper", sub)
