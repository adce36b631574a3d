"""How long `monitor run`'s start-up re-read of the alarm's history takes (not a test: a timing).

Fills a topic on the embedded broker with what a restart rebuilds (``rebuilt_windows``: 600
five-minute windows, 2 days and 2 hours) of ``--people`` people, one event each per window, records the 600 windows
as released in a fresh ledger, and runs ``monitor.pipeline.history.rebuild_history`` as the
service does at start (read, validate, bound, score, learn), then the read alone.

    python bench/bench_history_rebuild.py --people 1500
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--people", type=int, default=1500)
    parser.add_argument("--partitions", type=int, default=1)
    args = parser.parse_args()

    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    from monitor.budget.accountant import BudgetAccountant
    from monitor.budget.ledger import WindowLedger
    from monitor.config import parse_config
    from monitor.data.vitals import VITAL_FEATURES, simulate_vitals
    from monitor.model import GridKNN
    from monitor.pipeline.broker import EmbeddedBroker
    from monitor.pipeline.events import EventSchema
    from monitor.pipeline.history import HistoryRead, rebuild_history
    from monitor.release import WindowReleaser

    work = Path(tempfile.mkdtemp(prefix="history-timing-"))
    _, X, _ = simulate_vitals(3000, rng=5)
    names = [n for n, _, _ in VITAL_FEATURES]
    model = GridKNN(epsilon=1.0, bounds=[(lo, hi) for _, lo, hi in VITAL_FEATURES], contamination=0.05,
                    random_state=0, feature_names=names).fit(X)
    model.save(work / "model.json")
    cfg = parse_config({
        "features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
        "model": {"path": str(work / "model.json")},
        "stream": {"entity_field": "device_id", "timestamp_field": "ts", "input_topic": "events"},
        "budget": {"ledger": str(work / "ledger.sqlite")},
    })
    size = cfg.window.size_seconds
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        KafkaAdminClient(bootstrap_servers=bootstrap).create_topics([NewTopic("events", args.partitions, 1)])
        ledger = WindowLedger(cfg.budget.ledger)
        releaser = WindowReleaser(cfg, BudgetAccountant.from_settings(ledger, cfg.budget), model, rng=0)
        reach = releaser.reference.rebuilt_windows
        end = float(int(time.time() // size) * size)
        first = end - reach * size
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, batch_size=1 << 20, enable_idempotence=False)
        rng = np.random.default_rng(1)
        began = time.monotonic()
        sent = 0
        for i in range(reach):
            start = first + i * size
            ids, W, _ = simulate_vitals(args.people, rng=rng, n_devices=args.people)
            ts = start + np.sort(rng.uniform(0, size, args.people))
            for device, row, t in zip(ids, W.tolist(), ts.tolist()):
                event = dict(zip(names, row), ts=t, device_id=device)
                producer.send("events", json.dumps(event).encode(), key=device.encode(), timestamp_ms=int(t * 1000))
            sent += args.people
            ledger.record_release(start, start + size, 0.0, 0.0, '{"alarm": false}')
        producer.flush()
        produced = time.monotonic() - began
        print(f"produced {sent} events of {reach} windows in {produced:.1f} s")
        schema = EventSchema.from_config(cfg)
        began = time.monotonic()
        out = rebuild_history(cfg, bootstrap, releaser, ledger, end, schema, embedded=False, timeout_s=3600)
        took = time.monotonic() - began
        print(f"rebuild (read, validate, bound, score, learn): {out.windows} windows, {out.events} events in {took:.1f} s")
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        read = HistoryRead(consumer, "events", schema, size, cfg.window.allowed_lateness_seconds,
                           [first + i * size for i in range(reach)], timeout_s=3600)
        began = time.monotonic()
        n = sum(1 for _ in read.windows())
        print(f"read alone: {n} windows, {read.events} events, {read.records} records in {time.monotonic() - began:.1f} s")
        consumer.close()
        print(f"peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        print(json.dumps({"people": args.people, "events": out.events, "rebuild_s": round(took, 1)}))


if __name__ == "__main__":
    main()
