"""What the alarm makes of events you know are anomalies: their weight at its levels.

A surge of m people adds about m x (w_a - r) to a window's statistic, w_a the mean weight the
alarm gives the surge's events and r normal events' mean weight; the smallest surge that pages
follows from it (``monitor budget --anomalies FILE``). The synthetic probe
(``monitor.model.sight``) guesses w_a from events pushed outside the reference data; a file of
the user's own anomalies measures it.

Operator-side: this reads rows of the user's own file and prints exact figures about them, for
the operator who holds that file; nothing here is released or charged (README, "What is private").

>>> import numpy as np
>>> class Model:
...     def threshold_for(self, c): return {0.01: 2.0, 0.1: 1.0}[c]
...     def score_samples(self, X): return np.asarray(X, float)[:, 0]
>>> from monitor.config import AlarmSettings
>>> s = anomaly_sight(Model(), AlarmSettings(), np.array([[0.5], [1.5], [3.0], [9.0]]))
>>> s.rows, s.full_share, round(s.mean_weight, 3)
(4, 0.5, 0.625)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from monitor.alarm.calibrate import normal_weight_moments, rung_levels, rung_units
from monitor.alarm.units import RESOLUTION

__all__ = ["AnomalySight", "anomaly_sight", "auroc"]


@dataclass(frozen=True)
class AnomalySight:
    """The alarm's weights of a file's anomalies (``rows`` of them): the share weighed fully (above
    the upper level), their mean weight, normal events' mean weight at the same levels (the model's
    calibration), and with labels the AUROC of the model's score (anomalies against the file's
    normal rows)."""

    rows: int
    full_share: float
    mean_weight: float
    normal_weight: float
    auroc: "float | None" = None

    @property
    def excess(self) -> float:
        """What one anomalous event adds to a window's statistic beyond a normal one's weight."""
        return max(0.0, self.mean_weight - self.normal_weight)

    def as_dict(self) -> dict:
        return {**asdict(self), "excess": self.excess}


def anomaly_sight(model, settings, X: np.ndarray, labels: "np.ndarray | None" = None,
                  shares: "tuple[float, float | None] | None" = None) -> AnomalySight:
    """Weigh ``X``'s rows at the alarm's levels (``settings``: the config's ``alarm`` block;
    ``shares``: a rung of its ladder, the configured pair by default). ``labels`` (1 = anomaly):
    only those rows are the anomalies, and the AUROC of the score is measured against the rest."""
    X = np.asarray(X, dtype=float)
    levels = rung_levels(model, settings, shares)
    scores = np.asarray(model.score_samples(X), dtype=float)
    weights = rung_units(scores, levels, RESOLUTION) / RESOLUTION
    area = None
    if labels is not None:
        labels = np.asarray(labels).astype(bool)
        if labels.shape != (len(X),):
            raise ValueError(f"one label per row is needed ({len(X)}), got {labels.shape}")
        if labels.all() or not labels.any():
            area = None
        else:
            area = auroc(scores[labels], scores[~labels])
        weights = weights[labels]
    if weights.size == 0:
        raise ValueError("no anomalies to weigh: the file (or its rows labelled 1) is empty")
    normal = normal_weight_moments(model, levels, settings.contamination)[0]
    return AnomalySight(int(weights.size), float(np.mean(weights >= 1.0)), float(weights.mean()), float(normal), area)


def auroc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(score of an anomaly > score of a normal row), ties counted half (the Mann-Whitney U).

    >>> auroc(np.array([3.0, 4.0]), np.array([1.0, 3.0]))
    0.875
    """
    from scipy.stats import rankdata

    both = np.concatenate([positive, negative])
    ranks = rankdata(both)[: positive.size]
    n_p, n_n = positive.size, negative.size
    return float((ranks.sum() - n_p * (n_p + 1) / 2) / (n_p * n_n))
