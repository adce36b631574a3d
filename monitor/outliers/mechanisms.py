"""Private release of the outlier count (DESIGN 3.3 and 3.3b).

Mechanisms (the ``mechanism`` argument, and the name recorded in the release):

============  ====================  ============================================  ==========
argument      release name          noise                                         guarantee
============  ====================  ============================================  ==========
"global"      "laplace_global"      Lap((k K_|S| + 1) / eps)                      (eps, 0)
"laplace"     "laplace_smooth"      Lap(S / alpha), alpha = eps/2,                (eps, delta)
                                    beta = eps / (2 ln(2/delta))   (NRS 2007)
"gaussian"    "gaussian_smooth"     N(0, (S/alpha)^2), alpha = eps/(5 sqrt(2 ln(2/delta))),
                                    beta = eps/(4 (1 + ln(2/delta)))  (paper, Thm 2)  (eps, delta)
"student_t"   "student_t_smooth"    (S/s) T_3, beta = eps/8, s = eps sqrt(3)/4     (eps, 0)
                                    (Bun & Steinke 2019: eps = 4 beta + 4 s / (2 sqrt 3))
"auto"        one of the above      chosen from public parameters only (see below)
============  ====================  ============================================  ==========

S is min(smooth_sensitivity(W, beta), k K_|S| + 1): a constant bound on the local
sensitivity is beta-smooth and so is the minimum of two, so capping keeps every
guarantee and bounds the smooth noise by a constant multiple of the global one.

"auto" compares the expected noise of each valid mechanism at a *typical* smooth
sensitivity computed from public parameters only (|S|, k, eps, delta), never from the
window: S_typ(beta) = max_t exp(-beta t)(k + 2t + 1), the value Theorem 6 gives when
a ball around a point of degree k + t holds about k + t band members (a smooth
density). It picks the smallest expected standard deviation, preferring the global
mechanism unless the smooth one is expected to be at least twice as good, because a
window whose S exceeds S_typ can cost the smooth mechanism up to 2x the global noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from monitor.dp import NoiseSource, Release, noise_source
from monitor.outliers.sensitivity import (
    ParameterError,
    _smooth,
    count_outliers,
    global_sensitivity_bound,
    paper_global_sensitivity_lower_bound,
)

__all__ = ["CountRelease", "private_count", "MECHANISMS", "choose_mechanism", "noise_std", "paper_global_gaussian_count"]

MECHANISMS = ("auto", "global", "laplace", "gaussian", "student_t")
_RELEASE_NAME = {
    "global": "laplace_global",
    "laplace": "laplace_smooth",
    "gaussian": "gaussian_smooth",
    "student_t": "student_t_smooth",
}
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


def _smooth_params(mechanism: str, epsilon: float, delta: float) -> tuple[float, float]:
    """(beta, divisor): noise = (S / divisor) * Z for the mechanism's standard Z."""
    if mechanism == "laplace":
        return epsilon / (2 * math.log(2 / delta)), epsilon / 2
    if mechanism == "gaussian":
        ln = math.log(2 / delta)
        return epsilon / (4 * (1 + ln)), epsilon / (5 * math.sqrt(2 * ln))
    if mechanism == "student_t":
        nu = _T_DOF
        beta = _T_BETA_SHARE * epsilon / (nu + 1)
        s = (1 - _T_BETA_SHARE) * epsilon * 2 * math.sqrt(nu) / (nu + 1)
        return beta, s
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

    Guarantee, for add/remove neighbouring windows: "global" and "student_t" are
    (epsilon, 0)-DP; "laplace" and "gaussian" are (epsilon, delta)-DP; "auto" picks one
    of "global", "laplace", "student_t" from (|S|, k, epsilon, delta) and has that
    mechanism's guarantee (the release records which). The release's ``delta`` is the
    delta actually spent (0.0 for the pure mechanisms).

    >>> import numpy as np
    >>> X = np.random.default_rng(0).random((200, 2))
    >>> rel = private_count(X, k=3, r=0.05, epsilon=1.0, delta=1e-6, rng=1)
    >>> rel.mechanism, rel.delta
    ('laplace_global', 0.0)
    """
    _check_eps_delta(mechanism, epsilon, delta)
    X = np.asarray(X, dtype=float)
    dim = X.shape[1] if subspace is None else len(tuple(subspace))
    if mechanism == "auto":
        mechanism = choose_mechanism(epsilon, delta, k, dim)
    source = noise_source(rng)
    sub = None if subspace is None else tuple(int(i) for i in subspace)
    if mechanism == "global":
        q = count_outliers(X, k, r, sub)
        scale = global_sensitivity_bound(k, dim) / epsilon
        return CountRelease(source.laplace(scale, center=float(q)), float(epsilon), 0.0, "laplace_global", sub)
    beta, div = _smooth_params(mechanism, epsilon, delta)
    q, s = _smooth(X, k, r, beta, sub)
    value = _draw(mechanism, min(s, global_sensitivity_bound(k, dim)) / div, source, center=float(q))
    spent = 0.0 if mechanism == "student_t" else float(delta)
    return CountRelease(value, float(epsilon), spent, _RELEASE_NAME[mechanism], sub)


def _draw(mechanism: str, scale: float, source: NoiseSource, size: int | None = None, center: float = 0.0):
    # The true value goes in as ``center`` so that OpenDP adds the noise with exact rounding.
    if mechanism == "laplace":
        return source.laplace(scale, size, center=center)
    if mechanism == "gaussian":
        return source.gaussian(scale, size, center=center)
    return center + source.student_t(_T_DOF, scale, size)


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
