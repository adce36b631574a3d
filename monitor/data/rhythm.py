"""Daily and weekly rhythms in simulated traffic: which normal rows are likely at which hour.

Real traffic changes its make-up with the time of day (night and day, shifts, weekdays), so
the share of events any fixed model flags moves with the hour. A :class:`Rhythm` says, for
every moment, how the normal population is reweighted: an exponential tilt of a row's weight
along a direction of the normal data,

    weight(row, t) proportional to exp(a(t) . (u1, u2)),

``u1``, ``u2`` the row's standardised first and second principal components (of the traffic's
own pool of normal rows: the benchmark's ground truth, nothing the monitor sees). At one
moment the traffic is a mixture of such tilts (:meth:`Rhythm.components`):

- ``wave``: a smooth daily wave, ``a = (strength * sin(2 pi t), 0)`` with ``t`` in days: by
  night one side of the normal distribution dominates, by day the other;
- ``switch``: a day/night switch: the night weighting ``(-strength, 0)`` until ``day_start``,
  then the mixture moves to the day weighting ``(+strength, 0)`` over ``switch_hours``, and
  back at ``night_start``;
- ``weekly``: the wave on weekdays, and on the ``weekend`` days (2 of 7) a wave along the
  SECOND component instead (another part of the normal data moves);
- ``none`` (or strength 0): stationary.

:class:`RowRhythm` applies a rhythm to a pool of rows: :meth:`RowRhythm.probabilities` is the
exact distribution a window's rows are drawn from, so :meth:`RowRhythm.expected` gives the
TRUE expected value per event of anything computed per row (a flag, a graded weight): the
oracle an exact detector that knows each window's normal rate uses.

Optionally the volume follows the day too (``volume``: events per window times
``1 + volume * sin(2 pi t)``; :class:`monitor.data.traffic.RowTraffic` has its own ``swing``).

>>> rng = np.random.default_rng(0)
>>> pool = rng.normal(size=(500, 3))
>>> rr = RowRhythm(pool, Rhythm("wave", 1.0))
>>> p_night, p_day = rr.probabilities(0.75), rr.probabilities(0.25)   # sin = -1 and +1
>>> bool(p_day @ rr.u[:, 0] > 0.5 > -0.5 > p_night @ rr.u[:, 0])
True
>>> np.allclose(RowRhythm(pool, Rhythm("wave", 0.0)).probabilities(0.3), 1 / 500)
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["RHYTHM_KINDS", "Rhythm", "RowRhythm", "principal_scores"]

RHYTHM_KINDS: tuple[str, ...] = ("none", "wave", "switch", "weekly")


@dataclass(frozen=True)
class Rhythm:
    """How the normal population is reweighted over the day (see the module docstring).

    Time ``t`` is in days from midnight of day 0; day ``d`` is a weekend day when
    ``d % 7`` is in ``weekend`` (day 0 a Monday by default).
    """

    kind: str = "wave"
    strength: float = 0.5
    switch_hours: float = 1.0
    day_start: float = 7.0       # hour the night -> day switch begins
    night_start: float = 19.0    # hour the day -> night switch begins
    weekend: tuple[int, ...] = (5, 6)
    volume: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in RHYTHM_KINDS:
            raise ValueError(f"rhythm kind must be one of {', '.join(RHYTHM_KINDS)}, got {self.kind!r}")
        if not (math.isfinite(self.strength) and self.strength >= 0):
            raise ValueError(f"rhythm strength must be a non-negative number, got {self.strength}")
        if not 0 < self.switch_hours <= 12:
            raise ValueError(f"switch_hours must be in (0, 12], got {self.switch_hours}")
        if not 0 <= self.day_start < self.night_start - self.switch_hours <= 24 - self.switch_hours:
            raise ValueError("need 0 <= day_start < night_start - switch_hours and night_start <= 24")
        if not 0 <= self.volume < 1:
            raise ValueError(f"rhythm volume must be in [0, 1), got {self.volume}")

    @property
    def stationary(self) -> bool:
        return self.kind == "none" or self.strength == 0

    def components(self, t: float) -> list[tuple[float, tuple[float, float]]]:
        """The mixture at time ``t`` (days): (share, tilt along (u1, u2)) pairs, shares summing to 1."""
        g = self.strength
        if self.stationary:
            return [(1.0, (0.0, 0.0))]
        day, frac = int(math.floor(t)), t - math.floor(t)
        wave = g * math.sin(2 * math.pi * frac)
        if self.kind == "wave":
            return [(1.0, (wave, 0.0))]
        if self.kind == "weekly":
            return [(1.0, (0.0, wave) if day % 7 in self.weekend else (wave, 0.0))]
        lam = self.day_share(frac * 24.0)
        return [(s, a) for s, a in ((1.0 - lam, (-g, 0.0)), (lam, (g, 0.0))) if s > 0]

    def day_share(self, hour: float) -> float:
        """The switch's share of the day weighting at ``hour``: 0 by night, 1 by day, linear in between."""
        up = (hour - self.day_start) / self.switch_hours
        down = (hour - self.night_start) / self.switch_hours
        return float(min(max(up, 0.0), 1.0) - min(max(down, 0.0), 1.0))

    def volume_factor(self, t: float) -> float:
        """Events per unit of time relative to the mean, at time ``t`` (days)."""
        return 1.0 + self.volume * math.sin(2 * math.pi * (t - math.floor(t)))

    def cumulative_volume(self, t: float) -> float:
        """The integral of :meth:`volume_factor` from 0 to ``t`` (days): events sent by ``t`` over the mean rate."""
        return t + self.volume * (1.0 - math.cos(2 * math.pi * t)) / (2 * math.pi)

    def activity_factor(self, t: float) -> float:
        """For simulators without rows to reweight (the vitals): a multiplier of everybody's
        activity, the mixture's mean of exp(tilt along the first direction); on weekend days
        (``weekly``) people are 20 % less active and the wave is half as deep."""
        comps = self.components(t)
        return float(sum(s * (math.exp(a[0]) if a[1] == 0 else 0.8 * math.exp(a[1] / 2)) for s, a in comps))


def principal_scores(X: np.ndarray, k: int = 2) -> np.ndarray:
    """(n, k) standardised scores of ``X``'s first ``k`` principal components (of the
    column-standardised data; constant columns ignored), each with mean 0 and variance 1,
    the sign fixed so that the component's largest loading is positive (deterministic)."""
    X = np.asarray(X, dtype=float)
    sd = X.std(axis=0)
    keep = sd > 0
    Z = (X[:, keep] - X[:, keep].mean(axis=0)) / sd[keep] if keep.any() else np.zeros((X.shape[0], 0))
    out = np.zeros((X.shape[0], k))
    if Z.shape[1] == 0 or X.shape[0] < 2:
        return out
    _, _, vt = np.linalg.svd(Z, full_matrices=False)
    for j in range(min(k, vt.shape[0])):
        v = vt[j] * (1.0 if vt[j][np.argmax(np.abs(vt[j]))] > 0 else -1.0)
        s = Z @ v
        sd_s = s.std()
        out[:, j] = (s - s.mean()) / sd_s if sd_s > 0 else 0.0
    return out


class RowRhythm:
    """A :class:`Rhythm` applied to a pool of rows: the exact distribution of a row drawn at time ``t``.

    ``u`` (n, 2) are the pool's standardised first two principal components
    (:func:`principal_scores`).
    """

    def __init__(self, pool: np.ndarray, rhythm: Rhythm) -> None:
        self.pool = np.asarray(pool, dtype=float)
        if self.pool.ndim != 2 or self.pool.shape[0] == 0:
            raise ValueError("pool must be a non-empty 2-D array of rows")
        self.rhythm = rhythm
        self.u = principal_scores(self.pool, 2)
        self._cache: dict[tuple, np.ndarray] = {}

    def _tilted(self, a: tuple[float, float]) -> np.ndarray:
        key = (round(a[0], 12), round(a[1], 12))
        p = self._cache.get(key)
        if p is None:
            z = self.u @ np.asarray(a)
            w = np.exp(z - z.max())  # max-shift: no overflow at any strength
            p = w / w.sum()
            if len(self._cache) < 4096:
                self._cache[key] = p
        return p

    def probabilities(self, t: float) -> np.ndarray:
        """(n,) probability of each pool row for an event at time ``t`` (days); sums to 1."""
        comps = self.rhythm.components(t)
        p = sum(s * self._tilted(a) for s, a in comps)
        return p / p.sum()

    def expected(self, t: float, values: np.ndarray) -> np.ndarray:
        """The exact expected value per event at time ``t`` of per-row ``values`` ((n,) or (n, L)):
        e.g. the normal flagged share at each flag level, the oracle's rate."""
        return self.probabilities(t) @ np.asarray(values, dtype=float)

    def draw(self, t: float, size: int, rng: np.random.Generator) -> np.ndarray:
        """Indices of ``size`` pool rows drawn independently at time ``t``."""
        if self.rhythm.stationary:
            return rng.integers(self.pool.shape[0], size=size)
        cdf = np.cumsum(self.probabilities(t))
        return np.minimum(np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right"), cdf.size - 1)

    def swing(self, values: np.ndarray, times: Sequence[float]) -> float:
        """max / mean over ``times`` of the expected per-event ``values`` (1.0 = no swing)."""
        r = np.array([self.expected(t, values) for t in times])
        return float(r.max() / r.mean()) if r.mean() > 0 else float("nan")
