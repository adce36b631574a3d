"""One window's detailed report: the numbers a page comes with (DESIGN 3, 7; docs/report.md)."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from monitor.config import ReportSettings
from monitor.dp import Release, laplace_count, noise_source
from monitor.outliers import private_count, private_top_subspace_counts
from monitor.report.consistency import project_nested
from monitor.report.where import candidate_parts, part_counts, part_release, pick_parts

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
    grid_flagged: "np.ndarray | None" = None,
    grid_names: Sequence[str] = (),
    grid_features: "Sequence[Sequence[int]] | None" = None,
    normal_share: "float | Sequence[float]" = 0.0,
    reason: str | None = None,
) -> dict:
    """Release one window's detailed report; returns its JSON-ready dict.

    Parameters
    ----------
    X_scaled:
        The window's events, shape (n, d), scaled to [0, 1] with the public bounds. n
        may be 0: an empty window releases noise around 0, like any other.
    flagged:
        Shape (n,): which events the model flags (the alarm's threshold).
    settings:
        The ``report`` block of the config: epsilon shares, top_grids, and the seed's
        optional parts (k, radius, mechanism, epsilon_count, top_h).
    feature_names:
        The d feature names.
    rng:
        None in production (OpenDP); a seed or Generator for tests.
    grid_flagged, grid_names, grid_features:
        Shape (n, G): which events each of the model's G grids flags at its calibrated
        threshold, the grids' names, and (optional) each grid's feature indices. With G >
        1 the report's ``where`` picks the parts (one-feature grids when the layout has at
        least two, else grids) whose flagged events rise most above normal traffic.
    normal_share:
        Public: the share of normal traffic each grid flags (the contamination its
        threshold is calibrated to), one number or one per grid.
    reason:
        "alarm" for a page (the headline then says "surge"), anything else otherwise.

    Guarantee: (epsilon, delta)-DP for add/remove neighbouring windows, with (epsilon,
    delta) = ``settings.cost(d, G)`` (basic composition of the parts), provided each
    privacy unit contributes at most one event to the window. The event, flagged and part
    counts have sensitivity 1 (Laplace); the picks are report-noisy-max on monotone
    scores of sensitivity 1 (``pick_parts``); the seed's counts have their own guarantees
    (``monitor.outliers``). Everything after the draws (the projection onto nested,
    non-negative counts, the excess, the named features, the headline) is post-processing.

    >>> rec = release_report(np.zeros((0, 2)), np.zeros(0, bool), ReportSettings(), ["hr", "spo2"], rng=1)
    >>> sorted(rec)
    ['delta', 'epsilon', 'event_count', 'flagged_count', 'headline', 'outlier_count', 'top_subspaces', 'top_subspaces_epsilon', 'where']
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

    events = laplace_count(X.shape[0], settings.epsilon_events, sensitivity=1.0, rng=src)
    flagged_release = laplace_count(int(flagged.sum()), settings.epsilon_flagged, sensitivity=1.0, rng=src)
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
    parts: list[tuple[int, Release]] = []  # (grid index, its part's count)
    shares = np.zeros(0)
    if n_grids > 1:
        G = np.asarray(grid_flagged, dtype=bool).reshape(X.shape[0], n_grids)
        cands = candidate_parts(grid_features, n_grids)
        shares = np.broadcast_to(np.asarray(normal_share, dtype=float), (n_grids,))
        counts = part_counts(flagged, G, cands)
        picks = pick_parts(counts, shares[cands], events.value, min(settings.top_grids, len(cands)),
                           settings.epsilon_grids, src)
        parts = [(cands[j], part_release(counts[j], settings.epsilon_grid_count, src)) for j in picks]

    # Post-processing from here on: nothing below reads the window.
    accuracy = settings.count_accuracies(d, n_grids)
    events, flagged_release, outliers, subspaces, parts = _consistent(
        events, flagged_release, outliers, subspaces, parts, accuracy)

    top = [{"subspace": [int(i) for i in s], "features": [feature_names[i] for i in s], "rank": rank, "count": _public(c)}
           for rank, (s, c) in enumerate(subspaces, start=1)]
    where = None
    if n_grids > 1:
        where = _where(parts, shares, events, grid_names, grid_features, feature_names, settings)
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


def _consistent(events: Release, flagged: Release, outliers: Release | None, subspaces: list, parts: list,
                accuracy: dict[str, float]):
    """Project the noisy counts onto the nested, non-negative set (post-processing).

    Tree: events >= flagged >= each 'where' part; events >= the seed's outlier count and
    each subspace's count; all >= 0. Weights are 1 / variance from PUBLIC half-widths only
    (a smooth count's own scale follows the data and must not steer the projection). Each
    release keeps its epsilon, mechanism and published half-width.
    """
    rels = [events, flagged] + [c for _, c in parts]
    keys = ["epsilon_events", "epsilon_flagged"] + ["epsilon_grid_count"] * len(parts)
    parents = [-1, 0] + [1] * len(parts)
    if outliers is not None:
        rels.append(outliers), keys.append("epsilon_count"), parents.append(0)
    for _, c in subspaces:
        rels.append(c), keys.append("epsilon_top_count"), parents.append(0)
    weights = [1.0 / accuracy[key] ** 2 for key in keys]
    values = project_nested([float(x.value) for x in rels], weights, parents)
    out = [_with_value(rel, v) for rel, v in zip(rels, values)]
    it = iter(out)
    events, flagged = next(it), next(it)
    parts = [(g, next(it)) for g, _ in parts]
    if outliers is not None:
        outliers = next(it)
    subspaces = [(s, next(it)) for s, _ in subspaces]
    return events, flagged, outliers, subspaces, parts


def _with_value(release: Release, value: float) -> Release:
    return dataclasses.replace(release, value=float(value))


def _where(parts: list[tuple[int, Release]], shares: np.ndarray, events: Release, grid_names: Sequence[str],
           grid_features: "Sequence[Sequence[int]] | None", feature_names: Sequence[str],
           settings: ReportSettings) -> dict:
    """The 'where' block: the picked parts, best first, each with its flagged count, what
    normal traffic would give it, and its excess; and the features it names.

    The excess is the part's count less its normal share of the (noisy) event count,
    floored at 0, with a conservative 95 % half-width (the two counts' half-widths added).
    The first pick is always named (the pick itself is the evidence); a later one only if
    its excess is above 0 with 95 % confidence, so a surge in one feature names one.
    """
    out_parts, named = [], []
    for rank, (g, count) in enumerate(parts, start=1):
        share = float(shares[g])
        acc = (count.accuracy or 0.0) + share * (events.accuracy or 0.0)
        excess = count.value - share * events.value
        feats = [feature_names[i] for i in grid_features[g]] if grid_features is not None else grid_names[g].split("+")
        out_parts.append({
            "rank": rank,
            "grid": grid_names[g],
            "features": feats,
            "flagged_count": _public(count),
            "normal_share": share,
            "excess": {"value": max(0.0, float(excess)), "accuracy": float(acc)},
        })
        if rank == 1 or excess - acc > 0:
            named += [f for f in feats if f not in named]
    return {
        "features": named,
        "parts": out_parts,
        "selection": {"epsilon": settings.epsilon_grids, "delta": 0.0, "mechanism": "exponential"},
    }


def headline(report: dict, reason: str | None = None) -> str:
    """A short human line for logs and ``monitor alerts``: where, and how many flagged
    events beyond normal, with the 95 % half-width. Post-processing of the report.

    >>> headline({"where": {"features": ["temperature", "vibration"], "parts": [{"excess": {"value": 41.2, "accuracy": 12.0}}]},
    ...           "flagged_count": {"value": 60.0, "accuracy": 60.0}, "event_count": {"value": 300.0, "accuracy": 100.0}}, "alarm")
    'surge in temperature+vibration: +41 flagged (+-12)'
    """
    where = report.get("where") or {}
    first = (where.get("parts") or [None])[0]
    if where.get("features") and first is not None:
        ex = first["excess"]
        what = f"+{ex['value']:.0f} flagged (+-{ex['accuracy']:.0f})"
        place = "+".join(where["features"])
        return f"surge in {place}: {what}" if reason == "alarm" else f"{place}: {what} beyond normal"
    f, n = report["flagged_count"], report["event_count"]
    line = f"{f['value']:.0f} flagged (+-{_acc(f)}) of {n['value']:.0f} events (+-{_acc(n)})"
    return f"surge: {line}, no feature picked" if reason == "alarm" else line


def _acc(release: dict) -> str:
    acc = release.get("accuracy")
    return "?" if acc is None or not math.isfinite(acc) else f"{acc:.0f}"
