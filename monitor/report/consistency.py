"""Consistent report numbers, for free: a projection of the noisy counts (post-processing).

A report's counts nest: every flagged event is an event, and every event a 'where' part
counts is a flagged event. Independent noise breaks that (a part above its whole, a
negative count). The weighted least-squares projection onto the consistent set

    0 <= part_j <= whole(part_j)   for every count in a rooted tree of counts

repairs it. It is post-processing of the DP releases, so it costs nothing, and because
the true counts lie in that convex set, the projection never moves the vector of
estimates further from the truth (in the weighted norm).
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
from scipy.optimize import nnls

__all__ = ["project_nested", "project_partition"]

# 2^(edges) candidate block structures are tried: plenty for a report's handful of counts.
_MAX_EDGES = 12


def project_nested(values: Sequence[float], weights: Sequence[float], parents: Sequence[int]) -> np.ndarray:
    """Closest point (weighted least squares) to ``values`` with every count at least 0 and
    at most its parent.

    ``parents[i]`` is the index of count i's whole, -1 for the root(s); parents come before
    their children. ``weights`` are positive (use 1 / variance: epsilon squared for Laplace
    counts of sensitivity 1).

    Exact: the solution of an isotonic regression on a tree is piecewise constant on
    connected blocks, each at its weighted mean; every subset of tree edges is tried as the
    set of tied edges and the best feasible candidate kept (the tied-all candidate is always
    feasible). Clipping that solution at 0 gives the solution with the lower bound (bounded
    isotonic regression is the clipped unbounded one). A last top-down clamp removes any
    rounding residue, so the output always satisfies the constraints exactly.

    >>> project_nested([100.0, 23.0, 89.0], [1.0, 1.0, 1.0], [-1, 0, 1]).round(1).tolist()
    [100.0, 56.0, 56.0]
    >>> project_nested([-5.0, 3.0], [1.0, 1.0], [-1, 0]).tolist()
    [0.0, 0.0]
    """
    y = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    par = [int(p) for p in parents]
    m = y.size
    if w.shape != y.shape or len(par) != m:
        raise ValueError("values, weights and parents must have the same length")
    if not np.all(np.isfinite(y)):
        raise ValueError("values must be finite")
    if not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError("weights must be positive and finite")
    for i, p in enumerate(par):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: a count's parent must come before it (or be -1)")
    edges = [(i, p) for i, p in enumerate(par) if p >= 0]
    if len(edges) > _MAX_EDGES:
        raise ValueError(f"at most {_MAX_EDGES} nested counts, got {len(edges)}")

    best, best_loss = None, np.inf
    for tied in itertools.product((False, True), repeat=len(edges)):
        block = list(range(m))  # union-find over tied edges

        def find(a: int) -> int:
            while block[a] != a:
                block[a] = block[block[a]]
                a = block[a]
            return a

        for (i, p), t in zip(edges, tied):
            if t:
                block[find(i)] = find(p)
        roots = np.array([find(i) for i in range(m)])
        x = np.empty(m)
        for r in np.unique(roots):
            members = roots == r
            x[members] = np.dot(w[members], y[members]) / w[members].sum()
        if all(x[i] <= x[p] + 1e-9 * (1.0 + abs(x[p])) for i, p in edges):
            loss = float(np.dot(w, (x - y) ** 2))
            if loss < best_loss:
                best, best_loss = x, loss
    assert best is not None  # every count tied into one block per root is feasible
    out = np.maximum(best, 0.0)
    for i, p in enumerate(par):  # parents first: exact feasibility despite rounding
        if p >= 0:
            out[i] = min(out[i], out[p])
    return out


def project_partition(events: float, flagged: float, parts: Sequence[float], w_events: float, w_flagged: float,
                      w_parts: Sequence[float]) -> tuple[float, float, np.ndarray]:
    """Closest point (weighted least squares) with parts >= 0 that sum to flagged, and
    flagged <= events: the report's counts when every flagged event is in one part.

    Written as non-negative least squares in (parts, slack), flagged = sum(parts) and
    events = flagged + slack, and solved exactly (scipy's active-set NNLS). Post-processing.

    >>> e, f, p = project_partition(300.0, 23.0, [89.0, -5.0], 1.0, 1.0, [1.0, 1.0])
    >>> 0 <= p.min() and abs(p.sum() - f) < 1e-9 and f <= e
    True
    """
    y = np.asarray(parts, dtype=float)
    wp = np.asarray(w_parts, dtype=float)
    vals = np.array([events, flagged, *y], dtype=float)
    if not np.all(np.isfinite(vals)):
        raise ValueError("values must be finite")
    if not np.all(np.isfinite(wp)) or np.any(wp <= 0) or not (w_events > 0 and w_flagged > 0) or wp.shape != y.shape:
        raise ValueError("weights must be positive and finite, one per part")
    m = y.size
    if m == 0:
        x = project_nested([events, flagged], [w_events, w_flagged], [-1, 0])
        return float(x[0]), float(x[1]), np.zeros(0)
    # Scale by the largest magnitude so NNLS works on numbers near 1 whatever the counts.
    scale = max(1.0, float(np.abs(vals).max()))
    A = np.zeros((m + 2, m + 1))
    b = np.zeros(m + 2)
    A[:m, :m] = np.diag(np.sqrt(wp))
    b[:m] = np.sqrt(wp) * y / scale
    A[m, :m] = np.sqrt(w_flagged)
    b[m] = np.sqrt(w_flagged) * flagged / scale
    A[m + 1, :] = np.sqrt(w_events)
    b[m + 1] = np.sqrt(w_events) * events / scale
    z, _ = nnls(A, b, maxiter=50 * (m + 1))
    p = np.maximum(z[:m], 0.0) * scale
    f = float(p.sum())
    e = f + max(float(z[m]), 0.0) * scale
    return e, f, p
