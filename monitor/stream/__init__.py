"""The commands built on the pipeline (``monitor.pipeline``): ``monitor run`` (``cli``), ``demo``,
``simulate``, ``replay`` (backtests over a file) and ``alerts`` (reading the releases)."""
