"""Generate the Grafana dashboard JSON (deploy/grafana/dashboards/dp-monitor.json).

Kept as code rather than hand-edited JSON so that every query lives in one readable
list, and the tests can check that each one runs on a real Prometheus and uses only
metric names the service exports. Re-generate after editing:

    python deploy/grafana/dashboard.py           # writes the JSON
    python deploy/grafana/dashboard.py --check   # exit 1 if the JSON is stale (CI)

Each panel's description says whether its numbers are differentially private,
because operators read the dashboard, not the README.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "dp-monitor.json"
UID = "dp-outlier-monitor"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}  # fixed uid, see provisioning/datasources

# Every query is filtered by the instance variable so that one dashboard serves
# several monitors; tests substitute it (and the Grafana interval macros) before
# sending the query to Prometheus.
SEL = '{instance=~"$instance"}'
RATE = "$__rate_interval"

DP = "Differentially private release: safe to share."
OPS = "Operational, NOT covered by the privacy guarantee: keep inside the trust boundary."
PUB = "Public schedule/configuration: data-independent."

# Panels the README figure shows and the integration test requires to return data.
CORE_PANELS = [
    "Released outlier count vs alert level",
    "Released flagged count",
    "Privacy budget (epsilon)",
    "Windows released / suppressed",
    "Events by status",
    "Consumer lag",
]

# (title, type, width, height, description, [(expr, legend)], unit)
PANELS: list[tuple[str, str, int, int, str, list[tuple[str, str]], str]] = [
    ("Released outlier count vs alert level", "timeseries", 12, 8,
     f"Noisy full-space outlier count of each released window, and the configured surge level. {DP}",
     [(f"dp_monitor_released_outlier_count{SEL}", "released outliers"),
      (f"dp_monitor_outlier_alert_level{SEL}", "alert level")], "short"),
    ("Released flagged count", "timeseries", 12, 8,
     f"Noisy count of events the private model flagged, per released window. {DP}",
     [(f"dp_monitor_released_flagged_count{SEL}", "flagged")], "short"),
    ("Top subspaces (last window)", "bargauge", 8, 8,
     f"Noisy outlier counts of the top-h subspaces picked by the exponential mechanism. {DP}",
     [(f"sort_desc(dp_monitor_released_subspace_count{SEL})", "#{{rank}} {{subspace}}")], "short"),
    ("Top subspaces over time", "timeseries", 16, 8,
     f"Which subspaces were picked, window by window, and their noisy counts. {DP}",
     [(f"dp_monitor_released_subspace_count{SEL}", "{{subspace}}")], "short"),
    ("Privacy budget (epsilon)", "timeseries", 12, 8,
     f"Epsilon spent and left in the current period, per ledger. {PUB}",
     [(f"dp_monitor_budget_epsilon_spent{SEL}", "spent ({{ledger}})"),
      (f"dp_monitor_budget_epsilon_remaining{SEL}", "left ({{ledger}})"),
      (f"dp_monitor_budget_epsilon_limit{SEL}", "limit ({{ledger}})")], "short"),
    ("Windows released / suppressed", "timeseries", 12, 8,
     f"Windows per interval; a suppressed window was not released because the budget forbade it. {PUB}",
     [(f"sum(increase(dp_monitor_windows_released_total{SEL}[{RATE}]))", "released"),
      (f"sum by (reason) (increase(dp_monitor_windows_suppressed_total{SEL}[{RATE}]))", "suppressed ({{reason}})")],
     "short"),
    ("Events by status", "timeseries", 12, 8,
     f"Event rate by status (accepted, dead_letter, late, duplicate_entity). {OPS}",
     [(f"sum by (status) (rate(dp_monitor_events_total{SEL}[{RATE}]))", "{{status}}")], "ops"),
    ("Dead letters by reason", "timeseries", 12, 8,
     f"Malformed events per second by reason. {OPS}",
     [(f"sum by (reason) (rate(dp_monitor_dead_letters_total{SEL}[{RATE}]))", "{{reason}}")], "ops"),
    ("Consumer lag", "timeseries", 12, 8,
     f"Messages behind the input topic's end, per partition. {OPS}",
     [(f"sum by (partition) (dp_monitor_consumer_lag_messages{SEL})", "partition {{partition}}")], "short"),
    ("Release latency", "timeseries", 12, 8,
     f"From window close to alert published (quantiles over the interval). {OPS}",
     [(f"histogram_quantile(0.5, sum by (le) (rate(dp_monitor_release_latency_seconds_bucket{SEL}[{RATE}])))", "p50"),
      (f"histogram_quantile(0.95, sum by (le) (rate(dp_monitor_release_latency_seconds_bucket{SEL}[{RATE}])))", "p95")],
     "s"),
    ("Since last release", "stat", 6, 4,
     f"Wall-clock seconds since the last released window. {PUB}",
     [(f"time() - dp_monitor_last_release_timestamp_seconds{SEL}", "")], "s"),
    ("Epsilon per window", "stat", 6, 4,
     f"Configured epsilon one window costs. {PUB}",
     [(f"dp_monitor_window_cost_epsilon{SEL}", "")], "short"),
    ("Last window end (event time)", "stat", 6, 4,
     f"Event-time end of the last released window. {PUB}",
     [(f"dp_monitor_released_window_end_timestamp_seconds{SEL} * 1000", "")], "dateTimeAsIso"),
    ("Build and accountant", "stat", 6, 4,
     f"Version, accountant and mechanism of the running monitor. {PUB}",
     [(f"dp_monitor_info{SEL}", "{{version}} {{accountant}} {{mechanism}}")], "none"),
    ("Windows in a row above alert level", "stat", 6, 4,
     f"Consecutive released windows whose noisy outlier count exceeded the alert level; the surge alert fires at 3. "
     f"Computed from released counts only. {DP}",
     [(f"dp_monitor_consecutive_windows_above_alert_level{SEL}", "")], "short"),
    ("Window size and lateness", "stat", 6, 4,
     f"Configured window length and allowed lateness; the no-release alert fires when the last release is older than "
     f"2 windows + lateness. {PUB}",
     [(f"dp_monitor_window_size_seconds{SEL}", "window"),
      (f"dp_monitor_window_allowed_lateness_seconds{SEL}", "lateness")], "s"),
]


def _panel(pid: int, x: int, y: int, spec: tuple) -> dict:
    title, kind, w, h, desc, queries, unit = spec
    panel = {
        "id": pid, "type": kind, "title": title, "description": desc, "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend,
             # top-h subspaces are a snapshot of the last window, not a series
             "instant": kind == "bargauge", "range": kind != "bargauge"}
            for i, (expr, legend) in enumerate(queries)
        ],
    }
    if kind == "stat":
        panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "textMode": "value_and_name" if queries[0][1] else "value"}
    if title.startswith("Released outlier count"):
        # the alert level is a threshold, not data: draw it dashed
        panel["fieldConfig"]["overrides"].append({
            "matcher": {"id": "byName", "options": "alert level"},
            "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                           {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}],
        })
    return panel


def build() -> dict:
    panels, x, y, row_h = [], 0, 0, 0
    for pid, spec in enumerate(PANELS, start=1):
        w, h = spec[2], spec[3]
        if x + w > 24:  # Grafana's grid is 24 units wide
            x, y, row_h = 0, y + row_h, 0
        panels.append(_panel(pid, x, y, spec))
        x, row_h = x + w, max(row_h, h)
    return {
        "uid": UID, "title": "DP outlier monitor", "tags": ["dp-monitor", "privacy"],
        "description": "Differentially private streaming outlier monitor: releases, budget, and operations.",
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"}, "timezone": "browser",
        "templating": {"list": [{
            "name": "instance", "label": "monitor", "type": "query", "datasource": DATASOURCE,
            "query": {"query": "label_values(dp_monitor_info, instance)", "refId": "instance"},
            "definition": "label_values(dp_monitor_info, instance)",
            "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
            "current": {"selected": True, "text": "All", "value": "$__all"},
        }]},
        "annotations": {"list": [{
            "name": "Alerts", "enable": True, "iconColor": "red", "datasource": DATASOURCE,
            "expr": 'ALERTS{alertname=~"DPMonitor.*", alertstate="firing"}', "titleFormat": "{{alertname}}",
        }]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run python deploy/grafana/dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
