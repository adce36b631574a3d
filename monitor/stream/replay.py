"""``monitor replay``: the monitor's pipeline over a file of events, for backtests and reviews.

Validation, the model, contribution bounding, windows on the window grid between the
public times T0 and T1, the alarm, detailed reports and ledger charges: exactly what
``monitor run`` does (the same ``EventSchema``, ``WindowStore`` and ``WindowReleaser``),
with a JSON-lines file in place of the input topic and files in place of the alerts and
dead-letter topics. Replaying private data is a release: it charges the ledger like a
real run, and a window already in the ledger is written out as stored, never redrawn.

All events are held until the end (the file need not be in time order), so the file
must fit in memory.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path

from monitor.errors import MonitorError

__all__ = ["replay", "configure_replay"]


def replay(config, input_path: Path, start: float, end: float, output_path: Path, dead_letter_path: Path,
           rng=None, progress=None) -> dict[str, float]:
    """Replay ``input_path`` over the windows in [start, end); returns counts of what happened
    (operator output, NOT private).

    Writes one alert record per window to ``output_path`` (in window order) and one
    line per invalid event to ``dead_letter_path``.
    """
    from monitor.budget.accountant import BudgetAccountant
    from monitor.budget.ledger import WindowLedger
    from monitor.release import WindowReleaser
    from monitor.stream.events import EventSchema, InvalidEvent
    from monitor.stream.service import load_model
    from monitor.stream.windows import WindowStore

    if config.stream.timestamp_field is None:
        raise MonitorError("replay needs event times in the events: set stream.timestamp_field (a file has no Kafka timestamps)")
    size = config.window.size_seconds
    first = math.ceil(start / size) * size
    last_end = math.floor(end / size) * size
    if last_end <= first:
        raise MonitorError(f"--start {start:g} and --end {end:g} hold no whole window of {size:g} s (windows start at multiples of it)")
    model = load_model(config)
    schema = EventSchema.from_config(config)
    store = WindowStore(size, config.window.allowed_lateness_seconds, first, len(config.features))
    counts: Counter[str] = Counter()
    try:
        source = open(input_path, "rb")
    except OSError as err:
        raise MonitorError(f"cannot read --input {input_path}: {err.strerror}") from None
    with source, open(dead_letter_path, "w", encoding="utf-8") as dead:
        for line_no, line in enumerate(source, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                ev = schema.parse(line)
            except InvalidEvent as bad:
                counts["dead_letter"] += 1
                dead.write(json.dumps({"line": line_no, "reason": bad.reason, "detail": bad.detail,
                                       "value": line.decode("utf-8", "replace")}) + "\n")
                continue
            if not first <= ev.timestamp < last_end:
                counts["outside"] += 1
                continue
            status = store.add_one(ev.timestamp, ev.features, False, event_id=ev.event_id or f"line {line_no}",
                                   entity=ev.entity)
            counts[status] += 1
            if progress is not None and line_no % 10000 == 0:
                progress(line_no)
    b = config.budget
    ledger = WindowLedger(b.ledger)
    try:
        accountant = BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant)
        releaser = WindowReleaser(config, accountant, model, rng=rng)
        delay = config.window.allowed_lateness_seconds + config.window.publish_delay_seconds
        with open(output_path, "w", encoding="utf-8") as out:
            # Every scheduled window in [first, last_end), empty or not, in order.
            for window in store.close_due(last_end + config.window.allowed_lateness_seconds):
                released = releaser.release(window, released_at=window.end + delay)
                out.write(released.entry.payload + "\n")
                record = json.loads(released.entry.payload)
                counts["windows"] += 1
                counts["pages"] += record.get("alarm") is True and record["alarm_detail"]["state"] == "fired"
                counts["replayed_from_ledger"] += released.replayed
        summary: dict[str, float] = {**counts, "epsilon_spent_in_last_period": accountant.spent(last_end)[0]}
    finally:
        ledger.close()
    return summary


def configure_replay(parser: argparse.ArgumentParser) -> None:
    """Options of ``monitor replay``."""
    parser.add_argument("-c", "--config", default="config.yaml", help="configuration file (default: config.yaml)")
    parser.add_argument("--input", required=True, type=Path, help="JSON-lines file of events, one event per line")
    parser.add_argument("--start", required=True, type=float, help="T0, epoch seconds: the first window starts at the first multiple of window.size_seconds at or after it")
    parser.add_argument("--end", required=True, type=float, help="T1, epoch seconds: the last window ends at or before it")
    parser.add_argument("--output", required=True, type=Path, help="JSON-lines file to write one alert record per window to")
    parser.add_argument("--dead-letter", type=Path, help="where invalid events go, with their reason (default: OUTPUT.dead-letter.jsonl)")
    parser.set_defaults(func=run_replay_command)


def run_replay_command(args: argparse.Namespace) -> int:
    from monitor.config import load_config

    config = load_config(args.config)
    dead = args.dead_letter or args.output.with_name(args.output.name + ".dead-letter.jsonl")
    print(f"replaying {args.input} over [{args.start:g}, {args.end:g}): this charges the ledger {config.budget.ledger} "
          "like a real run (replaying private data is a release)", file=sys.stderr)
    summary = replay(config, args.input, args.start, args.end, args.output, dead,
                     progress=lambda n: print(f"  read {n} lines", file=sys.stderr))
    print(f"{summary.get('windows', 0)} windows written to {args.output} ({summary.get('pages', 0)} pages, "
          f"{summary.get('replayed_from_ledger', 0)} already in the ledger and written as stored); "
          f"{summary.get('accepted', 0)} events in windows, {summary.get('duplicate_entity', 0)} duplicates of an entity in a window, "
          f"{summary.get('outside', 0)} outside [--start, --end), {summary.get('dead_letter', 0)} invalid (see {dead}); "
          f"epsilon spent in the last period: {summary['epsilon_spent_in_last_period']:.3g}", file=sys.stderr)
    return 0
