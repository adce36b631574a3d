"""``monitor replay``: the monitor's pipeline over a file of events, for backtests and reviews.

Validation, the model, contribution bounding, windows on the window grid between the
public times T0 and T1, the alarm, detailed reports and ledger charges: exactly what
``monitor run`` does (the same ``EventSchema``, ``WindowStore`` and ``WindowReleaser``),
with a JSON-lines file in place of the input topic and files in place of the alerts and
dead-letter topics.

Replaying private data is a release, so it charges a ledger like a real run, and that
ledger remembers. By default it is the input's backtest ledger,
``<budget.ledger's folder>/backtest-ledgers/<input name>-<events digest, 16 hex>.sqlite``,
keyed by the events themselves (``events_digest``: each valid event's canonical form, hashed,
the hashes summed as a multiset), so blank or invalid lines, line and key order, spacing and
number spelling leave it the same; one event more, less or different makes it another. A
window already in the ledger is written out as stored, never redrawn; new windows are
charged under the config's caps. ``--redraw`` draws afresh into the input's next ledger,
which starts with every charge of the previous one; ``--ledger FILE`` charges a given
ledger; either way the replay holds the ledger's lock (``monitor.lockfile``). A ledger named
the old way (the sha256 of the file's bytes) is taken over by the next replay of those bytes.

Two streaming passes, memory bounded by the windows still open and the alarm's state, not
by the file: the first (``scan_input``) computes the digest and notes each window's last
batch of lines; the second validates in batches (``EventSchema.parse_batch``, as the live
path) and releases each window once the rest of the file holds none of its events, so a
file need not be in time order and no event in [--start, --end) is late. The output file
appears only when the whole replay succeeded; a file that changes while it is replayed is
refused (docs/operations.md, "Backtests").
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
from itertools import islice
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

from monitor.errors import MonitorError
from monitor.pipeline.windows import take

__all__ = ["replay", "configure_replay", "parse_time", "backtest_ledger", "input_digest", "scan_input", "events_digest",
           "InputScan"]

# Epoch seconds beyond this (year 5138) are taken for milliseconds in a user's input.
_MS_HINT_ABOVE = 1e11
BACKTEST_DIR = "backtest-ledgers"
_DIGEST_CHARS = 16  # 64 bits of sha256: two different inputs never share a ledger by chance
# Pages listed one per line in the summary; the rest are counted (``monitor alerts --input`` shows all).
_PAGES_LISTED = 20
# Lines read and validated at a time (both passes cut the file the same way); a batch is
# one EventSchema.parse_batch call, halved around an invalid line down to _SPLIT_BELOW.
_BATCH_LINES = 16384
_SPLIT_BELOW = 64
_PROGRESS_LINES = 1_000_000
# Entities' encoded forms kept between batches (the same devices come back every window).
_ENTITY_CACHE = 1_000_000
# Bumped if the canonical form of an event changes: a new form is a new key.
_CANONICAL_VERSION = 1


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
    """sha256 of the input's bytes (hex): what named a backtest ledger before ledgers were
    named by their events (``events_digest``); used to find such a ledger and take it over."""
    try:
        with open(input_path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as err:
        raise MonitorError(f"cannot read --input {input_path}: {err.strerror}") from None


class _Valid(NamedTuple):
    """Consecutive valid events of one batch, in file order, as columns."""

    ts: np.ndarray  # (n,) epoch seconds
    X: np.ndarray  # (n, d) raw feature values, config order
    entities: list[str] | None
    ids: list[str | None]  # the event's own id, or None
    lines: Sequence[int]  # each event's line number (1-based)


def _batches(source) -> Iterator[tuple[int, list[bytes]]]:
    """(first line number, lines) of ``_BATCH_LINES`` lines each: the same cut on both passes."""
    line_no = 1
    while True:
        lines = list(islice(source, _BATCH_LINES))
        if not lines:
            return
        yield line_no, lines
        line_no += len(lines)


def _validate(schema, lines: list[bytes], first_line: int) -> tuple[list[_Valid], list[tuple[int, bytes, Any]]]:
    """The valid events of a batch (in file order) and its invalid lines (line number, bytes,
    ``InvalidEvent``): exactly the live path's validation (``EventSchema``), one call per batch
    where it is all valid (``parse_batch``), per line only near an invalid line. Blank lines
    are neither."""
    values = [line.strip() for line in lines]
    if all(values):
        numbers: Sequence[int] = range(first_line, first_line + len(values))
    else:
        numbers = [first_line + k for k, v in enumerate(values) if v]
        values = [v for v in values if v]
    valid: list[_Valid] = []
    invalid: list[tuple[int, bytes, Any]] = []
    if values:
        # Plain functions, no closures: a recursive closure is a reference cycle that would
        # keep each batch's lines alive until the cyclic collector runs.
        _validate_part(schema, values, numbers, 0, len(values), valid, invalid)
    return valid, invalid


def _validate_part(schema, values: list[bytes], numbers: Sequence[int], lo: int, hi: int, valid: list, invalid: list) -> None:
    batch = schema.parse_batch(values[lo:hi]) if hi - lo >= _SPLIT_BELOW else None
    if batch is not None:
        valid.append(_Valid(batch.timestamps, batch.X, batch.entities, batch.event_ids, numbers[lo:hi]))
        return
    if hi - lo < 2 * _SPLIT_BELOW:
        _validate_lines(schema, values, numbers, lo, hi, valid, invalid)
        return
    # An invalid line (or ISO times) somewhere: halve, so one bad line costs a few batch
    # calls, not a batch of per-line calls; where both halves fail, go per line.
    mid = (lo + hi) // 2
    left, right = schema.parse_batch(values[lo:mid]), schema.parse_batch(values[mid:hi])
    if left is None and right is None:
        _validate_lines(schema, values, numbers, lo, hi, valid, invalid)
        return
    for (a, b), got in (((lo, mid), left), ((mid, hi), right)):
        if got is not None:
            valid.append(_Valid(got.timestamps, got.X, got.entities, got.event_ids, numbers[a:b]))
        else:
            _validate_part(schema, values, numbers, a, b, valid, invalid)


def _validate_lines(schema, values: list[bytes], numbers: Sequence[int], lo: int, hi: int, valid: list,
                    invalid: list) -> None:
    """``EventSchema.parse`` line by line: the one authority on a rejection's reason and detail."""
    from monitor.pipeline.events import InvalidEvent

    ts, rows, ents, ids, nos = [], [], [], [], []
    for k in range(lo, hi):
        try:
            ev = schema.parse(values[k])
        except InvalidEvent as bad:
            invalid.append((numbers[k], values[k], bad))
            continue
        ts.append(ev.timestamp), rows.append(ev.features), ents.append(ev.entity), ids.append(ev.event_id)
        nos.append(numbers[k])
    if ts:
        valid.append(_Valid(np.asarray(ts, dtype=float), np.asarray(rows, dtype=float).reshape(len(ts), -1),
                            ents if schema.entity_field else None, ids, nos))


def _event_sum(part: _Valid, cache: dict) -> int:
    """Sum over the events of their canonical digests (each read as a 256-bit integer).

    An event's canonical form is what the monitor uses of it after validation: its time and
    feature values as IEEE-754 doubles (little-endian, config order; exact, so 72, 72.0 and
    7.2e1 are one value) and its entity (a tag byte, then UTF-8; an integer entity is its
    decimal string, as the windows see it). Key order, spacing, number spelling and any
    other field of the line do not enter it."""
    n = len(part.ts)
    rows = np.empty((n, 1 + part.X.shape[1]), dtype="<f8")
    rows[:, 0] = part.ts
    rows[:, 1:] = part.X
    fixed = rows.view(np.dtype((np.void, rows.shape[1] * 8))).ravel().tolist()
    sha = hashlib.sha256
    if part.entities is None:
        digests = [sha(r + b"\x00").digest() for r in fixed]
    else:
        tags = [cache.get(e) or cache.setdefault(e, b"\x01" + e.encode("utf-8", "surrogatepass")) for e in part.entities]
        if len(cache) > _ENTITY_CACHE:
            cache.clear()
        digests = [sha(r + t).digest() for r, t in zip(fixed, tags)]
    limbs = np.frombuffer(b"".join(digests), dtype="<u4").reshape(n, 8).sum(axis=0, dtype=np.uint64)
    return sum(int(v) << (32 * j) for j, v in enumerate(limbs.tolist()))


class InputScan(NamedTuple):
    """The first pass over an input (``scan_input``): what names its backtest ledger, and
    where in the file each window's last event is (so the second pass closes each window
    as soon as the file holds no more of its events)."""

    events_digest: str  # sha256 hex of the valid events as a multiset (``events_digest``)
    byte_digest: str  # sha256 hex of the bytes (finds a ledger named the old way)
    events: int  # valid events
    invalid: int  # invalid lines
    last_batch: dict[int, int]  # window index -> the last batch holding one of its events
    window_size: float
    stat: tuple[int, int, int, int]  # (device, inode, size, mtime_ns) when scanned


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def scan_input(config, input_path: Path) -> InputScan:
    """One streaming pass over ``input_path``: the digest of its valid events (what keys its
    backtest ledger), the digest of its bytes, and each window's last batch. Memory: one
    batch of lines and a number per window."""
    from monitor.pipeline.events import EventSchema

    schema = EventSchema.from_config(config)
    size = config.window.size_seconds
    total, events, invalid = 0, 0, 0
    last_batch: dict[int, int] = {}
    cache: dict = {}
    raw = hashlib.sha256()
    try:
        source = open(input_path, "rb")
    except OSError as err:
        raise MonitorError(f"cannot read --input {input_path}: {err.strerror}") from None
    with source:
        before = _stat_key(os.fstat(source.fileno()))
        for b, (first_line, lines) in enumerate(_batches(source)):
            raw.update(b"".join(lines))
            valid, bad = _validate(schema, lines, first_line)
            invalid += len(bad)
            for part in valid:
                events += len(part.ts)
                total += _event_sum(part, cache)
                for n in np.unique(np.floor(part.ts / size).astype(np.int64)).tolist():
                    last_batch[n] = b
        if _stat_key(os.fstat(source.fileno())) != before:
            raise MonitorError(f"--input {input_path} changed while it was read: replay a file that is no longer written to")
    return InputScan(events_digest(config, events, total), raw.hexdigest(), events, invalid, last_batch, size, before)


def events_digest(config, events: int, digest_sum: int) -> str:
    """The key of a backtest ledger: sha256 over the feature names (config order), whether
    events carry an entity, the number of valid events and the sum of their canonical
    digests modulo 2**256 (``_event_sum``): a multiset hash, so the order of the lines,
    blank lines and the JSON's spelling leave it unchanged, and any other event changes it."""
    body = json.dumps({"canonical": _CANONICAL_VERSION, "features": list(config.feature_names),
                       "entity": config.stream.entity_field is not None, "events": events,
                       "sum": f"{digest_sum % (1 << 256):064x}"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def _ledger_folder(config) -> Path:
    return Path(config.budget.ledger).parent / BACKTEST_DIR


def _draws_named(folder: Path, digest: str) -> list[tuple[str, int, Path]]:
    pattern = re.compile(rf"(.+-{digest[:_DIGEST_CHARS]})(?:\.draw(\d+))?\.sqlite")
    return sorted((m.group(1), int(m.group(2) or 1), p) for p in (folder.iterdir() if folder.is_dir() else ())
                  if (m := pattern.fullmatch(p.name)))


def _backtest_ledgers(config, input_path: Path, digest: str) -> tuple[Path, dict[int, Path]]:
    # (the first draw's path, which also names the lock; the existing draws by number).
    # Found by the digest alone, so a renamed input, or a deleted first draw, forgets nothing.
    folder = _ledger_folder(config)
    found = _draws_named(folder, digest)
    if found:
        stem = found[0][0]
    else:
        stem = (re.sub(r"[^A-Za-z0-9._]+", "_", Path(input_path).stem)[:40] or "input") + f"-{digest[:_DIGEST_CHARS]}"
    return folder / f"{stem}.sqlite", {k: p for st, k, p in found if st == stem}


def _byte_keyed(config, byte_digest: str) -> dict[int, Path]:
    """The draws of a ledger named by the input's bytes (as before ledgers were named by
    their events), by number."""
    found = _draws_named(_ledger_folder(config), byte_digest)
    return {k: p for st, k, p in found if st == found[0][0]} if found else {}


def _draw_path(base: Path, k: int) -> Path:
    return base if k == 1 else base.with_name(f"{base.stem}.draw{k}.sqlite")


def backtest_ledger(config, input_path: Path, digest: str | None = None, redraw: bool = False,
                    scan: InputScan | None = None) -> Path:
    """The backtest ledger of an input: keyed by its valid events (``events_digest``), in
    ``backtest-ledgers/`` beside ``budget.ledger``. The name starts with the input's file
    name only to be readable; an existing ledger of the same events under another name is
    the one returned, and one named by the same bytes the old way is the one the next
    replay takes over (under this name). Its latest draw, or with ``redraw`` the next one."""
    if digest is None:
        scan = scan or scan_input(config, input_path)
        digest = scan.events_digest
    base, draws = _backtest_ledgers(config, input_path, digest)
    if not draws and scan is not None:
        draws = {k: _draw_path(base, k) for k in _byte_keyed(config, scan.byte_digest)}
    if not draws:
        return base
    return _draw_path(base, max(draws) + 1) if redraw else draws[max(draws)]


def _add_charges(previous: Path, led) -> None:
    # A window row's cost is its report's; "report" composes as that row did.
    from monitor.budget.ledger import WindowLedger

    with WindowLedger(previous) as old, led.transaction():
        for e in old.entries():
            if e.released and (e.epsilon > 0 or e.delta > 0):
                led.add_charge("report", e.window_start, e.window_end, e.epsilon, e.delta)
        for _, kind, start, end, eps, delta in old.span_charges():
            led.add_charge(kind, start, end, eps, delta)


def _seed_draw(previous: Path, new: Path) -> None:
    """Make ``new`` hold every charge ``previous`` holds (its windows' costs as span charges
    over each window), atomically: a ledger that exists is never one that forgot."""
    from monitor.budget.ledger import WindowLedger

    tmp = new.with_name(f".{new.name}.seeding-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    with WindowLedger(tmp) as led:
        _add_charges(previous, led)
        with WindowLedger(previous) as old:
            assert math.isclose(led.total_epsilon(), old.total_epsilon(), rel_tol=1e-12, abs_tol=1e-12)
    os.replace(tmp, new)


def _move_ledger(old: Path, new: Path) -> None:
    """Rename a closed ledger with its SQLite side files (a clean open and close first
    folds a write-ahead log left by a crash into the file)."""
    from monitor.budget.ledger import WindowLedger

    WindowLedger(old).close()
    for suffix in ("-wal", "-shm", "-journal"):
        side = old.with_name(old.name + suffix)
        if side.exists():
            os.replace(side, new.with_name(new.name + suffix))
    os.replace(old, new)


def _take_over_byte_keyed(config, scan: InputScan, base: Path, draws: dict[int, Path]) -> list[tuple[Path, Path, str]]:
    """A ledger named by this input's bytes (from before ledgers were named by their
    events) is this input's: with no ledger of its events yet, its draws are renamed to the
    events' names (kept, charges and stored windows whole); beside one, the old one's
    charges are added to the latest draw and it is renamed ``...sqlite.folded-into-<key>``
    (kept, never counted twice). Under ``base``'s lock. Returns (old, new, how) per file."""
    from monitor.budget.ledger import WindowLedger
    from monitor.lockfile import LedgerInUse, LedgerLock

    old = _byte_keyed(config, scan.byte_digest)
    if not old:
        return []
    try:
        lock = LedgerLock(old[min(old)]).acquire()
    except LedgerInUse as err:
        raise MonitorError(f"the backtest ledger named by this input's bytes, {old[min(old)].resolve()}, is in use by "
                           f"another replay ({err}): wait for it to finish") from None
    done = []
    try:
        if not draws:
            for k, path in sorted(old.items()):
                _move_ledger(path, _draw_path(base, k))
                done.append((path, _draw_path(base, k), "renamed"))
        else:
            with WindowLedger(draws[max(draws)]) as led:
                _add_charges(old[max(old)], led)  # the latest draw holds every earlier draw's charges
            done.append((old[max(old)], draws[max(draws)], "charges added"))
            for k, path in sorted(old.items()):
                folded = path.with_name(f"{path.name}.folded-into-{scan.events_digest[:_DIGEST_CHARS]}")
                _move_ledger(path, folded)
                done.append((path, folded, "renamed"))
    finally:
        lock.release()
    return done


def replay(config, input_path: Path, start: float, end: float, output_path: Path, dead_letter_path: Path,
           rng=None, progress=None, ledger_path: Path | None = None, redraw: bool = False,
           scan: InputScan | None = None) -> dict[str, Any]:
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

    Two streaming passes: ``scan_input`` (the events' digest, which picks the ledger, and
    where each window's last event lies; ``scan`` if the caller made it already), then the
    replay, which releases each window as soon as the file holds no more of its events.
    Memory holds the windows still open, not the file: a file in time order holds a few.
    """
    from monitor.budget.accountant import BudgetAccountant
    from monitor.budget.ledger import WindowLedger
    from monitor.lockfile import LedgerInUse, LedgerLock
    from monitor.pipeline.events import EventSchema
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
    if scan is None or scan.window_size != size:
        scan = scan_input(config, input_path)
    draw = None
    taken_over: list[tuple[Path, Path, str]] = []
    if own:
        # Every draw of one content shares the first draw's lock: two replays never pick
        # the same next draw, nor charge one while the other seeds the next.
        base, _ = _backtest_ledgers(config, input_path, scan.events_digest)
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
            _, draws = _backtest_ledgers(config, input_path, scan.events_digest)  # again: now under the lock
            taken_over = _take_over_byte_keyed(config, scan, base, draws)
            if taken_over:
                _, draws = _backtest_ledgers(config, input_path, scan.events_digest)
            draw = max(draws, default=1) + (redraw and bool(draws))
            ledger_path = _draw_path(base, draw)
            if draw not in draws and draws:
                _seed_draw(draws[max(draws)], ledger_path)
        model = load_model(config)
        schema = EventSchema.from_config(config)
        store = WindowStore(size, config.window.allowed_lateness_seconds, first, len(config.features))
        end_index = store.index_of(last_end)
        counts: Counter[str] = Counter()
        b = config.budget
        ledger_path.parent.mkdir(parents=True, exist_ok=True)
        ledger = WindowLedger(ledger_path)
        pages: list[dict[str, Any]] = []
        try:
            source = open(input_path, "rb")
        except OSError as err:
            ledger.close()
            raise MonitorError(f"cannot read --input {input_path}: {err.strerror}") from None
        try:
            accountant = BudgetAccountant.from_settings(ledger, b)
            lifetime_before = ledger.total_epsilon()
            # Suppressed spans already in a given ledger (a `catch_up` entry covers many
            # windows): those windows were decided once, as not released.
            suppressed = [(e.window_start, e.window_end, e.reason) for e in ledger.entries(since=first)
                          if not e.released and e.window_start < last_end]
            releaser = WindowReleaser(config, accountant, model, rng=rng)
            delay = config.window.allowed_lateness_seconds + config.window.publish_delay_seconds

            def release_through(now: float, out) -> None:
                # Every scheduled window closing by ``now``, empty or not, in order.
                for window in store.close_due(now):
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

            def changed() -> MonitorError:
                return MonitorError(f"--input {input_path} changed during the replay: the windows released so far stay "
                                    f"charged to {ledger_path}; replay a file that is no longer written to")

            with source, open(dead_letter_path, "w", encoding="utf-8") as dead, open(partial, "w", encoding="utf-8") as out:
                if _stat_key(os.fstat(source.fileno())) != scan.stat:
                    raise changed()
                no_flags = np.zeros(_BATCH_LINES, dtype=bool)
                last_batch = scan.last_batch
                for batch_no, (first_line, lines) in enumerate(_batches(source)):
                    valid, invalid = _validate(schema, lines, first_line)
                    for line_no, value, bad in invalid:
                        counts["dead_letter"] += 1
                        dead.write(json.dumps({"line": line_no, "reason": bad.reason, "detail": bad.detail,
                                               "value": value.decode("utf-8", "replace")}) + "\n")
                    for part in valid:
                        ts = part.ts
                        inside = (ts >= first) & (ts < last_end)
                        keep = None if inside.all() else np.flatnonzero(inside)
                        if keep is not None:
                            counts["outside"] += len(ts) - len(keep)
                            if not len(keep):
                                continue
                        ids, lines_of, entities = part.ids, part.lines, part.entities
                        if keep is not None:
                            ts, X = ts[keep], part.X[keep]
                            ids, lines_of = take(ids, keep), take(lines_of, keep)
                            entities = None if entities is None else take(entities, keep)
                        else:
                            X = part.X
                        if None in ids:
                            ids = [f"line {n}" if i is None else i for i, n in zip(ids, lines_of)]
                        counts.update(store.add_batch(ts, X, no_flags[:len(ts)], event_ids=ids, entities=entities))
                    counts["open_windows_peak"] = max(counts["open_windows_peak"], len(store._open))
                    # Release every window the rest of the file has no event of (the scan
                    # says which): the same windows as holding the whole file, none late.
                    n = store.next_index
                    while n < end_index and last_batch.get(n, -1) <= batch_no:
                        n += 1
                    if n > store.next_index:
                        release_through(store.close_time(n - 1), out)
                    if _stat_key(os.fstat(source.fileno())) != scan.stat:
                        raise changed()
                    if progress is not None and (first_line + len(lines) - 1) // _PROGRESS_LINES > (first_line - 1) // _PROGRESS_LINES:
                        progress(first_line + len(lines) - 1)
                release_through(last_end + config.window.allowed_lateness_seconds, out)
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
            "draw": draw, "taken_over": taken_over, "events_digest": scan.events_digest}


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
                        help="charge this ledger instead of the input's backtest ledger (backtest-ledgers/NAME-DIGEST.sqlite "
                             "beside budget.ledger, DIGEST of the file's valid events, whatever their order or JSON "
                             "formatting: shared by every replay of the same events). Windows already in the ledger "
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
    print(f"reading {args.input} for the digest of its events (which names its backtest ledger)", file=sys.stderr)
    scan = scan_input(config, args.input)
    own_ledger = backtest_ledger(config, args.input, scan.events_digest, scan=scan)
    old = _byte_keyed(config, scan.byte_digest)
    ledger = args.ledger or own_ledger
    if args.ledger is None and old:
        print(f"{', '.join(str(p) for p in old.values())}: a backtest ledger of these bytes named the old way (by the "
              f"file's bytes, not its events); this replay takes it over as this input's "
              + ("(renamed)" if not _backtest_ledgers(config, args.input, scan.events_digest)[1]
                 else "(its charges added to the events' ledger, the file kept as *.folded-into-*)"), file=sys.stderr)
    if args.ledger is None and args.redraw and (own_ledger.exists() or old):
        where = (f"a fresh draw in {backtest_ledger(config, args.input, scan.events_digest, redraw=True, scan=scan)}, which "
                 f"starts with every charge of {own_ledger}: a new release, charged on top of the earlier draws under the "
                 "same caps")
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
               progress=lambda n: print(f"  replayed {n} lines", file=sys.stderr), scan=scan)
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
    for before, after, how in s["taken_over"]:
        table.add_row("taken over", f"{before}: named by the file's bytes (before ledgers were named by their events), "
                      + ("renamed " if how == "renamed" else "its charges added to ") + str(after))
    table.add_row("ledger spent", f"{s['epsilon_spent_in_last_period']:.4g} in the rolling period ending {_iso(s['last_end'])} "
                  f"(limit {b.epsilon:g}); {s['epsilon_lifetime_spent']:.4g} since the ledger began ({_limit(b.lifetime_epsilon)})")
    table.add_row("events", f"{s.get('accepted', 0)} in windows, {s.get('duplicate_entity', 0)} duplicates of an entity in a "
                  f"window, {s.get('outside', 0)} outside [--start, --end), {s.get('dead_letter', 0)} invalid ({dead})")
    Console(width=max(100, Console().width)).print(table)
    return 0
