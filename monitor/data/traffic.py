"""Simulated traffic for alarm benchmarks and demos: days of windows with surges.

Each window holds one event per person online. The number online follows a daily
swing (+-``swing`` around ``people``); a slow drift raises everybody's activity over the
days, which moves the normal flagged rate the way a real fleet's habits do. Surges
last a few windows: a share of the people online sends anomalous readings, *clustered*
(close together: one cause, the realistic case) or *spread* (far from each other too).

Pure numpy, no Kafka: ``bench/bench_alarm.py`` and ``monitor simulate --surges`` use it.

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

from monitor.data.vitals import VITAL_FEATURES, VitalsSimulator, random_cluster

__all__ = ["Surge", "Traffic", "plan_surges"]

SurgeKind = Literal["clustered", "spread"]


@dataclass(frozen=True)
class Surge:
    """From window ``start`` for ``windows`` windows, a share ``share`` of the people
    online sends anomalous readings, clustered around ``center`` or spread."""

    start: int
    windows: int
    share: float
    kind: SurgeKind
    center: tuple[float, float] | None = None

    def covers(self, i: int) -> bool:
        return self.start <= i < self.start + self.windows


def plan_surges(days: int, per_day: int, windows_per_day: int, share: float, windows: int = 3,
                rng: "int | np.random.Generator | None" = None) -> list[Surge]:
    """``per_day`` surges a day at random, non-overlapping times, alternately clustered and
    spread, with at least a day's twelfth between two of them."""
    rng = np.random.default_rng(rng)
    gap = max(windows + 4, windows_per_day // 12)
    slots = np.arange(windows_per_day // 24, windows_per_day - gap, gap)
    surges: list[Surge] = []
    for d in range(days):
        for s in np.sort(rng.choice(slots, size=min(per_day, len(slots)), replace=False)):
            kind: SurgeKind = "clustered" if len(surges) % 2 == 0 else "spread"
            center = random_cluster(rng) if kind == "clustered" else None
            surges.append(Surge(int(d * windows_per_day + s), windows, share, kind, center))
    return surges


class Traffic:
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
        self.people = int(people)
        self.days = int(days)
        self.window_seconds = float(window_seconds)
        self.swing = float(swing)
        self.drift = float(drift)
        self.windows_per_day = int(round(86400 / self.window_seconds))
        self.population = int(math.ceil(self.people * (1 + self.swing)))
        self.sim = VitalsSimulator(features, n_devices=self.population, rng=seed)
        self._activity = self.sim._base["activity"].copy()
        self.order = self.sim.rng.permutation(self.population)

    @property
    def n_windows(self) -> int:
        return self.days * self.windows_per_day

    def online(self, i: int) -> int:
        """How many people send an event in window i (the daily swing)."""
        phase = 2 * math.pi * (i % self.windows_per_day) / self.windows_per_day
        return int(round(self.people * (1 + self.swing * math.sin(phase))))

    def window(self, i: int, surges: Sequence[Surge] = ()) -> tuple[np.ndarray, list[str], np.ndarray]:
        """Window i's events: (X raw (n, d), entity ids, anomalous mask)."""
        self.sim._base["activity"] = self._activity * (1 + self.drift * i / (30 * self.windows_per_day))
        devices = self.order[: self.online(i)]
        anomalous = np.zeros(devices.size, bool)
        surge = next((s for s in surges if s.covers(i)), None)
        if surge is not None:
            k = int(round(surge.share * devices.size))
            anomalous[self.sim.rng.choice(devices.size, size=k, replace=False)] = True
        X = self.sim.readings(devices, anomalous, cluster=surge.center if surge is not None else None)
        return X, [self.sim.device_ids[d] for d in devices], anomalous
