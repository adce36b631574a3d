"""Tumbling event-time windows on a schedule that does not depend on the data.

Windows are ``[n * size, (n + 1) * size)`` in event time (epoch seconds). Window n closes
at wall-clock time ``end + allowed_lateness``. The store releases every scheduled window
in order from ``first_start`` on, empty or not: whether a window is released must not
reveal whether anyone was in it.

An event is *late* when its window is before the next window to close (already closed,
or before the first scheduled one), when its record was created (``created``: the Kafka
record's timestamp) at or after its window's close time, or when its record lies at or
past its window's cut (``past_cut``: the partition's log end at the close, which stage 1
records). The last two rules are properties of the broker's log alone, so which events a
window holds does not depend on how fast they are read (docs/scaling.md, "What a window
holds"). With an entity field,
the first event of each entity in a window is kept and later ones are *duplicates*
(contribution bounding); ``select`` decides both before the caller scores anything.

>>> store = WindowStore(size=60, allowed_lateness=5, first_start=0)
>>> store.add_one(10.0, (1.0, 2.0), False, event_id="a", entity="p1")
'accepted'
>>> store.add_one(20.0, (1.0, 3.0), True, event_id="b", entity="p1")
'duplicate_entity'
>>> [(w.start, w.n_events) for w in store.close_due(now=64.0)]
[]
>>> [(w.start, w.n_events) for w in store.close_due(now=126.0)]
[(0.0, 1), (60.0, 0)]
>>> store.add_one(30.0, (0.0, 0.0), False, event_id="c")
'late'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain, groupby
from operator import itemgetter
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np

__all__ = ["ACCEPTED", "LATE", "DUPLICATE_ENTITY", "OpenWindow", "ClosedWindow", "Selection", "WindowStore",
           "smallest_offsets", "take"]

ACCEPTED = "accepted"
LATE = "late"
DUPLICATE_ENTITY = "duplicate_entity"


class _Chunk(NamedTuple):
    """Consecutive kept events of one window from one partition, as columns."""

    partition: int
    X: np.ndarray  # (k, d) raw feature values
    flagged: np.ndarray  # (k,) bool
    event_ids: list[str]
    entities: list[str | None]


@dataclass
class OpenWindow:
    """Events gathered so far in one window (inside the trust boundary).

    Kept as column chunks, one per ingested batch (a batch's columns are stored, not split
    into per-event objects); ``add_one``'s events wait in ``pending`` until the next chunk.
    """

    start: float
    end: float
    chunks: list[_Chunk] = field(default_factory=list)
    # add_one's events not yet in a chunk: (partition, row, flagged, event_id, entity)
    pending: list[tuple] = field(default_factory=list)
    entities: set[str] = field(default_factory=set)
    # partition -> smallest offset held here: what must not be committed past.
    first_offsets: dict[int, int] = field(default_factory=dict)

    @property
    def n_events(self) -> int:
        return len(self.pending) + sum(len(c.event_ids) for c in self.chunks)

    def flush(self) -> None:
        """Move the pending single events into chunks (one per run of the same partition)."""
        for p, run in groupby(self.pending, key=itemgetter(0)):
            _, rows, flagged, ids, entities = zip(*run)
            self.chunks.append(_Chunk(p, np.asarray(rows, dtype=float).reshape(len(ids), -1),
                                      np.asarray(flagged, dtype=bool), list(ids), list(entities)))
        self.pending.clear()


@dataclass(frozen=True)
class ClosedWindow:
    """A window due for release: its bounds and its events as arrays."""

    start: float
    end: float
    X: np.ndarray  # (n, d) raw feature values
    flagged: np.ndarray  # (n,) bool
    event_ids: tuple[str, ...]
    # The privacy unit of each event (None without an entity field): stage 2 keeps one
    # event per entity per window over all input partitions.
    entities: tuple[str | None, ...] = ()

    @property
    def n_events(self) -> int:
        return int(self.X.shape[0])


class Selection(NamedTuple):
    """The events of a batch a store keeps (``WindowStore.select``), grouped by window.

    ``keep``: positions in the batch, in window order and arrival order within a window
    (None: every event, in one window); ``windows``: (window index, how many of ``keep``)
    for consecutive runs of ``keep``; ``counts``: events by status; ``arrived_late``:
    positions of the late events the log says came after their window's close (created at
    or after it, or past its cut), which go to the dead-letter topic, or None for none. The
    other late ones are records read again after a restart, of windows already shipped.
    """

    keep: np.ndarray | None
    windows: list[tuple[int, int]]
    counts: dict[str, int]
    arrived_late: np.ndarray | None = None

    @property
    def n_kept(self) -> int:
        return sum(n for _, n in self.windows)


def smallest_offsets(per_window: Iterable[dict[int, int]]) -> dict[int, int]:
    """Per partition, the smallest of the windows' first offsets: what must not be committed past."""
    held: dict[int, int] = {}
    for offsets in per_window:
        for p, off in offsets.items():
            if off < held.get(p, off + 1):
                held[p] = off
    return held


class WindowStore:
    """Open windows keyed by their index n, closed in order on the wall clock.

    Parameters
    ----------
    size:
        Window length in seconds.
    allowed_lateness:
        Seconds a window waits after its end before it closes.
    first_start:
        Start of the first scheduled window (rounded down to a window boundary).
    n_features:
        Width of an empty window's feature array.
    """

    def __init__(self, size: float, allowed_lateness: float, first_start: float, n_features: int = 1) -> None:
        if not size > 0:
            raise ValueError(f"size must be positive, got {size!r}")
        self.size = float(size)
        self.allowed_lateness = float(allowed_lateness)
        self.n_features = n_features
        self._next = self.index_of(first_start)  # index of the next window to close
        self._open: dict[int, OpenWindow] = {}

    def index_of(self, ts: float) -> int:
        return math.floor(ts / self.size)

    @property
    def next_start(self) -> float:
        """Event-time start of the next window to close."""
        return self._next * self.size

    @property
    def next_close_time(self) -> float:
        """Wall-clock time at which the next window closes."""
        return (self._next + 1) * self.size + self.allowed_lateness

    def close_time(self, index: int) -> float:
        """Close time of window ``index``: its end + allowed lateness."""
        return (index + 1) * self.size + self.allowed_lateness

    def horizon(self, now: "float | np.ndarray") -> "float | np.ndarray":
        """Event times at or beyond this are too far in the future for a record appended
        by ``now`` (stage 1 passes, per record, the log's bound on its append time)."""
        return now + self.size + self.allowed_lateness

    def add_one(
        self,
        ts: float,
        row: tuple[float, ...],
        flagged: bool,
        *,
        event_id: str,
        entity: str | None = None,
        partition: int = 0,
        offset: int | None = None,
        created: float | None = None,
    ) -> str:
        """Put one event in its window; returns ACCEPTED, LATE or DUPLICATE_ENTITY.

        ``created``: when its record was appended (Kafka record timestamp, seconds); an
        event created at or after its window's close time is LATE whenever it is read.
        """
        n = self.index_of(ts)
        if n < self._next or (created is not None and created >= self.close_time(n)):
            return LATE
        w = self._open.get(n)
        if w is None:
            w = self._open[n] = OpenWindow(n * self.size, (n + 1) * self.size)
        if entity is not None:
            if entity in w.entities:
                return DUPLICATE_ENTITY
            w.entities.add(entity)
        w.pending.append((partition, row, flagged, event_id, entity))
        if offset is not None and offset < w.first_offsets.get(partition, offset + 1):
            w.first_offsets[partition] = offset
        return ACCEPTED

    def add_batch(
        self,
        ts: np.ndarray,
        X: np.ndarray,
        flagged: np.ndarray,
        *,
        event_ids: list[str],
        entities: list[str] | None = None,
        partition: int = 0,
        offsets: np.ndarray | None = None,
        created: np.ndarray | None = None,
    ) -> dict[str, int]:
        """``add_one`` for every event of a batch, in order; returns counts by status.

        ``select`` then ``insert``; a caller with costly per-event work (scoring) does that
        work between the two, on the kept events only.

        >>> store = WindowStore(size=60, allowed_lateness=5, first_start=60)
        >>> store.add_batch(np.array([10.0, 70.0, 80.0]), np.zeros((3, 1)), np.zeros(3, bool),
        ...                 event_ids=["a", "b", "c"], entities=["p", "q", "q"])
        {'late': 1, 'accepted': 1, 'duplicate_entity': 1}
        """
        sel = self.select(ts, entities=entities, created=created)
        if sel.keep is not None:
            X, flagged, event_ids = X[sel.keep], flagged[sel.keep], take(event_ids, sel.keep)
            entities = None if entities is None else take(entities, sel.keep)
            offsets = None if offsets is None else offsets[sel.keep]
        self.insert(sel, X, flagged, event_ids=event_ids, entities=entities, partition=partition, offsets=offsets)
        return sel.counts

    def select(self, ts: np.ndarray, *, entities: list | None = None, created: np.ndarray | None = None,
               past_cut: np.ndarray | None = None) -> Selection:
        """Decide which events of a batch are kept, before anything costly is done with them.

        Late events (window already shipped, record created at or after the window's
        close time, or record at or past the window's cut: ``past_cut``, a bool per event)
        and repeated entities (one event per entity per window, the first in arrival
        order) are dropped here; the kept events' entities are claimed in their windows,
        so ``insert`` must follow with the kept events. One person's flood of duplicates
        therefore costs a set lookup per event, never a model score.

        >>> store = WindowStore(size=60, allowed_lateness=5, first_start=0)
        >>> sel = store.select(np.array([1.0, 2.0, 61.0, 3.0]), entities=["p", "p", "p", "q"],
        ...                    created=np.array([1.0, 2.0, 61.0, 66.0]))
        >>> sel.keep.tolist(), sel.windows, sel.counts
        ([0, 2], [(0, 1), (1, 1)], {'late': 1, 'accepted': 2, 'duplicate_entity': 1})
        >>> store.select(np.array([5.0, 6.0]), past_cut=np.array([False, True])).counts
        {'late': 1, 'accepted': 1}
        """
        n_events = len(ts)
        counts = {LATE: 0, ACCEPTED: 0, DUPLICATE_ENTITY: 0}
        if n_events == 0:
            return Selection(np.zeros(0, dtype=np.intp), [], {})
        idx = np.floor(ts / self.size).astype(np.int64)
        late = idx < self._next
        by_log = None
        if created is not None:
            # The log decides: a record created after its window's close is late for
            # every reader, fast or slow (created is per record, not the clock of the read).
            by_log = created >= (idx + 1) * self.size + self.allowed_lateness
        if past_cut is not None:
            # Appended after the log end at the close: never in the window, however early
            # the reader reaches it.
            by_log = past_cut if by_log is None else by_log | past_cut
        arrived_late = None
        if by_log is not None:
            late |= by_log
            if by_log.any():
                arrived_late = np.flatnonzero(by_log)
        first, last = int(idx.min()), int(idx.max())
        groups: list[tuple[int, np.ndarray | None]]
        if first == last and not late.any():  # the usual case: one window, no index arrays
            groups = [(first, None)]
        else:
            counts[LATE] = int(late.sum())
            # Each window's events in arrival order: a stable sort by window index.
            order = np.argsort(idx, kind="stable")
            order = order[~late[order]]
            cuts = np.flatnonzero(np.diff(idx[order])) + 1
            groups = [(int(idx[sel[0]]), sel) for sel in np.split(order, cuts) if sel.size]
        keep_parts: list[np.ndarray] = []
        windows: list[tuple[int, int]] = []
        whole = len(groups) == 1 and groups[0][1] is None  # everything kept so far
        for n, sel in groups:
            w = self._open.get(n)
            if w is None:
                w = self._open[n] = OpenWindow(n * self.size, (n + 1) * self.size)
            if entities is not None:
                ents = list(entities) if sel is None else take(entities, sel)
                keep = _first_unseen(ents, w.entities)
                if keep is not None:
                    counts[DUPLICATE_ENTITY] += len(ents) - len(keep)
                    sel = np.arange(n_events)[keep] if sel is None else sel[keep]
            if sel is not None:
                whole = False
                if not sel.size:
                    continue
            k = n_events if sel is None else int(sel.size)
            counts[ACCEPTED] += k
            keep_parts.append(np.arange(n_events) if sel is None else sel)
            windows.append((n, k))
        keep = None if whole else (np.concatenate(keep_parts) if keep_parts else np.zeros(0, dtype=np.intp))
        return Selection(keep, windows, {k: v for k, v in counts.items() if v}, arrived_late)

    def insert(
        self,
        selection: Selection,
        X: np.ndarray,
        flagged: np.ndarray,
        *,
        event_ids: list[str],
        entities: list | None = None,
        partition: int = 0,
        offsets: np.ndarray | None = None,
    ) -> None:
        """Store the events ``select`` kept: the arrays hold the kept events only, in
        ``selection.keep``'s order."""
        at = 0
        for n, k in selection.windows:
            w = self._open.get(n)
            if w is None:  # its entities were claimed by select; only a discard can remove it
                w = self._open[n] = OpenWindow(n * self.size, (n + 1) * self.size)
            if w.pending:
                w.flush()
            cut = slice(at, at + k)
            whole = at == 0 and k == len(event_ids)
            at += k
            ids = list(event_ids) if whole else event_ids[cut]
            ents = [None] * k if entities is None else (list(entities) if whole else list(entities[cut]))
            w.chunks.append(_Chunk(partition, X if whole else X[cut], flagged if whole else flagged[cut], ids, ents))
            if offsets is not None and k:
                low = int(offsets[cut].min())
                if low < w.first_offsets.get(partition, low + 1):
                    w.first_offsets[partition] = low

    def close_due(self, now: float) -> Iterator[ClosedWindow]:
        """Close, in order, every scheduled window whose close time is at or before ``now``.

        A generator: each window leaves the store as it is yielded, so a caller that stops
        early (a stop request) leaves the later ones open.
        """
        while self.next_close_time <= now:
            n = self._next
            w = self._open.pop(n, None)
            self._next = n + 1
            yield self._closed(n, w)

    def due(self, now: float, limit: int | None = None) -> list[ClosedWindow]:
        """The windows ``close_due(now)`` would close, oldest first, left in the store.

        For a caller that must hand them on durably first and then ``discard_through``:
        until then their events keep holding their offsets.
        """
        out: list[ClosedWindow] = []
        n = self._next
        while (n + 1) * self.size + self.allowed_lateness <= now and (limit is None or len(out) < limit):
            out.append(self._closed(n, self._open.get(n)))
            n += 1
        return out

    def discard_through(self, start: float) -> None:
        """Forget every window up to the one starting at ``start`` (handed on already)."""
        last = self.index_of(start + self.size / 2)
        for n in range(self._next, last + 1):
            self._open.pop(n, None)
        self._next = max(self._next, last + 1)

    def _closed(self, n: int, w: OpenWindow | None) -> ClosedWindow:
        start, end = n * self.size, (n + 1) * self.size
        if w is not None and w.pending:
            w.flush()
        if w is None or not w.chunks:
            return ClosedWindow(start, end, np.zeros((0, self.n_features)), np.zeros(0, dtype=bool), ())
        chunks = w.chunks
        X = chunks[0].X if len(chunks) == 1 else np.concatenate([c.X for c in chunks])
        flagged = chunks[0].flagged if len(chunks) == 1 else np.concatenate([c.flagged for c in chunks])
        return ClosedWindow(start, end, np.asarray(X, dtype=float), np.asarray(flagged, dtype=bool),
                            tuple(chain.from_iterable(c.event_ids for c in chunks)),
                            tuple(chain.from_iterable(c.entities for c in chunks)))

    @property
    def next_index(self) -> int:
        """Index of the next window to close."""
        return self._next

    def held_offsets(self) -> dict[int, int]:
        """Per partition, the smallest offset of an event in a still-open window.

        Committing below this keeps every uncounted event re-readable after a crash.
        """
        return smallest_offsets(w.first_offsets for w in self._open.values())

    def drop_partitions(self, partitions: Iterable[int]) -> int:
        """Forget the events of partitions this instance no longer owns (rebalance).

        Their offsets were not committed past, so the new owner reads them again and
        counts them in its own windows. Returns how many events were dropped.
        """
        gone = set(partitions)
        dropped = 0
        for w in self._open.values():
            if w.pending:
                w.flush()
            keep = [c for c in w.chunks if c.partition not in gone]
            if len(keep) == len(w.chunks):
                continue
            dropped += sum(len(c.event_ids) for c in w.chunks if c.partition in gone)
            w.chunks = keep
            w.entities = {e for c in keep for e in c.entities if e is not None}
            for p in gone:
                w.first_offsets.pop(p, None)
        return dropped

    @property
    def n_open_events(self) -> int:
        return sum(w.n_events for w in self._open.values())


def take(seq: Sequence, sel) -> list:
    """``[seq[i] for i in sel]`` in C (itemgetter), for a list and an index array or list."""
    if isinstance(sel, np.ndarray):
        sel = sel.tolist()
    if len(sel) == 1:
        return [seq[int(sel[0])]]
    return list(itemgetter(*sel)(seq)) if len(sel) else []


def _first_unseen(entities: list, seen: set) -> list[int] | None:
    """Contribution bounding for one window: add the entities to ``seen`` and return the
    positions of the events to keep (the first of each entity not seen before), or None
    when all are kept (distinct and new: two set operations in C, no per-event loop)."""
    new = set(entities)
    if len(new) == len(entities) and seen.isdisjoint(new):
        seen |= new
        return None
    keep = []
    for i, e in enumerate(entities):
        if e not in seen:
            seen.add(e)
            keep.append(i)
    return keep
