"""Simulated traffic for alarm benchmarks and demos: days of windows with surges.

Each window holds one event per person online. The number online follows a daily
swing (+-``swing`` around ``people``); a slow drift raises everybody's activity over the
days, which moves the normal flagged rate the way a real fleet's habits do. Surges
last a few windows: a share of the people online sends anomalous readings, *clustered*
(close together: one cause, the realistic case) or *spread* (far from each other too).

Surges can also be any kind of :mod:`monitor.data.anomalies` (subtle shifts, stuck
sensors, correlated drift, far outliers), and :class:`RowTraffic` builds the same days
from labelled rows (normal rows as the traffic, anomalous rows as the surges: the
real-data benchmark, ``bench/bench_alarm_real.py``).

Pure numpy, no Kafka: ``bench/bench_alarm.py`` and ``bench/bench_alarm_real.py`` use it.

>>> t = Traffic(people=100, days=1, seed=0)
>>> plan = plan_surges(days=1, per_day=2, windows_per_day=t.windows_per_day, share=0.1, rng=1)
>>> X, entities, anomalous = t.window(plan[0].start, plan)
>>> X.shape[1], int(anomalous.sum()) > 0, len(entities) == len(X)
(5, True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from monitor.data.anomalies import SYNTHETIC_KINDS, FeatureStats, apply_recipe, draw_recipe
from monitor.data.rhythm import Rhythm, RowRhythm
from monitor.data.vitals import VITAL_FEATURES, VitalsSimulator, random_cluster

__all__ = ["Surge", "Traffic", "RowTraffic", "plan_surges"]

SurgeKind = Literal["clustered", "spread", "subtle_shift", "stuck_sensor", "correlated_drift", "far_outlier", "rows"]


@dataclass(frozen=True)
class Surge:
    """From window ``start`` for ``windows`` windows, a share ``share`` of the people
    online sends anomalous readings, clustered around ``center`` or spread."""

    start: int
    windows: int
    share: float
    kind: SurgeKind
    center: tuple[float, float] | None = None
    seed: int = 0               # draws a synthetic kind's recipe (one cause per surge)

    def covers(self, i: int) -> bool:
        return self.start <= i < self.start + self.windows


def plan_surges(days: int, per_day: int, windows_per_day: int, share: float, windows: int = 3,
                rng: "int | np.random.Generator | None" = None, kinds: Sequence[str] = ("clustered", "spread"),
                first: int | None = None, anytime: bool = False) -> list[Surge]:
    """``per_day`` surges a day at random, non-overlapping times, of ``kinds`` in turn
    (alternately clustered and spread by default), with at least a day's twelfth between
    two of them; none before window ``first`` of a day (default: the day's 24th part).

    The times come from a grid of slots a day's twelfth apart, so with 6 surges a day most of
    them recur at the hour of one the day before; ``anytime``: at any window instead (still a
    day's twelfth apart), as independent surges would, for a monitor that learns the day's
    shape from the days before."""
    rng = np.random.default_rng(rng)
    gap = max(windows + 4, windows_per_day // 12)
    start = windows_per_day // 24 if first is None else first
    slots = np.arange(start, windows_per_day - gap, gap)
    surges: list[Surge] = []
    for d in range(days):
        if anytime:
            # Spread the same number of starts over the day with random spacing of at least gap.
            k = min(per_day, len(slots))
            room = (windows_per_day - gap) - start - (k - 1) * gap
            starts = np.sort(rng.integers(0, max(room, 1), size=k)) + start + gap * np.arange(k)
        else:
            starts = np.sort(rng.choice(slots, size=min(per_day, len(slots)), replace=False))
        for s in starts:
            kind = kinds[len(surges) % len(kinds)]
            center = random_cluster(rng) if kind == "clustered" else None
            surges.append(Surge(int(d * windows_per_day + s), windows, share, kind, center, int(rng.integers(2**31))))
    return surges


class _DailySchedule:
    """Who is online when: ``people`` on average per window, swinging by +-``swing`` over each
    day of ``days`` days of ``window_seconds`` windows (shared by both traffic sources)."""

    def __init__(self, people: int, days: int, window_seconds: float, swing: float) -> None:
        self.people = int(people)
        self.days = int(days)
        self.window_seconds = float(window_seconds)
        self.swing = float(swing)
        self.windows_per_day = int(round(86400 / self.window_seconds))
        self.population = int(math.ceil(self.people * (1 + self.swing)))

    @property
    def n_windows(self) -> int:
        return self.days * self.windows_per_day

    def online(self, i: int) -> int:
        """How many people send an event in window i (the daily swing)."""
        phase = 2 * math.pi * (i % self.windows_per_day) / self.windows_per_day
        return int(round(self.people * (1 + self.swing * math.sin(phase))))


class Traffic(_DailySchedule):
    """Windows of events from a population of ``people`` devices.

    Parameters
    ----------
    people:
        Mean number of people online per window.
    days, window_seconds:
        Length of the simulation and of one window.
    swing:
        Daily swing of the number online: people * (1 +- swing).
    drift:
        Relative rise of everybody's activity per 30 days (slow; it raises the normal
        flagged rate by several times as much).
    features:
        The vitals by default; any (name, min, max) list (see ``VitalsSimulator``).
    seed:
        Seed of the population and every reading.
    """

    def __init__(self, people: int, days: int = 30, window_seconds: float = 300.0, swing: float = 0.3,
                 drift: float = 0.08, features: Sequence = VITAL_FEATURES, seed: int | None = None) -> None:
        super().__init__(people, days, window_seconds, swing)
        self.drift = float(drift)
        self.sim = VitalsSimulator(features, n_devices=self.population, rng=seed)
        self._activity = self.sim._base["activity"].copy()
        self.order = self.sim.rng.permutation(self.population)
        self._stats: FeatureStats | None = None

    def window(self, i: int, surges: Sequence[Surge] = ()) -> tuple[np.ndarray, list[str], np.ndarray]:
        """Window i's events: (X raw (n, d), entity ids, anomalous mask)."""
        self.sim._base["activity"] = self._activity * (1 + self.drift * i / (30 * self.windows_per_day))
        devices = self.order[: self.online(i)]
        anomalous = np.zeros(devices.size, bool)
        surge = next((s for s in surges if s.covers(i)), None)
        if surge is not None:
            k = int(round(surge.share * devices.size))
            anomalous[self.sim.rng.choice(devices.size, size=k, replace=False)] = True
        if surge is not None and surge.kind in SYNTHETIC_KINDS:
            X = self.sim.readings(devices)
            X[anomalous] = apply_recipe(self._recipe(surge), X[anomalous], self.stats, self.sim.rng)
        else:
            X = self.sim.readings(devices, anomalous, cluster=surge.center if surge is not None else None)
        return X, [self.sim.device_ids[d] for d in devices], anomalous

    @property
    def stats(self) -> FeatureStats:
        """Normal readings' centre and spread (the simulator's truth), for synthetic kinds."""
        if self._stats is None:
            probe = VitalsSimulator(list(zip(self.sim.feature_names, *self.sim.bounds.T)), n_devices=2000, rng=12345)
            self._stats = FeatureStats.of(probe.readings(np.arange(2000)), self.sim.bounds)
        return self._stats

    def _recipe(self, surge: Surge):
        return draw_recipe(surge.kind, self.stats, np.random.default_rng(surge.seed))


class RowTraffic(_DailySchedule):
    """Days of windows built from labelled rows: each person online sends a row drawn at
    random from ``normal``; during a surge, a share of them sends a row drawn from
    ``anomalous`` (kind ``rows``) or their normal row turned anomalous by a synthetic kind.

    The same interface as :class:`Traffic` (``windows_per_day``, ``n_windows``, ``online``,
    ``window``). Rows are raw features; ``bounds`` (d, 2) are the public bounds.

    ``rhythm`` (:mod:`monitor.data.rhythm`) reweights the normal rows by the time of day
    (window i at ``first_day + i / windows_per_day`` days); :meth:`expected` is then the exact
    expected value per normal event of any per-row quantity in window i (the oracle's rate).

    ``persistence``: each window, a person sends their own row for the hour with this
    probability, otherwise a fresh one. Own rows are drawn once per person and hour of the day
    from the rhythm on the first day, and each person moves to the next hour's at their own
    minute. The same people then stay heavy (flagged) window after window and day after day, as
    a patient's device does, where fresh rows make every person's history light.
    ``absence``: the probability that a person online skips a window (a device that drops out),
    so a heavy person is sometimes missing. Both 0 by default (independent rows, everyone online
    sends); :meth:`expected` stays exact (given the people's own rows).

    A rhythm of kind ``curve`` with a ``volume`` sets the number online too:
    ``people * rhythm.volume_factor(t)`` at the window's start (the curve's own shape, its
    weekends included), in place of the daily ``swing``.

    >>> rng = np.random.default_rng(0)
    >>> t = RowTraffic(rng.normal(size=(300, 3)), rng.normal(5, 1, size=(20, 3)), np.array([[-9.0, 9.0]] * 3), people=50, days=1, seed=1)
    >>> X, ents, anom = t.window(10, [Surge(10, 3, 0.2, "rows")])
    >>> X.shape[1], int(anom.sum()), bool(X[anom].mean() > 3)
    (3, 11, True)
    """

    def __init__(self, normal: np.ndarray, anomalous: "np.ndarray | None", bounds: np.ndarray, people: int, days: int = 1,
                 window_seconds: float = 300.0, swing: float = 0.3, seed: int | None = None,
                 rhythm: Rhythm | None = None, first_day: int = 0, persistence: float = 0.0, absence: float = 0.0) -> None:
        for name, value in (("persistence", persistence), ("absence", absence)):
            if not (math.isfinite(value) and 0.0 <= value < 1.0):
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        self.normal = np.asarray(normal, dtype=float)
        self.anomalous = None if anomalous is None else np.asarray(anomalous, dtype=float)
        if self.normal.ndim != 2 or self.normal.shape[0] == 0:
            raise ValueError("normal must be a non-empty 2-D array of rows")
        self.bounds = np.asarray(bounds, dtype=float)
        super().__init__(people, days, window_seconds, swing)
        self._curve_volume = rhythm is not None and rhythm.kind == "curve" and rhythm.volume > 0
        if self._curve_volume:
            self.population = int(math.ceil(self.people * (1 + rhythm.volume)))
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(self.population)
        self.device_ids = [f"p-{i:05d}" for i in range(self.population)]
        self.stats = FeatureStats.of(self.normal, self.bounds)
        self.first_day = int(first_day)
        self.rhythm = RowRhythm(self.normal, rhythm if rhythm is not None else Rhythm("none"))
        self.persistence, self.absence = float(persistence), float(absence)
        self._own: "np.ndarray | None" = None
        if self.persistence > 0:
            # Each person's own row for each hour of the day (their own stream: the other draws are
            # those of independent rows, so persistence 0 replays the same traffic as before).
            own_rng = np.random.default_rng(None if seed is None else seed + 7919)
            self._own = np.stack([self.rhythm.draw(self.first_day + h / 24, self.population, own_rng) for h in range(24)],
                                 axis=1)
            # Each person moves to their next hour's row at their own minute, not all at once.
            self._offset = own_rng.integers(max(1, self.windows_per_day // 24), size=self.population)

    def online(self, i: int) -> int:
        """How many people send an event in window i: the daily swing, or a curve's volume."""
        if self._curve_volume:
            return int(round(self.people * self.rhythm.rhythm.volume_factor(self.time_of(i))))
        return super().online(i)

    def time_of(self, i: int) -> float:
        """Window i's start, in days since midnight of day 0 (the rhythm's clock)."""
        return self.first_day + i / self.windows_per_day

    def expected(self, i: int, values: np.ndarray) -> np.ndarray:
        """The exact expected value per normal event in window i of per-row ``values``
        ((n_normal,) or (n_normal, L), aligned with ``normal``)."""
        fresh = self.rhythm.expected(self.time_of(i), values)
        if self._own is None:
            return fresh
        own = np.asarray(values, dtype=float)[self.own_rows(i)].mean(axis=0)
        return self.persistence * own + (1.0 - self.persistence) * fresh

    def own_rows(self, i: int) -> "np.ndarray | None":
        """The own rows (indices into ``normal``) of the people online in window i for its hour,
        absent or not; None without ``persistence``."""
        if self._own is None:
            return None
        people = self.order[: self.online(i)]
        return self._own[people, self._hours(i, people)]

    def _hours(self, i: int, people: np.ndarray) -> np.ndarray:
        """The hour of the day whose own row each of ``people`` sends in window i."""
        return ((i + self._offset[people]) % self.windows_per_day) * 24 // self.windows_per_day

    def window(self, i: int, surges: Sequence[Surge] = ()) -> tuple[np.ndarray, list[str], np.ndarray]:
        """Window i's events: (X raw (n, d), entity ids, anomalous mask)."""
        devices = self.order[: self.online(i)]
        if self.absence > 0:
            devices = devices[self.rng.random(devices.size) >= self.absence]
        n = devices.size
        rows = self.rhythm.draw(self.time_of(i), n, self.rng)
        if self._own is not None:
            own = self.rng.random(n) < self.persistence
            rows[own] = self._own[devices[own], self._hours(i, devices[own])]
        X = self.normal[rows]
        anomalous = np.zeros(n, bool)
        surge = next((s for s in surges if s.covers(i)), None)
        if surge is not None:
            k = int(round(surge.share * n))
            anomalous[self.rng.choice(n, size=k, replace=False)] = True
            if surge.kind == "rows":
                if self.anomalous is None or self.anomalous.shape[0] == 0:
                    raise ValueError("a surge of kind 'rows' needs anomalous rows")
                X[anomalous] = self.anomalous[self.rng.integers(self.anomalous.shape[0], size=k)]
            else:
                recipe = draw_recipe(surge.kind, self.stats, np.random.default_rng(surge.seed))
                X[anomalous] = apply_recipe(recipe, X[anomalous], self.stats, self.rng)
        return X, [self.device_ids[d] for d in devices], anomalous
