"""Stage 2 waits past the grace for every partition that announced a window (docs/scaling.md).

No broker: a Stage2 over stub clients, fed shard chunks and markers as the internal topic
would deliver them.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from kafka.structs import TopicPartition

from monitor.config import parse_config
from monitor.pipeline.shards import encode_marker, encode_shard
from monitor.pipeline.stage2 import Stage2
from monitor.pipeline.windows import ClosedWindow

SIZE, LATENESS, GRACE = 10.0, 1.0, 2.0


class _Consumer:
    """The internal topic read to its log end unless ``unread`` chunks are still on it."""

    unread = 0

    def assignment(self):
        return {TopicPartition("shards", 0)}

    def highwater(self, tp):
        return 0

    def position(self, tp):
        return 0

    def end_offsets(self, tps):
        return {tp: self.unread for tp in tps}

    def commit(self, offsets):
        pass


def _stage2() -> tuple[Stage2, list]:
    cfg = parse_config({"features": [{"name": "hr", "min": 0, "max": 1}], "model": {"path": "unused"},
                        "window": {"size_seconds": SIZE, "allowed_lateness_seconds": LATENESS,
                                   "release_grace_seconds": GRACE}})
    released: list[ClosedWindow] = []
    service = SimpleNamespace(config=cfg, max_windows_reached=False, stage1_ready=lambda: True,
                              update_reference_budget=lambda: None)
    stage = Stage2(service, SimpleNamespace(close=released.append), first_start=0.0)
    stage.consumer = _Consumer()
    return stage, released


def _shard(partition: int, ids: tuple[str, ...]):
    w = ClosedWindow(0.0, SIZE, np.zeros((len(ids), 1)), np.zeros(len(ids), bool), ids, ids)
    return encode_shard(w, partition, n_partitions=2, attempt=f"a{partition}")[0]


def test_a_window_announced_by_a_slow_partition_waits_for_its_shard_past_the_grace():
    stage, released = _stage2()
    past_grace = SIZE + LATENESS + GRACE + 1.0
    stage.collector.add(encode_marker("cut", 0.0, partition=0, n_partitions=2, offset=5), 0, 0)
    stage.collector.add(encode_marker("cut", 0.0, partition=1, n_partitions=2, offset=9), 1, 0)
    stage.collector.add(_shard(0, ("a",)), 2, 0)
    assert stage.release_ready(past_grace) == 0 and released == []  # partition 1 promised it
    assert stage.release_ready(past_grace + 3600) == 0  # however long it takes
    stage.collector.add(_shard(1, ("b",)), 3, 0)
    assert stage.release_ready(past_grace + 3600) >= 1
    assert released[0].event_ids == ("a", "b")


def test_the_grace_gives_up_only_on_partitions_without_an_owner_at_the_close():
    stage, released = _stage2()
    past_grace = SIZE + LATENESS + GRACE + 1.0
    stage.collector.add(encode_marker("cut", 0.0, partition=0, n_partitions=2, offset=5), 0, 0)
    stage.collector.add(_shard(0, ("a",)), 1, 0)
    assert stage.release_ready(SIZE + LATENESS + 0.5) == 0  # before the grace: waits for partition 1
    assert stage.release_ready(past_grace) >= 1  # partition 1 never announced window 0
    assert released[0].event_ids == ("a",)


def test_the_grace_waits_for_the_shards_still_unread_on_the_internal_topic():
    # A restarted stage 1 ships its backlog's shards once it is ready; they sit on the topic, unread,
    # while the backlog windows' grace has long passed: releasing then would publish them empty.
    stage, released = _stage2()
    past_grace = SIZE + LATENESS + GRACE + 1.0
    stage.collector.add(encode_marker("cut", 0.0, partition=0, n_partitions=2, offset=5), 0, 0)
    stage.collector.add(_shard(0, ("a",)), 1, 0)
    stage.consumer.unread = 3
    assert stage.release_ready(past_grace) == 0 and released == []
    stage.consumer.unread = 0
    assert stage.release_ready(past_grace) >= 1
    assert released[0].event_ids == ("a",)


def test_a_new_owner_that_starts_later_withdraws_the_old_owners_promise():
    stage, released = _stage2()
    past_grace = SIZE + LATENESS + GRACE + 1.0
    stage.collector.add(encode_marker("cut", 0.0, partition=1, n_partitions=2, offset=9), 0, 0)
    stage.collector.add(_shard(0, ("a",)), 1, 0)
    assert stage.release_ready(past_grace) == 0
    # Partition 1's new owner rebuilds from window 1 on: window 0's shard will never come.
    stage.collector.add(encode_marker("start", SIZE, partition=1, n_partitions=2, offset=None), 2, 0)
    assert stage.release_ready(past_grace) >= 1
    assert released[0].event_ids == ("a",)
