"""The ``monitor`` command line: one sub-command per job.

Each sub-command lives beside the code it drives, in a module that offers
``configure(parser)``; that function adds the command's options and sets
``func`` to the function that runs it. Heavy imports stay inside those functions
so that ``monitor --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from typing import Sequence

from monitor.errors import MonitorError

DEFAULT_CONFIG = "config.yaml"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# (name, one-line help, module whose configure_<name>() sets up the parser)
COMMANDS: list[tuple[str, str, str]] = [
    ("demo", "run the whole job on embedded defaults: broker, model, simulated events, live releases", "monitor.stream.demo"),
    ("run", "run the monitor on a Kafka topic", "monitor.stream.cli"),
    ("alerts", "print the alerts topic as a table (window, alarm, epsilon, report headline); --follow, --json", "monitor.stream.alerts"),
    ("replay", "run the monitor's pipeline over a file of events between two times (backtests, in a ledger of their own)", "monitor.stream.replay"),
    ("simulate", "produce simulated sensor events with an injected anomaly burst", "monitor.stream.simulate"),
    ("fit", "fit the private grid-kNN model on reference data and write the model file", "monitor.model.cli"),
    ("score", "score events from a file with a model file", "monitor.model.cli"),
    ("budget", "print the privacy ledgers: what was spent, what is left", "monitor.budget.cli"),
    ("identify", "ask privately whether records are anomalies of the reference data", "monitor.identify.cli"),
]


def add_config_option(parser: argparse.ArgumentParser, what: str = "features, bounds, ledgers, broker") -> None:
    """The one ``--config/-c`` convention of every command: config.yaml in the current folder by default."""
    parser.add_argument("--config", "-c", default=DEFAULT_CONFIG, metavar="FILE",
                        help=f"configuration file ({what}); default: {DEFAULT_CONFIG}")


def add_log_level_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS, type=str.upper,
                        help="how much to log on stderr: DEBUG adds kafka-python's own messages and each batch read; "
                             "WARNING shows only problems (default: INFO, one line per window)")


def setup_logging(level: str) -> None:
    """Log lines with ISO 8601 UTC times, as `monitor budget` prints them.

    kafka-python logs every failed connection attempt at ERROR (dozens a minute while a
    broker is down); the monitor reports such outages itself in one line, so the client's
    messages are shown only with --log-level DEBUG.
    """
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%Y-%m-%dT%H:%M:%SZ")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("kafka").setLevel(logging.DEBUG if level == "DEBUG" else logging.CRITICAL + 1)


def _version() -> str:
    from monitor import __version__

    return f"monitor {__version__} (dp-outlier-monitor)"


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each command's own parser (for its usage on a bad option)."""
    parser = argparse.ArgumentParser(
        prog="monitor",
        description="A streaming outlier monitor whose every published number is differentially private.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers: dict[str, argparse.ArgumentParser] = {}
    for name, help_text, module in COMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        subparsers[name] = p
        try:
            configure = getattr(importlib.import_module(module), f"configure_{name}")
        except (ImportError, AttributeError):
            p.set_defaults(func=_not_available(name))
            continue
        configure(p)
    return parser, subparsers


def _not_available(name: str):
    def run(args: argparse.Namespace) -> int:
        print(f"monitor {name}: not available in this build", file=sys.stderr)
        return 2

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser, subparsers = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # The command's own usage, not the top-level one: `monitor run --bogus` should
        # show what `run` accepts. (argparse.error exits 2.)
        (subparsers.get(args.command) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at interpreter exit
        return code
    except MonitorError as err:
        print(f"monitor {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `monitor budget --json | head`: the reader left, which is not an error. Point
        # stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
