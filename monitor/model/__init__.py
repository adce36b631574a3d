"""Private grid-kNN model (DESIGN 2): fit once under pure epsilon-DP, publish the file, score fast.

The service's use: ``m = GridKNN.load(path); m.check_features(cfg.feature_names, cfg.bounds);
m.predict(Y_raw)`` per batch.
"""

from monitor.model._defaults import default_layout
from monitor.model.estimator import GridKNN
from monitor.model.file import ModelFileError
from monitor.model.io import InputFileError, read_features

__all__ = ["GridKNN", "ModelFileError", "InputFileError", "default_layout", "read_features"]
