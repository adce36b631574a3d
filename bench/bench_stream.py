"""Throughput of the monitor service versus a bare consumer, and release latency per window.

One run, one embedded broker, one topic:

1. produce N JSON events (3 partitions) with event times in the current window;
2. time a bare kafka-python ``KafkaConsumer`` reading the whole topic and json-decoding
   each record (same client settings as the service: ``monitor.stream.clients.client_settings``);
3. time the service processing the whole topic (validate, score, window), alternating
   with 2. for ``--rounds`` rounds (medians); with ``--confluent`` also a bare
   confluent-kafka consumer and the service with ``stream.input_backend: confluent``;
4. time 1, 2, 3 separate ``monitor run --stage 1`` processes on the same topic;
5. run the service on live traffic with short windows and report the release latency
   (window close time -> alert acknowledged by the broker) per window.

Rates are counted from the first record received to the last, so the group join
(seconds on Tansu) is left out of both.

    python bench/bench_stream.py                          # 200k events, prints the tables
    python bench/bench_stream.py --confluent --write      # and writes BENCHMARKS.md section `stream`
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

from monitor.config import parse_config
from monitor.stream.broker import EmbeddedBroker
from monitor.stream.clients import make_consumer, make_producer
from monitor.stream.service import MonitorService

FEATURES = [{"name": "hr", "min": 30, "max": 220}, {"name": "spo2", "min": 70, "max": 100}, {"name": "temp", "min": 34, "max": 42}]
GROUP = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}


def fit_model(path: Path) -> None:
    from monitor.model import GridKNN

    X = np.random.default_rng(0).normal([75, 96, 37], [8, 1.5, 0.4], size=(5000, 3))
    GridKNN(epsilon=1.0, bounds=[(f["min"], f["max"]) for f in FEATURES], contamination=0.05, random_state=0,
            feature_names=[f["name"] for f in FEATURES]).fit(X).save(path)


def produce(bootstrap: str, topic: str, n: int, ts_of, partitions: int) -> float:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    rng = np.random.default_rng(1)
    vals = rng.normal([75, 96, 37], [8, 1.5, 0.4], size=(n, 3)).round(2)
    producer = make_producer(bootstrap, {}, linger_ms=20, batch_size=256 * 1024)
    t0 = time.perf_counter()
    for i in range(n):
        body = {"id": f"e{i}", "patient": f"p{i}", "ts": ts_of(i), "hr": vals[i, 0], "spo2": vals[i, 1], "temp": vals[i, 2]}
        producer.send(topic, json.dumps(body).encode())
    producer.flush()
    producer.close()
    return n / (time.perf_counter() - t0)


def bare_consumer_rate(bootstrap: str, topic: str, n: int) -> float:
    """A bare kafka-python consumer that json-decodes each record (the issue's yardstick)."""
    consumer = make_consumer(bootstrap, f"bare-{time.time_ns()}", GROUP)
    consumer.subscribe([topic])
    seen, first = 0, None
    loads = json.loads
    while seen < n:
        for records in consumer.poll(timeout_ms=500).values():
            if first is None:
                first = time.perf_counter()
            for rec in records:
                loads(rec.value)
            seen += len(records)
    rate = n / (time.perf_counter() - first)
    consumer.close()
    return rate


def bare_confluent_rate(bootstrap: str, topic: str, n: int) -> float:
    """A bare confluent-kafka consumer that json-decodes each record."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bare-ck-{time.time_ns()}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 2000, "heartbeat.interval.ms": 500})
    c.subscribe([topic])
    seen, first = 0, None
    loads = json.loads
    while seen < n:
        msgs = c.consume(num_messages=2000, timeout=0.5)
        if msgs and first is None:
            first = time.perf_counter()
        for m in msgs:
            if m.error() is None:
                loads(m.value())
                seen += 1
    rate = n / (time.perf_counter() - first)
    c.close()
    return rate


class _TimedService(MonitorService):
    """The service, with the times of its first and N-th event noted (bench only)."""

    def __init__(self, *a, expect: int, **kw) -> None:
        super().__init__(*a, **kw)
        self.expect, self.first, self.last = expect, None, None

    def _connect(self) -> None:
        super()._connect()
        ingest = self.stage1.ingest

        def timed(batch: dict) -> None:
            if self.first is None:
                self.first = time.perf_counter()
            ingest(batch)
            if self.last is None and sum(self.counts.values()) >= self.expect:
                self.last = time.perf_counter()
                self.stop()

        self.stage1.ingest = timed


def config(tmp: Path, topic: str, *, size: float, lateness: float, entity: bool, grace: float = 30.0, backend: str = "kafka-python"):
    return parse_config({
        "features": FEATURES,
        "model": {"path": str(tmp / "model.json")},
        # No publication delay: the latency phase measures the release work itself (with the
        # delay, every alert waits for its scheduled time, window.publish_delay_seconds).
        "window": {"size_seconds": size, "allowed_lateness_seconds": lateness, "release_grace_seconds": grace,
                   "publish_delay_seconds": 0.0},
        "budget": {"ledger": str(tmp / f"ledger-{topic}.sqlite"), "epsilon": 1000.0, "delta": 1e-3},
        "metrics": {"port": 0},
        "stream": {"input_topic": topic, "group_id": f"svc-{topic}-{backend}", "kafka": GROUP,
                   "entity_field": "patient" if entity else None, "input_backend": backend},
    })


def service_rate(bootstrap: str, tmp: Path, topic: str, n: int, backend: str = "kafka-python") -> tuple[float, dict]:
    cfg = config(tmp, topic, size=3600.0, lateness=0.0, entity=True, backend=backend)
    service = _TimedService(cfg, bootstrap_servers=bootstrap, rng=0, expect=n)
    service.run()
    return n / (service.last - service.first), dict(service.counts)


def release_latencies(bootstrap: str, tmp: Path, per_window: int, windows: int, size: float) -> tuple[list[float], list[int], int]:
    """Live traffic at about per_window events per window.

    Returns the latency of each released window, its true size (from the audit file:
    the bench is inside the trust boundary) and top_h.
    """
    topic = f"live-{time.time_ns()}"
    # A short grace: a fresh ledger starts at the oldest window within its grace, and
    # those (empty) windows are not what this phase measures.
    cfg = config(tmp, topic, size=size, lateness=0.2, entity=False, grace=0.5)
    audit = tmp / f"audit-{topic}.jsonl"
    service = MonitorService(cfg, bootstrap_servers=bootstrap, rng=0, max_windows=windows + 1, audit_path=audit)
    thread = threading.Thread(target=service.run)
    thread.start()
    service.wait_ready(30)
    producer = make_producer(bootstrap, {})
    rng = np.random.default_rng(2)
    i = 0
    while thread.is_alive():
        now = time.time()
        for _ in range(max(1, int(per_window / size / 50))):
            v = rng.normal([75, 96, 37], [8, 1.5, 0.4])
            producer.send(topic, json.dumps({"id": i, "ts": now, "hr": v[0], "spo2": v[1], "temp": v[2]}).encode())
            i += 1
        time.sleep(0.02)
    producer.close()
    thread.join()
    # The first window started before the traffic: leave it out.
    sizes = [json.loads(line)["n_events"] for line in audit.read_text().splitlines()]
    return service.release_latencies[1:], sizes[1:], cfg.report.top_h


_CAUGHT_UP = re.compile(r"^(\S+ \S+) INFO monitor.stream: stage 1: partition (\d+) caught up \((\d+) records in ([\d.]+) s\)")


def process_scaling(bootstrap: str, tmp: Path, topic: str, n: int, processes: int) -> float:
    """``processes`` separate `monitor run --stage 1` processes reading the topic's backlog.

    Rate = n / (span from the first record to the last catch-up over the final read of
    each partition), from the processes' own logs (join and interpreter start excluded).
    """
    import subprocess
    import sys
    from datetime import datetime

    group = f"scale{processes}-{time.time_ns()}"
    d = tmp / group
    d.mkdir()
    cfg = {
        "features": FEATURES, "model": {"path": str(tmp / "model.json")},
        "window": {"size_seconds": 3600.0, "allowed_lateness_seconds": 0.0, "release_grace_seconds": 3600.0},
        "budget": {"ledger": str(d / "ledger.sqlite"), "epsilon": 1000.0, "delta": 1e-3},
        "metrics": {"port": 0},
        "stream": {"input_topic": topic, "group_id": group, "kafka": GROUP, "entity_field": "patient"},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    logs = [d / f"p{i}.log" for i in range(processes)]
    procs = [subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config", str(d / "config.yaml"), "--stage", "1",
                               "--bootstrap-servers", bootstrap], stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) for log in logs]
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            last: dict[int, tuple[float, int, float]] = {}
            for log in logs:
                for line in log.read_text(errors="replace").splitlines():
                    m = _CAUGHT_UP.match(line)
                    if m:
                        end = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                        p = int(m.group(2))
                        if p not in last or end > last[p][0]:
                            last[p] = (end, int(m.group(3)), float(m.group(4)))
            if sum(v[1] for v in last.values()) >= n:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{processes} processes did not catch up; logs in {d}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    span = max(v[0] for v in last.values()) - min(v[0] - v[2] for v in last.values())
    return n / span


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--windows", type=int, default=5, help="windows for the latency phase")
    ap.add_argument("--per-window", type=int, default=2000, help="events per window in the latency phase")
    ap.add_argument("--window-size", type=float, default=2.0)
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of each reader (medians reported)")
    ap.add_argument("--confluent", action="store_true", help="also measure the confluent-kafka input backend")
    ap.add_argument("--processes", default="1,2,3", help="stage-1 process counts for the scaling table ('' = skip)")
    ap.add_argument("--write", action="store_true", help="write the BENCHMARKS.md section `stream`")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory() as d, EmbeddedBroker() as broker:
        tmp = Path(d)
        fit_model(tmp / "model.json")
        bs = broker.bootstrap_servers
        topic = f"bench-{time.time_ns()}"
        now = time.time()
        if now % 3600 > 3500:  # keep every event in the window open at the service's start
            time.sleep(3600 - now % 3600 + 1)
        ts = time.time()
        produce_rate = produce(bs, topic, args.events, lambda i: ts, args.partitions)
        # Alternating runs, medians: on a shared machine the load drifts between runs.
        bares, svcs, ck_bares, ck_svcs = [], [], [], []
        for _ in range(args.rounds):
            bares.append(bare_consumer_rate(bs, topic, args.events))
            rate, counts = service_rate(bs, tmp, topic, args.events)
            svcs.append(rate)
            if args.confluent:
                ck_bares.append(bare_confluent_rate(bs, topic, args.events))
                ck_svcs.append(service_rate(bs, tmp, topic, args.events, backend="confluent")[0])
        scaling = {m: process_scaling(bs, tmp, topic, args.events, m)
                   for m in (int(x) for x in args.processes.split(",") if x)}
        lat: list[float] = []
        if not args.skip_latency:
            lat, sizes, top_h = release_latencies(bs, tmp, args.per_window, args.windows, args.window_size)

    bare, svc = float(np.median(bares)), float(np.median(svcs))
    runs = lambda xs: ", ".join(f"{x:,.0f}" for x in xs)  # noqa: E731
    lines = [
        "## Stream throughput and release latency",
        "",
        f"`python bench/bench_stream.py --events {args.events} --partitions {args.partitions} "
        f"--windows {args.windows} --per-window {args.per_window} --window-size {args.window_size} "
        f"--rounds {args.rounds}{' --confluent' if args.confluent else ''} --write` "
        "(embedded Tansu broker, kafka-python 3.0, same consumer settings for both readers; "
        "rates from first to last record, group join excluded; the readers run alternately, "
        f"{args.rounds} rounds, medians).",
        "",
        "| reader | events/s (median) | runs |",
        "|---|---|---|",
        f"| producer (for reference) | {produce_rate:,.0f} | |",
        f"| bare `KafkaConsumer`, `json.loads` per record | {bare:,.0f} | {runs(bares)} |",
        f"| monitor service (kafka-python): validate (orjson per batch), score (grid-kNN), window, entity dedupe | {svc:,.0f} | {runs(svcs)} |",
        f"| **ratio service / bare** | **{svc / bare:.2f}** | |",
    ]
    if args.confluent:
        ck_bare, ck_svc = float(np.median(ck_bares)), float(np.median(ck_svcs))
        lines += [
            f"| bare confluent-kafka `Consumer`, `json.loads` per record | {ck_bare:,.0f} | {runs(ck_bares)} |",
            f"| monitor service, `stream.input_backend: confluent` | {ck_svc:,.0f} | {runs(ck_svcs)} |",
            f"| **ratio service confluent / service kafka-python** | **{ck_svc / svc:.2f}** | |",
        ]
    lines += [
        "",
        f"Service event statuses: {counts}. The machine (2 cores) was shared with other jobs during "
        "the run, so absolute rates are below INFRA.md's idle figures; the ratio is what the run compares. "
        "Both readers run with the `crc32c` extension installed (a dependency).",
    ]
    if scaling:
        lines += [
            "",
            f"Stage-1 throughput by number of `monitor run --stage 1` processes (separate processes, one "
            f"consumer group, {args.partitions} input partitions, the same {args.events:,} events; span from "
            "the first record to the last partition caught up, from the processes' logs; on this 2-core machine "
            "shared with other jobs, more processes than cores cannot scale):",
            "",
            "| stage-1 processes | events/s | vs 1 process |",
            "|---|---|---|",
            *(f"| {m} | {r:,.0f} | {r / scaling[min(scaling)]:.2f}x |" for m, r in scaling.items()),
        ]
    if lat:
        lines += [
            "",
            f"Release latency (window close time to the release computed and stored, before the alert's "
            f"scheduled publication; stage 1 ships the shards, stage 2 merges them and runs the release "
            f"with `window.publish_delay_seconds: 0`), {len(lat)} windows of {args.window_size:g} s, "
            f"3 features, top-{top_h} subspaces, default release settings: median {np.median(lat) * 1000:.0f} ms, "
            f"max {np.max(lat) * 1000:.0f} ms.",
            "",
            "| events in window | " + " | ".join(str(n) for n in sizes) + " |",
            "|---|" + "---|" * len(sizes),
            "| latency (ms) | " + " | ".join(f"{x * 1000:.0f}" for x in lat) + " |",
        ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        from report import write_section  # a sibling: run as python bench/bench_stream.py

        write_section("stream", text)


if __name__ == "__main__":
    main()
