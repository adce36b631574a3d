"""Stage 2's last step for one window: release it through the ledger, publish it on schedule.

``WindowPublisher.close(window)`` receives each window, merged over all input
partitions, exactly once and in schedule order, and runs

    ``monitor.release.WindowReleaser.release`` (alarm, report, charges and the alert
    record, one ledger transaction; the test-only audit line inside it) -> wait for the
    scheduled time -> alerts topic (acknowledged) -> ``mark_published`` -> metrics

so a crash anywhere leaves either no ledger row (the window is closed again from the
same shards) or a row that is re-published byte for byte with the ``republished``
header. What the alert record holds is decided in ``monitor.release`` only.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from monitor.budget.plan import iso

log = logging.getLogger("monitor.stream")

__all__ = ["WindowPublisher", "SEND_TIMEOUT_S", "release_summary", "late_cause"]

SEND_TIMEOUT_S = 30.0
# A publication this close to its scheduled time is on time: waking up from the wait, or a
# release that ends just as its time comes, is not a delay anyone can act on (it was logged
# as "published 0.0 s after its scheduled time").
LATE_TOLERANCE_S = 0.1


def late_by(released_at: float, now: float) -> float | None:
    """Seconds a publication at ``now`` comes after its scheduled time, None when on time.

    >>> late_by(100.0, 100.04) is None, late_by(100.0, 99.0) is None, late_by(100.0, 102.5)
    (True, True, 2.5)
    """
    late = now - released_at
    return late if late >= LATE_TOLERANCE_S else None


def late_cause(*, close_time: float, started_at: float | None, read_after_close: float, release_took: float,
               publish_delay: float) -> str:
    """Why a window was published after its scheduled time, in words, with what helps.

    Only a release slower than ``window.publish_delay_seconds`` is fixed by raising it; a
    window that closed before the monitor started, or whose events were still being read
    after its close (a backlog, a slow or rejoining stage 1), is late whatever the delay.

    >>> late_cause(close_time=100.0, started_at=120.0, read_after_close=30.0, release_took=0.1, publish_delay=5)
    'the window closed before the monitor started (released from the backlog at the start); a longer window.publish_delay_seconds would not help'
    >>> late_cause(close_time=100.0, started_at=50.0, read_after_close=0.0, release_took=6.5, publish_delay=5)
    'the release took 6.5 s, longer than window.publish_delay_seconds (5 s): raise it'
    >>> late_cause(close_time=100.0, started_at=50.0, read_after_close=0.25, release_took=0.3, publish_delay=0.5)
    'its input was read 0.2 s after its close and its release took 0.3 s, together longer than window.publish_delay_seconds (0.5 s): raise it'
    """
    if started_at is not None and close_time < started_at:
        return ("the window closed before the monitor started (released from the backlog at the start); "
                "a longer window.publish_delay_seconds would not help")
    if read_after_close >= publish_delay and read_after_close >= release_took:
        return (f"its input was still being read {read_after_close:.1f} s after its close (catching up on a backlog, or a "
                "slow or rejoining stage 1); a longer window.publish_delay_seconds would not help")
    if release_took >= publish_delay:
        return (f"the release took {release_took:.1f} s, longer than window.publish_delay_seconds ({publish_delay:g} s): "
                "raise it")
    return (f"its input was read {read_after_close:.1f} s after its close and its release took {release_took:.1f} s, "
            f"together longer than window.publish_delay_seconds ({publish_delay:g} s): raise it")


def headline(report: dict | None) -> str:
    """The report column: the report's own headline when it has one, else a short summary.

    A report names a feature only when it stands out for all parts at once
    (``where.parts[].stands_out``, docs/report.md). A record from before that rule (its parts
    carry no ``stands_out``) named the largest part whatever the noise, so its feature is not
    shown: only its flagged count.

    >>> headline({"reason": "alarm", "headline": "surge in hr: +9 flagged (+-15)", "flagged_count": {"value": 30.4, "accuracy": 60.0},
    ...           "where": {"features": ["hr"], "parts": [{"features": ["hr"], "excess": {"value": 9.0, "accuracy": 15.0}}]}})
    'alarm: 30 flagged (+-60), no feature checked (a record from before the stands-out rule)'
    """
    if not report:
        return "-"
    if "suppressed" in report:
        return f"{report.get('reason', 'report')}: suppressed ({report['suppressed']})"
    parts_of_where = (report.get("where") or {}).get("parts") or []
    if parts_of_where and not all("stands_out" in p for p in parts_of_where):
        flagged = report.get("flagged_count") or {}
        acc = flagged.get("accuracy")
        return (f"{report.get('reason', 'report')}: {flagged.get('value', float('nan')):.0f} flagged"
                + ("" if acc is None else f" (+-{acc:.0f})") + ", no feature checked (a record from before the stands-out rule)")
    if report.get("headline"):
        return str(report["headline"])
    parts = [str(report.get("reason", "report"))]
    flagged = (report.get("flagged_count") or {}).get("value")
    if flagged is not None:
        parts.append(f"{flagged:.0f} flagged")
    top = report.get("top_subspaces") or []
    if top and top[0].get("features"):
        parts.append("top " + "+".join(top[0]["features"]))
    grid = (report.get("top_grid") or {}).get("grid")
    if grid:
        parts.append(f"grid {grid}")
    return ", ".join(parts)


def release_summary(record: dict) -> str:
    """The per-window log line's content: alarm state, what the window charged and, with a
    detailed report, its headline (all from the published record).

    >>> release_summary({"alarm_detail": {"state": "fired"}, "epsilon": 0.95,
    ...                  "report": {"reason": "alarm", "headline": "surge in hr: +41 flagged (+-12)"}})
    'alarm fired, epsilon 0.95; report (alarm): surge in hr: +41 flagged (+-12)'
    >>> release_summary({"alarm_detail": {"state": "quiet"}, "epsilon": 0.0, "report": None})
    'alarm quiet, epsilon 0'
    """
    detail = record.get("alarm_detail") or {}
    line = f"alarm {detail.get('state', '?')}, epsilon {record.get('epsilon') or 0.0:.3g}"
    if detail.get("problem"):  # a degenerate baseline: why the alarm is still warming up
        line += f" ({detail['problem']})"
    report = record.get("report")
    if report:
        line += f"; report ({report.get('reason', '?')}): " + headline(report).removeprefix(f"{report.get('reason')}: ")
    return line


class WindowPublisher:
    """Release (through ``releaser``) and publish each window's alert record.

    Parameters
    ----------
    config:
        The validated configuration.
    ledger, accountant:
        The window ledger and the budget accountant over it.
    metrics:
        ``MonitorMetrics``.
    producer:
        A kafka-python producer WITHOUT internal retries (see ``service._ALERT_PRODUCER``);
        replaced by the service after a broker error.
    releaser:
        ``monitor.release.WindowReleaser`` (or None: built here from ``model`` and ``noise``).
    stop:
        Set when the service stops: cuts the wait for a window's scheduled time short.
    on_release:
        Called with each published alert record.
    audit:
        TESTS ONLY: path of the audit file (true window contents, not private).
    """

    def __init__(self, config, ledger, accountant, metrics, producer, *, model, noise, stop: threading.Event,
                 on_release: Callable[[dict], None] | None = None, audit: str | Path | None = None) -> None:
        from monitor.release import WindowReleaser

        self.config, self.ledger, self.accountant, self.metrics = config, ledger, accountant, metrics
        self.producer, self.on_release, self._stop = producer, on_release, stop
        self.audit_path = Path(audit) if audit else None
        self.releaser = WindowReleaser(config, accountant, model, rng=noise,
                                       audit=(lambda w, _: self.audit(w, "released")) if self.audit_path else None)
        self.report_cost = self.releaser.report_cost
        self.windows_closed = 0
        self.release_latencies: list[float] = []
        self.started_at: float | None = None  # when the service started (set by it): for the cause of a late publication

    def close(self, window) -> Any:
        """Release (or find in the ledger) one window, durably, then publish it on schedule."""
        cfg = self.config.window
        close_time = window.end + cfg.allowed_lateness_seconds
        # The release is stamped and published at a time fixed by the schedule alone, so
        # neither the stamp nor the moment it appears says how long the release took.
        released_at = close_time + cfg.publish_delay_seconds
        handed_at = time.time()
        outcome = self.releaser.release(window, released_at)
        release_took = time.time() - handed_at
        entry = outcome.entry
        if not outcome.replayed:
            latency = max(0.0, time.time() - close_time)
            self.release_latencies.append(latency)
            self.metrics.release_latency.observe(latency)
        if entry.released:
            # A replayed window that was already published needs nothing more.
            if not entry.published:
                now = time.time()
                late = late_by(released_at, now)
                if released_at > now:
                    self._stop.wait(released_at - now)
                elif late is not None and not outcome.replayed:
                    self.metrics.late_publications.inc()
                    cause = late_cause(close_time=close_time, started_at=self.started_at, release_took=release_took,
                                       read_after_close=max(0.0, handed_at - close_time),
                                       publish_delay=cfg.publish_delay_seconds)
                    log.warning("window [%s, %s) published %.1f s after its scheduled time: %s", iso(window.start),
                                iso(window.end), late, cause)
                self.publish(entry, republished=outcome.replayed)
        elif not outcome.replayed:
            self.metrics.windows_suppressed.labels(reason=entry.reason or "budget").inc()
            log.warning("window [%s, %s) suppressed: %s", iso(window.start), iso(window.end), entry.reason)
        # The budget is a function of event time: the period that ends with this window.
        self.metrics.set_budget("stream", self.accountant.spent(window.end)[0], self.accountant.remaining(window.end))
        self.windows_closed += 1
        return entry

    def publish(self, entry, *, republished: bool) -> None:
        """Send the stored bytes, wait for the broker's ack, mark them published."""
        headers = [("republished", b"1")] if republished else []
        record = json.loads(entry.payload)
        future = self.producer.send(
            self.config.stream.alerts_topic,
            value=entry.payload.encode("utf-8"),
            key=json.dumps(entry.window_start).encode(),
            headers=headers,
            # The record's timestamp is its scheduled time too, never the moment of sending.
            timestamp_ms=int(round(record["released_at"] * 1000)),
        )
        self.producer.flush(timeout=SEND_TIMEOUT_S)
        future.get(timeout=SEND_TIMEOUT_S)  # raises if the broker did not take it
        self.ledger.mark_published(entry.window_start)
        try:
            self.metrics.observe_release(record)
        except (KeyError, TypeError) as err:  # a record from an older version: publish it anyway
            log.warning("window [%s, %s): record lacks %s; metrics not updated", iso(entry.window_start), iso(entry.window_end), err)
        self.metrics.windows_released.inc()
        log.info("window [%s, %s) released%s: %s", iso(entry.window_start), iso(entry.window_end),
                 " (republished)" if republished else "", release_summary(record))
        if self.on_release is not None:
            try:
                self.on_release(record)
            except Exception as err:  # noqa: BLE001 - a display callback must not stop releases
                log.warning("on_release callback failed: %s", err)

    def republish_unpublished(self) -> None:
        """Publish, byte for byte, every ledger entry a crash left unpublished."""
        for entry in self.ledger.unpublished():
            self.publish(entry, republished=True)

    def audit(self, window, status: str) -> None:
        """TESTS ONLY: one fsynced line with the window's true size and event ids."""
        if self.audit_path is None:
            return
        line = {"window_start": window.start, "window_end": window.end, "status": status,
                "n_events": window.n_events, "event_ids": sorted(window.event_ids)}
        with open(self.audit_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
