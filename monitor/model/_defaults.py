"""Default grid layout from public settings and a private size estimate only.

Nothing here may look at the data itself: the layout is part of the mechanism, and
choosing it from the data would leak (docs/design.md#the-model). It depends on d, epsilon, the public
seed and ``n``, a NOISY count of the reference records that ``GridKNN.fit`` releases first
with a named share of the budget (SIZE_SHARE): the layout is then post-processing of a DP
release and the model stays pure epsilon-DP. docs/model.md explains the rule and
docs/benchmarks/model.md shows what it is worth.

The rule is noise-vs-count arithmetic. With G grids sharing epsilon, every cell gets
Laplace noise of scale G / epsilon; a grid of C cells holds n / C records a cell on
average. The layout keeps n / C >= RHO * G / epsilon (the average cell count at least
RHO noise scales), i.e. C * G <= n * epsilon / RHO:

- two kinds of grids: joint grids over GROUP_SIZE = 3 features (outliers in a
  combination of features), consecutive windows first and then bagged combinations,
  covering each feature about COVERAGE = 2 times (at most MAX_GRIDS), and a one-feature
  grid for every feature (at most MAX_MARGINALS; outliers within one feature's range,
  which need finer bins than a joint grid can afford);
- as many of them as the arithmetic allows at the coarsest joint grid (MIN_BINS per
  axis), joint grids first, but never fewer than MIN_GRIDS (fewer grids cover too few
  features; measured, docs/model.md);
- the finest bins the arithmetic allows: joint grids up to MAX_JOINT_CELLS cells (coarse:
  they only say which combination of ranges a record is in), one-feature grids up to
  MARGINAL_BINS bins (the resolution);
- k = max(K_MIN, K_NOISE * G / epsilon, K_SQRT * sqrt(n)): at least exact kNN's k, at
  least K_NOISE noise scales (noise alone does not reach it), and the classic
  k ~ sqrt(n) of kNN on larger data (the "tail" rule: K_SQRT_TAIL * sqrt(n)).

Above EPSILON_CAP more budget only lowers the noise on the same layout, so accuracy cannot
fall as the budget grows there.

>>> lay = default_layout(10, 1.0, n=1000)
>>> lay.groups[:3], len(lay.groups)
(((0, 1, 2), (3, 4, 5), (6, 7, 8)), 17)
>>> lay.bins[0], lay.bins[-1], round(lay.k, 1)  # 7 joint 3^3 + 10 one-feature grids of 32 bins, k = G / epsilon
(3, 32, 17.0)
>>> [len(g) for g in default_layout(10, 1.0, n=60).groups]  # a tiny reference set: 3 coarse grids
[3, 3, 3]
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

GROUP_SIZE = 3  # features per joint grid: 3 correlated features can share one
COVERAGE = 2  # each feature in about this many joint grids ...
MAX_GRIDS = 16  # ... but at most this many joint grids (scoring speed)
MAX_MARGINALS = 16  # one-feature grids at most (scoring speed; spread over the features)
MIN_GRIDS = 3  # never fewer grids (when d allows): measured on the smallest sets
MIN_BINS = 3  # 2 bins cut each feature at the middle of its bounds: too crude
MAX_JOINT_CELLS = 27  # joint grids stay coarse (3 bins per axis in 3-D); resolution comes from ...
MARGINAL_BINS = 32  # ... the one-feature grids, up to this many bins
RHO = 1.0  # the average cell count is kept at least this many noise scales
EPSILON_CAP = 1.0  # the layout is the same for every epsilon above this
K_NOISE = 1.0  # k in units of the per-cell noise scale G / epsilon ...
K_SQRT = 1.0  # ... and at least sqrt(n) ...
K_MIN = 5.0  # ... and at least exact kNN's k
# The "tail" rule (the default since model format 4's layout names; docs/model.md "The default layout"): what the
# alarm reads is the top 1 % to 10 % of scores, and there a small k and, for few features, one
# fine joint grid follow the data where the v4 rule (chosen for AUROC) stayed coarse.
# The model's score is the power mean of its grids' scores with this power (docs/model.md, "One score from
# many grids"): above 1, an event far out in one grid outranks one a little out in every grid.
SCORE_POWER = 1.5
SCORE_POWER_MAX = 8.0  # beyond it the score is nearly the largest grid's alone
RULES = ("tail", "v4")
DEFAULT_RULE = "tail"
K_SQRT_TAIL = 0.5  # tail: half the sqrt(n) term in k (a large k blurs the sparse cells the tail is made of; none
# lets the noise in empty cells reach k, and far outliers then score like the data's thin edges)
K_NOISE_TAIL = 1.0  # tail: k in noise scales
FINE_MAX_D = 4  # tail: up to this many features, one joint grid over all of them ...
FINE_MIN_BINS = 6  # ... when the arithmetic gives it at least this many bins per axis ...
FINE_MAX_BINS = 64  # ... and at most this many, and at most FINE_MAX_CELLS cells: every cell is noised
FINE_MAX_CELLS = 1 << 16  # one by one (the dense path, keep-threshold 0: the tail's few-record cells stay)
COVERAGE_MANY, MAX_GRIDS_MANY, MANY_D = 3, 24, 12  # tail: from MANY_D features, joint grids only, each
# feature in about 3 of them, at most 24 (many-feature outliers lie in joint structure: measured, docs/model.md)
RHO_FINE = 4.0  # ... sized so that its average cell holds RHO_FINE noise scales (measured, docs/benchmarks/model.md)
SIZE_SHARE = 0.05  # share of the fit's epsilon spent on the noisy reference size n
LAYOUT_SEED = 0  # public seed of the bagged feature draws


class Layout(NamedTuple):
    groups: tuple[tuple[int, ...], ...]  # features of each grid
    bins: tuple[int, ...]  # bins per axis of each grid
    k: float
    depth: int


def feature_groups(d: int, group_size: int, n_grids: int | None = None, seed: int | None = None
                   ) -> tuple[tuple[int, ...], ...]:
    """``n_grids`` groups of ``group_size`` distinct features, from public settings only.

    When the grids can cover every feature (n_grids >= ceil(d / group_size)), the first
    ceil(d / group_size) are windows of consecutive features in the PUBLIC order (features
    declared next to each other are often related: 0-2, 3-5, ...) and the rest are drawn
    by balanced feature bagging, so that features far apart in that order also meet in a
    grid (letter's outliers need such combinations; measured, docs/model.md). With fewer
    grids, all of them are drawn by balanced feature bagging from the public ``seed``:
    features dealt from successive seeded permutations (Lazarevic & Kumar 2005), so that
    no stretch of features is favoured. ``n_grids`` None: ceil(d / group_size) disjoint
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
        windows = tuple(tuple(sorted({(start + t) % d for t in range(group_size)}))
                        for start in range(0, d, group_size))
        return windows + _bagged(d, group_size, n_grids - n_first, seed, windows)
    return _bagged(d, group_size, n_grids, seed)


def _bagged(d: int, group_size: int, n_grids: int, seed: int | None,
            taken: tuple[tuple[int, ...], ...] = ()) -> tuple[tuple[int, ...], ...]:
    """Balanced feature bagging: groups dealt from successive seeded permutations of the
    features, each new group differing from ``taken`` and the earlier ones while there are
    other combinations left (a few redeals at most, so the draw stays cheap)."""
    gen = np.random.default_rng(LAYOUT_SEED if seed is None else seed)
    deck: list[int] = []
    while len(deck) < 2 * n_grids * group_size + d:
        deck += gen.permutation(d).tolist()
    groups: list[tuple[int, ...]] = []
    seen, combinations = set(taken), math.comb(d, group_size)
    for _ in range(n_grids):
        for _redeal in range(4):
            group: list[int] = []
            while len(group) < group_size:
                f = deck.pop(0)
                if f in group:  # a group needs distinct features: put it back under the deck
                    deck.append(f)
                    continue
                group.append(f)
            drawn = tuple(sorted(group))
            if drawn not in seen or len(seen) >= combinations:
                break
            deck += group  # already a grid: its features go back under the deck
        groups.append(drawn)
        seen.add(drawn)
    return tuple(groups)


def marginal_features(d: int, n: int) -> tuple[int, ...]:
    """n features spread evenly over 0..d-1 (all of them when n >= d)."""
    n = min(n, d)
    return tuple(sorted({round(i * d / n) for i in range(n)})) if n else ()


def min_grids(d: int) -> int:
    """The fewest grids the v4 rule gives for d features, whatever n and epsilon. What the
    configuration charges a detailed report's grid part by (monitor.config): the "tail"
    rule's one fine joint grid for 2 <= d <= FINE_MAX_D reports by its d features
    (``GridKNN.report_parts``), so the part is used there too."""
    return min(MIN_GRIDS, sum(_grid_counts(d, max(1, min(GROUP_SIZE, d)))))


def _grid_counts(d: int, p: int, rule: str = "v4") -> tuple[int, int]:
    """Joint and one-feature grids the rule wants before the noise arithmetic cuts them."""
    cover, most = (COVERAGE_MANY, MAX_GRIDS_MANY) if rule == "tail" and d >= MANY_D else (COVERAGE, MAX_GRIDS)
    joint = min(most, math.ceil(cover * d / p)) if d > p else 1
    return joint, (min(d, MAX_MARGINALS) if d > 1 else 0)


def default_layout(d: int, epsilon: float, n: float, group_size: int | None = None, bins: int | None = None,
                   k: float | None = None, depth: int | None = None, n_grids: int | None = None,
                   marginals: int | None = None, seed: int | None = None, rule: str = DEFAULT_RULE) -> Layout:
    """The grids, bins, k and search depth from d, the grids' epsilon, the public seed and
    ``n``, a differentially private estimate of the number of reference records.

    Explicit arguments override the rule: ``group_size``, ``bins`` and ``n_grids`` apply
    to the joint grids, ``marginals`` is the number of 1-feature grids (0 = none).
    ``rule``: "tail" (the default) or "v4" (the rule before the tail rule: k includes sqrt(n),
    never a fine joint grid). They differ in three places only:
    - k = max(K_MIN, K_NOISE * G / epsilon, K_SQRT_TAIL * sqrt(n)) under "tail" (half the
      v4 rule's sqrt(n) term);
    - "tail", d >= MANY_D and no explicit ``marginals``: joint grids only, about
      COVERAGE_MANY a feature (at most MAX_GRIDS_MANY) as far as n affords them;
    - "tail", 2 <= d <= FINE_MAX_D and no explicit group_size / n_grids / marginals: when
      one grid over all d features gets at least FINE_MIN_BINS bins per axis with RHO_FINE
      noise scales in its average cell (bins^d <= n epsilon / RHO_FINE), the layout is that
      one grid alone (up to FINE_MAX_BINS). Its cells see the joint structure a coarse grid
      and the one-feature grids average away, and one grid pays no composition.

    >>> default_layout(3, 1.0, n=15000)  # few features, many rows: one fine joint grid
    Layout(groups=((0, 1, 2),), bins=(15,), k=61.237243569579455, depth=2)
    >>> default_layout(3, 1.0, n=15000, rule="v4").bins
    (3, 32, 32, 32)
    """
    if rule not in RULES:
        raise ValueError(f"layout rule must be one of {RULES}, got {rule!r}")
    p = max(1, min(group_size if group_size is not None else GROUP_SIZE, d))
    e = min(float(epsilon), EPSILON_CAP)
    n = max(float(n), 1.0)
    k_sqrt = K_SQRT_TAIL if rule == "tail" else K_SQRT
    k_noise = K_NOISE_TAIL if rule == "tail" else K_NOISE
    if (rule == "tail" and 2 <= d <= FINE_MAX_D and group_size is None and n_grids is None and marginals is None):
        cap = min(FINE_MAX_BINS, math.floor(FINE_MAX_CELLS ** (1.0 / d) + 1e-9))
        b1 = int(bins) if bins is not None else min(cap, math.floor((n * e / RHO_FINE) ** (1.0 / d) + 1e-9))
        if b1 >= FINE_MIN_BINS:
            kk = k if k is not None else max(K_MIN, k_noise / e, k_sqrt * math.sqrt(n))
            return Layout((tuple(range(d)),), (b1,), float(kk), int(depth if depth is not None else 2))
    mj_want, mm_want = _grid_counts(d, p)
    if rule == "tail" and d >= MANY_D:
        # Many features: single-feature rarity is common among normal rows (a digit's stray pixel), and
        # one-feature grids then flag it before the joint shapes outliers differ in (optdigits' zeros:
        # 0.02 -> 0.25 of exact kNN at 1 %, pendigits 0.52 -> 0.59; measured, docs/model.md).
        mm_want = 0
    if marginals is not None:
        mm_want = min(marginals, d) if d > 1 else 0
    fit = math.floor(n * e / (RHO * MIN_BINS**p))  # grids whose coarsest cells hold RHO noise scales
    if rule == "tail":
        # The extra joint grids of many features only where n affords them beside the one-feature
        # grids asked for (none by default from MANY_D features).
        mj_want = max(mj_want, min(_grid_counts(d, p, rule)[0], fit - mm_want))
    if n_grids is not None:
        mj_want = n_grids
    want = mj_want + mm_want
    g = max(min(MIN_GRIDS, want), min(want, fit))
    mj = mj_want if n_grids is not None else min(mj_want, g)
    mm = mm_want if marginals is not None else max(0, min(mm_want, g - mj))
    g = mj + mm
    cells = n * e / (RHO * g)  # cells a grid may have
    # A 1-feature joint grid (d = 1) is a one-feature grid and gets its resolution.
    top = MARGINAL_BINS if p == 1 else math.floor(MAX_JOINT_CELLS ** (1.0 / p) + 1e-9)
    b = int(bins) if bins is not None else max(MIN_BINS, min(top, math.floor(cells ** (1.0 / p) + 1e-9)))
    bm = max(MIN_BINS, min(MARGINAL_BINS, math.floor(cells)))
    groups = feature_groups(d, p, mj, seed)
    marg = tuple((f,) for f in marginal_features(d, mm))
    kk = k if k is not None else max(K_MIN, k_noise * g / e, k_sqrt * math.sqrt(n))
    dp = depth if depth is not None else (2 if p <= 4 else 1)
    return Layout(groups + marg, (b,) * len(groups) + (bm,) * len(marg), float(kk), int(dp))


def check_score_power(p, name: str = "score_power") -> float:
    """``p`` as a float if it is a number in [1, SCORE_POWER_MAX]; else ValueError naming ``name``
    (the estimator's parameter, or a model file's ``layout.score_power``)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 1 <= p <= SCORE_POWER_MAX:
        raise ValueError(f"{name} must be a number in [1, {SCORE_POWER_MAX:g}], got {p!r}")
    return float(p)
