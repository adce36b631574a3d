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
- ``curve``: a measured curve with its weekends (``curve_slots`` values a day from a Monday):
  ``a = (strength * c(t), 0)``, ``c`` the curve normalised to [-1, 1] (:meth:`Rhythm.shape`);
- ``none`` (or strength 0): stationary.

:class:`RowRhythm` applies a rhythm to a pool of rows: :meth:`RowRhythm.probabilities` is the
exact distribution a window's rows are drawn from, so :meth:`RowRhythm.expected` gives the
TRUE expected value per event of anything computed per row (a flag, a graded weight): the
oracle an exact detector that knows each window's normal rate uses.

Optionally the volume follows the day (``volume``: events per window times ``1 + volume * sin(2 pi t)``,
or ``1 + volume * c(t)``; :class:`monitor.data.traffic.RowTraffic` follows a ``curve``'s, else its ``swing``).

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
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

__all__ = ["RHYTHM_KINDS", "Rhythm", "RowRhythm", "principal_scores", "strength_for_swing"]

RHYTHM_KINDS: tuple[str, ...] = ("none", "wave", "switch", "weekly", "curve")


@dataclass(frozen=True)
class Rhythm:
    """How the normal population is reweighted over the day (see the module docstring).

    Time ``t`` is in days from midnight of day 0; day ``d`` is a weekend day when
    ``d % 7`` is in ``weekend`` (day 0 a Monday by default). ``curve`` (kind ``curve`` only):
    ``curve_slots`` values a day from midnight of day 0, any whole number of days.
    """

    kind: str = "wave"
    strength: float = 0.5
    switch_hours: float = 1.0
    day_start: float = 7.0       # hour the night -> day switch begins
    night_start: float = 19.0    # hour the day -> night switch begins
    weekend: tuple[int, ...] = (5, 6)
    volume: float = 0.0
    curve: tuple[float, ...] = field(default=(), repr=False)
    curve_slots: int = 48

    def __post_init__(self) -> None:
        if self.kind == "curve" or self.curve:
            self._check_curve()
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

    def _check_curve(self) -> None:
        if self.kind != "curve":
            raise ValueError(f"only a rhythm of kind 'curve' takes a curve, got kind {self.kind!r}")
        if not (isinstance(self.curve_slots, int) and self.curve_slots >= 1):
            raise ValueError(f"curve_slots must be a positive whole number, got {self.curve_slots!r}")
        x = np.asarray(self.curve, dtype=float)
        if x.ndim != 1 or x.size == 0 or x.size % self.curve_slots:
            raise ValueError(f"a curve needs whole days of {self.curve_slots} values, got {x.size} values")
        if not np.isfinite(x).all():
            raise ValueError("a curve's values must be finite")
        dev = np.abs(x - x.mean()).max()
        if dev == 0:
            raise ValueError("a curve must not be constant")
        # The normalised shape, and the integral of the linear pieces up to each slot start (the
        # last piece wraps to the first slot); frozen, so set once here.
        c = (x - x.mean()) / dev
        steps = (c + np.roll(c, -1)) / (2 * self.curve_slots)
        object.__setattr__(self, "_shape", c)
        object.__setattr__(self, "_area", np.concatenate([[0.0], np.cumsum(steps)]))

    @property
    def curve_days(self) -> int:
        """Days the curve covers before it repeats (0 without a curve)."""
        return len(self.curve) // self.curve_slots if self.curve else 0

    @property
    def curve_volume(self) -> float:
        """The curve's own swing relative to its mean (its largest deviation over its mean): with
        ``volume`` set to it, events follow the curve in proportion (0 without a curve)."""
        x = np.asarray(self.curve, dtype=float)
        return float(np.abs(x - x.mean()).max() / x.mean()) if self.curve and x.mean() > 0 else 0.0

    def shape(self, t: float) -> float:
        """The curve's normalised value at time ``t`` (days): centred on its mean and divided by its
        largest deviation (in [-1, 1]), linear between slot starts (the last slot back to the first).
        With ``volume``, events per window are ``1 + volume * shape(t)`` times the mean;
        :attr:`curve_volume` (the curve's own relative swing) sends them in proportion to the curve.

        >>> c = Rhythm("curve", 1.0, curve=(1.0, 3.0), curve_slots=2)   # midnight low, noon high
        >>> c.shape(0.0), c.shape(0.25), c.shape(0.5), c.components(0.5)
        (-1.0, 0.0, 1.0, [(1.0, (1.0, 0.0))])
        """
        c = self._shape
        pos = (t * self.curve_slots) % c.size
        k = int(math.floor(pos))
        frac = pos - k
        return float((1.0 - frac) * c[k] + frac * c[(k + 1) % c.size])

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
        if self.kind == "curve":
            return [(1.0, (g * self.shape(t), 0.0))]
        lam = self.day_share(frac * 24.0)
        return [(s, a) for s, a in ((1.0 - lam, (-g, 0.0)), (lam, (g, 0.0))) if s > 0]

    def day_share(self, hour: float) -> float:
        """The switch's share of the day weighting at ``hour``: 0 by night, 1 by day, linear in between."""
        up = (hour - self.day_start) / self.switch_hours
        down = (hour - self.night_start) / self.switch_hours
        return float(min(max(up, 0.0), 1.0) - min(max(down, 0.0), 1.0))

    def volume_factor(self, t: float) -> float:
        """Events per unit of time relative to the mean, at time ``t`` (days)."""
        if self.kind == "curve":
            return 1.0 + self.volume * self.shape(t)
        return 1.0 + self.volume * math.sin(2 * math.pi * (t - math.floor(t)))

    def cumulative_volume(self, t: float) -> float:
        """The integral of :meth:`volume_factor` from 0 to ``t`` (days): events sent by ``t`` over the mean rate."""
        if self.kind == "curve":
            c, area, n = self._shape, self._area, self._shape.size
            laps, pos = divmod(t * self.curve_slots, n)
            k = int(math.floor(pos))
            frac = pos - k
            part = (c[k] * frac + (c[(k + 1) % n] - c[k]) * frac * frac / 2) / self.curve_slots
            return t + self.volume * (laps * area[-1] + area[k] + part)
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


def strength_for_swing(rhythm: Rhythm, pool: "np.ndarray | RowRhythm", values: np.ndarray, times: Sequence[float],
                       target: float, most: float = 8.0) -> float:
    """The smallest strength at which ``rhythm`` swings per-row ``values`` ((n,)) to ``target``
    (max / mean over ``times`` of their expected value per event, :meth:`RowRhythm.swing`), or
    ``most`` if that strength does not reach it. ``pool``: the rows, or a :class:`RowRhythm` of
    them (its principal components are reused). A benchmark's knob: a rhythm as strong as a real
    one is for the quantity that matters (the alarm's flagged weight), where one strength means
    something else on every data set.

    >>> rng = np.random.default_rng(0)
    >>> pool = rng.normal(size=(400, 2))
    >>> values = (pool[:, 0] > 1).astype(float)
    >>> g = strength_for_swing(Rhythm("wave", 0.0), pool, values, np.arange(48) / 48, 2.0)
    >>> round(RowRhythm(pool, Rhythm("wave", g)).swing(values, np.arange(48) / 48), 3)
    2.0
    """
    if not target >= 1.0:
        raise ValueError(f"a swing is max / mean, at least 1, got {target}")
    base = pool if isinstance(pool, RowRhythm) else RowRhythm(pool, rhythm)
    values = np.asarray(values, dtype=float)

    def swing(g: float) -> float:
        rr = RowRhythm.__new__(RowRhythm)  # the same rows and components, another strength
        rr.pool, rr.u, rr._cache, rr.rhythm = base.pool, base.u, {}, replace(rhythm, strength=g)
        return rr.swing(values, times)

    # A coarse scan for the first strength past the target (the swing need not grow evenly), then bisection.
    lo = 0.0
    for g in np.linspace(0.0, most, 33)[1:]:
        if swing(float(g)) >= target:
            hi = float(g)
            break
        lo = float(g)
    else:
        return float(most)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if swing(mid) < target else (lo, mid)
    return hi
