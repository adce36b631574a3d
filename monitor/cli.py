"""The ``monitor`` command line: one sub-command per job.

Each sub-command lives beside the code it drives, in a module that offers
``configure(parser)``; that function adds the command's options and sets
``func`` to the function that runs it. Heavy imports stay inside those functions
so that ``monitor --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from monitor.errors import MonitorError

# (name, one-line help, module whose configure_<name>() sets up the parser)
COMMANDS: list[tuple[str, str, str]] = [
    ("demo", "run the whole job on embedded defaults: broker, model, simulated events, live releases", "monitor.stream.demo"),
    ("run", "run the monitor on a Kafka topic", "monitor.stream.cli"),
    ("replay", "run the monitor's pipeline over a file of events between two times (backtests; charges the ledger)", "monitor.stream.replay"),
    ("simulate", "produce simulated sensor events with an injected anomaly burst", "monitor.stream.simulate"),
    ("fit", "fit the private grid-kNN model on reference data and write the model file", "monitor.model.cli"),
    ("score", "score events from a file with a model file", "monitor.model.cli"),
    ("budget", "print the privacy ledgers: what was spent, what is left", "monitor.budget.cli"),
    ("identify", "ask privately whether records are anomalies of the reference data", "monitor.identify.cli"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="monitor",
        description="A streaming outlier monitor whose every published number is differentially private.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text, module in COMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            configure = getattr(importlib.import_module(module), f"configure_{name}")
        except (ImportError, AttributeError):
            p.set_defaults(func=_not_available(name))
            continue
        configure(p)
    return parser


def _not_available(name: str):
    def run(args: argparse.Namespace) -> int:
        print(f"monitor {name}: not available in this build", file=sys.stderr)
        return 2

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except MonitorError as err:
        print(f"monitor {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
