"""``monitor alerts``: read the alerts topic without writing a consumer, or a backtest's alerts file.

Prints each window's alert record as one row (window, alarm state, epsilon charged, the
detailed report's headline), or the records themselves with ``--json``; ``--follow``
keeps reading as new windows are published; ``--input FILE`` reads the JSON-lines file
``monitor replay`` writes instead, with the same display. Everything shown is the published
record, so it is as private as the topic: post-processing of the releases, nothing more.

The reader joins no consumer group and commits nothing (it cannot disturb a running
monitor), and shows each window once: a record republished after a crash carries the
same key and bytes.

>>> row({"window_start": 1763700000.0, "window_end": 1763700300.0, "alarm": True, "epsilon": 0.95,
...      "alarm_detail": {"state": "fired"}, "report": {"reason": "alarm", "headline": "surge in hr+spo2: +41 flagged (+-12)"}})
('2025-11-21T04:40:00Z-04:45:00', 'fired', '0.95', 'surge in hr+spo2: +41 flagged (+-12)')
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any, Iterator

from monitor.errors import MonitorError
from monitor.pipeline.publisher import headline

__all__ = ["configure_alerts", "row", "headline", "resolve_bootstrap", "read_alerts", "read_alerts_file"]

COLUMNS = ("window (UTC)", "alarm", "epsilon", "report")
_WIDTHS = (30, 10, 8)
_POLL_MS = 500


def resolve_bootstrap(cli_value: str | None, config) -> str | list[str]:
    """--bootstrap-servers, else stream.bootstrap_servers, else the embedded broker of the
    running ``monitor run`` of this config (found by its ``budget.ledger``, wherever its port),
    else the embedded broker's port (``stream.embedded_broker_port``, or the default the
    embedded broker takes when free). A broker there that a dead monitor left behind is
    refused: its alerts are not current."""
    from monitor.pipeline.broker import DEFAULT_EMBEDDED_PORT, orphan_on, running_broker

    if cli_value:
        return cli_value
    if config.stream.bootstrap_servers:
        return config.stream.bootstrap_servers
    running = running_broker(config.budget.ledger)
    if running is not None:
        return running
    port = config.stream.embedded_broker_port or DEFAULT_EMBEDDED_PORT
    orphan = orphan_on(port)
    if orphan is not None:
        raise MonitorError(f"the embedded broker on 127.0.0.1:{port} was left behind by a monitor that is no longer "
                           f"running (pid {orphan.monitor_pid}): its alerts are not current. Start `monitor run` "
                           "(it stops that broker and takes its port back), or pass --bootstrap-servers")
    return f"127.0.0.1:{port}"


def row(record: dict) -> tuple[str, str, str, str]:
    """One alert record as the table's four cells."""
    from monitor.budget.plan import iso

    start, end = record.get("window_start"), record.get("window_end")
    window = "?" if start is None else iso(start) + ("" if end is None else "-" + iso(end)[11:19])
    detail = record.get("alarm_detail") or {}
    state = detail.get("state") or ("alarm" if record.get("alarm") else "quiet")
    eps = record.get("epsilon")
    return window, state, "-" if eps is None else f"{eps:.3g}", headline(record.get("report"))


def _line(cells) -> str:
    return " ".join(c.ljust(w) for c, w in zip(cells, _WIDTHS)) + " " + cells[-1]


def read_alerts(bootstrap, config, *, follow: bool, stop: threading.Event) -> Iterator[dict]:
    """Each window's alert record on the alerts topic, oldest first; with ``follow``, then
    each new one until ``stop`` is set."""
    from kafka import KafkaConsumer, TopicPartition

    from monitor.pipeline.clients import client_settings
    from monitor.pipeline.startup import kafka_setup_errors, wait_for_broker

    topic = config.stream.alerts_topic
    if not wait_for_broker(bootstrap, config.stream, stop):
        return
    settings = {k: v for k, v in client_settings("consumer", config.stream.kafka).items()
                if k not in ("session_timeout_ms", "heartbeat_interval_ms")}
    with kafka_setup_errors(bootstrap):
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, **{**settings, "enable_auto_commit": False})
    try:
        partitions = None
        while not stop.is_set():
            partitions = consumer.partitions_for_topic(topic)
            if partitions or not follow:
                break
            stop.wait(1.0)
        if not partitions:
            if not stop.is_set():
                raise MonitorError(f"no alerts topic {topic!r} on {bootstrap} yet (stream.alerts_topic): has a monitor run "
                                   "against this broker? `monitor alerts --follow` waits for it")
            return
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        seen: set = set()
        while not stop.is_set():
            batch = consumer.poll(timeout_ms=_POLL_MS)
            records = sorted((r for rs in batch.values() for r in rs), key=lambda r: r.timestamp)
            for r in records:
                try:
                    record = json.loads(r.value)
                except (TypeError, ValueError):
                    continue  # not ours: the topic is shared with something else
                key = record.get("window_start") if isinstance(record, dict) else None
                if key in seen:
                    continue  # republished after a crash: the same record again
                seen.add(key)
                yield record
            if not follow and all(consumer.position(tp) >= end[tp] for tp in tps):
                return
    finally:
        consumer.close()


def read_alerts_file(path) -> Iterator[dict]:
    """Each window's alert record in a JSON-lines file (``monitor replay --output``), in file
    order, each window once. Raises ``MonitorError`` naming the line that is not a record."""
    try:
        source = open(path, "rb")
    except OSError as err:
        raise MonitorError(f"cannot read --input {path}: {err.strerror}") from None
    seen: set = set()
    with source:
        for line_no, line in enumerate(source, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict) or "window_start" not in record:
                raise MonitorError(f"--input {path} line {line_no}: not an alert record (one JSON object per line with "
                                   "window_start, as monitor replay --output writes)")
            if record["window_start"] in seen:
                continue
            seen.add(record["window_start"])
            yield record


def configure_alerts(parser: argparse.ArgumentParser) -> None:
    """Options of ``monitor alerts``."""
    from monitor.cli import add_config_option

    add_config_option(parser, "names the broker and the alerts topic")
    parser.add_argument("--bootstrap-servers", help="Kafka brokers, overriding stream.bootstrap_servers (default with the "
                        "embedded broker: 127.0.0.1:stream.embedded_broker_port, or 9092)")
    parser.add_argument("--input", metavar="FILE", help="read this alerts file (monitor replay's --output, one record per "
                        "line) instead of the alerts topic")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new windows as they are published (Ctrl-C stops)")
    parser.add_argument("--json", action="store_true", help="print each alert record as one JSON line, as published")
    parser.set_defaults(func=run_alerts)


def run_alerts(args: argparse.Namespace) -> int:
    from monitor.config import load_config

    if args.input is not None:
        return _print_file(args)
    config = load_config(args.config)
    bootstrap = resolve_bootstrap(args.bootstrap_servers, config)
    stop = threading.Event()
    # Ctrl-C (or SIGTERM) sets ``stop``: the poll loop ends within one poll and the consumer
    # closes cleanly. An exception raised inside kafka-python's I/O wait could leave its
    # close() waiting forever (seen with kafka-python 3.0). A second Ctrl-C exits at once.
    def on_signal(signum, frame):  # noqa: ARG001
        if stop.is_set():
            os._exit(130)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    if not args.json:
        print(_line(COLUMNS), flush=True)
    n = 0
    try:
        for record in read_alerts(bootstrap, config, follow=args.follow, stop=stop):
            n += 1
            print(json.dumps(record) if args.json else _line(row(record)), flush=args.follow)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if not args.json and not args.follow:
        print(f"{n} window(s) on {config.stream.alerts_topic} at {bootstrap}", file=sys.stderr)
    return 0


def _print_file(args: argparse.Namespace) -> int:
    # A file needs no config or broker: its records are already the releases.
    if args.follow:
        raise MonitorError("--follow reads the alerts topic as it grows; --input reads a finished file once: drop one of them")
    records = list(read_alerts_file(args.input))  # a bad line stops it before any output
    if not args.json:
        print(_line(COLUMNS))
    for record in records:
        print(json.dumps(record) if args.json else _line(row(record)))
    if not args.json:
        print(f"{len(records)} window(s) in {args.input}", file=sys.stderr)
    return 0
