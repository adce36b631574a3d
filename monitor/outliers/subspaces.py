"""Top-h outlier subspaces with the exponential mechanism (Okada et al., section 5.1; docs/design.md#outlier-counts)."""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

from monitor.dp import NoiseSource, noise_source
from monitor.outliers.mechanisms import CountRelease, _private_count
from monitor.outliers.sensitivity import ParameterError, count_outliers, global_sensitivity_bound

__all__ = ["private_top_subspaces", "private_top_subspace_counts", "candidate_subspaces"]


def candidate_subspaces(n_features: int, subspaces: int | Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The explicit candidate list: ``subspaces`` itself, or all c-subsets of the columns.

    >>> candidate_subspaces(3, 2)
    [(0, 1), (0, 2), (1, 2)]
    """
    if isinstance(subspaces, (int, np.integer)) and not isinstance(subspaces, bool):
        c = int(subspaces)
        if not 1 <= c <= n_features:
            raise ParameterError(f"subspaces: dimension c must be between 1 and {n_features}, got {c}")
        return list(itertools.combinations(range(n_features), c))
    out = [tuple(int(i) for i in s) for s in subspaces]
    if not out:
        raise ParameterError("subspaces must not be empty")
    if len(set(out)) != len(out):
        raise ParameterError("subspaces must not repeat a candidate")
    return out


def private_top_subspaces(
    X: np.ndarray,
    k: int,
    r: float,
    h: int,
    epsilon: float,
    subspaces: int | Sequence[Sequence[int]],
    rng: "None | int | np.random.Generator | NoiseSource" = None,
) -> list[tuple[int, ...]]:
    """The h candidate subspaces with (noisily) the most outliers, best first.

    Utility u(S) = q(W, S) / (k K_|S| + 1) has sensitivity at most 1 for add/remove
    neighbours (Theorem 4). The h picks without replacement are report-noisy-max with
    exponential noise of scale 2h/epsilon (permute-and-flip, via OpenDP's noisy top-k):
    each pick is (epsilon/h)-DP like the exponential mechanism exp((epsilon/h) u / 2),
    and never less accurate than it.
    Guarantee: (epsilon, 0)-DP; the candidate list must be public (not data-chosen).

    >>> X = 0.5 + 0.01 * np.random.default_rng(0).random((300, 3))  # one tight cluster
    >>> X[:20, 2] = np.linspace(0, 1, 20)                            # column 2: 20 strays
    >>> private_top_subspaces(X, k=3, r=0.02, h=1, epsilon=10.0, subspaces=1, rng=0)
    [(2,)]
    """
    X, cands, counts, picks = _top(X, k, r, h, epsilon, subspaces, noise_source(rng))
    return [cands[i] for i in picks]


def private_top_subspace_counts(
    X: np.ndarray,
    k: int,
    r: float,
    h: int,
    epsilon_top: float,
    epsilon_count: float,
    delta_count: float,
    subspaces: int | Sequence[Sequence[int]],
    mechanism: str = "auto",
    rng: "None | int | np.random.Generator | NoiseSource" = None,
) -> list[tuple[tuple[int, ...], CountRelease]]:
    """The top-h subspaces and a private count of each, best first: the releases of
    :func:`private_top_subspaces` followed by :func:`private_count` on each pick, drawn
    in that order from one noise source (so a seeded call gives the same values).

    Guarantee: the selection is (epsilon_top, 0)-DP and each count has its mechanism's
    guarantee at (epsilon_count, delta_count); by basic composition the whole is
    (epsilon_top + h epsilon_count, h delta)-DP with delta the counts' spent delta.
    Each candidate's exact count is computed once: the selection's utilities already
    hold the picked subspaces' counts, and the global mechanism centres its noise on them.

    >>> X = 0.5 + 0.01 * np.random.default_rng(0).random((300, 3))
    >>> X[:20, 2] = np.linspace(0, 1, 20)
    >>> [(s, c.mechanism) for s, c in private_top_subspace_counts(X, 3, 0.02, 1, 10.0, 1.0, 0.0, 1, rng=0)]
    [((2,), 'laplace_global')]
    """
    source = noise_source(rng)
    X, cands, counts, picks = _top(X, k, r, h, epsilon_top, subspaces, source)
    return [(cands[i], _private_count(X, k, r, epsilon_count, delta_count, cands[i], mechanism, source, counts[i]))
            for i in picks]


def _top(X, k, r, h, epsilon, subspaces, source: NoiseSource):
    """(X, candidates, their exact counts, the picked indices) of the noisy top-h."""
    if not (isinstance(epsilon, (int, float, np.floating)) and epsilon > 0 and math.isfinite(epsilon)):
        raise ParameterError(f"epsilon must be a positive finite number, got {epsilon!r}")
    X = np.asarray(X, dtype=float)
    if X.ndim != 2:
        raise ParameterError(f"X must be a 2-D array, got shape {X.shape}")
    cands = candidate_subspaces(X.shape[1], subspaces)
    if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or not 1 <= h <= len(cands):
        raise ParameterError(f"h must be an integer between 1 and the number of candidates ({len(cands)}), got {h!r}")
    counts = [count_outliers(X, k, r, s) for s in cands]
    utility = [q / global_sensitivity_bound(k, len(s)) for q, s in zip(counts, cands)]
    return X, cands, counts, _select(utility, int(h), epsilon, source)


def _select(utility: Sequence[float], h: int, epsilon: float, source: NoiseSource) -> list[int]:
    """Noisy top-h with scale 2h/epsilon: h picks, epsilon-DP for utilities of sensitivity 1."""
    return source.top_k(utility, h, scale=2.0 * h / epsilon)
