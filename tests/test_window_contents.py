"""What a window holds does not depend on processing speed (docs/design.md#two-stages).

The same topic contents, produced on the same schedule relative to the window
boundaries, are processed once by a stage 1 that keeps up and once by a slowed one:
every poll is held back (an artificial delay in ``Stage1.ingest``, longer than the
allowed lateness, so events appended before a window's close are read after it), and
window W's shard is held back between the cut and the ship until the records appended
after the cut have been read. The windows must hold the same event ids, and with a
fixed seed the same released counts; the slow run's window is published late (counted)
instead (docs/scaling.md, "What a window holds").

The data carries what slowed stage 1 down before (one entity's flood of duplicates,
malformed messages between valid ones); records created after their window's close
(late for every reader); records created before W's close but appended after its cut
(a producer that held them back: late for every reader, never in W, although the slowed
reader reads them while W is still open); and records from a producer whose clock runs
ahead (CreateTime in the future), read at once by the fast reader and after their
CreateTime by the slow one: the acceptance horizon depends on the log, not on the read.
"""

from __future__ import annotations

import importlib.util
import json
import math
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from monitor.config import parse_config
from monitor.pipeline.publisher import WindowPublisher
from monitor.pipeline.service import MonitorService
from monitor.pipeline.stage1 import Stage1
from monitor.pipeline.broker import EMBEDDED_GROUP_SETTINGS as FAST_GROUP

pytestmark = pytest.mark.broker

FEATURES = [{"name": "hr", "min": 30, "max": 220}, {"name": "spo2", "min": 70, "max": 100}]
SIZE, LATENESS, GRACE = 2.0, 0.5, 1.0
DELAY_S = 1.5  # per poll in the slow run: more than the lateness, so the close passes unread events
AHEAD_S = 1.5  # how far the fast-clocked producer's CreateTime runs ahead
HOLD_S = 10.0  # the slow run holds W's shard back at most this long past W's close
SEED = 7
_HAS_CONFLUENT = importlib.util.find_spec("confluent_kafka") is not None

from tests.test_service import model_path  # noqa: E402,F401 - the same two-feature model fixture


def _config(tmp_path: Path, model_path: Path, tag: str, backend: str):
    return parse_config({
        "features": FEATURES,
        "model": {"path": str(model_path)},
        "window": {"size_seconds": SIZE, "allowed_lateness_seconds": LATENESS, "publish_delay_seconds": 0.0,
                   "release_grace_seconds": GRACE},
        "alarm": {"enabled": False},
        "report": {"top_h": 1, "every_seconds": SIZE},
        "budget": {"ledger": str(tmp_path / f"ledger-{tag}.sqlite"), "epsilon": 1000.0},
        "metrics": {"port": 0, "operational_port": 0},
        "stream": {"input_topic": f"events-{tag}", "alerts_topic": f"alerts-{tag}", "dead_letter_topic": f"dlq-{tag}",
                   "group_id": f"g-{tag}", "entity_field": "who", "timestamp_field": "ts", "kafka": FAST_GROUP,
                   "input_backend": backend},
    })


def _event(i: int, who: str, ts: float, rng: np.random.Generator, prefix: str) -> bytes:
    hr = float(rng.uniform(150, 210)) if rng.random() < 0.1 else float(rng.normal(75, 8))
    return json.dumps({"id": f"{prefix}{i}", "who": who, "ts": ts, "hr": round(hr, 2), "spo2": 96.0}).encode()


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def _run(bootstrap: str, tmp_path: Path, model_path: Path, *, slow: bool, backend: str, monkeypatch) -> dict:
    """One run: start the service, produce the same messages on the same schedule
    relative to the next window W, and return what was released."""
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    tag = ("slow-" if slow else "fast-") + uuid.uuid4().hex[:6]
    cfg = _config(tmp_path, model_path, tag, backend)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(cfg.stream.input_topic, 2, 1)])
    admin.close()

    ingested_after_close: list[int] = []  # records of window W handed to ingest after W's close
    after_cut_read_open: list[int] = []  # records appended after W's cut, handed to ingest while W was unshipped
    after_cut_read = threading.Event()
    original, original_ship = Stage1.ingest, Stage1.ship
    w_close = [math.inf]
    w_index = [math.inf]  # window W, chosen once the service is ready

    def delayed(self, batch):
        if any(batch.values()):
            time.sleep(DELAY_S)
            if time.time() > w_close[0]:
                ingested_after_close.append(sum(1 for recs in batch.values() for r in recs if b'"W' in (r.value or b"")))
            for tp, recs in batch.items():
                n = sum(1 for r in recs if b'"id": "A' in (r.value or b""))
                if n:
                    store = self.stores.get(tp)
                    if store is not None and store.next_index <= w_index[0]:
                        after_cut_read_open.append(n)
                    after_cut_read.set()
        return original(self, batch)

    def held_ship(self, now):
        # Between W's cut and its ship: keep W open until the records appended after the
        # cut have been read.
        t = time.time()
        if (w_close[0] <= t < w_close[0] + HOLD_S and not after_cut_read.is_set()
                and any(store.next_index <= w_index[0] for store in self.stores.values())):
            return 0
        return original_ship(self, now)

    if slow:
        monkeypatch.setattr(Stage1, "ingest", delayed)
        monkeypatch.setattr(Stage1, "ship", held_ship)
    # The same noise for the same window of the schedule in both runs, however many windows
    # stage 2 released before it (its first window follows the group join's timing).
    close = WindowPublisher.close

    def seeded_close(self, window):
        # A window that closes before W is chosen (w_index still inf) is not compared: any fixed seed will do.
        offset = round(window.start / SIZE) - w_index[0] if math.isfinite(w_index[0]) else 0
        self.releaser_noise.generator = np.random.default_rng([SEED, offset + 100])
        return close(self, window)

    monkeypatch.setattr(WindowPublisher, "close", seeded_close)
    audit = tmp_path / f"audit-{tag}.jsonl"
    releases: list[dict] = []
    service = MonitorService(cfg, bootstrap_servers=bootstrap, rng=SEED, audit_path=audit, on_release=releases.append)
    monkeypatch.setattr(WindowPublisher, "releaser_noise", service._noise, raising=False)
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _guard(service.run, errors), daemon=True)
    thread.start()
    try:
        assert service.wait_ready(30), "service not ready"
        w = math.floor(time.time() / SIZE) + 1
        w_index[0] = w
        w_start, w_end = w * SIZE, (w + 1) * SIZE
        w_close[0] = w_end + LATENESS
        assert time.time() < w_start, "started too late for the schedule"
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)
        topic = cfg.stream.input_topic
        rng = np.random.default_rng(SEED)
        # During W (the last batch 0.7 s before its close): 4 new people per batch, each twice or so (duplicates), a flood of one
        # person's duplicates, and a malformed message every 25 valid ones.
        _sleep_until(w_start + 0.05)
        i = 0
        for batch in range(30):  # the same messages in both runs, the last 0.3 s before the close
            _sleep_until(w_start + 0.05 + 0.06 * batch)
            for j in range(10):
                who = "flooder" if j % 3 == 0 else f"p{batch}.{j % 4}"
                ts = min(time.time(), w_end - 0.001)  # event time in W, record created before the close
                producer.send(topic, _event(i, who, ts, rng, "W"), key=who.encode())
                if i % 25 == 0:
                    producer.send(topic, b'{"id": "bad' + str(i).encode() + b'", "hr": ', key=who.encode())
                i += 1
            producer.flush()
            if batch == 15:  # about 1 s into W, well clear of W-1's close and cut
                # A producer whose clock runs AHEAD_S ahead, events timed near the end of W+1: within
                # the log's horizon (CreateTime, capped by W's close, + window + lateness), beyond the
                # one the old rule gave a reader that reads them at once (read time + window + lateness).
                sent = time.time()
                assert sent < w_start + 1.1, "the machine is too slow for this schedule"
                for j in range(5):
                    who = f"f{j}"
                    producer.send(topic, _event(j, who, w_start + 3.8, rng, "F"), key=who.encode(),
                                  timestamp_ms=int((sent + AHEAD_S) * 1000))
                # And beyond the log's horizon: rejected (bad_timestamp) by every reader.
                for j in range(3):
                    who = f"g{j}"
                    producer.send(topic, _event(j, who, w_start + 5.2, rng, "G"), key=who.encode(),
                                  timestamp_ms=int((sent + AHEAD_S) * 1000))
                producer.flush()
        assert time.time() < w_close[0] - 0.1, "the machine is too slow for this schedule: the runs' data would differ"
        # Once every partition's cut of W is recorded: records created before W's close (a
        # producer that held them back) but appended after the cut. Never in W.
        _sleep_until(w_close[0])
        stage = service.stage1
        deadline = time.time() + 5
        while time.time() < deadline and not (stage.stores and all(
                w in stage._cuts.get(tp, {}) or stage.stores[tp].next_index > w for tp in list(stage.stores))):
            time.sleep(0.005)
        for j in range(10):
            who = f"a{j}"
            producer.send(topic, _event(j, who, w_end - 0.2, rng, "A"), key=who.encode(),
                          timestamp_ms=int((w_end - 0.2) * 1000))
        producer.flush()
        # After W's close: events whose event time is in W but whose records are created
        # after the close: late for every reader.
        _sleep_until(w_close[0] + 0.3)
        for j in range(30):
            who = f"q{j}"
            producer.send(topic, _event(j, who, w_end - 0.5, rng, "L"), key=who.encode())
        # Window W+1: a few ordinary events.
        for j in range(20):
            who = f"r{j}"
            producer.send(topic, _event(j, who, time.time(), rng, "N"), key=who.encode())
        producer.flush()
        producer.close()
        deadline = time.time() + 60
        while time.time() < deadline and not any(r["window_start"] >= w_start + SIZE for r in releases):
            time.sleep(0.1)
        # The message says which run missed it and what stage 2 had released (an intermittent miss, 1 run in 6 or so).
        assert any(r["window_start"] >= w_start + SIZE for r in releases), (
            f"window W+1 not released ({tag}; released windows, counted from W: "
            f"{sorted(round((r['window_start'] - w_start) / SIZE) for r in releases)}; errors {errors!r})")
    finally:
        service.stop()
        thread.join(30)
    if errors:
        raise errors[0]
    lines = [json.loads(line) for line in audit.read_text().splitlines() if line.strip()]
    windows = {float(line["window_start"]): line for line in lines}
    alerts = {float(r["window_start"]): r for r in releases}
    return {"w": w_start, "windows": windows, "alerts": alerts, "ingested_after_close": ingested_after_close,
            "after_cut_read_open": after_cut_read_open,
            "late_publications": service.metrics.late_publications._value.get(), "counts": dict(service.counts)}


def _guard(fn, errors):
    try:
        fn()
    except BaseException as err:  # noqa: BLE001 - re-raised in the test thread
        errors.append(err)


@pytest.mark.parametrize("backend", ["kafka-python", pytest.param(
    "confluent", marks=pytest.mark.skipif(not _HAS_CONFLUENT, reason="confluent-kafka not installed (extra `confluent`)"))])
def test_window_contents_and_releases_do_not_depend_on_processing_speed(kafka_bootstrap, model_path, tmp_path,
                                                                         monkeypatch, backend):
    fast = _run(kafka_bootstrap, tmp_path, model_path, slow=False, backend=backend, monkeypatch=monkeypatch)
    monkeypatch.undo()
    slow = _run(kafka_bootstrap, tmp_path, model_path, slow=True, backend=backend, monkeypatch=monkeypatch)
    monkeypatch.undo()

    # The slowdown really pushed events of W past W's close, and the slowed reader read the
    # records appended after W's cut while W was still open (before, it counted them).
    assert sum(slow["ingested_after_close"]) > 0
    assert sum(slow["after_cut_read_open"]) > 0
    for run in (fast, slow):
        ids = run["windows"][run["w"]]["event_ids"]
        assert ids, "window W is empty"
        assert not any(i.startswith("L") for i in ids), "an event created after its window's close was counted"
        assert not any(i.startswith("A") for i in ids), "a record appended after the window's cut was counted"
        # One event per person: 4 per batch and the flooder.
        assert len(ids) == 30 * 4 + 1
        following = run["windows"][run["w"] + SIZE]["event_ids"]
        # The fast-clocked producer's events within the log's horizon are in W+1 for both readers;
        # those beyond it are in no window.
        assert sorted(i for i in following if i.startswith("F")) == [f"F{j}" for j in range(5)]
        assert not any(i.startswith("G") for w in run["windows"].values() for i in w["event_ids"])
    fw, sw = fast["windows"][fast["w"]], slow["windows"][slow["w"]]
    assert sorted(fw["event_ids"]) == sorted(sw["event_ids"])
    assert fw["n_events"] == sw["n_events"]
    fn = fast["windows"].get(fast["w"] + SIZE)
    sn = slow["windows"].get(slow["w"] + SIZE)
    assert fn is not None and sn is not None
    assert sorted(fn["event_ids"]) == sorted(sn["event_ids"])
    # Same seed for the same window: the released counts of W are the same.
    assert fast["alerts"][fast["w"]]["report"] == slow["alerts"][slow["w"]]["report"]
    # Both runs dead-lettered the same malformed messages and counted the same late events.
    for key in ("dead_letter", "late", "duplicate_entity", "accepted"):
        assert fast["counts"].get(key) == slow["counts"].get(key), key
    # The slow run published W late (counted), rather than releasing a smaller window.
    assert slow["late_publications"] >= 1
