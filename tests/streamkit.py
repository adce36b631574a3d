"""Test support for the end-to-end stream tests (crash, fuzz, broker restart).

Real processes only: a Tansu broker (``monitor.pipeline.broker.EmbeddedBroker``), the
service started as ``python -m monitor run`` and killed with SIGKILL, an optional s3rver
(npm) behind Tansu's durable ``s3://`` storage, real SQLite ledgers and audit files.

The pieces:

- :func:`require_service` skips a test cleanly while the service is not built yet;
- :func:`write_model` / :func:`write_config`: a fitted model file and a config in tmp_path;
- :class:`EventPacer`: produces valid events in real time (``ts`` = now, unique ``id``);
- :func:`read_topic`: every record of a topic, read to ``consumer.highwater()``;
- :class:`ServiceProcess`: start / SIGKILL / SIGTERM the service subprocess;
- :func:`read_audit` / :func:`audit_windows`: the test-only audit file;
- :func:`ledger_rows`: the window ledger, through ``monitor.budget.WindowLedger``;
- :class:`S3Server` / :func:`durable_broker_env`: s3rver for a broker that survives kill -9.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent

# Features of the synthetic events, with their public bounds.
FEATURES = [
    {"name": "hr", "min": 30.0, "max": 220.0},
    {"name": "spo2", "min": 70.0, "max": 100.0},
]

# Fast consumer-group settings on Tansu (INFRA.md): join in about 1 s.
from monitor.pipeline.broker import EMBEDDED_GROUP_SETTINGS as FAST_GROUP  # the test brokers are Tansu too

# Tansu 0.6.0 on s3:// storage answers an idempotent producer with
# OutOfOrderSequenceNumber as soon as another producer writes concurrently (measured:
# 97 of 100 sends failed); plain producers (acks=all) work. Clients of a durable broker
# therefore turn idempotence off.
DURABLE_BROKER_KAFKA = {"enable_idempotence": False}


# --------------------------------------------------------------------------- skip


def require_service() -> None:
    """Skip the calling test unless the service, the ledger and the model exist."""
    for module, attr in [
        ("monitor.pipeline.service", "MonitorService"),
        ("monitor.stream.cli", "configure_run"),
        ("monitor.budget", "WindowLedger"),
        ("monitor.model", "GridKNN"),
        ("monitor.release", "WindowReleaser"),
        ("monitor.outliers", "private_count"),
        ("monitor.outliers", "private_top_subspaces"),
    ]:
        try:
            mod = importlib.import_module(module)
        except ImportError as err:
            pytest.skip(f"{module} is not available yet ({err})")
        if not hasattr(mod, attr):
            pytest.skip(f"{module}.{attr} is not available yet")


# --------------------------------------------------------------------------- waiting


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05,
             on_timeout: Callable[[], str] | None = None) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = on_timeout() if on_timeout else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{extra}")
        time.sleep(interval)


# --------------------------------------------------------------------------- model and config


def write_model(path: Path, seed: int = 0, n: int = 2000) -> Path:
    """Fit ``monitor.model.GridKNN`` on seeded synthetic reference inliers; save to ``path``."""
    import numpy as np
    from monitor.model import GridKNN

    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.normal(75, 10, n), rng.normal(96, 1.5, n)])
    GridKNN(epsilon=1.0, bounds=[(f["min"], f["max"]) for f in FEATURES], contamination=0.05,
            random_state=seed, feature_names=[f["name"] for f in FEATURES]).fit(X).save(path)
    return path


def two_feature_model(path: Path) -> Path:
    """A fitted two-feature (hr, spo2) model of seeded normal vitals, saved to ``path``."""
    import numpy as np
    from monitor.model import GridKNN

    X = np.random.default_rng(0).normal([75, 96], [8, 1.5], size=(2000, 2))
    GridKNN(epsilon=1.0, bounds=[(30, 220), (70, 100)], contamination=0.05, random_state=0,
            feature_names=["hr", "spo2"]).fit(X).save(path)
    return path


def start_service(service) -> threading.Thread:
    """Run a ``MonitorService`` in a daemon thread; its error, if any, is kept for ``finish_service``."""
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


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM a process still running and wait for it, killing it after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def finish_service(thread: threading.Thread, timeout: float = 30.0) -> None:
    """Wait for a ``start_service`` thread to end; re-raise what the service raised."""
    thread.join(timeout)
    assert not thread.is_alive(), "service did not stop"
    if thread.errors:  # type: ignore[attr-defined]
        raise thread.errors[0]  # type: ignore[attr-defined]


def write_config(directory: Path, *, bootstrap: str, model_path: Path, prefix: str,
                 window_seconds: float = 1.0, lateness_seconds: float = 0.5,
                 max_message_bytes: int = 65536, metrics_port: int = 0,
                 kafka: dict[str, Any] | None = None, grace_seconds: float = 20.0,
                 entity_field: str | None = None, group: str | None = None,
                 window: dict[str, Any] | None = None) -> Path:
    """A config for a test run: short windows, a budget that never runs out, its own topics;
    ``window``: more keys of the window block."""
    config = {
        "features": FEATURES,
        "model": {"path": str(model_path)},
        "stream": {
            "bootstrap_servers": bootstrap,
            "input_topic": f"{prefix}.events",
            "alerts_topic": f"{prefix}.alerts",
            "dead_letter_topic": f"{prefix}.dead-letter",
            "group_id": group or f"{prefix}-monitor",
            "entity_field": entity_field,
            "timestamp_field": "ts",
            "max_message_bytes": max_message_bytes,
            # The service's defaults (6 s session) make each restart wait ~3 s to join.
            "kafka": {**FAST_GROUP, **(kafka or {})},
        },
        "window": {"size_seconds": window_seconds, "allowed_lateness_seconds": lateness_seconds, "publish_delay_seconds": 0.0,
                   "release_grace_seconds": grace_seconds, **(window or {})},
        # A detailed report with every window (a public schedule), so every window costs the
        # same and "charged once" is checkable window by window; the alarm is tested elsewhere.
        "alarm": {"enabled": False},
        "report": {"k": 3, "radius": 0.1, "top_h": 1, "subspace_dims": 1, "every_seconds": window_seconds},
        "budget": {
            "epsilon": 10_000.0,
            "delta": 0.5,
            "period_seconds": 86400.0,
            "accountant": "basic",
            "ledger": str(directory / "ledger.sqlite"),
            "reference_ledger": str(directory / "reference-ledger.sqlite"),
        },
        "metrics": {"host": "127.0.0.1", "port": metrics_port, "operational_port": 0},
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def window_cost(config_path: Path) -> tuple[float, float]:
    """(epsilon, delta) one released window costs under this config."""
    from monitor.config import load_config

    cfg = load_config(config_path)
    return cfg.report_cost()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()


# --------------------------------------------------------------------------- producing


def make_producer(bootstrap: str, idempotent: bool = True):
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, retries=1_000_000,
                         enable_idempotence=idempotent, max_in_flight_requests_per_connection=1,
                         request_timeout_ms=5000, reconnect_backoff_max_ms=500)


def valid_event(event_id: str, ts: float, rng: random.Random) -> dict:
    """A valid event; about one in ten is far from the reference data."""
    if rng.random() < 0.1:
        hr, spo2 = rng.uniform(150, 210), rng.uniform(72, 85)
    else:
        hr, spo2 = rng.gauss(75, 10), rng.gauss(96, 1.5)
    return {"id": event_id, "ts": ts, "hr": round(hr, 3), "spo2": round(min(spo2, 100.0), 3)}


def encode(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


class EventPacer:
    """Produces valid events in real time (``ts`` = wall clock at send) from a thread.

    ``pause()`` flushes and stops sending (e.g. before the broker goes away);
    ``resume()`` restarts. ``ids`` holds every id the broker acknowledged; ``last_ts``
    the event time of the last one sent.
    """

    def __init__(self, bootstrap: str, topic: str, rate: float, seed: int, prefix: str = "e",
                 idempotent: bool = True) -> None:
        self.topic = topic
        self.interval = 1.0 / rate
        self.rng = random.Random(seed)
        self.prefix = prefix
        self.ids: list[str] = []
        self.last_ts = 0.0
        self._producer = make_producer(bootstrap, idempotent)
        self._futures: list[tuple[str, Any]] = []
        self._running = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="event-pacer", daemon=True)
        self._n = 0
        self.error: BaseException | None = None

    def start(self) -> "EventPacer":
        self._running.set()
        self._thread.start()
        return self

    def _loop(self) -> None:
        try:
            next_t = time.monotonic()
            while not self._stop.is_set():
                if not self._running.is_set():
                    self._idle.set()
                    self._running.wait(0.05)
                    next_t = time.monotonic()
                    continue
                self._idle.clear()
                now = time.time()
                event_id = f"{self.prefix}-{self._n:06d}"
                self._n += 1
                self._futures.append((event_id, self._producer.send(self.topic, encode(valid_event(event_id, now, self.rng)))))
                self.last_ts = now
                next_t += self.interval
                delay = next_t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        except BaseException as err:  # surfaced by pause()/stop()
            self.error = err
        finally:
            self._idle.set()

    def _settle(self) -> None:
        self._producer.flush(timeout=30)
        for event_id, fut in self._futures:
            fut.get(timeout=30)  # raises if the broker refused it
            self.ids.append(event_id)
        self._futures.clear()
        if self.error:
            raise self.error

    def pause(self) -> None:
        self._running.clear()
        self._idle.wait(5)
        self._settle()

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._running.clear()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._settle()
        self._producer.close(timeout=5)


class KeyedPacer:
    """Real-time events keyed by ``device_id`` (EventPacer sends no key), from a thread.

    Devices take turns, and a device never sends twice within ``1.1 * window`` seconds,
    so the per-window entity bound (first event per entity kept) drops nothing and every
    event must be counted. Records ``entity`` and ``partition`` of each acknowledged id.
    """

    def __init__(self, bootstrap: str, topic: str, rate: float, seed: int, devices: int, window: float,
                 prefix: str = "m") -> None:
        self.topic, self.interval, self.devices, self.window = topic, 1.0 / rate, devices, window
        self.prefix = prefix
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
                device = f"dev-{n % self.devices:02d}"
                wait = self._last_by_device.get(device, -1e9) + 1.1 * self.window - time.time()
                if wait > 0:
                    time.sleep(wait)
                now = time.time()
                event_id = f"{self.prefix}-{n:06d}"
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

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        if self._stop.is_set():
            return
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


def stop_processes(procs: list["ServiceProcess"]) -> None:
    """SIGTERM every process first (so none takes over another's partitions), then wait
    for each to exit 0. Waiting rather than terminate(): a second SIGTERM during
    interpreter shutdown would kill the process with -15."""
    for p in procs:
        p.ensure_alive()
        p.proc.send_signal(signal.SIGTERM)
    for p in procs:
        assert p.proc.wait(30) == 0, p.log_tail()


def assigned(service: "ServiceProcess") -> list[int] | None:
    """The input partitions of the service's last stage-1 assignment, from its log (None before one)."""
    import re

    path = service._log_path
    log = path.read_text(errors="replace") if path and path.exists() else ""
    events = list(re.finditer(r"stage 1: (assigned input|revoked) partitions \[([\d, ]*)\]", log))
    if not events or events[-1].group(1) == "revoked":
        return None
    return [int(p) for p in events[-1].group(2).replace(" ", "").split(",") if p]


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]

    def header(self, name: str) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


def read_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> list[Record]:
    """Every record of ``topic``, all partitions, read until each reaches its highwater.

    Tansu's ``end_offsets()`` is wrong; ``consumer.highwater()`` (from fetch responses)
    is right (INFRA.md), so we poll until position >= highwater everywhere.
    """
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=100)
    try:
        deadline = time.monotonic() + timeout
        parts = None
        while not parts:
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                if time.monotonic() > deadline:
                    return []
                time.sleep(0.2)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Record] = []
        while True:
            for tp, records in consumer.poll(timeout_ms=200).items():
                for r in records:
                    out.append(Record(r.partition, r.offset, r.key, r.value, tuple(r.headers or ())))
            highs = {tp: consumer.highwater(tp) for tp in tps}
            if all(h is not None and consumer.position(tp) >= h for tp, h in highs.items()):
                return out
            if time.monotonic() > deadline:
                pytest.fail(f"could not read {topic} to its end within {timeout:.0f} s: "
                            f"highwater {highs}, positions { {tp: consumer.position(tp) for tp in tps} }")
    finally:
        consumer.close()


# --------------------------------------------------------------------------- the service


class ServiceProcess:
    """``python -m monitor run`` as a real subprocess, one log file per start."""

    def __init__(self, config: Path, bootstrap: str, audit: Path, seed: int, logs: Path,
                 max_windows: int | None = None, stage: str | None = None, name: str = "service") -> None:
        self.config, self.bootstrap, self.audit, self.seed = config, bootstrap, audit, seed
        self.logs, self.max_windows, self.stage, self.name = logs, max_windows, stage, name
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.kills = 0
        self._log_path: Path | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "monitor", "run", "--config", str(self.config),
               "--bootstrap-servers", self.bootstrap, "--audit-file", str(self.audit),
               "--seed", str(self.seed)]
        if self.max_windows is not None:
            cmd += ["--max-windows", str(self.max_windows)]
        if self.stage is not None:
            cmd += ["--stage", self.stage]
        return cmd

    def start(self) -> "ServiceProcess":
        assert not self.alive, "service already running"
        self.starts += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        self._log_path = self.logs / f"{self.name}-{self.starts:02d}.log"
        with open(self._log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no handler, no flush, no goodbye."""
        assert self.alive, f"service died before it was killed\n{self.log_tail()}"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.kills += 1

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; SIGKILL (and fail) if it does not stop in time."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                pytest.fail(f"service ignored SIGTERM for {timeout:.0f} s\n{self.log_tail()}")
        return self.proc.returncode

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample from the running service's private or operational /metrics (URLs
        taken from its log), or None."""
        import re
        import urllib.request

        if not self._log_path or not self.alive:
            return None
        urls = re.findall(r"metrics(?: \(NOT private\))? on (http://\S+)", self._log_path.read_text(errors="replace"))
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for url in urls:
            try:
                text = urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                continue
            for line in text.splitlines():
                series, _, value = line.rpartition(" ")
                if series == (f"{name}{{{want}}}" if want else name):
                    return float(value)
        return None

    def freeze(self) -> None:
        """SIGSTOP: the process stays alive but does nothing until :meth:`thaw`."""
        assert self.alive
        self.proc.send_signal(signal.SIGSTOP)
        # Delivery is asynchronous: on another core the process may run on for a moment.
        # Return only once every thread is stopped ("T" in /proc), so what we look at
        # cannot change under us.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            states = [self._thread_state(t) for t in self._threads()]
            if states and all(st in ("T", "t", "Z", "X", None) for st in states):
                return
            time.sleep(0.0001)
        pytest.fail(f"service did not stop on SIGSTOP within 5 s\n{self.log_tail()}")

    def _threads(self) -> list[str]:
        try:
            return os.listdir(f"/proc/{self.proc.pid}/task")
        except FileNotFoundError:
            return []

    def _thread_state(self, tid: str) -> str | None:
        try:
            with open(f"/proc/{self.proc.pid}/task/{tid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return None

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def ensure_alive(self) -> None:
        if not self.alive:
            code = self.proc.returncode if self.proc else None
            pytest.fail(f"service exited unexpectedly (code {code})\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if not self._log_path or not self._log_path.exists():
            return "(no service log)"
        text = self._log_path.read_text(errors="replace").splitlines()
        return f"--- {self._log_path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])

    def cleanup(self) -> None:
        if self.alive:
            self.proc.kill()
            self.proc.wait()


# --------------------------------------------------------------------------- audit and ledger


def read_audit(path: Path) -> list[dict]:
    """Every line of the audit file, in order (a window may appear twice after a crash).

    A last line without its newline is a write still in progress (the monitor is running,
    and a reader may see part of one write): it is left for the next read. A line that is
    not JSON anywhere else is a torn write, and fails the test."""
    if not path.exists():
        return []
    out = []
    complete = path.read_text(encoding="utf-8").split("\n")[:-1]  # the part after the last newline is unfinished
    for n, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"audit file {path} line {n} is not JSON (torn write?): {line[:200]!r}")
    return out


def audit_windows(lines: Iterable[dict]) -> dict[float, dict]:
    """Audit lines by window start; fails if two lines for one window differ."""
    by_start: dict[float, dict] = {}
    for line in lines:
        start = float(line["window_start"])
        if start in by_start:
            assert by_start[start] == line, (
                f"window {start} audited twice with different contents:\n{by_start[start]}\n{line}")
        else:
            by_start[start] = line
    return by_start


def audit_line_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0



def start_with_traffic(service, pacer, audit: Path, releases: int) -> int:
    """Start ``service``, then ``pacer`` from its first release on (a fresh service schedules
    windows from its start: earlier events would be late), and wait for ``releases`` more
    releases. Returns the audit's line count when the pacer started."""
    service.start()
    wait_for(lambda: audit_line_count(audit) >= 1, 90, "the first window release", on_timeout=service.log_tail)
    pacer.start()
    before = audit_line_count(audit)
    wait_for(lambda: audit_line_count(audit) >= before + releases, 60, f"{releases} releases",
             on_timeout=service.log_tail)
    return before

def file_stamp(path: Path) -> tuple[int, int]:
    """(size, mtime_ns): changes when the file is written (e.g. a SQLite WAL at commit)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return (0, 0)
    return (st.st_size, st.st_mtime_ns)


def ledger_published(path: Path, window_start: float) -> bool | None:
    """Would the ledger say the window is published if the service died now?

    Reads a copy of the database and its WAL without the shared-memory index, so SQLite
    recovers it the way a restart would: a commit whose frames are in the WAL but not
    yet in the index (a process stopped inside COMMIT) counts. None if the window is
    not there.
    """
    import sqlite3
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / path.name
        shutil.copyfile(path, copy)
        wal = path.with_name(path.name + "-wal")
        if wal.exists():
            shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
        conn = sqlite3.connect(copy, timeout=5)
        try:
            row = conn.execute("SELECT published FROM windows WHERE window_start = ?", (window_start,)).fetchone()
        finally:
            conn.close()
    return None if row is None else bool(row[0])


def kill_between_publish_and_mark(service: "ServiceProcess", audit: Path, ledger: Path, bootstrap: str,
                                  alerts_topic: str, step: float = 0.0002, attempts: int = 8) -> bool:
    """SIGKILL the service after a window's alert reached the broker but before the ledger
    marks it published, so that the restart re-publishes a record already published.

    Waits for an audit line (it precedes the ledger commit), then lets the service run in
    tiny steps (SIGCONT, ``step`` s, SIGSTOP), looking at the alerts topic and the ledger
    while it is stopped. If the mark wins the race, tries again on the next window, up to
    ``attempts`` windows (4 lost the race every time once, in a full parallel suite run). Returns True
    if it killed in that state; False if it killed after the last attempt's mark instead.
    """
    for attempt in range(attempts):
        seen = audit_line_count(audit)
        wait_for(lambda: audit_line_count(audit) > seen, 30, "an audit line", interval=0.0005,
                 on_timeout=service.log_tail)
        service.freeze()
        start = float(read_audit(audit)[-1]["window_start"])
        n0 = len(read_topic(bootstrap, alerts_topic))
        while True:
            published = ledger_published(ledger, start)
            if published:
                break  # the mark came first: this window is no use
            if published is False and len(read_topic(bootstrap, alerts_topic)) > n0:
                service.kill()  # SIGKILL works on a stopped process
                return True
            service.thaw()
            time.sleep(step)
            service.freeze()
        if attempt == attempts - 1:
            service.kill()
            return False
        service.thaw()
    raise AssertionError("unreachable")


def ledger_rows(path: Path) -> list[Any]:
    """The window ledger's entries (each with window_start, status, epsilon, delta, payload)."""
    from monitor.budget import WindowLedger

    ledger = WindowLedger(path)
    try:
        return list(ledger.entries())
    finally:
        close = getattr(ledger, "close", None)
        if close:
            close()


def field(entry: Any, name: str) -> Any:
    """A ledger entry's field, whether entries are objects, dicts or named tuples."""
    if isinstance(entry, dict):
        return entry[name]
    return getattr(entry, name)


def as_bytes(payload: Any) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode()
    raise TypeError(f"ledger payload of unexpected type {type(payload).__name__}")


def check_alerts_match_ledger(alerts: list[Record], entries: list[Any]) -> dict[str, int]:
    """Each ledger window has alert records, all byte-identical to the ledger payload.

    Returns counts: windows, records, republished records, windows published more than once.
    """
    by_key: dict[float, list[Record]] = {}
    for r in alerts:
        assert r.key is not None, f"alert without a key at {r.partition}:{r.offset}"
        by_key.setdefault(float(r.key.decode()), []).append(r)
    ledger_starts = {float(field(e, "window_start")) for e in entries}
    assert set(by_key) == ledger_starts, (
        f"alert keys and ledger windows differ: only in alerts {sorted(set(by_key) - ledger_starts)[:5]}, "
        f"only in ledger {sorted(ledger_starts - set(by_key))[:5]}")
    republished = 0
    for e in entries:
        start = float(field(e, "window_start"))
        payload = as_bytes(field(e, "payload"))
        records = by_key[start]
        firsts = [r for r in records if r.header("republished") != b"1"]
        republished += len(records) - len(firsts)
        for r in records:
            assert r.value == payload, (
                f"window {start}: alert at {r.partition}:{r.offset} (republished={r.header('republished')}) "
                f"differs from the ledger payload:\n{r.value[:300]!r}\n{payload[:300]!r}")
        # At most one first publication: a second one would be a second release.
        assert len(firsts) <= 1, f"window {start} published {len(firsts)} times without the republished header"
    twice = sum(1 for records in by_key.values() if len(records) > 1)
    return {"windows": len(by_key), "records": len(alerts), "republished": republished, "published_twice": twice}


def check_ledger_schedule(entries: list[Any], window_seconds: float, cost: tuple[float, float]) -> list[float]:
    """Windows once each, consecutive (empty ones too), each charged exactly ``cost``,
    all published. Returns the sorted window starts."""
    starts = [float(field(e, "window_start")) for e in entries]
    assert len(starts) == len(set(starts)), "a window appears twice in the ledger"
    starts.sort()
    for a, b in zip(starts, starts[1:]):
        assert abs((b - a) - window_seconds) < 1e-6, f"gap or overlap in the ledger between windows {a} and {b}"
    for e in entries:
        assert abs(float(field(e, "epsilon")) - cost[0]) < 1e-9, f"window charged {field(e, 'epsilon')} != {cost[0]}"
        assert abs(float(field(e, "delta")) - cost[1]) < 1e-15
        assert field(e, "status") == "released", f"window {field(e, 'window_start')} {field(e, 'status')}"
        assert field(e, "published"), f"window {field(e, 'window_start')} never marked published"
    spent = sum(float(field(e, "epsilon")) for e in entries)
    assert abs(spent - len(entries) * cost[0]) < 1e-6
    return starts


def check_budget_spent(entries: list[Any], cost: tuple[float, float]) -> float:
    """The budget each alert record states: the i-th window (basic composition, one
    period) reports i x cost spent, its own charge included, so no crash ever charged a
    window twice or skipped one. Returns the total spent."""
    ordered = sorted(entries, key=lambda e: float(field(e, "window_start")))
    for i, e in enumerate(ordered, 1):
        budget = json.loads(as_bytes(field(e, "payload")))["budget"]
        assert budget["accountant"] == "basic"
        assert abs(budget["epsilon_spent"] - i * cost[0]) < 1e-6, (
            f"window {field(e, 'window_start')} (number {i}) states epsilon_spent "
            f"{budget['epsilon_spent']}, expected {i} x {cost[0]}")
    return len(ordered) * cost[0]


def check_events_counted_once(windows: dict[float, dict], produced: set[str], window_seconds: float,
                              note: str = "") -> int:
    """Every produced valid id in exactly one released window, no other id anywhere.
    Returns the number of counted events."""
    seen: dict[str, float] = {}
    for start, line in windows.items():
        ids = line["event_ids"]
        assert ids == sorted(ids), f"window {start}: event_ids not sorted"
        assert line["n_events"] == len(ids), f"window {start}: n_events {line['n_events']} != {len(ids)} ids"
        assert abs(float(line["window_end"]) - start - window_seconds) < 1e-6
        for i in ids:
            assert i not in seen, f"event {i} counted in windows {seen[i]} and {start}"
            seen[i] = start
    missing = produced - set(seen)
    extra = set(seen) - produced
    assert not missing, f"{len(missing)} valid events never counted (late or lost), e.g. {sorted(missing)[:5]} {note}"
    assert not extra, f"{len(extra)} counted ids were never produced, e.g. {sorted(extra)[:5]}"
    return len(seen)


# --------------------------------------------------------------------------- s3rver


def s3rver_binary() -> str | None:
    """s3rver from $S3RVER_BIN, the CI's install folder (.ci/run), or PATH."""
    candidates = [os.environ.get("S3RVER_BIN"),
                  str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                      / "dp-monitor" / "s3rver" / "node_modules" / ".bin" / "s3rver"),
                  shutil.which("s3rver")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    return None


def warm_partitions(bootstrap: str, topics: Iterable[str]) -> int:
    """Fetch every partition of ``topics`` once, right after a durable broker restarts.

    Tansu 0.6.0 on s3:// storage forgets a partition's stored watermark when the first
    request after a restart is a produce: it writes from offset 0 again, overwriting
    the old records (measured: 30 records, kill -9, restart, produce 10 -> offsets
    0..9, the 30 gone). A fetch first loads the watermark, and produces then continue
    at the right offset. Returns the number of records seen.
    """
    return sum(len(read_topic(bootstrap, t)) for t in topics)


class S3Server:
    """An s3rver process on 127.0.0.1 with the bucket ``tansu``; data in ``directory``."""

    def __init__(self, directory: Path, bucket: str = "tansu") -> None:
        from monitor.pipeline.broker import free_port

        self.directory, self.bucket = directory, bucket
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> "S3Server":
        import socket

        binary = s3rver_binary()
        if binary is None:
            pytest.skip("s3rver is not installed (.ci/run installs it with npm)")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._log = open(self.directory.parent / "s3rver.log", "ab")
        self.proc = subprocess.Popen([binary, "-d", str(self.directory), "-a", "127.0.0.1", "-p", str(self.port),
                                      "--silent", "--configure-bucket", self.bucket],
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"s3rver exited at start (code {self.proc.returncode})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        pytest.fail(f"s3rver did not listen on {self.port} within {timeout:.0f} s")

    def broker_env(self) -> dict[str, str]:
        """Environment for Tansu's ``s3://tansu/`` storage against this server."""
        return {"AWS_ENDPOINT": f"http://127.0.0.1:{self.port}", "AWS_ACCESS_KEY_ID": "S3RVER",
                "AWS_SECRET_ACCESS_KEY": "S3RVER", "AWS_ALLOW_HTTP": "true", "AWS_DEFAULT_REGION": "us-east-1"}

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
