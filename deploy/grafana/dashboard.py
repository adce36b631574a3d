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
side's metrics. The panels are Grafana's own typed builders (``grafana-foundation-sdk``,
in the ``test`` extra, pinned to the build for the Grafana the compose stack runs), so a
misspelt option fails here rather than silently in Grafana. Re-generate after editing:

    python deploy/grafana/dashboard.py           # writes both JSON files
    python deploy/grafana/dashboard.py --check   # exit 1 if one is stale (CI)

Each panel's description says whether its numbers are differentially private, because
people read the dashboard, not the README.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from grafana_foundation_sdk.builders import bargauge, prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards" / "dp-monitor.json"
OPERATIONAL_OUT = HERE / "dashboards" / "dp-monitor-operational.json"
# Fixed datasource uids, see provisioning/datasources: each dashboard names the
# Prometheus of its own side of the boundary.
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="prometheus")
OPERATIONAL_DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="prometheus-operational")

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

# Alarm states (monitor.pipeline.metrics.ALARM_STATES) and how the timeline colours them.
STATE_COLOURS = {"fired": "red", "held": "orange", "quiet": "green", "warming_up": "blue", "suppressed": "purple"}

Override = tuple[str, list[model.DynamicConfigValue]]


def _panel(datasource: model.DataSourceRef, kind: ModuleType, title: str, w: int, h: int, description: str,
           queries: list[tuple[str, str]], unit: str = "short", overrides: Sequence[Override] = (),
           mappings: Sequence[model.ValueMapping] = ()) -> Builder[model.Panel]:
    """One panel of ``kind`` (an SDK panel module), its queries as (PromQL, legend) pairs."""
    panel = (kind.Panel().title(title).description(description).span(w).height(h).datasource(datasource)
             .unit(unit).mappings(list(mappings)))
    # top-h subspaces are a snapshot of the last report, not a series
    instant = kind is bargauge
    for i, (expr, legend) in enumerate(queries):
        query = prometheus.Dataquery().ref_id(chr(ord("A") + i)).datasource(datasource).expr(expr).legend_format(legend)
        panel.with_target(query.instant() if instant else query.range())
    for name, properties in overrides:
        panel.override_by_name(name, properties)
    if kind is stat:
        panel.reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        panel.text_mode(common.BigValueTextMode.VALUE_AND_NAME if queries[0][1] else common.BigValueTextMode.VALUE)
    if kind is statetimeline:
        # the SDK's model defaults hide the legend, which is what names the states' colours
        legend = common_builders.VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.LIST)
        tooltip = common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.SINGLE).sort(common.SortOrder.NONE)
        (panel.show_value(common.VisibilityMode.NEVER).merge_values(True).row_height(0.8)
         .legend(legend.placement(common.LegendPlacement.BOTTOM)).tooltip(tooltip))
    return panel


_analysts = functools.partial(_panel, DATASOURCE)
_operators = functools.partial(_panel, OPERATIONAL_DATASOURCE)


def _fixed(colour: str) -> model.DynamicConfigValue:
    return model.DynamicConfigValue("color", model.FieldColor(mode=model.FieldColorModeId.FIXED, fixed_color=colour))


def _dashed(name: str, colour: str) -> Override:
    """A threshold or a baseline, not data: drawn dashed."""
    return name, [model.DynamicConfigValue("custom.lineStyle", common.LineStyle(fill="dash", dash=[10, 10])), _fixed(colour)]


def _colour(name: str, colour: str) -> Override:
    return name, [_fixed(colour)]


def _values(texts: dict[str, tuple[str, str | None]]) -> list[model.ValueMapping]:
    """Value -> (text, colour) mappings; colour None keeps the field's own."""
    return [model.ValueMap({value: model.ValueMappingResult(text=text, color=colour) for value, (text, colour) in texts.items()})]


# ------------------------------------------------------------------ analysts (private)
PRIVATE_PANELS: list[Builder] = [
    _analysts(statetimeline, "Surge alarm state", 18, 6,
              "The private surge alarm's state each window: fired (a page), held (the alarm.hold_windows after one; alarm.trend_hold_windows before a day of history), quiet, "
              f"warming_up (no baseline yet), suppressed (no budget for an alarm run, or alarm.enabled false). {DP}",
              [(f"dp_monitor_alarm_state{SEL}", "{{state}}")], "none",
              overrides=[_colour(state, colour) for state, colour in STATE_COLOURS.items()],
              mappings=_values({"0": (" ", "transparent"), "1": ("on", None)})),
    _analysts(stat, "Paging now / pages", 6, 6,
              "1 while the alarm pages (this is what the DPMonitorSurge alert fires on), and the positive answers since the "
              f"monitor started. {DP}",
              [(f"max(dp_monitor_alarm{SEL})", "paging"), (f"sum(dp_monitor_alarm_pages_total{SEL})", "pages since start")],
              "none", mappings=_values({"0": ("quiet", "green"), "1": ("PAGING", "red")})),
    _analysts(timeseries, "Alarm threshold vs baseline", 12, 8,
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
    _analysts(timeseries, "Flagged rate", 12, 8,
              "Share of events flagged at the alarm's threshold (alarm.contamination): in each detailed report (noisy "
              "flagged count / noisy event count, both projected so that 0 <= flagged <= events, and clamped to [0, 1]), and "
              "the alarm's released baseline rate (the normal events' mean weight between its two levels, so at or above "
              f"alarm.contamination). {REPORT} {DP}",
              [(f"clamp(dp_monitor_report_flagged_count{SEL} / clamp_min(dp_monitor_report_event_count{SEL}, 1), 0, 1)",
                "reported window"),
               (f"dp_monitor_baseline_flagged_rate{SEL}", "baseline")], "percentunit",
              overrides=[_dashed("baseline", "blue")]),
    _analysts(timeseries, "Detailed report: counts", 12, 8,
              "Flagged events of the last reported window (at the alarm's threshold) and, in the feature its 'where' named, "
              "the flagged events beyond normal traffic, each with its public 95 % half-width (dashed). One scale: flagged "
              f"events; the event count has its own panel. {REPORT} {DP}",
              [(f"dp_monitor_report_flagged_count{SEL}", "flagged"),
               (f"sum(dp_monitor_report_where_excess_count{SEL})", "beyond normal in the named feature(s)"),
               (f"dp_monitor_report_count_accuracy{{count=~\"flagged|where\", instance=~\"$instance\"}}", "+- 95 % {{count}}")],
              overrides=[_dashed(f"+- 95 % {c}", "gray") for c in ("flagged", "where")]),
    _analysts(timeseries, "Detailed report: where", 12, 8,
              "Which feature each detailed report named and how many flagged events beyond normal it holds. A feature is "
              "named only when the low end of its excess's interval is above 0, with intervals that hold for all features at "
              "once (report.where.parts[].stands_out); a report where no single feature stands out draws no line. "
              f"{REPORT} {DP}",
              [(f"dp_monitor_report_where_excess_count{SEL}", "{{feature}}")]),
    _analysts(timeseries, "Detailed report: events", 12, 6,
              f"Noisy event count of the last reported window, with its public 95 % half-width (dashed). {REPORT} {DP}",
              [(f"dp_monitor_report_event_count{SEL}", "events"),
               (f"dp_monitor_report_count_accuracy{{count=\"event\", instance=~\"$instance\"}}", "+- 95 % event")],
              overrides=[_dashed("+- 95 % event", "gray")]),
    _analysts(timeseries, "Detailed report: outlier count (seed)", 12, 6,
              "The seed's distance-based outlier count of the last reported window, on its own axis; empty unless "
              "report.epsilon_count is set (off by default: at a report's share its 95 % interval is wider than a window). "
              f"{REPORT} {DP}",
              [(f"dp_monitor_report_outlier_count{SEL}", "outliers"),
               (f"dp_monitor_report_count_accuracy{{count=\"outlier\", instance=~\"$instance\"}}", "+- 95 % outlier")],
              overrides=[_dashed("+- 95 % outlier", "gray")]),
    _analysts(bargauge, "Detailed report: top subspaces", 6, 8,
              f"Noisy outlier counts of the top-h subspaces (exponential mechanism) of the last reported window. {REPORT} {DP}",
              [(f"sort_desc(dp_monitor_report_subspace_count{SEL})", "#{{rank}} {{subspace}}")]),
    _analysts(timeseries, "Privacy budget (epsilon)", 12, 8,
              "Epsilon spent and left per ledger: stream = a rolling budget (budget.epsilon per budget.period_seconds), "
              f"reference = a total that never refills. {PUB}",
              [(f"dp_monitor_budget_epsilon_spent{SEL}", "spent ({{ledger}})"),
               (f"dp_monitor_budget_epsilon_remaining{SEL}", "left ({{ledger}})"),
               (f"dp_monitor_budget_epsilon_limit{SEL}", "limit ({{ledger}})")]),
    _analysts(timeseries, "Windows released", 12, 8,
              "Windows released, detailed reports released (by reason: alarm, schedule) and windows suppressed, per interval. "
              f"How many reports were released follows from the alarm's answers (DP) and the schedule. {PUB}",
              [(f"sum(increase(dp_monitor_windows_released_total{SEL}[{RATE}]))", "windows"),
               (f"sum by (reason) (increase(dp_monitor_reports_total{SEL}[{RATE}]))", "reports ({{reason}})"),
               (f"sum by (reason) (increase(dp_monitor_windows_suppressed_total{SEL}[{RATE}]))", "suppressed ({{reason}})")]),
    _analysts(stat, "Cost of an alarm run / a detailed report", 6, 4,
              f"Epsilon one alarm run (any number of quiet windows and its pages) and one detailed report cost. {PUB}",
              [(f"dp_monitor_alarm_run_epsilon{SEL}", "alarm run"), (f"dp_monitor_report_cost_epsilon{SEL}", "report")]),
    _analysts(stat, "Since last release", 6, 4,
              f"Seconds since the scheduled time of the last released window. {PUB}",
              [(f"time() - dp_monitor_last_release_timestamp_seconds{SEL}", "")], "s"),
    _analysts(stat, "Last window end / last report (event time)", 6, 4,
              f"Event-time end of the last released window and of the last reported one. {PUB}",
              [(f"dp_monitor_released_window_end_timestamp_seconds{SEL} * 1000", "window"),
               (f"dp_monitor_report_window_end_timestamp_seconds{SEL} * 1000", "report")], "dateTimeAsIso"),
    _analysts(stat, "Window schedule", 6, 4,
              "Configured window length, allowed lateness and publish delay; the no-release alert fires when the last release "
              f"is older than 2 windows + lateness + delay. {PUB}",
              [(f"dp_monitor_window_size_seconds{SEL}", "window"), (f"dp_monitor_window_allowed_lateness_seconds{SEL}", "lateness"),
               (f"dp_monitor_window_publish_delay_seconds{SEL}", "publish delay")], "s"),
    _analysts(stat, "Pages in 7 days / promised", 12, 4,
              "The alarm's pages in the last 7 days, real surges and false pages alike, and the false pages its promise "
              "allows in 7 days (alarm.false_pages_per_30_days x 7 / 30); DPMonitorPagesBeyondPromise fires where the pages "
              f"are more than false pages at that rate would draw in 99 % of weeks. {DP}",
              [(f"sum(increase(dp_monitor_alarm_pages_total{SEL}[7d]))", "pages"),
               (f"max(dp_monitor_alarm_false_pages_per_30_days{SEL}) * 7 / 30", "promised")], "none"),
    _analysts(stat, "Build and accountant", 24, 3,
              f"Version, accountant and count mechanism of the running monitor. {PUB}",
              [(f"dp_monitor_info{SEL}", "{{version}} {{accountant}} {{mechanism}}")], "none"),
]

# ------------------------------------------------------------------ operators (NOT private)
OPERATIONAL_PANELS: list[Builder] = [
    _operators(timeseries, "Events by status", 12, 8,
               f"Event rate by status (accepted, dead_letter, late, duplicate_entity). {OPS}",
               [(f"sum by (status) (rate(dp_monitor_events_total{SEL}[{RATE}]))", "{{status}}")], "ops"),
    _operators(timeseries, "Dead letters by reason", 12, 8,
               f"Malformed events per second by reason. {OPS}",
               [(f"sum by (reason) (rate(dp_monitor_dead_letters_total{SEL}[{RATE}]))", "{{reason}}")], "ops"),
    _operators(timeseries, "Consumer lag", 12, 8,
               f"Messages behind the input topic's end, per partition. {OPS}",
               [(f"sum by (partition) (dp_monitor_consumer_lag_messages{SEL})", "partition {{partition}}")]),
    _operators(timeseries, "Release latency", 12, 8,
               "From a window's close time to the end of its release computation (quantiles over the interval); above "
               f"window.publish_delay_seconds an alert is published late. {OPS}",
               [(f"histogram_quantile(0.5, sum by (le) (rate(dp_monitor_release_latency_seconds_bucket{SEL}[{RATE}])))", "p50"),
                (f"histogram_quantile(0.95, sum by (le) (rate(dp_monitor_release_latency_seconds_bucket{SEL}[{RATE}])))", "p95")],
               "s"),
    _operators(timeseries, "Late publications", 12, 6,
               f"Alerts published after their scheduled time, per interval (a timing side channel: raise the publish delay). {OPS}",
               [(f"sum(increase(dp_monitor_late_publications_total{SEL}[{RATE}]))", "late")]),
    _operators(stat, "Events accepted (total)", 12, 6,
               f"Events accepted since the monitor started. {OPS}",
               [(f"sum(dp_monitor_events_total{{status=\"accepted\", instance=~\"$instance\"}})", "")]),
]


def _dashboard(uid: str, title: str, description: str, tags: list[str], datasource: model.DataSourceRef,
               variable_metric: str, panels: list[Builder[model.Panel]],
               annotations: list[Builder[model.AnnotationQuery]]) -> Builder[model.Dashboard]:
    instance = (dashboard_builders.QueryVariable("instance").label("monitor").datasource(datasource)
                .query({"query": f"label_values({variable_metric}, instance)", "refId": "instance"})
                .include_all(True).multi(True).all_value(".*").refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
                .current(model.VariableOption(selected=True, text="All", value="$__all")))
    dash = (dashboard_builders.Dashboard(title).uid(uid).tags(tags).description(description).version(1).editable()
            .refresh("10s").time("now-1h", "now").timezone("browser").with_variable(instance).annotations(annotations))
    # Our own row-major layout: the SDK's packs a panel into a row it overflows (a 12-wide one at x 18).
    x = y = row_h = 0
    for pid, panel in enumerate(panels, start=1):
        pos = panel.id(pid).build().grid_pos
        if x + pos.w > 24:  # Grafana's grid is 24 units wide
            x, y, row_h = 0, y + row_h, 0
        pos.x, pos.y = x, y
        dash.with_panel(panel)
        x, row_h = x + pos.w, max(row_h, pos.h)
    return dash


def _json(dash: Builder[model.Dashboard]) -> dict:
    """The dashboard as Grafana reads it, with the two fields the SDK's models lack."""
    out = json.loads(json.dumps(dash.build(), cls=JSONEncoder))
    for var in out["templating"]["list"]:
        # the text Grafana's variable list shows (and monitor.docs reads the metric from)
        var["definition"] = var["query"]["query"]
    for ann in out["annotations"]["list"]:
        # a Prometheus annotation's title template; without it every marker is untitled
        ann["titleFormat"] = "{{alertname}}"
    return out


def build() -> dict:
    """The analysts' dashboard: private values and public facts only."""
    # No ALERTS annotation: the analysts' Prometheus evaluates no rules (the operational
    # group's alerts would cross the boundary); the alarm state timeline shows the pages.
    return _json(_dashboard("dp-outlier-monitor", "DP outlier monitor",
                            "Differentially private streaming outlier monitor: the private surge alarm, detailed reports "
                            "and budget. Private values and public facts only (job dp-monitor).",
                            ["dp-monitor", "privacy"], DATASOURCE, "dp_monitor_info", PRIVATE_PANELS, []))


def build_operational() -> dict:
    """The operators' dashboard: operational metrics, NOT private."""
    alerts = (dashboard_builders.AnnotationQuery().name("Alerts").enable(True).icon_color("red")
              .datasource(OPERATIONAL_DATASOURCE).expr('ALERTS{alertname=~"DPMonitor.*", alertstate="firing"}'))
    return _json(_dashboard("dp-outlier-monitor-operational", "DP outlier monitor: operations",
                            "Operational metrics of the DP outlier monitor (job dp-monitor-operational): NOT private, "
                            "operators only.",
                            ["dp-monitor", "operational"], OPERATIONAL_DATASOURCE, "dp_monitor_events_total",
                            OPERATIONAL_PANELS, [alerts]))


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
