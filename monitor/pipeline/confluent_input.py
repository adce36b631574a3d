"""Stage 1's input through confluent-kafka (librdkafka): ``stream.input_backend: confluent``.

An adapter exposing the few ``kafka.KafkaConsumer`` methods stage 1 uses (subscribe with
a rebalance listener, poll, assignment, position, highwater, seek, commit,
partitions_for_topic, close), so the stage's logic and its offset discipline are the
same with either client. Install with ``pip install "dp-outlier-monitor[confluent]"``.

Settings: ``stream.confluent`` is passed to librdkafka as is (``security.protocol``,
``sasl.mechanism``, ...); the group timing comes from ``stream.kafka``'s
``session_timeout_ms`` / ``heartbeat_interval_ms`` when set, and the messages per poll
from its ``max_poll_records`` (default ``monitor.pipeline.clients.MAX_POLL_RECORDS``, as
for kafka-python). Auto-commit is off: stage 1 commits only past shards the broker
acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from itertools import groupby
from typing import Any, NamedTuple

from kafka.errors import KafkaError
from kafka.structs import TopicPartition

from monitor.errors import MonitorError
from monitor.pipeline.clients import MAX_POLL_RECORDS

log = logging.getLogger("monitor.stream")

__all__ = ["ConfluentConsumer", "CONFLUENT_DEFAULTS"]

# librdkafka settings of the input consumer, before stream.kafka's group timing and
# stream.confluent. fetch.queue.backoff.ms: once a partition's local queue holds
# queued.min.messages (100,000), librdkafka postpones its next fetch by this much,
# 1,000 ms by default; stage 1 empties such a queue in well under a second and then
# sat idle (measured on a backlog: 115k events/s with the default, 250k with 10 ms).
CONFLUENT_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False, "auto.offset.reset": "earliest",
    "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
    "fetch.queue.backoff.ms": 10,
}

# kafka-python names -> librdkafka names, for the keys the service sets itself.
_FROM_KAFKA_PYTHON = {"session_timeout_ms": "session.timeout.ms", "heartbeat_interval_ms": "heartbeat.interval.ms",
                      "max_poll_interval_ms": "max.poll.interval.ms", "group_instance_id": "group.instance.id"}


class Record(NamedTuple):
    """The fields of a kafka-python ``ConsumerRecord`` that stage 1 reads."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms
    key: bytes | None
    value: bytes | None


class MessageBatch(Sequence):
    """One partition's messages of a poll, read as columns; a message becomes a
    :class:`Record` only when asked for by index (a dead letter, the last offset)."""

    __slots__ = ("messages",)

    def __init__(self, messages: list) -> None:
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return MessageBatch(self.messages[i])
        m = self.messages[i]
        return Record(m.topic(), m.partition(), m.offset(), m.timestamp()[1], m.key(), m.value())

    def column(self, name: str) -> list:
        """The field ``name`` of a :class:`Record`, for every message, in order."""
        from confluent_kafka import Message

        if name == "timestamp":  # (type, ms)
            return [t[1] for t in map(Message.timestamp, self.messages)]
        return list(map(getattr(Message, name), self.messages))  # value, offset, key, topic, partition


class ConfluentConsumer:
    """A librdkafka consumer behind the kafka-python calls stage 1 makes."""

    def __init__(self, bootstrap_servers, group_id: str, kafka_settings: dict[str, Any],
                 confluent_settings: dict[str, Any] | None = None) -> None:
        try:
            from confluent_kafka import Consumer
        except ImportError:
            raise MonitorError('stream.input_backend is "confluent" but confluent-kafka is not installed: '
                               'pip install "dp-outlier-monitor[confluent]" (or confluent-kafka)') from None
        servers = bootstrap_servers if isinstance(bootstrap_servers, str) else ",".join(bootstrap_servers)
        conf = {"bootstrap.servers": servers, "group.id": group_id, **CONFLUENT_DEFAULTS}
        conf.update({_FROM_KAFKA_PYTHON[k]: v for k, v in kafka_settings.items() if k in _FROM_KAFKA_PYTHON})
        conf.update(confluent_settings or {})
        self._c = Consumer(conf)
        # The same key as kafka-python's: messages handed to stage 1 per poll.
        self._max_records = int(kafka_settings.get("max_poll_records", MAX_POLL_RECORDS))
        self._assignment: set[TopicPartition] = set()
        self._seeks: dict[TopicPartition, int] | None = None  # during on_assign: offsets to assign at

    # -- group ----------------------------------------------------------------------
    def subscribe(self, topics: list[str], listener=None) -> None:
        def on_assign(consumer, partitions):
            tps = {TopicPartition(p.topic, p.partition) for p in partitions}
            self._assignment = set(tps)
            self._seeks = {}
            try:
                if listener is not None:
                    listener.on_partitions_assigned(tps)
            finally:
                seeks, self._seeks = self._seeks, None
            from confluent_kafka import OFFSET_STORED
            from confluent_kafka import TopicPartition as CTP

            consumer.assign([CTP(tp.topic, tp.partition, seeks.get(tp, OFFSET_STORED)) for tp in tps])

        def on_revoke(consumer, partitions):
            tps = {TopicPartition(p.topic, p.partition) for p in partitions}
            if listener is not None:
                listener.on_partitions_revoked(tps)
            self._assignment -= tps

        self._c.subscribe(topics, on_assign=on_assign, on_revoke=on_revoke)

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    # -- reading --------------------------------------------------------------------
    def poll(self, timeout_ms: int = 0) -> dict[TopicPartition, "MessageBatch"]:
        """Up to ``max_poll_records`` messages, by partition, as lazy batches:
        stage 1 reads their values and offsets as columns (one C-level map each) and
        builds a record object only for a message it rejects."""
        from confluent_kafka import Message

        msgs = self._c.consume(num_messages=self._max_records, timeout=timeout_ms / 1000)
        if not msgs:
            return {}
        if any(map(Message.error, msgs)):
            msgs = self._without_errors(msgs)
        out: dict[TopicPartition, MessageBatch] = {}
        # Messages come in runs per partition, in offset order within a partition.
        for partition, run in groupby(msgs, key=Message.partition):
            run = list(run)
            tp = TopicPartition(run[0].topic(), partition)
            batch = out.get(tp)
            if batch is None:
                out[tp] = MessageBatch(run)
            else:
                batch.messages.extend(run)
        return out

    @staticmethod
    def _without_errors(msgs: list) -> list:
        kept = []
        for m in msgs:
            err = m.error()
            if err is None:
                kept.append(m)
            elif err.retriable() or not err.fatal():
                # Partition EOF and transient errors: librdkafka retries by itself.
                log.warning("confluent consumer: %s", err)
            else:
                raise KafkaError(str(err))
        return kept

    def highwater(self, tp: TopicPartition) -> int | None:
        """The highwater from the last fetch response (librdkafka's cached value): Tansu
        answers list-offsets requests wrongly, fetch responses rightly (INFRA)."""
        from confluent_kafka import TopicPartition as CTP

        _, high = self._c.get_watermark_offsets(CTP(tp.topic, tp.partition), cached=True)
        return high if high is not None and high >= 0 else None

    def position(self, tp: TopicPartition) -> int:
        from confluent_kafka import TopicPartition as CTP

        ctp = CTP(tp.topic, tp.partition)
        off = self._c.position([ctp])[0].offset
        if off >= 0:
            return off
        # Nothing consumed since the assignment: librdkafka has no position yet. An empty
        # partition (low == high) or a committed offset at the highwater is still caught up.
        low, high = self._c.get_watermark_offsets(ctp, cached=True)
        if high is not None and high >= 0 and low == high:
            return high
        committed = self._c.committed([ctp], timeout=10)[0].offset
        return committed if committed >= 0 else -1

    def seek(self, tp: TopicPartition, offset: int) -> None:
        from confluent_kafka import TopicPartition as CTP

        if self._seeks is not None:  # inside on_assign: assign at this offset
            self._seeks[tp] = offset
        else:
            self._c.seek(CTP(tp.topic, tp.partition, offset))

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        md = self._c.list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        return set(t.partitions) if t is not None and t.error is None else None

    # -- offsets ----------------------------------------------------------------------
    def commit(self, offsets: dict) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as CTP

        try:
            self._c.commit(offsets=[CTP(tp.topic, tp.partition, om.offset) for tp, om in offsets.items()],
                           asynchronous=False)
        except KafkaException as err:
            raise KafkaError(str(err)) from None

    def close(self, autocommit: bool = False) -> None:  # noqa: ARG002 - auto-commit is off anyway
        self._c.close()
