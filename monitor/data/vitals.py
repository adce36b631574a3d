"""Simulated vital signs of wearable devices: the demo's data and its anomaly burst.

Each simulated person wears one device (``device_id``) and has their own resting
baselines; every reading draws an activity level, and heart rate, respiration, skin
temperature and (slightly, downwards) blood oxygen follow it, so the normal data are
correlated the way real vitals are. An anomalous reading is a desaturation episode:
spo2 falls well below normal and heart rate rises, the other features stay normal.
The anomaly therefore lives in two features, which the top-h subspace release should
point at.

Features the generator does not know (a user's own config) get a generic normal
reading in the middle of their public bounds, so ``monitor simulate`` works with any
configuration; the burst then shifts the first two features.

Pure numpy, no Kafka: the model and the benchmarks may use it too.

>>> sim = VitalsSimulator(n_devices=10, rng=1)
>>> X = sim.readings(np.arange(10))
>>> X.shape
(10, 5)
>>> bool(np.all((X >= sim.bounds[:, 0]) & (X <= sim.bounds[:, 1])))
True
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = [
    "VITAL_FEATURES",
    "random_cluster",
    "VitalsSimulator",
    "simulate_vitals",
    "write_reference_csv",
    "REFERENCE_SEED",
    "REFERENCE_ROWS",
    "REFERENCE_DEVICES",
]

# Same names and public bounds as the repository's config.yaml.
VITAL_FEATURES: tuple[tuple[str, float, float], ...] = (
    ("heart_rate", 30.0, 220.0),
    ("spo2", 70.0, 100.0),
    ("skin_temp", 30.0, 42.0),
    ("resp_rate", 4.0, 40.0),
    ("activity", 0.0, 10.0),
)

# The committed monitor/data/reference-vitals.csv is simulate_vitals with these.
REFERENCE_SEED = 20261121
REFERENCE_ROWS = 4000
REFERENCE_DEVICES = 200

# Decimals a device would report; rounding also keeps the CSV small and readable.
_DECIMALS = {"heart_rate": 0, "spo2": 0, "skin_temp": 1, "resp_rate": 0, "activity": 2}


class VitalsSimulator:
    """A population of ``n_devices`` people, each with fixed resting baselines.

    Parameters
    ----------
    features:
        ``(name, min, max)`` per feature, in output column order; the vitals by default.
        Objects with ``name``, ``min``, ``max`` attributes (config ``Feature``) work too.
    n_devices:
        Number of simulated people (one device each).
    rng:
        Seed or numpy Generator; the population and every reading derive from it.
    """

    def __init__(self, features: Sequence = VITAL_FEATURES, n_devices: int = 200, rng: int | np.random.Generator | None = None) -> None:
        if n_devices < 1:
            raise ValueError(f"n_devices must be at least 1, got {n_devices}")
        self.feature_names = [_name(f) for f in features]
        self.bounds = np.array([_bounds(f) for f in features], dtype=float)
        if not self.feature_names:
            raise ValueError("features must not be empty")
        self.n_devices = int(n_devices)
        self.rng = np.random.default_rng(rng)
        r = self.rng
        # Person-level baselines: between-person spread is what makes real vitals
        # cluster less tightly than one person's readings.
        self._base = {
            "heart_rate": r.normal(68.0, 7.0, n_devices),
            "spo2": np.minimum(r.normal(97.5, 0.7, n_devices), 99.5),
            "skin_temp": r.normal(33.9, 0.4, n_devices),
            "resp_rate": r.normal(14.0, 1.6, n_devices),
            "activity": r.uniform(0.3, 1.4, n_devices),  # mean activity, g
        }
        self.device_ids = [f"dev-{i:04d}" for i in range(n_devices)]
        # Everybody's activity times this factor: the simulator's daily rhythm (people rest
        # at night), set from outside as the simulated clock moves (monitor.data.rhythm).
        self.activity_scale = 1.0

    def readings(self, devices: "np.ndarray | Sequence[int]", anomalous: "np.ndarray | Sequence[bool] | None" = None,
                 cluster: "tuple[float, float] | None" = None) -> np.ndarray:
        """One reading per entry of ``devices`` (indices), shape (len(devices), d).

        ``anomalous[i]`` True turns reading i into a desaturation episode. Values are
        clipped to the public bounds, as a device's own range would.

        ``cluster`` = (spo2, heart rate) makes the episodes *clustered*: every anomalous
        reading sits close to that one point, as when one cause (a faulty batch of
        sensors, one ward's oxygen supply) hits many people at once. The anomalies are
        then each other's neighbours: the seed's distance-based count misses them, the
        model's flags do not. Without it they are *spread* widely.
        """
        dev = np.asarray(devices, dtype=int)
        n = dev.size
        anom = np.zeros(n, bool) if anomalous is None else np.asarray(anomalous, dtype=bool)
        r = self.rng
        b = self._base
        activity = np.minimum(r.gamma(2.0, b["activity"][dev] * self.activity_scale / 2.0), 10.0)
        vitals = {
            "activity": activity,
            "heart_rate": b["heart_rate"][dev] + 14.0 * activity + r.normal(0.0, 3.0, n),
            "resp_rate": b["resp_rate"][dev] + 2.5 * activity + r.normal(0.0, 1.0, n),
            "spo2": np.minimum(b["spo2"][dev] - 0.25 * activity + r.normal(0.0, 0.5, n), 100.0),
            "skin_temp": b["skin_temp"][dev] + 0.2 * activity + r.normal(0.0, 0.25, n),
        }
        if anom.any():
            k = int(anom.sum())
            vitals["spo2"] = vitals["spo2"].copy()
            vitals["heart_rate"] = vitals["heart_rate"].copy()
            if cluster is None:
                # Spread widely: each anomaly far from the others as well as from normal.
                vitals["spo2"][anom] = r.uniform(70.0, 92.0, k)
                vitals["heart_rate"][anom] += r.uniform(40.0, 110.0, k)
            else:
                vitals["spo2"][anom] = r.normal(cluster[0], 0.7, k)
                vitals["heart_rate"][anom] = r.normal(cluster[1], 3.0, k)
        X = np.empty((n, len(self.feature_names)))
        generic = [j for j, name in enumerate(self.feature_names) if name not in vitals]
        for j, name in enumerate(self.feature_names):
            lo, hi = self.bounds[j]
            if name in vitals:
                X[:, j] = np.round(vitals[name], _DECIMALS[name])
            else:
                X[:, j] = r.normal((lo + hi) / 2.0, (hi - lo) / 16.0, n)
        if anom.any() and not {"spo2", "heart_rate"} & set(self.feature_names):
            # Unknown features: the burst moves the first two by a third of their range
            # (all by the same amount when clustered, so they stay close together).
            for j in generic[:2]:
                span = self.bounds[j, 1] - self.bounds[j, 0]
                X[anom, j] = (X[anom, j].mean() if cluster is not None else X[anom, j]) + span / 3.0
        return np.clip(X, self.bounds[:, 0], self.bounds[:, 1])


def random_cluster(rng: np.random.Generator) -> tuple[float, float]:
    """A (spo2, heart rate) centre for a clustered surge: desaturated and tachycardic."""
    return float(rng.uniform(76.0, 86.0)), float(rng.uniform(130.0, 175.0))


def simulate_vitals(
    n: int,
    rng: int | np.random.Generator | None = None,
    *,
    features: Sequence = VITAL_FEATURES,
    n_devices: int = 200,
    anomaly_fraction: float = 0.0,
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``n`` readings from ``n_devices`` people: (device ids, X of shape (n, d), anomalous mask).

    Devices take turns (reading i comes from device i mod n_devices). A fraction
    ``anomaly_fraction`` of the devices, chosen at random, is in a desaturation episode.

    >>> ids, X, anomalous = simulate_vitals(400, rng=3, anomaly_fraction=0.1)
    >>> X.shape, ids[0], ids[200]
    ((400, 5), 'dev-0000', 'dev-0000')
    >>> float(X[anomalous, 1].mean()) < 92 < float(X[~anomalous, 1].mean())
    True
    """
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if not 0.0 <= anomaly_fraction <= 1.0:
        raise ValueError(f"anomaly_fraction must be in [0, 1], got {anomaly_fraction}")
    sim = VitalsSimulator(features, n_devices=n_devices, rng=rng)
    burst = sim.rng.random(n_devices) < anomaly_fraction
    devices = np.arange(n) % n_devices
    X = sim.readings(devices, burst[devices])
    return [sim.device_ids[i] for i in devices], X, burst[devices]


def write_reference_csv(path: str | Path) -> Path:
    """Write the bundled reference data (normal readings only, header = feature names).

    The committed ``monitor/data/reference-vitals.csv`` is exactly this function's
    output; a test checks it, so regenerate with
    ``python -m monitor.data.vitals monitor/data/reference-vitals.csv`` after a change.
    """
    path = Path(path)
    _, X, _ = simulate_vitals(REFERENCE_ROWS, REFERENCE_SEED, n_devices=REFERENCE_DEVICES)
    names = [name for name, _, _ in VITAL_FEATURES]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(names)
        for row in X:
            w.writerow([_format(v, _DECIMALS[name]) for v, name in zip(row, names)])
    return path


def _format(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def _name(feature) -> str:
    return feature[0] if isinstance(feature, tuple) else feature.name


def _bounds(feature) -> tuple[float, float]:
    return (feature[1], feature[2]) if isinstance(feature, tuple) else (feature.min, feature.max)


if __name__ == "__main__":
    import sys

    print(write_reference_csv(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("reference-vitals.csv")))
