"""Where a surge is: the report's flagged events counted by the feature (the model's
one-feature grids) that finds each one most unusual (docs/design.md#the-report).

The private maths of a report's 'where': no streaming, no Kafka, no Prometheus.

Each flagged event goes to exactly one part, so the parts' counts form a histogram that
one event moves by at most 1 in total (L1 sensitivity 1): Laplace noise of scale
1 / epsilon on every part releases the whole histogram at epsilon (pure DP, parallel
composition); which parts stand out is decided from the released counts and public
numbers only (``monitor.report.simultaneous_low``): post-processing. Proof: docs/proofs/report.md.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from monitor.dp import NoiseSource, Release, laplace_count

__all__ = ["candidate_parts", "grid_unusual", "normal_part_shares", "part_counts", "part_of", "release_parts",
           "released_parts_scale", "ReportHistory"]


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
    # By report part: the grids, or the features of the joint grids (``GridKNN.part_scores``).
    scores = model.part_scores(X_raw) if hasattr(model, "part_scores") else model.grid_scores(X_raw)
    ratio = scores / np.maximum(np.asarray(grid_thresholds, dtype=float)[None, :], 1e-12)
    hists = getattr(getattr(model, "calibration_", None), "grids", None)
    if not hists or len(hists) != n_grids or not getattr(model, "parts_are_grids", lambda: True)():
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


class ReportHistory:
    """Normal traffic's parts read from the scheduled reports already published: free
    (post-processing of released values), and following the hour, since only the last
    ``span_seconds`` of reports count.

    Each scheduled report publishes every part's flagged count (Laplace of scale 1 /
    ``epsilon_parts`` each, then projected) and the event count; a part's normal per event is
    the sum of its published counts over the sum of the published event counts. Reports on a
    page are left out (the surge is what they show); a scheduled report of a surge that did
    not page is kept, which can only raise a part's normal (fewer parts named). The
    published counts are projected onto non-negative parts, so small parts' sums lean high:
    again fewer parts named. The error of the sum of K counts is counted as one Laplace
    variable of the same variance (scale sqrt(K) / epsilon_parts), whose tail is the heavier.

    >>> h = ReportHistory(["a", "b"], epsilon_parts=0.2, min_reports=2)
    >>> for t in (300.0, 600.0):
    ...     h.add(t, {"event_count": {"value": 1000.0}, "where": {"parts": [
    ...         {"grid": "b", "flagged_count": {"value": 5.0}}, {"grid": "a", "flagged_count": {"value": 15.0}}]}})
    >>> share, pi, scale = h.normal(900.0)
    >>> round(share, 3), pi.round(2).tolist(), round(scale, 3)
    (0.02, [0.75, 0.25], 0.177)
    """

    def __init__(self, part_grids: Sequence[str], epsilon_parts: float, span_seconds: float = 7200.0,
                 min_reports: int = 12) -> None:
        self.part_grids = list(part_grids)
        self.epsilon_parts = float(epsilon_parts)
        self.span_seconds = float(span_seconds)
        self.min_reports = int(min_reports)
        self._reports: list[tuple[float, float, np.ndarray]] = []  # (window end, events, part counts)

    def add(self, window_end: float, report: dict) -> None:
        """Keep a published scheduled report's event count and part counts."""
        where = report.get("where") or {}
        counts = {p["grid"]: float(p["flagged_count"]["value"]) for p in where.get("parts") or []}
        if set(counts) != set(self.part_grids):
            return
        self._reports.append((float(window_end), max(float(report["event_count"]["value"]), 0.0),
                              np.array([counts[g] for g in self.part_grids])))

    def normal(self, now: float) -> "tuple[float, np.ndarray, float] | None":
        """(normal weight per event, its shares over the parts, the shares' Laplace scale as
        ``release_report``'s ``normal_parts_scale``) from the reports of the last
        ``span_seconds`` before ``now``; None with fewer than ``min_reports`` of them or no
        normal weight."""
        self._reports = [r for r in self._reports if r[0] > now - self.span_seconds]
        recent = [r for r in self._reports if r[0] <= now]
        if len(recent) < self.min_reports:
            return None
        events = math.fsum(r[1] for r in recent)
        counts = np.sum([r[2] for r in recent], axis=0)
        weight = float(counts.sum())
        if not (events > 0 and weight > 0):
            return None
        share = weight / events
        return share, counts / weight, math.sqrt(len(recent)) / self.epsilon_parts / weight
