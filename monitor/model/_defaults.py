"""Default grid layout from public settings only: d, epsilon and a public seed.

Nothing here may look at the data: the layout is part of the mechanism, and choosing it
from the data would leak (DESIGN 2.1). docs/model.md explains the rule and
BENCHMARKS.md ("model") shows what each part is worth.

Two kinds of grids share the budget equally (epsilon / G each, G grids in all):

- joint grids over GROUP_SIZE = 3 features (outliers in a combination of features),
  coarse: at most MAX_CELLS = 125 cells (5 bins per axis);
- marginal grids over 1 feature each (outliers within one feature's range), fine:
  MARGINAL_BINS = 32 bins, on floor(MARGINALS_PER_EPSILON = 4 x min(epsilon, 1)) features spread
  over the d.

>>> lay = default_layout(10, 1.0)
>>> lay.groups
((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 1, 9), (2, 3, 4), (5, 6, 7), (0,), (2,), (5,), (8,))
>>> lay.bins, lay.k
((5, 5, 5, 5, 5, 5, 32, 32, 32, 32), 10.0)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

GROUP_SIZE = 3  # features per joint grid: 3 correlated features can share one
COVERAGE = 2  # each feature in about this many joint grids ...
MAX_GRIDS = 16  # ... but at most this many joint grids (scoring speed)
MAX_CELLS = 125  # cells per joint grid at most (5 bins per axis in 3-D)
MIN_BINS = 3  # 2 bins cut each feature at the middle of its bounds: too crude
CELLS_PER_EPSILON = 800  # the joint grids hold at most this many cells per unit of epsilon
EPSILON_CAP = 1.0  # the layout is the same for every epsilon above this
MARGINALS_PER_EPSILON = 4  # fine 1-feature grids per unit of epsilon (so 4 above the cap) ...
MARGINAL_BINS = 32  # ... of this many bins
K_NOISE = 1.0  # k in units of the per-cell noise scale G / epsilon ...
K_MIN = 5.0  # ... and at least exact kNN's k
LAYOUT_SEED = 0  # public seed of the feature draw when the joint grids cannot cover all features


class Layout(NamedTuple):
    groups: tuple[tuple[int, ...], ...]  # features of each grid
    bins: tuple[int, ...]  # bins per axis of each grid
    k: float
    depth: int


def feature_groups(d: int, group_size: int, n_grids: int | None = None, seed: int | None = None
                   ) -> tuple[tuple[int, ...], ...]:
    """``n_grids`` groups of ``group_size`` distinct features, from public settings only.

    When the grids can cover every feature (n_grids >= ceil(d / group_size)), they are
    windows of consecutive features in the PUBLIC order (features declared next to each
    other are often related): first 0-2, 3-5, ..., then the same shifted by
    ceil(group_size / 2), so that each boundary is bridged, then the other shifts.
    With fewer grids, balanced feature bagging from the public ``seed``: features
    dealt from successive seeded permutations (Lazarevic & Kumar 2005), so that no
    stretch of features is favoured. ``n_grids`` None: ceil(d / group_size) disjoint
    groups in order (the v1 layout).
    """
    group_size = max(1, min(group_size, d))
    n_first = math.ceil(d / group_size)
    if n_grids is None:
        base, extra = divmod(d, n_first)
        groups, start = [], 0
        for i in range(n_first):
            size = base + (1 if i < extra else 0)
            groups.append(tuple(range(start, start + size)))
            start += size
        return tuple(groups)
    if n_grids >= n_first:
        shifts = [0] + ([math.ceil(group_size / 2)] if group_size > 1 else [])
        shifts += [s for s in range(group_size) if s not in shifts]
        windows: list[tuple[int, ...]] = []
        for s in shifts:
            for start in range(s, s + d, group_size):
                w = tuple(sorted({(start + t) % d for t in range(group_size)}))
                if w not in windows:
                    windows.append(w)
        return tuple(windows[i % len(windows)] for i in range(n_grids))
    gen = np.random.default_rng(LAYOUT_SEED if seed is None else seed)
    deck: list[int] = []
    while len(deck) < n_grids * group_size + d:
        deck += gen.permutation(d).tolist()
    groups = []
    for _ in range(n_grids):
        group: list[int] = []
        while len(group) < group_size:
            f = deck.pop(0)
            if f in group:  # a group needs distinct features: put it back under the deck
                deck.append(f)
                continue
            group.append(f)
        groups.append(tuple(sorted(group)))
    return tuple(groups)


def marginal_features(d: int, n: int) -> tuple[int, ...]:
    """n features spread evenly over 0..d-1 (all of them when n >= d)."""
    n = min(n, d)
    return tuple(sorted({round(i * d / n) for i in range(n)})) if n else ()


def default_layout(d: int, epsilon: float, group_size: int | None = None, bins: int | None = None,
                   k: float | None = None, depth: int | None = None, n_grids: int | None = None,
                   marginals: int | None = None, seed: int | None = None) -> Layout:
    """The grids, bins, k and search depth, from d, epsilon and the public seed only.

    Explicit arguments override the rule: ``group_size``, ``bins`` and ``n_grids`` apply
    to the joint grids, ``marginals`` is the number of 1-feature grids (0 = none).
    """
    p = max(1, min(group_size if group_size is not None else GROUP_SIZE, d))
    # Above the cap more epsilon only lowers the noise: the same layout, so the same
    # model with less noise, and accuracy cannot fall as the budget grows.
    e = min(float(epsilon), EPSILON_CAP)
    m_max = min(MAX_GRIDS, math.ceil(COVERAGE * d / p)) if d > p else 1
    if bins is None:
        b, m_auto = _bins_and_grids(d, p, e, m_max)
    else:
        b, m_auto = int(bins), max(1, min(m_max, math.floor(CELLS_PER_EPSILON * e / int(bins) ** p)))
    m = n_grids if n_grids is not None else m_auto
    groups = feature_groups(d, p, m, seed)
    n_marg = (math.floor(MARGINALS_PER_EPSILON * e) if d > 1 else 0) if marginals is None else marginals
    marg = tuple((f,) for f in marginal_features(d, n_marg))
    g_total = len(groups) + len(marg)
    kk = k if k is not None else max(K_MIN, K_NOISE * g_total / e)
    dp = depth if depth is not None else (2 if p <= 4 else 1)
    return Layout(groups + marg, (b,) * len(groups) + (MARGINAL_BINS,) * len(marg), float(kk), int(dp))


def _bins_and_grids(d: int, p: int, epsilon: float, m_max: int) -> tuple[int, int]:
    """Finest bins (at most MAX_CELLS cells a grid) at which the cell budget still covers every feature.

    The joint grids may hold CELLS_PER_EPSILON * epsilon cells in all. Each of the G
    grids is epsilon / G-DP, so its per-cell noise has scale G / epsilon: the budget
    keeps the total noise mass over all cells bounded per unit of signal. Coverage first
    (every feature in some grid), resolution second, then more grids up to m_max.
    """
    budget = CELLS_PER_EPSILON * epsilon
    m_cover = min(m_max, math.ceil(d / p))
    for b in range(max(MIN_BINS, math.floor(MAX_CELLS ** (1.0 / p) + 1e-9)), MIN_BINS - 1, -1):
        m = min(m_max, math.floor(budget / b**p))
        if m >= m_cover:
            return b, m
    return MIN_BINS, max(1, min(m_max, math.floor(budget / MIN_BINS**p)))
