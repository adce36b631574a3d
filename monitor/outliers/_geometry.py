"""Geometry behind the outlier count: capped degrees and ball-packing bounds F(P).

Everything works in *scaled* subspace coordinates ``Y = X[:, S] / sqrt(|S|)``, where
the paper's normalised distance dist_S is the plain Euclidean distance, so a ball of
radius r is an ordinary ball.

The F functions bound ``max_c |P ∩ B(c, r)|`` (closed ball) and are monotone and
1-Lipschitz in P, as DESIGN 3.2 requires for the smooth bound:
- 1-D: exact (sorted sweep);
- 2-D: exact (angular sweep around every point);
- d >= 3: degeneracy + 1 of the graph joining points within 2r (a ball of radius r
  holds a clique of that graph).
Which one is used depends on the dimension only, never on the data.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.spatial import cKDTree

__all__ = ["scaled", "degrees", "BallPacking"]


def scaled(X: np.ndarray, subspace: tuple[int, ...] | None) -> np.ndarray:
    """Rows of X restricted to ``subspace`` and divided by sqrt(|S|)."""
    Y = X if subspace is None else X[:, list(subspace)]
    return np.ascontiguousarray(Y, dtype=float) / math.sqrt(Y.shape[1])


def degrees(Y: np.ndarray, r: float, cap: int) -> np.ndarray:
    """min(deg(x), cap) for every row: deg counts OTHER rows within distance r (closed).

    Only degrees below ``cap`` are ever used, so dense regions are cut short instead of
    counting their pairs: a row within r/2 of a pivot whose r/2-ball holds more than
    ``cap`` rows has all of those rows within r, so its degree is at least ``cap``.
    """
    n, d = Y.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if d == 1:
        v = np.sort(Y[:, 0])
        x = Y[:, 0]
        deg = np.searchsorted(v, x + r, side="right") - np.searchsorted(v, x - r, side="left") - 1
        return np.minimum(deg, cap)
    out = np.full(n, cap, dtype=np.int64)
    if d <= _GRID_MAX_DIM:
        todo = np.flatnonzero(_block_counts(Y, r) <= cap)
        if todo.size == 0:
            return out
        tree = cKDTree(Y)
    else:
        tree = cKDTree(Y)
        todo = np.arange(n)
        if n > _PIVOTS:
            pivots = Y[:: n // _PIVOTS]
            dense = pivots[tree.query_ball_point(pivots, r / 2, return_length=True) > cap]
            if len(dense):
                near, _ = cKDTree(dense).query(Y, distance_upper_bound=r / 2)
                todo = np.flatnonzero(near > r / 2)
    if todo.size and cap <= _KNN_MAX_CAP:
        # Small caps (the plain count): the cap + 1 nearest rows (self included) suffice.
        dist, _ = tree.query(Y[todo], k=cap + 1, distance_upper_bound=np.nextafter(r, np.inf))
        out[todo] = np.count_nonzero(dist.reshape(todo.size, -1) <= r, axis=1) - 1
    elif todo.size:
        deg = tree.query_ball_point(Y[todo], r, return_length=True) - 1
        out[todo] = np.minimum(deg, cap)
    return out


_KNN_MAX_CAP = 16


def _block_counts(Y: np.ndarray, r: float) -> np.ndarray:
    """For each row, the rows in the 3^d block of grid cells around its cell.

    With cell side r / (2 sqrt d) every row of the block is within r, so this minus one
    is a lower bound on the degree, found without looking at pairs.
    """
    n, d = Y.shape
    side = r / (2 * math.sqrt(d))
    cells = np.floor((Y - Y.min(0)) / side).astype(np.int64) + 1
    dims = tuple(int(m) + 2 for m in cells.max(0))
    keys = np.ravel_multi_index(cells.T, dims)
    uniq, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    total = np.zeros(uniq.size, dtype=np.int64)
    ucells = np.stack(np.unravel_index(uniq, dims))
    for offset in itertools.product((-1, 0, 1), repeat=d):
        nb = np.ravel_multi_index(ucells + np.array(offset)[:, None], dims)
        pos = np.minimum(np.searchsorted(uniq, nb), uniq.size - 1)
        total += np.where(uniq[pos] == nb, counts[pos], 0)
    return total[inverse.ravel()]


_GRID_MAX_DIM = 3
# Pivots for the dense-region shortcut: enough to cover clusters, few enough to be cheap.
_PIVOTS = 2000


class BallPacking:
    """F evaluated on many subsets of one point set (the nested bands of the smooth bound).

    The geometry (pairs within 2r and, in 2-D, the arcs of the angular sweep, sorted
    once) is shared, so each subset costs one masked pass instead of a new search.
    """

    def __init__(self, P: np.ndarray, r: float) -> None:
        self.n, self.d = P.shape
        self.r = r
        if self.d == 1:
            self.order = np.argsort(P[:, 0], kind="stable")
            self.values = P[self.order, 0]
            return
        pairs = cKDTree(P).query_pairs(2 * r, output_type="ndarray") if self.n > 1 else np.zeros((0, 2), int)
        if self.d == 2:
            self._prepare_arcs(P, pairs)
        else:
            self.a, self.b = pairs[:, 0], pairs[:, 1]

    def count(self, mask: np.ndarray) -> int:
        """F of the rows selected by the boolean ``mask``."""
        m = int(np.count_nonzero(mask))
        if m <= 1:
            return m
        if self.d == 1:
            v = self.values[mask[self.order]]
            return int(np.max(np.searchsorted(v, v + 2 * self.r, side="right") - np.arange(m)))
        if self.d == 2:
            return self._sweep(mask)
        keep = mask[self.a] & mask[self.b]
        if not keep.any():
            return 1
        return _degeneracy(self.n, self.a[keep], self.b[keep]) + 1

    def _prepare_arcs(self, P: np.ndarray, pairs: np.ndarray) -> None:
        # Some optimal disc has a point of P on its boundary; for pivot p, the centres
        # p + r(cos a, sin a) that also cover q form a closed arc of half-width
        # acos(|pq| / 2r). Arcs are sorted once by (pivot, angle, start-before-end).
        i = np.concatenate([pairs[:, 0], pairs[:, 1]])
        j = np.concatenate([pairs[:, 1], pairs[:, 0]])
        diff = P[j] - P[i]
        dist = np.hypot(diff[:, 0], diff[:, 1])
        # Coincident points are covered by every disc through the pivot.
        same = dist <= 1e-15
        self.same_i, self.same_j = i[same], j[same]
        i, j, diff, dist = i[~same], j[~same], diff[~same], dist[~same]
        phi = np.arctan2(diff[:, 1], diff[:, 0])
        half = np.arccos(np.clip(dist / (2 * self.r), 0.0, 1.0))
        two_pi = 2 * math.pi
        start = np.mod(phi - half, two_pi)
        end = start + 2 * half
        wraps = end >= two_pi
        end = np.where(wraps, end - two_pi, end)
        # Arcs that wrap cover angle 0: they start the sweep "on".
        self.wrap_i, self.wrap_j = i[wraps], j[wraps]
        piv = np.concatenate([i, i])
        nb = np.concatenate([j, j])
        ang = np.concatenate([start, end])
        kind = np.concatenate([np.zeros(i.size, np.int8), np.ones(i.size, np.int8)])
        order = np.lexsort((kind, ang, piv))
        self.piv, self.nb = piv[order], nb[order]
        self.step = np.where(kind[order] == 0, 1, -1).astype(np.int64)

    def _sweep(self, mask: np.ndarray) -> int:
        n = self.n
        base = np.bincount(self.same_i[mask[self.same_i] & mask[self.same_j]], minlength=n)
        base += np.bincount(self.wrap_i[mask[self.wrap_i] & mask[self.wrap_j]], minlength=n)
        best = int(base[mask].max())
        keep = mask[self.piv] & mask[self.nb]
        if keep.any():
            piv, step = self.piv[keep], self.step[keep]
            run = np.cumsum(step)
            seg = np.flatnonzero(np.r_[True, piv[1:] != piv[:-1]])
            offset = np.repeat(run[seg] - step[seg], np.diff(np.r_[seg, piv.size]))
            best = max(best, int((run - offset + base[piv]).max()))
        return 1 + best


def _degeneracy(n: int, a: np.ndarray, b: np.ndarray) -> int:
    """Largest c such that the graph with edges (a, b) has a non-empty c-core."""
    full = np.bincount(a, minlength=n) + np.bincount(b, minlength=n)

    def has_core(c: int) -> bool:
        alive = full >= c
        while True:
            keep = alive[a] & alive[b]
            deg = np.bincount(a[keep], minlength=n) + np.bincount(b[keep], minlength=n)
            nxt = alive & (deg >= c)
            if nxt.sum() == alive.sum():
                return bool(alive.any())
            alive = nxt

    lo, hi = 0, int(full.max())  # has_core(0) always holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if has_core(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
