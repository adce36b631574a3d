"""Can the model flag anything? A probe of the released model, from public things only.

A model fitted on too few reference rows for its epsilon can be blind: its noisy cells
reach k almost everywhere, so an event far from every normal record scores like a
normal one and never weighs in the alarm (measured: 357 rows, 5 features, epsilon 1:
rows with one feature far outside the normal range all scored under the alarm's level).
The calibration cannot say so, since it only sees normal rows.

The probe: points drawn from the model's own noisy mass (``GridKNN._synthetic``, a public
seed), each with one feature (in turn) pushed to a uniform place at least ``STEP`` of its
public range beyond the bulk of that mass (its ``BULK`` and 1 - ``BULK`` quantiles).
``sight`` is how much weight the push adds at the alarm's two levels, on average:
mean w(pushed) - mean w(unpushed), in [0, 1] (the surge excess such an event brings, for
the 1 an event weighing fully brings). Post-processing of the released model with public
randomness: free, never the reference rows.

>>> import numpy as np
>>> from monitor.model import GridKNN
>>> X = np.random.default_rng(0).normal(50, 5, size=(4000, 3))
>>> m = GridKNN(epsilon=1.0, bounds=[(0, 100)] * 3, contamination=0.05, random_state=1).fit(X)
>>> s = model_sight(m, m.threshold_for(0.1), m.threshold_for(0.01))
>>> s.blind, s.sight > 0.5
(False, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Sight", "model_sight", "model_sight_at", "SIGHT_BLIND", "SIGHT_SIGNAL"]

PROBE_POINTS = 4000
PROBE_SEED = 1  # public: which synthetic points are pushed, and where to
SYNTHETIC_SEED = 0
BULK = 0.01  # the bulk of the noisy mass along a feature: its 1 % to 99 % quantiles
STEP = 0.1  # pushed at least a tenth of the public range beyond it
# Below this the model "flags almost nothing": an event far outside its bulk adds under half
# a flag. Measured on the bundled vital signs (5 features, epsilon 1, noise seeds 0-5): 357
# rows gave 0.05 to 0.48, 1,000 rows 0.26 to 0.90, 2,000 rows 0.39 to 0.91, 4,000 rows 0.55
# to 0.93; 357 rows of a second 5-feature set (benign breast-cancer records) 0.08 to 0.32,
# where rows with one feature far off scored under the alarm's upper level, all but 1 in 200.
SIGHT_BLIND = 0.5
# Records per grid cell, in noise scales (``GridKNN.cell_signal_``), at which the models of
# that measurement saw in 5 draws of 6 (2,000 rows; 1,000 rows, 2.5 noise scales: 4 of 6).
SIGHT_SIGNAL = 5.0


@dataclass(frozen=True)
class Sight:
    """What the probe measured (public).

    ``sight``: the weight a push outside the bulk adds on average (0: blind, 1: every
    pushed event weighs fully); ``pushed_weight`` / ``base_weight``: the two means;
    ``flagged_share``: the share of pushed points above the upper level (weighing 1);
    ``probed``: points that could be pushed (a feature whose bulk reaches within ``STEP`` of
    its public bounds leaves no room). 0: the reference data fills every feature's public
    range, no event lies outside it, and the probe measures nothing (``has_room`` False: not
    blind; anomalies there lie inside the ranges, and a file of them is the check).
    ``rows_needed`` / ``epsilon_needed``: a rough size or budget at which models of this
    layout's kind saw (``SIGHT_SIGNAL`` noise scales per cell), None when unknown.
    """

    sight: float
    pushed_weight: float
    base_weight: float
    flagged_share: float
    probed: int
    rows_needed: float | None = None
    epsilon_needed: float | None = None

    @property
    def has_room(self) -> bool:
        """Some feature's bulk leaves room to push an event outside it: the probe measured."""
        return self.probed > 0

    @property
    def blind(self) -> bool:
        return self.has_room and self.sight < SIGHT_BLIND

    def as_dict(self) -> dict:
        return {"sight": self.sight, "pushed_weight": self.pushed_weight, "base_weight": self.base_weight,
                "flagged_share": self.flagged_share, "probed": self.probed, "has_room": self.has_room, "blind": self.blind,
                "rows_needed": self.rows_needed,
                "epsilon_needed": self.epsilon_needed}

    def advice(self) -> str:
        """What would be needed at least, as one clause (empty when unknown). A lower bound:
        the bundled vital signs saw at about that size, independent normal features (a looser
        bulk) needed about 4 times as many rows at 5 features, and more with more features,
        where an event unusual in one feature is diluted among more grids."""
        parts = []
        if self.rows_needed is not None:
            parts.append(f"at least about {float(f'{self.rows_needed:.2g}'):,.0f} reference rows")
        if self.epsilon_needed is not None:
            parts.append(f"with model.epsilon at least about {self.epsilon_needed:.2g}")
        return " or ".join(parts)


def probe_points(model, n: int = PROBE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(base, pushed): points of the model's noisy mass in the unit cube, and the same with
    one feature each pushed outside the bulk (only the points that had room)."""
    base = model._synthetic(np.random.default_rng(SYNTHETIC_SEED))
    d = base.shape[1]
    lo, hi = np.quantile(base, BULK, axis=0), np.quantile(base, 1.0 - BULK, axis=0)
    below, above = np.clip(lo - STEP, 0.0, None), np.clip(1.0 - (hi + STEP), 0.0, None)
    gen = np.random.default_rng(PROBE_SEED)
    pick = gen.integers(0, len(base), n)
    feature = np.arange(n) % d
    room = below[feature] + above[feature]
    u = gen.random(n) * room
    value = np.where(u < below[feature], u, hi[feature] + STEP + (u - below[feature]))
    ok = room > 0
    B = base[pick[ok]]
    P = B.copy()
    P[np.arange(int(ok.sum())), feature[ok]] = np.clip(value[ok], 0.0, 1.0)
    return B, P


def model_sight(model, t_lo: float, t_hi: float) -> Sight:
    """Probe ``model`` at the alarm's levels (``monitor.alarm.calibrate.alarm_levels``)."""
    return model_sight_at(model, [(t_lo, t_hi)])


def model_sight_at(model, levels: "list[tuple[float, float]] | tuple[tuple[float, float], ...]") -> Sight:
    """Probe ``model`` at a rung of the alarm's levels (``calibrate.rung_levels``): the weight is
    the mean of the graded weights at each (t_lo, t_hi) pair, and an event weighs fully above
    the highest t_hi."""
    from monitor.alarm.calibrate import graded_weights

    def weight(scores: np.ndarray) -> float:
        return float(np.mean([graded_weights(scores, lo, hi) for lo, hi in levels], axis=0).mean())

    B, P = probe_points(model)
    if not len(P):
        return Sight(0.0, 0.0, 0.0, 0.0, 0, *_needed(model))
    wb = weight(model._score_unit(B))
    pushed = model._score_unit(P)
    wp = weight(pushed)
    top = max(hi for _, hi in levels)
    return Sight(max(0.0, wp - wb), wp, wb, float((pushed > top).mean()), len(P), *_needed(model))


def _needed(model) -> tuple[float | None, float | None]:
    """Rows and epsilon at SIGHT_SIGNAL noise scales per cell: the signal grows about like
    rows x epsilon (the layout keeps its cells near one noise scale up to its finest bins)."""
    signal, n = model.cell_signal_, getattr(model, "n_estimate_", None)
    if signal is None or n is None or not signal > 0 or signal >= SIGHT_SIGNAL:
        return None, None
    times = SIGHT_SIGNAL / signal
    return max(float(n), 1.0) * times, float(model.epsilon) * times
