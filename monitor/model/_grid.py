"""One noisy grid over a few features: the private histogram and Algorithm 1 on it.

The grid covers [0, 1]^p (features already scaled with PUBLIC bounds) with ``bins``
cells per axis. Only noisy values above a public threshold are kept (docs/design.md#the-model); the
same distribution is produced either by noising every cell (dense) or by noising the
occupied cells and simulating the empty cells that cross the threshold (sparse).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from monitor.dp import NoiseSource

# Above this many cells, noising every cell costs too much (OpenDP: ~20 us a sample).
DENSE_MAX_CELLS = 1 << 16
# Below this many cells, lookups go through a dense array; above, through sorted keys.
LOOKUP_DENSE_MAX = 1 << 22
# Score tables (post-processing for speed): at most this many sub-cells per grid, at most
# TABLE_SUB sub-cells per axis of a cell.
TABLE_MAX = 1 << 14
TABLE_SUB = 16
# A fine grid (the "tail" rule's one joint grid) still gets 2 sub-cells per axis up to this many.
TABLE_FINE_MAX = 1 << 20
# Largest grid we index with int64 keys.
MAX_CELLS = 1 << 62
_CHUNK = 8192


def cell_threshold(n_cells: int, epsilon: float, false_cells: float) -> float:
    """Public keep-threshold theta: about ``false_cells`` empty cells are expected above it.

    An empty cell's noisy value exceeds theta with probability exp(-epsilon theta) / 2, so
    theta = ln(n_cells / (2 false_cells)) / epsilon, and at least 0 (keep positives only).
    """
    return max(0.0, float(np.log(n_cells / (2.0 * false_cells))) / epsilon)


@lru_cache(maxsize=64)
def neighbour_offsets(p: int, depth: int) -> np.ndarray:
    """Integer offsets with L1 norm <= depth (the paper's C_y), nearest first.

    The order is public and breaks ties in the per-query sort (a query on a cell border,
    common with discrete features, is as close to its own cell as to the next one): the
    own cell comes first.
    """
    offs = np.array(list(_l1_ball(p, depth)), dtype=np.int64).reshape(-1, p)
    offs = offs[np.lexsort((*offs.T[::-1], (offs**2).sum(axis=1)))]
    offs.setflags(write=False)
    return offs


@dataclass
class NoisyGrid:
    """Kept noisy cells of one grid: ``keys`` (sorted flat cell indices) and ``values``."""

    features: tuple[int, ...]
    bins: int
    keys: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        self.keys = np.asarray(self.keys, dtype=np.int64)
        self.values = np.asarray(self.values, dtype=np.float64)
        p = len(self.features)
        self.n_cells = self.bins**p
        self._strides = self.bins ** np.arange(p - 1, -1, -1, dtype=np.int64)
        if self.n_cells <= LOOKUP_DENSE_MAX:
            self._dense = np.zeros(self.n_cells + 1, dtype=np.float64)  # last slot: outside
            self._dense[self.keys] = self.values
        else:
            self._dense = None
        self._tables: dict = {}

    # -- fitting --------------------------------------------------------------------------
    @classmethod
    def fit(cls, U: np.ndarray, features: tuple[int, ...], bins: int, epsilon: float,
            theta: float, noise: NoiseSource, dense_max_cells: int = DENSE_MAX_CELLS) -> "NoisyGrid":
        """Noisy histogram of ``U[:, features]`` with Laplace(1/epsilon) per cell, kept above theta.

        Guarantee: pure epsilon-DP for add/remove-one-record neighbours. One record
        changes one cell count by 1 (sensitivity 1); every cell, empty or not, gets its
        own Laplace(1/epsilon) draw (parallel composition), and thresholding at the
        public theta is post-processing. The sparse path returns the same distribution
        as the dense path without materialising empty cells (Cormode et al. 2012);
        ``dense_max_cells`` only picks the path (speed), never the output distribution.
        """
        p = len(features)
        n_cells = bins**p
        if n_cells > MAX_CELLS:
            raise ValueError(f"grid of {bins}^{p} cells is too large to index")
        strides = bins ** np.arange(p - 1, -1, -1, dtype=np.int64)
        flat = (_cells(U[:, list(features)], bins) * strides).sum(axis=1)
        occupied, counts = np.unique(flat, return_counts=True)
        scale = 1.0 / epsilon
        if n_cells <= dense_max_cells:
            full = np.zeros(n_cells)
            full[occupied] = counts
            full = noise.laplace(scale, center=full)  # every cell, empty ones too
            keys = np.flatnonzero(full > theta)
            return cls(features, bins, keys, full[keys])
        noisy = noise.laplace(scale, center=counts.astype(float))
        keep = noisy > theta
        keys, values = occupied[keep], noisy[keep]
        # Empty cells above theta: Binomial(#empty, P(Lap > theta)) of them, uniform
        # positions among the empty cells, values drawn by _laplace_tail (the same
        # sampler as the dense path, so the same set of possible values).
        n_empty = n_cells - occupied.size
        tail_p = 0.5 * np.exp(-theta / scale)
        n_false = int(noise.generator.binomial(n_empty, tail_p))
        if n_false:
            fake = _uniform_empty_cells(n_cells, occupied, n_false, noise.generator)
            fake_values = _laplace_tail(noise, scale, theta, n_false)
            keys = np.concatenate([keys, fake])
            values = np.concatenate([values, fake_values])
        order = np.argsort(keys)
        return cls(features, bins, keys[order], values[order])

    # -- scoring --------------------------------------------------------------------------
    def lookup(self, flat: np.ndarray) -> np.ndarray:
        """Noisy values of flat cell indices; index n_cells means 'outside the grid' (0)."""
        if self._dense is not None:
            return self._dense[flat]
        pos = np.searchsorted(self.keys, flat)
        pos = np.minimum(pos, max(self.keys.size - 1, 0))
        if self.keys.size == 0:
            return np.zeros(flat.shape)
        hit = self.keys[pos] == flat
        return np.where(hit, self.values[pos], 0.0)

    def score(self, U: np.ndarray, k: float, depth: int, weighted: bool) -> np.ndarray:
        """Algorithm 1 (Rauch et al.) on the noisy cells, vectorised, in unit-cube distance.

        The cells within L1 depth of the query's cell are visited in order of the
        distance from the query to their centres (the paper's dist_y), accumulating
        noisy mass Q until Q >= k. Cell i covers the ring from the previous cell's reach
        to its own (distance + half a cell), its mass spread evenly over it, so scores
        are continuous. Basic: the radius at which Q reaches k. Weighted: the mean
        radius of the first k units of mass. If the neighbourhood holds less than k, the
        score is the search radius plus one cell per missing k, so emptier
        neighbourhoods rank higher. Post-processing of the noisy cells: no privacy cost.
        """
        offs = neighbour_offsets(len(self.features), depth)
        out = np.empty(U.shape[0])
        for lo in range(0, U.shape[0], _CHUNK):
            out[lo:lo + _CHUNK] = self._score_chunk(U[lo:lo + _CHUNK], offs, k, weighted)
        return out / self.bins

    def score_fast(self, U: np.ndarray, k: float, depth: int, weighted: bool) -> np.ndarray:
        """``score`` read from a precomputed table of sub-cells, when the grid is small enough.

        Each cell is cut into s^p sub-cells (s <= TABLE_SUB, s^p * cells <= TABLE_MAX) and
        ``score`` is evaluated once at every sub-cell centre; an event then costs one
        lookup per grid. The score becomes piecewise constant on sub-cells of width
        1 / (bins * s), finer than the grid's own resolution. Post-processing: free.
        """
        sub = self._table_sub()
        if sub < 2:
            return self.score(U, k, depth, weighted)
        key = (float(k), int(depth), bool(weighted))
        table = self._tables.get(key)
        p, res = len(self.features), self.bins * sub
        strides = res ** np.arange(p - 1, -1, -1, dtype=np.int64)
        idx = np.minimum((U[:, list(self.features)] * res).astype(np.int64), res - 1) @ strides
        if table is None and U.shape[0] * 8 < res**p:
            # A small batch: score only the sub-cells it touches (the same values the
            # full table would hold), so a single event does not pay for the table.
            cells, inv = np.unique(idx, return_inverse=True)
            return self._score_centres(cells, res, p, k, depth, weighted)[inv.ravel()]
        if table is None:
            table = self._tables[key] = self._score_centres(np.arange(res**p), res, p, k, depth, weighted)
        return table[idx]

    def _score_centres(self, flat, res, p, k, depth, weighted) -> np.ndarray:
        """``score`` at the centres of sub-cells given by flat index on a res^p lattice."""
        coords = (flat[:, None] // (res ** np.arange(p - 1, -1, -1, dtype=np.int64))[None, :]) % res
        full = np.zeros((flat.size, max(self.features) + 1))
        full[:, list(self.features)] = (coords + 0.5) / res
        return self.score(full, k, depth, weighted)

    def _table_sub(self) -> int:
        p = len(self.features)
        sub = 1 if self.n_cells > TABLE_MAX else min(TABLE_SUB, int(np.floor((TABLE_MAX / self.n_cells) ** (1.0 / p) + 1e-9)))
        return 2 if sub < 2 and self.n_cells * 2**p <= TABLE_FINE_MAX else sub

    def _score_chunk(self, U, offs, k, weighted):
        X = U[:, list(self.features)] * self.bins
        cells = np.minimum(X.astype(np.int64), self.bins - 1)
        pos = X - cells - 0.5  # query position relative to its cell centre, in cells
        offs_f = offs.astype(float)
        # |pos - o|^2 = |pos|^2 + (|o|^2 - 2 pos.o): only the bracket decides the order,
        # and it is one small matrix product.
        key = (offs_f**2).sum(axis=1)[None, :] - 2.0 * (pos @ offs_f.T)
        order = np.argsort(key, axis=1, kind="stable")
        sq = np.take_along_axis(key, order, axis=1) + (pos**2).sum(axis=1)[:, None]
        reach = np.sqrt(np.maximum(sq, 0.0)) + 0.5
        # Per-axis loops: numpy reductions over a short last axis are slow.
        inside = np.ones(order.shape, dtype=bool)
        for a in range(cells.shape[1]):
            coord = cells[:, a:a + 1] + offs[:, a][order]
            inside &= (coord >= 0) & (coord < self.bins)
        flat = (cells @ self._strides)[:, None] + (offs @ self._strides)[order]
        mass = self.lookup(np.where(inside, flat, self.n_cells))
        n, m = mass.shape
        rows = np.arange(n)
        r_prev = np.concatenate([np.zeros((n, 1)), reach[:, :-1]], axis=1)
        Q = np.cumsum(mass, axis=1)
        reached = Q >= k
        any_reached = reached.any(axis=1)
        j = np.where(any_reached, reached.argmax(axis=1), m - 1)
        need = k - np.where(j > 0, Q[rows, np.maximum(j - 1, 0)], 0.0)  # still needed entering cell j
        missing = np.where(any_reached, 0.0, np.maximum(k - Q[:, -1], 0.0))
        if weighted:
            used = np.where(np.arange(m)[None, :] < j[:, None], mass, 0.0)
            used[rows, j] = np.where(any_reached, need, mass[rows, j])
            share = np.where(mass > 0, used / (2 * np.where(mass > 0, mass, 1.0)), 0.5)
            s = (used * (r_prev + (reach - r_prev) * share)).sum(axis=1) / k
            return s + missing / k * (reach[:, -1] + 1.0)
        mj = mass[rows, j]
        frac = np.clip(need / np.where(mj > 0, mj, 1.0), 0.0, 1.0)
        s = r_prev[rows, j] + (reach[rows, j] - r_prev[rows, j]) * frac
        return np.where(any_reached, s, reach[:, -1] + missing / k)


def _l1_ball(p: int, budget: int):
    """Integer vectors of length p with L1 norm <= budget, without enumerating the cube."""
    if p == 0:
        yield ()
        return
    for v in range(-budget, budget + 1):
        for rest in _l1_ball(p - 1, budget - abs(v)):
            yield (v, *rest)


def _cells(U: np.ndarray, bins: int) -> np.ndarray:
    """Cell coordinates of points in [0, 1]^p; the value 1.0 falls in the last cell."""
    return np.minimum((U * bins).astype(np.int64), bins - 1)


def _laplace_tail(noise: NoiseSource, scale: float, theta: float, n: int) -> np.ndarray:
    """n noisy values of EMPTY cells conditioned on exceeding theta, exactly as the dense path draws them.

    Drawn as ``noise.laplace(scale, center=theta)`` and kept when > theta (rejection, about
    2 draws per value). Why this is exact, not just close: OpenDP's float Laplace adds
    discrete Laplace noise on the lattice 2^-1074 Z to the centre (every float, theta
    included, lies on it) and rounds the sum to a float, monotonically. An empty cell of
    the dense path releases round(2^-1074 W), W ~ DLap; one of the sparse path releases
    round(2^-1074 (t + Z)), t = theta / 2^-1074, Z ~ DLap. Both are kept exactly when the
    lattice point is at least the same w0 > t, and the discrete Laplace tail is memoryless
    (P(W = w | W >= w0) is proportional to exp(-w 2^-1074 / scale) in both), so the
    kept values have the same distribution over the same floats. The previous
    ``theta + |Laplace|`` summed two floats in numpy: values on another lattice than
    the dense path's, which a neighbour without the record could not produce. The
    seeded (test) path is numpy's continuous Laplace, for which the same holds.
    """
    out = np.empty(0)
    while out.size < n:
        draw = np.asarray(noise.laplace(scale, 2 * (n - out.size) + 8, center=theta))
        out = np.concatenate([out, draw[draw > theta]])
    return out[:n]


def _uniform_empty_cells(n_cells: int, occupied: np.ndarray, n: int, gen: np.random.Generator) -> np.ndarray:
    """n distinct cells drawn uniformly among those not in ``occupied`` (rejection)."""
    chosen = np.empty(0, dtype=np.int64)
    while chosen.size < n:
        draw = gen.integers(0, n_cells, size=2 * (n - chosen.size) + 8, dtype=np.int64)
        draw = draw[~np.isin(draw, occupied)]
        chosen = np.unique(np.concatenate([chosen, draw]))
    # np.unique sorts: pick a uniform subset of the right size, not the smallest ones.
    return gen.permutation(chosen)[:n]
