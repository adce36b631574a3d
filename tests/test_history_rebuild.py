"""`monitor run` rebuilds the alarm's rhythm history at start from the input topic (a real broker).

A service releases some 1-second windows with the rhythm reference on, stops; a new service on
the same ledger and topic re-reads the topic before its first release and its reference holds
the same windows with the same units per person, with nothing charged or published for them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

from monitor.budget.accountant import BudgetAccountant
from monitor.budget.ledger import WindowLedger
from monitor.config import parse_config
from monitor.pipeline.broker import EMBEDDED_GROUP_SETTINGS as FAST_GROUP
from monitor.pipeline.events import EventSchema
from monitor.pipeline.history import history_span, rebuild_history
from monitor.pipeline.service import MonitorService
from monitor.pipeline.windows import ClosedWindow

pytestmark = pytest.mark.broker

FEATURES = [{"name": "hr", "min": 30, "max": 220}, {"name": "spo2", "min": 70, "max": 100}]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    from monitor.model import GridKNN

    path = tmp_path_factory.mktemp("model") / "model.json"
    X = np.random.default_rng(0).normal([75, 96], [8, 1.5], size=(2000, 2))
    GridKNN(epsilon=1.0, bounds=[(30, 220), (70, 100)], contamination=0.05, random_state=0,
            feature_names=["hr", "spo2"]).fit(X).save(path)
    return path


def make_config(tmp_path: Path, model_path: Path, tag: str):
    # The alarm as shipped (follow_rhythm on, warming up: the reference learns every window).
    return parse_config({
        "features": FEATURES,
        "model": {"path": str(model_path)},
        "window": {"size_seconds": 1.0, "allowed_lateness_seconds": 0.5, "publish_delay_seconds": 0.0,
                   "release_grace_seconds": 5.0},
        "report": {"on_alarm": False},
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "epsilon": 10_000.0},
        "metrics": {"port": 0, "operational_port": 0},
        "stream": {"input_topic": f"hist-{tag}", "alerts_topic": f"alerts-{tag}", "dead_letter_topic": f"dlq-{tag}",
                   "group_id": f"g-{tag}", "entity_field": "device", "timestamp_field": "ts", "kafka": FAST_GROUP},
    })


def start(service: MonitorService) -> threading.Thread:
    errors: list[BaseException] = []

    def target():
        try:
            service.run()
        except BaseException as err:  # noqa: BLE001 - re-raised in the test thread
            errors.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def finish(thread: threading.Thread, timeout: float = 30.0) -> None:
    thread.join(timeout)
    assert not thread.is_alive(), "service did not stop"
    if thread.errors:  # type: ignore[attr-defined]
        raise thread.errors[0]  # type: ignore[attr-defined]


def history(ref, only=None) -> dict:
    """The reference's windows: index -> (sorted (entity, units), paged)."""
    names = {i: e for e, i in ref._ids.items()}
    return {k: (sorted(zip((names[int(u)] for u in ids), units.tolist())), paged)
            for k, (ids, units, paged) in ref._windows.items() if only is None or k in only}


def alert_starts(bootstrap: str, topic: str) -> list[float]:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None,
                             consumer_timeout_ms=1500)
    starts = [json.loads(r.value)["window_start"] for r in consumer]
    consumer.close()
    return starts


def test_a_restart_rebuilds_the_alarms_history_from_the_input_topic(kafka_bootstrap, model_path, tmp_path, caplog):
    tag = uuid.uuid4().hex[:8]
    cfg = make_config(tmp_path, model_path, tag)
    topic = cfg.stream.input_topic
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(topic, 2, 1)])  # two partitions: the merge in partition order
    admin.close()
    first = MonitorService(cfg, bootstrap_servers=kafka_bootstrap, rng=1)
    thread = start(first)
    assert first.wait_ready(30)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    rng = np.random.default_rng(3)
    t0, last_ts = time.time(), 0.0
    while time.time() < t0 + 3.5:  # 3 to 4 windows; each device several times a window (duplicates)
        for d in range(30):
            ts = time.time()
            hr = float(rng.normal(75, 8)) if d % 7 else float(rng.uniform(150, 200))  # some weigh in the alarm
            producer.send(topic, json.dumps({"hr": hr, "spo2": 96.0, "ts": ts, "device": f"d{d}"}).encode(),
                          key=f"d{d}".encode())
            last_ts = ts
        producer.send(topic, b'{"hr": "high"}', key=b"d1")  # invalid: dead-lettered, skipped by the rebuild
        time.sleep(0.1)
    producer.flush()
    producer.close()
    deadline = time.monotonic() + 20
    while not (first.ledger.last_window_end() or 0) > last_ts and time.monotonic() < deadline:
        time.sleep(0.05)
    first.stop()
    finish(thread)
    before = history(first.publisher.releaser.reference)
    ledger = WindowLedger(cfg.budget.ledger)
    released = [e for e in ledger.entries() if e.released]
    rows_before = {e.window_start: e for e in ledger.entries()}
    charges_before = ledger.span_charges()
    total_before = ledger.total_epsilon()
    ledger.close()
    assert len(released) >= 3 and sum(len(v[0]) for v in before.values()) >= 60  # windows that hold people
    assert all(len({e for e, _ in v[0]}) == len(v[0]) for v in before.values())  # one event per person a window

    caplog.set_level(logging.INFO, logger="monitor.stream")
    second = MonitorService(cfg, bootstrap_servers=kafka_bootstrap, rng=2)
    assert not second.history
    thread = start(second)
    deadline = time.monotonic() + 30
    while second.history is None and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
    rebuilt = second.history
    after = history(second.publisher.releaser.reference, only=set(before))  # the windows released before
    second.stop()
    finish(thread)

    assert rebuilt is not None and rebuilt.windows == len(released) and rebuilt.complete
    assert after == before
    assert rebuilt.events == sum(len(v[0]) for v in before.values())
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rebuilt the alarm's history")]
    assert len(line) == 1 and f"from {len(released)} windows ({rebuilt.events} events)" in line[0], line
    # Nothing charged, released or published again for the old windows.
    ledger = WindowLedger(cfg.budget.ledger)
    for start_, entry in rows_before.items():
        assert ledger.get(start_) == entry
    new_charges = [c for c in ledger.span_charges() if c not in charges_before]
    assert all(c[2] >= rows_before[max(rows_before)].window_end - 1e-9 for c in new_charges)
    new_windows = [e for e in ledger.entries() if e.window_start not in rows_before]
    assert ledger.total_epsilon() - total_before == pytest.approx(sum(e.epsilon for e in new_windows))
    ledger.close()
    starts = alert_starts(kafka_bootstrap, cfg.stream.alerts_topic)
    assert sorted(s for s in starts if s in rows_before) == sorted(e.window_start for e in released)


def _released_ledger(cfg, model, windows: int):
    """A ledger with ``windows`` released 1-second windows ending now, through the real releaser."""
    from monitor.release import WindowReleaser

    b = cfg.budget
    ledger = WindowLedger(b.ledger)
    accountant = BudgetAccountant.from_settings(ledger, b)
    releaser = WindowReleaser(cfg, accountant, model, rng=0)
    now = float(int(time.time()))
    for i in range(windows):
        s = now - windows + i
        X = np.random.default_rng(i).normal([75, 96], [8, 1.5], size=(5, 2))
        releaser.release(ClosedWindow(s, s + 1, X, np.zeros(5, bool), (), tuple(f"d{j}" for j in range(5))), s + 1)
    return ledger, accountant, now


def test_a_topic_without_the_span_logs_what_the_restart_costs(kafka_bootstrap, model_path, tmp_path, caplog):
    from monitor.model.file import load_configured
    from monitor.pipeline.clients import ensure_topics
    from monitor.release import WindowReleaser

    cfg = make_config(tmp_path, model_path, uuid.uuid4().hex[:8])
    model = load_configured(cfg)
    ledger, accountant, now = _released_ledger(cfg, model, 4)
    ensure_topics(kafka_bootstrap, [cfg.stream.input_topic], cfg.stream.kafka)  # a topic that holds nothing
    restarted = WindowReleaser(cfg, accountant, model, rng=1)
    charges = ledger.span_charges()
    caplog.set_level(logging.INFO, logger="monitor.stream")
    out = rebuild_history(cfg, kafka_bootstrap, restarted, ledger, now, EventSchema.from_config(cfg), embedded=False,
                          timeout_s=20)
    assert out is not None and out.windows == 0 and out.events == 0 and out.released == 4
    assert not restarted.reference._windows  # nothing learnt: not four empty windows
    assert ledger.span_charges() == charges
    lost = [r for r in caplog.records if "the alarm's history is lost" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING
    text = lost[0].getMessage()
    assert "holds no event of the 4 windows" in text and "plain baseline" in text and "first day's trend" in text
    assert "17.75" in text and "benchmarks/alarm-rhythm.md#a-restart-on-rhythmic-traffic" in text

    caplog.clear()  # the embedded broker restarts empty: nothing is read, the same line says why
    out = rebuild_history(cfg, None, restarted, ledger, now, EventSchema.from_config(cfg), embedded=True)
    assert out.windows == 0 and "embedded broker" in caplog.records[-1].getMessage()
    ledger.close()


def test_the_span_is_the_next_windows_reach_within_what_was_released():
    assert history_span(600.0, None, None) is None  # a first start: nothing lost
    assert history_span(600.0, 1000.0, 1000.0) == (400.0, 1000.0)
    assert history_span(600.0, 1000.0, 1500.0) == (900.0, 1000.0)  # downtime: only what the next window reads
    assert history_span(600.0, 1000.0, 1600.0) is None
