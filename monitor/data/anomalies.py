"""Anomalies that look like real ones, for any feature set.

The simulator's own desaturation episodes are extreme: the model flags 99 % of them. Real
surges are often quieter. Each kind below turns normal readings into anomalous ones; a
surge draws one :class:`AnomalyRecipe` (one cause: the same features, the same shift for
everybody in it) and applies it to the readings of the people it hits:

- ``subtle_shift``: one or two features shifted by 1.5 to 3 standard deviations;
- ``stuck_sensor``: one feature reads a constant (its lower public bound, as a dead sensor does);
- ``correlated_drift``: every feature moves together along one direction, 2 to 3 sd in all;
- ``far_outlier``: one or two features far out (5 to 8 sd), each person differently.

``clustered`` and ``spread`` are the vitals simulator's own desaturation episodes
(:mod:`monitor.data.vitals`); ``rows`` are real anomalous rows (``monitor simulate
--anomalies``, the real-data benchmark).

>>> rng = np.random.default_rng(0)
>>> X = rng.normal(0.0, 1.0, size=(500, 4))
>>> stats = FeatureStats.of(X, bounds=np.array([[-10.0, 10.0]] * 4))
>>> r = draw_recipe("subtle_shift", stats, rng)
>>> Y = apply_recipe(r, X, stats, rng)
>>> moved = np.abs((Y - X).mean(axis=0)) > 1.0
>>> 1 <= int(moved.sum()) <= 2
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ANOMALY_KINDS", "SYNTHETIC_KINDS", "FeatureStats", "AnomalyRecipe", "draw_recipe", "apply_recipe"]

SYNTHETIC_KINDS: tuple[str, ...] = ("subtle_shift", "stuck_sensor", "correlated_drift", "far_outlier")
ANOMALY_KINDS: tuple[str, ...] = ("clustered", "spread", *SYNTHETIC_KINDS)


@dataclass(frozen=True)
class FeatureStats:
    """Per-feature centre, spread and public bounds of normal readings (shape (d,), (d,), (d, 2))."""

    center: np.ndarray
    scale: np.ndarray
    bounds: np.ndarray

    @classmethod
    def of(cls, X: np.ndarray, bounds: np.ndarray) -> "FeatureStats":
        X = np.asarray(X, dtype=float)
        scale = X.std(axis=0)
        span = bounds[:, 1] - bounds[:, 0]
        # A feature that never varies still gets a shift a sensor could show: 1 % of its range.
        scale = np.where(scale > 0, scale, 0.01 * span)
        return cls(np.median(X, axis=0), scale, np.asarray(bounds, dtype=float))


@dataclass(frozen=True)
class AnomalyRecipe:
    """One surge's cause: which features move, and how (in units of each feature's sd)."""

    kind: str
    features: tuple[int, ...]
    shift: np.ndarray          # per feature, in sd (subtle_shift, correlated_drift)


def draw_recipe(kind: str, stats: FeatureStats, rng: np.random.Generator) -> AnomalyRecipe:
    """Draw one surge's recipe of a synthetic ``kind``."""
    d = stats.center.size
    if kind not in SYNTHETIC_KINDS:
        raise ValueError(f"unknown synthetic anomaly kind {kind!r}; one of {', '.join(SYNTHETIC_KINDS)}")
    shift = np.zeros(d)
    if kind == "subtle_shift":
        feats = tuple(int(j) for j in rng.choice(d, size=min(d, int(rng.integers(1, 3))), replace=False))
        shift[list(feats)] = rng.uniform(1.5, 3.0, len(feats)) * rng.choice([-1.0, 1.0], len(feats))
    elif kind == "stuck_sensor":
        feats = (int(rng.integers(d)),)
    elif kind == "correlated_drift":
        feats = tuple(range(d))
        direction = rng.normal(size=d)
        shift = direction / np.linalg.norm(direction) * rng.uniform(2.0, 3.0)
    else:  # far_outlier: the features are drawn per person
        feats = ()
    return AnomalyRecipe(kind, feats, shift)


def apply_recipe(recipe: AnomalyRecipe, X: np.ndarray, stats: FeatureStats, rng: np.random.Generator) -> np.ndarray:
    """The anomalous version of normal readings ``X`` (n, d), clipped to the public bounds."""
    Y = np.array(X, dtype=float, copy=True)
    n, d = Y.shape
    if n == 0:
        return Y
    if recipe.kind in ("subtle_shift", "correlated_drift"):
        Y += recipe.shift * stats.scale
    elif recipe.kind == "stuck_sensor":
        j = recipe.features[0]
        Y[:, j] = stats.bounds[j, 0]
    elif recipe.kind == "far_outlier":
        for i in range(n):
            feats = rng.choice(d, size=min(d, int(rng.integers(1, 3))), replace=False)
            Y[i, feats] = stats.center[feats] + rng.uniform(5.0, 8.0, feats.size) * rng.choice([-1.0, 1.0], feats.size) * stats.scale[feats]
    else:
        raise ValueError(f"unknown synthetic anomaly kind {recipe.kind!r}")
    return np.clip(Y, stats.bounds[:, 0], stats.bounds[:, 1])
