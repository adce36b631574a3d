"""One window's detailed report: the numbers a page comes with (docs/report.md; docs/design.md#the-report).

Each part is pure DP or (epsilon, delta)-DP on add/remove neighbours, the report their sum by basic
composition; the consistency projection and the headline are post-processing. Proof: docs/proofs/report.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy.signal import fftconvolve
from scipy.stats import norm, poisson

from monitor.config import ReportSettings
from monitor.dp import Release, laplace_count, noise_source
from monitor.outliers import private_count, private_top_subspace_counts
from monitor.report.consistency import project_partition
from monitor.report.where import candidate_parts, part_counts, release_parts

__all__ = ["release_report", "headline", "simultaneous_low", "error_quantile"]


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
    normal_parts_scale: float = 0.0,
    normal_share_sd: float = 0.0,
    alpha: float = 0.05,
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
        finds each most unusual, and names the parts whose excess over normal traffic
        stands out for all parts at once (``simultaneous_low``).
    normal_share, normal_parts:
        Public: the share of normal events the alarm flags (its released baseline rate, or
        its calibrated contamination), and how normal traffic's flagged events spread over
        the parts (a baseline's released ``normal_parts``, or the model's guess
        ``normal_part_shares``; even when None). A part's excess is its count less
        normal_parts[part] x normal_share x the noisy event count.
    normal_error:
        Public: how far, relatively, each part's normal may be off at most (0 for released
        parts; 1 for the model's guess). Widens the excess's interval by that much of the
        normal, deterministically (a conservative bound, not a probability).
    normal_parts_scale, normal_share_sd:
        Public: the Laplace scale of each released normal share (the baseline's noise on
        its part totals over its span, as a share of the span's normal weight), and the
        standard deviation of ``normal_share`` (the baseline's ``rate_error``). Both are
        counted in the simultaneous intervals that decide which parts stand out.
    alpha:
        A part is named (``stands_out``) only when the low end of its excess's interval is
        above 0, with intervals that hold for all parts at once with probability at least
        1 - alpha (Bonferroni over the parts and the error sources; docs/report.md).
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
    raw_parts = np.zeros(0)
    if n_grids > 1:
        U = np.asarray(grid_unusual, dtype=float).reshape(X.shape[0], n_grids)
        cands = candidate_parts(grid_features, n_grids)
        parts = [_per_unit(p, resolution)
                 for p in release_parts(part_counts(units, U, cands), settings.epsilon_grids, src, resolution)]
        # The Laplace tails hold for the noisy counts as drawn; the projection below moves
        # each part by a little of the flagged count's noise, so what stands out is judged
        # on the drawn values.
        raw_parts = np.array([p.value for p in parts])

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
                       normal_error, raw=raw_parts, share=float(normal_share), flagged=flagged_release,
                       parts_scale=float(normal_parts_scale), share_sd=float(normal_share_sd), alpha=float(alpha))
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
           grid_features: "Sequence[Sequence[int]] | None", feature_names: Sequence[str], settings: ReportSettings,
           normal_error: float = 0.0, *, raw: "np.ndarray | None" = None, share: float = 0.0,
           flagged: "Release | None" = None, parts_scale: float = 0.0, share_sd: float = 0.0, alpha: float = 0.05) -> dict:
    """The 'where' block: every part with its flagged count, what normal traffic would put
    in it (its share of the normal flags times the noisy event count), its excess, and
    whether it stands out; the features of the parts that stand out; and the flagged
    total's own excess over normal.

    The published excess is floored at 0 with a conservative 95 % half-width (the two
    half-widths added, and how far a guessed normal may lie above the guess: ``normal_error``
    of it, at most the whole normal weight). A part stands out when the low end of its excess's simultaneous interval
    (``simultaneous_low``, on the counts as drawn, ``raw``) is above 0; parts are ranked by
    that low end, so the first is the clearest.
    """
    values = np.array([p.value for p in parts])
    drawn = values if raw is None or raw.size != values.size else np.asarray(raw, dtype=float)
    normal = shares * events.value
    normal_acc = shares * (events.accuracy or 0.0) + _normal_high(normal, share * events.value, normal_error) - normal
    excess = values - normal
    low = simultaneous_low(drawn, shares, events.value, epsilon_parts=settings.epsilon_grids,
                           epsilon_events=settings.epsilon_events, normal_error=normal_error, share=share,
                           parts_scale=parts_scale, share_sd=share_sd, alpha=alpha)
    order = sorted(range(len(parts)), key=lambda j: -low[j])
    out_parts, named = [], []
    for rank, j in enumerate(order, start=1):
        g, count = cands[j], parts[j]
        acc = (count.accuracy or 0.0) + normal_acc[j]
        feats = [feature_names[i] for i in grid_features[g]] if grid_features is not None else grid_names[g].split("+")
        stands_out = bool(low[j] > 0.0)
        out_parts.append({
            "rank": rank,
            "grid": grid_names[g],
            "features": feats,
            "flagged_count": _public(count),
            "normal": float(normal[j]),
            "excess": {"value": max(0.0, float(excess[j])), "accuracy": float(acc)},
            "stands_out": stands_out,
        })
        if stands_out:
            named += [f for f in feats if f not in named]
    out = {
        "features": named,
        "parts": out_parts,
        "level": 1.0 - alpha,
        "epsilon": settings.epsilon_grids, "delta": 0.0, "mechanism": "laplace_global",
    }
    if flagged is not None:
        out["excess"] = {"value": float(flagged.value - share * events.value),
                         "accuracy": float((flagged.accuracy or 0.0) + share * (events.accuracy or 0.0))}
    return out


def simultaneous_low(drawn: "np.ndarray | Sequence[float]", shares: "np.ndarray | Sequence[float]", events: float, *,
                     epsilon_parts: float, epsilon_events: float, normal_error: float = 0.0, share: float = 0.0,
                     parts_scale: float = 0.0, share_sd: float = 0.0, alpha: float = 0.05) -> np.ndarray:
    """Per part, a lower bound on its true excess over normal traffic that holds for all m
    parts at once with probability at least 1 - alpha. Public arithmetic on released values.

    A part's drawn count is its true count plus Laplace(1 / epsilon_parts); its normal,
    ``shares[j]`` x the noisy event count, is off by the event count's Laplace noise times
    the share, by the window's own normal traffic (a sum of weights in [0, 1], bounded by a
    Poisson count of the same mean), by the released shares' Laplace noise
    (``parts_scale``, relative to the normal weight ``share``) and by the normal rate's
    standard deviation (``share_sd``, a normal error); a guessed normal may also be off by
    ``normal_error`` of itself (added whole). Each part's margin is the upper alpha / m
    quantile of the sum of those independent errors (``error_quantile``), so by Bonferroni
    all m low ends hold together with probability at least 1 - alpha.

    >>> simultaneous_low([50.0, 3.0], [0.01, 0.01], 1000.0, epsilon_parts=0.2, epsilon_events=0.03).round(1).tolist()
    [23.8, -23.2]
    """
    drawn = np.asarray(drawn, dtype=float)
    shares = np.asarray(shares, dtype=float)
    m = drawn.size
    if m == 0:
        return np.zeros(0)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    n = max(float(events), 0.0)
    pi = shares / share if share > 0 else np.zeros_like(shares)
    high = _normal_high(shares * n, share * n, normal_error)
    margin = np.array([
        error_quantile([1.0 / epsilon_parts, shares[j] / epsilon_events, parts_scale * share * n], float(high[j]),
                       share_sd * float(pi[j]) * n, alpha / m)
        for j in range(m)])
    return drawn - high - margin


def _normal_high(normal: np.ndarray, whole: float, normal_error: float) -> np.ndarray:
    """The most a part's normal may be when its share is off by ``normal_error`` of itself:
    never more than the whole normal weight (a part holds at most all of it; an infinite
    error means the guessed shares are not relied on at all)."""
    if normal_error == 0.0:
        return normal
    # A part guessed at 0 stays 0 (an infinite error times 0 is no number).
    raised = np.where(normal > 0, (1.0 + normal_error) * np.where(normal > 0, normal, 1.0), 0.0)
    return np.maximum(normal, np.minimum(whole, raised))


def error_quantile(laplace_scales: Sequence[float], poisson_mean: float, normal_sd: float, a: float,
                   step: float | None = None) -> float:
    """An upper bound on the upper-``a`` quantile of a sum of independent errors: Laplace
    variables of the given scales, a Poisson count less its mean, and a normal variable.

    Computed on a grid: each error is rounded up to the grid (so the sum on the grid is
    stochastically at least the true sum), the distributions are convolved, and tails cut
    off the grid are charged against ``a``. Deterministic public arithmetic.

    >>> round(error_quantile([5.0], 0.0, 0.0, 0.025), 1)  # one Laplace: 5 ln(20) = 15.0
    15.0
    """
    scales = [float(b) for b in laplace_scales if b > 0 and math.isfinite(b)]
    if any(not math.isfinite(b) for b in laplace_scales) or not math.isfinite(normal_sd) or not math.isfinite(poisson_mean):
        return math.inf
    if not 0.0 < a < 1.0:
        raise ValueError(f"a must be in (0, 1), got {a!r}")
    spread = sum(scales) + normal_sd + math.sqrt(max(poisson_mean, 0.0))
    if spread == 0.0:
        return 0.0
    h = step or spread / 100.0  # each error rounds up by less than h: a conservative bias of a few h at most
    cut = 1e-12  # tail mass left off each error's grid, charged against a
    pmfs, left = [], 0  # each as (lowest grid index, masses)
    for b in scales:
        r = b * math.log(1.0 / (2.0 * cut))
        k = np.arange(-math.ceil(r / h), math.ceil(r / h) + 1)
        cdf = np.where(k * h < 0, 0.5 * np.exp(np.minimum(k * h, 0.0) / b), 1.0 - 0.5 * np.exp(-np.maximum(k * h, 0.0) / b))
        pmfs.append((int(k[0]), np.diff(np.concatenate([[0.0], cdf]))))  # mass of (x_{k-1}, x_k] put at x_k
    if normal_sd > 0:
        r = normal_sd * 7.5
        k = np.arange(-math.ceil(r / h), math.ceil(r / h) + 1)
        cdf = norm.cdf(k * h / normal_sd)
        pmfs.append((int(k[0]), np.diff(np.concatenate([[0.0], cdf]))))
    if poisson_mean > 0:
        top = int(poisson.isf(cut, poisson_mean)) + 1
        vals = np.arange(0, top + 1)
        idx = np.ceil((vals - poisson_mean) / h - 1e-12).astype(int)
        masses = np.zeros(idx[-1] - idx[0] + 1)
        np.add.at(masses, idx - idx[0], poisson.pmf(vals, poisson_mean))
        pmfs.append((int(idx[0]), masses))
    total, dropped = np.ones(1), len(pmfs) * cut
    for lo, masses in pmfs:
        total = np.maximum(fftconvolve(total, masses), 0.0) if total.size > 1 else masses
        left += lo
    budget = a - dropped
    if budget <= 0:
        raise ValueError(f"a = {a!r} is below the grid's own cut-off")
    tail = np.cumsum(total[::-1])[::-1]  # P(sum >= x_k)
    # Smallest grid point t with P(sum > t) <= budget: P(sum > x_k) = tail[k + 1].
    over = np.concatenate([tail[1:], [0.0]])
    k = int(np.argmax(over <= budget))
    return float((left + k) * h)


def headline(report: dict, reason: str | None = None) -> str:
    """A short human line for logs and ``monitor alerts``: where, and how many flagged
    events beyond normal, with the 95 % half-width; "no single feature stands out" when no
    part's excess is clear (``where.parts[].stands_out``). Post-processing of the report.

    >>> parts = [{"features": ["temperature"], "excess": {"value": 30.2, "accuracy": 6.0}, "stands_out": True},
    ...          {"features": ["vibration"], "excess": {"value": 11.0, "accuracy": 6.0}, "stands_out": True}]
    >>> headline({"where": {"features": ["temperature", "vibration"], "parts": parts},
    ...           "flagged_count": {"value": 60.0, "accuracy": 60.0}, "event_count": {"value": 300.0, "accuracy": 100.0}}, "alarm")
    'surge in temperature+vibration: +41 flagged (+-12)'
    >>> headline({"where": {"features": [], "parts": parts[:0], "excess": {"value": 35.2, "accuracy": 60.3}},
    ...           "flagged_count": {"value": 60.0, "accuracy": 60.0}, "event_count": {"value": 300.0, "accuracy": 100.0}})
    'no single feature stands out, and the excess over normal, +35 flagged (+-60), is within its noise'
    >>> headline({"where": {"features": [], "parts": parts[:0], "excess": {"value": 95.0, "accuracy": 60.3}},
    ...           "flagged_count": {"value": 60.0, "accuracy": 60.0}, "event_count": {"value": 300.0, "accuracy": 100.0}})
    'no single feature stands out: +95 flagged (+-60) beyond normal'
    """
    where = report.get("where") or {}
    names = set(where.get("features") or [])
    named = [p for p in where.get("parts") or [] if p.get("stands_out", True) and set(p["features"]) & names]
    if named:
        value = sum(p["excess"]["value"] for p in named)
        acc = sum(p["excess"]["accuracy"] for p in named)  # conservative: half-widths add
        what = f"+{value:.0f} flagged (+-{acc:.0f})"
        place = "+".join(where["features"])
        return f"surge in {place}: {what}" if reason == "alarm" else f"{place}: {what} beyond normal"
    if where.get("excess"):
        total = where["excess"]
        if abs(total["value"]) <= total["accuracy"]:
            # An interval wider than the value says nothing about the window's excess: say so.
            line = (f"no single feature stands out, and the excess over normal, {total['value']:+.0f} flagged "
                    f"(+-{_acc(total)}), is within its noise")
        else:
            line = f"no single feature stands out: {total['value']:+.0f} flagged (+-{_acc(total)}) beyond normal"
        return f"surge, {line}" if reason == "alarm" else line
    f, n = report["flagged_count"], report["event_count"]
    line = f"{f['value']:.0f} flagged (+-{_acc(f)}) of {n['value']:.0f} events (+-{_acc(n)})"
    return f"surge: {line}, no feature picked" if reason == "alarm" else line


def _acc(release: dict) -> str:
    acc = release.get("accuracy")
    return "?" if acc is None or not math.isfinite(acc) else f"{acc:.0f}"
