"""The vital-signs simulator, the bundled reference data, and `monitor simulate` on a real broker."""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pytest

from monitor.cli import main
from monitor.config import parse_config
from monitor.data import REFERENCE_CSV, load_reference
from monitor.data.vitals import VITAL_FEATURES, simulate_vitals, write_reference_csv
from monitor.errors import MonitorError
from monitor.stream.simulate import (
    MALFORMED_KINDS,
    AnomalyBurst,
    FakeClock,
    SimulationPlan,
    VitalsSource,
    resolve_bootstrap,
    run_simulation,
)

NAMES = [name for name, _, _ in VITAL_FEATURES]
LOW = np.array([lo for _, lo, _ in VITAL_FEATURES])
HIGH = np.array([hi for _, _, hi in VITAL_FEATURES])


def test_normal_readings_are_within_bounds_and_look_like_vitals():
    ids, X, anomalous = simulate_vitals(5000, rng=11)
    assert X.shape == (5000, 5) and not anomalous.any()
    assert len(set(ids)) == 200
    assert np.all((X >= LOW) & (X <= HIGH))
    mean = dict(zip(NAMES, X.mean(axis=0)))
    assert 95.5 < mean["spo2"] < 98.5
    assert 33.0 < mean["skin_temp"] < 35.0
    assert 60 < mean["heart_rate"] < 95
    # Activity drives heart rate and respiration, as in real vitals.
    corr = np.corrcoef(X, rowvar=False)
    assert corr[NAMES.index("heart_rate"), NAMES.index("activity")] > 0.5
    assert corr[NAMES.index("resp_rate"), NAMES.index("activity")] > 0.5


def test_burst_moves_spo2_and_heart_rate_only():
    _, X, anomalous = simulate_vitals(4000, rng=5, anomaly_fraction=0.1)
    assert 0.05 < anomalous.mean() < 0.15
    shift = X[anomalous].mean(axis=0) - X[~anomalous].mean(axis=0)
    scaled = dict(zip(NAMES, shift / (HIGH - LOW)))
    assert scaled["spo2"] < -0.25
    assert scaled["heart_rate"] > 0.25
    for other in ("skin_temp", "resp_rate", "activity"):
        assert abs(scaled[other]) < 0.05, other


def test_committed_reference_csv_is_the_generators_output(tmp_path):
    names, X = load_reference()
    assert names == NAMES
    assert X.shape == (4000, 5)
    assert np.all((X >= LOW) & (X <= HIGH))
    regenerated = write_reference_csv(tmp_path / "ref.csv")
    assert regenerated.read_text() == REFERENCE_CSV.read_text(), (
        "monitor/data/reference-vitals.csv is stale: python -m monitor.data.vitals monitor/data/reference-vitals.csv"
    )


def _run_fake(plan: SimulationPlan, seed: int = 3, n_devices: int = 50):
    sent: list[tuple[bytes | None, bytes]] = []
    stats = run_simulation(lambda k, v: sent.append((k, v)), plan, VitalsSource(n_devices=n_devices, seed=seed),
                           clock=FakeClock(), sleep=FakeClock.sleep)
    return stats, sent


def test_events_are_json_objects_within_bounds_and_paced_over_the_duration():
    stats, sent = _run_fake(SimulationPlan(rate=100, duration=5))
    assert stats.events == len(sent) == 500
    events = [json.loads(v) for _, v in sent]
    assert all(set(e) == {"device_id", "ts", *NAMES} for e in events)
    assert all(k == e["device_id"].encode() for (k, _), e in zip(sent, events))
    X = np.array([[e[n] for n in NAMES] for e in events])
    assert np.all((X >= LOW) & (X <= HIGH))
    ts = np.array([e["ts"] for e in events])
    assert np.all(np.diff(ts) >= 0)
    assert 4.5 < ts[-1] - ts[0] <= 5.1


def test_burst_is_confined_to_its_interval():
    plan = SimulationPlan(rate=100, duration=10, burst=AnomalyBurst(start=4, duration=2, fraction=0.2))
    stats, sent = _run_fake(plan)
    events = [json.loads(v) for _, v in sent]
    t0 = stats.started_at
    low_spo2 = [e["ts"] - t0 for e in events if e["spo2"] <= 92]
    assert stats.anomalous == len(low_spo2) > 20
    assert min(low_spo2) >= 4 - 0.06 and max(low_spo2) < 6 + 0.06


def test_malformed_messages_cover_every_reason_and_do_not_parse_as_valid_events():
    stats, sent = _run_fake(SimulationPlan(rate=200, duration=5, malformed_rate=0.2))
    assert set(stats.malformed) == set(MALFORMED_KINDS)
    assert 120 < stats.malformed_total < 280
    valid = 0
    for _, value in sent:
        try:
            e = json.loads(value)
        except ValueError:
            continue
        if (isinstance(e, dict) and isinstance(e.get("ts"), float)
                and all(isinstance(e.get(n), float) and np.isfinite(e[n]) for n in NAMES)):
            valid += 1
    assert valid == stats.events - stats.malformed_total


def test_simulate_without_a_broker_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("DP_MONITOR_RUN_DIR", str(tmp_path))  # no running monitor's broker to find
    cfg = parse_config({"features": [{"name": "spo2", "min": 70, "max": 100}]})
    with pytest.raises(MonitorError, match="needs a broker"):
        resolve_bootstrap(None, cfg)
    pinned = parse_config({"features": [{"name": "spo2", "min": 70, "max": 100}], "stream": {"embedded_broker_port": 9093}})
    assert resolve_bootstrap(None, pinned) == "127.0.0.1:9093"
    assert resolve_bootstrap("kafka:9092", pinned) == "kafka:9092"


def test_simulate_finds_the_embedded_broker_of_the_running_monitor_of_its_config(tmp_path, monkeypatch):
    """`monitor run` records its embedded broker (monitor.pipeline.broker.BrokerClaim) by its ledger:
    the simulator finds it on whatever port it took, and only for the same config."""
    from monitor.pipeline.broker import EmbeddedBroker

    monkeypatch.setenv("DP_MONITOR_RUN_DIR", str(tmp_path / "run"))
    ledger = tmp_path / "ledger.sqlite"
    cfg = parse_config({"features": [{"name": "spo2", "min": 70, "max": 100}], "budget": {"ledger": str(ledger)}})
    other = parse_config({"features": [{"name": "spo2", "min": 70, "max": 100}],
                          "budget": {"ledger": str(tmp_path / "other.sqlite")}})
    with EmbeddedBroker() as broker:
        broker.claim(ledger)
        assert resolve_bootstrap(None, cfg) == broker.bootstrap_servers
        with pytest.raises(MonitorError, match="needs a broker"):
            resolve_bootstrap(None, other)
    with pytest.raises(MonitorError, match="needs a broker"):  # stopped: its record is gone
        resolve_bootstrap(None, cfg)


def test_the_simulators_producer_goes_on_through_a_restart_of_the_embedded_broker():
    """The embedded broker restarts empty with `monitor run`: an idempotent producer's id is then
    unknown and every send is refused; the simulator's producer must carry on."""
    from kafka.errors import KafkaError

    from monitor.pipeline.broker import EmbeddedBroker, free_port
    from monitor.stream.simulate import open_producer

    port = free_port()
    broker = EmbeddedBroker(port=port).start()
    producer = open_producer(broker.bootstrap_servers, {"request_timeout_ms": 5000, "reconnect_backoff_max_ms": 500})
    try:
        for i in range(5):
            producer.send("sim-restart", value=f"before {i}".encode()).get(timeout=30)
        broker.kill()
        broker = EmbeddedBroker(port=port).start()
        futures = []
        for i in range(100):
            futures.append(producer.send("sim-restart", value=f"after {i}".encode()))
            time.sleep(0.01)
        acked = 0
        for future in futures:
            try:
                future.get(timeout=30)
                acked += 1
            except KafkaError:
                pass  # Tansu refuses a few of the first sends after its restart (UnknownError)
        # kafka-python's default idempotent producer: 0 of them (tests/test_first_hour.py)
        assert acked >= 90, f"{acked} of 100 sends acknowledged after the restart"
    finally:
        producer.close(timeout=1)
        broker.stop()


def _read_topic(bootstrap: str, topic: str, expect: int, timeout: float = 15.0) -> list[bytes]:
    """Every message of ``topic``, read without a consumer group (no join delay), then
    half a second more to catch any message beyond ``expect``."""
    import time

    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        values: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(values) < expect and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                values.extend(r.value for r in records)
        for records in consumer.poll(timeout_ms=500).values():
            values.extend(r.value for r in records)
        return values
    finally:
        consumer.close()


@pytest.mark.broker
def test_monitor_simulate_produces_the_requested_events(kafka_bootstrap, tmp_path):
    topic = f"sim-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "config.yaml"
    config.write_text(
        "features:\n"
        + "".join(f"  - {{name: {n}, min: {lo}, max: {hi}}}\n" for n, lo, hi in VITAL_FEATURES)
        + f"stream: {{input_topic: {topic}, entity_field: device_id}}\n"
    )
    rc = main(["simulate", "--config", str(config), "--bootstrap-servers", kafka_bootstrap,
               "--rate", "400", "--duration", "2", "--malformed-rate", "0.1", "--seed", "4"])
    assert rc == 0
    values = _read_topic(kafka_bootstrap, topic, expect=800)
    assert len(values) == 800
    parsed = []
    for v in values:
        try:
            parsed.append(json.loads(v))
        except ValueError:
            pass
    good = [e for e in parsed if isinstance(e, dict) and all(isinstance(e.get(n), float) and np.isfinite(e[n]) for n in NAMES)
            and isinstance(e.get("ts"), float)]
    assert 600 < len(good) < 800  # about 10 % malformed
    assert len({e["device_id"] for e in good}) == 200


# --- the user's own rows, and anomalies that look like real ones ---------------------


def _rows_run(plan: SimulationPlan, normal, anomalous, features, seed: int = 4):
    from monitor.stream.simulate import RowSource

    sent: list[bytes] = []
    src = RowSource(normal, anomalous, features, n_devices=40, seed=seed)
    stats = run_simulation(lambda k, v: sent.append(v), plan, src, clock=FakeClock(), sleep=FakeClock.sleep)
    return stats, [json.loads(v) for v in sent]


def test_row_traffic_sends_the_users_rows_and_the_burst_sends_anomalous_rows():
    rng = np.random.default_rng(0)
    normal = np.round(rng.normal(0.0, 1.0, size=(300, 2)), 3)
    anomalous = np.round(rng.normal(8.0, 0.5, size=(30, 2)), 3)
    features = [("a", -20, 20), ("b", -20, 20)]
    plan = SimulationPlan(rate=100, duration=10, burst=AnomalyBurst(start=4, duration=2, fraction=0.25, kind="rows"))
    stats, events = _rows_run(plan, normal, anomalous, features)
    X = np.array([[e["a"], e["b"]] for e in events])
    normal_set, anomalous_set = {tuple(r) for r in normal}, {tuple(r) for r in anomalous}
    is_anom = np.array([tuple(r) in anomalous_set for r in X])
    # Every event is one of the user's rows, and exactly the burst's events are anomalous rows.
    assert all(tuple(r) in normal_set or tuple(r) in anomalous_set for r in X)
    assert int(is_anom.sum()) == stats.anomalous > 20
    t = np.array([e["ts"] for e in events]) - stats.started_at
    assert t[is_anom].min() >= 4 - 0.06 and t[is_anom].max() < 6 + 0.06


@pytest.mark.parametrize("kind", ["subtle_shift", "stuck_sensor", "correlated_drift", "far_outlier"])
def test_synthetic_kinds_move_the_burst_and_nothing_else(kind):
    rng = np.random.default_rng(1)
    normal = rng.normal(0.0, 1.0, size=(2000, 4))
    features = [(f"x{j}", -12, 12) for j in range(4)]
    plan = SimulationPlan(rate=200, duration=10, burst=AnomalyBurst(start=2, duration=6, fraction=0.5, kind=kind))
    stats, events = _rows_run(plan, normal, None, features)
    X = np.array([[e[f"x{j}"] for j in range(4)] for e in events])
    t = np.array([e["ts"] for e in events]) - stats.started_at
    outside = X[(t < 2 - 0.06) | (t > 8 + 0.06)]
    inside = X[(t > 2 + 0.06) & (t < 8 - 0.06)]
    # Outside the burst the traffic is the normal rows; inside, half the devices are moved.
    assert np.abs(outside.mean(axis=0)).max() < 0.2
    moved = np.abs(inside.mean(axis=0) - normal.mean(axis=0))
    if kind == "far_outlier":  # each person out in either direction: the spread moves, not the mean
        moved = np.abs(inside.std(axis=0) - normal.std(axis=0))
    assert moved.max() > 0.5, (kind, moved)
    if kind == "subtle_shift":
        # 1.5 to 3 sd on one or two features, for half the devices: 0.75 to 1.5 sd on average.
        assert 1 <= int((moved > 0.5).sum()) <= 2 and moved.max() < 1.7


def test_simulate_rows_options_are_checked(tmp_path):
    from argparse import Namespace

    from monitor.stream.simulate import plan_from_args, source_from_args

    cfg = parse_config({"features": [{"name": "a", "min": 0, "max": 10}]})
    (tmp_path / "normal.csv").write_text("a\n1\n2\n3\n")
    args = Namespace(normal=None, anomalies=tmp_path / "normal.csv", devices=5, seed=1)
    with pytest.raises(MonitorError, match="--anomalies needs --normal"):
        source_from_args(args, cfg)
    args = Namespace(normal=tmp_path / "normal.csv", anomalies=None, devices=5, seed=1)
    src = source_from_args(args, cfg)
    with pytest.raises(MonitorError, match="needs --anomalies"):
        src.burst_cause("rows")
    with pytest.raises(MonitorError, match="vitals simulator"):
        src.burst_cause("clustered")
    plan = plan_from_args(Namespace(anomaly_start=None, anomaly_duration=None, anomaly_fraction=0.1, anomaly_kind=None,
                                    anomalies=tmp_path / "normal.csv", duration=10.0, rate=5.0, malformed_rate=0.0))
    assert plan.burst.kind == "rows"


# --- a daily rhythm (monitor.data.rhythm) ---------------------------------------------


def _phase_split(events, t0: float, day_seconds: float, key):
    """Values of ``key`` by day (sin > 0.6 of the wave) and by night (sin < -0.6)."""
    t = (np.array([e["ts"] for e in events]) - t0) / day_seconds
    s = np.sin(2 * np.pi * t)
    v = np.array([key(e) for e in events])
    return v[s > 0.6], v[s < -0.6]


def test_rhythm_moves_the_vitals_activity_and_the_users_rows_over_the_simulated_day():
    from monitor.data.rhythm import Rhythm

    plan = SimulationPlan(rate=50, duration=200, rhythm=Rhythm("wave", 1.0), day_seconds=100)
    stats, sent = _run_fake(plan)
    day, night = _phase_split([json.loads(v) for _, v in sent], stats.started_at, 100, lambda e: e["activity"])
    assert day.size > 1000 and night.size > 1000
    assert day.mean() > 2.0 * night.mean()  # exp(+-0.6..1): about 3.5x
    flat, flat_sent = _run_fake(SimulationPlan(rate=50, duration=200, day_seconds=100))
    day, night = _phase_split([json.loads(v) for _, v in flat_sent], flat.started_at, 100, lambda e: e["activity"])
    assert 0.8 < day.mean() / night.mean() < 1.25
    # The user's rows: by day the rows high on their first principal component (here column a).
    rng = np.random.default_rng(2)
    normal = np.c_[rng.normal(0, 3, 3000), rng.normal(0, 1, 3000)]
    stats, events = _rows_run(SimulationPlan(rate=50, duration=200, rhythm=Rhythm("wave", 1.0), day_seconds=100),
                              normal, None, [("a", -20, 20), ("b", -20, 20)])
    day, night = _phase_split(events, stats.started_at, 100, lambda e: e["a"])
    assert day.mean() > 1.5 and night.mean() < -1.5  # a tilt of +-0.6..1 sd of a, whose sd is 3


def test_rhythm_volume_swings_the_rate_and_the_options_are_checked():
    from argparse import Namespace

    from monitor.data.rhythm import Rhythm
    from monitor.stream.simulate import plan_from_args

    plan = SimulationPlan(rate=40, duration=100, rhythm=Rhythm("none", volume=0.3), day_seconds=100)
    stats, sent = _run_fake(plan)
    t = np.array([json.loads(v)["ts"] for _, v in sent]) - stats.started_at
    assert stats.events == plan.total_events == 4000
    first, second = int((t < 50).sum()), int((t >= 50).sum())
    assert 1.35 < first / second < 1.6  # (0.5 + 0.3 / pi) / (0.5 - 0.3 / pi) = 1.47
    base = dict(anomaly_start=None, anomaly_duration=0, anomaly_fraction=0.1, anomaly_kind=None, rate=10, duration=5,
                malformed_rate=0.0, day_seconds=600.0, rhythm_volume=0.0)
    plan = plan_from_args(Namespace(**base, rhythm="switch", rhythm_strength=0.75))
    assert plan.rhythm == Rhythm("switch", 0.75) and plan.day_seconds == 600.0
    assert plan_from_args(Namespace(**base, rhythm="none", rhythm_strength=0.5)).rhythm is None
    with pytest.raises(MonitorError, match="--rhythm-strength"):
        plan_from_args(Namespace(**base, rhythm="wave", rhythm_strength=-0.5))
    with pytest.raises(MonitorError, match="--day-seconds"):
        plan_from_args(Namespace(**{**base, "day_seconds": 0.0}, rhythm="wave", rhythm_strength=0.5))
