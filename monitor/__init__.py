"""A streaming outlier monitor whose every published number is differentially private.

Layout (the private maths apart from the streaming plumbing):

- ``monitor.dp``: noise samplers and selection shared by every mechanism;
- ``monitor.outliers``: private outlier counts (smooth sensitivity) and top-h subspaces;
- ``monitor.model``: the private grid-kNN model that scores every event;
- ``monitor.identify``: private "is this record an anomaly?" queries on reference data;
- ``monitor.budget``: the privacy accountant and its crash-safe ledgers;
- ``monitor.alarm``, ``monitor.report``: the private surge alarm and a window's detailed report;
- ``monitor.release``: the one place a window's alert record is decided, drawn and stored;
- ``monitor.pipeline``: Kafka in, windows, releases out, metrics (the only part that needs a broker);
- ``monitor.stream``: the commands built on the pipeline (``monitor run``, demo, simulate, replay, alerts).
"""

__version__ = "0.1.0"
