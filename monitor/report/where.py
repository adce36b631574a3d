"""Where a surge is: the parts (features, or model grids) whose flagged events rise most
above normal traffic, picked privately, with each picked part's count (DESIGN 7).

The private maths of a report's 'where': no streaming, no Kafka, no Prometheus.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from monitor.dp import NoiseSource, Release, laplace_count

__all__ = ["candidate_parts", "part_counts", "pick_parts"]


def candidate_parts(grid_features: Sequence[Sequence[int]] | None, n_grids: int) -> list[int]:
    """Which grids the 'where' picks among (public: the model's layout only).

    The one-feature (marginal) grids when the layout has at least two: they name one
    feature each, so a pick never names a feature the surge did not touch along with one
    it did. Otherwise every grid.

    >>> candidate_parts([(0, 1, 2), (2, 3, 4), (0,), (1,), (2,)], 5)
    [2, 3, 4]
    >>> candidate_parts([(0, 1, 2), (2, 3, 4)], 2)
    [0, 1]
    """
    if grid_features is not None:
        marginal = [i for i, f in enumerate(grid_features) if len(f) == 1]
        if len(marginal) >= 2:
            return marginal
    return list(range(n_grids))


def part_counts(flagged: np.ndarray, grid_flagged: np.ndarray, candidates: Sequence[int]) -> np.ndarray:
    """Per candidate grid, the flagged events (the alarm's flags) that grid also flags.

    A part of the flagged count by construction (the report's whole), so the published
    numbers can be made to nest. Adding or removing one event moves every part by 0 or
    1, all in the same direction: monotone counts of sensitivity 1.
    """
    G = np.asarray(grid_flagged, dtype=bool)
    f = np.asarray(flagged, dtype=bool).reshape(-1)
    return (G[:, list(candidates)] & f[:, None]).sum(axis=0).astype(float)


def pick_parts(counts: np.ndarray, normal_share: np.ndarray, events_noisy: float, h: int, epsilon: float,
               src: NoiseSource) -> list[int]:
    """Indices (into ``counts``) of the h parts with the largest excess over normal traffic.

    The score of part j is ``counts[j] - normal_share[j] * events_noisy``: its flagged
    events less what normal traffic gives it at the window's (already released, noisy)
    event count. Given that release the scores are monotone of sensitivity 1 (only the
    counts depend on the window), so report-noisy-max with exponential noise of scale
    h / epsilon (permute-and-flip) makes the h picks together epsilon-DP for add/remove
    neighbouring windows (one event per privacy unit), by adaptive composition after the
    event count's own release. With one normal share for every part the subtraction does
    not change the ranking: it matters when the model's grids are calibrated apart.
    """
    scores = np.asarray(counts, dtype=float) - np.asarray(normal_share, dtype=float) * float(events_noisy)
    return src.top_k(scores, h, scale=h / epsilon, monotonic=True)


def part_release(count: float, epsilon: float, src: NoiseSource) -> Release:
    """A picked part's flagged count: Laplace, scale 1 / epsilon (epsilon-DP, sensitivity 1)."""
    return laplace_count(int(count), epsilon, sensitivity=1.0, rng=src)
