"""Stage 2: merge the shards of each window and release it once, in schedule order.

One consumer in the internal topic's group (``stream.group_id`` + ``.stage2``). Windows
are released in order from the ledger's last one (on a first start, from the window the
monitor started in), every scheduled window, empty or not. Window W is
released as soon as every input partition has reported it (stage 1's shards are also
"done up to W's end" markers), or once ``end + allowed_lateness + release_grace`` has
passed, the internal topic is read up to its log end as it is then and every partition whose stage 1
sent a ``cut`` for W (it owned the partition at W's close) has reported it: a slow
stage 1 delays the release (published late, counted), it never shrinks the window. The
grace only gives up on partitions that had no owner at the close.
The internal offsets are committed only past windows that are in the ledger, so after a
crash the same shards are read again, in the same order, and give the same windows.

The ledger is a local SQLite file: run ONE stage-2 process (docs/scaling.md).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from monitor.pipeline.shards import ShardCollector, loads
from monitor.pipeline.windows import ClosedWindow

log = logging.getLogger("monitor.stream")

__all__ = ["Stage2"]

CATCH_UP_TIMEOUT_S = 30.0
# On stop, how long stage 2 waits for the shards its own process's stage 1 ships: well
# inside the command's stop grace (8 s), so a window that cannot complete (its partition
# was revoked at the stop) is left to the next start while the clients still close cleanly.
_FINISH_WAIT_S = 5.0
_WAIT_LOG_EVERY_S = 10.0


class Stage2:
    """The release side of the service; ``step()`` is called from the service loop."""

    producers = ("alert_producer",)  # renewed after a broker error

    def __init__(self, service, publisher, first_start: float) -> None:
        cfg = service.config
        self.service, self.config, self.publisher = service, cfg, publisher
        self.size = cfg.window.size_seconds
        self.lateness = cfg.window.allowed_lateness_seconds
        self.grace = cfg.window.release_grace_seconds
        self.collector = ShardCollector(self.size)
        # Index of the next window to release (public: the clock at start, or the ledger).
        self.next = math.floor(first_start / self.size + 1e-9)
        self._pending: ClosedWindow | None = None  # merged, not yet in the ledger
        self._catching_up: dict[Any, float] = {}
        self._targets: dict[Any, int] = {}
        self._positions: dict[Any, int] = {}
        self._reseek: set[Any] = set()
        self._rebalancing = False
        self._last_commit: dict | None = None
        self.bad_records = 0

    @property
    def next_start(self) -> float:
        return self.next * self.size

    def subscribe(self, consumer) -> None:
        from kafka import ConsumerRebalanceListener

        stage = self

        class _Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                if revoked:
                    stage._rebalancing = True
                    stage.collector.clear()  # read again from the committed offsets
                    stage._catching_up.clear()
                    stage._targets.clear()
                    stage._positions.clear()

            def on_partitions_assigned(self, assigned):
                deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
                for tp in assigned:
                    stage._catching_up[tp] = deadline
                stage._reseek = set(assigned)
                stage._rebalancing = False
                log.info("stage 2: assigned internal partitions %s", sorted(tp.partition for tp in assigned))

        self.consumer = consumer
        consumer.subscribe([self.config.stream.shard_topic], listener=_Listener())

    def _caught_up(self) -> bool:
        if self._rebalancing or not self.consumer.assignment():
            return False
        now = time.monotonic()
        for tp, deadline in list(self._catching_up.items()):
            target = self._targets.get(tp)
            if target is None:
                target = self.consumer.highwater(tp)
                if target is not None:
                    self._targets[tp] = target
            if target is not None and self.consumer.position(tp) >= target:
                del self._catching_up[tp]
            elif now > deadline:
                log.warning("internal partition %d: no catch-up within %.0f s", tp.partition, CATCH_UP_TIMEOUT_S)
                del self._catching_up[tp]
        return not self._catching_up

    @property
    def joined(self) -> bool:
        return bool(self.consumer.assignment()) and not self._rebalancing

    def poll_timeout_ms(self) -> int:
        return 200  # returns as soon as shards arrive

    @property
    def ready(self) -> bool:
        return self._caught_up()

    def step(self, timeout_ms: int, grace: bool = True) -> None:
        if self._reseek:
            # A partition kept across a rebalance keeps kafka-python's read position, but
            # its held shards were dropped: read them again from the committed offset.
            for tp in self._reseek:
                committed = self.consumer.committed(tp)
                if committed is not None:
                    self.consumer.seek(tp, committed)
            self._reseek = set()
        batch = self.consumer.poll(timeout_ms=timeout_ms)
        for tp, records in batch.items():
            if records:
                self._positions[tp] = records[-1].offset + 1
            for rec in records:
                try:
                    chunk = loads(rec.value)
                except ValueError as err:
                    self.bad_records += 1
                    log.error("internal topic %d:%d: not a shard (%s); skipped", rec.partition, rec.offset, err)
                    continue
                if self.collector.index_of(chunk["window_start"]) >= self.next:
                    self.collector.add(chunk, rec.offset, rec.partition)
        self.release_ready(time.time(), grace=grace)

    def release_ready(self, now: float, *, grace: bool = True) -> int:
        """Release, in order, every window that is complete or past its grace; returns how many."""
        n = 0
        if self._pending is not None:
            self._release(self._pending)
            n += 1
        while not self.service.max_windows_reached:
            end = (self.next + 1) * self.size
            if self.collector.complete(self.next):
                pass
            elif (grace and now >= end + self.lateness + self.grace and self._caught_up()
                  and self.service.stage1_ready() and not self._still_waiting(self.next, now) and self._read_to_end()):
                log.warning("window [%.0f, %.0f): released after the grace with %d of %d input partitions reported "
                            "(the others had no stage-1 owner at its close)",
                            self.next * self.size, end, self.collector.reported(self.next), self.collector.n_partitions)
            else:
                break
            self._pending = self.collector.take(self.next, len(self.config.features))
            self.next += 1
            self._release(self._pending)
            n += 1
        return n

    def _read_to_end(self) -> bool:
        """Whether every internal partition is read up to its log end as it is now, after ``stage1_ready``:
        the shards a stage 1 had acknowledged by then are in hand. ``_caught_up`` reads to the log end at
        the assignment only; the shards a restarted stage 1 shipped from the backlog just after it were on the
        topic, unread, when its windows' grace had long passed, and those windows went out empty."""
        tps = list(self.consumer.assignment())
        try:
            ends = self.consumer.end_offsets(tps)
        except Exception as err:  # noqa: BLE001 - the broker is away: wait, and ask again at the next step
            log.debug("stage 2: internal log ends not known (%s)", err)
            return False
        return all(self.consumer.position(tp) >= ends.get(tp, 0) for tp in tps)

    def _still_waiting(self, index: int, now: float) -> bool:
        """True while a partition that promised window ``index`` (a cut) has not reported it."""
        waiting = self.collector.waiting(index)
        if waiting and now >= self._waiting_logged + _WAIT_LOG_EVERY_S:
            self._waiting_logged = now
            log.warning("window [%.0f, %.0f): past its grace, still reading input partitions %s up to their log end "
                        "at the close; it is published late rather than without them",
                        index * self.size, (index + 1) * self.size, waiting)
        return bool(waiting)

    _waiting_logged = 0.0

    def update_lag(self) -> None:
        """Stage 2's lag is not exported: the input lag (stage 1) is what operators watch."""

    def finish(self, until: float, service) -> None:
        """On stop: release the windows due at ``until`` that every partition has reported.

        In one process with stage 1, first wait for stage 1 to ship them (at most
        ``_FINISH_WAIT_S``); alone, release what is already complete.
        """
        try:
            wait = service.stage1 is not None and not service.max_windows_reached
            deadline = time.monotonic() + (_FINISH_WAIT_S if wait else 0.0)
            if wait:
                service.wait_stage1_finished(_FINISH_WAIT_S)
            while not service.max_windows_reached:
                self.release_ready(time.time(), grace=False)
                due = (self.next + 1) * self.size + self.lateness <= until
                if not due:
                    break
                if time.monotonic() > deadline:
                    log.info("stage 2, stopping: window [%.0f, %.0f) is not complete after %g s; it is released at the "
                             "next start", self.next * self.size, (self.next + 1) * self.size, _FINISH_WAIT_S)
                    break
                self.step(100, grace=False)
            self.commit(force=True)
        except Exception as err:  # noqa: BLE001 - stopping must finish
            log.error("stage 2, during stop: %s: %s", type(err).__name__, err)

    def _release(self, window: ClosedWindow) -> None:
        self.publisher.close(window)
        self._pending = None  # in the ledger and published: a retry has nothing left to do
        self.service.update_reference_budget()
        try:
            self.commit(force=True)
        except Exception as err:  # noqa: BLE001 - the periodic commit will retry
            log.warning("commit after window release failed: %s", err)

    def commit(self, force: bool = False) -> None:
        """Commit per internal partition the smallest offset a window not yet released holds."""
        from kafka.structs import OffsetAndMetadata

        assignment = self.consumer.assignment()
        if not assignment or self._pending is not None or self._rebalancing:
            return
        held = self.collector.held_offsets()
        offsets = {}
        for tp in assignment:
            off = held.get(tp.partition, self._positions.get(tp))
            if off is not None:
                offsets[tp] = OffsetAndMetadata(off, "", -1)
        if offsets and (force or offsets != self._last_commit):
            self.consumer.commit(offsets)
            self._last_commit = offsets
