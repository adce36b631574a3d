"""Shared by the deploy tests: the queries of both dashboards, the rules by group, and the
metric names each side of the trust boundary exports."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import yaml

from monitor import docs

REPO = Path(__file__).resolve().parent.parent
OPERATIONAL_DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "dp-monitor-operational.json"
PRIVATE_JOB, OPERATIONAL_JOB = "dp-monitor", "dp-monitor-operational"
# Rule group -> the scrape job (and so the endpoint) its rules may read.
GROUP_JOB = {"dp-monitor": PRIVATE_JOB, "dp-monitor-operational": OPERATIONAL_JOB}


def dashboard_queries(path: Path, rate_interval: str = "1m") -> list[tuple[str, str]]:
    """(panel title, PromQL) of any of our dashboards, through monitor.docs's own reader
    (which reads docs.DASHBOARD, the analysts' one)."""
    with mock.patch.object(docs, "DASHBOARD", path):
        return list(docs.dashboard_queries(rate_interval))


def all_dashboard_queries(rate_interval: str = "1m") -> list[tuple[str, str]]:
    return dashboard_queries(docs.DASHBOARD, rate_interval) + dashboard_queries(OPERATIONAL_DASHBOARD, rate_interval)


def rules_by_group() -> dict[str, list[dict]]:
    return {g["name"]: g["rules"] for g in yaml.safe_load(docs.RULES.read_text(encoding="utf-8"))["groups"]}


def exported(which: str) -> set[str]:
    """Series names the service's `registry` ("private") or `operational` registry serves."""
    from prometheus_client import generate_latest

    from monitor.pipeline.metrics import MonitorMetrics

    m = MonitorMetrics()
    return docs.exported_names(generate_latest(m.registry if which == "private" else m.operational).decode())
