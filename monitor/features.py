"""Scaling events to the unit cube with PUBLIC bounds (docs/design.md#the-model).

Scaling by the data's own min, max or mean would leak them; every private part of the
monitor sees features only through this function.

>>> scale_to_unit([[50.0, 120.0]], [(0, 100), (0, 100)]).tolist()
[[0.5, 1.0]]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["scale_to_unit", "check_bounds"]


def check_bounds(bounds: "Sequence[Sequence[float]] | np.ndarray") -> np.ndarray:
    """Validate public bounds: an array (d, 2) of finite (min, max) with min < max."""
    b = np.asarray(bounds, dtype=float)
    if b.ndim != 2 or b.shape[1] != 2 or b.shape[0] < 1:
        raise ValueError(f"bounds must have shape (d, 2), got {b.shape}")
    if not np.all(np.isfinite(b)):
        raise ValueError("bounds must be finite")
    bad = np.flatnonzero(b[:, 1] <= b[:, 0])
    if bad.size:
        raise ValueError(f"bounds of feature {int(bad[0])}: max must be greater than min, got {b[bad[0]].tolist()}")
    return b


def scale_to_unit(X: "Sequence[Sequence[float]] | np.ndarray", bounds: "Sequence[Sequence[float]] | np.ndarray") -> np.ndarray:
    """Map each feature from its public [min, max] to [0, 1]; values outside are clipped."""
    b = check_bounds(bounds)
    X = np.asarray(X, dtype=float)
    if X.ndim == 1:
        X = X.reshape(1, -1) if X.size == b.shape[0] else X.reshape(-1, 1)
    if X.shape[1] != b.shape[0]:
        raise ValueError(f"X has {X.shape[1]} features but bounds describe {b.shape[0]}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X holds NaN or infinite values")
    return np.clip((X - b[:, 0]) / (b[:, 1] - b[:, 0]), 0.0, 1.0)
