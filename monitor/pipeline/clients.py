"""Building kafka-python clients from the config, and creating the service's topics.

``stream.kafka`` in the config is passed through to kafka-python (SASL, TLS, tuning);
each client receives only the keys it knows, because kafka-python rejects unknown ones.

>>> sorted(client_settings("consumer", {"security_protocol": "SASL_SSL", "acks": "all"}))[:2]
['auto_offset_reset', 'enable_auto_commit']
"""

from __future__ import annotations

import logging
from typing import Any, Literal

log = logging.getLogger("monitor.stream")

__all__ = ["client_settings", "make_consumer", "make_producer", "ensure_topics", "MAX_POLL_RECORDS", "RESTART_SAFE_PRODUCER"]

# Records per poll. Stage 1 parses, scores and windows a poll's records in a few numpy
# calls whose fixed cost is paid per poll: kafka-python's default (500) spreads it over
# too few events. A poll of this many ~100-byte events takes about 10 ms to ingest, far
# under max_poll_interval_ms.
MAX_POLL_RECORDS = 5000

# Group membership: 6 s is the smallest session timeout real Kafka accepts by default
# (group.min.session.timeout.ms); Tansu joins in session_timeout_ms / 2, about 3 s.
_CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable_auto_commit": False,  # we commit only what no open window still holds
    "auto_offset_reset": "earliest",
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "max_poll_records": MAX_POLL_RECORDS,
}
_PRODUCER_DEFAULTS: dict[str, Any] = {"linger_ms": 5}
# What a producer into the embedded broker needs to survive a restart of `monitor run`: the
# broker restarts empty, so an idempotent producer's id is unknown to it and every later send
# is refused (kafka-python's default). kafka-python's other defaults (acks=all, retries until
# delivery_timeout_ms, 2 minutes) then carry each send over the restart.
RESTART_SAFE_PRODUCER: dict[str, Any] = {"enable_idempotence": False}


def client_settings(kind: Literal["consumer", "producer", "admin"], passthrough: dict[str, Any]) -> dict[str, Any]:
    """Our defaults for one client kind, overridden by the passthrough keys it accepts."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    known = {"consumer": KafkaConsumer, "producer": KafkaProducer, "admin": KafkaAdminClient}[kind].DEFAULT_CONFIG
    defaults = {"consumer": _CONSUMER_DEFAULTS, "producer": _PRODUCER_DEFAULTS, "admin": {}}[kind]
    return {**defaults, **{k: v for k, v in passthrough.items() if k in known}}


def make_consumer(bootstrap_servers, group_id: str, passthrough: dict[str, Any], **overrides):
    from kafka import KafkaConsumer

    return KafkaConsumer(
        bootstrap_servers=bootstrap_servers, group_id=group_id, **{**client_settings("consumer", passthrough), **overrides}
    )


def make_producer(bootstrap_servers, passthrough: dict[str, Any], **overrides):
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap_servers, **{**client_settings("producer", passthrough), **overrides})


def ensure_topics(bootstrap_servers, topics: list[str], passthrough: dict[str, Any], partitions: int = 1) -> None:
    """Create the topics that do not exist yet; a failure is logged, not fatal.

    On a managed cluster the service may lack the right to create topics; they then
    have to exist already (or be auto-created by the broker).
    """
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_settings("admin", passthrough))
    except Exception as err:  # noqa: BLE001 - creation is best effort
        log.warning("cannot create topics %s: %s", topics, err)
        return
    try:
        existing = set(admin.list_topics())
        missing = [t for t in dict.fromkeys(topics) if t not in existing]
        if missing:
            admin.create_topics([NewTopic(t, partitions, 1) for t in missing])
            log.info("created topics %s", missing)
    except TopicAlreadyExistsError:
        pass
    except Exception as err:  # noqa: BLE001
        log.warning("cannot create topics %s: %s", topics, err)
    finally:
        admin.close()
