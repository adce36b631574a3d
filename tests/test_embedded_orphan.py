"""`kill -9` of `monitor run` with its embedded broker: the broker must not live on.

Real processes only: `python -m monitor run` on the embedded Tansu broker, killed with
SIGKILL; a producer made as the README says; `monitor alerts` as a user runs it. Each test
keeps its broker records (`DP_MONITOR_RUN_DIR`) in its own folder, so it neither sees nor
reaps another test's brokers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.streamkit import REPO, stop_process as stop, wait_for, write_config, write_model

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    from monitor.pipeline.broker import free_port

    model = write_model(tmp_path / "model.json")
    config = write_config(tmp_path, bootstrap=None, model_path=model, prefix="orphan", window_seconds=2.0,
                          lateness_seconds=0.5)
    data = yaml.safe_load(config.read_text())
    # A port of its own rather than 9092, which other tests (and engineers) may hold.
    data["stream"]["embedded_broker_port"] = free_port()
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "run").mkdir()
    return tmp_path


def env(workdir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "DP_MONITOR_RUN_DIR": str(workdir / "run")}


def port_of(workdir: Path) -> int:
    return yaml.safe_load((workdir / "config.yaml").read_text())["stream"]["embedded_broker_port"]


def start_monitor(workdir: Path, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "monitor", "run"], cwd=workdir, env=env(workdir), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    wait_for(lambda: "caught up" in log.read_text() or proc.poll() is not None, 60, "the monitor to start")
    assert proc.poll() is None, log.read_text()[-3000:]
    return proc


def claim_of(workdir: Path) -> dict:
    files = list((workdir / "run").glob("embedded-broker-*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone, only not reaped yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_left_behind(workdir: Path) -> None:
    """A failed test must not leave its brokers running."""
    for path in (workdir / "run").glob("embedded-broker-*.json"):
        pid = json.loads(path.read_text())["broker_pid"]
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def accepted(log: Path) -> float:
    """The monitor's operational count of accepted events (NOT private)."""
    url = re.search(r"operational metrics \(NOT private\) on (\S+)", log.read_text()).group(1)
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    m = re.search(r'^dp_monitor_events_total\{status="accepted"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


class Producer:
    """Sends one valid event every 20 ms, as the README's snippet makes its producer;
    records when each send was acknowledged and how many failed."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from kafka import KafkaProducer

        from monitor.pipeline.clients import RESTART_SAFE_PRODUCER

        self.producer = KafkaProducer(bootstrap_servers=bootstrap, reconnect_backoff_max_ms=500, **RESTART_SAFE_PRODUCER)
        self.topic = topic
        self.acked: list[float] = []
        self.failed = 0
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        i = 0
        while not self.halt.is_set():
            future = self.producer.send(self.topic, json.dumps({"id": f"p-{i}", "ts": time.time(), "hr": 75.0, "spo2": 96.0}).encode())
            future.add_callback(lambda _: self.acked.append(time.time()))
            future.add_errback(lambda _: setattr(self, "failed", self.failed + 1))
            i += 1
            time.sleep(0.02)

    def acked_after(self, t: float) -> int:
        return sum(w > t for w in self.acked)

    def close(self) -> None:
        self.halt.set()
        self.thread.join(10)
        self.producer.close(timeout=1)


def test_kill_9_takes_the_embedded_broker_with_it_and_the_restart_counts_the_producers_events(workdir):
    port = port_of(workdir)
    topic = yaml.safe_load((workdir / "config.yaml").read_text())["stream"]["input_topic"]
    proc = start_monitor(workdir, workdir / "run1.log")
    producer = None
    try:
        claim = claim_of(workdir)
        assert claim["port"] == port and claim["monitor_pid"] == proc.pid and alive(claim["broker_pid"])
        producer = Producer(f"127.0.0.1:{port}", topic)
        wait_for(lambda: len(producer.acked) > 20, 30, "the producer to be acknowledged")

        os.killpg(proc.pid, signal.SIGKILL)  # the monitor's own group: the broker runs in a session of its own
        proc.wait()
        t_kill = time.monotonic()
        wait_for(lambda: not alive(claim["broker_pid"]), 5, "the orphaned broker to die with its monitor")
        died_in = time.monotonic() - t_kill
        assert died_in < 2.0, died_in

        t_restart = time.time()
        proc = start_monitor(workdir, workdir / "run2.log")
        text = (workdir / "run2.log").read_text()
        assert "already in use" not in text and "is taken" not in text, text[-3000:]
        new = claim_of(workdir)
        assert new["port"] == port and new["monitor_pid"] == proc.pid and new["broker_pid"] != claim["broker_pid"]
        wait_for(lambda: producer.acked_after(t_restart) > 20, 60, "the producer to be acknowledged by the new broker")
        wait_for(lambda: accepted(workdir / "run2.log") > 0, 30, "the restarted monitor to count the producer's events")

        # `monitor alerts` finds this config's running broker, even where the config no longer names its port.
        from monitor.config import load_config
        from monitor.stream.alerts import resolve_bootstrap

        data = yaml.safe_load((workdir / "config.yaml").read_text())
        data["stream"]["embedded_broker_port"] = 0
        (workdir / "unpinned.yaml").write_text(yaml.safe_dump(data))
        config = load_config(workdir / "unpinned.yaml")
        os.environ["DP_MONITOR_RUN_DIR"] = str(workdir / "run")
        try:
            assert resolve_bootstrap(None, config) == f"127.0.0.1:{port}"
        finally:
            del os.environ["DP_MONITOR_RUN_DIR"]
    finally:
        if producer is not None:
            producer.close()
        stop(proc)
        kill_left_behind(workdir)
    assert not list((workdir / "run").glob("embedded-broker-*.json")), "a clean stop removes its record"


ORPHAN = """
import os, sys
from monitor.pipeline.broker import EmbeddedBroker
broker = EmbeddedBroker(port=int(sys.argv[1]), die_with_parent=False).start()
broker.claim(sys.argv[2])
print(broker.pid, flush=True)
os._exit(0)  # as a kill -9 would: no stop, the broker is left running
"""


def test_a_broker_left_behind_is_refused_by_alerts_and_reclaimed_by_the_next_start(workdir):
    """Where the parent-death signal does not reach (another OS, a broker started by a
    thread that exited), the record the broker left lets the next start take it down."""
    port = port_of(workdir)
    ledger = yaml.safe_load((workdir / "config.yaml").read_text())["budget"]["ledger"]
    topic = yaml.safe_load((workdir / "config.yaml").read_text())["stream"]["input_topic"]
    out = subprocess.run([sys.executable, "-c", ORPHAN, str(port), ledger], env=env(workdir), capture_output=True,
                         text=True, timeout=60, check=True)
    orphan = int(out.stdout.split()[0])
    proc = None
    producer = None
    try:
        assert alive(orphan)
        res = subprocess.run([sys.executable, "-m", "monitor", "alerts"], cwd=workdir, env=env(workdir),
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, res.stderr
        assert "left behind by a monitor that is no longer running" in res.stderr and "Traceback" not in res.stderr

        log = workdir / "run.log"
        proc = start_monitor(workdir, log)
        text = log.read_text()
        assert f"killed the embedded broker (pid {orphan}) on port {port}" in text, text[-3000:]
        assert not alive(orphan)
        assert claim_of(workdir)["port"] == port

        t0 = time.time()
        producer = Producer(f"127.0.0.1:{port}", topic)
        wait_for(lambda: producer.acked_after(t0) > 20, 30, "the producer to be acknowledged")
        wait_for(lambda: accepted(log) > 0, 30, "the monitor to count the producer's events")
        res = subprocess.run([sys.executable, "-m", "monitor", "alerts"], cwd=workdir, env=env(workdir),
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert f"at 127.0.0.1:{port}" in res.stderr
    finally:
        if producer is not None:
            producer.close()
        if proc is not None:
            stop(proc)
        if alive(orphan):
            os.kill(orphan, signal.SIGKILL)
        kill_left_behind(workdir)
