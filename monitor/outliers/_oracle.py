"""Exponential-time reference implementations (the paper's Algorithms 1 and 2).

For tests and benchmarks on small windows only: Algorithm 1 makes O(2^|P|) smallest-
enclosing-ball calls (``miniball``, an optional dependency of the test/bench extras).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from monitor.outliers._geometry import scaled, sq_dist

__all__ = ["true_degrees", "count_brute", "largest_ball_subset", "smooth_oracle", "local_sensitivity_brute"]

# Below the edge predicate's 1e-9 slack: a set the oracle accepts is a clique of our edge graph.
_TOL = 1e-10


def _seb(points: np.ndarray) -> tuple[np.ndarray, float]:
    import miniball

    # miniball's circumsphere solve is singular on repeated or affinely dependent points.
    # Points within 1e-13 of one another are merged (the radius moves by less than that,
    # far below _TOL), and dependent sets are solved in their affine hull.
    points = np.asarray(points, dtype=float)
    scale = max(1.0, float(np.abs(points).max()))
    kept: list[np.ndarray] = []
    for p in points:
        if all(np.linalg.norm(p - q) > 1e-13 * scale for q in kept):
            kept.append(p)
    points = np.array(kept)
    if len(points) == 1:
        return points[0].copy(), 0.0
    base = points.mean(0)
    _, sv, vt = np.linalg.svd(points - base, full_matrices=False)
    basis = vt[sv > 1e-9 * sv[0]]
    sub, r2 = miniball.get_bounding_ball((points - base) @ basis.T)
    return base + np.asarray(sub) @ basis, float(r2)


def true_degrees(Y: np.ndarray, r: float) -> np.ndarray:
    """deg of every row from the full distance matrix (the count's predicate
    sq_dist <= r*r, self excluded)."""
    return (sq_dist(Y[:, None, :], Y[None, :, :]) <= r * r).sum(1) - 1


def count_brute(Y: np.ndarray, k: int, r: float) -> int:
    return int(np.count_nonzero(true_degrees(Y, r) < k)) if len(Y) else 0


def largest_ball_subset(P: np.ndarray, r: float) -> int:
    """Algorithm 1: the largest subset of P whose smallest enclosing ball has radius <= r."""
    n = len(P)
    best = 0

    def rec(chosen: list[int], i: int) -> None:
        nonlocal best
        if chosen and _seb(P[chosen])[1] > r * r * (1 + _TOL):
            return  # supersets only grow the ball
        best = max(best, len(chosen))
        if i == n or len(chosen) + (n - i) <= best:
            return
        rec(chosen + [i], i + 1)
        rec(chosen, i + 1)

    rec([], 0)
    return best


def smooth_oracle(X: np.ndarray, k: int, r: float, beta: float, subspace=None) -> float:
    """Algorithm 2 with Algorithm 1 for the ball counts and no min(N, .) cap."""
    Y = scaled(np.asarray(X, dtype=float), subspace)
    n = len(Y)
    deg = true_degrees(Y, r) if n else np.zeros(0, int)
    best, t = 0.0, 0
    while True:
        hi = Y[(deg >= k - t) & (deg <= k + t)]
        lo = Y[(deg >= k - t - 1) & (deg <= k + t - 1)]
        u = max(largest_ball_subset(hi, r), largest_ball_subset(lo, r)) + t + 1
        best = max(best, math.exp(-beta * t) * u)
        t += 1
        if n + t + 1 > 1 / beta and math.exp(-beta * t) * (n + t + 1) <= best:
            return best


def local_sensitivity_brute(X: np.ndarray, k: int, r: float, subspace=None, max_subset: int = 3) -> int:
    """A lower bound on the local sensitivity: every removal, and insertions at the
    smallest-enclosing-ball centres of all subsets of up to ``max_subset`` rows (and at
    a point far from everything)."""
    Y = scaled(np.asarray(X, dtype=float), subspace)
    n = len(Y)
    q = count_brute(Y, k, r)
    worst = 0
    for i in range(n):
        worst = max(worst, abs(q - count_brute(np.delete(Y, i, axis=0), k, r)))
    centres = [np.full(Y.shape[1], 10.0)]
    for size in range(1, min(max_subset, n) + 1):
        for sub in itertools.combinations(range(n), size):
            c, r2 = _seb(Y[list(sub)])
            if r2 <= r * r * (1 + _TOL):
                centres.append(c)
    for c in centres:
        worst = max(worst, abs(q - count_brute(np.vstack([Y, c]), k, r)))
    return worst
