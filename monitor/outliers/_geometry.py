"""Geometry behind the outlier count: capped degrees and ball-packing bounds F(P).

Everything works in *scaled* subspace coordinates ``Y = X[:, S] / sqrt(|S|)``, where
the paper's normalised distance dist_S is the plain Euclidean distance, so a ball of
radius r is an ordinary ball.

Floating point (docs/design.md#floating-point). Both predicates are functions of the two rows only, computed
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
construction (docs/design.md#outlier-counts), because they are the clique number, or the degeneracy + 1, of
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
        # Rows taken in sorted order: the searches then walk the array once (searchsorted
        # with sorted needles), several times faster than in the rows' own order.
        order = np.argsort(Y[:, 0])
        v = Y[order, 0]
        lo = _run_end(v, v, r2, np.searchsorted(v, v - r, side="left"), upward=False)
        hi = _run_end(v, v, r2, np.searchsorted(v, v + r, side="right"), upward=True)
        out = np.empty(n, dtype=np.int64)
        out[order] = np.minimum(hi - lo - 1, cap)
        return out
    out = np.full(n, cap, dtype=np.int64)
    todo = _not_dense(Y, r, cap)
    if todo.size == 0:
        return out
    # Low dimensions: few rows are left after the grid shortcut and building the tree is
    # most of the work; the sliding-midpoint build is about twice as fast.
    fast = dict(leafsize=32, balanced_tree=False, compact_nodes=False) if d <= GRID_MAX_DIM else {}
    out[todo] = _neighbour_counts(cKDTree(Y, **fast), Y, todo, r, r2, cap)
    return out


def _not_dense(Y: np.ndarray, r: float, cap: int) -> np.ndarray:
    """Rows whose degree the shortcuts could not show to be >= cap."""
    n, d = Y.shape
    if d <= GRID_MAX_DIM:
        return np.flatnonzero(_block_counts(Y, r) <= cap)
    todo = np.arange(n)
    if n > _PIVOTS or (cap > 16 and n > cap):  # worth it for large caps (the smooth bound)
        safe = r / 2 * (1 - 1e-6)
        # Small windows need fewer pivots: a dense region holds more than cap rows.
        pivots = Y[:: max(1, n // min(_PIVOTS, max(_PIVOTS_SMALL, n // 8)))]
        tree = cKDTree(Y)
        dense = pivots[tree.query_ball_point(pivots, safe, return_length=True) > cap]
        if len(dense):
            near, _ = cKDTree(dense).query(Y, distance_upper_bound=safe)
            todo = np.flatnonzero(near > safe)
    return todo


def _neighbour_counts(tree: cKDTree, Y: np.ndarray, rows: np.ndarray, r: float, r2: float, cap: int) -> np.ndarray:
    """min(#{y : sq_dist(x, y) <= r2} - 1, cap) for the given rows (the tree proposes).

    A few nearest candidates settle most rows (sparse neighbourhoods are the common
    case); only rows whose slots all filled are asked again with more slots, then in full.
    """
    counts = np.zeros(rows.size, dtype=np.int64)
    todo = np.arange(rows.size)
    for most in _KNN_SLOTS:
        if todo.size == 0:
            break
        slots = min(cap, most) + 1
        full = np.zeros(todo.size, dtype=bool)
        for start in range(0, todo.size, _CHUNK):  # bounded memory: _CHUNK x slots candidates
            part = rows[todo[start:start + _CHUNK]]
            dist, idx = tree.query(Y[part], k=slots, distance_upper_bound=r * _CANDIDATE)
            dist, idx = dist.reshape(part.size, slots), idx.reshape(part.size, slots)
            found = np.isfinite(dist)
            ok = found.copy()
            ok[found] = sq_dist(Y[np.repeat(part, slots)[found.ravel()]], Y[idx[found]]) <= r2
            counts[todo[start:start + part.size]] = np.count_nonzero(ok, axis=1) - 1
            # A full row of candidates says nothing about the rows beyond the slots,
            # unless all passed and the cap is reached.
            full[start:start + part.size] = found[:, -1] & ~ok.all(axis=1) | found[:, -1] & (slots <= cap)
        todo = todo[full]
    if todo.size:
        counts[todo] = _ball_counts(tree, Y[rows[todo]], r, r2) - 1
    return np.minimum(counts, cap)


def _ball_counts(tree: cKDTree, Q: np.ndarray, r: float, r2: float) -> np.ndarray:
    """#{y in the tree : sq_dist(x, y) <= r2} for each row x of Q. Pairs inside
    r (1 - 4e-9) by the tree's distance pass the predicate and pairs beyond r (1 + 4e-9)
    fail it, so only rows with a pair in between need their candidates checked one by one."""
    hi = tree.query_ball_point(Q, r * _CANDIDATE, return_length=True)
    lo = tree.query_ball_point(Q, r * (2 - _CANDIDATE), return_length=True)
    out = np.asarray(hi, dtype=np.int64).copy()
    for i in np.flatnonzero(lo != hi):
        cand = np.asarray(tree.query_ball_point(Q[i], r * _CANDIDATE), dtype=np.int64)
        out[i] = np.count_nonzero(sq_dist(tree.data[cand], Q[i][None, :]) <= r2)
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


_KNN_SLOTS = (8, 64)
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
    # Column by column: numpy's axis-0 reductions over a few columns are ~30x slower.
    low = np.array([Y[:, j].min() for j in range(d)])
    extent = (np.array([Y[:, j].max() for j in range(d)]) - low) / side
    if not np.all(extent < 1e9) or np.prod(extent + 3) > 2.0**62:
        return np.zeros(n, dtype=np.int64)
    cells = np.floor((Y - low) / side).astype(np.int64) + 1
    dims = tuple(int(cells[:, j].max()) + 2 for j in range(d))
    keys = np.ravel_multi_index(cells.T, dims)
    if math.prod(dims) <= max(4 * n, 2**16):
        # Small grids: a dense array of cell counts and its 3^d box sums by shifted slices
        # (the padding cells around the occupied range are empty, so edges need no care).
        grid = np.bincount(keys, minlength=math.prod(dims)).reshape(dims)
        box = np.zeros_like(grid)
        core = tuple(slice(1, m - 1) for m in dims)
        for offset in itertools.product((-1, 0, 1), repeat=d):
            box[core] += grid[tuple(slice(1 + o, m - 1 + o) for o, m in zip(offset, dims))]
        return box.ravel()[keys]
    uniq, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    total = np.zeros(uniq.size, dtype=np.int64)
    ucells = np.stack(np.unravel_index(uniq, dims))
    for offset in itertools.product((-1, 0, 1), repeat=d):
        nb = np.ravel_multi_index(ucells + np.array(offset)[:, None], dims)
        pos = np.minimum(np.searchsorted(uniq, nb), uniq.size - 1)
        total += np.where(uniq[pos] == nb, counts[pos], 0)
    return total[inverse.ravel()]


GRID_MAX_DIM = 3
# Pivots for the dense-region shortcut: enough to cover clusters, few enough to be cheap.
_PIVOTS = 2000
_PIVOTS_SMALL = 256


def close_pairs(P: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, sq_dist) of all pairs a < b of rows of P with ``sq_dist(P[a], P[b]) <= threshold``.

    The kd-tree only proposes candidates; the predicate decides each one. Beyond
    ``SPLIT_MIN_DIM`` dimensions a ball search at the full radius prunes badly (most of
    the tree is visited), so the columns are split into two halves A and B: a pair within
    R has d_A^2 + d_B^2 <= R^2, so min(d_A, d_B) <= R / sqrt(2), and the pairs within
    R / sqrt(2) of either half, each found in a kd-tree of half the dimension, hold every
    pair within R. Float margin: a pair passing the predicate is within sqrt(threshold)
    (1 + 1e-15 d) in reals, so some half is within sqrt(threshold / 2) (1 + 1e-15 d) in
    reals and within that times (1 + 1e-15 d) by the tree's own arithmetic, inside the
    query radius (factor _CANDIDATE = 1 + 4e-9).
    """
    n, d = P.shape
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    reach = math.sqrt(threshold) * _CANDIDATE
    if d < SPLIT_MIN_DIM:
        halves = [(slice(None), reach)]
    else:
        h = d // 2
        halves = [(slice(0, h), reach / math.sqrt(2)), (slice(h, d), reach / math.sqrt(2))]
    from monitor.outliers import _compiled  # numba: imported on the first search, not by every command

    a, b, d2 = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    for cols, radius in halves:
        # The search and the predicate's gathers run on a copy of the rows stored in the
        # order of a first tree's leaves, where pairs are mostly nearby in memory (on 10^6
        # rows the search is about 18 % faster); the rows are the same, mapped back.
        order = cKDTree(P[:, cols], **_PAIR_TREE).indices.astype(np.int64)
        Po = P[order]
        pairs = cKDTree(np.ascontiguousarray(Po[:, cols]), **_PAIR_TREE).query_pairs(
            radius, output_type="ndarray").reshape(-1, 2)
        scratch = np.empty(min(len(pairs), _PAIR_BLOCK))
        # Candidates are checked in blocks: a 10^6-row 10-D window proposes ~10^8 of them,
        # and a block bounds the scratch distances and the passing pairs held at once.
        for lo in range(0, len(pairs), _PAIR_BLOCK):
            # sq_dist compiled (same bits; symmetric: (x - y)^2 = (y - x)^2 exactly).
            ia, ib, dist = _compiled.close_pairs_block(Po, pairs[lo:lo + _PAIR_BLOCK], order, float(threshold), scratch)
            a.append(ia), b.append(ib), d2.append(dist)
        del pairs, Po
    a, b, d2 = np.concatenate(a), np.concatenate(b), np.concatenate(d2)
    if len(halves) > 1:  # a pair close in both halves was proposed twice
        _, first = np.unique(a * n + b, return_index=True)
        a, b, d2 = a[first], b[first], d2[first]
    return a, b, d2


def degrees_and_pairs(Y: np.ndarray, r: float, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`degrees` and the packing graph's edges among the rows not shown dense, from
    one pair search within 2r: (deg, rows, a, b) with edges (rows[a], rows[b]).

    Where the rows left after the dense shortcut are about the rows the smooth bound's
    bands need (beyond GRID_MAX_DIM), this saves a separate degree search. The
    degree of a listed row counts its pairs within r (the count's predicate on the same
    sq_dist) and the rows shown dense within r of it; every other row has degree >= cap.
    """
    n = Y.shape[0]
    r2 = r * r
    out = np.full(n, cap, dtype=np.int64)
    rows = _not_dense(Y, r, cap) if n else np.zeros(0, np.int64)
    a, b, d2 = close_pairs(Y[rows], EDGE_FACTOR * (4 * r2))
    near = d2 <= r2
    counts = np.bincount(a[near], minlength=rows.size) + np.bincount(b[near], minlength=rows.size)
    dense = np.setdiff1d(np.arange(n), rows, assume_unique=True)
    if dense.size and rows.size:
        counts += _ball_counts(cKDTree(Y[dense]), Y[rows], r, r2)
    out[rows] = np.minimum(counts, cap)
    return out, rows, a, b


# Dimension from which the pair search splits the columns (measured on diffuse 100,000-row
# windows, bench_core --cost: at 10-D the split search is 2-3x faster, below 8-D slower).
SPLIT_MIN_DIM = 8
# Sliding-midpoint trees (not median-balanced) pair up faster on these windows: diffuse
# 100,000 rows 0.91 -> 0.70 s in 5-D, 1.76 -> 1.38 s in 10-D; 10^6 rows in 5-D 36 -> 33 s.
_PAIR_TREE = dict(leafsize=16, balanced_tree=False, compact_nodes=False)
_PAIR_BLOCK = 1 << 22


class BallPacking:
    """F evaluated on many subsets of one point set (the nested bands of the smooth bound).

    The geometry (sorted values in 1-D, the edge pairs beyond) is computed once, so each
    subset costs one masked pass instead of a new search.
    """

    def __init__(self, P: np.ndarray, r: float, edges: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.n, self.d = P.shape
        self.r = r
        if self.d == 1:
            self.order = np.argsort(P[:, 0], kind="stable")
            self.values = P[self.order, 0]
            return
        # ``edges``: the edge predicate's pairs among P, when a search already found them.
        self.a, self.b = edges if edges is not None else close_pairs(P, EDGE_FACTOR * (4 * r * r))[:2]
        self._P = P
        self._seen: list[tuple[np.ndarray, int, int | None]] = []  # (mask, lo, hi): lo <= F(mask) <= hi
        self._graph: _Cores | None = None

    def _cores(self) -> "_Cores":
        if self._graph is None:  # built on the first mask that needs a graph search
            self._graph = _Cores(self.n, self.a, self.b, order=cKDTree(self._P, **_PAIR_TREE).indices)
        return self._graph

    def count(self, mask: np.ndarray) -> int:
        """F of the rows selected by the boolean ``mask``.

        Beyond 1-D what is already known about other masks S brackets the search: F is
        monotone and 1-Lipschitz, so F(S) - |S minus M| <= F(M) <= F(S) + |M minus S|.
        The brackets only shorten the degeneracy search, never change its result.
        """
        small = self._small(mask)
        if small is not None:
            return small
        lo, hi = self._bracket(mask)
        f = self._cores().degeneracy(mask, lo - 1, None if hi is None else hi - 1) + 1
        self._seen.append((mask.copy(), f, f))
        return f

    def at_most(self, mask: np.ndarray, f: int) -> bool:
        """Whether F of the rows selected by ``mask`` is <= f (one peel instead of a search)."""
        small = self._small(mask)
        if small is not None:
            return small <= f
        lo, hi = self._bracket(mask)
        if hi is not None and hi <= f:
            return True
        if lo > f:
            return False
        # F <= f iff the degeneracy is <= f - 1 iff the f-core is empty.
        empty = self._cores().core_is_empty(mask, f)
        self._seen.append((mask.copy(), lo, f) if empty else (mask.copy(), f + 1, hi))
        return empty

    def _small(self, mask: np.ndarray) -> int | None:
        """F where it needs no graph search (at most one row, 1-D, or no edge), else None."""
        m = int(np.count_nonzero(mask))
        if m <= 1:
            return m
        if self.d == 1:
            v = self.values[mask[self.order]]
            start = np.searchsorted(v, v, side="left")
            t2 = EDGE_FACTOR * (4 * self.r * self.r)
            end = _run_end(v, v, t2, np.searchsorted(v, v + 2 * self.r, side="right"), upward=True)
            return int(np.max(end - start))
        if self._cores().top(mask) == 0:  # no row of the mask has an edge at all
            return 1
        return None

    def _bracket(self, mask: np.ndarray) -> tuple[int, int | None]:
        """(lo, hi) with lo <= F(mask) <= hi (hi None: unknown), for a mask of two rows or more."""
        lo, hi = 1, None
        for seen, f_lo, f_hi in self._seen:
            lo = max(lo, f_lo - int(np.count_nonzero(seen & ~mask)))
            if f_hi is not None:
                up = f_hi + int(np.count_nonzero(mask & ~seen))
                hi = up if hi is None else min(hi, up)
        return lo, hi


class _Cores:
    """k-cores of the subgraphs that vertex masks induce on one fixed graph.

    The adjacency is kept in CSR form and the core number of every vertex in the whole
    graph is found once: a subgraph's c-core lies inside the whole graph's c-core, so a
    question about it starts from there instead of from the whole mask. The peels run
    compiled (``monitor.outliers._compiled``): on diffuse 10^6-row windows, where the smooth
    bound asks about 40 such questions of an 8 x 10^7-edge graph, they were most of the
    release in numpy.
    """

    def __init__(self, n: int, a: np.ndarray, b: np.ndarray, order: np.ndarray | None = None) -> None:
        from monitor.outliers import _compiled

        # The vertices are relabelled in ``order`` (the rows in a kd-tree's leaf order:
        # neighbours get nearby labels), so the peels' degree updates stay near each
        # other in memory: on 10^6 rows the whole graph's cores take half the time.
        self._order = None if order is None else np.asarray(order, dtype=np.int64)
        if self._order is not None:
            rank = np.empty(n, dtype=np.int64)
            rank[self._order] = np.arange(n)
            a, b = rank[a], rank[b]
        self._kernels, self.n = _compiled, n
        self.indptr, self.nbrs = _compiled.adjacency(n, np.asarray(a, np.int64), np.asarray(b, np.int64))
        self._core = _compiled.core_numbers(self.indptr, self.nbrs, np.ones(n, dtype=bool))

    @property
    def core(self) -> np.ndarray:
        """Core number of each vertex in the whole graph (in the caller's labels)."""
        if self._order is None:
            return self._core
        out = np.empty(self.n, dtype=np.int64)
        out[self._order] = self._core
        return out

    def _local(self, mask: np.ndarray) -> np.ndarray:
        return mask if self._order is None else mask[self._order]

    def top(self, mask: np.ndarray) -> int:
        """An upper bound on the degeneracy of the subgraph of ``mask``: its largest core number."""
        return int(self._core[self._local(mask)].max(initial=0))

    def degeneracy(self, mask: np.ndarray, lo: int = 1, hi: int | None = None) -> int:
        """Largest c with a non-empty c-core in the subgraph of ``mask``, given lo <= c
        (and c <= hi when given).

        For c >= lo the c-cores of the mask's subgraph are those of the subgraph induced
        by its rows in the whole graph's lo-core, so the core numbers of that smaller
        subgraph settle it in one pass.
        """
        hi = self.top(mask) if hi is None else min(hi, self.top(mask))
        if lo >= hi:
            return lo
        alive = self._local(mask) & (self._core >= lo)
        return max(lo, int(self._kernels.core_numbers(self.indptr, self.nbrs, alive).max(initial=0)))

    def core_is_empty(self, mask: np.ndarray, c: int) -> bool:
        """Whether the subgraph of ``mask`` has an empty c-core."""
        if self.top(mask) < c:
            return True
        alive = self._local(mask) & (self._core >= c)
        return self._kernels.peel(self.indptr, self.nbrs, alive, c) == 0
