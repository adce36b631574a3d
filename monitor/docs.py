"""Generate the configuration and metrics references (docs/configuration.md, docs/metrics.md) from the code.

    python -m monitor.docs            # rewrite the generated blocks
    python -m monitor.docs --check    # exit 1 if they are stale (the tests call this)

The configuration reference comes from the pydantic model (monitor/config.py), the
metrics reference from the service's registry (monitor/pipeline/metrics.py) plus where
each metric is used in deploy/ (dashboard and alert rules), so neither can drift from
the code. This module also offers the helpers the deploy tests share: every PromQL
expression of the dashboard and the rules, and the metric names inside them.

It reads deploy/ from a source checkout; it is a developer tool, not part of `monitor`'s
runtime, and imports nothing from the source tree outside the package (bench/ included).
"""

from __future__ import annotations

import json
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Iterator, Literal

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from monitor.config import ADVANCED_ALARM_KEYS, MonitorConfig

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "dp-monitor.json"
RULES = REPO / "deploy" / "prometheus" / "rules" / "dp-monitor.yml"

# What each metric's value reveals, in the terms of docs/privacy.md. Kept beside the generator
# (not in metrics.py) because it is documentation; test_deploy_docs checks that it
# names exactly the registry's metrics, so a new metric must be classified here.
PRIVACY = {
    "dp_monitor_alarm": "DP release",
    "dp_monitor_alarm_state": "DP release",
    "dp_monitor_alarm_pages_total": "DP release (post-processing)",
    "dp_monitor_alarm_threshold_events": "DP release (post-processing: config and released baseline)",
    "dp_monitor_baseline_flagged_rate": "DP release",
    "dp_monitor_baseline_events_per_window": "DP release",
    "dp_monitor_report_event_count": "DP release",
    "dp_monitor_report_flagged_count": "DP release",
    "dp_monitor_report_outlier_count": "DP release",
    "dp_monitor_report_count_accuracy": "config (published with a report: post-processing of the alarm's answers)",
    "dp_monitor_report_subspace_count": "DP release",
    "dp_monitor_report_where_excess_count": "DP release (post-processing: the parts that stand out and their Laplace counts, less a public share of the noisy event count)",
    "dp_monitor_report_window_end_timestamp_seconds": "DP release (post-processing: when the alarm paged)",
    "dp_monitor_reports_total": "DP release (post-processing: the alarm's answers and the schedule)",
    "dp_monitor_reports_suppressed_total": "DP release (post-processing: the alarm's answers, the schedule and the budget)",
    "dp_monitor_released_window_end_timestamp_seconds": "public schedule",
    "dp_monitor_last_release_timestamp_seconds": "public schedule",
    "dp_monitor_windows_released_total": "public schedule",
    "dp_monitor_windows_suppressed_total": "public schedule",
    # What is spent depends on the alarm's (DP) answers: a page pays its own share and buys a report.
    "dp_monitor_budget_epsilon_spent": "DP release (post-processing: the alarm's answers and the schedule)",
    "dp_monitor_budget_epsilon_remaining": "DP release (post-processing: the alarm's answers and the schedule)",
    "dp_monitor_budget_epsilon_limit": "config",
    "dp_monitor_alarm_run_epsilon": "config",
    "dp_monitor_report_cost_epsilon": "config",
    "dp_monitor_alarm_false_pages_per_30_days": "config",
    "dp_monitor_window_size_seconds": "config",
    "dp_monitor_window_allowed_lateness_seconds": "config",
    "dp_monitor_window_publish_delay_seconds": "config",
    "dp_monitor_info": "config",
    "dp_monitor_events_total": "**NOT private** (operational)",
    "dp_monitor_dead_letters_total": "**NOT private** (operational)",
    "dp_monitor_values_out_of_bounds_total": "**NOT private** (operational)",
    "dp_monitor_consumer_lag_messages": "**NOT private** (operational)",
    "dp_monitor_release_latency_seconds": "**NOT private** (operational)",
    "dp_monitor_late_publications_total": "**NOT private** (operational)",
    "dp_monitor_intake_window_seconds": "config",
    "dp_monitor_last_accepted_timestamp_seconds": "**NOT private** (operational)",
    "dp_monitor_intake_last_window_events": "**NOT private** (operational)",
    "dp_monitor_intake_usual_window_events": "**NOT private** (operational)",
}

_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


# ---------------------------------------------------------------- deploy expressions

def grafana_to_promql(expr: str, rate_interval: str) -> str:
    """Replace the Grafana variables our dashboard uses by concrete values."""
    return expr.replace("$__rate_interval", rate_interval).replace('"$instance"', '".*"')


def dashboard_queries(rate_interval: str = "1m") -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every query of the dashboard, variables substituted."""
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for var in dash.get("templating", {}).get("list", []):
        yield f"variable {var['name']}", var["definition"].removeprefix("label_values(").rsplit(",", 1)[0]
    for ann in dash.get("annotations", {}).get("list", []):
        if "expr" in ann:
            yield f"annotation {ann['name']}", ann["expr"]
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], grafana_to_promql(target["expr"], rate_interval)


def rule_expressions() -> Iterator[tuple[str, str]]:
    """(alert name, PromQL) for every rule of deploy/prometheus/rules."""
    for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"].strip()


_NAME = re.compile(r"\b(dp_monitor_[a-z0-9_]+)")


def metric_names(expr: str) -> set[str]:
    """The dp_monitor_* series names an expression reads (histogram series as exported).

    >>> sorted(metric_names('rate(dp_monitor_events_total[5m]) > on(instance) dp_monitor_info'))
    ['dp_monitor_events_total', 'dp_monitor_info']
    """
    return set(_NAME.findall(expr))


def family_name(series: str) -> str:
    """dp_monitor_release_latency_seconds_bucket -> dp_monitor_release_latency_seconds."""
    for suffix in _HISTOGRAM_SUFFIXES:
        if series.endswith(suffix) and series.removesuffix(suffix) in PRIVACY:
            return series.removesuffix(suffix)
    return series


def exported_names(exposition: str) -> set[str]:
    """Every series name a /metrics text can carry, including labelled metrics that have
    no child yet (only their # TYPE line is present) and histogram sub-series."""
    from prometheus_client.parser import text_string_to_metric_families

    names: set[str] = set()
    for fam in text_string_to_metric_families(exposition):
        names.update(s.name for s in fam.samples)
        if fam.type == "counter":
            names.add(fam.name + "_total")
        elif fam.type == "histogram":
            names.update(fam.name + s for s in _HISTOGRAM_SUFFIXES)
        else:
            names.add(fam.name)
    return names


def registry_families() -> list[tuple[str, str, str, list[str]]]:
    """(exported name, type, help, label names) of every metric the service registers,
    in the order metrics.py declares them (releases, schedule, budget, operations)."""
    from prometheus_client.metrics import MetricWrapperBase

    from monitor.pipeline.metrics import MonitorMetrics

    out = []
    for metric in vars(MonitorMetrics()).values():
        if isinstance(metric, MetricWrapperBase):
            for fam in metric.describe():
                name = fam.name + "_total" if fam.type == "counter" else fam.name
                out.append((name, fam.type, fam.documentation, list(metric._labelnames)))  # noqa: SLF001 - no public accessor
    return out


# ---------------------------------------------------------------- generated blocks

def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    return {"str": "string", "Path": "path", "float": "number", "int": "integer", "bool": "boolean"}.get(
        getattr(tp, "__name__", str(tp)), getattr(tp, "__name__", str(tp)))


_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "length >="}


def _constraints(field) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sym in _BOUNDS.items():
            if getattr(meta, attr, None) is not None:
                parts.append(f"{sym} {getattr(meta, attr):g}")
    return ", ".join(parts)


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "**required**"
    else:
        value = field.default
    text = yaml.safe_dump(str(value) if isinstance(value, Path) else value, default_flow_style=True).strip()
    return f"`{text.removesuffix('...').strip()}`"


# Keys listed apart, after what a user decides: the alarm's constants of the prediction (monitor/config.py).
ADVANCED = frozenset(f"alarm.{key}" for key in ADVANCED_ALARM_KEYS)


def _rows(model: type[BaseModel], prefix: str, advanced: bool = False) -> Iterator[str]:
    """One table row per key; ``advanced``: only the ADVANCED keys, else all the others."""
    for name, field in model.model_fields.items():
        ann = field.annotation
        args = typing.get_args(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _rows(ann, f"{prefix}{name}.", advanced)
            continue
        if (f"{prefix}{name}" in ADVANCED) != advanced:
            continue
        if typing.get_origin(ann) is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            yield f"| `{prefix}{name}` | list | {_default(field)} | {field.description} ({_constraints(field)}) |"
            yield from _rows(args[0], f"{prefix}{name}[].")
            continue
        kind = _type_name(ann)
        if limits := _constraints(field):
            kind += f" ({limits})"
        yield f"| `{prefix}{name}` | {kind} | {_default(field)} | {field.description or ''} |"


def config_reference() -> str:
    head = [
        "# Configuration reference",
        "",
        "Generated from `monitor/config.py` by `python -m monitor.docs`. Every key except",
        "`features` is optional; unknown keys are rejected, and relative paths are resolved",
        "against the configuration file's folder. An example: `config.yaml`. Every command",
        "reads `config.yaml` in the current folder unless given `--config/-c FILE`.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    advanced = [
        "",
        "## Advanced: constants of the prediction",
        "",
        "The alarm's other settings: constants of its prediction and schedule, each chosen by a",
        "measurement (docs/benchmarks/alarm-rhythm.md, \"Trial history\"), and the old absolute",
        "threshold. They are read like any other key, but the false-page promise and the figures",
        "of docs/alarm.md hold at these values; changing one needs the alarm benchmarks rerun.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    return "\n".join(head + list(_rows(MonitorConfig, "")) + advanced + list(_rows(MonitorConfig, "", advanced=True)))


def _usage() -> dict[str, list[str]]:
    used: dict[str, list[str]] = {}
    sources = [(f"panel *{t}*", e) for t, e in dashboard_queries() if not t.startswith(("variable", "annotation"))]
    sources += [(f"alert `{a}`", e) for a, e in rule_expressions()]
    for where, expr in sources:
        for name in metric_names(expr):
            places = used.setdefault(family_name(name), [])
            if where not in places:
                places.append(where)
    return used


def metrics_reference() -> str:
    used = _usage()
    lines = [
        "# Metrics reference",
        "",
        "Served on `http://<metrics.host>:<metrics.port>/metrics` (default 127.0.0.1:9108).",
        "Generated from `monitor/pipeline/metrics.py` and `deploy/` by `python -m monitor.docs`.",
        "Only **DP release** values are covered by the privacy guarantee; *public schedule*,",
        "*data-independent* and *config* values reveal nothing about the events; the",
        "**NOT private** ones are operational counters for the people who run the monitor.",
        "",
        "| metric | type | labels | meaning | privacy | used by |",
        "|---|---|---|---|---|---|",
    ]
    for name, kind, doc, labels in registry_families():
        where = "; ".join(used.get(name, [])) or "-"
        lines.append(f"| `{name}` | {kind} | {', '.join(f'`{l}`' for l in labels) or '-'} | {doc} | "
                     f"{PRIVACY.get(name, '?')} | {where} |")
    return "\n".join(lines)


# Generated block -> (page it lives in, generator).
BLOCKS = {
    "config-reference": (DOCS / "configuration.md", config_reference),
    "metrics-reference": (DOCS / "metrics.md", metrics_reference),
}


def current_block(name: str, path: Path) -> str | None:
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"<!-- begin:{name} -->\n(.*?)\n?<!-- end:{name} -->", text, re.S)
    return match.group(1).strip() if match else None


def write_block(name: str, markdown: str, path: Path) -> None:
    """Replace the ``<!-- begin:NAME -->`` ... ``<!-- end:NAME -->`` block of ``path`` (appended
    when absent), atomically. Here rather than imported from bench/: the installed package
    must not reach into the source tree.
    """
    begin, end = f"<!-- begin:{name} -->", f"<!-- end:{name} -->"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    block = f"{begin}\n{markdown.strip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    stale = [name for name, (path, make) in BLOCKS.items() if current_block(name, path) != make().strip()]
    if "--check" in argv:
        for name in stale:
            print(f"{BLOCKS[name][0].relative_to(REPO)}: block {name!r} is stale: run python -m monitor.docs", file=sys.stderr)
        return 1 if stale else 0
    for name in stale:
        path, make = BLOCKS[name]
        write_block(name, make(), path)
        print(f"updated {path.relative_to(REPO)} block {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
