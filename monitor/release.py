"""What one window releases: the private part of the alert record (DESIGN 3).

Broker-free on purpose: the service calls :func:`release_window` at each window close,
and the tests call it with no Kafka at all.

A window releases, each with its own share of the budget (``ReleaseSettings``):

- ``outlier_count``: the number of events with fewer than ``k`` other events within
  ``radius`` in the full feature space (smooth or global sensitivity, picked from public
  parameters by ``monitor.outliers.private_count``);
- ``flagged_count``: the number of events the model flags (sensitivity 1, Laplace);
- ``top_subspaces``: the ``top_h`` candidate subspaces with the most outliers (exponential
  mechanism), each with its own private outlier count.

The decision to release, and what a release costs, never depend on the data:
``ReleaseSettings.window_cost`` is a function of the settings and the number of features only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from monitor.config import ReleaseSettings
from monitor.dp import laplace_count, noise_source
from monitor.outliers import private_count, private_top_subspaces

__all__ = ["release_window"]


def _public(release) -> dict:
    # Only the four public fields, whatever a mechanism's release type carries besides.
    return {"value": float(release.value), "epsilon": float(release.epsilon),
            "delta": float(release.delta), "mechanism": str(release.mechanism)}


def release_window(
    X_scaled: "np.ndarray | Sequence[Sequence[float]]",
    flagged: "np.ndarray | Sequence[bool]",
    settings: ReleaseSettings,
    feature_names: Sequence[str],
    rng: "None | int | np.random.Generator" = None,
) -> dict:
    """Release one window's values; returns the private part of the alert record.

    Parameters
    ----------
    X_scaled:
        The window's events, shape (n, d), already scaled to [0, 1] with the public
        bounds (``monitor.features.scale_to_unit``). n may be 0: an empty window
        releases noise around 0, like any other.
    flagged:
        Shape (n,): which events the model flags.
    settings:
        The ``release`` block of the config: k, radius, mechanism, epsilon shares.
    feature_names:
        The d feature names, for the ``features`` field of each top subspace.
    rng:
        None in production (OpenDP); a seed or Generator for tests.

    Guarantee: (epsilon, delta)-DP for add/remove neighbouring windows, with
    (epsilon, delta) = ``settings.window_cost(d)`` (basic composition of the parts), provided
    each privacy unit contributes at most one event to the window.

    >>> rec = release_window(np.zeros((0, 2)), np.zeros(0, bool), ReleaseSettings(top_h=1), ["hr", "spo2"], rng=1)
    >>> sorted(rec)
    ['delta', 'epsilon', 'flagged_count', 'outlier_count', 'top_subspaces', 'top_subspaces_epsilon']
    """
    d = len(feature_names)
    X = np.asarray(X_scaled, dtype=float).reshape(-1, d)
    flagged = np.asarray(flagged, dtype=bool).reshape(-1)
    if flagged.shape[0] != X.shape[0]:
        raise ValueError(f"flagged has {flagged.shape[0]} entries but the window has {X.shape[0]} events")
    # One noise source for the whole window: its draws are independent, and a seeded
    # test gets one reproducible sequence.
    src = noise_source(rng)
    k, r, mechanism = settings.k, settings.radius, settings.mechanism

    outliers = private_count(
        X, k, r, settings.epsilon_count, settings.delta_count, mechanism=mechanism, rng=src
    )
    flagged_release = laplace_count(int(flagged.sum()), settings.epsilon_flagged, sensitivity=1.0, rng=src)

    top: list[dict] = []
    h = settings.top_h_for(d)
    if h:
        chosen = private_top_subspaces(X, k, r, h, settings.epsilon_top, settings.subspace_dims, rng=src)
        for rank, subspace in enumerate(chosen, start=1):
            count = private_count(
                X, k, r, settings.epsilon_top_count, settings.delta_top_count,
                subspace=tuple(subspace), mechanism=mechanism, rng=src,
            )
            top.append({
                "subspace": [int(i) for i in subspace],
                "features": [feature_names[i] for i in subspace],
                "rank": rank,
                "count": _public(count),
            })

    epsilon, delta = settings.window_cost(d)
    return {
        "outlier_count": _public(outliers),
        "flagged_count": _public(flagged_release),
        "top_subspaces": top,
        "top_subspaces_epsilon": settings.epsilon_top if h else 0.0,
        "epsilon": epsilon,
        "delta": delta,
    }
