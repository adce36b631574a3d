"""Window shards: what stage 1 hands to stage 2 over the internal topic.

A *shard* is one window's kept events from one input partition: raw features, model
flags, event ids (for the test-only audit) and entities (for contribution bounding
across partitions). It is sent even when empty: the shard is also the partition's
"done up to the end of this window" marker, which is what lets stage 2 release a window
as soon as every input partition has reported it.

A shard travels as one or more chunks (a record must stay under the broker's message
size), all tagged with the same random ``attempt`` id. After a crash stage 1 may send a
window's shard again (a new attempt, possibly with events that were late the first
time); stage 2 keeps, per window and partition, the first attempt whose chunks are all
on the topic, in topic order, so every process that reads the topic agrees on it.

Two small *markers* travel on the same topic (``kind``; docs/scaling.md, "What a window
holds"): ``cut``, sent at a window's close for each partition with its log end then (its
shard will follow and holds no record past that offset: stage 2 waits for it, whatever the
grace), and ``start``, sent when stage 1 takes a partition over, with the first window it
rebuilds (a cut of an older window will never be followed by a shard). The internal topic
holds raw data: it is inside the trust boundary, like the input.

>>> from monitor.pipeline.windows import ClosedWindow, smallest_offsets
>>> w = ClosedWindow(0.0, 60.0, np.array([[1.0, 2.0]]), np.array([True]), ("a",), ("p1",))
>>> [s["partition"] for s in encode_shard(w, partition=2, n_partitions=3, attempt="x")]
[2]
>>> c = ShardCollector(window_size=60.0)
>>> c.add(encode_shard(w, 0, 2, "x", 10)[0], offset=5, source=0)
>>> c.complete(0), c.reported(0)
(False, 1)
>>> c.add(encode_shard(ClosedWindow(0.0, 60.0, np.zeros((0, 2)), np.zeros(0, bool), ()), 1, 2, "y", 10)[0], 6, 0)
>>> c.complete(0), c.take(0, n_features=2).event_ids
(True, ('a',))
>>> c.add(encode_marker("cut", 60.0, partition=1, n_partitions=2, offset=7), 8, 0)
>>> c.waiting(1)
[1]
>>> c.add(encode_marker("start", 120.0, partition=1, n_partitions=2, offset=9), 9, 0)
>>> c.waiting(1)
[]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from monitor.pipeline.windows import ClosedWindow, smallest_offsets

__all__ = ["encode_shard", "encode_marker", "chunk_events", "dumps", "loads", "ShardCollector"]

# A chunk stays well under Kafka's default 1 MB message limit: about 24 bytes per JSON
# float plus ids and entities, budgeted at 400 kB per chunk.
_CHUNK_BYTES = 400_000
_EVENT_OVERHEAD_BYTES = 128


def chunk_events(n_features: int) -> int:
    """Events per chunk for windows of ``n_features`` features."""
    return max(1, _CHUNK_BYTES // (24 * n_features + _EVENT_OVERHEAD_BYTES))
_VERSION = 1


def encode_shard(window: ClosedWindow, partition: int, n_partitions: int, attempt: str,
                 per_chunk: int | None = None) -> list[dict[str, Any]]:
    """The chunks (dicts, see ``dumps``) of one window's shard from one input partition."""
    n = window.n_events
    per_chunk = per_chunk or chunk_events(window.X.shape[1])
    chunks = max(1, math.ceil(n / per_chunk))
    entities = window.entities or (None,) * n
    out = []
    for i in range(chunks):
        lo, hi = i * per_chunk, min(n, (i + 1) * per_chunk)
        out.append({
            "v": _VERSION, "window_start": window.start, "window_end": window.end,
            "partition": partition, "n_partitions": n_partitions, "attempt": attempt,
            "chunk": i, "chunks": chunks,
            "X": window.X[lo:hi].tolist(), "flagged": window.flagged[lo:hi].tolist(),
            "ids": list(window.event_ids[lo:hi]), "entities": list(entities[lo:hi]),
        })
    return out


def encode_marker(kind: str, window_start: float, *, partition: int, n_partitions: int,
                  offset: int | None) -> dict[str, Any]:
    """A ``cut`` (window ``window_start`` closed; the partition's log end then was
    ``offset``) or ``start`` (a new owner rebuilds windows from ``window_start`` on, from
    input offset ``offset``) marker."""
    if kind not in ("cut", "start"):
        raise ValueError(f"unknown marker kind {kind!r}")
    return {"v": _VERSION, "kind": kind, "window_start": window_start, "partition": partition,
            "n_partitions": n_partitions, "offset": offset}


def dumps(chunk: dict[str, Any]) -> bytes:
    return orjson.dumps(chunk)


def loads(value: bytes) -> dict[str, Any]:
    chunk = orjson.loads(value)
    if not isinstance(chunk, dict) or chunk.get("v") != _VERSION:
        raise ValueError("not a shard of this version")
    return chunk


@dataclass
class _Window:
    # (partition, attempt) -> {chunk index: chunk}
    attempts: dict[tuple[int, str], dict[int, dict]] = field(default_factory=dict)
    # partition -> the chunks of its first complete attempt
    done: dict[int, list[dict]] = field(default_factory=dict)
    # source (internal-topic partition) -> smallest offset of a record of this window
    first_offsets: dict[int, int] = field(default_factory=dict)
    n_partitions: int = 0
    # input partitions whose stage 1 sent a cut for this window (and was not replaced
    # since by an owner that starts after it): their shard must be waited for
    promised: set[int] = field(default_factory=set)


class ShardCollector:
    """Stage 2's windows not yet released, built from shard chunks in topic order."""

    def __init__(self, window_size: float) -> None:
        self.size = float(window_size)
        self._windows: dict[int, _Window] = {}
        self.n_partitions = 0  # input partitions, as the latest shard reports them

    def index_of(self, start: float) -> int:
        return round(start / self.size)

    def add(self, chunk: dict[str, Any], offset: int, source: int) -> None:
        """One record of the internal topic (a shard chunk or a marker), in topic order."""
        kind = chunk.get("kind")
        if kind == "start":
            # The partition's new owner rebuilds from this window on: older cuts from the
            # partition are promises nobody will keep.
            first, p = self.index_of(chunk["window_start"]), int(chunk["partition"])
            for n, w in self._windows.items():
                if n < first:
                    w.promised.discard(p)
            return
        w = self._windows.setdefault(self.index_of(chunk["window_start"]), _Window())
        if offset < w.first_offsets.get(source, offset + 1):
            w.first_offsets[source] = offset
        n = int(chunk["n_partitions"])
        w.n_partitions = max(w.n_partitions, n)
        self.n_partitions = max(self.n_partitions, n)
        p = int(chunk["partition"])
        if kind == "cut":
            if p not in w.done:
                w.promised.add(p)
            return
        if p in w.done:  # an earlier attempt is complete: later ones are ignored
            return
        parts = w.attempts.setdefault((p, chunk["attempt"]), {})
        parts[int(chunk["chunk"])] = chunk
        if len(parts) == int(chunk["chunks"]):
            w.done[p] = [parts[i] for i in range(len(parts))]
            for key in [k for k in w.attempts if k[0] == p]:
                del w.attempts[key]

    def reported(self, index: int) -> int:
        """How many input partitions have reported window ``index`` completely."""
        w = self._windows.get(index)
        return len(w.done) if w else 0

    def waiting(self, index: int) -> list[int]:
        """Input partitions that sent a cut for window ``index`` and no complete shard yet."""
        w = self._windows.get(index)
        return sorted(w.promised - set(w.done)) if w else []

    def complete(self, index: int) -> bool:
        """True once every input partition has reported window ``index``."""
        w = self._windows.get(index)
        return bool(w) and w.n_partitions > 0 and len(w.done) >= w.n_partitions

    def take(self, index: int, n_features: int) -> ClosedWindow:
        """Remove window ``index`` and merge its reported shards, partition by partition.

        One event per entity per window over all partitions: the first in partition
        order, then in each partition's order (the same in every run).
        """
        w = self._windows.pop(index, None)
        start, end = index * self.size, (index + 1) * self.size
        rows: list[list[float]] = []
        flagged: list[bool] = []
        ids: list[str] = []
        entities: list[str | None] = []
        seen: set[str] = set()
        for p in sorted(w.done) if w else ():
            for chunk in w.done[p]:
                for x, f, i, e in zip(chunk["X"], chunk["flagged"], chunk["ids"], chunk["entities"]):
                    if e is not None:
                        if e in seen:
                            continue
                        seen.add(e)
                    rows.append(x)
                    flagged.append(f)
                    ids.append(i)
                    entities.append(e)
        X = np.asarray(rows, dtype=float) if rows else np.zeros((0, n_features))
        return ClosedWindow(start, end, X, np.asarray(flagged, dtype=bool), tuple(ids), tuple(entities))

    def drop_before(self, index: int) -> None:
        """Forget windows before ``index`` (released already)."""
        for n in [n for n in self._windows if n < index]:
            del self._windows[n]

    def clear(self) -> None:
        self._windows.clear()

    def held_offsets(self) -> dict[int, int]:
        """Per internal-topic partition, the smallest offset a window not yet released holds."""
        return smallest_offsets(w.first_offsets for w in self._windows.values())

    @property
    def earliest(self) -> int | None:
        return min(self._windows) if self._windows else None
