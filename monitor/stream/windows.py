"""Tumbling event-time windows on a schedule that does not depend on the data.

Windows are ``[n * size, (n + 1) * size)`` in event time (epoch seconds). Window n closes
at wall-clock time ``end + allowed_lateness``. The store releases every scheduled window
in order from ``first_start`` on, empty or not: whether a window is released must not
reveal whether anyone was in it.

An event is *late* when its window is before the next window to close (already closed,
or before the first scheduled one). With an entity field, the first event of each
entity in a window is kept and later ones are *duplicates* (contribution bounding).

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
from typing import Iterable, Iterator

import numpy as np

__all__ = ["ACCEPTED", "LATE", "DUPLICATE_ENTITY", "OpenWindow", "ClosedWindow", "WindowStore", "smallest_offsets"]

ACCEPTED = "accepted"
LATE = "late"
DUPLICATE_ENTITY = "duplicate_entity"


@dataclass
class OpenWindow:
    """Events gathered so far in one window (inside the trust boundary)."""

    start: float
    end: float
    rows: list[tuple[float, ...]] = field(default_factory=list)
    flagged: list[bool] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    row_entities: list[str | None] = field(default_factory=list)
    entities: set[str] = field(default_factory=set)
    # partition -> smallest offset held here: what must not be committed past.
    first_offsets: dict[int, int] = field(default_factory=dict)


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

    def horizon(self, now: float) -> float:
        """Event times at or beyond this are too far in the future to accept."""
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
    ) -> str:
        """Put one event in its window; returns ACCEPTED, LATE or DUPLICATE_ENTITY."""
        n = self.index_of(ts)
        if n < self._next:
            return LATE
        w = self._open.get(n)
        if w is None:
            w = self._open[n] = OpenWindow(n * self.size, (n + 1) * self.size)
        if entity is not None:
            if entity in w.entities:
                return DUPLICATE_ENTITY
            w.entities.add(entity)
        w.rows.append(row)
        w.flagged.append(flagged)
        w.event_ids.append(event_id)
        w.partitions.append(partition)
        w.row_entities.append(entity)
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
    ) -> dict[str, int]:
        """``add_one`` for every event of a batch, in order; returns counts by status.

        >>> store = WindowStore(size=60, allowed_lateness=5, first_start=60)
        >>> store.add_batch(np.array([10.0, 70.0, 80.0]), np.zeros((3, 1)), np.zeros(3, bool),
        ...                 event_ids=["a", "b", "c"], entities=["p", "q", "q"])
        {'late': 1, 'accepted': 1, 'duplicate_entity': 1}
        """
        idx = np.floor(ts / self.size).astype(np.int64)
        late = idx < self._next
        counts = {LATE: int(late.sum()), ACCEPTED: 0, DUPLICATE_ENTITY: 0}
        for n in np.unique(idx[~late]).tolist():
            sel = np.flatnonzero(idx == n).tolist()
            w = self._open.get(n)
            if w is None:
                w = self._open[n] = OpenWindow(n * self.size, (n + 1) * self.size)
            if entities is not None:
                seen, keep = w.entities, []
                for i in sel:
                    e = entities[i]
                    if e not in seen:
                        seen.add(e)
                        keep.append(i)
                counts[DUPLICATE_ENTITY] += len(sel) - len(keep)
                sel = keep
                w.row_entities.extend(entities[i] for i in sel)
            else:
                w.row_entities.extend([None] * len(sel))
            if not sel:
                continue
            counts[ACCEPTED] += len(sel)
            w.rows.extend(map(tuple, X[sel].tolist()))
            w.flagged.extend(flagged[sel].tolist())
            w.event_ids.extend(event_ids[i] for i in sel)
            w.partitions.extend([partition] * len(sel))
            if offsets is not None:
                first = int(offsets[sel].min())
                if first < w.first_offsets.get(partition, first + 1):
                    w.first_offsets[partition] = first
        return {k: v for k, v in counts.items() if v}

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
        if w is None or not w.rows:
            return ClosedWindow(start, end, np.zeros((0, self.n_features)), np.zeros(0, dtype=bool), ())
        return ClosedWindow(start, end, np.asarray(w.rows, dtype=float), np.asarray(w.flagged, dtype=bool), tuple(w.event_ids),
                            tuple(w.row_entities))

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
            keep = [i for i, p in enumerate(w.partitions) if p not in gone]
            dropped += len(w.rows) - len(keep)
            if len(keep) == len(w.rows):
                continue
            w.rows = [w.rows[i] for i in keep]
            w.flagged = [w.flagged[i] for i in keep]
            w.event_ids = [w.event_ids[i] for i in keep]
            w.partitions = [w.partitions[i] for i in keep]
            w.row_entities = [w.row_entities[i] for i in keep]
            w.entities = {e for e in w.row_entities if e is not None}
            for p in gone:
                w.first_offsets.pop(p, None)
        return dropped

    @property
    def n_open_events(self) -> int:
        return sum(len(w.rows) for w in self._open.values())
