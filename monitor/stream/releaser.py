"""The release of one window, in one place: decide, draw, store, publish.

Stage 2 (``monitor.stream.stage2``) hands every window, merged over all input
partitions, to :meth:`WindowReleaser.close` exactly in schedule order. The sequence is

    accountant decides -> noise is drawn -> audit line (tests only) -> ledger row
    (fsynced) -> alerts topic -> ``mark_published`` -> metrics

so a crash anywhere leaves either no ledger row (the window is closed again from the
same events) or a row that is re-published byte for byte with the ``republished`` header.
What the alert record holds is decided in ``payload`` below and nowhere else.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from monitor.features import scale_to_unit
from monitor.release import release_window

log = logging.getLogger("monitor.stream")

__all__ = ["WindowReleaser", "ReleasableWindow", "SEND_TIMEOUT_S"]

SEND_TIMEOUT_S = 30.0


class ReleasableWindow(Protocol):
    """What a release needs: bounds, raw features, flags, and ids for the audit."""

    start: float
    end: float
    X: np.ndarray  # (n, d) raw feature values
    flagged: np.ndarray  # (n,) bool
    event_ids: tuple[str, ...]

    @property
    def n_events(self) -> int: ...


class WindowReleaser:
    """Release (or suppress) windows through the accountant and publish their alerts.

    Parameters
    ----------
    config:
        The validated configuration (release settings, bounds, alerts topic).
    ledger, accountant:
        The window ledger and the budget accountant over it.
    metrics:
        ``MonitorMetrics``; the released values and budget gauges are set here.
    producer:
        A kafka-python producer WITHOUT internal retries (see ``service._ALERT_PRODUCER``).
    noise:
        The ``NoiseSource`` (OpenDP in production).
    on_release:
        Called with each published alert record.
    audit:
        TESTS ONLY: path of the audit file (true window contents, not private).
    """

    def __init__(self, config, ledger, accountant, metrics, producer, noise, on_release: Callable[[dict], None] | None = None,
                 audit: str | Path | None = None) -> None:
        self.config, self.ledger, self.accountant, self.metrics = config, ledger, accountant, metrics
        self.producer, self.noise, self.on_release = producer, noise, on_release
        self.audit_path = Path(audit) if audit else None
        self.cost = config.release.window_cost(len(config.features))
        self.windows_closed = 0
        self.release_latencies: list[float] = []

    def close(self, window: ReleasableWindow) -> Any:
        """Release (or suppress) one window, durably, then publish it; returns the ledger entry."""
        cfg = self.config
        close_time = window.end + cfg.window.allowed_lateness_seconds

        def payload(decision) -> str:
            X = scale_to_unit(window.X, cfg.bounds) if window.n_events else window.X
            private = release_window(X, window.flagged, cfg.release, cfg.feature_names, rng=self.noise)
            record = {"window_start": window.start, "window_end": window.end, "released_at": time.time(),
                      **private, "budget": decision.budget_record()}
            # Audit BEFORE the ledger commit (inside its transaction): a crash between the
            # commit and the audit line would leave a released window with no record of its
            # contents. A crash before the commit re-closes the window from the same
            # events, so its audit line then appears twice, identical.
            self.audit(window, "released")
            return json.dumps(record)

        outcome = self.accountant.release(window.start, window.end, self.cost, payload)
        entry = outcome.entry
        if not outcome.replayed and not entry.released:
            self.audit(window, entry.status)
        if entry.released:
            if not entry.published:  # a replayed window already published needs nothing more
                self.publish(entry, republished=outcome.replayed)
                latency = time.time() - close_time
                self.release_latencies.append(latency)
                self.metrics.release_latency.observe(max(0.0, latency))
        elif not outcome.replayed:
            self.metrics.windows_suppressed.labels(reason=entry.reason or "budget").inc()
            log.warning("window [%.0f, %.0f) suppressed: %s", window.start, window.end, entry.reason)
        # The budget is a function of event time: the period that ends with this window.
        self.metrics.set_budget("stream", self.accountant.spent(window.end)[0], self.accountant.remaining(window.end))
        self.windows_closed += 1
        return entry

    def publish(self, entry, *, republished: bool) -> None:
        """Send the stored bytes, wait for the broker's ack, mark them published."""
        headers = [("republished", b"1")] if republished else []
        future = self.producer.send(
            self.config.stream.alerts_topic,
            value=entry.payload.encode("utf-8"),
            key=json.dumps(entry.window_start).encode(),
            headers=headers,
        )
        self.producer.flush(timeout=SEND_TIMEOUT_S)
        future.get(timeout=SEND_TIMEOUT_S)  # raises if the broker did not take it
        self.ledger.mark_published(entry.window_start)
        record = json.loads(entry.payload)
        try:
            self.metrics.observe_release(record)
        except (KeyError, TypeError) as err:  # a record from an older version: publish it anyway
            log.warning("window [%.0f, %.0f): record lacks %s; metrics not updated", entry.window_start, entry.window_end, err)
        self.metrics.windows_released.inc()
        log.info("window [%.0f, %.0f) released%s: outliers %.1f, flagged %.1f", entry.window_start, entry.window_end,
                 " (republished)" if republished else "", record["outlier_count"]["value"], record["flagged_count"]["value"])
        if self.on_release is not None:
            try:
                self.on_release(record)
            except Exception as err:  # noqa: BLE001 - a display callback must not stop releases
                log.warning("on_release callback failed: %s", err)

    def republish_unpublished(self) -> None:
        """Publish, byte for byte, every ledger entry a crash left unpublished."""
        for entry in self.ledger.unpublished():
            self.publish(entry, republished=True)

    def audit(self, window: ReleasableWindow, status: str) -> None:
        """TESTS ONLY: one fsynced line with the window's true size and event ids."""
        if self.audit_path is None:
            return
        line = {"window_start": window.start, "window_end": window.end, "status": status,
                "n_events": window.n_events, "event_ids": sorted(window.event_ids)}
        with open(self.audit_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
