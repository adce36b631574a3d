"""``monitor simulate``: simulated device events, paced in real time, with an anomaly burst.

Each event is one JSON object ``{"device_id": ..., "ts": <epoch seconds>, <features>}``
(the field names come from the config's ``entity_field``, ``timestamp_field`` and
features). During the burst a fraction of the devices sends desaturation readings
(spo2 down, heart rate up: see :mod:`monitor.data.vitals`), or anomalies that look like
real ones (``--anomaly-kind subtle_shift``, ``stuck_sensor``, ``correlated_drift``,
``far_outlier``: :mod:`monitor.data.anomalies`). With ``--normal normal.csv`` the traffic is
the user's own labelled rows (each event a row drawn at random), and with ``--anomalies
anomalous.csv`` the burst sends rows drawn from that file: a backtest on real data. A chosen share of the
messages can be malformed on purpose, one of each dead-letter reason in turn, to
exercise the monitor's dead-letter path.

``--rhythm wave|switch|weekly`` gives the traffic a daily rhythm (:mod:`monitor.data.rhythm`):
with ``--normal`` rows are reweighted by the time of day along the rows' first principal
component (``--rhythm-strength``), and the vitals' activity rises by day and falls by night;
``--rhythm-volume`` swings the event rate over the day too. ``--day-seconds`` is the length
of a simulated day (86,400 by default; a few minutes shows a whole day's rhythm in a demo);
the simulated day starts at midnight when the simulator starts.

Which broker: ``--bootstrap-servers``, else ``stream.bootstrap_servers`` from the
config, else the embedded broker that a running ``monitor run`` of the same config started
(found by its ``budget.ledger``, whatever its port), else, when the config pins
``stream.embedded_broker_port``, the embedded broker on that port. Otherwise it
stops with a message: an embedded broker of its own would vanish with the simulator,
with nobody reading it (``monitor demo`` runs broker, monitor and simulator together).

>>> plan = SimulationPlan(rate=100, duration=2, burst=AnomalyBurst(start=0.5, duration=1))
>>> sent = []
>>> stats = run_simulation(lambda key, value: sent.append(value), plan, VitalsSource(seed=1), clock=FakeClock(), sleep=FakeClock.sleep)
>>> stats.events, len(sent), stats.anomalous > 0
(200, 200, True)
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from monitor.data.anomalies import ANOMALY_KINDS, SYNTHETIC_KINDS, AnomalyRecipe, FeatureStats, apply_recipe, draw_recipe
from monitor.data.rhythm import RHYTHM_KINDS, Rhythm, RowRhythm
from monitor.data.vitals import VITAL_FEATURES, VitalsSimulator, random_cluster
from monitor.errors import MonitorError

__all__ = [
    "AnomalyBurst",
    "SimulationPlan",
    "SimulationStats",
    "VitalsSource",
    "RowSource",
    "BURST_KINDS",
    "MALFORMED_KINDS",
    "run_simulation",
    "resolve_bootstrap",
    "open_producer",
    "configure_simulate",
    "FakeClock",
]

# One malformed message per dead-letter reason the monitor knows (DEVELOPERS.md),
# except too_large, which would cost 64 KiB per message for no extra coverage.
MALFORMED_KINDS: tuple[str, ...] = ("bad_json", "not_object", "missing_field", "wrong_type", "not_finite", "bad_timestamp")
# What a burst can send: the simulator's desaturation episodes (clustered, spread), the
# synthetic kinds of monitor.data.anomalies, or the user's anomalous rows (--anomalies).
BURST_KINDS: tuple[str, ...] = (*ANOMALY_KINDS, "rows")


@dataclass(frozen=True)
class AnomalyBurst:
    """From ``start`` to ``start + duration`` seconds after the simulation starts, a
    fraction ``fraction`` of the devices sends anomalous readings, ``clustered`` close
    together (one cause hitting many people: the realistic case) or ``spread``."""

    start: float
    duration: float
    fraction: float = 0.05
    kind: str = "clustered"

    def active(self, elapsed: float) -> bool:
        return self.duration > 0 and self.start <= elapsed < self.start + self.duration


@dataclass(frozen=True)
class SimulationPlan:
    """How many events, how fast, and what goes wrong."""

    rate: float = 200.0              # events per second, all devices together
    duration: float = 60.0           # seconds
    burst: AnomalyBurst | None = None
    malformed_rate: float = 0.0      # share of messages replaced by a malformed one
    rhythm: Rhythm | None = None     # the traffic's daily rhythm (None: stationary)
    day_seconds: float = 86400.0     # length of one simulated day, for the rhythm

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise MonitorError(f"--rate must be a positive number of events per second, got {self.rate}")
        if not (self.duration >= 0 and math.isfinite(self.duration)):
            raise MonitorError(f"--duration must be a non-negative number of seconds, got {self.duration}")
        if not 0.0 <= self.malformed_rate <= 1.0:
            raise MonitorError(f"--malformed-rate must be between 0 and 1, got {self.malformed_rate}")
        if self.burst is not None and not 0.0 <= self.burst.fraction <= 1.0:
            raise MonitorError(f"--anomaly-fraction must be between 0 and 1, got {self.burst.fraction}")
        if self.burst is not None and self.burst.kind not in BURST_KINDS:
            raise MonitorError(f"--anomaly-kind must be one of {', '.join(BURST_KINDS)}, got {self.burst.kind!r}")
        if not (self.day_seconds > 0 and math.isfinite(self.day_seconds)):
            raise MonitorError(f"--day-seconds must be a positive number of seconds, got {self.day_seconds}")

    @property
    def total_events(self) -> int:
        if self.rhythm is not None and self.rhythm.volume:
            return int(round(self.rate * self.day_seconds * self.rhythm.cumulative_volume(self.duration / self.day_seconds)))
        return int(round(self.rate * self.duration))

    def events_due(self, elapsed: float) -> int:
        """Events sent by ``elapsed`` seconds: the rate, swung by the rhythm's volume if any."""
        if self.rhythm is not None and self.rhythm.volume:
            return int(self.rate * self.day_seconds * self.rhythm.cumulative_volume(elapsed / self.day_seconds))
        return int(self.rate * elapsed)


@dataclass
class SimulationStats:
    """What was sent; the simulator knows the truth, the monitor must not publish it."""

    events: int = 0
    anomalous: int = 0
    malformed: Counter = field(default_factory=Counter)
    burst_devices: int = 0
    started_at: float = 0.0          # wall clock
    first_ts: float | None = None
    last_ts: float | None = None
    burst_from: float | None = None  # wall-clock interval the burst covered
    burst_to: float | None = None
    in_burst: bool = False           # is the burst on right now (for live displays)
    elapsed: float = 0.0
    feature_names: list = field(default_factory=list)

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())


class VitalsSource:
    """Turns simulated readings into event payloads for a given config.

    >>> src = VitalsSource(seed=2, n_devices=3)
    >>> sorted(json.loads(src.event(0, 1700000000.0, anomalous=False)))
    ['activity', 'device_id', 'heart_rate', 'resp_rate', 'skin_temp', 'spo2', 'ts']
    """

    def __init__(
        self,
        features: Sequence = VITAL_FEATURES,
        *,
        entity_field: str | None = "device_id",
        timestamp_field: str | None = "ts",
        n_devices: int = 200,
        seed: int | None = None,
    ) -> None:
        self.sim = VitalsSimulator(features, n_devices=n_devices, rng=seed)
        self.rng = self.sim.rng
        self.entity_field = entity_field
        self.timestamp_field = timestamp_field
        # Devices speak in a fixed shuffled order so consecutive events come from
        # different people, as a real fleet's would.
        self.order = self.rng.permutation(n_devices)

    @property
    def n_devices(self) -> int:
        return self.sim.n_devices

    def follow(self, rhythm: Rhythm, t: float) -> None:
        """Readings from now on as at time ``t`` (days) of ``rhythm``: activity by the time of day."""
        self.sim.activity_scale = rhythm.activity_factor(t)

    def choose_burst_devices(self, fraction: float) -> np.ndarray:
        """Boolean mask of the devices in the burst: round(fraction * n_devices) of them,
        at least one if fraction > 0 (an exact number keeps demo runs comparable)."""
        n = max(int(round(fraction * self.n_devices)), 1 if fraction > 0 else 0)
        mask = np.zeros(self.n_devices, bool)
        mask[self.rng.choice(self.n_devices, size=n, replace=False)] = True
        return mask

    def payload(self, device: int, ts: float, values: np.ndarray) -> dict:
        event: dict = {}
        if self.entity_field:
            event[self.entity_field] = self.sim.device_ids[device]
        if self.timestamp_field:
            event[self.timestamp_field] = round(ts, 3)
        for name, v in zip(self.sim.feature_names, values):
            event[name] = float(v)
        return event

    def burst_cause(self, kind: str):
        """One burst's cause, drawn once: a cluster centre (clustered), None (spread, rows), or
        a synthetic kind's recipe (the same features and shift for everybody in the burst)."""
        if kind == "clustered":
            return random_cluster(self.rng)
        if kind in SYNTHETIC_KINDS:
            return draw_recipe(kind, self.stats, self.rng)
        if kind == "rows":
            raise MonitorError("--anomaly-kind rows needs --anomalies FILE (anomalous rows to send)")
        return None

    @property
    def stats(self) -> FeatureStats:
        """Normal readings' centre and spread, for the synthetic kinds (the simulator's own)."""
        if getattr(self, "_stats", None) is None:
            probe = VitalsSimulator(list(zip(self.sim.feature_names, *self.sim.bounds.T)), n_devices=2000, rng=12345)
            self._stats = FeatureStats.of(probe.readings(np.arange(2000)), self.sim.bounds)
        return self._stats

    def event(self, device: int, ts: float, anomalous: bool, cluster=None) -> bytes:
        if isinstance(cluster, AnomalyRecipe):
            values = self.sim.readings([device])
            if anomalous:
                values = apply_recipe(cluster, values, self.stats, self.rng)
            values = values[0]
        else:
            values = self.sim.readings([device], [anomalous], cluster=cluster)[0]
        return json.dumps(self.payload(device, ts, values)).encode()

    def malformed(self, device: int, ts: float, kind: str) -> bytes:
        """A message that the monitor must route to the dead-letter topic for ``kind``."""
        event = self.payload(device, ts, self.sim.readings([device])[0])
        first = self.sim.feature_names[0]
        if kind == "bad_json":
            return json.dumps(event).encode()[:-7]
        if kind == "not_object":
            return json.dumps(list(event.values())).encode()
        if kind == "missing_field":
            del event[first]
        elif kind == "wrong_type":
            event[first] = "high"
        elif kind == "not_finite":
            event[first] = float("nan")  # json.dumps writes NaN, which Python's json accepts
        elif kind == "bad_timestamp":
            if self.timestamp_field:
                event[self.timestamp_field] = "yesterday"
            else:
                event[first] = "high"
        else:
            raise ValueError(f"unknown malformed kind {kind!r}")
        return json.dumps(event).encode()


class _RowSim:
    """Readings drawn from the user's rows: a random normal row per event, a random
    anomalous row for an anomalous one (``VitalsSimulator``'s interface)."""

    def __init__(self, normal: np.ndarray, anomalous: np.ndarray | None, feature_names: Sequence[str],
                 bounds: np.ndarray, n_devices: int, rng) -> None:
        self.normal = np.asarray(normal, dtype=float)
        self.anomalous = None if anomalous is None else np.asarray(anomalous, dtype=float)
        self.feature_names = list(feature_names)
        self.bounds = np.asarray(bounds, dtype=float)
        self.n_devices = int(n_devices)
        self.rng = np.random.default_rng(rng)
        self.device_ids = [f"dev-{i:04d}" for i in range(self.n_devices)]
        self.rhythm: RowRhythm | None = None
        self.t = 0.0

    def readings(self, devices, anomalous=None, cluster=None) -> np.ndarray:
        n = len(devices)
        idx = self.rhythm.draw(self.t, n, self.rng) if self.rhythm is not None else self.rng.integers(self.normal.shape[0], size=n)
        X = self.normal[idx].copy()
        if anomalous is not None and self.anomalous is not None:
            anom = np.asarray(anomalous, dtype=bool)
            X[anom] = self.anomalous[self.rng.integers(self.anomalous.shape[0], size=int(anom.sum()))]
        return X


class RowSource(VitalsSource):
    """Events built from the user's labelled rows (``monitor simulate --normal FILE
    [--anomalies FILE]``): each event is a normal row drawn at random; during the burst a
    share of the devices sends anomalous rows (kind ``rows``) or a synthetic kind applied
    to their normal rows.

    >>> rng = np.random.default_rng(0)
    >>> src = RowSource(rng.normal(size=(50, 2)), rng.normal(9, 1, size=(5, 2)), [("a", -20, 20), ("b", -20, 20)], n_devices=4, seed=1)
    >>> sorted(json.loads(src.event(0, 1700000000.0, anomalous=True)))
    ['a', 'b', 'device_id', 'ts']
    >>> json.loads(src.event(0, 1700000000.0, anomalous=True))["a"] > 4
    True
    """

    def __init__(self, normal: np.ndarray, anomalous: np.ndarray | None, features: Sequence, *,
                 entity_field: str | None = "device_id", timestamp_field: str | None = "ts", n_devices: int = 200,
                 seed: int | None = None) -> None:
        from monitor.data.vitals import _bounds, _name

        normal = np.asarray(normal, dtype=float)
        if normal.ndim != 2 or normal.shape[0] == 0:
            raise MonitorError("--normal holds no rows")
        if anomalous is not None and np.asarray(anomalous).shape[0] == 0:
            raise MonitorError("--anomalies holds no rows")
        bounds = np.array([_bounds(f) for f in features], dtype=float)
        self.sim = _RowSim(normal, anomalous, [_name(f) for f in features], bounds, n_devices, seed)
        self.rng = self.sim.rng
        self.entity_field = entity_field
        self.timestamp_field = timestamp_field
        self.order = self.rng.permutation(n_devices)
        self._stats = FeatureStats.of(normal, bounds)

    def follow(self, rhythm: Rhythm, t: float) -> None:
        """Normal rows from now on drawn as at time ``t`` (days) of ``rhythm`` (reweighted along
        their first principal component)."""
        if self.sim.rhythm is None or self.sim.rhythm.rhythm != rhythm:
            self.sim.rhythm = RowRhythm(self.sim.normal, rhythm)
        self.sim.t = t

    def burst_cause(self, kind: str):
        if kind == "rows":
            if self.sim.anomalous is None:
                raise MonitorError("--anomaly-kind rows needs --anomalies FILE (anomalous rows to send)")
            return None
        if kind in ("clustered", "spread"):
            raise MonitorError(f"--anomaly-kind {kind} is the vitals simulator's own episode; with --normal use rows "
                               f"(with --anomalies) or one of {', '.join(SYNTHETIC_KINDS)}")
        return draw_recipe(kind, self.stats, self.rng)


def run_simulation(
    send: Callable[[bytes | None, bytes], None],
    plan: SimulationPlan,
    source: VitalsSource,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    stop: threading.Event | None = None,
    on_progress: Callable[[SimulationStats], None] | None = None,
    tick: float = 0.05,
) -> SimulationStats:
    """Send ``plan.total_events`` events through ``send(key, value)``, paced in real time.

    Every ``tick`` seconds it sends what is due, so the event timestamps (the wall
    clock at sending) spread evenly over ``plan.duration``. ``stop`` ends it early.
    """
    stats = SimulationStats(started_at=clock())
    burst = plan.burst
    burst_mask = source.choose_burst_devices(burst.fraction) if burst else np.zeros(source.n_devices, bool)
    cluster = source.burst_cause(burst.kind) if burst else None
    stats.burst_devices = int(burst_mask.sum())
    stats.feature_names = list(source.sim.feature_names)
    total = plan.total_events
    kinds = iter(_cycle(MALFORMED_KINDS))
    t0 = stats.started_at
    while stats.events < total and not (stop and stop.is_set()):
        now = clock()
        elapsed = now - t0
        if plan.rhythm is not None:
            source.follow(plan.rhythm, elapsed / plan.day_seconds)
        due = min(total, plan.events_due(elapsed) + 1)
        burst_on = stats.in_burst = bool(burst and burst.active(elapsed))
        if burst_on:
            stats.burst_from = stats.burst_from or now
            stats.burst_to = now
        while stats.events < due:
            device = int(source.order[stats.events % source.n_devices])
            key = source.sim.device_ids[device].encode()
            if plan.malformed_rate and source.rng.random() < plan.malformed_rate:
                kind = next(kinds)
                send(key, source.malformed(device, now, kind))
                stats.malformed[kind] += 1
            else:
                anomalous = burst_on and bool(burst_mask[device])
                send(key, source.event(device, now, anomalous, cluster if anomalous else None))
                stats.anomalous += anomalous
                stats.first_ts = stats.first_ts or now
                stats.last_ts = now
            stats.events += 1
        if on_progress:
            on_progress(stats)
        if stats.events < total:
            # Sleep until the next event is due, but wake at least every tick to honour stop.
            next_due = t0 + stats.events / plan.rate
            sleep(max(0.0, min(tick, next_due - clock())))
    stats.elapsed = clock() - t0
    stats.in_burst = False
    return stats


def _cycle(items: Sequence[str]):
    while True:
        yield from items


class FakeClock:
    """A clock that only moves when slept on: runs a simulation instantly (doctests)."""

    now = 1_700_000_000.0

    def __call__(self) -> float:
        return FakeClock.now

    @staticmethod
    def sleep(seconds: float) -> None:
        FakeClock.now += max(seconds, 1e-3)


# --- Kafka side -------------------------------------------------------------------


def resolve_bootstrap(cli_value: str | None, config) -> str | list[str]:
    """The broker to produce to (see the module docstring for the order)."""
    if cli_value:
        return cli_value
    if config.stream.bootstrap_servers:
        return config.stream.bootstrap_servers
    from monitor.pipeline.broker import running_broker

    running = running_broker(config.budget.ledger)  # the embedded broker of this config's `monitor run`
    if running is not None:
        return running
    if config.stream.embedded_broker_port:
        return f"127.0.0.1:{config.stream.embedded_broker_port}"
    raise MonitorError(
        "needs a broker: pass --bootstrap-servers HOST:PORT or set stream.bootstrap_servers in the config "
        "(or stream.embedded_broker_port, to feed the embedded broker of a running `monitor run`). "
        "To try everything on one machine with nothing to set up, run `monitor demo`."
    )


def open_producer(bootstrap_servers: str | list[str], kafka_settings: dict | None = None):
    """The shared kafka-python producer (``monitor.pipeline.clients``), with a clear error
    when the broker cannot be reached."""
    from kafka.errors import KafkaError

    from monitor.pipeline.clients import RESTART_SAFE_PRODUCER, make_producer

    try:
        # Not idempotent: the embedded broker restarts empty with `monitor run`, and an idempotent
        # producer's id is then unknown to it, so every later send is refused (measured with
        # kafka-python's default: 0 of 197 sends in 20 s after a restart). Its acks=all and
        # retries for up to delivery_timeout_ms still carry each event to the broker that came back.
        return make_producer(bootstrap_servers, {**RESTART_SAFE_PRODUCER, **(kafka_settings or {})}, linger_ms=20)
    except KafkaError as err:
        raise MonitorError(f"cannot connect to the broker at {bootstrap_servers}: {err}") from None


def configure_simulate(parser: argparse.ArgumentParser) -> None:
    """Options of ``monitor simulate``."""
    parser.add_argument("--config", default="config.yaml", help="configuration file (features, topic, broker); default: config.yaml")
    parser.add_argument("--bootstrap-servers", help="Kafka brokers, overriding stream.bootstrap_servers")
    parser.add_argument("--rate", type=float, default=200.0, help="events per second, all devices together (default 200)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds to run (default 60)")
    parser.add_argument("--devices", type=int, default=200, help="simulated people, one device each (default 200)")
    parser.add_argument("--anomaly-start", type=float, help="seconds after the start when the burst begins (default: 40%% of the duration)")
    parser.add_argument("--anomaly-duration", type=float, help="burst length in seconds, 0 for none (default: 20%% of the duration)")
    parser.add_argument("--anomaly-fraction", type=float, default=0.05, help="share of devices in the burst (default 0.05)")
    parser.add_argument("--anomaly-kind", choices=BURST_KINDS, default=None,
                        help="clustered: the burst's desaturation readings sit close together (one cause); spread: each far "
                        "from the others; subtle_shift (1.5-3 sd in one or two features), stuck_sensor, correlated_drift, "
                        "far_outlier: anomalies that look like real ones; rows: rows of --anomalies (default: rows with "
                        "--anomalies, else clustered)")
    parser.add_argument("--normal", type=Path, help="CSV (header = the config's feature names) or npz of normal rows: "
                        "the traffic is built from them instead of the vitals simulator (a backtest on your own data)")
    parser.add_argument("--anomalies", type=Path, help="CSV or npz of anomalous rows: the burst sends rows drawn from it "
                        "(with --normal)")
    parser.add_argument("--malformed-rate", type=float, default=0.0, help="share of messages sent malformed, to exercise the dead-letter topic (default 0)")
    parser.add_argument("--rhythm", choices=RHYTHM_KINDS, default="none",
                        help="a daily rhythm in the traffic: wave (smooth over the day), switch (night and day, switching "
                        "over an hour at 07:00 and 19:00), weekly (the wave, different on Saturday and Sunday); default none")
    parser.add_argument("--rhythm-strength", type=float, default=0.5, help="how far the rhythm moves the traffic's make-up "
                        "(the tilt along the rows' first principal component, or the log of the activity factor; default 0.5)")
    parser.add_argument("--rhythm-volume", type=float, default=0.0, help="the event rate swings by this share over the day "
                        "(e.g. 0.3 for +-30 %%; default 0)")
    parser.add_argument("--day-seconds", type=float, default=86400.0, help="length of one simulated day in seconds (default "
                        "86400; shorter shows a whole day's rhythm in a short run)")
    parser.add_argument("--seed", type=int, help="seed of the simulated population and readings (default: random)")
    parser.set_defaults(func=run_simulate_command)


def plan_from_args(args: argparse.Namespace) -> SimulationPlan:
    """The plan ``monitor simulate`` (and ``monitor demo``) derive from their options."""
    start = args.anomaly_start if args.anomaly_start is not None else 0.4 * args.duration
    length = args.anomaly_duration if args.anomaly_duration is not None else 0.2 * args.duration
    kind = getattr(args, "anomaly_kind", None) or ("rows" if getattr(args, "anomalies", None) else "clustered")
    burst = AnomalyBurst(start, length, args.anomaly_fraction, kind) if length > 0 else None
    return SimulationPlan(rate=args.rate, duration=args.duration, burst=burst, malformed_rate=args.malformed_rate,
                          rhythm=rhythm_from_args(args), day_seconds=getattr(args, "day_seconds", 86400.0))


def rhythm_from_args(args: argparse.Namespace) -> Rhythm | None:
    """The rhythm of ``--rhythm``, ``--rhythm-strength``, ``--rhythm-volume`` (None: stationary)."""
    kind = getattr(args, "rhythm", "none") or "none"
    volume = getattr(args, "rhythm_volume", 0.0)
    strength = getattr(args, "rhythm_strength", 0.5)
    if not (math.isfinite(strength) and strength >= 0):
        raise MonitorError(f"--rhythm-strength must be a non-negative number, got {strength}")
    if not 0 <= volume < 1:
        raise MonitorError(f"--rhythm-volume must be at least 0 and below 1, got {volume}")
    if kind == "none" and not volume:
        return None
    return Rhythm(kind, strength, volume=volume)


def run_simulate_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    from monitor.config import load_config

    config = load_config(args.config)
    if args.devices < 1:
        raise MonitorError(f"--devices must be at least 1, got {args.devices}")
    plan = plan_from_args(args)
    bootstrap = resolve_bootstrap(args.bootstrap_servers, config)
    source = source_from_args(args, config)
    console = Console()
    topic = config.stream.input_topic
    producer = open_producer(bootstrap, config.stream.kafka)
    try:
        stats = _produce_with_progress(producer, topic, plan, source, console)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)
    for line in summary_lines(stats, plan, topic, bootstrap):
        console.print(line, highlight=False, soft_wrap=True)
    return 0


def source_from_args(args: argparse.Namespace, config) -> VitalsSource:
    """The event source ``monitor simulate`` uses: the user's rows (--normal, --anomalies) or the vitals simulator."""
    if args.anomalies is not None and args.normal is None:
        raise MonitorError("--anomalies needs --normal (the normal rows the traffic is built from)")
    if args.normal is None:
        return VitalsSource(config.features, entity_field=config.stream.entity_field,
                            timestamp_field=config.stream.timestamp_field, n_devices=args.devices, seed=args.seed)
    from monitor.model.io import read_features

    normal = read_features(args.normal, config.feature_names, progress=False)
    anomalous = read_features(args.anomalies, config.feature_names, progress=False) if args.anomalies else None
    return RowSource(normal, anomalous, config.features, entity_field=config.stream.entity_field,
                     timestamp_field=config.stream.timestamp_field, n_devices=args.devices, seed=args.seed)


def _produce_with_progress(producer, topic: str, plan: SimulationPlan, source: VitalsSource, console) -> SimulationStats:
    def send(key: bytes | None, value: bytes) -> None:
        producer.send(topic, key=key, value=value)

    if not console.is_terminal:
        return run_simulation(send, plan, source)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task(f"producing to {topic}", total=plan.total_events)

        def show(stats: SimulationStats) -> None:
            burst = " [red]anomaly burst[/red]" if stats.in_burst else ""
            progress.update(task, completed=stats.events, description=f"producing to {topic}{burst}")

        return run_simulation(send, plan, source, on_progress=show)


def summary_lines(stats: SimulationStats, plan: SimulationPlan, topic: str, bootstrap) -> list[str]:
    """Plain-text summary of a simulation (what the simulator knows, not a DP release)."""
    rate = stats.events / stats.elapsed if stats.elapsed > 0 else float("nan")
    lines = [f"sent {stats.events} events to topic {topic} at {bootstrap} in {stats.elapsed:.1f} s ({rate:.0f}/s)"]
    if plan.burst and stats.burst_from is not None:
        lines.append(
            f"anomaly burst: {stats.burst_devices} devices from +{stats.burst_from - stats.started_at:.1f} s "
            f"to +{stats.burst_to - stats.started_at:.1f} s, {stats.anomalous} anomalous events ({plan.burst.kind}; "
            f"{_burst_features(plan, stats)})"
        )
    else:
        lines.append("anomaly burst: none")
    if plan.rhythm is not None:
        lines.append(f"rhythm: {plan.rhythm.kind}, strength {plan.rhythm.strength:g}, volume +-{plan.rhythm.volume:.0%}, "
                     f"a simulated day every {plan.day_seconds:g} s")
    if stats.malformed_total:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(stats.malformed.items()))
        lines.append(f"malformed messages: {stats.malformed_total} ({kinds})")
    return lines


def _burst_features(plan: SimulationPlan, stats: SimulationStats) -> str:
    names = stats.feature_names
    if plan.burst is not None and plan.burst.kind == "rows":
        return "rows of --anomalies"
    if plan.burst is not None and plan.burst.kind in SYNTHETIC_KINDS:
        return plan.burst.kind.replace("_", " ")
    if {"spo2", "heart_rate"} <= set(names):
        return "spo2 down, heart_rate up"
    return f"{' and '.join(names[:2])} shifted by a third of their range" if names else "first two features shifted"
