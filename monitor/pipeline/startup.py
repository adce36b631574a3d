"""Start-up checks and notices of ``monitor run``: fail fast in one line, say what a default costs.

The service calls these with one line each, so that a user sees, before anything else:

- an unreachable or unknown broker as one line within ``stream.connect_timeout_seconds``
  (kafka-python alone retries for a minute and then raises a traceback);
- a port already taken (metrics, embedded broker) as one line, never as a traceback and
  never by silently joining another monitor's embedded broker;
- that the embedded broker keeps events in memory only;
- the budget plan (``monitor.budget.plan``), what the alarm can see (the smallest surge that
  pages within one window 95 % of the time, the false-page rate its threshold implies) and
  when the first window will be released;
- which missed windows are skipped after downtime (``window.max_catch_up_windows``).

Every decision here depends on the config, the clock and the ledger's schedule only; what
the alarm can see also reads the model file and the baseline the ledger last released
(both DP, so public).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import socket
import threading
import time
from typing import Iterator

from monitor.budget.plan import duration, iso, plan_from_config, visibility_report
from monitor.errors import MonitorError
from monitor.pipeline.broker import bind_error, reap_orphans

log = logging.getLogger("monitor.stream")

__all__ = [
    "BrokerUnreachable",
    "wait_for_broker",
    "kafka_setup_errors",
    "check_port_free",
    "check_ports",
    "serve_metrics",
    "announce_embedded_broker",
    "revoke_note",
    "skip_missed_windows",
    "first_window_start",
    "announce_schedule",
    "announce_visibility",
    "CATCH_UP_REASON",
]

CATCH_UP_REASON = "catch_up"
_PROBE_TIMEOUT_S = 1.0
_PROBE_PAUSE_S = 0.5


class BrokerUnreachable(MonitorError):
    """No bootstrap server accepted a connection in time."""


def _hosts(bootstrap: str | list[str]) -> list[tuple[str, int]]:
    from kafka.cluster import collect_hosts

    return [(host, port) for host, port, _ in collect_hosts(bootstrap)]


def _probe(host: str, port: int) -> str | None:
    """None if a TCP connection opens, else why not (in words)."""
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S):
            return None
    except socket.gaierror:
        return "unknown host"
    except ConnectionRefusedError:
        return "connection refused"
    except (TimeoutError, socket.timeout):
        return "no answer"
    except OSError as err:
        return err.strerror or str(err)


def wait_for_broker(bootstrap: str | list[str], stream, stop: threading.Event) -> bool:
    """Wait until a bootstrap server accepts a connection and answers as Kafka.

    ``stream`` is the config's StreamSettings (``connect_timeout_seconds``, and ``kafka``
    for TLS / SASL). Returns False if ``stop`` was set meanwhile (SIGTERM acts within
    about a second); raises a MonitorError, one line naming each server and why, after
    ``connect_timeout_seconds`` (kafka-python alone would wait a minute, then raise).
    """
    timeout = stream.connect_timeout_seconds
    hosts = _hosts(bootstrap)
    deadline = time.monotonic() + timeout
    reasons: dict[str, str] = {}
    while not stop.is_set():
        for host, port in hosts:
            why = _probe(host, port)
            if why is None:
                _check_kafka(bootstrap, stream.kafka, max(1.0, deadline - time.monotonic()))
                return True
            reasons[f"{host}:{port}"] = why
        if time.monotonic() >= deadline:
            break
        stop.wait(_PROBE_PAUSE_S)
    else:
        return False
    detail = ", ".join(f"{hp} ({why})" for hp, why in reasons.items())
    raise BrokerUnreachable(
        f"cannot reach Kafka at {detail} within {timeout:g} s: check --bootstrap-servers / stream.bootstrap_servers "
        f"and that the broker is running (stream.connect_timeout_seconds sets how long to wait; "
        f"without any bootstrap server the monitor starts its own embedded broker)"
    )


def _check_kafka(bootstrap, passthrough: dict, timeout: float) -> None:
    """A reachable port is not yet a Kafka broker (or the wrong TLS / SASL settings): bootstrap
    an admin client within ``timeout`` to find out in seconds rather than a minute."""
    from kafka import KafkaAdminClient

    from monitor.pipeline.clients import client_settings

    with kafka_setup_errors(bootstrap, f" within {timeout:.0f} s"):
        settings = {**client_settings("admin", passthrough), "bootstrap_timeout_ms": int(timeout * 1000)}
        KafkaAdminClient(bootstrap_servers=bootstrap, **settings).close()


@contextlib.contextmanager
def kafka_setup_errors(bootstrap: str | list[str], within: str = "") -> Iterator[None]:
    """Turn kafka-python's set-up failures (no broker, timeouts) into one MonitorError line."""
    from kafka.errors import KafkaError

    try:
        yield
    except KafkaError as err:
        detail = str(err).removeprefix(f"{type(err).__name__}: ")
        raise MonitorError(
            f"Kafka at {bootstrap} does not answer as a Kafka broker{within} ({type(err).__name__}: {detail}): "
            f"check the address and, for TLS or SASL, stream.kafka"
        ) from None


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise one clear MonitorError if ``host:port`` cannot be bound (port 0 is always free)."""
    if not port:
        return
    err = bind_error(port, host)
    if err is not None:
        raise MonitorError(_port_message(host, port, what, err))


def _port_message(host: str, port: int, what: str, err: OSError) -> str:
    if err.errno == errno.EADDRINUSE:
        cause = "is already in use (another monitor?)"
    elif err.errno == errno.EADDRNOTAVAIL:
        cause = "is not an address of this machine"
    else:
        cause = f"cannot be used: {err.strerror}"
    return f"{what}: {host}:{port} {cause}: choose another port, or 0 to pick a free one"


def check_ports(config, embedded: bool) -> None:
    """Before starting anything: are the metrics ports and (if used) the embedded broker's port free?"""
    check_port_free(config.metrics.host, config.metrics.port, "metrics.port")
    if config.metrics.operational_port is not None:
        check_port_free(config.metrics.host, config.metrics.operational_port, "metrics.operational_port")
    if embedded:
        # A broker left behind by a monitor that died (kill -9 where no parent-death signal
        # exists) would hold 9092 and swallow the producers' events: it goes first.
        for note in reap_orphans():
            log.warning("%s", note)
        check_port_free("127.0.0.1", config.stream.embedded_broker_port, "stream.embedded_broker_port")


def serve_metrics(metrics, host: str, port: int, operational_port: int | None) -> tuple[int, int | None]:
    """Start both /metrics endpoints; a taken port is one line naming its key, not an OSError traceback."""
    try:
        return metrics.serve(host, port, operational_port)
    except OSError as err:
        key, taken = ("metrics.port", port) if not metrics.serving else ("metrics.operational_port", operational_port)
        raise MonitorError(_port_message(host, taken, key, err)) from None


def announce_embedded_broker(bootstrap: str, moved: str | None = None) -> None:
    """Say where producers connect (the exact string to paste) and that nothing survives a stop."""
    if moved:
        log.warning("%s", moved)
    log.warning("no bootstrap_servers configured: started the embedded broker. Producers (and `monitor alerts`) connect "
                "with bootstrap_servers=%s. It keeps events IN MEMORY ONLY: events not yet released when the monitor "
                "stops are lost, and nothing survives a restart (restart producers with the monitor, or give them "
                "enable_idempotence=False). For real data set stream.bootstrap_servers to your Kafka",
                bootstrap)


def revoke_note(embedded: bool) -> str:
    """What happens to the events of open windows dropped on a revoke (the log line's ending)."""
    if embedded:
        return "lost: the embedded broker keeps them in memory only and stops with this monitor"
    return "uncommitted, so the partitions' next owner (or this monitor's next run) reads them again"


def skip_missed_windows(config, ledger, now: float, embedded: bool, metrics=None) -> float | None:
    """Apply ``window.max_catch_up_windows`` after downtime; return where the schedule resumes.

    Windows whose close time passed while no monitor ran are "missed". At most
    ``max_catch_up_windows`` of the most recent ones are released from the backlog; older
    ones are recorded in the ledger as ONE suppressed entry (reason ``catch_up``) and
    counted in ``dp_monitor_windows_suppressed_total{reason="catch_up"}``. With the
    embedded broker the cap is 0 and the schedule resumes with the window the monitor starts
    in: the broker has just started empty, so a missed window could only ever be released
    as pure noise. The rule reads the clock, the config and the ledger, never the data.
    """
    resume = ledger.last_window_end()
    if resume is None:
        return None
    w = config.window
    size = w.size_seconds
    cap = 0 if embedded else w.max_catch_up_windows
    if cap is None:
        return resume
    # The first window whose close time has not passed; on the embedded broker, the window the
    # monitor starts in: an earlier one's events were in the broker that stopped.
    due = math.floor((now if embedded else now - w.allowed_lateness_seconds) / size)
    missed = due - math.floor(resume / size)
    if missed <= cap:
        return resume
    skip_end = float((due - cap) * size)
    n_skipped = missed - cap
    ledger.record_suppressed(resume, skip_end, reason=CATCH_UP_REASON)
    if metrics is not None:
        metrics.windows_suppressed.labels(reason=CATCH_UP_REASON).inc(n_skipped)
    why = ("the embedded broker has just started empty, so they hold no events" if embedded
           else f"window.max_catch_up_windows is {cap}")
    log.warning("%d windows missed while the monitor was down, [%s, %s), are suppressed (reason %s), not released: %s",
                n_skipped, iso(resume), iso(skip_end), CATCH_UP_REASON, why)
    return skip_end


def first_window_start(config, started_at: float) -> float:
    """Start of the first window on a fresh ledger: the one that holds ``started_at``, the
    moment ``monitor run`` started (public: the clock and the config).

    Events from before it are late, even when they wait in the topic: a window that closed
    before the monitor started would be published late, and a warm-up baseline over it
    would pay for windows nobody was reading (docs/operations.md, "When windows close").

    >>> from types import SimpleNamespace
    >>> first_window_start(SimpleNamespace(window=SimpleNamespace(size_seconds=300)), 1_763_700_123.4)
    1763700000.0
    """
    size = config.window.size_seconds
    return float(math.floor(started_at / size + 1e-9) * size)


def announce_schedule(config, ledger, first_start: float | None, now: float,
                      why: str = "after the ledger's last window") -> None:
    """Log the budget plan and, when it is known, when the first window will be released."""
    plan = plan_from_config(config)
    restart = f"; {plan.restart_note()}" if plan.restart_note() else ""
    if plan.advice():
        log.warning("budget plan: %s%s. %s", plan.summary(), restart, plan.advice())
    else:
        log.info("budget plan: %s%s", plan.summary(), restart)
    announce_visibility(config, ledger)
    if first_start is None:
        log.info("first window: decided once the input is read (the ledger is empty)")
        return
    announce_first_window(config, first_start, now, why)


def announce_visibility(config, ledger) -> None:
    """Log what the alarm can see: at the traffic of the baseline in use (the ledger's last
    released record) or, before one, at a few stated traffics (``visibility_report``)."""
    last = ledger.last_released()
    record = json.loads(last.payload) if last is not None and last.payload else None
    vis = visibility_report(config, record)
    if (vis["source"] is None or vis.get("blind")) and config.alarm.enabled:  # no model file, or a blind one: say it
        log.warning("what the alarm can see: %s", vis["summary"])
    else:
        log.info("what the alarm can see: %s", vis["summary"])


def announce_first_window(config, first_start: float, now: float, why: str) -> None:
    """Log when the first window will be released (its scheduled publication time)."""
    size, late = config.window.size_seconds, config.window.allowed_lateness_seconds
    # Published at its scheduled time: close time plus the publication delay.
    first_close = first_start + size + late + config.window.publish_delay_seconds
    if first_close <= now:
        log.info("first window [%s, %s) (%s) has already closed: it is released once the backlog is read",
                 iso(first_start), iso(first_start + size), why)
    elif first_close > now + 60:
        # With 5-minute windows the first release is minutes away: say so, or the
        # silence looks like a hang.
        log.info("first window [%s, %s) (%s) is released at %s (in %s); nothing is published before that",
                 iso(first_start), iso(first_start + size), why, iso(first_close), duration(first_close - now))
    else:
        log.info("first window [%s, %s) (%s) is released at %s", iso(first_start), iso(first_start + size), why, iso(first_close))
