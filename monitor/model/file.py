"""The model file: versioned, checksummed JSON that is safe to publish.

Layout (format version 1)::

    {"format": "dp-grid-knn", "version": 1, "sha256": "<hex of the canonical content>",
     "content": {"features": [{"name": ..., "min": ..., "max": ...}, ...],
                 "parameters": {"bins", "k", "max_depth", "weighted", "group_size", "contamination"},
                 "privacy": {"epsilon": ..., "delta": 0.0, "mechanism": "laplace_grid",
                             "unit": "one reference record (add/remove)"},
                 "threshold": float or null,
                 "grids": [{"features": [0, 1], "bins": 6, "keys": [...], "values": [...]}, ...]}}

``keys`` are flat cell indices (row-major over the grid's features) and ``values`` their
NOISY masses above the public keep-threshold; no raw count is ever written. The checksum
is sha256 over ``json.dumps(content, sort_keys=True, separators=(",", ":"))``.
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

__all__ = ["ModelFileError", "FORMAT", "VERSION", "save_model", "load_model", "check_features"]

FORMAT = "dp-grid-knn"
VERSION = 1


class ModelFileError(MonitorError):
    """A model file that cannot be used: missing, corrupt, of another version, or fitted
    on other features than the configuration declares."""


def _canonical(content: dict) -> bytes:
    return json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def save_model(model, path: str | os.PathLike) -> None:
    """Write a fitted GridKNN to ``path`` atomically (temp file + rename)."""
    model._check_fitted()
    content = {
        "features": [{"name": n, "min": float(lo), "max": float(hi)}
                     for n, (lo, hi) in zip(model.feature_names_, model.bounds_)],
        "parameters": {"bins": model.bins_, "k": model.k_, "max_depth": model.max_depth_,
                       "weighted": bool(model.weighted), "group_size": model.group_size_,
                       "contamination": model.contamination},
        "privacy": {"epsilon": model.epsilon_spent_, "delta": 0.0, "mechanism": "laplace_grid",
                    "unit": "one reference record (add/remove)"},
        "threshold": model.threshold_,
        "grids": [{"features": list(g.features), "bins": g.bins, "keys": g.keys.tolist(),
                   "values": g.values.tolist()} for g in model.grids_],
    }
    doc = {"format": FORMAT, "version": VERSION, "sha256": hashlib.sha256(_canonical(content)).hexdigest(),
           "content": content}
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, path)


def load_model(path: str | os.PathLike):
    """Read and verify a model file; raise ModelFileError saying what is wrong."""
    from monitor.model._grid import NoisyGrid
    from monitor.model.estimator import GridKNN

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
    if doc.get("version") != VERSION:
        raise ModelFileError(f"model file {path} has format version {doc.get('version')!r}; this monitor reads "
                             f"version {VERSION}: refit it with `monitor fit`")
    content = doc.get("content")
    if not isinstance(content, dict) or not isinstance(doc.get("sha256"), str):
        raise ModelFileError(f"model file {path} is malformed: missing content or sha256")
    try:
        digest = hashlib.sha256(_canonical(content)).hexdigest()
    except (TypeError, ValueError):
        digest = None
    if digest != doc["sha256"]:
        raise ModelFileError(f"model file {path} is corrupt: its sha256 checksum does not match its content")
    try:
        return _build(content, GridKNN, NoisyGrid)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ModelFileError(f"model file {path} is malformed: {err}") from None


def _build(c: dict[str, Any], GridKNN, NoisyGrid):
    feats = c["features"]
    names = [str(f["name"]) for f in feats]
    bounds = check_bounds([[float(f["min"]), float(f["max"])] for f in feats])
    p, priv = c["parameters"], c["privacy"]
    if float(priv["delta"]) != 0.0:
        raise ValueError("privacy.delta must be 0 (pure DP)")
    m = GridKNN(bins=int(p["bins"]), k=float(p["k"]), epsilon=float(priv["epsilon"]), bounds=bounds,
                max_depth=int(p["max_depth"]), weighted=bool(p["weighted"]), contamination=p["contamination"],
                threshold=c["threshold"], feature_names=names, group_size=int(p["group_size"]))
    m._validate()
    grids = []
    covered: list[int] = []
    for g in c["grids"]:
        fs, bins = tuple(int(i) for i in g["features"]), int(g["bins"])
        keys = np.asarray(g["keys"], dtype=np.int64)
        values = np.asarray(g["values"], dtype=np.float64)
        if keys.ndim != 1 or keys.shape != values.shape:
            raise ValueError("grid keys and values must be lists of equal length")
        if keys.size and (keys[0] < 0 or keys[-1] >= bins ** len(fs) or np.any(np.diff(keys) <= 0)):
            raise ValueError("grid keys must be sorted distinct cell indices inside the grid")
        if not np.all(np.isfinite(values)):
            raise ValueError("grid values must be finite")
        covered.extend(fs)
        grids.append(NoisyGrid(fs, bins, keys, values))
    if sorted(covered) != list(range(len(names))):
        raise ValueError("grids do not cover every feature exactly once")
    if [g.features for g in grids] != m.groups_:
        raise ValueError("grid feature groups differ from the parameters' layout")
    m.grids_ = grids
    m.epsilon_spent_ = float(priv["epsilon"])
    m.n_features_in_ = len(names)
    thr = c["threshold"]
    m.threshold_ = None if thr is None else float(thr)
    if m.threshold_ is not None and not math.isfinite(m.threshold_):
        raise ValueError("threshold must be finite")
    return m


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
