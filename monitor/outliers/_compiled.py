"""Compiled loops (numba) for the smooth bound's largest windows.

On a diffuse 10^6-row window the smooth bound checks about 8 x 10^7 candidate pairs
and asks tens of questions about k-cores of vertex-induced subgraphs of the resulting
graph. In numpy each step of those loops builds index arrays over the whole frontier;
compiled, they are plain passes over the rows and edges.

Floats. The one float computation here, :func:`close_pairs_block`'s squared distance,
is the same IEEE operations in the same order as ``_geometry.sq_dist`` (differences,
their squares, summed left to right over the columns); numba compiles without fastmath,
so nothing is reassociated or fused into an FMA, and both give the same bits (checked
in tests/test_outliers_cost.py on float-degenerate windows). Everything else is integer
graph work, which compiling cannot change.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["adjacency", "close_pairs_block", "core_numbers", "peel"]


def _jit(fn):
    # Machine code is cached next to the source or in the user's cache directory; where
    # neither is writable (a read-only install, no home) numba refuses to cache, and the
    # loops are compiled in memory at each start instead (about a second).
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:
        return numba.njit(nogil=True)(fn)


@_jit
def close_pairs_block(P: np.ndarray, pairs: np.ndarray, order: np.ndarray, threshold: float,
                      scratch: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidate ``pairs`` (rows of P) whose squared distance is <= threshold, as
    (a, b, sq_dist) with a < b in the labels ``order`` gives the rows of P. ``scratch``
    (at least one float per candidate) holds the distances between the two passes, so
    only the passing pairs get fresh memory."""
    m, d = pairs.shape[0], P.shape[1]
    k = 0
    for i in range(m):
        p, q = pairs[i, 0], pairs[i, 1]
        diff = P[p, 0] - P[q, 0]
        s = diff * diff
        for j in range(1, d):
            diff = P[p, j] - P[q, j]
            s += diff * diff
        scratch[i] = s
        if s <= threshold:
            k += 1
    a = np.empty(k, np.int64)
    b = np.empty(k, np.int64)
    d2 = np.empty(k, np.float64)
    k = 0
    for i in range(m):
        if scratch[i] <= threshold:
            u, v = order[pairs[i, 0]], order[pairs[i, 1]]
            a[k], b[k], d2[k] = min(u, v), max(u, v), scratch[i]
            k += 1
    return a, b, d2


@_jit
def adjacency(n: int, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR adjacency (indptr, neighbours) of the undirected graph with edges (a[i], b[i]),
    which must be distinct pairs of distinct vertices."""
    indptr = np.zeros(n + 1, np.int64)
    for i in range(a.size):
        indptr[a[i] + 1] += 1
        indptr[b[i] + 1] += 1
    for v in range(n):
        indptr[v + 1] += indptr[v]
    fill = indptr[:-1].copy()
    nbrs = np.empty(indptr[n], np.int32)
    for i in range(a.size):
        u, v = a[i], b[i]
        nbrs[fill[u]] = v
        fill[u] += 1
        nbrs[fill[v]] = u
        fill[v] += 1
    return indptr, nbrs


@_jit
def _degrees(indptr: np.ndarray, nbrs: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """Alive neighbours of each alive vertex (0 elsewhere)."""
    n = alive.size
    deg = np.zeros(n, np.int64)
    for v in range(n):
        if alive[v]:
            d = 0
            for j in range(indptr[v], indptr[v + 1]):
                if alive[nbrs[j]]:
                    d += 1
            deg[v] = d
    return deg


@_jit
def _remove_below(indptr: np.ndarray, nbrs: np.ndarray, alive: np.ndarray, deg: np.ndarray, c: int,
                  stack: np.ndarray, core: np.ndarray) -> int:
    """Remove from ``alive`` every vertex outside the c-core, given ``deg`` (alive
    neighbours of each alive vertex, kept exact); record c - 1 in ``core`` for each vertex
    removed and return how many were.

    A vertex leaves ``alive`` when it is stacked, so it is stacked once; its neighbours
    lose it when it is taken off the stack."""
    top = 0
    for v in range(alive.size):
        if alive[v] and deg[v] < c:
            alive[v] = False
            core[v] = c - 1
            stack[top] = v
            top += 1
    removed = top
    while top:
        top -= 1
        v = stack[top]
        for j in range(indptr[v], indptr[v + 1]):
            u = nbrs[j]
            if alive[u]:
                deg[u] -= 1
                if deg[u] < c:
                    alive[u] = False
                    core[u] = c - 1
                    removed += 1
                    stack[top] = u
                    top += 1
    return removed


@_jit
def core_numbers(indptr: np.ndarray, nbrs: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """Core number of every vertex in the subgraph ``alive`` induces (0 outside it).

    Peeled level by level: the vertices removed on the way to the c-core have core
    number c - 1. Each level scans the vertices once (a few hundred levels on the largest
    windows), and every removal touches its own edges once, in the order of the vertex
    labels, which keeps the degree updates near each other in memory when the labels
    follow space (as ``_Cores`` arranges).
    """
    left_mask = alive.copy()
    deg = _degrees(indptr, nbrs, left_mask)
    core = np.zeros(alive.size, np.int64)
    stack = np.empty(alive.size, np.int64)
    left, c = np.count_nonzero(left_mask), 0
    while left:
        c += 1
        left -= _remove_below(indptr, nbrs, left_mask, deg, c, stack, core)
    return core


@_jit
def peel(indptr: np.ndarray, nbrs: np.ndarray, alive: np.ndarray, c: int) -> int:
    """Remove from ``alive`` (in place) every vertex outside the c-core of the subgraph it
    induces; return the number of vertices left."""
    deg = _degrees(indptr, nbrs, alive)
    left = np.count_nonzero(alive)
    stack = np.empty(alive.size, np.int64)
    unused_core = np.empty(alive.size, np.int64)  # _remove_below records core numbers; not needed here
    return left - _remove_below(indptr, nbrs, alive, deg, c, stack, unused_core)
