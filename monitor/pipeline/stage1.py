"""Stage 1: validate, score, bound contributions, window; hand shards to stage 2.

One consumer in the input topic's group (``stream.group_id``); any number of processes.
Per assigned input partition it keeps a :class:`WindowStore`.

What a window holds is decided by the broker's log, not by how fast it is read
(docs/scaling.md, "What a window holds"). At each close time (end + allowed lateness) a
watcher thread, which does no event work, reads every owned partition's log end
(highwater, from a fetch response: Tansu's list-offsets answers are wrong) with a
consumer of its own, records it as the window's *cut* and sends a ``cut`` marker to the
internal topic. An event belongs to window W when its event time is in W, its record was
created (Kafka record timestamp) before W's close and lies before W's cut. A record read
before W's close lies before the cut (the watcher reads the log end after it was
appended); one read later is compared with the recorded cut, so a record appended after
the close is never in W, however early the stage reaches it. The acceptance horizon is
judged against the log too: the earlier of the record's timestamp and the close of the
first window whose cut lies past the record, never the time of the read. The shard of W
from partition p (see ``shards``) is sent only once the stage has read p up to that cut,
however long that takes; stage 2 waits for it. Shards are sent keyed by window and
acknowledged by the broker; only then is the window forgotten and the input offset
committed past its events. A crash at any point therefore re-reads the events and sends
the shard again (a new attempt, which stage 2 ignores if an earlier one is complete);
the same records give the same window, except that a window which closed before the
takeover is cut where the new owner first sees the log end (below).

Each person's work is bounded before the costly steps: late events and repeated
entities are dropped (``WindowStore.select``) before the model scores anything, and a
malformed message costs a few more batch decodes of the messages around it (splitting),
never a per-message pass over everyone else's.

A partition this process takes over (from a dead or departed member) is read from its
committed offset with windows from the next one its own stage 2 releases on (after a
downtime, the backlog), or, with stage 2 elsewhere, from ``now - lateness - grace`` on:
every window stage 2 may still wait for is rebuilt, and the windows already shipped are
sent again as attempts stage 2 ignores. A ``start`` marker tells stage 2 so: a cut the previous owner
sent for an older window will not be followed by a shard. Windows that closed before the
takeover are cut at the highwater the new owner first sees.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections import Counter, deque
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from monitor.pipeline.events import HORIZON_HINT, InvalidEvent
from monitor.pipeline.publisher import SEND_TIMEOUT_S
from monitor.pipeline.shards import dumps, encode_marker, encode_shard
from monitor.pipeline.windows import Selection, WindowStore, take as _take

log = logging.getLogger("monitor.stream")

__all__ = ["Stage1"]

# How long to wait for the highwater of a newly assigned partition before shipping anyway
# (a partition whose leader never answers must not hold every window back forever).
CATCH_UP_TIMEOUT_S = 30.0
# Windows shipped per partition and round, so one long backlog does not starve the loop.
_SHIP_BATCH = 64
# On stop, how long stage 1 reads on for a due window whose cut it has not reached yet (the
# loop stopped polling at the signal): one or two polls; past it the window is read again at
# the next start. Well inside stage 2's wait for it (``stage2._FINISH_WAIT_S``).
_FINISH_READ_S = 2.0
_FINISH_POLL_MS = 50
_JOIN_POLL_MS = _MAX_POLL_MS = 200
# A window whose cut the watcher did not record this long after its close (the broker
# did not answer) is cut at the stage's own latest highwater instead, with a warning.
CUT_TIMEOUT_S = 10.0
# How long the watcher tries to read the log ends at one close time.
_CUT_SAMPLE_TIMEOUT_S = 5.0
# Around a malformed message, a partition's poll is split in up to this many pieces per
# level, and pieces of this many messages or fewer are decoded one by one.
_BISECT_FANOUT = 32
_BISECT_LEAF = 8


LATE_REASON = "late"
LATE_HINT = ("its window had closed (window end + window.allowed_lateness_seconds) before the record reached the topic: "
             "a device clock reset (ts 0), old data sent again, or a producer that lags; raise "
             "window.allowed_lateness_seconds if such delays are normal")


def _late_event(ts: float, size: float, lateness: float, field: str | None) -> InvalidEvent:
    """The dead letter of an event that came after its window's close."""
    from monitor.budget.plan import iso

    start = math.floor(ts / size) * size
    when = f"{ts:.3f} ({iso(ts)})" if math.isfinite(ts) and abs(ts) < 1e11 else f"{ts:.6g}"
    return InvalidEvent(LATE_REASON, f"event time {when} is in the window [{iso(start)}, {iso(start + size)}), "
                        f"closed at {iso(start + size + lateness)} before the record was appended",
                        field or "(Kafka timestamp)", LATE_HINT)


def _column(records, name: str) -> list:
    """One field of a partition's records as a list: the confluent backend's batches hand
    over their columns (``column``), kafka-python's ConsumerRecords are read in C."""
    column = getattr(records, "column", None)
    return column(name) if column is not None else list(map(attrgetter(name), records))


class Stage1:
    """The input side of the service; ``step()`` is called from the service loop."""

    producers = ("producer", "shard_producer")  # renewed after a broker error

    def __init__(self, service) -> None:
        self.service = service  # producers, model, schema, metrics, counts live there
        cfg = service.config
        self.config = cfg
        self.size = cfg.window.size_seconds
        self.lateness = cfg.window.allowed_lateness_seconds
        self.grace = cfg.window.release_grace_seconds
        self.stores: dict[Any, WindowStore] = {}
        self._catching_up: dict[Any, float] = {}  # partition -> deadline
        self._targets: dict[Any, int] = {}  # partition -> highwater at assignment
        self._positions: dict[Any, int] = {}  # partition -> next offset to read, from records seen
        # partition -> (monotonic time of the first record since assignment, records since): for the catch-up log
        self._first_read: dict[Any, list] = {}
        self._rewind: dict[Any, tuple[int | None, int]] = {}  # partition -> (first dropped offset, next window)
        # Dead letters not yet handed to the producer; their offsets stay uncommitted.
        self._unsent: deque[tuple[Any, InvalidEvent]] = deque()
        self._rebalancing = False
        self._last_commit: dict | None = None
        self.n_partitions = 0
        # The watcher thread writes these; the stage reads them (under the lock).
        self._lock = threading.Lock()
        self._owned: set = set()
        self._assigned_at: dict[Any, float] = {}  # partition -> wall-clock time of assignment
        self._cuts: dict[Any, dict[int, int]] = {}  # partition -> window index -> log end at its close
        self._markers: deque[tuple[str, float, int]] = deque()  # start markers to send: (kind, window start, partition)
        self._cut_warned: set = set()
        self._watcher: threading.Thread | None = None
        self._watch_stop = threading.Event()

    # -- group ------------------------------------------------------------------------
    def subscribe(self, consumer) -> None:
        from kafka import ConsumerRebalanceListener

        stage = self

        class _Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                stage._on_revoked(revoked)

            def on_partitions_assigned(self, assigned):
                stage._on_assigned(assigned)

        self.consumer = consumer
        consumer.subscribe([self.config.stream.input_topic], listener=_Listener())
        self._watcher = threading.Thread(target=self._watch_cuts, name="stage1-cuts", daemon=True)
        self._watcher.start()

    def _on_assigned(self, assigned) -> None:
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        # Windows stage 2 may still wait for: a taken-over partition rebuilds them all. A stage 2 in
        # this process waits for every window from its next one on, however long ago it closed (the
        # backlog after a downtime, window.max_catch_up_windows); one elsewhere, for those within the grace.
        stage2 = getattr(self.service, "stage2", None)
        fresh_start = stage2.next * self.size if stage2 is not None else time.time() - self.lateness - self.grace
        for tp in assigned:
            self._catching_up[tp] = deadline
            self._targets.pop(tp, None)
            self._first_read.pop(tp, None)
            first_start = fresh_start
            if tp in self._rewind:  # ours again: read the events we dropped once more
                offset, next_index = self._rewind[tp]
                first_start = next_index * self.size
                if offset is not None:
                    self.consumer.seek(tp, offset)
                    log.info("partition %d: reading again from offset %d", tp.partition, offset)
            self.stores[tp] = WindowStore(self.size, self.lateness, first_start, len(self.config.features))
            with self._lock:
                self._owned.add(tp)
                self._assigned_at[tp] = time.time()
                self._cuts[tp] = {}
            # Sent by the loop (not here, on the client's IO thread), before any shard.
            self._markers.append(("start", self.stores[tp].next_start, tp.partition))
        self._rewind.clear()  # the others' new owners start from the committed offsets
        self._rebalancing = False
        parts = self.consumer.partitions_for_topic(self.config.stream.input_topic)
        self.n_partitions = len(parts) if parts else max(self.n_partitions, 1 + max(tp.partition for tp in assigned))
        log.info("stage 1: assigned input partitions %s of %d", sorted(tp.partition for tp in assigned), self.n_partitions)

    def _on_revoked(self, revoked) -> None:
        # No commit here: kafka-python 3 runs this on its IO thread, where a blocking
        # commit is refused. Nothing is lost: every shipment commits at once, and events
        # read since then are read again by the partition's new owner.
        if not revoked:
            return
        self._rebalancing = True
        dropped = 0
        with self._lock:
            for tp in revoked:
                self._owned.discard(tp)
                self._assigned_at.pop(tp, None)
                self._cuts.pop(tp, None)
        for tp in revoked:
            store = self.stores.pop(tp, None)
            self._catching_up.pop(tp, None)
            self._targets.pop(tp, None)
            self._positions.pop(tp, None)
            if store is not None:
                held = store.held_offsets().get(tp.partition)
                unsent = [rec.offset for rec, _ in self._unsent if rec.partition == tp.partition]
                offset = min([o for o in [held, *unsent] if o is not None], default=None)
                self._rewind[tp] = (offset, store.next_index)
                dropped += store.n_open_events
        self._unsent = deque((rec, bad) for rec, bad in self._unsent if all(rec.partition != tp.partition for tp in revoked))
        from monitor.pipeline import startup

        log.info("stage 1: revoked partitions %s; %d events of open windows dropped here, %s",
                 sorted(tp.partition for tp in revoked), dropped, startup.revoke_note(self.service.broker is not None))

    def _caught_up(self, tp) -> bool:
        """True once ``tp`` is read up to its highwater at assignment (or waited too long)."""
        deadline = self._catching_up.get(tp)
        if deadline is None:
            return True
        target = self._targets.get(tp)
        if target is None:
            target = self.consumer.highwater(tp)  # known after the first fetch response
            if target is not None:
                self._targets[tp] = target
        if target is not None and self.consumer.position(tp) >= target:
            del self._catching_up[tp]
            first = self._first_read.pop(tp, None)
            took = f" ({first[1]} records in {time.monotonic() - first[0]:.3f} s)" if first else ""
            log.info("stage 1: partition %d caught up%s", tp.partition, took)
            return True
        if time.monotonic() > deadline:
            log.warning("partition %d: no catch-up within %.0f s; shipping anyway", tp.partition, CATCH_UP_TIMEOUT_S)
            del self._catching_up[tp]
            return True
        return False

    @property
    def ready(self) -> bool:
        """Assigned, caught up, and every window already due is shipped (acknowledged):
        stage 2 in the same process then has all this process can report."""
        if not self.stores or self._rebalancing or self._catching_up:
            return False
        now = time.time()
        return all(store.next_close_time > now for store in list(self.stores.values()))

    # -- the loop ---------------------------------------------------------------------
    def step(self, timeout_ms: int) -> None:
        self.send_dead_letters()
        self.send_markers()
        batch = self.consumer.poll(timeout_ms=timeout_ms)
        if batch:
            self.ingest(batch)
        now = time.time()
        if self.service.intake is not None:
            self.service.intake.tick(now)
        self.ship(now)

    def poll_timeout_ms(self) -> int:
        """Up to the next close time; never very short while joining the group (a poll
        that returns too early can abandon the join)."""
        if self._rebalancing or not self.stores:
            return _JOIN_POLL_MS
        close = min(s.next_close_time for s in self.stores.values())
        # At least 10 ms: a due window may wait a moment for its cut (the watcher's fetch).
        return int(1000 * max(0.01, min(_MAX_POLL_MS / 1000, close - time.time())))

    def ship(self, now: float) -> int:
        """Send every due window's shard of each caught-up partition; commit. Returns shards sent."""
        if self._rebalancing:
            return 0
        shipped: list[tuple[Any, WindowStore, float]] = []
        futures = []
        producer = self.service.shard_producer
        topic = self.config.stream.shard_topic
        for tp, store in list(self.stores.items()):
            if not self._caught_up(tp):
                continue
            due = self._read_to_cut(tp, store, store.due(now, limit=_SHIP_BATCH), now)
            for window in due:
                attempt = uuid.uuid4().hex
                key = json.dumps(window.start).encode()
                for chunk in encode_shard(window, tp.partition, self.n_partitions, attempt):
                    futures.append(producer.send(topic, value=dumps(chunk), key=key))
            if due:
                shipped.append((tp, store, due[-1].start))
        if not futures:
            return 0
        # Durably on the internal topic before the windows are forgotten and committed past.
        producer.flush(timeout=SEND_TIMEOUT_S)
        for f in futures:
            f.get(timeout=SEND_TIMEOUT_S)
        for tp, store, last in shipped:
            store.discard_through(last)
            self.forget_cuts(tp, store.index_of(last + self.size / 2))
        self.commit(force=True)
        return len(shipped)

    def _due_left(self, until: float) -> bool:
        """A caught-up partition still holds a window due at ``until``, not shipped."""
        return not self._rebalancing and any(self._caught_up(tp) and store.due(until, limit=1)
                                             for tp, store in list(self.stores.items()))

    def _read_to_cut(self, tp, store: WindowStore, due: list, now: float) -> list:
        """The leading windows of ``due`` whose cut ``tp`` has been read up to.

        A window that closed after the assignment is cut at the log end the watcher saw
        at its close; one that closed before, at the highwater at assignment (which
        ``_caught_up`` already waits for).
        """
        if not due:
            return due
        with self._lock:
            assigned_at = self._assigned_at.get(tp, 0.0)
            cuts = dict(self._cuts.get(tp, {}))
        position = None
        out = []
        for window in due:
            n = store.index_of(window.start + self.size / 2)
            close = store.close_time(n)
            if close > assigned_at:
                cut = cuts.get(n)
                if cut is None and close > time.time():
                    # Closed early by window.on_stop "release_current": the log end now.
                    cut = self._fallback_cut(tp, n, warn=False)
                    if cut is None:
                        break
                elif cut is None:
                    stopping = self.service._stop.is_set()
                    if now < close + CUT_TIMEOUT_S and not stopping:
                        break  # the watcher records it within milliseconds of the close
                    # Overdue (worth a warning), or a stop (the watcher has stopped): the same rule as _await_cuts.
                    cut = self._fallback_cut(tp, n, warn=not stopping)
                    if cut is None:
                        break
                if position is None:
                    position = self.consumer.position(tp)
                if position < cut:
                    break
            out.append(window)
        return out

    def forget_cuts(self, tp, through: int) -> None:
        with self._lock:
            cuts = self._cuts.get(tp)
            if cuts:
                for n in [n for n in cuts if n <= through]:
                    del cuts[n]

    def _fallback_cut(self, tp, n: int, warn: bool = True) -> int | None:
        """Record (and return) a cut for window ``n`` that the watcher did not record: the
        stage's own highwater now, which lies past every record it has read, and never
        below an earlier window's cut. A cut recorded meanwhile by the watcher wins."""
        hw = self.consumer.highwater(tp)
        if hw is None:
            return None
        with self._lock:
            if tp not in self._owned:  # revoked meanwhile: nothing of it is shipped here
                return None
            cuts = self._cuts.setdefault(tp, {})
            if n in cuts:
                return cuts[n]
            cut = cuts[n] = max([hw, *(c for m, c in cuts.items() if m < n)])
        if warn and (tp, n) not in self._cut_warned:
            self._cut_warned.add((tp, n))
            log.warning("partition %d: no log end recorded at the close of window [%.0f, %.0f); "
                        "cut at the highwater now, %d", tp.partition, n * self.size, (n + 1) * self.size, cut)
        return cut

    def _await_cuts(self, tp, store: WindowStore, missing: list[int]) -> dict[int, int]:
        """Wait for the watcher to record the cuts of windows ``missing`` (closed already;
        it reads the log end within milliseconds of a close), falling back on
        ``_fallback_cut`` at ``CUT_TIMEOUT_S`` past a close or on a stop. Returns the
        partition's cuts."""
        stopping = self.service._stop
        while True:
            with self._lock:
                cuts = dict(self._cuts.get(tp, {}))
                owned = tp in self._owned
            missing = [n for n in missing if n not in cuts]
            if not missing or not owned:
                return cuts
            now = time.time()
            overdue = [n for n in missing if stopping.is_set() or now >= store.close_time(n) + CUT_TIMEOUT_S]
            if overdue:
                for n in overdue:
                    if self._fallback_cut(tp, n) is None:
                        missing.remove(n)  # no highwater yet: these records are judged without it
                continue
            time.sleep(0.002)

    def _log_bounds(self, tp, store: WindowStore, ts: np.ndarray, offsets: np.ndarray,
                    now: float) -> tuple[np.ndarray | None, np.ndarray]:
        """What the log says about each record of one partition's batch, read by ``now``.

        Returns (past_cut, first_close): whether the record lies at or past its event's
        window's cut (None: none does), and the close time of the first window (closing
        after this process took the partition) whose cut lies past the record: the record
        was appended before then. Both depend on the record's offset and the cuts only,
        never on when the record is read: a record read before a close lies before that
        close's cut, and one read after it is compared with the recorded cut (waiting a
        moment for the watcher when the close has just passed).
        """
        size, lateness = self.size, self.lateness
        m_open = math.floor((now - lateness) / size)  # the first window whose close is after now
        with self._lock:
            assigned_at = self._assigned_at.get(tp, 0.0)
            cuts = dict(self._cuts.get(tp, {}))
        m_owned = math.floor((assigned_at - lateness) / size)  # the first window closing after the assignment
        lo = max(store.next_index, m_owned)  # earlier windows are shipped (their cuts are below the position) or not ours
        missing = [n for n in range(lo, m_open) if n not in cuts]
        if missing:
            cuts = self._await_cuts(tp, store, missing)
        known = sorted((n, c) for n, c in cuts.items() if lo <= n < m_open)
        ns = np.asarray([n for n, _ in known] + [m_open], dtype=np.int64)
        ends = np.maximum.accumulate(np.asarray([c for _, c in known] + [np.iinfo(np.int64).max], dtype=np.int64))
        first = ns[np.searchsorted(ends, offsets, side="right")]
        first_close = (first + 1) * size + lateness
        idx = np.floor(ts / size).astype(np.int64)
        closed = (idx >= store.next_index) & (idx < m_open)
        if not closed.any():  # the usual case: every event's window is still open
            return None, first_close
        # A window closed before the assignment is cut at the highwater the stage first saw.
        target = self._targets.get(tp)
        if target is None and m_owned > store.next_index:
            target = self.consumer.highwater(tp)  # past every record read so far
            if target is not None:
                self._targets[tp] = target
        before = idx < m_owned
        past = np.where(before, offsets >= (target if target is not None else np.iinfo(np.int64).max), first > idx)
        past &= closed & (before | np.isin(idx, ns[:-1]))  # a window with no cut at all (no highwater yet) excludes nothing
        return (past if past.any() else None), first_close

    def send_markers(self) -> None:
        """Send the queued ``start`` markers (partitions taken over) to the internal topic."""
        while self._markers:
            kind, start, partition = self._markers[0]
            chunk = encode_marker(kind, start, partition=partition, n_partitions=self.n_partitions, offset=None)
            self.service.shard_producer.send(self.config.stream.shard_topic, value=dumps(chunk),
                                             key=json.dumps(start).encode())
            self._markers.popleft()

    # -- the watcher ------------------------------------------------------------------
    def _watch_cuts(self) -> None:
        """At each window's close time, record and announce every owned partition's log end.

        Runs in its own thread with its own consumer, so a stage busy with a big backlog
        (or one person's flood) reads the same cut as an idle one: the log end at the
        close, give or take one fetch round trip.
        """
        stop = self._watch_stop
        n = math.floor((time.time() - self.lateness) / self.size)  # the next window to close
        while not stop.is_set() and not self.service._stop.is_set():
            close = (n + 1) * self.size + self.lateness
            wait = close - time.time()
            if wait > 0:
                stop.wait(min(wait, 1.0))
                continue
            if time.time() > close + self.grace:
                # Far behind (a frozen process): promise none of the windows missed, whose
                # partitions may have a new owner by now; go on with the next to close.
                n = math.floor((time.time() - self.lateness) / self.size)
                continue
            try:
                self._cut(n)
            except Exception as err:  # noqa: BLE001 - the stage falls back on its own highwater
                log.warning("stage 1: cannot read the log ends at the close of window %d: %s: %s", n, type(err).__name__, err)
            n += 1

    def _cut(self, n: int) -> None:
        with self._lock:
            owned = list(self._owned)
            assigned_at = dict(self._assigned_at)
        positions = dict(self._positions)
        close = (n + 1) * self.size + self.lateness
        owned = [tp for tp in owned if assigned_at.get(tp, close) < close]
        if not owned:
            return
        ends = self._log_ends(owned, positions)
        start = n * self.size
        producer = self.service.shard_producer
        for tp, end in ends.items():
            chunk = encode_marker("cut", start, partition=tp.partition, n_partitions=self.n_partitions, offset=end)
            # Sent before the cut is recorded: the shard, sent after, follows it on the topic.
            producer.send(self.config.stream.shard_topic, value=dumps(chunk), key=json.dumps(start).encode())
            with self._lock:
                if tp in self._owned:
                    # A cut the stage already fell back on (and compared records with) stays.
                    self._cuts.setdefault(tp, {}).setdefault(n, end)

    def _log_ends(self, tps: list, positions: dict) -> dict:
        """Each partition's highwater from a fetch sent now, by a consumer of its own (no group)."""
        from monitor.pipeline.clients import make_consumer

        s = self.config.stream
        # No group (and so no static member id): it only reads log ends, never commits.
        consumer = make_consumer(self.service.bootstrap_servers, None, s.kafka, fetch_max_wait_ms=10,
                                 max_partition_fetch_bytes=1024, max_poll_records=1, group_instance_id=None)
        try:
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, positions.get(tp, 0))
            ends: dict = {}
            deadline = time.monotonic() + _CUT_SAMPLE_TIMEOUT_S
            while len(ends) < len(tps) and time.monotonic() < deadline:
                consumer.poll(timeout_ms=20)
                for tp in tps:
                    hw = consumer.highwater(tp)
                    if hw is not None:
                        ends[tp] = hw
            return ends
        finally:
            consumer.close(autocommit=False)

    def finish(self, until: float, service) -> None:
        """On stop: ship what is due at ``until``, flush dead letters, commit."""
        self._watch_stop.set()
        if self.stores and not self._rebalancing and not service.max_windows_reached:
            deadline = time.monotonic() + _FINISH_READ_S
            while True:
                while self.ship(until):
                    pass
                if not self._due_left(until) or time.monotonic() > deadline:
                    break
                # A due window waits for its cut: without reading on, stage 2 (in this process)
                # waited its whole 5 s for it and the window was left to the next start.
                batch = self.consumer.poll(timeout_ms=_FINISH_POLL_MS)
                if batch:
                    self.ingest(batch)
        self.send_dead_letters()
        self.service.producer.flush(timeout=SEND_TIMEOUT_S)
        self.service.shard_producer.flush(timeout=SEND_TIMEOUT_S)
        self.commit(force=True)

    # -- ingestion --------------------------------------------------------------------
    def ingest(self, batch: dict) -> None:
        """Validate, bound, score and window one poll's records.

        The whole poll is parsed at once, then each partition's events are put through
        ``WindowStore.select`` (late ones and repeated entities dropped), and only the
        kept events of all partitions are scored, in one call (numpy calls cost the same
        for 10 events as for 1,000).
        """
        svc = self.service
        counts: Counter[str] = Counter()
        dead: Counter[str] = Counter()
        late_dead = 0
        now = time.time()
        parts = []
        for tp, records in batch.items():
            if not records:
                continue
            self._positions[tp] = records[-1].offset + 1
            if tp in self._catching_up:
                self._first_read.setdefault(tp, [time.monotonic(), 0])[1] += len(records)
            store = self.stores.get(tp)
            if store is not None:  # else revoked within this poll: its new owner reads it again
                parts.append((tp, store, records))
        X, parsed = self._parse(parts, dead)
        rejected: list[tuple[Any, InvalidEvent]] = []
        if len(X):
            svc.watch.out_of_bounds(X, now)
        selected = []  # (tp, store, records, selection, rows of X kept, offsets, ids, entities, keep)
        at = 0
        for (tp, store, records), (keep, ts, entities, ids, bad) in zip(parts, parsed):
            rejected += bad  # this partition's rejected messages, then its events beyond the horizon
            n = len(ts)
            if not n:
                continue
            rows = np.arange(at, at + n)
            at += n
            offsets = np.asarray(_column(records, "offset"), dtype=np.int64)
            created = self._kafka_times(records, None)
            if keep is not None:
                offsets, created = offsets[keep], created[keep]
            if None in ids:
                ids = [i if i is not None else f"{tp.partition}:{o}" for i, o in zip(ids, offsets.tolist())]
            past_cut, first_close = self._log_bounds(tp, store, ts, offsets, now)
            # The acceptance horizon from the log, never from the time of the read: the
            # record's timestamp, capped (a producer's clock that runs ahead) by the close
            # before which the record was appended. A record with no timestamp (old message
            # format) has only the cap, and only the cut decides whether it is late.
            untimed = created < 0
            if untimed.any():
                appended = np.where(untimed, first_close, np.minimum(created, first_close))
                created = np.where(untimed, -np.inf, created)
            else:
                appended = np.minimum(created, first_close)
            horizon = store.horizon(appended)
            ok = ts < horizon
            if not ok.all():
                for i in np.flatnonzero(~ok).tolist():
                    rec = records[i if keep is None else int(keep[i])]
                    rejected.append((rec, InvalidEvent("bad_timestamp", f"{ts[i]:.3f} is beyond the acceptance horizon "
                                                       f"{horizon[i]:.3f} (the earlier of the record's timestamp and the "
                                                       "close it was appended before, + window + lateness)",
                                                       svc.schema.timestamp_field, HORIZON_HINT)))
                    dead["bad_timestamp"] += 1
                sel = np.flatnonzero(ok)
                keep = sel if keep is None else keep[sel]
                rows, offsets, ts, created = rows[sel], offsets[sel], ts[sel], created[sel]
                past_cut = None if past_cut is None else past_cut[sel]
                ids = _take(ids, sel)
                entities = None if entities is None else _take(entities, sel)
            selection = store.select(ts, entities=entities, created=created, past_cut=past_cut)
            counts.update(selection.counts)
            if selection.arrived_late is not None:
                # Counted as late (not as dead letters: each event has one status), but sent
                # and logged as every other event the monitor cannot use: a device clock reset
                # to 0 or yesterday's data must not vanish without a word.
                for i in selection.arrived_late.tolist():
                    rec = records[i if keep is None else int(keep[i])]
                    rejected.append((rec, _late_event(float(ts[i]), self.size, self.lateness, svc.schema.timestamp_field)))
                late_dead += len(selection.arrived_late)
            if selection.keep is not None:
                k = selection.keep
                rows, offsets, ids = rows[k], offsets[k], _take(ids, k)
                entities = None if entities is None else _take(entities, k)
                keep = k if keep is None else keep[k]
            if selection.n_kept:
                selected.append((tp, store, records, selection, rows, offsets, ids, entities, keep))
        if selected:
            rows = np.concatenate([r for _, _, _, _, r, *_ in selected])
            scores = svc.model.score_samples(X[rows])
            flagged = scores > svc.threshold
            at = 0
            for tp, store, records, selection, part_rows, offsets, ids, entities, keep in selected:
                cut = slice(at, at + len(part_rows))
                at += len(part_rows)
                store.insert(selection, X[part_rows], flagged[cut], event_ids=ids, entities=entities,
                             partition=tp.partition, offsets=offsets)
                if self.config.stream.scores_topic:
                    keys = _column(records, "key")
                    self._publish_scores(keys if keep is None else _take(keys, keep), ids, scores[cut], flagged[cut])
        if dead:
            counts["dead_letter"] = sum(dead.values())
            for reason, n in dead.items():
                svc.metrics.dead_letters.labels(reason=reason).inc(n)
        if late_dead:
            svc.metrics.dead_letters.labels(reason=LATE_REASON).inc(late_dead)
        for status, n in counts.items():
            svc.metrics.events.labels(status=status).inc(n)
        svc.counts.update(counts)
        if svc.intake is not None:
            svc.intake.observe(counts.get("accepted", 0), now)
        if rejected:
            svc.watch.dead_letters((bad for _, bad in rejected), time.time())
        else:  # what the last warnings held back, once due, though no bad event came since
            svc.watch.flush(time.time())
        # Sent last: the valid events are in their windows (memory only, cannot fail)
        # before anything that talks to the broker, so a failed send loses nothing.
        self._unsent.extend(rejected)
        self.send_dead_letters()

    def _parse(self, parts: list, dead: Counter) -> tuple[np.ndarray, list[tuple]]:
        """Every partition's valid messages: their features stacked over the partitions (X),
        and per partition (positions of the valid records or None for all, timestamps,
        entities, ids, [(record, InvalidEvent)] of the rejected ones).

        The whole poll at once when every message is valid (the usual case); else
        partition by partition, and in a partition with an invalid message by splitting
        (``_parse_values``): the valid messages around a bad one stay on the batch path,
        and only the messages the batch decoder refuses are validated one by one, so
        each rejected one gets its own reason.
        """
        schema = self.service.schema
        n_features = len(schema.feature_names)
        values = [_column(records, "value") for _, _, records in parts]
        whole = schema.parse_batch(list(chain.from_iterable(values))) if len(parts) > 1 else None
        if whole is not None:
            X, out, at = whole.X, [], 0
            for (_, _, records), vals in zip(parts, values):
                cut = slice(at, at + len(vals))
                at += len(vals)
                ts = self._kafka_times(records, None) if whole.timestamps is None else whole.timestamps[cut]
                out.append((None, ts, None if whole.entities is None else whole.entities[cut], whole.event_ids[cut], []))
            return X, out
        blocks, out = [], []
        for (_, _, records), vals in zip(parts, values):
            fast = schema.parse_batch(vals)
            if fast is not None:
                keep, bad, (X, ts, entities, ids) = None, [], fast
            else:
                keep, bad, X, ts, entities, ids = self._parse_values(records, vals, dead)
            if ts is None:
                ts = self._kafka_times(records, keep)
            blocks.append(X)
            out.append((keep, ts, entities, ids, bad))
        X = blocks[0] if len(blocks) == 1 else np.concatenate(blocks) if blocks else np.zeros((0, n_features))
        return X, out

    def _parse_values(self, records, vals: list, dead: Counter) -> tuple:
        """One partition's messages, some invalid: split with the batch decoder (up to
        ``_BISECT_FANOUT`` pieces per level) down to runs of ``_BISECT_LEAF``, then each
        message of a refused run on its own (the batch decoder, then ``schema.parse`` for
        the reason of a rejection). A malformed message costs a few batch decodes of the
        pieces around it, not a per-message pass over everyone else's messages.
        Returns (keep, rejected, X, timestamps or None, entities or None, ids)."""
        schema = self.service.schema
        n_features = len(schema.feature_names)
        with_ts, with_entity = schema.timestamp_field is not None, schema.entity_field is not None
        pieces: list[tuple[int, Any]] = []  # (first position, EventBatch) of accepted runs, in order
        bad: list = []

        def one(i: int) -> None:
            got = schema.parse_batch([vals[i]])
            if got is not None:
                pieces.append((i, got))
                return
            try:
                ev = schema.parse(vals[i])
            except InvalidEvent as err:
                bad.append((records[i], err))
                dead[err.reason] += 1
                return
            # Valid, but only for the per-message path (an ISO timestamp, for one).
            pieces.append((i, (np.asarray([ev.features], dtype=float).reshape(1, n_features),
                               np.asarray([ev.timestamp], dtype=float) if with_ts else None,
                               [ev.entity] if with_entity else None, [ev.event_id])))

        def run(lo: int, hi: int, known_bad: bool) -> None:
            if hi - lo == 1:
                one(lo)
                return
            got = None if known_bad else schema.parse_batch(vals[lo:hi])
            if got is not None:
                pieces.append((lo, got))
                return
            if hi - lo <= _BISECT_LEAF:
                for i in range(lo, hi):
                    one(i)
                return
            # Split in up to _BISECT_FANOUT pieces rather than halves: each refused message
            # then costs about two decodes of its piece, not one per halving level.
            step = max(_BISECT_LEAF, -(-(hi - lo) // _BISECT_FANOUT))
            for start in range(lo, hi, step):
                run(start, min(hi, start + step), False)

        run(0, len(vals), True)
        keep_parts, X_parts, ts_parts, ent_parts, ids = [], [], [], [], []
        for first, (X, ts, entities, event_ids) in pieces:
            keep_parts.append(np.arange(first, first + len(event_ids)))
            X_parts.append(X)
            ts_parts.append(ts)
            ent_parts.append(entities)
            ids.extend(event_ids)
        if not pieces:
            return np.zeros(0, dtype=np.intp), bad, np.zeros((0, n_features)), (np.zeros(0) if with_ts else None), \
                ([] if with_entity else None), []
        keep = np.concatenate(keep_parts)
        ts = np.concatenate(ts_parts) if with_ts else None
        entities = list(chain.from_iterable(ent_parts)) if with_entity else None
        return keep, bad, np.concatenate(X_parts), ts, entities, ids

    @staticmethod
    def _kafka_times(records, keep) -> np.ndarray:
        """Event times from the Kafka record timestamps (ms), when no timestamp field is configured."""
        ts = np.asarray(_column(records, "timestamp"), dtype=float) / 1000.0
        return ts if keep is None else ts[keep]

    def send_dead_letters(self) -> None:
        """Hand the backlog of dead letters to the producer, oldest first, until one fails."""
        while self._unsent:
            rec, bad = self._unsent[0]
            headers = [
                ("reason", bad.reason.encode()),
                ("detail", bad.detail.encode("utf-8", "replace")[:500]),
                ("source", f"{rec.topic}:{rec.partition}:{rec.offset}".encode()),
            ]
            self.service.producer.send(self.config.stream.dead_letter_topic, value=rec.value, key=rec.key, headers=headers)
            self._unsent.popleft()

    def _publish_scores(self, keys: list, ids: list[str], scores: np.ndarray, flagged: np.ndarray) -> None:
        # Per-event scores are NOT private: this topic must stay inside the trust boundary.
        topic = self.config.stream.scores_topic
        for key, event_id, score, flag in zip(keys, ids, scores.tolist(), flagged.tolist()):
            body = {"id": event_id, "score": score, "flagged": flag}
            self.service.producer.send(topic, value=json.dumps(body).encode(), key=key)

    # -- offsets and lag ----------------------------------------------------------------
    def commit(self, force: bool = False) -> None:
        """Commit per partition the smallest offset an unshipped window or an unsent dead letter holds."""
        from kafka.structs import OffsetAndMetadata

        assignment = self.consumer.assignment()
        if not assignment or self._rebalancing:
            return
        # Dead letters and scores must be on the broker before their offsets are committed.
        self.service.producer.flush(timeout=SEND_TIMEOUT_S)
        offsets = {}
        for tp in assignment:
            store = self.stores.get(tp)
            if store is None:
                continue
            held = [o for o in (store.held_offsets().get(tp.partition), self._positions.get(tp)) if o is not None]
            held += [rec.offset for rec, _ in self._unsent if rec.partition == tp.partition]
            if held:
                offsets[tp] = OffsetAndMetadata(min(held), "", -1)
        if offsets and (force or offsets != self._last_commit):
            self.consumer.commit(offsets)
            self._last_commit = offsets

    def update_lag(self) -> None:
        for tp in self.consumer.assignment():
            hw = self.consumer.highwater(tp)
            if hw is not None:
                self.service.metrics.consumer_lag.labels(partition=str(tp.partition)).set(max(0, hw - self.consumer.position(tp)))
