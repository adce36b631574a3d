"""Where a surge is: the report's flagged events counted by the feature (the model's
one-feature grids) that finds each one most unusual (DESIGN 7).

The private maths of a report's 'where': no streaming, no Kafka, no Prometheus.

Each flagged event goes to exactly one part, so the parts' counts form a histogram that
one event moves by at most 1 in total (L1 sensitivity 1): Laplace noise of scale
1 / epsilon on every part releases the whole histogram at epsilon (pure DP, parallel
composition), and picking its largest parts is post-processing (report-noisy-max with
Laplace noise, with the counts published besides).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from monitor.dp import NoiseSource, Release, laplace_count

__all__ = ["candidate_parts", "grid_unusual", "normal_part_shares", "part_counts", "part_of", "release_parts",
           "released_parts_scale"]


def candidate_parts(grid_features: Sequence[Sequence[int]] | None, n_grids: int) -> list[int]:
    """Which grids the 'where' counts by (public: the model's layout only).

    The one-feature (marginal) grids when the layout has at least two: each names one
    feature, so a part never names a feature the surge did not touch along with one it
    did. Otherwise every grid.

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


def part_counts(flagged: np.ndarray, grid_unusual: np.ndarray, candidates: Sequence[int]) -> np.ndarray:
    """Per candidate grid, the flagged events that grid finds the most unusual of the candidates.

    ``flagged`` is a flag (bool) or a non-negative weight per event (the alarm's graded
    weights as integer units); each flagged event adds its weight to exactly one part.
    ``grid_unusual`` (n, G) says how unusual each event is by each grid on one common
    scale (higher = more unusual; e.g. minus the calibrated share of normal events that
    score higher by that grid). The parts sum to the flagged total, and adding or removing
    one event changes one part by at most its largest weight: L1 sensitivity 1 for flags
    (``resolution`` for weights in units).

    >>> part_counts(np.array([True, True, False]), np.array([[0.1, 0.9], [0.8, 0.2], [0.0, 1.0]]), [0, 1]).tolist()
    [1.0, 1.0]
    """
    w = np.asarray(flagged).reshape(-1).astype(float)
    out = np.zeros(len(candidates))
    on = w > 0
    if on.any():
        np.add.at(out, part_of(np.asarray(grid_unusual, dtype=float)[on], candidates), w[on])
    return out


def part_of(grid_unusual: np.ndarray, candidates: Sequence[int]) -> np.ndarray:
    """Each event's part: the index (into ``candidates``) of the candidate grid that finds it
    the most unusual. NaN (a grid that cannot say) never wins; ties go to the first.

    >>> part_of(np.array([[0.1, 0.9, 0.5], [0.8, np.nan, 0.2]]), [1, 2]).tolist()
    [0, 1]
    """
    U = np.asarray(grid_unusual, dtype=float).reshape(-1, np.shape(grid_unusual)[-1])[:, list(candidates)]
    return np.argmax(np.nan_to_num(U, nan=-np.inf), axis=1)


def release_parts(counts: np.ndarray, epsilon: float, src: NoiseSource, resolution: int = 1) -> list[Release]:
    """The whole histogram of parts: Laplace(resolution / epsilon) on every (integer) count.

    Guarantee: epsilon-DP for add/remove neighbouring windows (one event per privacy
    unit), since the histogram has L1 sensitivity ``resolution`` (``part_counts``).
    """
    return [laplace_count(int(round(c)), epsilon, sensitivity=float(resolution), rng=src) for c in counts]


def grid_unusual(model, X_raw: np.ndarray, grid_thresholds: np.ndarray) -> np.ndarray:
    """How unusual each event is by each of the model's grids, on one scale across grids.

    Minus the calibrated share of normal events that score higher by that grid (from the
    model's released histograms of held-apart rows, ``model.calibration_.grids``), ties
    broken by the score over the grid's threshold; for a model without per-grid
    calibration, the score over the grid's threshold alone. Post-processing of the model,
    free; computed inside the trust boundary like the flags.
    """
    X_raw = np.asarray(X_raw, dtype=float)
    n_grids = len(grid_thresholds)
    if not len(X_raw):
        return np.zeros((0, n_grids))
    scores = model.grid_scores(X_raw)
    ratio = scores / np.maximum(np.asarray(grid_thresholds, dtype=float)[None, :], 1e-12)
    hists = getattr(getattr(model, "calibration_", None), "grids", None)
    if not hists or len(hists) != n_grids:
        return ratio
    share = np.column_stack([np.asarray(h.share_above(scores[:, i]), dtype=float) for i, h in enumerate(hists)])
    return -share + 1e-9 * np.tanh(ratio)


def normal_part_shares(model, weigh: Callable[[np.ndarray], np.ndarray], grid_thresholds: np.ndarray,
                       candidates: Sequence[int], seed: int = 0) -> np.ndarray:
    """The model's own guess of how NORMAL traffic's flagged weight spreads over the parts:
    shares summing to 1. The report uses it until a baseline has released the parts of real
    traffic (``BaselineEstimate.normal_parts``), which are better: the model's sample misses
    how heavy a feature's tail is on live data.

    ``weigh`` maps model scores to each event's weight (a flag, or the alarm's graded
    weight). Drawn from the model's own noisy mass (its public synthetic sample, fixed
    seed), attributed like window events: post-processing of the private model, free.
    Normal flags are not spread evenly: a heavy-tailed feature holds many of them, and
    without this a surge elsewhere would name it too. Even shares when the model cannot
    draw a sample (or weighs none of it).
    """
    m = len(candidates)
    even = np.full(m, 1.0 / m)
    sample = getattr(model, "_synthetic", None)
    if sample is None:
        return even
    U = sample(np.random.default_rng(seed))
    bounds = np.asarray(model.bounds_, dtype=float)
    X = bounds[:, 0] + U * (bounds[:, 1] - bounds[:, 0])  # back to raw units: the model scales them again
    w = np.asarray(weigh(model.score_samples(X)), dtype=float)
    if np.count_nonzero(w) < 10 * m:
        return even
    counts = part_counts(w, grid_unusual(model, X, grid_thresholds), candidates)
    # A little even mass, so that no part is expected to hold nothing (the sample is finite).
    return 0.9 * counts / counts.sum() + 0.1 * even


def released_parts_scale(flag_cap: "float | None", epsilon_parts: "float | None", rate: float, events_per_window: float,
                         span_windows: int) -> float:
    """The Laplace scale of a baseline's released normal share per part, as a share of the
    normal weight (public: from the estimate's released fields and the config).

    The baseline adds Laplace(flag_cap / epsilon_parts) to each part's clipped weight over
    its span (``BaselineTracker``; a cap of None: each event its own unit, sensitivity 1),
    and the shares are those totals over the span's normal weight, about rate x events per
    window x span windows. Infinite when that weight is 0 (the shares say nothing).

    >>> round(released_parts_scale(16, 0.025, 0.01, 1500.0, 288), 3)
    0.148
    """
    if not epsilon_parts:
        return 0.0
    weight = float(rate) * float(events_per_window) * int(span_windows)
    if not weight > 0:
        return math.inf
    return float(flag_cap or 1.0) / float(epsilon_parts) / weight
