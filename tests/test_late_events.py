"""Late events (a device clock reset to 0, yesterday's data) are dead-lettered and logged,
not only counted; events read again after a restart are not called late arrivals."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from monitor.config import parse_config
from monitor.pipeline.broker import EMBEDDED_GROUP_SETTINGS as FAST_GROUP
from monitor.pipeline.windows import WindowStore
from streamkit import two_feature_model

pytestmark = pytest.mark.broker


def test_select_names_the_events_that_came_after_their_close_not_those_read_again():
    store = WindowStore(size=10, allowed_lateness=2, first_start=100)
    ts = np.array([0.0, 95.0, 105.0, 96.0])
    # ts 0 appended now; 95 appended after its close (102); 105 on time; 96 appended at 99,
    # before its close: a record of a window before this store's first one, read again
    created = np.array([106.0, 106.0, 106.0, 99.0])
    sel = store.select(ts, created=created)
    assert sel.counts == {"late": 3, "accepted": 1}
    assert sel.arrived_late.tolist() == [0, 1]
    assert store.select(np.array([107.0]), created=np.array([107.0])).arrived_late is None
    assert store.select(np.array([108.0, 109.0]), past_cut=np.array([False, True])).arrived_late.tolist() == [1]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return two_feature_model(tmp_path_factory.mktemp("model") / "model.json")


def test_late_events_go_to_the_dead_letter_topic_with_reason_late_and_one_log_line(tmp_path, model_path,
                                                                                   kafka_bootstrap, caplog):
    from kafka import KafkaConsumer, KafkaProducer

    from monitor.pipeline.service import MonitorService

    tag = uuid.uuid4().hex[:8]
    config = parse_config({
        "features": [{"name": "hr", "min": 30, "max": 220}, {"name": "spo2", "min": 70, "max": 100}],
        "model": {"path": str(model_path)},
        "window": {"size_seconds": 2.0, "allowed_lateness_seconds": 0.5, "publish_delay_seconds": 0.0},
        "alarm": {"enabled": False},
        "report": {"top_h": 1, "every_seconds": 2.0},
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "epsilon": 100.0},
        "metrics": {"port": 0, "operational_port": 0},
        "stream": {"input_topic": f"late-{tag}", "alerts_topic": f"alerts-{tag}", "dead_letter_topic": f"dlq-{tag}",
                   "group_id": f"g-{tag}", "kafka": FAST_GROUP},
    })
    service = MonitorService(config, bootstrap_servers=kafka_bootstrap, rng=0)
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run(service, errors), daemon=True)
    caplog.set_level(logging.WARNING, logger="monitor.stream")
    thread.start()
    try:
        assert service.wait_ready(60), "the service did not get ready"
        now = time.time()
        late = [0.0, 0.0, now - 86_400.0, now - 86_400.5, now - 30.0]
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
        for i, ts in enumerate(late):
            producer.send(config.stream.input_topic, json.dumps({"hr": 75.0, "spo2": 96.0, "ts": ts, "id": f"late{i}"}).encode())
        for i in range(5):
            producer.send(config.stream.input_topic, json.dumps({"hr": 75.0, "spo2": 96.0, "ts": time.time(), "id": f"ok{i}"}).encode())
        producer.flush()
        producer.close()
        consumer = KafkaConsumer(config.stream.dead_letter_topic, bootstrap_servers=kafka_bootstrap,
                                 auto_offset_reset="earliest", group_id=None)
        dead: list = []
        deadline = time.monotonic() + 30
        while len(dead) < len(late) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                dead.extend(records)
        consumer.close()
        ops = service.metrics.operational
        accepted = ops.get_sample_value("dp_monitor_events_total", {"status": "accepted"})
    finally:
        service.stop()
        thread.join(30)
    assert not errors, errors
    assert sorted(json.loads(r.value)["id"] for r in dead) == [f"late{i}" for i in range(len(late))]
    headers = [dict(r.headers) for r in dead]
    assert {h["reason"] for h in headers} == {b"late"}
    zero = next(h for r, h in zip(dead, headers) if json.loads(r.value)["id"] == "late0")
    assert b"event time 0.000 (1970-01-01T00:00:00Z) is in the window [1970-01-01T00:00:00Z" in zero["detail"], zero
    assert ops.get_sample_value("dp_monitor_dead_letters_total", {"reason": "late"}) == len(late)
    assert ops.get_sample_value("dp_monitor_events_total", {"status": "late"}) == len(late)
    # each event has one status: late ones are not also counted as dead letters
    assert ops.get_sample_value("dp_monitor_events_total", {"status": "dead_letter"}) == 0
    assert accepted == 5
    lines = [r.getMessage() for r in caplog.records if "reason late" in r.getMessage()]
    assert lines, [r.getMessage() for r in caplog.records]
    assert "(field 'ts')" in lines[0] and "allowed_lateness_seconds" in lines[0], lines[0]
    assert "1970" not in lines[0] and "86400" not in lines[0]  # the cause, never the value
    assert sum(int(line.split()[0]) for line in lines) == len(late)  # rate-limited: counts, not a line per event
    assert len(lines) <= 2, lines


def _run(service, errors: list) -> None:
    try:
        service.run()
    except BaseException as err:  # noqa: BLE001 - asserted in the test thread
        errors.append(err)
