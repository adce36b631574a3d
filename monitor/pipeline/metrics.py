"""The service's Prometheus metrics, on two registries served on two ports.

The trust boundary runs between them:

- ``MonitorMetrics.registry`` (``metrics.port``): what an analyst or a dashboard may see.
  Only private values (the alarm, the baseline, the detailed reports, all DP) and public
  facts (the schedule, the budget, the config). Nothing here moves with the data except
  through a mechanism.
- ``MonitorMetrics.operational`` (``metrics.operational_port``): what operators need to
  run the service: events by status, dead letters, consumer lag, release latency. NOT
  private: differencing the event counter at window closes gives each window's size.
  Keep it away from analysts (a separate Prometheus job, a separate dashboard).

Dedicated registries keep two services in one process (tests, the demo) from clashing,
and keep the process's default collectors out of both endpoints.

>>> m = MonitorMetrics()
>>> m.events.labels(status="accepted").inc(3)
>>> m.operational.get_sample_value("dp_monitor_events_total", {"status": "accepted"})
3.0
>>> m.registry.get_sample_value("dp_monitor_events_total", {"status": "accepted"}) is None
True
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["MonitorMetrics", "EVENT_STATUSES", "ALARM_STATES"]

EVENT_STATUSES = ("accepted", "dead_letter", "late", "duplicate_entity")
ALARM_STATES = ("fired", "held", "quiet", "warming_up", "suppressed", "off")

# Release latency is dominated by the detailed report's smooth sensitivity (ms to s) and
# the broker round trip; buckets from 5 ms to 1 min.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class MonitorMetrics:
    """Every metric the service exports: private ones on ``registry``, operational ones on ``operational``."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.operational = o = CollectorRegistry(auto_describe=True)
        p = "dp_monitor_"
        # -- the alarm (DP: each answer is covered by its AboveThreshold run) ----------------
        self.alarm = Gauge(p + "alarm", "1 while the private surge alarm pages (fired or held), else 0 (DP).", registry=r)
        self.alarm_state = Gauge(p + "alarm_state", "1 for the alarm's state in the last window (DP).", ["state"], registry=r)
        self.alarm_pages = Counter(p + "alarm_pages", "Positive alarm answers (pages) since start (DP post-processing).", registry=r)
        self.alarm_threshold = Gauge(p + "alarm_threshold_events", "Excess flagged events a window needed to page (public: config and released baseline).", registry=r)
        self.baseline_rate = Gauge(p + "baseline_flagged_rate", "Released normal flagged rate the alarm measures against (DP).", registry=r)
        self.baseline_events = Gauge(p + "baseline_events_per_window", "Released mean events per window of the baseline span (DP).", registry=r)
        # -- detailed reports (DP) ------------------------------------------------------------
        self.report_event_count = Gauge(p + "report_event_count", "Noisy event count of the last reported window (DP).", registry=r)
        self.report_flagged_count = Gauge(p + "report_flagged_count", "Noisy flagged count of the last reported window: the alarm's graded weights, in events (DP).", registry=r)
        self.report_outlier_count = Gauge(
            p + "report_outlier_count", "Noisy full-space outlier count of the last reported window (DP); NaN when the report "
            "releases none (report.epsilon_count null, the default).", registry=r)
        self.report_count_accuracy = Gauge(
            p + "report_count_accuracy", "Half-width of the 95 % interval of the last report's noisy count, where its noise "
            "scale is public (a function of epsilon and the public sensitivity); absent where the scale follows the data.",
            ["count"], registry=r,
        )
        self.report_subspace_count = Gauge(
            p + "report_subspace_count", "Noisy outlier count of each top-h subspace of the last reported window (DP).",
            ["rank", "subspace"], registry=r,
        )
        self.report_where_excess = Gauge(
            p + "report_where_excess_count", "Flagged events beyond normal traffic in each feature the last report named "
            "(report.where.features: the parts whose excess stands out for all parts at once; noisy count less the "
            "normal share; DP).", ["feature"], registry=r,
        )
        self.report_window_end = Gauge(p + "report_window_end_timestamp_seconds", "Event-time end of the last reported window.", registry=r)
        self.reports = Counter(p + "reports", "Detailed reports released, by reason (alarm, schedule).", ["reason"], registry=r)
        self.reports_suppressed = Counter(
            p + "reports_suppressed", "Detailed reports due but not released because the budget could not pay for them (DP post-processing).",
            ["reason"], registry=r,
        )
        # -- public schedule ------------------------------------------------------------------
        self.released_window_end = Gauge(p + "released_window_end_timestamp_seconds", "Event-time end of the last released window.", registry=r)
        self.last_release = Gauge(p + "last_release_timestamp_seconds", "Scheduled time of the last release (its released_at).", registry=r)
        self.windows_released = Counter(p + "windows_released", "Windows released.", registry=r)
        self.windows_suppressed = Counter(p + "windows_suppressed", "Windows not released.", ["reason"], registry=r)
        # -- budget (data-independent) and config -------------------------------------------------
        self.budget_spent = Gauge(p + "budget_epsilon_spent", "Epsilon spent in the current period.", ["ledger"], registry=r)
        self.budget_remaining = Gauge(p + "budget_epsilon_remaining", "Epsilon left in the current period.", ["ledger"], registry=r)
        self.budget_limit = Gauge(p + "budget_epsilon_limit", "Configured epsilon per period.", ["ledger"], registry=r)
        self.alarm_run_cost = Gauge(p + "alarm_run_epsilon", "Epsilon of an alarm run that pages once: its threshold and one page (config).", registry=r)
        self.report_cost = Gauge(p + "report_cost_epsilon", "Epsilon one detailed report costs (config).", registry=r)
        self.false_pages_promise = Gauge(
            p + "alarm_false_pages_per_30_days", "The alarm's promise: false pages per 30 days of quiet traffic "
            "(alarm.false_pages_per_30_days; config; 0 with an absolute alarm.threshold or the alarm off: no promise).", registry=r)
        self.window_size = Gauge(p + "window_size_seconds", "Configured window length (window.size_seconds).", registry=r)
        self.window_lateness = Gauge(p + "window_allowed_lateness_seconds", "Configured wait for late events after a window's end.", registry=r)
        self.publish_delay = Gauge(p + "window_publish_delay_seconds", "Configured delay from a window's close time to its publication.", registry=r)
        self.info = Gauge(p + "info", "Build and configuration info.", ["version", "accountant", "mechanism"], registry=r)
        # -- operational: NOT private, served apart ------------------------------------------
        self.events = Counter(p + "events", "Events seen, by status (operational, NOT private).", ["status"], registry=o)
        self.dead_letters = Counter(p + "dead_letters", "Malformed events by reason (operational, NOT private).", ["reason"], registry=o)
        self.consumer_lag = Gauge(p + "consumer_lag_messages", "Highwater minus position per partition (operational, NOT private).", ["partition"], registry=o)
        self.values_out_of_bounds = Counter(
            p + "values_out_of_bounds", "Raw feature values outside their public bounds, clipped to them (operational, NOT private).",
            ["feature"], registry=o,
        )
        self.release_latency = Histogram(
            p + "release_latency_seconds", "From window close time to the end of the release computation (operational, NOT private).",
            buckets=_LATENCY_BUCKETS, registry=o,
        )
        self.late_publications = Counter(
            p + "late_publications", "Alerts published after their scheduled time because the release took longer than "
            "window.publish_delay_seconds (operational, NOT private: lateness is a timing channel).", registry=o,
        )
        # Intake that stops or collapses (monitor.pipeline.intake): a window without events is
        # released as `quiet`, so the silence must be seen on this side.
        self.intake_window = Gauge(
            p + "intake_window_seconds", "Length of the wall-clock windows intake is counted in: window.size_seconds "
            "(config, on the operational endpoint for its rules).", registry=o,
        )
        self.last_accepted = Gauge(
            p + "last_accepted_timestamp_seconds", "When stage 1 last accepted an event (the process start until the "
            "first; operational, NOT private).", registry=o,
        )
        self.intake_last_window = Gauge(
            p + "intake_last_window_events", "Events accepted in the last whole wall-clock window (operational, NOT private).",
            registry=o,
        )
        self.intake_usual_window = Gauge(
            p + "intake_usual_window_events", "Mean events accepted per wall-clock window over the windows before the last "
            "(up to 12; operational, NOT private).", registry=o,
        )
        # Zero-valued series exist from the start, so rate() and absent() rules work at once.
        for status in EVENT_STATUSES:
            self.events.labels(status=status)
        for reason in ("alarm", "schedule"):
            self.reports.labels(reason=reason)
            self.reports_suppressed.labels(reason=reason)
        self.windows_suppressed.labels(reason="budget")
        self._servers: list = []

    def observe_config(self, config, report_cost: "float | None" = None) -> None:
        """Set the config gauges the rules and the dashboard read (public), from a MonitorConfig.

        >>> from monitor.config import parse_config
        >>> m = MonitorMetrics()
        >>> m.observe_config(parse_config({"features": [{"name": "hr", "min": 30, "max": 220}], "model": {"path": "m.json"},
        ...                                "alarm": {"enabled": True, "false_pages_per_30_days": 2}}))
        >>> m.registry.get_sample_value("dp_monitor_alarm_false_pages_per_30_days")
        2.0
        """
        self.budget_limit.labels(ledger="stream").set(config.budget.epsilon)
        self.alarm_run_cost.set(config.alarm.run_epsilon)
        if report_cost is not None:
            self.report_cost.set(report_cost)
        self.window_size.set(config.window.size_seconds)
        self.window_lateness.set(config.window.allowed_lateness_seconds)
        self.publish_delay.set(config.window.publish_delay_seconds)
        promised = config.alarm.enabled and config.alarm.threshold is None
        self.false_pages_promise.set(config.alarm.false_pages_per_30_days if promised else 0.0)

    def observe_release(self, record: dict) -> None:
        """Set the private gauges from one released alert record.

        >>> m = MonitorMetrics()
        >>> m.observe_release({"window_end": 300.0, "released_at": 335.0, "alarm": True,
        ...                    "alarm_detail": {"state": "fired", "threshold": 40.0, "baseline_rate": 0.01},
        ...                    "report": {"reason": "alarm", "event_count": {"value": 990.0},
        ...                               "flagged_count": {"value": 80.0, "accuracy": 20.0},
        ...                               "outlier_count": {"value": 3.0, "accuracy": None}, "top_subspaces": [],
        ...                               "where": {"features": ["spo2"], "parts": [{"features": ["spo2"], "excess": {"value": 41.0, "accuracy": 30.0}}]}}})
        >>> m.registry.get_sample_value("dp_monitor_alarm"), m.registry.get_sample_value("dp_monitor_report_flagged_count")
        (1.0, 80.0)
        >>> acc = "dp_monitor_report_count_accuracy"
        >>> m.registry.get_sample_value(acc, {"count": "flagged"}), m.registry.get_sample_value(acc, {"count": "outlier"})
        (20.0, None)
        >>> m.registry.get_sample_value("dp_monitor_report_where_excess_count", {"feature": "spo2"}), m.registry.get_sample_value(acc, {"count": "where"})
        (41.0, 30.0)
        """
        detail = record.get("alarm_detail") or {}
        state = detail.get("state")
        self.alarm.set(1.0 if record.get("alarm") else 0.0)
        for s in ALARM_STATES:
            self.alarm_state.labels(state=s).set(1.0 if s == state else 0.0)
        if state == "fired":
            self.alarm_pages.inc()
        if detail.get("threshold") is not None:
            self.alarm_threshold.set(detail["threshold"])
        base = record.get("baseline_in_use")
        if base:
            self.baseline_rate.set(base["rate"])
            self.baseline_events.set(base["events_per_window"])
        report = record.get("report")
        if report and "suppressed" in report:
            self.reports_suppressed.labels(reason=report["reason"]).inc()
        elif report:
            self._observe_report(report, record["window_end"])
        self.released_window_end.set(record["window_end"])
        self.last_release.set(record["released_at"])
        budget = record.get("budget") or {}
        if "epsilon_spent" in budget:
            self.set_budget("stream", budget["epsilon_spent"], budget["epsilon_remaining"])

    def _observe_report(self, report: dict, window_end: float) -> None:
        self.reports.labels(reason=report["reason"]).inc()
        self.report_event_count.set(report["event_count"]["value"])
        self.report_flagged_count.set(report["flagged_count"]["value"])
        outliers = report.get("outlier_count")
        # NaN, not 0: a report that releases no outlier count says nothing about outliers.
        self.report_outlier_count.set(outliers["value"] if outliers else float("nan"))
        self.report_count_accuracy.clear()
        for count in ("event", "flagged", "outlier"):
            accuracy = (report.get(count + "_count") or {}).get("accuracy")  # records stored before it was published lack it
            if accuracy is not None:
                self.report_count_accuracy.labels(count=count).set(accuracy)
        # An older report's subspaces and features must not linger as if they were current.
        self.report_subspace_count.clear()
        for top in report.get("top_subspaces", []):
            self.report_subspace_count.labels(rank=str(top["rank"]), subspace="+".join(top["features"])).set(top["count"]["value"])
        self.report_where_excess.clear()
        where = report.get("where") or {}
        named = set(where.get("features") or [])
        for part in where.get("parts") or []:
            for feature in part["features"]:
                if feature in named:
                    self.report_where_excess.labels(feature=feature).set(part["excess"]["value"])
            if part.get("rank", 1) == 1:
                self.report_count_accuracy.labels(count="where").set(part["excess"]["accuracy"])
        self.report_window_end.set(window_end)

    def set_budget(self, ledger: str, spent: float, remaining: float, limit: float | None = None) -> None:
        self.budget_spent.labels(ledger=ledger).set(spent)
        self.budget_remaining.labels(ledger=ledger).set(remaining)
        if limit is not None:
            self.budget_limit.labels(ledger=ledger).set(limit)

    def serve(self, host: str, port: int, operational_port: int | None = None) -> tuple[int, int | None]:
        """Start the private and (unless None) the operational /metrics servers in daemon
        threads; returns the bound ports."""
        ports: list[int | None] = []
        for registry, p in ((self.registry, port), (self.operational, operational_port)):
            if p is None:
                ports.append(None)
                continue
            server, _ = start_http_server(p, addr=host, registry=registry)
            self._servers.append(server)
            ports.append(int(server.server_port))
        return ports[0], ports[1]

    @property
    def serving(self) -> bool:
        """True once the first (private) endpoint is up."""
        return bool(self._servers)

    def shutdown(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()
