"""``monitor replay``: the monitor's pipeline over a file of events, for backtests and reviews.

Validation, the model, contribution bounding, windows on the window grid between the
public times T0 and T1, the alarm, detailed reports and ledger charges: exactly what
``monitor run`` does (the same ``EventSchema``, ``WindowStore`` and ``WindowReleaser``),
with a JSON-lines file in place of the input topic and files in place of the alerts and
dead-letter topics.

Replaying private data is a release, so it charges a ledger like a real run. By default
that is a backtest ledger of its own, ``OUTPUT.ledger.sqlite``, made afresh for each
backtest (its output and its ledger go together): re-running with another setting draws
anew instead of returning the stored records, and a backtest never spends a running
monitor's budget. ``--ledger FILE`` charges a given ledger instead; a window already in
it is written out as stored, never redrawn. Either way the replay holds the ledger's lock
(``monitor.lockfile``), so it refuses a ledger that a running monitor writes.

The output file appears only when the whole replay succeeded (written beside it, then
renamed). All events are held until the end (the file need not be in time order), so the
file must fit in memory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from collections import Counter
from pathlib import Path

from monitor.errors import MonitorError

__all__ = ["replay", "configure_replay", "parse_time", "backtest_ledger"]

# Epoch seconds beyond this (year 5138) are taken for milliseconds in a user's input.
_MS_HINT_ABOVE = 1e11
_SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def parse_time(text: str, option: str) -> float:
    """``--start``/``--end``: epoch seconds or ISO 8601 (UTC when no offset is given).

    >>> parse_time("2025-11-21T04:40:00Z", "--start"), parse_time("1763700000", "--start")
    (1763700000.0, 1763700000.0)
    """
    try:
        value = float(text)
    except ValueError:
        try:
            dt = datetime.datetime.fromisoformat(text.strip())
        except ValueError:
            raise MonitorError(f"{option} {text!r}: give epoch seconds (1763700000) or ISO 8601 "
                               "(2025-11-21T04:40:00Z; UTC when no offset is given)") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=datetime.timezone.utc)
        return dt.timestamp()
    if not math.isfinite(value) or value < 0:
        raise MonitorError(f"{option} {text!r}: not a valid epoch time")
    if value > _MS_HINT_ABOVE:
        raise MonitorError(f"{option} {text}: looks like milliseconds since the epoch; give seconds "
                           f"({value / 1000:.0f}) or ISO 8601")
    return value


def backtest_ledger(output_path: Path) -> Path:
    """The default ledger of a backtest: beside its output, named after it."""
    return output_path.with_name(output_path.name + ".ledger.sqlite")


def _remove_ledger(path: Path) -> None:
    for p in (path, *(path.with_name(path.name + s) for s in _SQLITE_SIDE_FILES)):
        p.unlink(missing_ok=True)


def replay(config, input_path: Path, start: float, end: float, output_path: Path, dead_letter_path: Path,
           rng=None, progress=None, ledger_path: Path | None = None) -> dict[str, float]:
    """Replay ``input_path`` over the windows in [start, end); returns counts of what happened
    (operator output, NOT private).

    Writes one alert record per released window to ``output_path`` (in window order; a
    window the ledger holds as suppressed has no record, as on the alerts topic) and one
    line per invalid event to ``dead_letter_path``. ``ledger_path`` None: a fresh backtest
    ledger (``backtest_ledger(output_path)``, replaced if there); else that ledger, kept.
    Raises ``MonitorError`` if another process holds the ledger's lock.
    """
    from monitor.budget.accountant import BudgetAccountant
    from monitor.budget.ledger import WindowLedger
    from monitor.lockfile import LedgerInUse, LedgerLock
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
        raise MonitorError(f"--start {_iso(start)} and --end {_iso(end)} hold no whole window of {size:g} s "
                           "(windows start at multiples of it)")
    fresh = ledger_path is None
    ledger_path = backtest_ledger(output_path) if fresh else Path(ledger_path)
    try:
        lock = LedgerLock(ledger_path).acquire()
    except LedgerInUse as err:
        owner = str(err).split("(pid ", 1)[-1].split(")", 1)[0]
        raise MonitorError(
            f"--ledger {ledger_path.resolve()} is in use by a running monitor (pid {owner}): a replay into it would spend "
            f"that monitor's budget. Leave out --ledger for a backtest ledger of its own, or stop that monitor first"
        ) from None
    partial = output_path.with_name(f".{output_path.name}.partial-{os.getpid()}")
    try:
        if fresh:
            _remove_ledger(ledger_path)  # the previous backtest of this output: replaced with it
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
        ledger = WindowLedger(ledger_path)
        try:
            accountant = BudgetAccountant.from_settings(ledger, b)
            # Suppressed spans already in a given ledger (a `catch_up` entry covers many
            # windows): those windows were decided once, as not released.
            suppressed = [(e.window_start, e.window_end, e.reason) for e in ledger.entries(since=first)
                          if not e.released and e.window_start < last_end]
            releaser = WindowReleaser(config, accountant, model, rng=rng)
            delay = config.window.allowed_lateness_seconds + config.window.publish_delay_seconds
            epsilon = 0.0
            with open(partial, "w", encoding="utf-8") as out:
                # Every scheduled window in [first, last_end), empty or not, in order.
                for window in store.close_due(last_end + config.window.allowed_lateness_seconds):
                    counts["windows"] += 1
                    span = next((s for s in suppressed if s[0] <= window.start < s[1]), None)
                    if span is not None:
                        counts["suppressed_in_ledger"] += 1
                        continue
                    released = releaser.release(window, released_at=window.end + delay)
                    entry = released.entry
                    counts["replayed_from_ledger"] += released.replayed
                    if entry.payload is None:  # suppressed when it was first decided
                        counts["suppressed_in_ledger"] += 1
                        continue
                    out.write(entry.payload + "\n")
                    record = json.loads(entry.payload)
                    counts["written"] += 1
                    counts["pages"] += record.get("alarm") is True and (record.get("alarm_detail") or {}).get("state") == "fired"
                    report = record.get("report")
                    counts["reports"] += bool(report) and "suppressed" not in report
                    counts["reports_suppressed"] += bool(report) and "suppressed" in report
                    if not released.replayed:
                        epsilon += float(record.get("epsilon") or 0.0)
            spent = accountant.spent(last_end)[0]
        finally:
            ledger.close()
        os.replace(partial, output_path)
    except BaseException:
        partial.unlink(missing_ok=True)
        if fresh:
            _remove_ledger(ledger_path)  # nothing was written out: nothing was released
        raise
    finally:
        lock.release()
    return {**counts, "epsilon_charged": epsilon, "epsilon_spent_in_last_period": spent,
            "first": first, "last_end": last_end}


def _iso(t: float) -> str:
    from monitor.budget.plan import iso

    return iso(t)


def configure_replay(parser: argparse.ArgumentParser) -> None:
    """Options of ``monitor replay``."""
    from monitor.cli import add_config_option

    add_config_option(parser)
    parser.add_argument("--input", required=True, type=Path, help="JSON-lines file of events, one event per line")
    parser.add_argument("--start", required=True, metavar="T0",
                        help="ISO 8601 (2025-11-21T04:40:00Z; UTC without an offset) or epoch seconds: the first window "
                             "starts at the first multiple of window.size_seconds at or after it")
    parser.add_argument("--end", required=True, metavar="T1", help="ISO 8601 or epoch seconds: the last window ends at or before it")
    parser.add_argument("--output", required=True, type=Path, help="JSON-lines file to write one alert record per window to")
    parser.add_argument("--dead-letter", type=Path, help="where invalid events go, with their reason (default: OUTPUT.dead-letter.jsonl)")
    parser.add_argument("--ledger", type=Path, metavar="FILE",
                        help="charge this ledger (windows already in it are written as stored). Default: a fresh backtest "
                             "ledger OUTPUT.ledger.sqlite, replaced on each run. A ledger a running monitor holds is refused")
    parser.set_defaults(func=run_replay_command)


def run_replay_command(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from monitor.config import load_config

    config = load_config(args.config)
    start, end = parse_time(args.start, "--start"), parse_time(args.end, "--end")
    dead = args.dead_letter or args.output.with_name(args.output.name + ".dead-letter.jsonl")
    ledger = args.ledger or backtest_ledger(args.output)
    if args.ledger is None:
        where = (f"a fresh backtest ledger {ledger} (its own budget: budget.ledger {config.budget.ledger} is not "
                 "charged; --ledger FILE charges a given one)")
    else:
        where = f"the ledger {ledger} like a real run (windows already in it are written as stored)"
    print(f"replaying {args.input} over [{_iso(start)}, {_iso(end)}): replaying private data is a release; "
          f"this charges {where}", file=sys.stderr)
    s = replay(config, args.input, start, end, args.output, dead, ledger_path=args.ledger,
               progress=lambda n: print(f"  read {n} lines", file=sys.stderr))
    table = Table(title=f"Backtest [{_iso(s['first'])}, {_iso(s['last_end'])}) -> {args.output}", show_header=False,
                  box=None, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    stored = s.get("replayed_from_ledger", 0)
    table.add_row("windows", f"{s.get('windows', 0)} of {config.window.size_seconds:g} s, {s.get('written', 0)} written"
                  + (f", {stored} of them as stored in the ledger" if stored else "")
                  + (f", {s['suppressed_in_ledger']} suppressed in the ledger (no record)" if s.get("suppressed_in_ledger") else ""))
    table.add_row("pages", str(s.get("pages", 0)))
    table.add_row("detailed reports", f"{s.get('reports', 0)}" + (f" ({s['reports_suppressed']} more suppressed by the budget)"
                                                                    if s.get("reports_suppressed") else ""))
    table.add_row("epsilon charged", f"{s['epsilon_charged']:.4g} by this replay; {s['epsilon_spent_in_last_period']:.4g} "
                  f"in the rolling period ending {_iso(s['last_end'])} (limit {config.budget.epsilon:g})")
    table.add_row("events", f"{s.get('accepted', 0)} in windows, {s.get('duplicate_entity', 0)} duplicates of an entity in a "
                  f"window, {s.get('outside', 0)} outside [--start, --end), {s.get('dead_letter', 0)} invalid ({dead})")
    table.add_row("ledger", f"{ledger}" + (" (backtest ledger of its own)" if args.ledger is None else ""))
    Console(width=max(100, Console().width)).print(table)
    return 0
