"""The outlier count of Okada et al. and its sensitivities.

q(W, S) = number of rows with fewer than k OTHER rows within r under dist_S (Okada et al.,
section 3.1). Its global sensitivity is at most k K_|S| + 1 (Theorem 4, K_d the
kissing number); :func:`smooth_sensitivity` is a polynomial-time beta-smooth upper bound
on its local sensitivity (Theorem 6 with bounded ball packing; docs/design.md#outlier-counts;
proof: docs/proofs/smooth-count.md).

>>> import numpy as np
>>> X = np.array([[0.0], [0.05], [0.1], [0.9]])
>>> count_outliers(X, k=1, r=0.06)
1
>>> smooth_sensitivity(X, k=1, r=0.06, beta=0.5) >= 1
True
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from monitor.errors import MonitorError
from monitor.outliers._geometry import GRID_MAX_DIM, BallPacking, degrees, degrees_and_pairs, scaled

__all__ = [
    "ParameterError",
    "kissing_number_bound",
    "global_sensitivity_bound",
    "paper_global_sensitivity_lower_bound",
    "count_outliers",
    "smooth_sensitivity",
]

class ParameterError(MonitorError, ValueError):
    """An invalid argument of a private outlier function; the message names it."""


# Exact kissing numbers for d <= 4 and d = 8, 24; best known upper bounds otherwise
# (d = 5, 6, 7 are the accepted values 40, 72, 126; d = 9..23 are the semidefinite
# bounds of Machado & de Oliveira Filho 2018). Only upper bounds keep the global
# sensitivity bound valid.
_KISSING_UPPER = {
    1: 2, 2: 6, 3: 12, 4: 24, 5: 44, 6: 78, 7: 134, 8: 240,
    9: 363, 10: 553, 11: 869, 12: 1356, 13: 2066, 14: 3177, 15: 4858, 16: 7332,
    17: 11014, 18: 16469, 19: 24575, 20: 36402, 21: 53878, 22: 81376, 23: 122605,
    24: 196560,
}


def kissing_number_bound(d: int) -> int:
    """The best valid upper bound we use on the kissing number K_d.

    >>> [kissing_number_bound(d) for d in (1, 2, 3, 4, 8)]
    [2, 6, 12, 24, 240]
    """
    if isinstance(d, bool) or int(d) != d or d < 1:
        raise ParameterError(f"dimension d must be a positive integer, got {d!r}")
    d = int(d)
    return min(_KISSING_UPPER.get(d, 3**d - 1), 3**d - 1)


def global_sensitivity_bound(k: int, d: int) -> int:
    """k K_d + 1: a valid bound on the global sensitivity of the count (Theorem 4)."""
    _check_k(k)
    return int(k) * kissing_number_bound(d) + 1


def paper_global_sensitivity_lower_bound(k: int, d: int) -> int:
    """2 d k + 1, the paper's LOWER bound (eq. 18), used by its baseline (benchmarks only).

    Not a valid sensitivity for d >= 2: noise calibrated to it is not differentially private.
    """
    _check_k(k)
    return 2 * int(d) * int(k) + 1


def count_outliers(X: np.ndarray, k: int, r: float, subspace: Sequence[int] | None = None) -> int:
    """Number of rows with fewer than k other rows within r under dist_S.

    Not private: this is the true value the mechanisms protect.

    >>> count_outliers(np.array([[0.1, 0.1], [0.12, 0.1], [0.9, 0.9]]), k=1, r=0.05)
    1
    """
    Y, k, r = _prepare(X, k, r, subspace)
    return int(np.count_nonzero(degrees(Y, r, cap=k) < k))


def smooth_sensitivity(
    X: np.ndarray, k: int, r: float, beta: float, subspace: Sequence[int] | None = None
) -> float:
    """A beta-smooth upper bound S(W) on the local sensitivity of :func:`count_outliers`.

    S(W) = max_t exp(-beta t) U_t(W), U_t = max(F(P_hi(t)), F(P_lo(t))) + t + 1, where
    P_hi(t) holds the rows with deg in [k-t, k+t], P_lo(t) those with deg in
    [k-t-1, k+t-1], and F is the clique number of the 2r-graph for |S| = 1 and its
    degeneracy + 1 for |S| >= 2 (docs/design.md#outlier-counts). For add/remove neighbours W, W':
    LS(W) <= S(W) and S(W) <= exp(beta) S(W'). The window size is never used as a cap.
    The value is data-dependent: never publish it.

    >>> X = np.array([[0.0], [0.05], [0.1], [0.9]])
    >>> round(smooth_sensitivity(X, k=1, r=0.06, beta=10.0), 6)
    3.0
    """
    return _smooth(X, k, r, beta, subspace)[1]


def _prepare(X, k, r, subspace):
    _check_k(k)
    if not (isinstance(r, (int, float, np.floating)) and r > 0 and math.isfinite(r)):
        raise ParameterError(f"r must be a positive finite number, got {r!r}")
    X = np.asarray(X, dtype=float)
    if X.ndim != 2:
        raise ParameterError(f"X must be a 2-D array (rows x features), got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ParameterError("X must be finite (scale features with monitor.features.scale_to_unit first)")
    if subspace is not None:
        subspace = tuple(int(i) for i in subspace)
        if len(subspace) == 0 or len(set(subspace)) != len(subspace):
            raise ParameterError(f"subspace must be a non-empty tuple of distinct column indices, got {subspace!r}")
        if min(subspace) < 0 or max(subspace) >= X.shape[1]:
            raise ParameterError(f"subspace {subspace!r} has a column outside 0..{X.shape[1] - 1}")
    elif X.shape[1] == 0:
        raise ParameterError("X has no columns")
    return scaled(X, subspace), int(k), float(r)


def _check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ParameterError(f"k must be an integer >= 1, got {k!r}")


def _check_beta(beta) -> None:
    if not (isinstance(beta, (int, float, np.floating)) and beta > 0 and math.isfinite(beta)):
        raise ParameterError(f"beta must be a positive finite number, got {beta!r}")
    if beta <= 10 * _BETA_MARGIN:
        raise ParameterError(f"beta must be larger than {10 * _BETA_MARGIN:g}, got {beta!r}")


# S is computed in floats: each term exp(-beta t) U_t (U_t an exact integer) is within a
# relative (beta t + 8) u of its real value (beta t <= 745 before exp underflows to 0, so
# at most 760 u = 8.5e-14), and the search stops only where the real terms cannot beat
# the float maximum by more than that. So S_float(W) <= exp(beta') (1 + 1.7e-13) S_float(W')
# when the real S is beta'-smooth. Computing with beta' = beta - _BETA_MARGIN keeps the
# float S beta-smooth, with room for the few roundings of S / s in the mechanisms.
_BETA_MARGIN = 1e-12


def smooth_floor(beta: float) -> float:
    """max_t exp(-beta' t)(t + 1), beta' = beta - margin: a lower bound on S for every window.

    Every U_t >= t + 1, so the smooth bound of any window (even an empty one) is at least
    this; it depends on beta only, so the mechanisms use it as a public fact.
    """
    b = beta - _BETA_MARGIN
    t_star = max(0.0, 1.0 / b - 1.0)
    return max(math.exp(-b * t) * (t + 1) for t in (math.floor(t_star), math.ceil(t_star)))


def _horizon(n: int, beta: float, floor: float) -> int:
    """First t from which exp(-beta t)(n + t + 1) stays <= floor.

    U_t <= |W| + t + 1, so no t beyond this can beat a value already reached; this only
    limits the search, never the value. The function rises until t = 1/beta - n - 1 and
    falls after, so a bisection on the falling part finds it.
    """
    f = lambda t: math.exp(-beta * t) * (n + t + 1)  # noqa: E731
    lo = max(0, math.ceil(1.0 / beta - n - 1))
    if f(lo) <= floor:
        return lo
    hi = lo + 1
    while f(hi) > floor:
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if f(mid) <= floor else (mid, hi)
    return hi


def _smooth(X, k, r, beta, subspace):
    """(q, S): the count and its smooth bound, sharing one degree computation."""
    Y, k, r = _prepare(X, k, r, subspace)
    _check_beta(beta)
    n = Y.shape[0]
    floor = smooth_floor(beta)
    beta = beta - _BETA_MARGIN  # see _BETA_MARGIN: float rounding stays inside the margin
    horizon = _horizon(n, beta, floor)
    cap = k + horizon + 1
    if Y.shape[1] > GRID_MAX_DIM:
        # Beyond the grid shortcut's dimensions the rows left after the dense shortcut are
        # about the rows the bands need: one search within 2r gives their degrees and edges.
        deg, listed, ea, eb = degrees_and_pairs(Y, r, cap)
        ea, eb = listed[ea], listed[eb]
    else:
        deg, ea, eb = degrees(Y, r, cap), None, None
    q = int(np.count_nonzero(deg < k))
    # Entry time of each row into the bands: in P_hi(t) iff t >= |deg - k|, in P_lo(t)
    # iff t >= |deg - k + 1|. Rows at the cap never enter before the horizon.
    live = deg < cap
    tau_hi = np.where(live, np.abs(deg - k), horizon + 1)
    tau_lo = np.where(live, np.abs(deg - k + 1), horizon + 1)
    # size(t) = rows in the band at t, for the Lipschitz part of the pruning bound.
    size_hi = np.cumsum(np.bincount(tau_hi[live], minlength=horizon + 2))
    size_lo = np.cumsum(np.bincount(tau_lo[live], minlength=horizon + 2))
    tau = np.minimum(tau_hi, tau_lo)
    cache: dict[int, int] = {}  # t -> an upper bound on G(t) (G(t) itself where evaluated)
    exact: dict[int, int] = {}
    packing: list = [None, -1]  # (BallPacking over rows with tau <= reach, reach)

    def bands(t: int):
        if t > packing[1]:
            # Most of the search stays below a few 1/beta; grow the shared geometry
            # only when a larger t must be evaluated.
            reach = min(horizon, max(t, 2 * packing[1], math.ceil(3.0 / beta)))
            rows = np.flatnonzero(tau <= reach)
            edges = None
            if ea is not None:  # rows in a band were all listed (their degree < cap)
                local = np.full(n, -1, dtype=np.int64)
                local[rows] = np.arange(rows.size)
                la, lb = local[ea], local[eb]
                keep = (la >= 0) & (lb >= 0)
                edges = (la[keep], lb[keep])
            packing[:] = [(BallPacking(Y[rows], r, edges), tau_hi[rows], tau_lo[rows]), reach]
        pk, th, tl = packing[0]
        return pk, th <= t, tl <= t

    def G(t: int) -> int:
        if t not in exact:
            pk, hi, lo = bands(t)
            cache[t] = exact[t] = max(pk.count(hi), pk.count(lo))
        return exact[t]

    def dominated(t: int, best: float) -> bool:
        """Whether value(t) <= best, shown by F <= f on both bands for the largest such f
        (the same float expression as value), without finding F itself."""
        f = math.floor(best * math.exp(beta * t)) - t
        while f >= 0 and math.exp(-beta * t) * (f + t + 1) > best:
            f -= 1
        if f < 0:
            return False
        pk, hi, lo = bands(t)
        if pk.at_most(hi, f) and pk.at_most(lo, f):
            cache[t] = f  # an upper bound on G(t): enough for the pruning bounds
            return True
        return False

    def value(t: int) -> float:
        return math.exp(-beta * t) * (G(t) + t + 1)

    # Branch and bound over t in [0, horizon]. G is non-decreasing and, being
    # 1-Lipschitz in the set, grows by at most the number of rows entering the bands,
    # so upper bounds on G at a few t (exact values, or thresholds shown by dominated)
    # bound it everywhere; settle the most promising t until no unsettled t can beat the
    # best value found. Every t is evaluated, shown to be at most best, or bounded below
    # best, so best is the maximum over all t.
    ts = np.arange(horizon + 1)
    decay = np.exp(-beta * ts)
    best = max(floor, value(0))
    while True:
        known = np.array(sorted(cache))
        g = np.array([cache[t] for t in known])
        left = np.searchsorted(known, ts, side="right") - 1  # always >= 0: t = 0 is known
        lt = known[left]
        ub = g[left] + np.maximum(size_hi[ts] - size_hi[lt], size_lo[ts] - size_lo[lt])
        right = np.searchsorted(known, ts, side="left")
        has_right = right < known.size
        ub = np.where(has_right, np.minimum(ub, g[np.minimum(right, known.size - 1)]), ub)
        bound = decay * (ub + ts + 1)
        bound[known] = -1.0
        t_next = int(np.argmax(bound))
        if bound[t_next] <= best:
            break
        # Most promising t whose term cannot reach the best value are settled by one
        # threshold test; the others are evaluated.
        if not dominated(t_next, best):
            best = max(best, value(t_next))
    return q, float(best)
