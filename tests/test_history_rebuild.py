"""`monitor run` rebuilds the alarm's rhythm history at start from the input topic (a real broker).

A service releases some 1-second windows with the rhythm reference on, stops; a new service on
the same ledger and topic re-reads the topic before its first release and its reference holds
the same windows with the same units per person, with nothing charged or published for them.
"""

from __future__ import annotations

import json
import logging
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
from streamkit import finish_service as finish, start_service as start, two_feature_model

pytestmark = pytest.mark.broker

FEATURES = [{"name": "hr", "min": 30, "max": 220}, {"name": "spo2", "min": 70, "max": 100}]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return two_feature_model(tmp_path_factory.mktemp("model") / "model.json")


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
    reference = second.publisher.releaser.reference
    after = history(reference, only=set(before))  # the windows released before
    second.stop()
    finish(thread)

    assert rebuilt is not None and rebuilt.windows == len(released) and rebuilt.complete
    assert after == before
    # Runs after the restart are charged from the rebuilt span on at the earliest (what the history holds).
    assert reference.history_from == reference.window_index(rebuilt.span[0])
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

    # A stage-2-only process (the releaser's) re-reads the input topic too, without stage 1's group.
    third = MonitorService(cfg, bootstrap_servers=kafka_bootstrap, rng=3, stage="2")
    thread = start(third)
    deadline = time.monotonic() + 30
    while third.history is None and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
    assert third.history is not None and third.history.events == rebuilt.events
    assert history(third.publisher.releaser.reference, only=set(before)) == before
    third.stop()
    finish(thread)


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
    assert "17.75" in text and "docs/benchmarks/alarm-rhythm.md#a-restart-on-rhythmic-traffic" in text

    caplog.clear()  # the embedded broker restarts empty: nothing is read, the same line says why
    out = rebuild_history(cfg, None, restarted, ledger, now, EventSchema.from_config(cfg), embedded=True)
    assert out.windows == 0 and "embedded broker" in caplog.records[-1].getMessage()
    ledger.close()


def test_the_span_is_the_next_windows_reach_within_what_was_released():
    assert history_span(600.0, None, None) is None  # a first start: nothing lost
    assert history_span(600.0, 1000.0, 1000.0) == (400.0, 1000.0)
    assert history_span(600.0, 1000.0, 1500.0) == (900.0, 1000.0)  # downtime: only what the next window reads
    assert history_span(600.0, 1000.0, 1600.0) is None


class _Record:
    def __init__(self, partition: int, offset: int, created: float, value: bytes) -> None:
        self.partition, self.offset, self.timestamp, self.value = partition, offset, int(created * 1000), value


class _Log:
    """A consumer over in-memory partition logs, with what HistoryRead asks of kafka-python:
    ``log_start``: the offset retention deleted up to, per partition."""

    def __init__(self, logs: dict[int, list[tuple[float, dict | bytes]]], log_start: dict[int, int] | None = None,
                 per_poll: int = 3) -> None:
        from kafka.structs import TopicPartition

        self.tp = {p: TopicPartition("t", p) for p in logs}
        start = log_start or {}
        self.logs = {self.tp[p]: [_Record(p, o, c, v if isinstance(v, bytes) else json.dumps(v).encode())
                                  for o, (c, v) in enumerate(recs) if o >= start.get(p, 0)] for p, recs in logs.items()}
        self.start = {self.tp[p]: start.get(p, 0) for p in logs}
        self.pos = dict(self.start)
        self.paused: set = set()
        self.fetched: set = set()
        self.per_poll = per_poll

    def partitions_for_topic(self, topic):
        return set(tp.partition for tp in self.tp.values())

    def assign(self, tps):
        pass

    def offsets_for_times(self, times):
        from kafka.structs import OffsetAndTimestamp

        out = {}
        for tp, ms in times.items():
            hit = next((r for r in self.logs[tp] if r.timestamp >= ms), None)
            out[tp] = None if hit is None else OffsetAndTimestamp(hit.offset, hit.timestamp, 0)
        return out

    def beginning_offsets(self, tps):
        return {tp: self.start[tp] for tp in tps}

    def seek(self, tp, offset):
        self.pos[tp] = offset

    def highwater(self, tp):
        return self.start[tp] + len(self.logs[tp]) if tp in self.fetched else None

    def position(self, tp):
        return self.pos[tp]

    def pause(self, *tps):
        self.paused |= set(tps)

    def resume(self, *tps):
        self.paused -= set(tps)

    def poll(self, timeout_ms=0):
        out = {}
        for tp, recs in self.logs.items():
            if tp in self.paused:
                continue
            self.fetched.add(tp)
            got = [r for r in recs if r.offset >= self.pos[tp]][: self.per_poll]
            if got:
                out[tp] = got
                self.pos[tp] = got[-1].offset + 1
        return out


def _read(logs, starts, log_start=None, **kw):
    from monitor.pipeline.history import HistoryRead

    schema = EventSchema(["hr", "spo2"], timestamp_field="ts", entity_field="device")
    read = HistoryRead(_Log(logs, log_start), "t", schema, 10.0, 2.0, starts, **kw)
    return read, {w.start: list(zip(w.entities, w.X[:, 0].tolist())) for w in read.windows()}


def _ev(ts: float, device: str, hr: float = 75.0) -> dict:
    return {"hr": hr, "spo2": 96.0, "ts": ts, "device": device}


def test_the_reread_applies_stage_1s_window_rules_from_the_log():
    # Windows of 10 s, lateness 2 s: [100, 110) closes at 112, [110, 120) at 122.
    logs = {
        0: [(101.0, _ev(101.0, "a", 70)), (102.0, _ev(102.0, "a", 71)),  # a's second: a duplicate
            (103.0, b'{"hr": "high"}'),                                   # invalid: skipped
            (103.5, _ev(103.5, "b", 72)),
            (111.0, _ev(109.0, "c", 73)),                                 # late but before the close: kept
            (112.5, _ev(111.0, "d", 74)),                                 # the next window's
            (112.6, _ev(108.0, "e", 75)),                                 # created after [100, 110)'s close: late
            (114.0, _ev(160.0, "f", 76)),                                 # beyond the horizon (114 + 12)
            (123.0, _ev(119.0, "g", 77)),                                 # created after the last close: the end
            (124.0, _ev(119.5, "h", 78))],
        1: [(104.0, _ev(104.0, "a", 80)),                                 # a again, on a later partition: dropped
            (105.0, _ev(105.0, "i", 81)),
            (113.0, _ev(115.0, "j", 82))],
    }
    read, windows = _read(logs, [100.0, 110.0])
    assert windows == {100.0: [("a", 70.0), ("b", 72.0), ("c", 73.0), ("i", 81.0)], 110.0: [("d", 74.0), ("j", 82.0)]}
    assert read.events == 6 and not read.timed_out and read.trimmed_from is None


def test_the_reread_cuts_a_window_at_the_first_record_created_after_its_close():
    # A record created before the close but appended after a later one (held back by its producer):
    # the live cut (the log end at the close) left it out, and so does the re-read.
    logs = {0: [(101.0, _ev(101.0, "a")), (112.1, _ev(112.1, "x")), (111.9, _ev(109.0, "held")),
                (130.0, _ev(130.0, "z"))]}
    _, windows = _read(logs, [100.0, 110.0])
    assert [e for e, _ in windows[100.0]] == ["a"] and [e for e, _ in windows[110.0]] == ["x"]


def test_windows_retention_may_have_touched_are_not_learnt():
    logs = {0: [(t, _ev(t, f"p{i}")) for i, t in enumerate([101.0, 111.0, 121.0, 131.0, 141.0])]}
    # Retention deleted the first two records: what [100, 110) and [110, 120) held is unknown.
    # A record of [130, 140) may have been created from 118 on (its horizon), before the first kept one.
    read, windows = _read(logs, [100.0, 110.0, 120.0, 130.0, 140.0], log_start={0: 2})
    assert sorted(windows) == [140.0] and read.skipped == 4 and read.trimmed_from == 121.0
    read, windows = _read(logs, [100.0, 110.0, 120.0, 130.0, 140.0])  # nothing deleted: every window
    assert sorted(windows) == [100.0, 110.0, 120.0, 130.0, 140.0] and read.skipped == 0


def test_a_read_past_its_time_budget_learns_only_the_windows_read_completely():
    logs = {0: [(100.0 + i, _ev(100.0 + i, f"p{i}")) for i in range(40)]}
    read, windows = _read(logs, [100.0, 110.0, 120.0], timeout_s=0.0)
    assert read.timed_out and len(windows) < 3
