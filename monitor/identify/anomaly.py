"""The (beta, r)-anomaly of the seed and its distance to the other answer (docs/design.md#anomaly-queries).

Definition 2.2 of Asif et al. (CCS 2019): record ``i`` is a (beta, r)-anomaly of the
database x when ``i`` is present in x and at most beta records of x lie within distance r
of ``i``. The count INCLUDES the copies of ``i`` itself, so a present record counts at
least 1. With ``include_record=True`` the query is answered over x + {i} instead (the
seed's footnote variant, for an incoming event that is not in the reference data): the
answer is "yes" iff 1 + (records of x within r) <= beta.

The accuracy of the optimal private answer grows with ``m``, the number of records one
must add or remove to reach a database with the other answer, measured on

- the ordinary neighbour graph (add or remove any record: epsilon-DP), or
- the k-sensitive neighbour graph (Definitions 3.1, 3.2: add or remove a record j only
  if j is k-sensitive, i.e. present and normal in some database within k changes).
  Worked out, the edge {z, z + j} exists iff j has at least T + 1 records within r in
  z + j (j included), with ``T = beta - k``; when k >= beta every edge exists.

``flip_distance`` returns a LOWER bound on m that is exact on the ordinary graph. It is
the exact distance in an abstract graph H whose states are the query's ball counts
(copies of i, and the counts c_t within t*r, t = 1, 2, ...); every sensitive edge maps to
an H edge because a record j within t*r of i has its r-ball inside the (t+1)*r-ball
(triangle inequality), so it can only be added or removed when c_{t+1} >= T + 1 in the
larger database. Hence the bound is <= m AND changes by at most 1 along every sensitive
edge, and it is 1 exactly at the boundary: the two properties the mechanism's privacy
proof needs (a lower bound alone would not be enough). The test suite checks both
against breadth-first search on small discrete universes.

>>> nb = Neighbourhood(copies=1, within=(1, 1, 40), total=40)
>>> is_anomaly(nb, beta=5)
True
>>> flip_distance(nb, beta=5).m            # ordinary graph: removing the record flips it
1
>>> flip_distance(nb, beta=5, sensitive_k=1).m   # it cannot be removed on the sensitive graph
8
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Neighbourhood", "FlipDistance", "is_anomaly", "flip_distance", "sensitive_threshold", "check_parameters"]


@dataclass(frozen=True)
class Neighbourhood:
    """The counts around one query record that its answer and flip distance depend on.

    copies: records of the database equal to the query (the seed's x_i).
    within: within[t - 1] = records at distance <= t * r of the query, t = 1, 2, ...
        (copies included). It may stop once a count reaches the sensitive threshold T
        (``sensitive_threshold``) or the total: the counts only grow from there.
    total: records in the database.
    """

    copies: int
    within: tuple[int, ...]
    total: int

    def __post_init__(self) -> None:
        w = self.within
        if not w or any(b < a for a, b in zip(w, w[1:])) or not 0 <= self.copies <= w[0] or w[-1] > self.total:
            raise ValueError(f"inconsistent neighbourhood counts: copies={self.copies}, within={w}, total={self.total}")

    def count(self, t: int) -> int:
        """Records within t * r (t >= 1); beyond the stored counts, the last one (see class doc)."""
        return self.within[min(t, len(self.within)) - 1]


class FlipDistance(NamedTuple):
    """m: lower bound on the graph distance to the other answer (math.inf: unreachable).
    exact: True where m is proven equal to the true distance (always on the ordinary graph)."""

    m: float
    exact: bool


def check_parameters(beta: int, sensitive_k: int | None = None) -> None:
    """Raise ValueError unless beta >= 1 and k (if given) >= 1 are integers."""
    if isinstance(beta, bool) or int(beta) != beta or beta < 1:
        raise ValueError(f"beta must be an integer >= 1, got {beta!r}")
    if sensitive_k is not None and (isinstance(sensitive_k, bool) or int(sensitive_k) != sensitive_k or sensitive_k < 1):
        raise ValueError(f"sensitive k must be an integer >= 1, got {sensitive_k!r}")


def sensitive_threshold(beta: int, sensitive_k: int | None) -> int:
    """T: a record may be added or removed on the k-sensitive graph only if, in the larger
    database, it has at least T + 1 records within r. 0 means every edge exists
    (ordinary graph, or k >= beta)."""
    return 0 if sensitive_k is None else max(0, int(beta) - int(sensitive_k))


def is_anomaly(nb: Neighbourhood, beta: int, include_record: bool = False) -> bool:
    """The exact (beta, r)-anomaly answer. NOT private: only mechanisms may release it."""
    if include_record:
        return nb.within[0] + 1 <= beta
    return nb.copies > 0 and nb.within[0] <= beta


def _chain(nb: Neighbourhood, T: int) -> float:
    # Adding anything within r of the query needs c_2 >= T first; raising c_2 needs
    # additions in the shell (r, 2r], which need c_3 >= T, and so on outwards: each
    # shell t short of T costs T - c_t additions of its own.
    if nb.within[-1] < T:
        if nb.within[-1] < nb.total:
            raise ValueError(f"neighbourhood counts stop at {nb.within[-1]} < T = {T}: compute more shells")
        return math.inf  # fewer than T records in all: nothing can ever be added or removed
    cost, t = 0, 2
    while nb.count(t) < T:
        cost += T - nb.count(t)
        t += 1
    return cost


def flip_distance(nb: Neighbourhood, beta: int, sensitive_k: int | None = None, include_record: bool = False) -> FlipDistance:
    """Lower bound on the distance to the nearest database with the other answer.

    ``sensitive_k=None``: the ordinary neighbour graph, where the value is exact.
    Otherwise the k-sensitive graph; see the module docstring for why the bound is safe.
    c = records within r (copies of the query included), x = copies, T = beta - k:

    ======================  ==========================================================
    case                    m
    ======================  ==========================================================
    anomaly (x>=1, c<=beta) min(beta + 1 - c, x + max(0, T + x - c)) + chain
    normal (x>=1, c>beta)   c - beta
    absent (x = 0)          1 + max(0, c + 1 - beta, T - c) + chain
    include_record, yes     beta - c + chain         (c counts the database only)
    include_record, no      c + 1 - beta
    ======================  ==========================================================

    chain = sum over t >= 2 of max(0, T - c_t) (infinite if the database has fewer than
    T records); it is 0 on the ordinary graph (T = 0).

    >>> flip_distance(Neighbourhood(copies=1, within=(7,), total=50), beta=5).m
    2
    >>> flip_distance(Neighbourhood(copies=0, within=(2,), total=50), beta=5, include_record=True).m
    3
    """
    check_parameters(beta, sensitive_k)
    T = sensitive_threshold(beta, sensitive_k)
    c, x = nb.within[0], nb.copies
    if include_record:
        if c + 1 <= beta:
            return FlipDistance(beta - c + _chain(nb, T), exact=c >= T)
        return FlipDistance(c + 1 - beta, exact=T == 0 or x >= c + 1 - beta)
    if x == 0:
        return FlipDistance(1 + max(0, c + 1 - beta, T - c) + _chain(nb, T), exact=T == 0 or T <= c <= beta - 1)
    if c > beta:
        # Removing copies of the query is always allowed here (c >= beta + 1 >= T + 1).
        return FlipDistance(c - beta, exact=T == 0 or x > c - beta)
    add = beta + 1 - c
    remove = x + max(0, T + x - c)
    # Adding copies of the query realises the addition route when c >= T; removing the
    # copies needs no help when c >= T + x.
    exact = T == 0 or (c >= T and add <= remove) or c >= T + x
    return FlipDistance(min(add, remove) + _chain(nb, T), exact=exact)
