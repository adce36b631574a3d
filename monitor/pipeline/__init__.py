"""The streaming pipeline (docs/scaling.md): Kafka in, private windows out.

- ``events``: validation of incoming JSON events (dead-letter reasons);
- ``windows``: tumbling event-time windows on a public schedule, ``ClosedWindow``;
- ``stage1``: validate, score, bound contributions, window; ship shards (``shards``) to stage 2;
- ``stage2``: merge each window's shards and release it once, in schedule order;
- ``publisher``: one window's release through the ledger, published on schedule;
- ``service``: both stages in one process (``MonitorService``), the metrics endpoints (``metrics``);
- ``clients``, ``confluent_input``, ``broker``: Kafka clients, the librdkafka input, the embedded broker;
- ``inputwatch``: log warnings about input that silently hurts the releases.

The commands built on it (``monitor run``, ``demo``, ``simulate``, ``replay``, ``alerts``) live in
``monitor.stream``.
"""
