"""Shards between the stages (no broker): chunking, attempts, merging, held offsets."""

from __future__ import annotations

import numpy as np

from monitor.pipeline.shards import ShardCollector, dumps, encode_shard, loads
from monitor.pipeline.windows import ClosedWindow


def window(n: int, d: int = 2, start: float = 0.0, tag: str = "e", entities=None) -> ClosedWindow:
    X = np.arange(n * d, dtype=float).reshape(n, d)
    ids = tuple(f"{tag}{i}" for i in range(n))
    return ClosedWindow(start, start + 60.0, X, np.arange(n) % 2 == 0, ids, tuple(entities or ()))


def feed(collector: ShardCollector, chunks, offset: int = 0) -> int:
    for chunk in chunks:
        collector.add(loads(dumps(chunk)), offset=offset, source=0)
        offset += 1
    return offset


def test_a_large_window_travels_in_chunks_under_the_message_limit_and_comes_back_whole():
    w = window(20_000, d=50)
    chunks = encode_shard(w, partition=0, n_partitions=1, attempt="a")
    assert len(chunks) > 1
    assert max(len(dumps(c)) for c in chunks) < 1_000_000
    c = ShardCollector(60.0)
    feed(c, chunks[:-1])
    assert not c.complete(0)  # one chunk short
    feed(c, chunks[-1:])
    merged = c.take(0, n_features=50)
    assert np.array_equal(merged.X, w.X) and np.array_equal(merged.flagged, w.flagged)
    assert merged.event_ids == w.event_ids


def test_the_first_complete_attempt_wins_and_later_ones_are_ignored():
    first = encode_shard(window(5, tag="first"), 0, 1, "a", per_chunk=2)
    again = encode_shard(window(7, tag="again"), 0, 1, "b", per_chunk=2)
    c = ShardCollector(60.0)
    # An incomplete attempt (a crash mid-send), then a complete one, interleaved with a third.
    feed(c, again[:2])
    feed(c, first[:1] + again[2:3] + first[1:])
    feed(c, again[3:])
    assert c.complete(0)
    assert c.take(0, 2).event_ids == tuple(f"first{i}" for i in range(5))


def test_release_needs_every_partition_and_keeps_one_event_per_entity_over_partitions():
    c = ShardCollector(60.0)
    feed(c, encode_shard(window(3, tag="p1-", entities=["x", "y", "z"]), 1, 3, "a"))
    feed(c, encode_shard(window(2, tag="p0-", entities=["y", "w"]), 0, 3, "b"))
    assert c.reported(0) == 2 and not c.complete(0)
    feed(c, encode_shard(window(0), 2, 3, "c"))  # an empty shard is a partition's done marker
    assert c.complete(0)
    merged = c.take(0, 2)
    # partition order: p0's y wins over p1's y
    assert merged.event_ids == ("p0-0", "p0-1", "p1-0", "p1-2")
    assert merged.entities == ("y", "w", "x", "z")


def test_held_offsets_cover_every_record_of_an_unreleased_window():
    c = ShardCollector(60.0)
    c.add(encode_shard(window(1, start=0.0), 0, 1, "a")[0], offset=10, source=0)
    c.add(encode_shard(window(1, start=60.0), 0, 1, "a")[0], offset=11, source=0)
    c.add(encode_shard(window(1, start=0.0, tag="dup"), 0, 1, "b")[0], offset=12, source=0)  # ignored attempt
    assert c.held_offsets() == {0: 10}
    c.take(0, 2)
    assert c.held_offsets() == {0: 11}
