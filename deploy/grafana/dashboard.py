"""Generate the two Grafana dashboards, one per side of the metrics trust boundary.

- ``dashboards/dp-monitor.json``, "DP outlier monitor": for analysts. ONLY metrics of the
  private endpoint (``metrics.port``, job ``dp-monitor``): the private surge alarm, the
  baseline, the detailed reports, the budget, the schedule. Its datasource (uid
  ``prometheus``) must be a Prometheus that scrapes nothing else.
- ``dashboards/dp-monitor-operational.json``, "DP outlier monitor: operations": for
  operators. ONLY metrics of the operational endpoint (``metrics.operational_port``, job
  ``dp-monitor-operational``): events, dead letters, lag, latency, late publications.
  NOT private; datasource uid ``prometheus-operational`` (the operators' Prometheus).

Kept as code rather than hand-edited JSON so that every query lives in one readable list,
and the tests can check that each one runs on a real Prometheus and reads only its own
side's metrics. Re-generate after editing:

    python deploy/grafana/dashboard.py           # writes both JSON files
    python deploy/grafana/dashboard.py --check   # exit 1 if one is stale (CI)

Each panel's description says whether its numbers are differentially private, because
people read the dashboard, not the README.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards" / "dp-monitor.json"
OPERATIONAL_OUT = HERE / "dashboards" / "dp-monitor-operational.json"
# Fixed datasource uids, see provisioning/datasources: each dashboard names the
# Prometheus of its own side of the boundary.
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
OPERATIONAL_DATASOURCE = {"type": "prometheus", "uid": "prometheus-operational"}

# Every query is filtered by the instance variable so that one dashboard serves several
# monitors; tests substitute it (and the Grafana interval macro) before sending the query
# to Prometheus (monitor.docs.grafana_to_promql).
SEL = '{instance=~"$instance"}'
RATE = "$__rate_interval"

DP = "Differentially private release: safe to share."
PUB = "Public schedule/configuration: data-independent."
OPS = "Operational, NOT covered by the privacy guarantee: operators only, never on the analysts' dashboard."
REPORT = "Updated only when a detailed report is released (on a page, or on report.every_seconds); the values stay until the next one."

# Panels the README figure shows and the integration test requires to return data.
CORE_PANELS = [
    "Surge alarm state",
    "Alarm threshold vs baseline",
    "Flagged rate",
    "Detailed report: counts",
    "Privacy budget (epsilon)",
    "Windows released",
]

# Alarm states (monitor.stream.metrics.ALARM_STATES) and how the timeline colours them.
STATE_COLOURS = {"fired": "red", "held": "orange", "quiet": "green", "warming_up": "blue", "suppressed": "purple"}


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str                      # timeseries, stat, bargauge, state-timeline
    w: int
    h: int
    description: str
    queries: list[tuple[str, str]]  # (expr, legend)
    unit: str = "short"
    overrides: list[dict] = field(default_factory=list)
    mappings: list[dict] = field(default_factory=list)

    @property
    def instant(self) -> bool:
        # top-h subspaces are a snapshot of the last report, not a series
        return self.kind == "bargauge"


def _dashed(name: str, colour: str) -> dict:
    """A threshold or a baseline, not data: drawn dashed."""
    return {"matcher": {"id": "byName", "options": name},
            "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                           {"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}]}


def _colour(name: str, colour: str) -> dict:
    return {"matcher": {"id": "byName", "options": name},
            "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}]}


# ------------------------------------------------------------------ analysts (private)
PRIVATE_PANELS: list[Panel] = [
    Panel("Surge alarm state", "state-timeline", 18, 6,
          "The private surge alarm's state each window: fired (a page), held (the alarm.hold_windows after one), quiet, "
          f"warming_up (no baseline yet), suppressed (no budget for an alarm run, or alarm.enabled false). {DP}",
          [(f"dp_monitor_alarm_state{SEL}", "{{state}}")], "none",
          overrides=[_colour(state, colour) for state, colour in STATE_COLOURS.items()],
          mappings=[{"type": "value", "options": {"0": {"text": " ", "color": "transparent"}, "1": {"text": "on"}}}]),
    Panel("Paging now / pages", "stat", 6, 6,
          "1 while the alarm pages (this is what the DPMonitorSurge alert fires on), and the positive answers since the "
          f"monitor started. {DP}",
          [(f"max(dp_monitor_alarm{SEL})", "paging"), (f"sum(dp_monitor_alarm_pages_total{SEL})", "pages since start")],
          "none", mappings=[{"type": "value", "options": {"0": {"text": "quiet", "color": "green"},
                                                          "1": {"text": "PAGING", "color": "red"}}}]),
    Panel("Alarm threshold vs baseline", "timeseries", 12, 8,
          "Flagged events per window, each weighing 0 to 1 between the alarm's two calibrated levels "
          "(alarm.contamination_graded, alarm.contamination): the released baseline (normal mean weight x mean events of its "
          "span), the excess the alarm needs to page (derived from alarm.false_pages_per_30_days, the baseline's traffic and "
          "error and the alarm's noise: no absolute count to tune), and their sum, the weighted count that pages at baseline "
          f"traffic. The alarm compares each window privately; no window's own count is shown here. {DP}",
          [(f"dp_monitor_baseline_flagged_rate{SEL} * dp_monitor_baseline_events_per_window{SEL}", "baseline flagged per window"),
           (f"dp_monitor_alarm_threshold_events{SEL}", "excess that pages"),
           (f"dp_monitor_baseline_flagged_rate{SEL} * dp_monitor_baseline_events_per_window{SEL} + dp_monitor_alarm_threshold_events{SEL}",
            "flagged count that pages")],
          overrides=[_dashed("excess that pages", "red"), _dashed("flagged count that pages", "orange")]),
    Panel("Flagged rate", "timeseries", 12, 8,
          "Share of events flagged at the alarm's threshold (alarm.contamination): in each detailed report (noisy "
          "flagged count / noisy event count, both projected so that 0 <= flagged <= events, and clamped to [0, 1]), and "
          "the alarm's released baseline rate (the normal events' mean weight between its two levels, so at or above "
          f"alarm.contamination). {REPORT} {DP}",
          [(f"clamp(dp_monitor_report_flagged_count{SEL} / clamp_min(dp_monitor_report_event_count{SEL}, 1), 0, 1)",
            "reported window"),
           (f"dp_monitor_baseline_flagged_rate{SEL}", "baseline")], "percentunit",
          overrides=[_dashed("baseline", "blue")]),
    Panel("Detailed report: counts", "timeseries", 12, 8,
          "Flagged events of the last reported window (at the alarm's threshold) and, in the feature its 'where' named, "
          "the flagged events beyond normal traffic, each with its public 95 % half-width (dashed). One scale: flagged "
          f"events; the event count has its own panel. {REPORT} {DP}",
          [(f"dp_monitor_report_flagged_count{SEL}", "flagged"),
           (f"sum(dp_monitor_report_where_excess_count{SEL})", "beyond normal in the named feature(s)"),
           (f"dp_monitor_report_count_accuracy{{count=~\"flagged|where\", instance=~\"$instance\"}}", "+- 95 % {{count}}")],
          overrides=[_dashed(f"+- 95 % {c}", "gray") for c in ("flagged", "where")]),
    Panel("Detailed report: where", "timeseries", 12, 8,
          "Which feature each detailed report named and how many flagged events beyond normal it holds. A feature is "
          "named only when the low end of its excess's interval is above 0, with intervals that hold for all features at "
          "once (report.where.parts[].stands_out); a report where no single feature stands out draws no line. "
          f"{REPORT} {DP}",
          [(f"dp_monitor_report_where_excess_count{SEL}", "{{feature}}")]),
    Panel("Detailed report: events", "timeseries", 12, 6,
          f"Noisy event count of the last reported window, with its public 95 % half-width (dashed). {REPORT} {DP}",
          [(f"dp_monitor_report_event_count{SEL}", "events"),
           (f"dp_monitor_report_count_accuracy{{count=\"event\", instance=~\"$instance\"}}", "+- 95 % event")],
          overrides=[_dashed("+- 95 % event", "gray")]),
    Panel("Detailed report: outlier count (seed)", "timeseries", 12, 6,
          "The seed's distance-based outlier count of the last reported window, on its own axis; empty unless "
          "report.epsilon_count is set (off by default: at a report's share its 95 % interval is wider than a window). "
          f"{REPORT} {DP}",
          [(f"dp_monitor_report_outlier_count{SEL}", "outliers"),
           (f"dp_monitor_report_count_accuracy{{count=\"outlier\", instance=~\"$instance\"}}", "+- 95 % outlier")],
          overrides=[_dashed("+- 95 % outlier", "gray")]),
    Panel("Detailed report: top subspaces", "bargauge", 6, 8,
          f"Noisy outlier counts of the top-h subspaces (exponential mechanism) of the last reported window. {REPORT} {DP}",
          [(f"sort_desc(dp_monitor_report_subspace_count{SEL})", "#{{rank}} {{subspace}}")]),
    Panel("Privacy budget (epsilon)", "timeseries", 12, 8,
          "Epsilon spent and left per ledger: stream = a rolling budget (budget.epsilon per budget.period_seconds), "
          f"reference = a total that never refills. {PUB}",
          [(f"dp_monitor_budget_epsilon_spent{SEL}", "spent ({{ledger}})"),
           (f"dp_monitor_budget_epsilon_remaining{SEL}", "left ({{ledger}})"),
           (f"dp_monitor_budget_epsilon_limit{SEL}", "limit ({{ledger}})")]),
    Panel("Windows released", "timeseries", 12, 8,
          "Windows released, detailed reports released (by reason: alarm, schedule) and windows suppressed, per interval. "
          f"How many reports were released follows from the alarm's answers (DP) and the schedule. {PUB}",
          [(f"sum(increase(dp_monitor_windows_released_total{SEL}[{RATE}]))", "windows"),
           (f"sum by (reason) (increase(dp_monitor_reports_total{SEL}[{RATE}]))", "reports ({{reason}})"),
           (f"sum by (reason) (increase(dp_monitor_windows_suppressed_total{SEL}[{RATE}]))", "suppressed ({{reason}})")]),
    Panel("Cost of an alarm run / a detailed report", "stat", 6, 4,
          f"Epsilon one alarm run (any number of quiet windows and its pages) and one detailed report cost. {PUB}",
          [(f"dp_monitor_alarm_run_epsilon{SEL}", "alarm run"), (f"dp_monitor_report_cost_epsilon{SEL}", "report")]),
    Panel("Since last release", "stat", 6, 4,
          f"Seconds since the scheduled time of the last released window. {PUB}",
          [(f"time() - dp_monitor_last_release_timestamp_seconds{SEL}", "")], "s"),
    Panel("Last window end / last report (event time)", "stat", 6, 4,
          f"Event-time end of the last released window and of the last reported one. {PUB}",
          [(f"dp_monitor_released_window_end_timestamp_seconds{SEL} * 1000", "window"),
           (f"dp_monitor_report_window_end_timestamp_seconds{SEL} * 1000", "report")], "dateTimeAsIso"),
    Panel("Window schedule", "stat", 6, 4,
          "Configured window length, allowed lateness and publish delay; the no-release alert fires when the last release "
          f"is older than 2 windows + lateness + delay. {PUB}",
          [(f"dp_monitor_window_size_seconds{SEL}", "window"), (f"dp_monitor_window_allowed_lateness_seconds{SEL}", "lateness"),
           (f"dp_monitor_window_publish_delay_seconds{SEL}", "publish delay")], "s"),
    Panel("Build and accountant", "stat", 24, 3,
          f"Version, accountant and count mechanism of the running monitor. {PUB}",
          [(f"dp_monitor_info{SEL}", "{{version}} {{accountant}} {{mechanism}}")], "none"),
]

# ------------------------------------------------------------------ operators (NOT private)
OPERATIONAL_PANELS: list[Panel] = [
    Panel("Events by status", "timeseries", 12, 8,
          f"Event rate by status (accepted, dead_letter, late, duplicate_entity). {OPS}",
          [(f"sum by (status) (rate(dp_monitor_events_total{SEL}[{RATE}]))", "{{status}}")], "ops"),
    Panel("Dead letters by reason", "timeseries", 12, 8,
          f"Malformed events per second by reason. {OPS}",
          [(f"sum by (reason) (rate(dp_monitor_dead_letters_total{SEL}[{RATE}]))", "{{reason}}")], "ops"),
    Panel("Consumer lag", "timeseries", 12, 8,
          f"Messages behind the input topic's end, per partition. {OPS}",
          [(f"sum by (partition) (dp_monitor_consumer_lag_messages{SEL})", "partition {{partition}}")]),
    Panel("Release latency", "timeseries", 12, 8,
          "From a window's close time to the end of its release computation (quantiles over the interval); above "
          f"window.publish_delay_seconds an alert is published late. {OPS}",
          [(f"histogram_quantile(0.5, sum by (le) (rate(dp_monitor_release_latency_seconds_bucket{SEL}[{RATE}])))", "p50"),
           (f"histogram_quantile(0.95, sum by (le) (rate(dp_monitor_release_latency_seconds_bucket{SEL}[{RATE}])))", "p95")],
          "s"),
    Panel("Late publications", "timeseries", 12, 6,
          f"Alerts published after their scheduled time, per interval (a timing side channel: raise the publish delay). {OPS}",
          [(f"sum(increase(dp_monitor_late_publications_total{SEL}[{RATE}]))", "late")]),
    Panel("Events accepted (total)", "stat", 12, 6,
          f"Events accepted since the monitor started. {OPS}",
          [(f"sum(dp_monitor_events_total{{status=\"accepted\", instance=~\"$instance\"}})", "")]),
]


def _panel(pid: int, x: int, y: int, p: Panel, datasource: dict) -> dict:
    panel = {
        "id": pid, "type": p.kind, "title": p.title, "description": p.description, "datasource": datasource,
        "gridPos": {"x": x, "y": y, "w": p.w, "h": p.h},
        "fieldConfig": {"defaults": {"unit": p.unit, "mappings": p.mappings}, "overrides": p.overrides},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": datasource, "expr": expr, "legendFormat": legend,
             "instant": p.instant, "range": not p.instant}
            for i, (expr, legend) in enumerate(p.queries)
        ],
    }
    if p.kind == "stat":
        panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]},
                            "textMode": "value_and_name" if p.queries[0][1] else "value"}
    if p.kind == "state-timeline":
        panel["options"] = {"showValue": "never", "mergeValues": True, "rowHeight": 0.8}
    return panel


def _layout(specs: list[Panel], datasource: dict) -> list[dict]:
    panels, x, y, row_h = [], 0, 0, 0
    for pid, spec in enumerate(specs, start=1):
        if x + spec.w > 24:  # Grafana's grid is 24 units wide
            x, y, row_h = 0, y + row_h, 0
        panels.append(_panel(pid, x, y, spec, datasource))
        x, row_h = x + spec.w, max(row_h, spec.h)
    return panels


def _dashboard(uid: str, title: str, description: str, tags: list[str], datasource: dict, variable_metric: str,
               specs: list[Panel], annotations: list[dict]) -> dict:
    return {
        "uid": uid, "title": title, "tags": tags, "description": description,
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"}, "timezone": "browser",
        "templating": {"list": [{
            "name": "instance", "label": "monitor", "type": "query", "datasource": datasource,
            "query": {"query": f"label_values({variable_metric}, instance)", "refId": "instance"},
            "definition": f"label_values({variable_metric}, instance)",
            "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
            "current": {"selected": True, "text": "All", "value": "$__all"},
        }]},
        "annotations": {"list": annotations},
        "panels": _layout(specs, datasource),
    }


def build() -> dict:
    """The analysts' dashboard: private values and public facts only."""
    # No ALERTS annotation: the analysts' Prometheus evaluates no rules (the operational
    # group's alerts would cross the boundary); the alarm state timeline shows the pages.
    return _dashboard("dp-outlier-monitor", "DP outlier monitor",
                      "Differentially private streaming outlier monitor: the private surge alarm, detailed reports and budget. "
                      "Private values and public facts only (job dp-monitor).",
                      ["dp-monitor", "privacy"], DATASOURCE, "dp_monitor_info", PRIVATE_PANELS, [])


def build_operational() -> dict:
    """The operators' dashboard: operational metrics, NOT private."""
    alerts = {"name": "Alerts", "enable": True, "iconColor": "red", "datasource": OPERATIONAL_DATASOURCE,
              "expr": 'ALERTS{alertname=~"DPMonitor.*", alertstate="firing"}', "titleFormat": "{{alertname}}"}
    return _dashboard("dp-outlier-monitor-operational", "DP outlier monitor: operations",
                      "Operational metrics of the DP outlier monitor (job dp-monitor-operational): NOT private, operators only.",
                      ["dp-monitor", "operational"], OPERATIONAL_DATASOURCE, "dp_monitor_events_total", OPERATIONAL_PANELS,
                      [alerts])


DASHBOARDS = {OUT: build, OPERATIONAL_OUT: build_operational}


def render(builder=build) -> str:
    return json.dumps(builder(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for path, builder in DASHBOARDS.items():
        text = render(builder)
        if "--check" in argv:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path)
            continue
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    for path in stale:
        print(f"{path} is stale: run python deploy/grafana/dashboard.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
