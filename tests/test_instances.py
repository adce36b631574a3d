"""Several instances in one consumer group (README "Several instances (one consumer group)").

Two ``monitor run`` processes in the same group on one broker, each with its own config,
ledger, audit file, alerts topic and metrics port 0; an input topic with 2 partitions,
created beforehand; events keyed by entity (``device_id``, also ``stream.entity_field``),
so each entity's events go to one partition. Once both instances hold one partition each,
events are produced in real time for about 9 one-second windows. Afterwards:

- each instance held exactly one partition (its log) and released windows (its audit
  file), and every event it counted came from that partition;
- over the union of both audit files (windows keyed by (instance, window_start)) every
  produced event is counted exactly once, and no event id is in both instances;
- each entity appears in the windows of at most one instance;
- each instance's ledger has every window once (consecutive), each charged the window
  cost, so its spend is windows x cost (the i-th alert states i x cost);
- each instance's alerts topic holds its ledger's windows, byte for byte, once each.
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamkit import (
    ServiceProcess,
    audit_windows,
    check_alerts_match_ledger,
    check_budget_spent,
    check_events_counted_once,
    check_ledger_schedule,
    create_topic,
    encode,
    ledger_rows,
    make_producer,
    read_audit,
    read_topic,
    require_service,
    valid_event,
    wait_for,
    window_cost,
    write_config,
    write_model,
)

pytestmark = [pytest.mark.slow, pytest.mark.broker]

SEED = 20261122
WINDOW = 1.0
LATENESS = 2.0  # generous: on a loaded 2-core machine a real-time event may take a while
PRODUCE_SECONDS = 9.0  # about 9 windows of events
RATE = 20.0  # events per second
DEVICES = 40  # round robin: each device sends every DEVICES / RATE = 2 s
PREFIX = "multi"
INSTANCES = ("a", "b")


class KeyedPacer:
    """Real-time events keyed by ``device_id`` (streamkit's EventPacer sends no key).

    Devices take turns, and a device never sends twice within one window length plus a
    margin, so the per-window entity bound (first event per entity kept) drops nothing
    and every event must be counted. Records ``entity`` and ``partition`` of each
    acknowledged id.
    """

    def __init__(self, bootstrap: str, topic: str, rate: float, seed: int) -> None:
        self.topic, self.interval = topic, 1.0 / rate
        self.rng = random.Random(seed)
        self.producer = make_producer(bootstrap)
        self.entity: dict[str, str] = {}
        self.partition: dict[str, int] = {}
        self.last_ts = 0.0
        self._futures: list[tuple[str, Any]] = []
        self._last_by_device: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="keyed-pacer", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> "KeyedPacer":
        self._thread.start()
        return self

    def _loop(self) -> None:
        try:
            n = 0
            next_t = time.monotonic()
            while not self._stop.is_set():
                device = f"dev-{n % DEVICES:02d}"
                wait = self._last_by_device.get(device, -1e9) + 1.1 * WINDOW - time.time()
                if wait > 0:
                    time.sleep(wait)
                now = time.time()
                event_id = f"m-{n:06d}"
                event = {**valid_event(event_id, now, self.rng), "device_id": device}
                fut = self.producer.send(self.topic, key=device.encode(), value=encode(event))
                self._futures.append((event_id, fut))
                self.entity[event_id] = device
                self._last_by_device[device] = now
                self.last_ts = now
                n += 1
                next_t += self.interval
                delay = next_t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        except BaseException as err:  # surfaced by stop()
            self.error = err

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        try:
            self.producer.flush(timeout=30)
            for event_id, fut in self._futures:
                self.partition[event_id] = fut.get(timeout=30).partition  # raises if refused
        finally:
            self.producer.close(timeout=5)
        if self.error:
            raise self.error


def instance_config(directory: Path, bootstrap: str, model: Path, name: str) -> Path:
    """streamkit's config (its own ledger, metrics port 0), same input topic and group,
    the entity field, and an alerts topic of the instance's own."""
    directory.mkdir(parents=True, exist_ok=True)
    path = write_config(directory, bootstrap=bootstrap, model_path=model, prefix=PREFIX,
                        window_seconds=WINDOW, lateness_seconds=LATENESS, metrics_port=0)
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["stream"]["entity_field"] = "device_id"
    config["stream"]["alerts_topic"] = f"{PREFIX}.alerts.{name}"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def assigned(service: ServiceProcess) -> list[int] | None:
    """The partitions of the service's last assignment, from its log (None before one)."""
    path = service._log_path
    log = path.read_text(errors="replace") if path and path.exists() else ""
    events = list(re.finditer(r"(assigned|revoked) partitions \[([\d, ]*)\]", log))
    if not events or events[-1].group(1) == "revoked":
        return None
    return [int(p) for p in events[-1].group(2).replace(" ", "").split(",") if p]


def make_services(tmp_path: Path, bootstrap: str) -> tuple[dict, dict, dict]:
    """Per instance: its config, audit file and (not yet started) service process."""
    model = write_model(tmp_path / "model.json", seed=SEED)
    create_topic(bootstrap, f"{PREFIX}.events", partitions=2)
    configs = {name: instance_config(tmp_path / name, bootstrap, model, name) for name in INSTANCES}
    audits = {name: tmp_path / name / "audit.jsonl" for name in INSTANCES}
    services = {name: ServiceProcess(configs[name], bootstrap, audits[name], seed=SEED + i, logs=tmp_path / name / "logs")
                for i, name in enumerate(INSTANCES)}
    return configs, audits, services


def stop_all(services: dict) -> None:
    """SIGTERM every instance first (so none takes over another's partition), then wait.

    Waiting rather than terminate(): a second SIGTERM during interpreter shutdown, when
    Python has restored the default handler, would kill the process with -15.
    """
    for s in services.values():
        s.ensure_alive()
        s.proc.send_signal(signal.SIGTERM)
    for s in services.values():
        assert s.proc.wait(30) == 0, s.log_tail()


def wait_for_last_window(audits: dict, last_ts: float, logs) -> None:
    """Until every instance has audited the window that holds the last event sent."""
    wait_for(lambda: all(any(float(w["window_end"]) > last_ts for w in read_audit(audits[n])) for n in INSTANCES),
             30, "the window of the last event in both instances", interval=0.1, on_timeout=logs)


@contextmanager
def cleanup(services: dict, pacer: "KeyedPacer"):
    """Whatever happens inside: no service process and no producer thread outlives the test."""
    try:
        yield
    finally:
        for s in services.values():
            s.cleanup()
        if not pacer._stop.is_set():
            pacer.stop()


def test_two_instances_split_partitions_and_entities(tmp_path, fresh_broker):
    require_service()
    t0 = time.monotonic()
    bootstrap = fresh_broker.bootstrap_servers
    configs, audits, services = make_services(tmp_path, bootstrap)
    pacer = KeyedPacer(bootstrap, f"{PREFIX}.events", rate=RATE, seed=SEED)
    logs = lambda: "\n".join(s.log_tail() for s in services.values())  # noqa: E731
    with cleanup(services, pacer):
        for s in services.values():
            s.start()
        # Both in the group, one partition each, and releasing: only then produce, so no
        # event is read during the join's rebalance.
        def settled() -> bool:
            parts = {name: assigned(s) for name, s in services.items()}
            return (all(p is not None and len(p) == 1 for p in parts.values())
                    and sorted(sum(parts.values(), [])) == [0, 1])
        wait_for(settled, 40, "one partition for each instance", interval=0.1, on_timeout=logs)
        counts = {name: len(read_audit(audits[name])) for name in INSTANCES}
        wait_for(lambda: all(len(read_audit(audits[n])) > counts[n] for n in INSTANCES), 20,
                 "a release from each instance after the assignment", interval=0.1, on_timeout=logs)
        partitions = {name: assigned(s)[0] for name, s in services.items()}

        pacer.start()
        time.sleep(PRODUCE_SECONDS)
        pacer.stop()
        wait_for_last_window(audits, pacer.last_ts, logs)
        for name, s in services.items():
            s.ensure_alive()
            # Still the assignment the events were produced under: no rebalance happened.
            assert assigned(s) == [partitions[name]], f"instance {name} was rebalanced\n{s.log_tail()}"
        stop_all(services)

    produced = set(pacer.entity)
    assert len(produced) >= PRODUCE_SECONDS * RATE * 0.5
    by_partition = Counter(pacer.partition.values())
    assert set(by_partition) == {0, 1}, f"events reached partitions {dict(by_partition)} only"
    cost = window_cost(configs["a"])

    windows: dict[str, dict[float, dict]] = {}
    stats: dict[str, dict] = {}
    for name in INSTANCES:
        lines = read_audit(audits[name])
        assert lines, f"instance {name} released nothing"
        windows[name] = audit_windows(lines)
        assert len(lines) == len(windows[name]), f"instance {name} audited a window twice without a crash"
        # Every event of the instance's partition, and none of the other's.
        mine = {i for i in produced if pacer.partition[i] == partitions[name]}
        counted = check_events_counted_once(windows[name], mine, WINDOW, note=f"(instance {name})")
        assert counted == len(mine) > 0

        entries = ledger_rows(tmp_path / name / "ledger.sqlite")
        starts = check_ledger_schedule(entries, WINDOW, cost)
        assert set(starts) == set(windows[name]), f"instance {name}: audited and ledger windows differ"
        spent = check_budget_spent(entries, cost)
        assert abs(spent - len(starts) * cost[0]) < 1e-6

        alerts = read_topic(bootstrap, f"{PREFIX}.alerts.{name}")
        s = check_alerts_match_ledger(alerts, entries)
        assert s["windows"] == s["records"] == len(starts) and s["republished"] == 0
        stats[name] = {"windows": len(starts), "events": counted, "spent": spent, "alerts": s["records"],
                       "partition": partitions[name], "first": min(starts), "last": max(starts)}

    # The union over both instances, windows keyed by (instance, window_start): each
    # produced event exactly once, no id in both instances.
    seen = Counter(i for name in INSTANCES for line in windows[name].values() for i in line["event_ids"])
    assert set(seen) == produced, f"missing {sorted(produced - set(seen))[:5]}, extra {sorted(set(seen) - produced)[:5]}"
    assert max(seen.values()) == 1, f"counted twice: {[i for i, c in seen.items() if c > 1][:5]}"
    ids = {name: {i for line in windows[name].values() for i in line["event_ids"]} for name in INSTANCES}
    assert not ids["a"] & ids["b"]
    # Each entity in one instance only (parallel composition holds per person).
    entities = {name: {pacer.entity[i] for i in ids[name]} for name in INSTANCES}
    assert entities["a"] and entities["b"]
    assert not entities["a"] & entities["b"], f"entities in both instances: {sorted(entities['a'] & entities['b'])}"
    assert len(entities["a"] | entities["b"]) == DEVICES
    # Same event-time grid in both: the windows overlap in time, over disjoint people.
    overlap = set(windows["a"]) & set(windows["b"])
    assert len(overlap) >= PRODUCE_SECONDS - 1

    print(f"\ninstances: {len(produced)} events from {DEVICES} devices over 2 partitions {dict(by_partition)}; "
          + "; ".join(f"{n}: partition {st['partition']}, {st['windows']} windows ({st['alerts']} alerts), "
                      f"{st['events']} events of {len(entities[n])} devices, spent {st['spent']:.3f} = "
                      f"{st['windows']} x {cost[0]:g}" for n, st in stats.items())
          + f"; {len(overlap)} window starts in both; {time.monotonic() - t0:.1f} s")


def test_an_instance_joining_mid_stream_loses_and_repeats_nothing(tmp_path, fresh_broker):
    """Instance b joins while events flow: the rebalance hands one partition over.

    kafka-python revokes every partition of a and re-assigns one; a must read again the
    events it dropped from its open windows (and close no window before it has), and b
    must count the events of windows that are still open, not treat them as late. Every produced event is counted exactly once
    over both instances. (During the handoff one person's events can reach both instances
    in different windows; the README says what that costs.)
    """
    require_service()
    bootstrap = fresh_broker.bootstrap_servers
    configs, audits, services = make_services(tmp_path, bootstrap)
    pacer = KeyedPacer(bootstrap, f"{PREFIX}.events", rate=RATE, seed=SEED + 1)
    logs = lambda: "\n".join(s.log_tail() for s in services.values())  # noqa: E731
    with cleanup(services, pacer):
        services["a"].start()
        wait_for(lambda: assigned(services["a"]) == [0, 1], 40, "both partitions for a", interval=0.1, on_timeout=logs)
        wait_for(lambda: read_audit(audits["a"]), 20, "a first release", interval=0.1, on_timeout=logs)
        pacer.start()
        time.sleep(PRODUCE_SECONDS / 3)
        services["b"].start()  # joins while events flow
        wait_for(lambda: assigned(services["b"]) is not None and assigned(services["a"]) is not None
                 and len(assigned(services["a"])) == 1, 40, "the rebalance", interval=0.1, on_timeout=logs)
        time.sleep(PRODUCE_SECONDS * 2 / 3)
        pacer.stop()
        wait_for_last_window(audits, pacer.last_ts, logs)
        stop_all(services)

    produced = set(pacer.entity)
    assert len(produced) >= PRODUCE_SECONDS * RATE * 0.5
    cost = window_cost(configs["a"])
    seen: Counter[str] = Counter()
    for name in INSTANCES:
        for line in audit_windows(read_audit(audits[name])).values():
            seen.update(line["event_ids"])
        entries = ledger_rows(tmp_path / name / "ledger.sqlite")
        starts = check_ledger_schedule(entries, WINDOW, cost)
        assert abs(check_budget_spent(entries, cost) - len(starts) * cost[0]) < 1e-6
    missing = sorted(produced - set(seen))
    assert not missing, (f"{len(missing)} events never counted, e.g. {missing[:5]} on partitions "
                         f"{sorted(Counter(pacer.partition[i] for i in missing).items())}\n{logs()}")
    assert set(seen) == produced
    assert max(seen.values()) == 1, f"counted twice: {[i for i, c in seen.items() if c > 1][:5]}"
