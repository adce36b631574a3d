"""The monitor service: Kafka in, private windows out, a budget that survives crashes.

One loop in one thread:

1. poll a batch of events; validate each (bad ones go to the dead-letter topic with
   their original bytes and a ``reason`` header); score the valid ones with the model
   in one vectorised call; put them in their event-time windows;
2. once the backlog present at start is read (catch-up), close every window whose
   wall-clock close time (end + allowed lateness) has passed, in order: accountant
   decides -> noise is drawn -> ledger row (fsynced) -> audit line (tests only) ->
   alerts topic -> ``mark_published`` -> metrics -> offsets committed;
3. commit, per partition, the smallest offset still held by an open window, so a crash
   loses nothing: events are read again and windows already in the ledger skip them.

The schedule of releases depends only on the clock and the config, never on the data.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any, Callable

import numpy as np
from kafka.errors import KafkaError

from monitor.config import MonitorConfig
from monitor.errors import MonitorError
from monitor.release import WindowReleaser
from monitor.stream.broker import EMBEDDED_GROUP_SETTINGS
from monitor.stream.events import EventSchema, InvalidEvent
from monitor.stream.metrics import MonitorMetrics
from monitor.stream import startup
from monitor.budget.plan import iso
from monitor.stream.windows import ClosedWindow, WindowStore

log = logging.getLogger("monitor.stream")

__all__ = ["MonitorService", "load_model"]

# How long to wait for the highwater of a newly assigned partition before releasing
# anyway (a partition whose leader never answers must not block every release).
_CATCH_UP_TIMEOUT_S = 30.0
_COMMIT_INTERVAL_S = 5.0
_LAG_INTERVAL_S = 1.0
# Errors worth waiting out. Anything else is a bug: retrying it forever would only hide
# that no window is being released, so it stops the service with its traceback.
_RETRIABLE = (KafkaError, OSError, sqlite3.OperationalError)
_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.5, 30.0
_SEND_TIMEOUT_S = 30.0
# Alerts are sent without the client's own retries: a broker that restarts loses the
# idempotent producer's state, and an internal retry would then write a second copy
# without the `republished` header. The service retries itself, with the header.
_ALERT_PRODUCER = {"retries": 0, "enable_idempotence": False}


def load_model(config: MonitorConfig):
    """The model file named in config, checked against the configured features, with the
    config's threshold applied (post-processing, no refit)."""
    from monitor.model.file import load_configured

    path = Path(config.model.path)
    if not path.exists():
        raise MonitorError(f"model file {path} not found (model.path): run `monitor fit` first to create it")
    model = load_configured(config)
    if getattr(model, "threshold_", None) is None:
        raise MonitorError(f"model file {path} has no flag threshold: refit with model.contamination or model.threshold set")
    return model


class MonitorService:
    """Consume events, release private windows, publish alerts and metrics.

    Parameters
    ----------
    config:
        The validated configuration.
    bootstrap_servers:
        Overrides ``stream.bootstrap_servers``; with neither, an embedded Tansu broker is
        started on 127.0.0.1 for the life of ``run()``.
    rng:
        None in production (OpenDP noise). A seed makes releases reproducible: TESTS ONLY.
    audit_path:
        TESTS ONLY: append one JSON line per closed window with its true size and event
        ids. This file is inside the trust boundary: it holds non-private data.
    on_release:
        Called with each alert record (dict) after it is published, e.g. the demo's table.
    max_windows:
        Stop cleanly after this many windows were released or suppressed.
    """

    def __init__(
        self,
        config: MonitorConfig,
        *,
        bootstrap_servers: str | list[str] | None = None,
        rng: Any = None,
        audit_path: str | Path | None = None,
        on_release: Callable[[dict], None] | None = None,
        max_windows: int | None = None,
    ) -> None:
        from monitor.dp import noise_source

        self.config = config
        self._bootstrap = bootstrap_servers or config.stream.bootstrap_servers
        self._noise = noise_source(rng)
        self._audit_path = Path(audit_path) if audit_path else None
        self._on_release = on_release
        self._max_windows = max_windows
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.metrics = MonitorMetrics()
        self._metrics_port: int | None = None
        self.broker = None  # the EmbeddedBroker, when we started one
        self.schema = EventSchema.from_config(config)
        self._operational_port: int | None = None
        from monitor.stream.inputwatch import InputWatch

        self._watch = InputWatch(config.feature_names, config.bounds, dead_letter_topic=config.stream.dead_letter_topic,
                                 counter=self.metrics.values_out_of_bounds)
        # Operational counts (NOT private), also in the metrics; handy for tests and bench.
        self.counts: Counter[str] = Counter()
        self.windows_closed = 0
        self.release_latencies: list[float] = []

    # -- public -----------------------------------------------------------------------
    @property
    def metrics_url(self) -> str | None:
        """URL of the Prometheus endpoint, once ``run()`` has started it."""
        if self._metrics_port is None:
            return None
        return f"http://{self.config.metrics.host}:{self._metrics_port}/metrics"

    @property
    def operational_metrics_url(self) -> str | None:
        """URL of the operators' (NOT private) Prometheus endpoint, once started."""
        if self._operational_port is None:
            return None
        return f"http://{self.config.metrics.host}:{self._operational_port}/metrics"

    @property
    def bootstrap_servers(self):
        return self._bootstrap

    def stop(self) -> None:
        """Ask ``run()`` to finish: thread- and signal-safe, returns at once."""
        self._stop.set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the service has joined its group and read its backlog."""
        return self._ready.wait(timeout)

    def run(self) -> None:
        """Run until ``stop()`` (or ``max_windows``); raises MonitorError on a setup problem."""
        from monitor.budget.accountant import BudgetAccountant
        from monitor.budget.ledger import WindowLedger

        from monitor.lockfile import LedgerLock

        cfg = self.config
        self.model = load_model(cfg)
        self._threshold = float(self.model.threshold_)
        lock = LedgerLock(cfg.budget.ledger).acquire()  # one monitor per ledger, or budgets are spent twice
        ledger = WindowLedger(cfg.budget.ledger)
        try:
            self.accountant = BudgetAccountant(ledger, cfg.budget.epsilon, cfg.budget.delta, cfg.budget.period_seconds, cfg.budget.accountant)
            self.ledger = ledger
            self.releaser = WindowReleaser(cfg, self.accountant, self.model, rng=self._noise,
                                           audit=(lambda w, _: self._audit(w, "released")) if self._audit_path else None)
            startup.check_ports(cfg, embedded=not self._bootstrap)
            self._start_broker()
            self._start_metrics()
            if self.broker is None and not startup.wait_for_broker(self._bootstrap, cfg.stream, self._stop):
                return  # stopped while waiting for the broker
            with startup.kafka_setup_errors(self._bootstrap):
                self._connect()
            try:
                self._republish_unpublished()
                resume = startup.skip_missed_windows(cfg, ledger, time.time(), self.broker is not None, self.metrics)
                # With no ledger yet, start at the oldest window the clock has not closed:
                # a partition taken over from another instance brings events of windows
                # that are still open, and they must not count as late here.
                first = resume if resume is not None else time.time() - cfg.window.allowed_lateness_seconds
                self.store = WindowStore(cfg.window.size_seconds, cfg.window.allowed_lateness_seconds, first, len(cfg.features))
                startup.announce_schedule(cfg, ledger, self.store.next_start, time.time())
                self._loop()
            finally:
                self._shutdown_clients()
        finally:
            ledger.close()
            lock.release()
            self.metrics.shutdown()
            if self.broker is not None:
                self.broker.stop()

    # -- setup ------------------------------------------------------------------------
    def _start_broker(self) -> None:
        if self._bootstrap:
            return
        from monitor.stream.broker import EmbeddedBroker

        self.broker = EmbeddedBroker(port=self.config.stream.embedded_broker_port).start()
        self._bootstrap = self.broker.bootstrap_servers
        startup.announce_embedded_broker(self._bootstrap)

    def _start_metrics(self) -> None:
        cfg, m = self.config, self.metrics
        self._metrics_port, self._operational_port = startup.serve_metrics(m, cfg.metrics.host, cfg.metrics.port, cfg.metrics.operational_port)
        m.budget_limit.labels(ledger="stream").set(cfg.budget.epsilon)
        m.alarm_run_cost.set(cfg.alarm.run_epsilon)
        m.report_cost.set(self.releaser.report_cost[0])
        m.window_size.set(cfg.window.size_seconds)
        m.window_lateness.set(cfg.window.allowed_lateness_seconds)
        m.publish_delay.set(cfg.window.publish_delay_seconds)
        from monitor import __version__

        m.info.labels(version=__version__, accountant=cfg.budget.accountant, mechanism=cfg.report.mechanism).set(1)
        at = self.ledger.last_window_end() or time.time()
        m.set_budget("stream", self.accountant.spent(at)[0], self.accountant.remaining(at))
        self._update_reference_budget()
        # The "no window released for too long" rule must see a stall that begins right
        # after a restart, so the last release comes from the ledger, not from zero.
        last = self.ledger.last_released()
        if last is not None:
            m.last_release.set(json.loads(last.payload)["released_at"])
        log.info("metrics on %s (private values and public facts only); operational metrics (NOT private) on %s",
                 self.metrics_url, self.operational_metrics_url or "(off)")

    def _update_reference_budget(self) -> None:
        """Export the reference ledger (written by `monitor fit` / `identify`), if there is one."""
        from monitor.budget.reference import ReferenceLedger

        b = self.config.budget
        if not Path(b.reference_ledger).exists():  # do not create it: the service never charges it
            return
        try:
            with ReferenceLedger(b.reference_ledger, b.reference_epsilon) as ref:
                self.metrics.set_budget("reference", ref.spent()[0], ref.remaining(), b.reference_epsilon)
        except Exception as err:  # noqa: BLE001 - a metric must not stop the service
            log.warning("cannot read the reference ledger %s: %s", b.reference_ledger, err)

    def _connect(self) -> None:
        from kafka import ConsumerRebalanceListener

        from monitor.stream.clients import ensure_topics, make_consumer, make_producer

        s = self.config.stream
        topics = [s.input_topic, s.alerts_topic, s.dead_letter_topic] + ([s.scores_topic] if s.scores_topic else [])
        ensure_topics(self._bootstrap, topics, s.kafka)
        self.producer = make_producer(self._bootstrap, s.kafka)
        self.alert_producer = make_producer(self._bootstrap, s.kafka, **_ALERT_PRODUCER)
        # Tansu joins a group in session_timeout_ms / 2: on the broker we started ourselves,
        # shorter timeouts than real Kafka accepts make (re)starts take 1 s instead of 3 s.
        group = {**EMBEDDED_GROUP_SETTINGS, **s.kafka} if self.broker is not None else s.kafka
        self.consumer = make_consumer(self._bootstrap, s.group_id, group)
        service = self

        class _Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                service._on_revoked(revoked)

            def on_partitions_assigned(self, assigned):
                service._on_assigned(assigned)

        self._catching_up: dict[Any, float] = {}  # partition -> deadline
        self._targets: dict[Any, int] = {}  # partition -> highwater at assignment
        self._positions: dict[Any, int] = {}  # partition -> next offset to read, from records seen
        # Dead letters not yet handed to the producer; their offsets stay uncommitted.
        self._unsent: deque[tuple[Any, InvalidEvent]] = deque()
        # A closed window not yet in the ledger (its release failed and is retried): while
        # it exists nothing is committed, because its events are held nowhere else.
        self._pending: ClosedWindow | None = None
        self._rewind: dict[Any, int] = {}  # partition -> first offset dropped on revoke
        # Between a revoke and the next assignment no window may close: the events dropped
        # at the revoke are not read again yet, and the old assignment is still visible.
        self._rebalancing = False
        self.consumer.subscribe([s.input_topic], listener=_Listener())

    def _renew_producers(self) -> None:
        """Replace the producers after an error: an idempotent producer whose broker lost
        its producer id (a restarted broker) fails every send until it is recreated."""
        from monitor.stream.clients import make_producer

        kafka = self.config.stream.kafka
        for name, extra in (("producer", {}), ("alert_producer", _ALERT_PRODUCER)):
            old = getattr(self, name)
            try:
                new = make_producer(self._bootstrap, kafka, **extra)
            except Exception as err:  # noqa: BLE001 - the next round of the loop retries
                log.warning("cannot create a producer yet: %s", err)
                continue
            setattr(self, name, new)
            try:
                old.close(timeout=0)
            except Exception:  # noqa: BLE001 - it is broken anyway
                pass

    def _shutdown_clients(self) -> None:
        for name in ("producer", "alert_producer", "consumer"):
            client = getattr(self, name, None)
            if client is None:
                continue
            try:
                client.close(autocommit=False) if name == "consumer" else client.close(timeout=5)
            except Exception as err:  # noqa: BLE001 - closing must not hide the real error
                log.warning("closing the %s: %s", name, err)

    # -- rebalance ------------------------------------------------------------------------
    def _on_assigned(self, assigned) -> None:
        deadline = time.monotonic() + _CATCH_UP_TIMEOUT_S
        for tp in assigned:
            self._catching_up[tp] = deadline
            self._targets.pop(tp, None)
            if tp in self._rewind:  # ours again: read the events we dropped once more
                self.consumer.seek(tp, self._rewind[tp])
                log.info("partition %d: reading again from offset %d", tp.partition, self._rewind[tp])
        self._rewind.clear()  # the others' new owners start from the committed offsets
        self._rebalancing = False
        log.info("assigned partitions %s", sorted(tp.partition for tp in assigned))

    def _on_revoked(self, revoked) -> None:
        # No commit here: kafka-python 3 runs this on its IO thread, where a blocking
        # commit is refused. Nothing is lost: every release commits at once, and events
        # read since then are read again by the partition's new owner.
        if not revoked or not hasattr(self, "store"):
            return
        self._rebalancing = True
        # kafka-python revokes every partition and then keeps the read position of those
        # it assigns again: remember where the dropped events start, to seek back there.
        held = self.store.held_offsets()
        gone = {tp.partition for tp in revoked}
        for rec, _ in self._unsent:
            if rec.partition in gone:
                held[rec.partition] = min(held.get(rec.partition, rec.offset), rec.offset)
        self._unsent = deque((rec, bad) for rec, bad in self._unsent if rec.partition not in gone)
        dropped = self.store.drop_partitions(gone)
        for tp in revoked:
            self._catching_up.pop(tp, None)
            self._targets.pop(tp, None)
            self._positions.pop(tp, None)
            if tp.partition in held:
                self._rewind[tp] = held[tp.partition]
        log.info("revoked partitions %s; %d events of open windows dropped here, %s", sorted(tp.partition for tp in revoked), dropped,
                 startup.revoke_note(self.broker is not None))

    def _caught_up(self) -> bool:
        """True once every assigned partition is read up to its highwater at assignment."""
        if self._rebalancing or not self.consumer.assignment():
            return False
        now = time.monotonic()
        for tp, deadline in list(self._catching_up.items()):
            target = self._targets.get(tp)
            if target is None:
                target = self.consumer.highwater(tp)  # known after the first fetch response
                if target is not None:
                    self._targets[tp] = target
            if target is not None and self.consumer.position(tp) >= target:
                del self._catching_up[tp]
            elif now > deadline:
                log.warning("partition %d: no catch-up within %.0f s; releasing anyway", tp.partition, _CATCH_UP_TIMEOUT_S)
                del self._catching_up[tp]
        done = not self._catching_up
        if done and not self._ready.is_set():
            self._ready.set()
            log.info("caught up; releasing windows on schedule")
        return done

    # -- the loop ---------------------------------------------------------------------
    def _loop(self) -> None:
        backoff = _BACKOFF_MIN_S
        next_commit = next_lag = 0.0
        while not self._stop.is_set():
            try:
                self._send_dead_letters()
                wait = max(0.0, min(0.2, self.store.next_close_time - time.time()))
                batch = self.consumer.poll(timeout_ms=int(wait * 1000))
                if batch:
                    self._ingest(batch)
                if self._caught_up():
                    if self._pending is not None:
                        self._close(self._pending)
                    for window in self.store.close_due(time.time()):
                        self._pending = window
                        self._close(window)
                        if self._done():
                            break
                now = time.monotonic()
                if now >= next_lag:
                    self._update_lag()
                    next_lag = now + _LAG_INTERVAL_S
                if now >= next_commit:
                    self._commit()
                    next_commit = now + _COMMIT_INTERVAL_S
                backoff = _BACKOFF_MIN_S
            except MonitorError:
                raise
            except _RETRIABLE as err:  # the broker, the network or the disk may come back: keep going
                log.error("stream error (retrying in %.1f s): %s: %s", backoff, type(err).__name__, err,
                          exc_info=log.isEnabledFor(logging.DEBUG))
                self._stop.wait(backoff)
                backoff = min(_BACKOFF_MAX_S, backoff * 2)
                self._renew_producers()
        self._finish()

    def _done(self) -> bool:
        if self._max_windows is not None and self.windows_closed >= self._max_windows:
            log.info("released or suppressed %d windows (--max-windows): stopping", self.windows_closed)
            self._stop.set()
        return self._stop.is_set()

    def _finish(self) -> None:
        """On stop: release windows per ``window.on_stop``, flush, commit.

        "release_due" drops the open windows: their events are not committed past, so
        the next run reads them again and puts them in the same windows. "release_current"
        also closes the window the clock is in (its close time is at most one window
        length away); the policy is config, so the decision stays data-independent.
        """
        cfg = self.config.window
        until = time.time()
        if cfg.on_stop == "release_current":
            until += cfg.size_seconds + cfg.allowed_lateness_seconds
        try:
            if self._pending is not None:
                self._close(self._pending)
            if self._max_windows is None or self.windows_closed < self._max_windows:
                if self._catching_up == {} and not self._rebalancing and self.consumer.assignment():
                    for window in self.store.close_due(until):
                        self._pending = window
                        self._close(window)
                        if self._max_windows is not None and self.windows_closed >= self._max_windows:
                            break
            self._send_dead_letters()
            self.producer.flush(timeout=_SEND_TIMEOUT_S)
            self._commit(force=True)
        except Exception as err:  # noqa: BLE001 - stopping must finish
            log.error("during stop: %s: %s", type(err).__name__, err)

    # -- ingestion --------------------------------------------------------------------
    def _ingest(self, batch: dict) -> None:
        schema, s = self.schema, self.config.stream
        use_kafka_time = s.timestamp_field is None
        valid: list[tuple[Any, Any]] = []  # (record, event)
        rejected: list[tuple[Any, InvalidEvent]] = []
        counts: Counter[str] = Counter()
        dead: Counter[str] = Counter()
        for tp, records in batch.items():
            if records:
                self._positions[tp] = records[-1].offset + 1
                log.debug("partition %d: offsets %d..%d read", tp.partition, records[0].offset, records[-1].offset)
            for rec in records:
                try:
                    valid.append((rec, schema.parse(rec.value)))
                except InvalidEvent as bad:
                    rejected.append((rec, bad))
                    dead[bad.reason] += 1
        if valid:
            X = np.array([ev.features for _, ev in valid], dtype=float)
            self._watch.out_of_bounds(X, time.time())
            scores = self.model.score_samples(X)
            flagged = scores > self._threshold
            horizon = self.store.horizon(time.time())
            add = self.store.add_one
            for i, (rec, ev) in enumerate(valid):
                ts = rec.timestamp / 1000.0 if use_kafka_time else ev.timestamp
                if ts >= horizon:
                    rejected.append((rec, InvalidEvent("bad_timestamp", f"{ts:.3f} is beyond the acceptance horizon {horizon:.3f} (now + window + lateness)")))
                    dead["bad_timestamp"] += 1
                    continue
                counts[add(
                    ts, ev.features, bool(flagged[i]),
                    event_id=ev.event_id or f"{rec.partition}:{rec.offset}",
                    entity=ev.entity, partition=rec.partition, offset=rec.offset,
                )] += 1
            if s.scores_topic:
                self._publish_scores(valid, scores, flagged)
        if dead:
            counts["dead_letter"] = sum(dead.values())
            for reason, n in dead.items():
                self.metrics.dead_letters.labels(reason=reason).inc(n)
        for status, n in counts.items():
            self.metrics.events.labels(status=status).inc(n)
        self.counts.update(counts)
        if rejected:
            self._watch.dead_letters((bad for _, bad in rejected), time.time())
        # Sent last: the valid events are in their windows (memory only, cannot fail)
        # before anything that talks to the broker, so a failed send loses nothing.
        self._unsent.extend(rejected)
        self._send_dead_letters()

    def _send_dead_letters(self) -> None:
        """Hand the backlog of dead letters to the producer, oldest first, until one fails."""
        while self._unsent:
            rec, bad = self._unsent[0]
            self._dead_letter(rec, bad)
            self._unsent.popleft()

    def _dead_letter(self, rec, bad: InvalidEvent) -> None:
        headers = [
            ("reason", bad.reason.encode()),
            ("detail", bad.detail.encode("utf-8", "replace")[:500]),
            ("source", f"{rec.topic}:{rec.partition}:{rec.offset}".encode()),
        ]
        self.producer.send(self.config.stream.dead_letter_topic, value=rec.value, key=rec.key, headers=headers)

    def _publish_scores(self, valid, scores: np.ndarray, flagged: np.ndarray) -> None:
        # Per-event scores are NOT private: this topic must stay inside the trust boundary.
        topic = self.config.stream.scores_topic
        for (rec, ev), score, flag in zip(valid, scores, flagged):
            body = {"id": ev.event_id or f"{rec.partition}:{rec.offset}", "score": float(score), "flagged": bool(flag)}
            self.producer.send(topic, value=json.dumps(body).encode(), key=rec.key)

    # -- window close -----------------------------------------------------------------
    def _close(self, window: ClosedWindow) -> None:
        """Release (or find in the ledger) one window, durably, then publish it on schedule."""
        cfg = self.config.window
        close_time = window.end + cfg.allowed_lateness_seconds
        # The release is stamped and published at a time fixed by the schedule alone, so
        # neither the stamp nor the moment it appears says how long the release took.
        released_at = close_time + cfg.publish_delay_seconds
        outcome = self.releaser.release(window, released_at)
        entry = outcome.entry
        if not outcome.replayed:
            latency = max(0.0, time.time() - close_time)
            self.release_latencies.append(latency)
            self.metrics.release_latency.observe(latency)
        if entry.released:
            # A replayed window that was already published needs nothing more.
            if not entry.published:
                wait = released_at - time.time()
                if wait > 0:
                    self._stop.wait(wait)
                elif not outcome.replayed:
                    self.metrics.late_publications.inc()
                    log.warning("window [%s, %s) published %.1f s after its scheduled time: the release took longer than "
                                "window.publish_delay_seconds (%g s); raise it", iso(window.start), iso(window.end), -wait,
                                cfg.publish_delay_seconds)
                self._publish_alert(entry, republished=outcome.replayed)
        elif not outcome.replayed:
            self.metrics.windows_suppressed.labels(reason=entry.reason or "budget").inc()
            log.warning("window [%s, %s) suppressed: %s", iso(window.start), iso(window.end), entry.reason)
        # The budget is a function of event time: the period that ends with this window.
        self.metrics.set_budget("stream", self.accountant.spent(window.end)[0], self.accountant.remaining(window.end))
        self._update_reference_budget()
        self.windows_closed += 1
        # Stored and published: from here a retry has nothing left to do.
        self._pending = None
        try:
            self._commit(force=True)
        except Exception as err:  # noqa: BLE001 - the periodic commit will retry
            log.warning("commit after window release failed: %s", err)

    def _publish_alert(self, entry, *, republished: bool) -> None:
        """Send the stored bytes, wait for the broker's ack, mark them published."""
        headers = [("republished", b"1")] if republished else []
        record = json.loads(entry.payload)
        future = self.alert_producer.send(
            self.config.stream.alerts_topic,
            value=entry.payload.encode("utf-8"),
            key=json.dumps(entry.window_start).encode(),
            headers=headers,
            # The record's timestamp is its scheduled time too, never the moment of sending.
            timestamp_ms=int(round(record["released_at"] * 1000)),
        )
        self.alert_producer.flush(timeout=_SEND_TIMEOUT_S)
        future.get(timeout=_SEND_TIMEOUT_S)  # raises if the broker did not take it
        self.ledger.mark_published(entry.window_start)
        try:
            self.metrics.observe_release(record)
        except (KeyError, TypeError) as err:  # a record from an older version: publish it anyway
            log.warning("window [%s, %s): record lacks %s; metrics not updated", iso(entry.window_start), iso(entry.window_end), err)
        self.metrics.windows_released.inc()
        detail = record.get("alarm_detail") or {}
        log.info("window [%s, %s) released%s: alarm %s%s", iso(entry.window_start), iso(entry.window_end),
                 " (republished)" if republished else "", detail.get("state", "?"),
                 " with a detailed report" if record.get("report") and "suppressed" not in record["report"] else "")
        if self._on_release is not None:
            try:
                self._on_release(record)
            except Exception as err:  # noqa: BLE001 - a display callback must not stop releases
                log.warning("on_release callback failed: %s", err)

    def _republish_unpublished(self) -> None:
        """Publish, byte for byte, every ledger entry a crash left unpublished."""
        for entry in self.ledger.unpublished():
            self._publish_alert(entry, republished=True)

    def _audit(self, window: ClosedWindow, status: str) -> None:
        if self._audit_path is None:
            return
        line = {"window_start": window.start, "window_end": window.end, "status": status,
                "n_events": window.n_events, "event_ids": sorted(window.event_ids)}
        with open(self._audit_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())

    # -- offsets and lag ----------------------------------------------------------------
    def _commit(self, force: bool = False) -> None:
        """Commit per partition the smallest offset an open window or an unsent dead letter holds.

        Nothing is committed while a closed window awaits its ledger row (``_pending``).
        """
        from kafka.structs import OffsetAndMetadata

        assignment = self.consumer.assignment()
        if not assignment or self._pending is not None:
            return
        # Dead letters and scores must be on the broker before their offsets are committed.
        self.producer.flush(timeout=_SEND_TIMEOUT_S)
        held = self.store.held_offsets()
        for rec, _ in self._unsent:
            held[rec.partition] = min(held.get(rec.partition, rec.offset), rec.offset)
        offsets = {}
        for tp in assignment:
            off = held.get(tp.partition, self._positions.get(tp))
            if off is not None:
                offsets[tp] = OffsetAndMetadata(off, "", -1)
        if offsets and (force or offsets != getattr(self, "_last_commit", None)):
            self.consumer.commit(offsets)
            self._last_commit = offsets

    def _update_lag(self) -> None:
        for tp in self.consumer.assignment():
            hw = self.consumer.highwater(tp)
            if hw is not None:
                self.metrics.consumer_lag.labels(partition=str(tp.partition)).set(max(0, hw - self.consumer.position(tp)))
