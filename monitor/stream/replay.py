"""``monitor replay``: the monitor's pipeline over a file of events, for backtests and reviews.

Validation, the model, contribution bounding, windows on the window grid between the
public times T0 and T1, the alarm, detailed reports and ledger charges: exactly what
``monitor run`` does (the same ``EventSchema``, ``WindowStore`` and ``WindowReleaser``),
with a JSON-lines file in place of the input topic and files in place of the alerts and
dead-letter topics.

Replaying private data is a release, so it charges a ledger like a real run, and that
ledger remembers. By default it is the input's backtest ledger,
``<budget.ledger's folder>/backtest-ledgers/<input name>-<sha256 of its bytes, 16 hex>.sqlite``:
one per content (a copy under another name finds the same one), never deleted, under the
config's period and lifetime caps (``budget.epsilon``, ``budget.lifetime_epsilon``). Every
replay of the same data adds to it, so repeated backtests add up against one lifetime cap
instead of each starting afresh. A window already in the ledger is written out as stored,
never redrawn: averaging several draws of one window would remove its noise. New windows
(another range) are charged. ``--redraw`` (another setting on the same data) draws afresh
into the input's next backtest ledger, ``...-<sha256>.draw<k>.sqlite``, which starts with
every charge the previous one holds: a new release, charged on top of the earlier ones
under the same caps, never free. ``--ledger FILE`` charges a given ledger instead (the same
rules; its caps are its own). Either way the replay holds the ledger's lock
(``monitor.lockfile``), so it refuses a ledger that a running monitor or another replay writes.

The output file appears only when the whole replay succeeded (written beside it, then
renamed); windows charged before a failure stay in the ledger and are written as stored
next time. All events are held until the end (the file need not be in time order), so the
file must fit in memory.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from monitor.errors import MonitorError

__all__ = ["replay", "configure_replay", "parse_time", "backtest_ledger", "input_digest"]

# Epoch seconds beyond this (year 5138) are taken for milliseconds in a user's input.
_MS_HINT_ABOVE = 1e11
BACKTEST_DIR = "backtest-ledgers"
_DIGEST_CHARS = 16  # 64 bits of sha256: two different inputs never share a ledger by chance
# Pages listed one per line in the summary; the rest are counted (``monitor alerts --input`` shows all).
_PAGES_LISTED = 20


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


def input_digest(input_path: Path) -> str:
    """sha256 of the input's bytes (hex): what names its backtest ledger."""
    try:
        with open(input_path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as err:
        raise MonitorError(f"cannot read --input {input_path}: {err.strerror}") from None


def _backtest_ledgers(config, input_path: Path, digest: str) -> tuple[Path, dict[int, Path]]:
    # (the first draw's path, which also names the lock; the existing draws by number).
    # Found by the digest alone, so a renamed input, or a deleted first draw, forgets nothing.
    digest = digest[:_DIGEST_CHARS]
    folder = Path(config.budget.ledger).parent / BACKTEST_DIR
    pattern = re.compile(rf"(.+-{digest})(?:\.draw(\d+))?\.sqlite")
    found = sorted((m.group(1), int(m.group(2) or 1), p) for p in (folder.iterdir() if folder.is_dir() else ())
                   if (m := pattern.fullmatch(p.name)))
    if found:
        stem = found[0][0]
    else:
        stem = (re.sub(r"[^A-Za-z0-9._]+", "_", Path(input_path).stem)[:40] or "input") + f"-{digest}"
    return folder / f"{stem}.sqlite", {k: p for st, k, p in found if st == stem}


def _draw_path(base: Path, k: int) -> Path:
    return base if k == 1 else base.with_name(f"{base.stem}.draw{k}.sqlite")


def backtest_ledger(config, input_path: Path, digest: str | None = None, redraw: bool = False) -> Path:
    """The backtest ledger of an input: keyed by its content, in ``backtest-ledgers/`` beside
    ``budget.ledger``. The name starts with the input's file name only to be readable; an
    existing ledger of the same content under another name is the one returned. Its latest
    draw, or with ``redraw`` the next one (``--redraw``)."""
    base, draws = _backtest_ledgers(config, input_path, digest or input_digest(input_path))
    if not draws:
        return base
    return _draw_path(base, max(draws) + 1) if redraw else draws[max(draws)]


def _seed_draw(previous: Path, new: Path) -> None:
    """Make ``new`` hold every charge ``previous`` holds (its windows' costs as span charges
    over each window), atomically: a ledger that exists is never one that forgot."""
    from monitor.budget.ledger import WindowLedger

    tmp = new.with_name(f".{new.name}.seeding-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    with WindowLedger(previous) as old, WindowLedger(tmp) as led:
        with led.transaction():
            # A window row's cost is its report's; "report" composes as that row did.
            for e in old.entries():
                if e.released and (e.epsilon > 0 or e.delta > 0):
                    led.add_charge("report", e.window_start, e.window_end, e.epsilon, e.delta)
            for _, kind, start, end, eps, delta in old.span_charges():
                led.add_charge(kind, start, end, eps, delta)
        assert math.isclose(led.total_epsilon(), old.total_epsilon(), rel_tol=1e-12, abs_tol=1e-12)
    os.replace(tmp, new)


def replay(config, input_path: Path, start: float, end: float, output_path: Path, dead_letter_path: Path,
           rng=None, progress=None, ledger_path: Path | None = None, redraw: bool = False) -> dict[str, Any]:
    """Replay ``input_path`` over the windows in [start, end); returns counts of what happened
    (operator output, NOT private) and, under ``"pages"``, each page of the output (its
    window start, headline, epsilon and whether it was stored by an earlier replay: all
    read from the released records).

    Writes one alert record per released window to ``output_path`` (in window order; a
    window the ledger holds as suppressed has no record, as on the alerts topic) and one
    line per invalid event to ``dead_letter_path``. ``ledger_path`` None: the input's
    backtest ledger (``backtest_ledger``); else that ledger. Neither is ever deleted.
    ``redraw``: draw every window afresh into the input's next backtest ledger, seeded with
    every charge of the previous one. Raises ``MonitorError`` if another process holds the
    ledger's lock.
    """
    from monitor.budget.accountant import BudgetAccountant
    from monitor.budget.ledger import WindowLedger
    from monitor.lockfile import LedgerInUse, LedgerLock
    from monitor.pipeline.events import EventSchema, InvalidEvent
    from monitor.pipeline.publisher import headline
    from monitor.pipeline.service import load_model
    from monitor.pipeline.windows import WindowStore
    from monitor.release import WindowReleaser

    if config.stream.timestamp_field is None:
        raise MonitorError("replay needs event times in the events: set stream.timestamp_field (a file has no Kafka timestamps)")
    size = config.window.size_seconds
    if end <= start:
        raise MonitorError(f"--end {_iso(end)} is {'the same as' if end == start else 'before'} --start {_iso(start)}: "
                           "--start is the first event time to replay, --end the last window's end, so --end must come later")
    first = math.ceil(start / size) * size
    last_end = math.floor(end / size) * size
    if last_end <= first:
        raise MonitorError(f"--start {_iso(start)} and --end {_iso(end)} hold no whole window of {size:g} s "
                           "(windows start at multiples of it)")
    own = ledger_path is None
    if redraw and not own:
        raise MonitorError("--redraw draws afresh into the input's next backtest ledger; a ledger given with --ledger keeps "
                           "its windows as stored: leave out one of them")
    draw = None
    if own:
        # Every draw of one content shares the first draw's lock: two replays never pick
        # the same next draw, nor charge one while the other seeds the next.
        digest = input_digest(input_path)
        base, _ = _backtest_ledgers(config, input_path, digest)
    else:
        base = ledger_path = Path(ledger_path)
    try:
        lock = LedgerLock(base).acquire()
    except LedgerInUse as err:
        owner = str(err).split("(pid ", 1)[-1].split(")", 1)[0]
        if own:
            raise MonitorError(f"the backtest ledger of {input_path}, {base.resolve()}, is in use by another replay "
                               f"of the same data (pid {owner}): wait for it to finish") from None
        raise MonitorError(
            f"--ledger {ledger_path.resolve()} is in use by a running monitor (pid {owner}): a replay into it would spend "
            f"that monitor's budget. Leave out --ledger to charge the input's backtest ledger, or stop that monitor first"
        ) from None
    partial = output_path.with_name(f".{output_path.name}.partial-{os.getpid()}")
    try:
        if own:
            _, draws = _backtest_ledgers(config, input_path, digest)  # again: now under the lock
            draw = max(draws, default=1) + (redraw and bool(draws))
            ledger_path = _draw_path(base, draw)
            if draw not in draws and draws:
                _seed_draw(draws[max(draws)], ledger_path)
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
        ledger_path.parent.mkdir(parents=True, exist_ok=True)
        ledger = WindowLedger(ledger_path)
        pages: list[dict[str, Any]] = []
        try:
            accountant = BudgetAccountant.from_settings(ledger, b)
            lifetime_before = ledger.total_epsilon()
            # Suppressed spans already in a given ledger (a `catch_up` entry covers many
            # windows): those windows were decided once, as not released.
            suppressed = [(e.window_start, e.window_end, e.reason) for e in ledger.entries(since=first)
                          if not e.released and e.window_start < last_end]
            releaser = WindowReleaser(config, accountant, model, rng=rng)
            delay = config.window.allowed_lateness_seconds + config.window.publish_delay_seconds
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
                    report = record.get("report")
                    counts["reports"] += bool(report) and "suppressed" not in report
                    counts["reports_suppressed"] += bool(report) and "suppressed" in report
                    record_eps = float(record.get("epsilon") or 0.0)
                    if record.get("alarm") is True and (record.get("alarm_detail") or {}).get("state") == "fired":
                        counts["pages"] += 1
                        pages.append({"window_start": record.get("window_start"), "headline": headline(report),
                                      "epsilon": record_eps, "stored": released.replayed})
            spent = accountant.spent(last_end)[0]
            lifetime = ledger.total_epsilon()
            epsilon = max(0.0, lifetime - lifetime_before)
        finally:
            ledger.close()
        os.replace(partial, output_path)
    except BaseException:
        # The ledger stays whatever happened: what it charged was drawn, and a rerun
        # writes those windows as stored instead of drawing them again.
        partial.unlink(missing_ok=True)
        raise
    finally:
        lock.release()
    return {**counts, "epsilon_charged": epsilon, "epsilon_spent_in_last_period": spent,
            "epsilon_lifetime_spent": lifetime, "first": first, "last_end": last_end,
            "ledger": ledger_path, "backtest_ledger": own, "pages": pages,
            "draw": draw}


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
                        help="charge this ledger instead of the input's backtest ledger (backtest-ledgers/NAME-SHA256.sqlite "
                             "beside budget.ledger, shared by every replay of the same data). Windows already in the ledger "
                             "are written as stored, never redrawn. A ledger a running monitor holds is refused")
    parser.add_argument("--redraw", action="store_true",
                        help="draw every window afresh (another setting on the same data) into the input's next backtest "
                             "ledger, which starts with every charge of the previous one: a new release, charged on top under "
                             "the same period and lifetime caps")
    parser.set_defaults(func=run_replay_command)


def _limit(value: float | None) -> str:
    return "no cap: budget.lifetime_epsilon is null" if value is None else f"cap {value:g}"


def run_replay_command(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from monitor.config import load_config

    config = load_config(args.config)
    start, end = parse_time(args.start, "--start"), parse_time(args.end, "--end")
    dead = args.dead_letter or args.output.with_name(args.output.name + ".dead-letter.jsonl")
    if args.redraw and args.ledger is not None:
        raise MonitorError("--redraw draws afresh into the input's next backtest ledger; a ledger given with --ledger keeps "
                           "its windows as stored: leave out one of them")
    digest = input_digest(args.input)
    own_ledger = backtest_ledger(config, args.input, digest)
    ledger = args.ledger or own_ledger
    if args.ledger is None and args.redraw and own_ledger.exists():
        where = (f"a fresh draw in {backtest_ledger(config, args.input, digest, redraw=True)}, which starts with every charge "
                 f"of {own_ledger}: a new release, charged on top of the earlier draws under the same caps")
    elif args.ledger is None:
        where = (f"the backtest ledger of this input, {ledger} (every replay of the same data charges it: its period and "
                 f"lifetime caps hold across them; budget.ledger {config.budget.ledger} is not charged)")
    else:
        where = f"the ledger {ledger} like a real run (windows already in it are written as stored)"
        if own_ledger.exists() and own_ledger.resolve() != Path(args.ledger).resolve():
            where += (f". This data also has a backtest ledger, {own_ledger}: its charges and {args.ledger}'s are capped "
                      "separately, though both are about the same people")
    print(f"replaying {args.input} over [{_iso(start)}, {_iso(end)}): replaying private data is a release; "
          f"this charges {where}", file=sys.stderr)
    s = replay(config, args.input, start, end, args.output, dead, ledger_path=args.ledger, redraw=args.redraw,
               progress=lambda n: print(f"  read {n} lines", file=sys.stderr))
    table = Table(title=f"Backtest [{_iso(s['first'])}, {_iso(s['last_end'])}) -> {args.output}", show_header=False,
                  box=None, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    stored = s.get("replayed_from_ledger", 0)
    table.add_row("windows", f"{s.get('windows', 0)} of {config.window.size_seconds:g} s, {s.get('written', 0)} written"
                  + (f", {stored} of them as stored in the ledger by an earlier replay (not drawn again, not charged again; "
                     "a setting changed since does not apply to them: --redraw draws afresh, charged)" if stored else "")
                  + (f", {s['suppressed_in_ledger']} suppressed in the ledger (no record)" if s.get("suppressed_in_ledger") else ""))
    pages = s["pages"]
    table.add_row("pages", str(len(pages)))
    for page in pages[:_PAGES_LISTED]:
        table.add_row("", escape(f"{_iso(page['window_start'])}  {page['headline']}  (epsilon {page['epsilon']:.3g}"
                                 + (", stored earlier)" if page["stored"] else ")")))
    if len(pages) > _PAGES_LISTED:
        table.add_row("", f"... {len(pages) - _PAGES_LISTED} more: monitor alerts --input {args.output}")
    table.add_row("detailed reports", f"{s.get('reports', 0)}" + (f" ({s['reports_suppressed']} more suppressed by the budget)"
                                                                    if s.get("reports_suppressed") else ""))
    b = config.budget
    table.add_row("epsilon charged", f"{s['epsilon_charged']:.4g} by this replay")
    draw = s["draw"]
    table.add_row("ledger", f"{s['ledger']}" + ("" if draw is None else " (the backtest ledger of this input"
                                                + (f", draw {draw}: it holds the charges of draws 1 to {draw - 1} too)"
                                                   if draw > 1 else ")")))
    table.add_row("ledger spent", f"{s['epsilon_spent_in_last_period']:.4g} in the rolling period ending {_iso(s['last_end'])} "
                  f"(limit {b.epsilon:g}); {s['epsilon_lifetime_spent']:.4g} since the ledger began ({_limit(b.lifetime_epsilon)})")
    table.add_row("events", f"{s.get('accepted', 0)} in windows, {s.get('duplicate_entity', 0)} duplicates of an entity in a "
                  f"window, {s.get('outside', 0)} outside [--start, --end), {s.get('dead_letter', 0)} invalid ({dead})")
    Console(width=max(100, Console().width)).print(table)
    return 0
