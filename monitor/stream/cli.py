"""``monitor run``: the service on a Kafka topic (or on the embedded broker)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

__all__ = ["configure_run", "run_command"]

_TEST_ONLY = "TEST ONLY"
# A second signal within this time is the first one delivered again (`timeout` and some
# supervisors signal both the process and its group), not an impatient user.
_REPEAT_GRACE_S = 1.0
# How long a clean stop may take before the process exits as if killed: below Docker's
# and systemd's default 10 s, so the log says why instead of a bare SIGKILL.
_STOP_GRACE_S = 8.0


def configure_run(parser: argparse.ArgumentParser) -> None:
    from monitor.cli import add_config_option, add_log_level_option

    add_config_option(parser)
    parser.add_argument("--bootstrap-servers", help="Kafka brokers, overriding stream.bootstrap_servers")
    parser.add_argument("--stage", choices=["1", "2", "both"],
                        help="run stage 1 only (validate, score, window; many processes), stage 2 only (merge and "
                        "release; one process) or both (default; overrides stream.stage); see docs/scaling.md")
    parser.add_argument("--max-windows", type=int, metavar="N", help="stop cleanly after N windows released or suppressed")
    parser.add_argument("--audit-file", metavar="F", help=f"{_TEST_ONLY}: append each window's true size and event ids to F (not private)")
    parser.add_argument("--seed", type=int, help=f"{_TEST_ONLY}: reproducible noise; releases are then NOT private")
    add_log_level_option(parser)
    parser.set_defaults(func=run_command)


def _warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr, flush=True)


def run_command(args: argparse.Namespace) -> int:
    from monitor.cli import setup_logging
    from monitor.config import load_config
    from monitor.pipeline.service import MonitorService

    setup_logging(args.log_level)
    config = load_config(args.config)
    if args.seed is not None:
        _warn(f"--seed {args.seed}: noise is reproducible, so the releases are NOT differentially private ({_TEST_ONLY})")
    if args.audit_file:
        _warn(f"--audit-file {args.audit_file}: true window sizes and event ids are written there, "
              f"outside the privacy guarantee ({_TEST_ONLY})")
    service = MonitorService(
        config,
        bootstrap_servers=args.bootstrap_servers,
        rng=args.seed,
        audit_path=args.audit_file,
        max_windows=args.max_windows,
        stage=args.stage,
    )

    finished = threading.Event()
    _handle_stop_signals(service, finished)
    try:
        service.run()
    finally:
        finished.set()
    return 0


def _handle_stop_signals(service, finished: threading.Event, grace: float | None = None) -> None:
    """SIGTERM / Ctrl-C: stop cleanly, but never hang.

    The first signal asks the service to release its due windows, flush and commit. If
    that has not finished within ``grace`` seconds (a broker that went away makes every
    flush wait for its timeout), or on a second signal, the process exits at once, as if
    killed: nothing is lost, because the ledger is crash-safe, due windows are released
    at the next start and uncommitted events are read again.
    """
    grace = _STOP_GRACE_S if grace is None else grace
    log = logging.getLogger("monitor.stream")
    first_signal: list[float] = []

    def exit_now(code: int, why: str) -> None:
        log.warning("%s: exiting now. Nothing is lost: the ledger is crash-safe, due windows are released at the "
                    "next start and uncommitted events are read again", why)
        if service.broker is not None:
            service.broker.kill()  # our own child: do not leave it behind
        logging.shutdown()
        os._exit(code)

    def watchdog(code: int) -> None:
        if not finished.wait(grace):
            exit_now(code, f"stopping takes longer than {grace:g} s (is the broker reachable?)")

    def on_signal(signum, frame):  # noqa: ARG001
        now = time.monotonic()
        code = 130 if signum == signal.SIGINT else 143
        if first_signal and now - first_signal[0] < _REPEAT_GRACE_S:
            return  # the same stop request delivered twice (to the process and to its group)
        if first_signal:
            exit_now(code, f"second signal {signum}")
        first_signal.append(now)
        log.info("signal %d: stopping after releasing due windows (a second Ctrl-C exits at once)", signum)
        service.stop()
        threading.Thread(target=watchdog, args=(code,), name="stop-watchdog", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
