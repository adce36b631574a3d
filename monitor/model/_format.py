"""The model file's format: versioned, checksummed JSON that is safe to publish.

This module knows the format only; it never imports the estimator (the class to build is
passed in), so ``estimator`` -> ``_format`` and ``file`` -> both, without a cycle.

Layout (format version 4)::

    {"format": "dp-grid-knn", "version": 4, "sha256": "<hex of the canonical private part>",
     "private": {"features": [{"name": ..., "min": ..., "max": ...}, ...],
                 "privacy": {"epsilon": ..., "delta": 0.0, "mechanism": "laplace_grid",
                             "composition": ..., "unit": "one reference record (add/remove)"},
                 "size": {"value": <noisy number of reference records>, "epsilon": ...,
                          "mechanism": "laplace_global"},
                 "layout": {"rule": ..., "name": "tail" or "v4" (absent in older files: v4),
                            "group_size", "n_grids", "marginals", "bins", "score_power" (absent: 1)},
                 "grids": [{"features": [0, 1, 2], "bins": 5, "epsilon": ..., "keys": [...],
                            "values": [...]}, ...],
                 "calibration": null or {"share": ..., "seed": ..., "epsilon": ...,
                     "mechanism": "laplace_histogram", "unit": ...,
                     "score": {"edges": [...], "values": [...], "epsilon": ...},
                     "grids": [{"edges": [...], "values": [...], "epsilon": ...}, ...]}},
     "scoring": {"k": ..., "max_depth": ..., "weighted": ..., "threshold": float or null,
                 "contamination": float or null}}

``keys`` are flat cell indices (row-major over the grid's features) and ``values`` their
NOISY masses above the public keep-threshold; no raw count is ever written. ``size`` is
the noisy record count the layout was chosen from (null in a re-saved version 2 model).
``calibration`` holds the NOISY score histograms of the reference rows held apart from
the grids (``share`` of them, split by a hash with the public ``seed``; docs/model.md).
The per-grid epsilons and the size's epsilon add up to ``privacy.epsilon`` (basic
composition on the grids' rows), and so do the calibration's and the size's (the
held-apart rows): the two parts are disjoint (parallel composition); the loader checks it.

The checksum is sha256 over ``json.dumps(private, sort_keys=True, separators=(",", ":"))``:
it guards the private release. ``scoring`` is post-processing of that release, free in
privacy, so it is outside the checksum and may be edited (a new threshold needs no refit):
``threshold`` wins over ``contamination``; with neither the model flags nothing.

Older files load: version 3 (no calibration) with uncalibrated thresholds (refit to
calibrate), version 2 unchanged, version 1 with its threshold converted to cells.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from monitor.errors import MonitorError
from monitor.features import check_bounds
from monitor.model._defaults import check_score_power
from monitor.model._grid import NoisyGrid
from monitor.model.calibration import Calibration

__all__ = ["ModelFileError", "FORMAT", "VERSION", "save_model", "read_model", "check_features",
           "apply_config_threshold"]

FORMAT = "dp-grid-knn"
VERSION = 4


class ModelFileError(MonitorError):
    """A model file that cannot be used: missing, corrupt, of another version, or fitted
    on other features than the configuration declares."""


def _canonical(content: dict) -> bytes:
    return json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _private_part(model) -> dict:
    cal = getattr(model, "calibration_", None)
    return {
        "features": [{"name": n, "min": float(lo), "max": float(hi)}
                     for n, (lo, hi) in zip(model.feature_names_, model.bounds_)],
        "privacy": {"epsilon": model.epsilon_spent_, "delta": 0.0, "mechanism": "laplace_grid",
                    "composition": "basic" if cal is None else
                    "basic within the grids' rows and within the held-apart rows; parallel across the two",
                    "unit": "one reference record (add/remove)"},
        "size": None if getattr(model, "n_estimate_", None) is None else {
            "value": model.n_estimate_, "epsilon": model.size_epsilon_, "mechanism": "laplace_global"},
        "layout": {"rule": "joint+marginal grids sized by the noisy size, monitor 3 (docs/model.md)",
                   "name": getattr(model, "layout_rule", "v4"), "group_size": model.group_size,
                   "n_grids": model.n_grids, "marginals": model.marginals, "bins": model.bins,
                   "score_power": float(model.score_power)},
        "grids": [{"features": list(g.features), "bins": g.bins, "epsilon": e, "keys": g.keys.tolist(),
                   "values": g.values.tolist()} for g, e in zip(model.grids_, model.grid_epsilons_)],
        "calibration": None if cal is None else cal.as_dict(),
    }


def _scoring_part(model) -> dict:
    return {"k": model.k_, "max_depth": model.max_depth_, "weighted": bool(model.weighted),
            "threshold": None if model.threshold is None else float(model.threshold),
            "contamination": model.contamination}


def save_model(model, path: str | os.PathLike) -> None:
    """Write a fitted GridKNN to ``path`` atomically (temp file + rename)."""
    model._check_fitted()
    private = _private_part(model)
    doc = {"format": FORMAT, "version": VERSION, "sha256": hashlib.sha256(_canonical(private)).hexdigest(),
           "private": private, "scoring": _scoring_part(model)}
    _write(doc, Path(path))


def _write(doc: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, path)


def read_model(path: str | os.PathLike, GridKNN):
    """Read and verify a model file into a fitted ``GridKNN`` (the class is passed in);
    raise ModelFileError saying what is wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelFileError(f"model file {path} does not exist: create it with `monitor fit`") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ModelFileError(f"cannot read model file {path}: {err}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ModelFileError(f"model file {path} is corrupt (not valid JSON: {err.msg} at line {err.lineno})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelFileError(f"{path} is not a grid-kNN model file (missing format {FORMAT!r})")
    version = doc.get("version")
    if version not in (1, 2, 3, VERSION):
        raise ModelFileError(f"model file {path} has format version {version!r}; this monitor reads "
                             f"versions 1 to {VERSION}: refit it with `monitor fit`")
    private = doc.get("content" if version == 1 else "private")
    if not isinstance(private, dict) or not isinstance(doc.get("sha256"), str):
        raise ModelFileError(f"model file {path} is malformed: missing {'content' if version == 1 else 'private'} "
                             "or sha256")
    try:
        digest = hashlib.sha256(_canonical(private)).hexdigest()
    except (TypeError, ValueError):
        digest = None
    if digest != doc["sha256"]:
        raise ModelFileError(f"model file {path} is corrupt: its sha256 checksum does not match its private part "
                             "(the noisy grids, features or privacy record were changed)")
    try:
        if version == 1:
            return _build_v1(private, GridKNN)
        scoring = doc.get("scoring")
        if not isinstance(scoring, dict):
            raise ValueError("missing scoring section")
        return _build(private, scoring, GridKNN, version)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ModelFileError(f"model file {path} is malformed: {err}") from None


def _features_and_privacy(c: dict[str, Any]):
    names = [str(f["name"]) for f in c["features"]]
    bounds = check_bounds([[float(f["min"]), float(f["max"])] for f in c["features"]])
    if float(c["privacy"]["delta"]) != 0.0:
        raise ValueError("privacy.delta must be 0 (pure DP)")
    return names, bounds, c["privacy"]


def _build(c: dict[str, Any], scoring: dict[str, Any], GridKNN, version: int):
    names, bounds, priv = _features_and_privacy(c)
    lay = c["layout"]
    k, depth, weighted = float(scoring["k"]), scoring["max_depth"], scoring["weighted"]
    if not (k > 0 and math.isfinite(k)) or not isinstance(depth, int) or depth < 0 or not isinstance(weighted, bool):
        raise ValueError("scoring needs k > 0, an integer max_depth >= 0 and a boolean weighted")
    m = GridKNN(bins=lay["bins"], k=k, epsilon=float(priv["epsilon"]), bounds=bounds, max_depth=depth,
                weighted=weighted, feature_names=names, group_size=lay["group_size"], n_grids=lay["n_grids"],
                marginals=lay["marginals"], layout_rule=_rule_name(lay), score_power=_score_power(lay))
    if len(set(names)) != len(names):
        raise ValueError("feature names must be distinct")
    grids = _grids(c["grids"], len(names))
    eps_list = [float(g["epsilon"]) for g in c["grids"]]
    size = c["size"] if version >= 3 else None  # a version 3 file must say it, even as null
    size_eps = 0.0 if size is None else float(size["epsilon"])
    if (not math.isclose(math.fsum(eps_list) + size_eps, m.epsilon, rel_tol=1e-9) or min(eps_list) <= 0
            or size_eps < 0):
        raise ValueError("the grids' epsilons and the size's epsilon must be positive and add up to "
                         "privacy.epsilon (basic composition)")
    cal = None
    if version >= 4 and c["calibration"] is not None:  # a version 4 file must say it, even as null
        cal = Calibration.from_dict(c["calibration"])
        if len(cal.grids) != len(grids) and not (len(grids) == 1 and cal.grids[0] is cal.score):
            raise ValueError("calibration.grids must hold one histogram per grid")
        if not math.isclose(cal.epsilon + size_eps, m.epsilon, rel_tol=1e-9):
            raise ValueError("the calibration's epsilon and the size's epsilon must add up to privacy.epsilon "
                             "(the held-apart rows)")
    if size is not None:
        m.n_estimate_, m.size_epsilon_ = float(size["value"]), size_eps
    m.calibration_ = cal
    m.calibration_share_ = 0.0 if cal is None else cal.share
    m.calibration_share = m.calibration_share_
    return _finish(m, names, bounds, grids, eps_list, k, depth, scoring.get("threshold"), scoring.get("contamination"))


def _score_power(lay: dict) -> float:
    """The power mean over the grids a file's scores (and its calibration's histograms) were made
    with: its ``layout.score_power``, 1 (the arithmetic mean) for files written before it. In
    the checksummed part: the released histograms hold that score and no other."""
    return check_score_power(lay.get("score_power", 1.0), "layout.score_power")


def _rule_name(lay: dict) -> str:
    """The layout rule a file was fitted under: its ``layout.name`` (written since the tail rule's
    "tail" rule; the file holds the fitted grids and k in full, so the name only records how
    they were chosen), "v4" for files written before it."""
    name = lay.get("name", "v4")
    if name not in ("tail", "v4"):
        raise ValueError(f"unknown layout rule {name!r} (this monitor knows 'tail' and 'v4')")
    return name


def _build_v1(c: dict[str, Any], GridKNN):
    """A version 1 file: disjoint groups, equal bins, threshold in unit-cube distance."""
    names, bounds, priv = _features_and_privacy(c)
    p = c["parameters"]
    m = GridKNN(bins=int(p["bins"]), k=float(p["k"]), epsilon=float(priv["epsilon"]), bounds=bounds,
                max_depth=int(p["max_depth"]), weighted=bool(p["weighted"]), feature_names=names,
                group_size=int(p["group_size"]), n_grids=None, marginals=0, layout_rule="v4")
    grids = _grids(c["grids"], len(names))
    covered = sorted(f for g in grids for f in g.features)
    if covered != list(range(len(names))):
        raise ValueError("grids do not cover every feature exactly once")
    thr = c["threshold"]
    # v2 scores are in cells of each grid; v1 divided by the (common) bins.
    thr = None if thr is None else float(thr) * int(p["bins"])
    eps_list = [float(priv["epsilon"]) / len(grids)] * len(grids)
    m.calibration_, m.calibration_share_, m.calibration_share = None, 0.0, 0.0
    return _finish(m, names, bounds, grids, eps_list, float(p["k"]), int(p["max_depth"]), thr, None)


def _grids(raw: list, d: int):
    grids = []
    for g in raw:
        fs, bins = tuple(int(i) for i in g["features"]), int(g["bins"])
        if not fs or len(set(fs)) != len(fs) or min(fs) < 0 or max(fs) >= d or bins < 2:
            raise ValueError("a grid needs distinct feature indices inside the features and bins >= 2")
        keys = np.asarray(g["keys"], dtype=np.int64)
        values = np.asarray(g["values"], dtype=np.float64)
        if keys.ndim != 1 or keys.shape != values.shape:
            raise ValueError("grid keys and values must be lists of equal length")
        if keys.size and (keys[0] < 0 or keys[-1] >= bins ** len(fs) or np.any(np.diff(keys) <= 0)):
            raise ValueError("grid keys must be sorted distinct cell indices inside the grid")
        if not np.all(np.isfinite(values)):
            raise ValueError("grid values must be finite")
        grids.append(NoisyGrid(fs, bins, keys, values))
    if not grids or sorted({f for g in grids for f in g.features}) != list(range(d)):
        raise ValueError("the grids must cover every feature")
    return grids


def _finish(m, names, bounds, grids, eps_list, k, depth, threshold, contamination):
    m.bounds_, m.feature_names_ = bounds, names
    m.groups_ = tuple(g.features for g in grids)
    m.grid_bins_ = tuple(g.bins for g in grids)
    m.k_, m.max_depth_ = float(k), int(depth)
    m.grids_, m.grid_epsilons_ = grids, eps_list
    m.epsilon_spent_ = float(m.epsilon)
    m.n_features_in_ = len(names)
    if threshold is not None and not isinstance(threshold, (int, float)):
        raise ValueError("scoring.threshold must be a number or null")
    m.set_threshold(None if threshold is None else float(threshold), contamination)
    return m


def apply_config_threshold(model, settings) -> None:
    """Apply ``model.threshold`` / ``model.contamination`` when the configuration sets them.

    ``settings`` is the config's ModelSettings. Only keys written in the configuration
    count (pydantic's ``model_fields_set``): a config that says nothing keeps the file's
    threshold. Post-processing of the private model: no refit, no charge.
    """
    explicit = getattr(settings, "model_fields_set", set())
    if "threshold" in explicit and settings.threshold is not None:
        model.set_threshold(float(settings.threshold), None)
    elif "contamination" in explicit or "threshold" in explicit:
        model.set_threshold(None, settings.contamination)


def check_features(model, names: Sequence[str], bounds) -> None:
    """Raise ModelFileError unless ``names`` and ``bounds`` (the config's) equal the model's."""
    model._check_fitted()
    names = [str(n) for n in names]
    if names != list(model.feature_names_):
        raise ModelFileError(
            f"the model was fitted on features {list(model.feature_names_)} but the configuration declares "
            f"{names}: refit the model with `monitor fit` or fix `features` in the configuration")
    b = np.asarray(bounds, dtype=float)
    if b.shape != model.bounds_.shape or not np.allclose(b, model.bounds_, rtol=1e-12, atol=0.0):
        diff = [f"{n}: model {list(mb)} vs config {list(cb)}"
                for n, mb, cb in zip(names, model.bounds_.tolist(), b.reshape(-1, 2).tolist()) if mb != cb]
        raise ModelFileError("the model's feature bounds differ from the configuration's ("
                             + "; ".join(diff) + "): refit the model with `monitor fit`")
