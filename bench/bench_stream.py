"""Throughput of the monitor service versus a bare consumer, and release latency per window.

One run, one embedded broker, one topic:

1. produce N JSON events (3 partitions) with event times in the current window;
2. time a bare kafka-python ``KafkaConsumer`` reading the whole topic and json-decoding
   each record (same client settings as the service: ``monitor.pipeline.clients.client_settings``);
3. time the service processing the whole topic (validate, score, bound one event per
   entity per window, window), alternating with 2. for ``--rounds`` rounds, the order of
   the two swapped every round; with ``--confluent`` also a bare confluent-kafka consumer
   and the service with ``stream.input_backend: confluent``. On a shared machine the
   load drifts between runs, so the figure of merit is the median over rounds of the
   ratio of the two runs of the same round (adjacent in time), with its spread;
4. time 1, 2, 3 separate ``monitor run --stage 1`` processes on the same topic;
5. run the service on live traffic with short windows and report the release latency
   (window close time -> alert acknowledged by the broker) per window.

Rates are counted from the first record received to the last, so the group join
(seconds on Tansu) is left out of both.

    python bench/bench_stream.py                          # 300k events, 5 rounds, prints the tables
    python bench/bench_stream.py --confluent --write      # and writes docs/benchmarks/stream.md section `stream`
    python bench/bench_stream.py --floods --events 100000 # one person's floods (docs/scaling.md)

``--floods`` measures only what one person's flood costs everyone (docs/scaling.md#what-a-window-holds): the
service's rate on the same number of events, clean, with one malformed message per
1,000, and with half the events one entity's duplicates (the other half distinct).
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
import orjson
import yaml

from monitor.config import parse_config
from monitor.pipeline.broker import EmbeddedBroker
from monitor.pipeline.clients import MAX_POLL_RECORDS, make_consumer, make_producer
from monitor.pipeline.service import MonitorService

FEATURES = [{"name": "hr", "min": 30, "max": 220}, {"name": "spo2", "min": 70, "max": 100}, {"name": "temp", "min": 34, "max": 42}]
GROUP = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}
_DAY = 86400.0  # the throughput phase's window: no window closes while it runs


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


def _clocks() -> tuple[float, float]:
    """Wall-clock time and this process's CPU time (all its threads; the broker is another process)."""
    return time.perf_counter(), time.process_time()


def _rates(n: int, first: tuple[float, float], last: tuple[float, float]) -> tuple[float, float]:
    """Events per wall-clock second and per CPU second of the reading process. On a shared
    machine the first depends on how much CPU the other jobs leave; the second is the
    reader's own cost, which is what bounds it on an idle machine (one Python thread)."""
    return n / (last[0] - first[0]), n / (last[1] - first[1])


def bare_consumer_rate(bootstrap: str, topic: str, n: int, loads=json.loads) -> tuple[float, float]:
    """A bare kafka-python consumer that json-decodes each record (the yardstick:
    ``json.loads``; ``orjson.loads`` for the row that shows the client's own ceiling)."""
    consumer = make_consumer(bootstrap, f"bare-{time.time_ns()}", GROUP)
    consumer.subscribe([topic])
    seen, first = 0, None
    while seen < n:
        for records in consumer.poll(timeout_ms=500).values():
            if first is None:
                first = _clocks()
            for rec in records:
                loads(rec.value)
            seen += len(records)
    rate = _rates(n, first, _clocks())
    consumer.close()
    return rate


def bare_confluent_rate(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    """A bare confluent-kafka consumer that json-decodes each record, with the service's
    librdkafka settings (``CONFLUENT_DEFAULTS``)."""
    from confluent_kafka import Consumer

    from monitor.pipeline.confluent_input import CONFLUENT_DEFAULTS

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bare-ck-{time.time_ns()}", **CONFLUENT_DEFAULTS,
                  "session.timeout.ms": 2000, "heartbeat.interval.ms": 500})
    c.subscribe([topic])
    seen, first = 0, None
    loads = json.loads
    while seen < n:
        msgs = c.consume(num_messages=MAX_POLL_RECORDS, timeout=0.5)
        if msgs and first is None:
            first = _clocks()
        for m in msgs:
            if m.error() is None:
                loads(m.value())
                seen += 1
    rate = _rates(n, first, _clocks())
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
                self.first = _clocks()
            ingest(batch)
            if self.last is None and sum(self.counts.values()) >= self.expect:
                self.last = _clocks()
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


STATUSES: dict[str, dict] = {}  # backend -> event statuses of its last service run


def _service_rate(bootstrap: str, tmp: Path, topic: str, n: int, backend: str = "kafka-python") -> tuple[float, float]:
    """The service as `monitor run` runs it (both stages, one process), event time from the
    events, one event per entity per window: every event must be accepted, or it measured less."""
    cfg = config(tmp, topic, size=_DAY, lateness=0.0, entity=True, backend=backend)
    service = _TimedService(cfg, bootstrap_servers=bootstrap, rng=0, expect=n)
    service.run()
    STATUSES[backend] = dict(service.counts)
    if service.counts["accepted"] != n:
        raise RuntimeError(f"the service accepted {service.counts['accepted']} of {n} events: {dict(service.counts)}")
    return _rates(n, service.first, service.last)


def produce_values(bootstrap: str, topic: str, values: list[bytes], partitions: int) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    producer = make_producer(bootstrap, {}, linger_ms=20, batch_size=256 * 1024)
    for v in values:
        producer.send(topic, v)
    producer.flush()
    producer.close()


def flood_rates(bootstrap: str, tmp: Path, n: int, partitions: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """The service's rate (wall, per CPU second) on n messages: clean; one malformed
    message per 1,000; half of them one entity's duplicates. Rounds alternate the order."""
    rng = np.random.default_rng(2)
    vals = rng.normal([75, 96, 37], [8, 1.5, 0.4], size=(n, 3)).round(2).tolist()
    ts = time.time()

    def body(i: int, who: str) -> bytes:
        return orjson.dumps({"id": f"e{i}", "patient": who, "ts": ts, "hr": vals[i][0], "spo2": vals[i][1], "temp": vals[i][2]})

    kinds = {
        "clean": [body(i, f"p{i}") for i in range(n)],
        "malformed 1/1000": [b'{"hr": 1,' if i % 1000 == 999 else body(i, f"p{i}") for i in range(n)],
        "one entity's duplicates 1/2": [body(i, "flood" if i % 2 else f"p{i}") for i in range(n)],
    }
    topics = {}
    for k, values in kinds.items():
        topics[k] = f"flood-{time.time_ns()}"
        produce_values(bootstrap, topics[k], values, partitions)
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for r in range(rounds):
        for k in (list(kinds) if r % 2 == 0 else list(kinds)[::-1]):
            cfg = config(tmp, topics[k], size=_DAY, lateness=0.0, entity=True)
            service = _TimedService(cfg, bootstrap_servers=bootstrap, rng=0, expect=n)
            service.run()
            out[k].append(_rates(n, service.first, service.last))
            print(f"round {r + 1}: {k}: {out[k][-1][0]:,.0f} events/s, {out[k][-1][1]:,.0f}/cpu-s {dict(service.counts)}",
                  flush=True)
    return out


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


_CAUGHT_UP = re.compile(r"stage 1: partition (\d+) caught up \((\d+) records in ([\d.]+) s\)")


def process_scaling(bootstrap: str, tmp: Path, topic: str, n: int, processes: int) -> float:
    """``processes`` separate `monitor run --stage 1` processes reading the topic's backlog.

    Rate = n / (span from the first record to the last catch-up over the final read of
    each partition): each process logs when a partition is caught up and how long its
    records took since the first one (join and interpreter start excluded); the bench
    notes when each line arrives (the log's own times have whole seconds only).
    """
    import subprocess
    import sys

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
    last: dict[int, tuple[float, int, float]] = {}  # partition -> (arrival of its last catch-up line, records, seconds)
    lock = threading.Lock()

    def follow(stream) -> None:
        for raw in stream:
            m = _CAUGHT_UP.search(raw.decode(errors="replace"))
            if m:
                with lock:
                    last[int(m.group(1))] = (time.time(), int(m.group(2)), float(m.group(3)))

    procs = [subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config", str(d / "config.yaml"), "--stage", "1",
                               "--bootstrap-servers", bootstrap], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) for _ in range(processes)]
    readers = [threading.Thread(target=follow, args=(p.stdout,), daemon=True) for p in procs]
    for t in readers:
        t.start()
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with lock:
                if sum(v[1] for v in last.values()) >= n:
                    break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"{processes} processes did not catch up")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    span = max(v[0] for v in last.values()) - min(v[0] - v[2] for v in last.values())
    return n / span


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--windows", type=int, default=5, help="windows for the latency phase")
    ap.add_argument("--per-window", type=int, default=2000, help="events per window in the latency phase")
    ap.add_argument("--window-size", type=float, default=2.0)
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of each reader (median of paired ratios)")
    ap.add_argument("--confluent", action="store_true", help="also measure the confluent-kafka input backend")
    ap.add_argument("--processes", default="1,2,3", help="stage-1 process counts for the scaling table ('' = skip)")
    ap.add_argument("--write", action="store_true", help="write the docs/benchmarks/stream.md section `stream`")
    ap.add_argument("--floods", action="store_true", help="only the cost of one person's floods (prints a table)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the clipped-value warnings of the synthetic data are expected
    load_start = os.getloadavg()
    if args.floods:
        with tempfile.TemporaryDirectory() as d, EmbeddedBroker() as broker:
            fit_model(Path(d) / "model.json")
            got = flood_rates(broker.bootstrap_servers, Path(d), args.events, args.partitions, args.rounds)
        clean = np.median([c for _, c in got["clean"]])
        print(f"\n`python bench/bench_stream.py --floods --events {args.events} --rounds {args.rounds}` "
              f"(load {load_start[0]:.1f} -> {os.getloadavg()[0]:.1f} on 2 shared cores)\n")
        print("| input | events/s (median) | events per CPU-second (median) | per CPU-second, relative to clean |\n|---|---|---|---|")
        for k, v in got.items():
            wall, per_cpu = np.median([w for w, _ in v]), np.median([c for _, c in v])
            print(f"| {k} | {wall:,.0f} | {per_cpu:,.0f} | {per_cpu / clean:.2f} |")
        return

    with tempfile.TemporaryDirectory() as d, EmbeddedBroker() as broker:
        tmp = Path(d)
        fit_model(tmp / "model.json")
        bs = broker.bootstrap_servers
        topic = f"bench-{time.time_ns()}"
        now = time.time()
        if now % _DAY > _DAY - 1800:  # keep every event in the (one-day) window open while the rounds run
            time.sleep(_DAY - now % _DAY + 1)
        ts = time.time()
        produce_rate = produce(bs, topic, args.events, lambda i: ts, args.partitions)
        # reader -> its rate per round. Each round runs the readers in turn, in the opposite
        # order the next round, so a drift of the machine's load favours neither side.
        readers = {"bare": lambda: bare_consumer_rate(bs, topic, args.events),
                   "service": lambda: _service_rate(bs, tmp, topic, args.events)}
        if args.confluent:  # in this order, each ratio below is between neighbours
            readers["ck_service"] = lambda: _service_rate(bs, tmp, topic, args.events, backend="confluent")
            readers["ck_bare"] = lambda: bare_confluent_rate(bs, topic, args.events)
        readers["bare_orjson"] = lambda: bare_consumer_rate(bs, topic, args.events, loads=orjson.loads)
        rates: dict[str, list[float]] = {name: [] for name in readers}  # per wall-clock second
        cpu: dict[str, list[float]] = {name: [] for name in readers}  # per CPU second
        for r in range(args.rounds):
            for name in (list(readers) if r % 2 == 0 else list(readers)[::-1]):
                wall, per_cpu = readers[name]()
                rates[name].append(wall)
                cpu[name].append(per_cpu)
            print(f"round {r + 1}: " + ", ".join(f"{k} {rates[k][-1]:,.0f} ({cpu[k][-1]:,.0f}/cpu-s)" for k in rates),
                  flush=True)
        load_rounds = os.getloadavg()
        scaling = {m: process_scaling(bs, tmp, topic, args.events, m)
                   for m in (int(x) for x in args.processes.split(",") if x)}
        lat: list[float] = []
        if not args.skip_latency:
            lat, sizes, top_h = release_latencies(bs, tmp, args.per_window, args.windows, args.window_size)

    runs = lambda xs: ", ".join(f"{x:,.0f}" for x in xs)  # noqa: E731

    def ratio(num: str, den: str, of: dict[str, list[float]]) -> str:
        r = [a / b for a, b in zip(of[num], of[den])]
        return f"**{np.median(r):.2f}** ({min(r):.2f}-{max(r):.2f}: {', '.join(f'{x:.2f}' for x in r)})"

    def row(label: str, name: str) -> str:
        return (f"| {label} | {np.median(rates[name]):,.0f} | {runs(rates[name])} "
                f"| {np.median(cpu[name]):,.0f} | {runs(cpu[name])} |")

    def ratio_row(label: str, num: str, den: str) -> str:
        return f"| **{label}** | {ratio(num, den, rates)} | | {ratio(num, den, cpu)} | |"

    from kafka.record import util as kafka_record_util

    crc = "C extension `crc32c` active" if kafka_record_util.crc32c_c is not None else "pure-Python CRC (crc32c NOT installed)"
    lines = [
        "## Stream throughput and release latency",
        "",
        f"`OMP_NUM_THREADS=1 python bench/bench_stream.py --events {args.events} --partitions {args.partitions} "
        f"--windows {args.windows} --per-window {args.per_window} --window-size {args.window_size} "
        f"--rounds {args.rounds}{' --confluent' if args.confluent else ''} --write` "
        f"(embedded Tansu broker; kafka-python 3.0 with the {crc} for every kafka-python reader; the same "
        "consumer settings (`monitor.pipeline.clients.client_settings`) for the bare consumer and the service; "
        "rates from the first record to the last, group join excluded). "
        f"Each of {args.rounds} rounds runs every reader once over the same {args.events:,} events, in the "
        "opposite order the next round. A ratio is taken between the two runs of one round (adjacent in "
        "time); the figure is the median of those ratios, then (min-max: each round's). "
        "Rates per wall-clock second depend on how much CPU the machine's other jobs leave; rates per CPU "
        "second of the reading process (all its threads; the broker is another process) are the readers' "
        "own cost, which bounds them on an idle machine, and vary far less. "
        f"Load average (1/5/15 min) at the start: {load_start[0]:.2f}/{load_start[1]:.2f}/{load_start[2]:.2f}, "
        f"after the rounds: {load_rounds[0]:.2f}/{load_rounds[1]:.2f}/{load_rounds[2]:.2f} (2 cores, shared).",
        "",
        "| reader | events/s (median) | per round | events per CPU-second (median) | per round |",
        "|---|---|---|---|---|",
        f"| producer (for reference) | {produce_rate:,.0f} | | | |",
        row("bare `KafkaConsumer`, `json.loads` per record", "bare"),
        row("monitor service (kafka-python; `monitor run`'s both stages in one process): validate, score "
            "(grid-kNN), one event per entity per window, window", "service"),
        ratio_row("ratio service / bare", "service", "bare"),
        row("(for comparison) bare `KafkaConsumer`, `orjson.loads` per record", "bare_orjson"),
        ratio_row("(for comparison) ratio service / bare with orjson", "service", "bare_orjson"),
    ]
    if args.confluent:
        lines += [
            row("bare confluent-kafka `Consumer`, `json.loads` per record", "ck_bare"),
            row("monitor service, `stream.input_backend: confluent`", "ck_service"),
            ratio_row("ratio service confluent / service kafka-python", "ck_service", "service"),
            ratio_row("ratio service confluent / bare confluent", "ck_service", "ck_bare"),
        ]
    lines += [
        "",
        f"Service event statuses (every run must accept all events, or the bench fails): {STATUSES}. "
        "The machine is shared with other jobs, so absolute rates vary between runs and are below "
        "INFRA.md's idle figures; the paired ratio is what the run compares.",
    ]
    if scaling:
        lines += [
            "",
            f"Stage-1 throughput by number of `monitor run --stage 1` processes (separate processes, one "
            f"consumer group, {args.partitions} input partitions, the same {args.events:,} events; span from "
            "the first record to the last partition caught up, from the processes' log lines as they arrive; on this 2-core machine "
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
