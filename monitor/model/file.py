"""The model file: versioned, checksummed JSON that is safe to publish (format: ``_format``).

This module joins the format (``monitor.model._format``, which never imports the estimator)
and the estimator: reading a file into a ``GridKNN``, rewriting its threshold, and loading
the model a configuration names. The imports run one way (file -> estimator -> _format).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from monitor.model._format import (FORMAT, VERSION, ModelFileError, _canonical, _scoring_part, _write,
                                   apply_config_threshold, check_features, read_model, save_model)
from monitor.model.estimator import GridKNN

__all__ = ["ModelFileError", "FORMAT", "VERSION", "save_model", "load_model", "check_features",
           "set_file_threshold", "apply_config_threshold", "load_configured", "_canonical"]


def load_model(path: str | os.PathLike) -> GridKNN:
    """Read and verify a model file; raise ModelFileError saying what is wrong."""
    return read_model(path, GridKNN)


def set_file_threshold(path: str | os.PathLike, threshold: float | None = None,
                       contamination: float | None = None) -> GridKNN:
    """Rewrite only the ``scoring`` threshold of a model file; returns the loaded model.

    Post-processing of the private model: no refit and no charge to the reference ledger.
    The private part and its checksum are left byte for byte as they were.
    """
    model = load_model(path)
    try:
        model.set_threshold(threshold, contamination)
    except ValueError as err:
        raise ModelFileError(f"cannot set the threshold of {path}: {err}") from None
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if doc.get("version") not in (2, 3, VERSION):
        raise ModelFileError(f"model file {path} has format version {doc.get('version')!r}: refit it with "
                             f"`monitor fit` to get version {VERSION}, whose threshold can be changed")
    doc["scoring"] = _scoring_part(model)
    _write(doc, Path(path))
    return model


def load_configured(config, path: str | os.PathLike | None = None) -> GridKNN:
    """The model file ``path`` (default ``config.model.path``), checked against the configured
    features and with the configuration's threshold applied (see apply_config_threshold)."""
    model = load_model(config.model.path if path is None else path)
    model.check_features(config.feature_names, config.bounds)
    try:
        apply_config_threshold(model, config.model)
    except ValueError as err:
        raise ModelFileError(f"model.threshold / model.contamination: {err}") from None
    return model
