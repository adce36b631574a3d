"""A streaming outlier monitor whose every published number is differentially private.

Layout (the private maths apart from the streaming plumbing):

- ``monitor.dp``: noise samplers and selection shared by every mechanism;
- ``monitor.outliers``: private outlier counts (smooth sensitivity) and top-h subspaces;
- ``monitor.model``: the private grid-kNN model that scores every event;
- ``monitor.identify``: private "is this record an anomaly?" queries on reference data;
- ``monitor.budget``: the privacy accountant and its crash-safe ledgers;
- ``monitor.stream``: Kafka in, windows, releases out, metrics (the only part that needs a broker).
"""

__version__ = "0.1.0"
