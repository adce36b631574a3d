"""Geometry behind the outlier count: capped degrees and ball-packing bounds F(P).

Everything works in *scaled* subspace coordinates ``Y = X[:, S] / sqrt(|S|)``, where
the paper's normalised distance dist_S is the plain Euclidean distance, so a ball of
radius r is an ordinary ball.

Floating point (DESIGN 8). Both predicates are functions of the two rows only, computed
the same way wherever they are used (:func:`sq_dist`, summed in a fixed order):

- the count's: ``y`` is within r of ``x`` iff ``sq_dist(x, y) <= r * r``;
- the packing graph's edge: ``sq_dist(x, y) <= EDGE_FACTOR * (4 * r * r)``.

fl(sq_dist) is within a relative (d + 2) u of the real squared distance (a difference, a
square and d - 1 additions of non-negative terms, each rounding relatively), so two rows
within r of a common centre by the count's predicate are at real distance at most
2 r (1 + (d + 2) u) and pass the edge predicate for any d < 10^6 (EDGE_FACTOR = 1 + 1e-9):
every set the count's ball can hold is a clique of the edge graph. kd-trees only propose
candidates (at a radius 1e-9 wider than any pair passing the predicate); the predicates
decide, so the result never depends on the tree's own rounding or shape.

The F functions bound ``max_c |P ∩ B(c, r)|`` and are monotone and 1-Lipschitz in P by
construction (DESIGN 3.2), because they are the clique number, or the degeneracy + 1, of
the graph the fixed edge predicate induces on P:
- 1-D: the clique number, exactly: the edge graph of sorted values is a proper interval
  graph (fl(v_j - v_i) is monotone in each argument), whose largest clique is the
  largest "anchored" run {j : v_j >= v_i, edge(i, j)};
- d >= 2: degeneracy + 1 (a clique of size c has c - 1 as degeneracy at least).
Which one is used depends on the dimension only, never on the data.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.spatial import cKDTree

__all__ = ["scaled", "degrees", "BallPacking", "sq_dist", "EDGE_FACTOR"]

EDGE_FACTOR = 1.0 + 1e-9
# Candidate radius factor for the kd-tree: any pair passing a predicate with threshold
# R^2 is at real distance <= R (1 + 1e-15 d), and the tree's own computed distance is as
# close to the real one, so a query at R (1 + 4e-9) misses none.
_CANDIDATE = 1.0 + 4e-9


def scaled(X: np.ndarray, subspace: tuple[int, ...] | None) -> np.ndarray:
    """Rows of X restricted to ``subspace`` and divided by sqrt(|S|)."""
    Y = X if subspace is None else X[:, list(subspace)]
    return np.ascontiguousarray(Y, dtype=float) / math.sqrt(Y.shape[1])


def sq_dist(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Squared distance of paired rows, summed left to right over the columns: the one
    float function both predicates use."""
    D = (A - B) ** 2
    out = D[..., 0].copy()
    for j in range(1, D.shape[-1]):
        out += D[..., j]
    return out


def degrees(Y: np.ndarray, r: float, cap: int) -> np.ndarray:
    """min(deg(x), cap) for every row: deg counts OTHER rows y with sq_dist(x, y) <= r*r.

    Only degrees below ``cap`` are ever used, so dense regions are cut short instead of
    counting their pairs: a row within r/2 of a pivot whose r/2-ball holds more than
    ``cap`` rows has all of those rows within r, so its degree is at least ``cap``. The
    shortcuts use radii 1e-6 smaller than needed, so their float rounding can only make
    them skip work, never count a pair the predicate would not.
    """
    n, d = Y.shape
    r2 = r * r
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if d == 1:
        v = np.sort(Y[:, 0])
        x = Y[:, 0]
        lo = _run_end(v, x, r2, np.searchsorted(v, x - r, side="left"), upward=False)
        hi = _run_end(v, x, r2, np.searchsorted(v, x + r, side="right"), upward=True)
        return np.minimum(hi - lo - 1, cap)
    out = np.full(n, cap, dtype=np.int64)
    todo = _not_dense(Y, r, cap)
    if todo.size == 0:
        return out
    out[todo] = _neighbour_counts(cKDTree(Y), Y, todo, r, r2, cap)
    return out


def _not_dense(Y: np.ndarray, r: float, cap: int) -> np.ndarray:
    """Rows whose degree the shortcuts could not show to be >= cap."""
    n, d = Y.shape
    if d <= _GRID_MAX_DIM:
        return np.flatnonzero(_block_counts(Y, r) <= cap)
    todo = np.arange(n)
    if n > _PIVOTS or (cap > 16 and n > cap):  # worth it for large caps (the smooth bound)
        safe = r / 2 * (1 - 1e-6)
        pivots = Y[:: max(1, n // _PIVOTS)]
        tree = cKDTree(Y)
        dense = pivots[tree.query_ball_point(pivots, safe, return_length=True) > cap]
        if len(dense):
            near, _ = cKDTree(dense).query(Y, distance_upper_bound=safe)
            todo = np.flatnonzero(near > safe)
    return todo


def _neighbour_counts(tree: cKDTree, Y: np.ndarray, rows: np.ndarray, r: float, r2: float, cap: int) -> np.ndarray:
    """min(#{y : sq_dist(x, y) <= r2} - 1, cap) for the given rows (the tree proposes)."""
    if rows.size == 0:
        return np.zeros(0, dtype=np.int64)
    slots = min(cap, _KNN_MAX_CAP) + 1
    counts = np.empty(rows.size, dtype=np.int64)
    full = np.zeros(rows.size, dtype=bool)
    for start in range(0, rows.size, _CHUNK):  # bounded memory: _CHUNK x slots candidates
        part = rows[start:start + _CHUNK]
        dist, idx = tree.query(Y[part], k=slots, distance_upper_bound=r * _CANDIDATE)
        dist, idx = dist.reshape(part.size, slots), idx.reshape(part.size, slots)
        found = np.isfinite(dist)
        ok = found.copy()
        ok[found] = sq_dist(Y[np.repeat(part, slots)[found.ravel()]], Y[idx[found]]) <= r2
        counts[start:start + part.size] = np.count_nonzero(ok, axis=1) - 1
        full[start:start + part.size] = found[:, -1] & ~ok.all(axis=1) | found[:, -1] & (slots <= cap)
    # A full row of candidates says nothing about the rows beyond the slots, unless all
    # passed and the cap is reached: count those rows in full.
    redo = np.flatnonzero(full)
    if redo.size:
        counts[redo] = _ball_counts(tree, Y, rows[redo], r, r2)
    return np.minimum(counts, cap)


def _ball_counts(tree: cKDTree, Y: np.ndarray, rows: np.ndarray, r: float, r2: float) -> np.ndarray:
    """#{y : sq_dist(x, y) <= r2} - 1 for the given rows. Pairs inside r (1 - 4e-9) by
    the tree's distance pass the predicate and pairs beyond r (1 + 4e-9) fail it, so only
    rows with a pair in between need their candidates checked one by one."""
    hi = tree.query_ball_point(Y[rows], r * _CANDIDATE, return_length=True)
    lo = tree.query_ball_point(Y[rows], r * (2 - _CANDIDATE), return_length=True)
    out = hi - 1
    for i in np.flatnonzero(lo != hi):
        cand = np.asarray(tree.query_ball_point(Y[rows[i]], r * _CANDIDATE), dtype=np.int64)
        out[i] = np.count_nonzero(sq_dist(Y[cand], Y[rows[i]][None, :]) <= r2) - 1
    return out


def _run_end(v: np.ndarray, x: np.ndarray, r2: float, guess: np.ndarray, upward: bool) -> np.ndarray:
    """End of the run of sorted ``v`` around each ``x`` with (v - x)^2 <= r2 (float).

    The predicate is monotone along ``v`` on each side of ``x`` (fl(v - x) is monotone in
    v), so the run is contiguous; ``guess`` (from searchsorted at x +- r) is moved over
    whole runs of equal values until it sits exactly on the boundary. Upward: first index
    past the run; downward: first index of the run.
    """
    n = v.size
    pos = guess.copy()
    while True:
        if upward:
            grow = pos < n
            grow[grow] = (v[pos[grow]] - x[grow]) ** 2 <= r2
            shrink = pos > 0
            shrink[shrink] = (v[pos[shrink] - 1] - x[shrink]) ** 2 > r2
            new = np.where(grow, np.searchsorted(v, v[np.minimum(pos, n - 1)], side="right"), pos)
            new = np.where(shrink, np.searchsorted(v, v[np.maximum(pos - 1, 0)], side="left"), new)
        else:
            grow = pos > 0
            grow[grow] = (v[pos[grow] - 1] - x[grow]) ** 2 <= r2
            shrink = pos < n
            shrink[shrink] = (v[pos[shrink]] - x[shrink]) ** 2 > r2
            new = np.where(grow, np.searchsorted(v, v[np.maximum(pos - 1, 0)], side="left"), pos)
            new = np.where(shrink, np.searchsorted(v, v[np.minimum(pos, n - 1)], side="right"), new)
        if np.array_equal(new, pos):
            return pos
        pos = new


_KNN_MAX_CAP = 64
_CHUNK = 50_000


def _block_counts(Y: np.ndarray, r: float) -> np.ndarray:
    """For each row, the rows in the 3^d block of grid cells around its cell (0 when the
    grid cannot be trusted in floats).

    With cell side r / (2 sqrt d) (1 - 1e-6) every row of the block is within r by the
    count's predicate, so this minus one is a lower bound on the degree, found without
    looking at pairs. The cell of a row is off by at most u |Y - min| / side cells, far
    inside the 1e-6 margin when the extent is below 1e9 cells; beyond, no shortcut.
    """
    n, d = Y.shape
    side = r / (2 * math.sqrt(d)) * (1 - 1e-6)
    low = Y.min(0)
    extent = (Y.max(0) - low) / side
    if not np.all(extent < 1e9) or np.prod(extent + 3) > 2.0**62:
        return np.zeros(n, dtype=np.int64)
    cells = np.floor((Y - low) / side).astype(np.int64) + 1
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


def edge_pairs(P: np.ndarray, r: float, known: "EdgeHint | None" = None) -> tuple[np.ndarray, np.ndarray]:
    """All pairs (a < b) of rows of P joined by the edge predicate.

    ``known`` (from :func:`degrees_and_edges` on a superset) gives the whole candidate
    lists of some rows; only the other rows are searched.
    """
    n = P.shape[0]
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    reach = 2 * r * _CANDIDATE
    if known is None:
        tree = cKDTree(P, leafsize=_LEAF)
        rows, cols, full = _candidates(tree, P, np.arange(n), reach)
    else:
        rows, cols, full = known.rows, known.cols, np.flatnonzero(~known.complete)
        tree = cKDTree(P, leafsize=_LEAF) if full.size else None
    if full.size:
        lists = tree.query_ball_point(P[full], reach)
        lengths = np.fromiter((len(x) for x in lists), np.int64, full.size)
        rows = np.concatenate([rows, np.repeat(full, lengths)])
        cols = np.concatenate([cols, np.fromiter(itertools.chain.from_iterable(lists), np.int64, int(lengths.sum()))])
    # Each pair is proposed from both ends (each end's list is whole); keep it once.
    keep = rows < cols
    rows, cols = rows[keep], cols[keep]
    if rows.size:
        ok = sq_dist(P[rows], P[cols]) <= EDGE_FACTOR * (4 * r * r)
        rows, cols = rows[ok], cols[ok]
    key = np.unique(rows * n + cols)
    return key // n, key % n


def _candidates(tree: cKDTree, Y: np.ndarray, rows: np.ndarray, reach: float):
    """(row, col) candidates within ``reach`` of each of ``rows``, found with a few nearest
    neighbours (sparse neighbourhoods are the common case), and the rows whose slots all
    filled, so that their lists may be incomplete."""
    slots = min(tree.n, _EDGE_SLOTS)
    dist, idx = tree.query(Y[rows], k=slots, distance_upper_bound=reach)
    dist, idx = dist.reshape(rows.size, slots), idx.reshape(rows.size, slots)
    found = np.isfinite(dist)
    complete = ~found[:, -1] | (slots == tree.n)
    sel = found & complete[:, None]
    return np.broadcast_to(rows[:, None], sel.shape)[sel], idx[sel], rows[~complete]


class EdgeHint:
    """Whole candidate lists (within 2r, then the edge predicate) of the rows of a window
    whose neighbourhood was small, restricted to a subset with :meth:`subset`."""

    def __init__(self, n: int, complete: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> None:
        self.n, self.complete, self.rows, self.cols = n, complete, rows, cols

    def subset(self, take: np.ndarray) -> "EdgeHint":
        local = np.full(self.n, -1, dtype=np.int64)
        local[take] = np.arange(take.size)
        a, b = local[self.rows], local[self.cols]
        keep = (a >= 0) & (b >= 0)
        return EdgeHint(take.size, self.complete[take], a[keep], b[keep])


def degrees_and_edges(Y: np.ndarray, r: float, cap: int) -> tuple[np.ndarray, EdgeHint]:
    """:func:`degrees` and, from the same search, the edge candidates of the sparse rows.

    One query within 2r gives both the degree (the count's predicate on the list) and the
    packing graph's candidates of every row with a small 2r-neighbourhood; the others get
    their degree from the usual search. Same values as :func:`degrees` and
    :func:`edge_pairs`, computed once.
    """
    n = Y.shape[0]
    r2 = r * r
    out = np.full(n, cap, dtype=np.int64)
    complete = np.zeros(n, dtype=bool)
    empty = np.zeros(0, np.int64)
    todo = _not_dense(Y, r, cap) if n else empty
    if todo.size == 0:
        return out, EdgeHint(n, complete, empty, empty)
    tree = cKDTree(Y, leafsize=_LEAF)
    rows, cols, full = _candidates(tree, Y, todo, 2 * r * _CANDIDATE)
    d2 = sq_dist(Y[rows], Y[cols])
    near = d2 <= r2
    whole = np.setdiff1d(todo, full, assume_unique=True)
    complete[whole] = True
    out[whole] = np.minimum(np.bincount(rows[near], minlength=n)[whole] - 1, cap)
    out[full] = _neighbour_counts(tree, Y, full, r, r2, cap)
    edge = d2 <= EDGE_FACTOR * (4 * r * r)
    return out, EdgeHint(n, complete, rows[edge], cols[edge])


_LEAF = 32
_EDGE_SLOTS = 8
class BallPacking:
    """F evaluated on many subsets of one point set (the nested bands of the smooth bound).

    The geometry (sorted values in 1-D, the edge pairs beyond) is computed once, so each
    subset costs one masked pass instead of a new search.
    """

    def __init__(self, P: np.ndarray, r: float, known: EdgeHint | None = None) -> None:
        self.n, self.d = P.shape
        self.r = r
        if self.d == 1:
            self.order = np.argsort(P[:, 0], kind="stable")
            self.values = P[self.order, 0]
            return
        self.a, self.b = edge_pairs(P, r, known)

    def count(self, mask: np.ndarray) -> int:
        """F of the rows selected by the boolean ``mask``."""
        m = int(np.count_nonzero(mask))
        if m <= 1:
            return m
        if self.d == 1:
            v = self.values[mask[self.order]]
            start = np.searchsorted(v, v, side="left")
            t2 = EDGE_FACTOR * (4 * self.r * self.r)
            end = _run_end(v, v, t2, np.searchsorted(v, v + 2 * self.r, side="right"), upward=True)
            return int(np.max(end - start))
        keep = mask[self.a] & mask[self.b]
        if not keep.any():
            return 1
        return _degeneracy(self.n, self.a[keep], self.b[keep]) + 1


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
