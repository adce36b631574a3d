"""At start, the alarm's rhythm history re-read from the input topic (no release, no charge).

With ``alarm.follow_rhythm`` the releaser's rhythm reference keeps up to a week of each
person's weights in memory (``RhythmReference.reach_windows``), and a restart loses them: the
alarm then compares with the plain baseline, then the first day's trend, and with the days
before only once a day has passed (docs/benchmarks/alarm-rhythm.md, "A restart on rhythmic
traffic"). What the trust boundary still holds of those days is the input topic, so stage 2
re-reads it before its first release:

- the span: from the next window to release less the two days' reach (``rebuilt_windows``: what
  its comparison reads but the week-old set, whose re-read would take 3.4 times as long) to the
  end of the ledger's last released window;
- every partition of the input topic, assigned (no consumer group: stage 1's offsets are not
  touched), from ``offsets_for_times`` at the span's start less a window and the lateness (a
  record's event time may be that far past its timestamp and still pass the horizon), up to
  the log end seen at the first fetch, or the first record created at or after the last
  window's close (nothing later can be in a released window);
- each record validated as stage 1 validates it (``EventSchema``); invalid ones are skipped
  (they were dead-lettered when first read); the window rules of stage 1 applied from the log
  alone: event time in a released window of the span, record created before that window's
  close, before the first record of its partition created at or after the close (the
  *cut*, approximated by the timestamps: stage 1 reads the log end at the close, which a
  restart cannot see again), event time before the horizon (created + window + lateness);
- one event per entity per window, the first in log order (offsets within a partition,
  then partition order, as stage 2 merges), and one ``ClosedWindow`` per released window of
  the span (empty where the topic holds nothing of it), handed oldest first to
  ``WindowReleaser.rebuild``, which learns only the windows the ledger holds as released.

Nothing is published, charged or dead-lettered. The read is of raw data inside the trust
boundary; the runs that read the rebuilt history are charged over their reach, from the span's
start at the earliest (``RhythmReference.held_windows``; docs/budget.md, "What a run reads").
The read stops after ``REBUILD_TIMEOUT_S``: the windows read completely by then are learnt, the
rest are not, with a warning.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from monitor.budget.plan import duration, iso
from monitor.pipeline.events import InvalidEvent
from monitor.pipeline.windows import ClosedWindow

log = logging.getLogger("monitor.stream")

__all__ = ["REBUILD_TIMEOUT_S", "RESTART_COST", "HistoryRead", "Rebuilt", "history_span", "rebuild_history"]

# The read's time budget: the first release waits for it (a 5-minute window's close passes
# while it reads are published late, counted). Measured: docs/operations.md, "Restarts".
REBUILD_TIMEOUT_S = 300.0
PROGRESS_EVERY_S = 10.0
_POLL_MS = 200
# A partition more than this far ahead of the slowest unfinished one (record timestamps) is
# paused, so the windows in flight (held until every partition passed their close) stay few.
_AHEAD_S = 3600.0
# What a restart without the history costs (bench/bench_restart.py on rhythmic traffic).
RESTART_COST = ("measured on rhythmic traffic over a restart: 17.75 expected false pages per 30 days instead of 0.58, "
                "15 of 44 surges paged in their first window instead of 34 "
                "(docs/benchmarks/alarm-rhythm.md#a-restart-on-rhythmic-traffic)")
_LOST = ("the alarm compares with the plain baseline, then with the first day's trend, and with the days before "
         "once a day has passed")


def history_span(reach_seconds: float, last_end: float | None, resume_start: float | None) -> tuple[float, float] | None:
    """[start, end) of event time whose released windows the reference needs after a restart,
    or None: nothing was released, or the last release is older than the next window's reach.

    >>> history_span(600.0, 1000.0, 1000.0), history_span(600.0, 1000.0, 1300.0), history_span(600.0, 1000.0, 1700.0)
    ((400.0, 1000.0), (700.0, 1000.0), None)
    """
    if last_end is None:
        return None
    start = (last_end if resume_start is None else max(last_end, resume_start)) - reach_seconds
    return (start, last_end) if start < last_end else None


@dataclass
class HistoryRead:
    """One pass over the input topic for the windows ``starts`` (released, in the span).

    ``windows()`` yields a ``ClosedWindow`` per start, oldest first, each once every
    partition has been read past its close (or to its end); the counters say what was read.
    """

    consumer: Any
    topic: str
    schema: Any
    size: float
    lateness: float
    starts: list[float]
    timeout_s: float = REBUILD_TIMEOUT_S
    stop: Any = None  # a threading.Event: a stop asked during the read ends it
    records: int = 0
    events: int = 0
    windows_yielded: int = 0
    # Where retention deleted the start of a partition read from its log start: windows before
    # this (the first kept record's timestamp + window + lateness) may have lost events and are
    # not learnt (an empty window would be learnt as nobody there). None: nothing deleted.
    trimmed_from: float | None = None
    skipped: int = 0  # released windows not learnt because of it
    timed_out: bool = False
    stopped: bool = False
    partitions: int = 0
    _from_log_start: set = field(default_factory=set)
    _wanted: Any = None

    def windows(self) -> Iterator[ClosedWindow]:
        if not self.starts:
            return
        size, late = self.size, self.lateness
        index = np.array([math.floor(s / size + 1e-9) for s in self.starts], dtype=np.int64)
        wanted = set(index.tolist())
        self._wanted = index
        lo, hi = int(index[0]), int(index[-1])
        last_close = (hi + 1) * size + late
        c = self.consumer
        from kafka.structs import TopicPartition

        numbers = c.partitions_for_topic(self.topic) or set()
        tps = [TopicPartition(self.topic, p) for p in sorted(numbers)]
        self.partitions = len(tps)
        if not tps:
            yield from (self._window(int(i), {}) for i in index)
            return
        c.assign(tps)
        # A record whose event time is in the span was created after span start - window - lateness
        # (the horizon), so nothing before that is needed.
        from_ms = int(math.floor((lo * size - size - late) * 1000))
        try:
            found = c.offsets_for_times({tp: from_ms for tp in tps})
        except Exception as err:  # noqa: BLE001 - an old broker: read from the beginning, filter by time
            log.debug("offsets_for_times failed (%s): reading the input topic from its beginning", err)
            found = _FromStart()
            c.seek_to_beginning(*tps)
        try:
            log_start = c.beginning_offsets(tps)
        except Exception:  # noqa: BLE001 - unknown: assume nothing was deleted
            log_start = {}
        done: set = set()
        self._from_log_start = set()  # partitions whose read begins where retention deleted records
        for tp in tps:
            hit = found.get(tp)
            if hit is not None:
                c.seek(tp, hit.offset)
            elif not isinstance(found, _FromStart):
                done.add(tp)  # no record at or after from_ms: nothing of the span
            begins = log_start.get(tp) or 0
            if begins > 0 and tp not in done and (hit is None or hit.offset <= begins):
                self._from_log_start.add(tp)
        # read_through[tp]: the largest record timestamp read so far (the cut's stand-in).
        read_through = {tp: -math.inf for tp in tps}
        targets: dict = {}
        pending: dict[int, dict[int, list]] = {}  # window index -> partition -> [(X, entities)]
        seen: dict[tuple[int, int], set] = {}  # (window index, partition) -> entities kept there
        next_i = 0  # position in index of the next window to yield
        began = time.monotonic()
        next_log = began + PROGRESS_EVERY_S
        paused: set = set()
        while True:
            unfinished = [tp for tp in tps if tp not in done]
            through = min((read_through[tp] for tp in unfinished), default=math.inf)
            # Yield every window every partition has passed (or finished).
            while next_i < len(index) and ((int(index[next_i]) + 1) * size + late <= through or not unfinished):
                n = int(index[next_i])
                parts = pending.pop(n, {})
                if self.trimmed_from is not None and n * size < self.trimmed_from + size + late:
                    self.skipped += 1
                else:
                    yield self._window(n, parts)
                for tp in tps:
                    seen.pop((n, tp.partition), None)
                next_i += 1
            if not unfinished or next_i >= len(index):
                return
            if self.stop is not None and self.stop.is_set():
                self.stopped = True
                return
            now = time.monotonic()
            if now - began > self.timeout_s:
                self.timed_out = True
                return
            if now >= next_log:
                next_log = now + PROGRESS_EVERY_S
                log.info("re-reading the input topic %s for the alarm's history: %d records in %.0f s, read up to %s "
                         "(%d of %d partitions done), the span ends at %s", self.topic, self.records, now - began,
                         iso(through) if math.isfinite(through) else "its start", len(done), len(tps), iso(last_close - late))
            # Keep the partitions level, so that few windows wait for a slow one.
            ahead = {tp for tp in unfinished if read_through[tp] > through + _AHEAD_S}
            if ahead != paused:
                if paused - ahead:
                    c.resume(*(paused - ahead))
                if ahead - paused:
                    c.pause(*(ahead - paused))
                paused = ahead
            batch = c.poll(timeout_ms=_POLL_MS)
            for tp in unfinished:
                if tp not in targets:
                    hw = c.highwater(tp)  # the log end seen at the first fetch (Tansu's list-offsets is wrong)
                    if hw is not None:
                        targets[tp] = hw
            for tp, recs in batch.items():
                if tp in done or not recs:
                    continue
                end = targets.get(tp)
                if end is not None:
                    recs = [r for r in recs if r.offset < end]
                if recs:
                    if self._ingest(tp, recs, read_through, pending, seen, wanted, last_close):
                        done.add(tp)
            for tp in unfinished:
                end = targets.get(tp)
                if tp not in done and end is not None and c.position(tp) >= end:
                    done.add(tp)
            for tp in done & paused:
                paused.discard(tp)
                c.resume(tp)

    def _ingest(self, tp, recs: list, read_through: dict, pending: dict, seen: dict, wanted: set,
                last_close: float) -> bool:
        """One partition's records of a poll, in offset order; True when the partition is done
        (a record created at or after the last window's close: nothing later can count)."""
        size, late = self.size, self.lateness
        self.records += len(recs)
        created = np.array([r.timestamp for r in recs], dtype=float) / 1000.0
        created = np.where(created < 0, -np.inf, created)  # no timestamp (old message format)
        if tp in self._from_log_start:  # the first record retention kept: nothing older is known
            self._from_log_start.discard(tp)
            first = float(created[0]) if np.isfinite(created[0]) else math.inf
            self.trimmed_from = first if self.trimmed_from is None else max(self.trimmed_from, first)
        # The largest timestamp read before each record: past a window's close, the cut.
        prior = np.maximum.accumulate(np.concatenate([[read_through[tp]], created]))[:-1]
        beyond = np.flatnonzero(created >= last_close)
        stop_at = int(beyond[0]) if beyond.size else len(recs)
        read_through[tp] = math.inf if beyond.size else max(read_through[tp], float(created.max()))
        keep, X, ts, entities = _validate(self.schema, [r.value for r in recs[:stop_at]])
        if not len(keep):
            return stop_at < len(recs)
        if ts is None:  # the event time is the record's timestamp
            ts = created[keep]
        c, before = created[keep], prior[keep]
        win = np.floor(ts / size).astype(np.int64)
        close = (win + 1) * size + late
        ok = (c < close) & (before < close) & ((ts < c + size + late) | ~np.isfinite(c))
        ok &= np.isin(win, self._wanted)
        for n in np.unique(win[ok]).tolist():
            rows = np.flatnonzero(ok & (win == n))
            if entities is not None:
                kept = seen.setdefault((n, tp.partition), set())
                first = []
                for i in rows.tolist():
                    e = entities[i]
                    if e not in kept:
                        kept.add(e)
                        first.append(i)
                rows = np.asarray(first, dtype=np.intp)
            if rows.size:
                pending.setdefault(n, {}).setdefault(tp.partition, []).append(
                    (X[rows], None if entities is None else [entities[i] for i in rows.tolist()]))
        return stop_at < len(recs)

    def _window(self, n: int, parts: dict) -> ClosedWindow:
        """Window n from its partitions' kept events: the first per entity over all partitions,
        in partition order (stage 2's merge)."""
        d = len(self.schema.feature_names)
        blocks, ents = [], []
        with_entity = self.schema.entity_field is not None
        seen: set = set()
        for p in sorted(parts):
            for X, E in parts[p]:
                if with_entity and len(parts) > 1:
                    rows = [i for i, e in enumerate(E) if not (e in seen or seen.add(e))]
                    X, E = X[rows], [E[i] for i in rows]
                blocks.append(X)
                if with_entity:
                    ents.extend(E)
        X = np.concatenate(blocks) if blocks else np.zeros((0, d))
        self.events += int(X.shape[0])
        self.windows_yielded += 1
        # Flags and ids are not needed to learn the history (the releaser scores the events).
        return ClosedWindow(n * self.size, (n + 1) * self.size, X, np.zeros(X.shape[0], dtype=bool), (),
                            tuple(ents) if with_entity else ())


def _once_any_event(windows: Iterator[ClosedWindow]) -> Iterator[ClosedWindow]:
    """The windows, except that empty ones are held back until one with an event comes: a topic
    that holds nothing of the span (a new topic) teaches the reference nothing, not empty windows."""
    held: list[ClosedWindow] | None = []
    for window in windows:
        if held is not None and not window.n_events:
            held.append(window)
            continue
        if held:
            yield from held
        held = None
        yield window


class _FromStart(dict):
    """offsets_for_times failed: every partition is read from its beginning."""


def _validate(schema, values: list) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, list | None]:
    """Stage 1's validation of one partition's messages: (positions of the valid ones, their
    features, event times or None for the record timestamp, entities or None). Invalid
    messages are skipped: they were dead-lettered when stage 1 first read them."""
    d = len(schema.feature_names)
    whole = schema.parse_batch(values)
    if whole is not None:
        return np.arange(len(values)), whole.X, whole.timestamps, whole.entities
    keep, rows, ts, ents = [], [], [], []
    for i, v in enumerate(values):
        got = schema.parse_batch([v])
        if got is not None:
            keep.append(i)
            rows.append(got.X[0])
            ts.append(None if got.timestamps is None else float(got.timestamps[0]))
            ents.append(None if got.entities is None else got.entities[0])
            continue
        try:
            ev = schema.parse(v)
        except InvalidEvent:
            continue
        keep.append(i)
        rows.append(np.asarray(ev.features, dtype=float))
        ts.append(ev.timestamp)
        ents.append(ev.entity)
    X = np.asarray(rows, dtype=float).reshape(len(rows), d)
    times = np.asarray(ts, dtype=float) if schema.timestamp_field else None
    return np.asarray(keep, dtype=np.intp), X, times, (ents if schema.entity_field else None)


@dataclass(frozen=True)
class Rebuilt:
    """What the start-up pass did (also kept by the service: tests read it)."""

    windows: int  # windows learnt by the reference
    events: int
    released: int  # released windows of the span in the ledger
    span: tuple[float, float] | None
    covered_from: float | None  # event time from which the topic held the span (None: nothing)
    seconds: float
    complete: bool


def rebuild_history(config, bootstrap, releaser, ledger, resume_start: float | None, schema, *,
                    embedded: bool, stop=None, timeout_s: float = REBUILD_TIMEOUT_S) -> Rebuilt | None:
    """Re-read the input topic for the reference's history and learn it (``releaser.rebuild``);
    log what was rebuilt, or what the restart costs. None where there is nothing to rebuild
    (no rhythm reference, or nothing released yet)."""
    reference = getattr(releaser, "reference", None)
    if reference is None or not config.alarm.enabled:
        return None  # no comparison reads a history
    last = ledger.last_released()
    if last is None:
        return None  # a first start: no history was lost
    reach = reference.rebuilt_seconds
    span = history_span(reach, last.window_end, resume_start)
    topic = config.stream.input_topic
    if span is None:
        log.warning("the alarm's history is not rebuilt: the last released window ended at %s, more than what a "
                    "restart rebuilds (%s) before the next window; %s, %s", iso(last.window_end), duration(reach), _LOST, RESTART_COST)
        return Rebuilt(0, 0, 0, None, None, 0.0, True)
    starts = [e.window_start for e in ledger.entries(since=span[0])
              if e.released and e.window_start >= span[0] - 1e-9 and e.window_end <= span[1] + 1e-9]
    if embedded:
        log.warning("the alarm's history is lost at this restart: the embedded broker keeps the input topic in memory "
                    "and has started empty, so the %d windows released in the last %s cannot be re-read; %s; %s",
                    len(starts), duration(span[1] - span[0]), _LOST, RESTART_COST)
        return Rebuilt(0, 0, len(starts), span, None, 0.0, True)
    from monitor.pipeline.clients import make_consumer

    began = time.monotonic()
    s = config.stream
    consumer = make_consumer(bootstrap, None, s.kafka, group_instance_id=None, enable_auto_commit=False)
    try:
        read = HistoryRead(consumer, topic, schema, config.window.size_seconds, config.window.allowed_lateness_seconds,
                           starts, timeout_s=timeout_s, stop=stop)
        learnt = releaser.rebuild(_once_any_event(read.windows()), since=span[0])
    finally:
        consumer.close(autocommit=False)
    took = time.monotonic() - began
    if read.stopped:
        return Rebuilt(learnt, read.events, len(starts), span, None, took, False)
    if not read.events:
        log.warning("the alarm's history is lost at this restart: the input topic %s holds no event of the %d windows "
                    "released in the last %s (its retention, or a new topic); %s; %s", topic, len(starts),
                    duration(span[1] - span[0]), _LOST, RESTART_COST)
        return Rebuilt(learnt, 0, len(starts), span, None, took, not read.timed_out)
    size = config.window.size_seconds
    released_from = min(starts)  # the oldest released window the reach holds
    whole = duration(span[1] - released_from)
    covered = released_from
    part = f"all {whole}"
    if read.skipped:
        covered = starts[read.skipped] if read.skipped < len(starts) else span[1]
        part = f"the last {duration(span[1] - covered)} of {whole}"
    line = (f"rebuilt the alarm's history from {learnt} windows ({read.events} events) of the input topic {topic}: "
            f"{part} released within what a restart rebuilds ({duration(reach)}), read in {took:.1f} s ({read.records} records); "
            "nothing published or charged")
    if read.timed_out:
        log.warning("%s; the read stopped after %.0f s with %d of the %d released windows learnt: the later ones are "
                    "missing from the history", line, timeout_s, learnt, len(starts))
    elif read.skipped:
        log.info("%s; the %d older windows are not learnt: the topic's retention deleted events of them", line,
                 read.skipped)
    else:
        log.info("%s", line)
    return Rebuilt(learnt, read.events, len(starts), span, covered, took, not read.timed_out)
