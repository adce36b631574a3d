"""The monitor service: Kafka in, private windows out, a budget that survives crashes.

Two stages on Kafka (docs/design.md#two-stages, docs/scaling.md), run by one loop in one thread:

- stage 1 (``monitor.pipeline.stage1``, consumer group ``stream.group_id`` on the input
  topic, any number of processes): validate each event (bad ones go to the dead-letter
  topic with their original bytes and a ``reason`` header), score the valid ones in one
  vectorised call, keep one event per entity per window, and once a window has closed
  (end + allowed lateness) and the partition is read up to its log end at the close,
  send its shard from each input partition to the internal topic; input offsets are
  committed only past shards the broker acknowledged;
- stage 2 (``monitor.pipeline.stage2``, group ``stream.group_id + ".stage2"`` on the
  internal topic, one process): merge each window's shards and release it once, in
  order, when every input partition has reported it or a grace has passed with every
  partition that announced the window (a ``cut``) reported,
  through ``monitor.pipeline.publisher.WindowPublisher`` (``monitor.release.WindowReleaser``:
  alarm, report, ledger; then the alerts topic at the scheduled time);
  internal offsets are committed only past windows in the ledger.

Before stage 2's first release, the alarm's rhythm history is re-read from the input topic
(``monitor.pipeline.history``: nothing released or charged; docs/operations.md, "Restarts").

``stream.stage`` (or ``monitor run --stage``) picks ``both`` (default), ``1`` or ``2``.
What a window holds is decided by the broker's log (event time in the window, record
timestamp before its close), never by how fast stage 1 reads it; a window waits for
every partition whose stage 1 announced it (a ``cut`` at its close), so a slow read
delays a release, published late and counted, rather than shrinking it
(docs/scaling.md, "What a window holds").
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Literal

from kafka.errors import KafkaError

from monitor.config import MonitorConfig
from monitor.errors import MonitorError
from monitor.pipeline import startup
from monitor.pipeline.broker import EMBEDDED_GROUP_SETTINGS
from monitor.pipeline.events import EventSchema
from monitor.pipeline.metrics import MonitorMetrics
from monitor.pipeline.publisher import WindowPublisher

log = logging.getLogger("monitor.stream")

__all__ = ["MonitorService", "load_model", "STAGE2_GROUP_SUFFIX"]

_COMMIT_INTERVAL_S = 5.0
_LAG_INTERVAL_S = 1.0
# Errors worth waiting out. Anything else is a bug: retrying it forever would only hide
# that no window is being released, so it stops the service with its traceback.
_RETRIABLE = (KafkaError, OSError, sqlite3.OperationalError)
_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.5, 30.0
# Alerts are sent without the client's own retries: a broker that restarts loses the
# idempotent producer's state, and an internal retry would then write a second copy
# without the `republished` header. The service retries itself, with the header.
_ALERT_PRODUCER = {"retries": 0, "enable_idempotence": False}
# Shards may be written by several stage-1 processes at once, which Tansu's idempotent
# producers do not survive (INFRA); a duplicate from a retry is harmless, since stage 2
# keeps the first complete attempt per window and partition.
_SHARD_PRODUCER = {"enable_idempotence": False}
STAGE2_GROUP_SUFFIX = ".stage2"


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
    stage:
        Overrides ``stream.stage``: ``"both"``, ``"1"`` (ingest only) or ``"2"`` (release only).
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
        stage: Literal["both", "1", "2"] | None = None,
    ) -> None:
        from monitor.dp import noise_source

        self.config = config
        self.stage = str(stage or config.stream.stage)
        if self.stage not in ("both", "1", "2"):
            raise MonitorError(f"stage must be 1, 2 or both, got {stage!r}")
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
        from monitor.pipeline.inputwatch import InputWatch

        # Rate-limited warnings for a misspelt field or values far outside the bounds.
        self.watch = InputWatch(config.feature_names, config.bounds, dead_letter_topic=config.stream.dead_letter_topic,
                                counter=self.metrics.values_out_of_bounds)
        # Operational counts (NOT private), also in the metrics; handy for tests and bench.
        self.counts: Counter[str] = Counter()
        self.stage1 = self.stage2 = self.publisher = None
        self.intake = None  # monitor.pipeline.intake.IntakeWatch, with stage 1
        self.ledger = None
        self.started_at: float | None = None  # when run() began: the first window holds it
        self.first_window_start: float | None = None  # where stage 2's schedule begins (None: stage 1 only)

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

    @property
    def windows_closed(self) -> int:
        """Windows released or suppressed by this process (stage 2)."""
        return self.publisher.windows_closed if self.publisher else 0

    @property
    def release_latencies(self) -> list[float]:
        return self.publisher.release_latencies if self.publisher else []

    @property
    def runs_stage1(self) -> bool:
        return self.stage in ("both", "1")

    @property
    def runs_stage2(self) -> bool:
        return self.stage in ("both", "2")

    def stop(self) -> None:
        """Ask ``run()`` to finish: thread- and signal-safe, returns at once."""
        self._stop.set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the service has joined its group(s) and read its backlog."""
        return self._ready.wait(timeout)

    def stage1_ready(self) -> bool:
        """False while this process's own stage 1 is joining or catching up: a window
        is then not released on its grace alone, since this process is about to report
        partitions (after a restart, the grace may pass during the rejoin)."""
        return self.stage1 is None or self.stage1.ready

    def done(self) -> bool:
        """True once a stop was asked or ``max_windows`` windows were closed."""
        if self._max_windows is not None and self.windows_closed >= self._max_windows and not self._stop.is_set():
            log.info("released or suppressed %d windows (--max-windows): stopping", self.windows_closed)
            self._stop.set()
        return self._stop.is_set()

    def run(self) -> None:
        """Run until ``stop()`` (or ``max_windows``); raises MonitorError on a setup problem."""
        cfg = self.config
        self.started_at = time.time()
        # Both stages need the model: stage 1 flags events, stage 2's releaser drives
        # the alarm and the reports with it.
        self.model = load_model(cfg)
        self.threshold = float(self.model.threshold_)
        from monitor.lockfile import LedgerLock

        # One stage 2 per ledger, or budgets are spent twice.
        lock = LedgerLock(cfg.budget.ledger).acquire() if self.runs_stage2 else None
        try:
            if self.runs_stage2:
                self._open_ledger()
            startup.check_ports(cfg, embedded=not self._bootstrap)
            self._start_broker()
            self._start_metrics()
            if self.broker is None and not startup.wait_for_broker(self._bootstrap, cfg.stream, self._stop):
                return  # stopped while waiting for the broker
            with startup.kafka_setup_errors(self._bootstrap):
                self._connect()
            try:
                if self.runs_stage2:
                    self.publisher.republish_unpublished()
                self._loop()
            finally:
                self._shutdown_clients()
                self.watch.flush(time.time(), held=True)  # counts the rate limit still held back
        finally:
            if self.ledger is not None:
                self.ledger.close()
            self.metrics.shutdown()
            if self.broker is not None:
                self.broker.stop()
            if lock is not None:
                lock.release()

    # -- setup ------------------------------------------------------------------------
    def _open_ledger(self) -> None:
        from monitor.budget.accountant import BudgetAccountant
        from monitor.budget.ledger import WindowLedger

        b = self.config.budget
        self.ledger = WindowLedger(b.ledger)
        self.accountant = BudgetAccountant.from_settings(self.ledger, b)
        # Its producer comes with the others in _connect.
        self.publisher = WindowPublisher(self.config, self.ledger, self.accountant, self.metrics, None, model=self.model,
                                         noise=self._noise, stop=self._stop, on_release=self._on_release,
                                         audit=self._audit_path)
        self.publisher.started_at = self.started_at

    def _start_broker(self) -> None:
        if self._bootstrap:
            return
        from monitor.pipeline.broker import start_embedded

        self.broker, moved = start_embedded(self.config.stream.embedded_broker_port, ledger=self.config.budget.ledger)
        self._bootstrap = self.broker.bootstrap_servers
        startup.announce_embedded_broker(self._bootstrap, moved)

    def _start_metrics(self) -> None:
        cfg, m = self.config, self.metrics
        self._metrics_port, self._operational_port = startup.serve_metrics(m, cfg.metrics.host, cfg.metrics.port,
                                                                           cfg.metrics.operational_port)
        m.observe_config(cfg, None if self.publisher is None else self.publisher.report_cost[0])
        from monitor import __version__

        m.info.labels(version=__version__, accountant=cfg.budget.accountant, mechanism=cfg.report.mechanism).set(1)
        if self.ledger is not None:
            at = self.ledger.last_window_end() or time.time()
            m.set_budget("stream", self.accountant.spent(at)[0], self.accountant.remaining(at))
            # The "no window released for too long" rule must see a stall that begins right
            # after a restart, so the last release comes from the ledger, not from zero.
            last = self.ledger.last_released()
            if last is not None:
                m.last_release.set(json.loads(last.payload)["released_at"])
        self.update_reference_budget()
        log.info("metrics on %s (private values and public facts only); operational metrics (NOT private) on %s",
                 self.metrics_url, self.operational_metrics_url or "(off)")

    def update_reference_budget(self) -> None:
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
        from monitor.pipeline.clients import ensure_topics, make_consumer
        from monitor.pipeline.stage1 import Stage1
        from monitor.pipeline.stage2 import Stage2

        s = self.config.stream
        topics = [s.input_topic, s.shard_topic, s.alerts_topic, s.dead_letter_topic] + ([s.scores_topic] if s.scores_topic else [])
        ensure_topics(self._bootstrap, topics, s.kafka)
        self._make_producers()
        # Tansu joins a group in session_timeout_ms / 2: on the broker we started ourselves,
        # shorter timeouts than real Kafka accepts make (re)starts take 1 s instead of 3 s.
        group = {**EMBEDDED_GROUP_SETTINGS, **s.kafka} if self.broker is not None else s.kafka
        if self.runs_stage2:
            self.publisher.producer = self.alert_producer
            # After downtime the oldest missed windows are suppressed by a public rule
            # (window.max_catch_up_windows), not released as noise that spends the budget.
            resume = startup.skip_missed_windows(self.config, self.ledger, time.time(), self.broker is not None, self.metrics)
            why = "after the ledger's last window"
            if resume is None:
                # A fresh ledger starts with the window the monitor starts in: never one that
                # closed before (it would be published late, and a warm-up baseline over it
                # would pay for windows nobody was reading), unless window.first_window asks
                # for the backlog. A function of the clock and the config only.
                w = self.config.window
                backlog = w.first_window == "backlog"
                at = self.started_at - (w.allowed_lateness_seconds + w.release_grace_seconds if backlog else 0.0)
                resume = startup.first_window_start(self.config, at)
                why = ("the oldest window within the grace: window.first_window backlog" if backlog
                       else "the window the monitor started in")
            self.first_window_start = resume
            self.stage2 = Stage2(self, self.publisher, resume)
            startup.announce_schedule(self.config, self.ledger, resume, time.time(), why)
            self.stage2.subscribe(make_consumer(self._bootstrap, s.group_id + STAGE2_GROUP_SUFFIX, _without_instance_id(group)))
        if self.runs_stage1:
            from monitor.pipeline.intake import IntakeWatch

            self.intake = IntakeWatch(self.config.window.size_seconds, self.started_at, metrics=self.metrics,
                                      where=f"topic {s.input_topic} on {_bootstrap_text(self._bootstrap)}")
            log.info("intake: a whole window (%g s) without an accepted event is logged as a WARNING, and the "
                     "operational rule DPMonitorNoIntake fires on it", self.config.window.size_seconds)
            self.stage1 = Stage1(self)
            if s.input_backend == "confluent":
                from monitor.pipeline.confluent_input import ConfluentConsumer

                consumer = ConfluentConsumer(self._bootstrap, s.group_id, group, s.confluent)
            else:
                consumer = make_consumer(self._bootstrap, s.group_id, group)
            self.stage1.subscribe(consumer)

    _PRODUCERS = {"producer": {}, "alert_producer": _ALERT_PRODUCER, "shard_producer": _SHARD_PRODUCER}

    def _make_producers(self, *names: str) -> None:
        """(Re)create producers: an idempotent producer whose broker lost its producer id
        (a restarted broker) fails every send until it is recreated."""
        from monitor.pipeline.clients import make_producer

        kafka = self.config.stream.kafka
        for name in names or tuple(self._PRODUCERS):
            old = getattr(self, name, None)
            try:
                new = make_producer(self._bootstrap, kafka, **self._PRODUCERS[name])
            except Exception as err:  # noqa: BLE001 - the next round of the loop retries
                if old is None:
                    raise
                log.warning("cannot create a producer yet: %s", err)
                continue
            setattr(self, name, new)
            if name == "alert_producer" and self.publisher is not None:
                self.publisher.producer = new
            if old is not None:
                try:
                    old.close(timeout=0)
                except Exception:  # noqa: BLE001 - it is broken anyway
                    pass

    def _consumers(self) -> list:
        return [st.consumer for st in (self.stage1, self.stage2) if st is not None and hasattr(st, "consumer")]

    def _shutdown_clients(self) -> None:
        for name in ("producer", "alert_producer", "shard_producer"):
            client = getattr(self, name, None)
            if client is not None:
                try:
                    client.close(timeout=5)
                except Exception as err:  # noqa: BLE001 - closing must not hide the real error
                    log.warning("closing the %s: %s", name, err)
        for consumer in self._consumers():
            try:
                consumer.close(autocommit=False)
            except Exception as err:  # noqa: BLE001
                log.warning("closing a consumer: %s", err)

    # -- the loops --------------------------------------------------------------------
    def _loop(self) -> None:
        """Each stage in a thread of its own, with its own consumer: kafka-python cannot
        complete two group joins that one thread's polls interleave (measured: 6 to 20 s,
        sometimes never), and a restart must rejoin fast to report before the grace."""
        threads = []
        self._stage1_finished = threading.Event()
        if self.stage1 is None:
            self._stage1_finished.set()
        if self.stage2 is not None:
            t = threading.Thread(target=self._guarded, args=(self._run_stage2,), name="stage2", daemon=True)
            threads.append(t)
            t.start()
        if self.stage1 is not None:
            try:
                self._run_stage(self.stage1)
            finally:
                self._stage1_finished.set()
        else:
            self._stop.wait()
        for t in threads:
            while t.is_alive():
                t.join(0.5)
        if self._thread_error is not None:
            raise self._thread_error

    _thread_error: BaseException | None = None
    history = None  # monitor.pipeline.history.Rebuilt: what the start-up pass re-read (stage 2)

    def _run_stage2(self) -> None:
        self._rebuild_history()
        self._run_stage(self.stage2)

    def _rebuild_history(self) -> None:
        """Before stage 2's first release: the alarm's rhythm history re-read from the input topic
        (``monitor.pipeline.history``; nothing released or charged). In the stage-2 thread, so
        this process's stage 1 joins and reads meanwhile. A stage-2-only process reads the topic
        too: it needs no group, only the config's Kafka settings. A broker error costs the
        history (logged), never the service."""
        from monitor.pipeline.history import RESTART_COST, rebuild_history

        try:
            self.history = rebuild_history(self.config, self._bootstrap, self.publisher.releaser, self.ledger,
                                           self.first_window_start, self.schema, embedded=self.broker is not None,
                                           stop=self._stop)
        except _RETRIABLE as err:
            log.warning("the alarm's history is not rebuilt: reading the input topic failed (%s: %s); the alarm compares "
                        "with the plain baseline, then with the first day's trend, and with the days before once a day "
                        "has passed; %s", type(err).__name__, err, RESTART_COST)

    def _guarded(self, target, *args) -> None:
        try:
            target(*args)
        except BaseException as err:  # noqa: BLE001 - re-raised by run() in the main thread
            self._thread_error = err
            self._stop.set()

    def _run_stage(self, stage) -> None:
        backoff = _BACKOFF_MIN_S
        next_commit = next_lag = 0.0
        while not self.done():
            try:
                stage.step(stage.poll_timeout_ms())
                self._check_ready()
                now = time.monotonic()
                if now >= next_lag:
                    stage.update_lag()
                    next_lag = now + _LAG_INTERVAL_S
                if now >= next_commit:
                    stage.commit()
                    next_commit = now + _COMMIT_INTERVAL_S
                backoff = _BACKOFF_MIN_S
            except MonitorError:
                raise
            except _RETRIABLE as err:  # the broker, the network or the disk may come back: keep going
                log.error("stream error (retrying in %.1f s): %s: %s", backoff, type(err).__name__, err,
                          exc_info=log.isEnabledFor(logging.DEBUG))
                self._stop.wait(backoff)
                backoff = min(_BACKOFF_MAX_S, backoff * 2)
                self._make_producers(*stage.producers)
        stage.finish(self._finish_until(), self)

    def _check_ready(self) -> None:
        if not self._ready.is_set() and all(st is None or st.ready for st in (self.stage1, self.stage2)):
            self._ready.set()
            log.info("caught up; releasing windows on schedule")

    def _finish_until(self) -> float:
        """On stop, windows closing up to this time are shipped and released (``window.on_stop``).

        "release_due" leaves the open windows: their events are not committed past, so
        the next run reads them again and puts them in the same windows. "release_current"
        also closes the window the clock is in (its close time is at most one window
        length away); the policy is config, so the decision stays data-independent.
        """
        cfg = self.config.window
        until = getattr(self, "_until", None)
        if until is None:
            until = self._until = time.time() + (cfg.size_seconds + cfg.allowed_lateness_seconds
                                                 if cfg.on_stop == "release_current" else 0.0)
        return until

    @property
    def max_windows_reached(self) -> bool:
        return self._max_windows is not None and self.windows_closed >= self._max_windows

    def wait_stage1_finished(self, timeout: float) -> bool:
        return self._stage1_finished.wait(timeout)


def _bootstrap_text(bootstrap) -> str:
    return bootstrap if isinstance(bootstrap, str) else ",".join(bootstrap)


def _without_instance_id(settings: dict[str, Any]) -> dict[str, Any]:
    # A static member id names one member of one group: the stage-2 consumer of a
    # process gets its own, derived from the stage-1 one.
    if settings.get("group_instance_id"):
        return {**settings, "group_instance_id": f"{settings['group_instance_id']}{STAGE2_GROUP_SUFFIX}"}
    return settings
