"""One window's detailed report: the numbers a page comes with (DESIGN 3, 7; docs/report.md)."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from monitor.config import ReportSettings
from monitor.dp import Release, laplace_count, noise_source
from monitor.outliers import private_count, private_top_subspace_counts
from monitor.report.consistency import project_partition
from monitor.report.where import candidate_parts, part_counts, release_parts

__all__ = ["release_report", "headline"]


def _public(release: Release) -> dict:
    # Release's own public fields only, whatever a mechanism's release type carries besides
    # (a subclass's as_dict may add some), as plain JSON types.
    return {key: value if value is None or isinstance(value, str) else float(value)
            for key, value in Release.as_dict(release).items()}


def release_report(
    X_scaled: "np.ndarray | Sequence[Sequence[float]]",
    flagged: "np.ndarray | Sequence[bool]",
    settings: ReportSettings,
    feature_names: Sequence[str],
    rng: "None | int | np.random.Generator" = None,
    grid_unusual: "np.ndarray | None" = None,
    grid_names: Sequence[str] = (),
    grid_features: "Sequence[Sequence[int]] | None" = None,
    normal_share: float = 0.0,
    normal_parts: "Sequence[float] | None" = None,
    normal_error: float = 0.0,
    reason: str | None = None,
    resolution: int = 1,
) -> dict:
    """Release one window's detailed report; returns its JSON-ready dict.

    Parameters
    ----------
    X_scaled:
        The window's events, shape (n, d), scaled to [0, 1] with the public bounds. n
        may be 0: an empty window releases noise around 0, like any other.
    flagged:
        Shape (n,): which events the model flags (bool), or each event's weight as an
        integer number of units in [0, resolution] (the alarm's graded weights).
    settings:
        The ``report`` block of the config: epsilon shares, and the seed's
        optional parts (k, radius, mechanism, epsilon_count, top_h).
    feature_names:
        The d feature names.
    rng:
        None in production (OpenDP); a seed or Generator for tests.
    grid_unusual, grid_names, grid_features:
        Shape (n, G): how unusual each event is by each of the model's G grids, on one
        scale across grids (higher = more unusual); the grids' names, and (optional) each
        grid's feature indices. With G > 1 the report's ``where`` counts the flagged events
        by the part (one-feature grid when the layout has at least two, else grid) that
        finds each most unusual, and names the parts that rise above normal traffic.
    normal_share, normal_parts:
        Public: the share of normal events the alarm flags (its released baseline rate, or
        its calibrated contamination), and how normal traffic's flagged events spread over
        the parts (a baseline's released ``normal_parts``, or the model's guess
        ``normal_part_shares``; even when None). A part's excess is its count less
        normal_parts[part] x normal_share x the noisy event count.
    normal_error:
        Public: how far, relatively, each part's normal may be off (0 for released parts;
        about 1 for the model's guess). Widens the excess's interval and lowers the
        rank of a part by that much of its normal.
    reason:
        "alarm" for a page (the headline then says "surge"), anything else otherwise.
    resolution:
        Units per full weight (1 for flags): the flagged counts are sums of integer units,
        released with sensitivity ``resolution`` and divided by it (post-processing).

    Guarantee: (epsilon, delta)-DP for add/remove neighbouring windows, with (epsilon,
    delta) = ``settings.cost(d, G)`` (basic composition of the parts), provided each
    privacy unit contributes at most one event to the window. The event, flagged and part
    counts have sensitivity 1 (Laplace); the parts' histogram has L1 sensitivity 1 (each
    flagged event is in one part), Laplace on every part (``release_parts``); the seed's
    counts have their own guarantees
    (``monitor.outliers``). Everything after the draws (the projection onto nested,
    non-negative counts, the ranking, the excess, the named features, the headline) is
    post-processing.

    >>> rec = release_report(np.zeros((0, 2)), np.zeros(0, bool), ReportSettings(), ["hr", "spo2"], rng=1)
    >>> sorted(rec)
    ['delta', 'epsilon', 'event_count', 'flagged_count', 'headline', 'outlier_count', 'top_subspaces', 'top_subspaces_epsilon', 'where']
    """
    d = len(feature_names)
    X = np.asarray(X_scaled, dtype=float).reshape(-1, d)
    flagged = np.asarray(flagged).reshape(-1)
    units = flagged.astype(np.int64)
    if flagged.dtype != bool and (np.any(units != flagged) or np.any(units < 0) or np.any(units > resolution)):
        raise ValueError(f"flagged must be bools or integer units in [0, {resolution}]")
    if flagged.shape[0] != X.shape[0]:
        raise ValueError(f"flagged has {flagged.shape[0]} entries but the window has {X.shape[0]} events")
    # One noise source for the whole window: its draws are independent, and a seeded
    # test gets one reproducible sequence.
    src = noise_source(rng)
    k, r, mechanism = settings.k, settings.radius, settings.mechanism

    events = laplace_count(X.shape[0], settings.epsilon_events, sensitivity=1.0, rng=src)
    flagged_release = _per_unit(laplace_count(int(units.sum()), settings.epsilon_flagged, sensitivity=float(resolution),
                                              rng=src), resolution)
    outliers = None
    if settings.epsilon_count is not None:
        outliers = private_count(X, k, r, settings.epsilon_count, settings.delta_count, mechanism=mechanism, rng=src)

    subspaces: list[tuple[tuple[int, ...], Release]] = []
    h = settings.top_h_for(d)
    if h:
        subspaces = private_top_subspace_counts(
            X, k, r, h, settings.epsilon_top, settings.epsilon_top_count, settings.delta_top_count,
            settings.subspace_dims, mechanism=mechanism, rng=src,
        )

    n_grids = len(grid_names)
    cands: list[int] = []
    parts: list[Release] = []
    if n_grids > 1:
        U = np.asarray(grid_unusual, dtype=float).reshape(X.shape[0], n_grids)
        cands = candidate_parts(grid_features, n_grids)
        parts = [_per_unit(p, resolution)
                 for p in release_parts(part_counts(units, U, cands), settings.epsilon_grids, src, resolution)]

    # Post-processing from here on: nothing below reads the window.
    accuracy = settings.count_accuracies(d, n_grids)
    events, flagged_release, parts = _consistent(events, flagged_release, parts, accuracy)
    # The seed's optional counts are events too: clamped into [0, events].
    if outliers is not None:
        outliers = _with_value(outliers, min(max(outliers.value, 0.0), events.value))
    subspaces = [(sub, _with_value(c, min(max(c.value, 0.0), events.value))) for sub, c in subspaces]

    top = [{"subspace": [int(i) for i in s], "features": [feature_names[i] for i in s], "rank": rank, "count": _public(c)}
           for rank, (s, c) in enumerate(subspaces, start=1)]
    where = None
    if n_grids > 1:
        pi = np.full(len(cands), 1.0 / len(cands)) if normal_parts is None else np.asarray(normal_parts, dtype=float)
        where = _where(cands, parts, float(normal_share) * pi, events, grid_names, grid_features, feature_names, settings,
                       normal_error)
    epsilon, delta = settings.cost(d, n_grids)
    rec = {
        "event_count": _public(events),
        "flagged_count": _public(flagged_release),
        "where": where,
        "outlier_count": None if outliers is None else _public(outliers),
        "top_subspaces": top,
        "top_subspaces_epsilon": settings.epsilon_top if h else 0.0,
        "epsilon": epsilon,
        "delta": delta,
    }
    rec["headline"] = headline(rec, reason)
    return rec


def _consistent(events: Release, flagged: Release, parts: list[Release], accuracy: dict[str, float]):
    """Project the noisy counts onto the consistent set (post-processing): parts >= 0 that
    add up to the flagged count (each flagged event is in one part), flagged <= events.
    Without parts: 0 <= flagged <= events. Weights are 1 / variance from PUBLIC half-widths
    only. Each release keeps its epsilon, mechanism and published half-width.
    """
    w = {key: 1.0 / half ** 2 for key, half in accuracy.items()}
    e, f, p = project_partition(events.value, flagged.value, [x.value for x in parts], w["epsilon_events"],
                                w["epsilon_flagged"], [w.get("epsilon_grids", 1.0)] * len(parts))
    return _with_value(events, e), _with_value(flagged, f), [_with_value(x, v) for x, v in zip(parts, p)]


def _per_unit(release: Release, resolution: int) -> Release:
    """A count of weight units as a count of events: value and half-width over the resolution."""
    if resolution == 1:
        return release
    acc = None if release.accuracy is None else release.accuracy / resolution
    return dataclasses.replace(release, value=release.value / resolution, accuracy=acc)


def _with_value(release: Release, value: float) -> Release:
    return dataclasses.replace(release, value=float(value))


def _where(cands: list[int], parts: list[Release], shares: np.ndarray, events: Release, grid_names: Sequence[str],
           grid_features: "Sequence[Sequence[int]] | None", feature_names: Sequence[str], settings: ReportSettings, normal_error: float = 0.0) -> dict:
    """The 'where' block: every part, largest excess first, with its flagged count, what
    normal traffic would put in it (its share of the normal flags times the noisy event
    count), and its excess; and the features it names.

    The excess is floored at 0 and has a conservative 95 % half-width (the two
    half-widths added, and ``normal_error`` x the normal when the normal parts are only a
    guess). Parts are ranked by their excess less that guess's own error (so a feature
    whose normal share the guess may have put too low does not lead on it alone). The
    first part is named when its excess is positive; a later one only if the low end of
    its excess's 95 % interval reaches half the first's excess (a surge carried evenly by
    two features names both; a heavy-tailed feature does not add itself).
    """
    normal = shares * events.value
    normal_acc = shares * (events.accuracy or 0.0) + normal_error * normal
    excess = np.array([p.value for p in parts]) - normal
    order = sorted(range(len(parts)), key=lambda j: -(excess[j] - normal_error * normal[j]))
    out_parts, named = [], []
    for rank, j in enumerate(order, start=1):
        g, count = cands[j], parts[j]
        acc = (count.accuracy or 0.0) + normal_acc[j]
        feats = [feature_names[i] for i in grid_features[g]] if grid_features is not None else grid_names[g].split("+")
        out_parts.append({
            "rank": rank,
            "grid": grid_names[g],
            "features": feats,
            "flagged_count": _public(count),
            "normal": float(normal[j]),
            "excess": {"value": max(0.0, float(excess[j])), "accuracy": float(acc)},
        })
        top = excess[order[0]]
        if (rank == 1 and excess[j] > 0) or excess[j] - acc >= max(0.5 * top, 1e-9):
            named += [f for f in feats if f not in named]
    return {
        "features": named,
        "parts": out_parts,
        "epsilon": settings.epsilon_grids, "delta": 0.0, "mechanism": "laplace_global",
    }


def headline(report: dict, reason: str | None = None) -> str:
    """A short human line for logs and ``monitor alerts``: where, and how many flagged
    events beyond normal, with the 95 % half-width. Post-processing of the report.

    >>> parts = [{"features": ["temperature"], "excess": {"value": 30.2, "accuracy": 6.0}},
    ...          {"features": ["vibration"], "excess": {"value": 11.0, "accuracy": 6.0}}]
    >>> headline({"where": {"features": ["temperature", "vibration"], "parts": parts},
    ...           "flagged_count": {"value": 60.0, "accuracy": 60.0}, "event_count": {"value": 300.0, "accuracy": 100.0}}, "alarm")
    'surge in temperature+vibration: +41 flagged (+-12)'
    """
    where = report.get("where") or {}
    named = [p for p in where.get("parts") or [] if set(p["features"]) & set(where.get("features") or [])]
    if named:
        value = sum(p["excess"]["value"] for p in named)
        acc = sum(p["excess"]["accuracy"] for p in named)  # conservative: half-widths add
        what = f"+{value:.0f} flagged (+-{acc:.0f})"
        place = "+".join(where["features"])
        return f"surge in {place}: {what}" if reason == "alarm" else f"{place}: {what} beyond normal"
    f, n = report["flagged_count"], report["event_count"]
    line = f"{f['value']:.0f} flagged (+-{_acc(f)}) of {n['value']:.0f} events (+-{_acc(n)})"
    return f"surge: {line}, no feature picked" if reason == "alarm" else line


def _acc(release: dict) -> str:
    acc = release.get("accuracy")
    return "?" if acc is None or not math.isfinite(acc) else f"{acc:.0f}"
