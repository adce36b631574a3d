"""``monitor run``: the service on a Kafka topic (or on the embedded broker)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

__all__ = ["configure_run", "run_command"]

_TEST_ONLY = "TEST ONLY"


def configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", default="config.yaml", help="configuration file (default: config.yaml)")
    parser.add_argument("--bootstrap-servers", help="Kafka brokers, overriding stream.bootstrap_servers")
    parser.add_argument("--stage", choices=["1", "2", "both"],
                        help="run stage 1 only (validate, score, window; many processes), stage 2 only (merge and "
                        "release; one process) or both (default; overrides stream.stage); see docs/scaling.md")
    parser.add_argument("--max-windows", type=int, metavar="N", help="stop cleanly after N windows released or suppressed")
    parser.add_argument("--audit-file", metavar="F", help=f"{_TEST_ONLY}: append each window's true size and event ids to F (not private)")
    parser.add_argument("--seed", type=int, help=f"{_TEST_ONLY}: reproducible noise; releases are then NOT private")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.set_defaults(func=run_command)


def _warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr, flush=True)


def run_command(args: argparse.Namespace) -> int:
    from monitor.config import load_config
    from monitor.stream.service import MonitorService

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.getLevelName(args.log_level)))
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

    def on_signal(signum, frame):  # noqa: ARG001
        logging.getLogger("monitor.stream").info("signal %d: stopping after releasing due windows", signum)
        service.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    service.run()
    return 0
