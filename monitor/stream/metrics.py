"""The service's Prometheus metrics (names fixed in DEVELOPERS.md), on their own registry.

A dedicated ``CollectorRegistry`` keeps two services in one process (tests, the demo)
from clashing, and keeps the process's default collectors out of the endpoint.

Released values are DP releases; budget and schedule metrics are data-independent;
event counters, lag and latency are operational and NOT covered by the guarantee.

>>> m = MonitorMetrics()
>>> m.events.labels(status="accepted").inc(3)
>>> m.registry.get_sample_value("dp_monitor_events_total", {"status": "accepted"})
3.0
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["MonitorMetrics", "EVENT_STATUSES"]

EVENT_STATUSES = ("accepted", "dead_letter", "late", "duplicate_entity")

# Release latency is dominated by the smooth-sensitivity computation (ms to s) and the
# broker round trip; buckets from 5 ms to 1 min.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class MonitorMetrics:
    """Every metric the service exports, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        p = "dp_monitor_"
        # DP releases
        self.released_outlier_count = Gauge(p + "released_outlier_count", "Noisy full-space outlier count of the last released window (DP).", registry=r)
        self.released_flagged_count = Gauge(p + "released_flagged_count", "Noisy count of model-flagged events in the last released window (DP).", registry=r)
        self.released_subspace_count = Gauge(
            p + "released_subspace_count", "Noisy outlier count of each top-h subspace of the last released window (DP).",
            ["rank", "subspace"], registry=r,
        )
        # Post-processing of released counts only, so DP as well; the surge rule reads it, so
        # that "N windows in a row" does not depend on the window size.
        self.consecutive_above = Gauge(
            p + "consecutive_windows_above_alert_level",
            "Consecutive most recent released windows whose released outlier count exceeded the alert level (DP post-processing).",
            registry=r,
        )
        # Public schedule
        self.released_window_end = Gauge(p + "released_window_end_timestamp_seconds", "Event-time end of the last released window.", registry=r)
        self.last_release = Gauge(p + "last_release_timestamp_seconds", "Wall-clock time of the last release.", registry=r)
        self.windows_released = Counter(p + "windows_released", "Windows released.", registry=r)
        self.windows_suppressed = Counter(p + "windows_suppressed", "Windows not released.", ["reason"], registry=r)
        # Budget (data-independent) and config
        self.budget_spent = Gauge(p + "budget_epsilon_spent", "Epsilon spent in the current period.", ["ledger"], registry=r)
        self.budget_remaining = Gauge(p + "budget_epsilon_remaining", "Epsilon left in the current period.", ["ledger"], registry=r)
        self.budget_limit = Gauge(p + "budget_epsilon_limit", "Configured epsilon per period.", ["ledger"], registry=r)
        self.window_cost = Gauge(p + "window_cost_epsilon", "Epsilon one window costs.", registry=r)
        self.outlier_alert_level = Gauge(p + "outlier_alert_level", "Released outlier count above which the surge alert counts a window.", registry=r)
        self.window_size = Gauge(p + "window_size_seconds", "Configured window length (window.size_seconds).", registry=r)
        self.window_lateness = Gauge(p + "window_allowed_lateness_seconds", "Configured wait for late events after a window's end.", registry=r)
        self.info = Gauge(p + "info", "Build and configuration info.", ["version", "accountant", "mechanism"], registry=r)
        # Operational: NOT private
        self.events = Counter(p + "events", "Events seen, by status (operational, not private).", ["status"], registry=r)
        self.dead_letters = Counter(p + "dead_letters", "Malformed events by reason (operational, not private).", ["reason"], registry=r)
        self.values_out_of_bounds = Counter(
            p + "values_out_of_bounds", "Raw feature values outside their public bounds, clipped to them (operational, not private).",
            ["feature"], registry=r,
        )
        self.consumer_lag = Gauge(p + "consumer_lag_messages", "Highwater minus position per partition (operational, not private).", ["partition"], registry=r)
        self.release_latency = Histogram(
            p + "release_latency_seconds", "From window close time to alert published (operational, not private).",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        # Zero-valued series exist from the start, so rate() and absent() rules work at once.
        for status in EVENT_STATUSES:
            self.events.labels(status=status)
        self.windows_suppressed.labels(reason="budget")
        self._alert_level: float | None = None
        self._server = None
        self._thread = None

    def set_alert_level(self, level: float) -> None:
        """Export ``metrics.outlier_alert_level`` and count released windows against it from now on.

        >>> m = MonitorMetrics()
        >>> m.set_alert_level(10)
        >>> for count in (12, 15, 3, 11, 14):
        ...     m.observe_release({"outlier_count": {"value": count}, "flagged_count": {"value": 0.0},
        ...                        "window_end": 60.0, "released_at": 65.0})
        >>> m.registry.get_sample_value("dp_monitor_consecutive_windows_above_alert_level")
        2.0
        """
        self._alert_level = level
        self.outlier_alert_level.set(level)

    def observe_release(self, record: dict) -> None:
        """Set the DP gauges from one released alert record."""
        count = record["outlier_count"]["value"]
        self.released_outlier_count.set(count)
        # Only released windows reach here: a suppressed window neither extends nor breaks a run.
        if self._alert_level is not None:
            if count > self._alert_level:
                self.consecutive_above.inc()
            else:
                self.consecutive_above.set(0)
        self.released_flagged_count.set(record["flagged_count"]["value"])
        # Subspaces of an older window must not linger as if they were current.
        self.released_subspace_count.clear()
        for top in record.get("top_subspaces", []):
            self.released_subspace_count.labels(rank=str(top["rank"]), subspace="+".join(top["features"])).set(top["count"]["value"])
        self.released_window_end.set(record["window_end"])
        self.last_release.set(record["released_at"])
        budget = record.get("budget") or {}
        if "epsilon_spent" in budget:
            self.set_budget("stream", budget["epsilon_spent"], budget["epsilon_remaining"])

    def set_budget(self, ledger: str, spent: float, remaining: float, limit: float | None = None) -> None:
        self.budget_spent.labels(ledger=ledger).set(spent)
        self.budget_remaining.labels(ledger=ledger).set(remaining)
        if limit is not None:
            self.budget_limit.labels(ledger=ledger).set(limit)

    def serve(self, host: str, port: int) -> int:
        """Start the /metrics HTTP server in a daemon thread; returns the bound port."""
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._server.server_port)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
