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
:func:`window_cost` is a function of the settings and the number of features only.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from monitor.config import ReleaseSettings
from monitor.dp import laplace_count, noise_source
from monitor.outliers import private_count, private_top_subspaces

__all__ = ["release_window", "window_cost"]


def _top_h(settings: ReleaseSettings, n_features: int) -> int:
    # top_h may exceed the number of candidates (e.g. top 3 of 2 features): report all.
    if not settings.top_h:
        return 0
    return min(settings.top_h, math.comb(n_features, settings.subspace_dims))


def window_cost(settings: ReleaseSettings, n_features: int) -> tuple[float, float]:
    """(epsilon, delta) one released window costs, by basic composition of its parts.

    Same as ``ReleaseSettings.window_cost()`` except that ``top_h`` is capped at the
    number of candidate subspaces, so that the record states what is really spent.

    >>> s = ReleaseSettings(epsilon_count=0.4, epsilon_flagged=0.2, epsilon_top=0.2, epsilon_top_count=0.1,
    ...                     delta_count=1e-6, delta_top_count=1e-7, top_h=5, subspace_dims=1)
    >>> window_cost(s, n_features=2)
    (1.0, 1.2e-06)
    """
    h = _top_h(settings, n_features)
    eps = settings.epsilon_count + settings.epsilon_flagged
    delta = settings.delta_count
    if h:
        eps += settings.epsilon_top + h * settings.epsilon_top_count
        delta += h * settings.delta_top_count
    return eps, delta


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
    (epsilon, delta) = :func:`window_cost` (basic composition of the parts), provided
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
    h = _top_h(settings, d)
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

    epsilon, delta = window_cost(settings, d)
    return {
        "outlier_count": _public(outliers),
        "flagged_count": _public(flagged_release),
        "top_subspaces": top,
        "top_subspaces_epsilon": settings.epsilon_top if h else 0.0,
        "epsilon": epsilon,
        "delta": delta,
    }
