"""Private grid-kNN model (docs/design.md#the-model): fit once under pure epsilon-DP, publish the file, score fast.

The service's use: ``m = load_configured(cfg)`` (the model file of ``cfg.model.path``, checked
against the configured features, with the config's threshold applied), then ``m.predict(Y_raw)``
per batch.
"""

from monitor.model._defaults import default_layout
from monitor.model.estimator import GridKNN
from monitor.model.file import ModelFileError, load_configured, set_file_threshold
from monitor.model.io import InputFileError, read_features

__all__ = ["GridKNN", "ModelFileError", "InputFileError", "default_layout", "load_configured", "read_features",
           "set_file_threshold"]
