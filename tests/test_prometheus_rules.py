"""The alert rules and the Prometheus config, checked with Debian's promtool, and every
metric name in the rules and the dashboard checked against the service's registry."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitor import docs

REPO = Path(__file__).resolve().parent.parent
PROM = REPO / "deploy" / "prometheus"
RULE_TESTS = PROM / "tests" / "dp-monitor.test.yml"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian package `prometheus`; .ci/run installs it)"
)

# What the issue asks operators to get on day one; each must exist and be unit-tested.
REQUIRED_ALERTS = {
    "DPMonitorOutlierSurge", "DPMonitorBudgetLow", "DPMonitorBudgetExhausted", "DPMonitorNoRelease",
    "DPMonitorDown", "DPMonitorConsumerLagHigh", "DPMonitorDeadLetterRateHigh",
}


def _promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_check_config_and_rules():
    res = _promtool("check", "config", "prometheus.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 rule files found" in res.stdout  # the glob in rule_files really matches our file
    res = _promtool("check", "rules", str(docs.RULES))
    assert res.returncode == 0, res.stdout + res.stderr


@needs_promtool
def test_promtool_rule_unit_tests_pass():
    res = _promtool("test", "rules", str(RULE_TESTS))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@needs_promtool
def test_rule_unit_tests_catch_a_broken_rule(tmp_path):
    """The unit tests are not vacuous: a surge rule that pages on one window above the level must fail them."""
    rules = docs.RULES.read_text(encoding="utf-8").replace(
        'dp_monitor_consecutive_windows_above_alert_level{job="dp-monitor"} >= 3',
        'dp_monitor_consecutive_windows_above_alert_level{job="dp-monitor"} >= 1')
    assert rules != docs.RULES.read_text(encoding="utf-8")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "dp-monitor.yml").write_text(rules, encoding="utf-8")
    (tmp_path / "tests").mkdir()
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    res = _promtool("test", "rules", f"tests/{RULE_TESTS.name}", cwd=tmp_path)
    assert res.returncode != 0 and "DPMonitorOutlierSurge" in res.stdout + res.stderr


def test_every_required_alert_exists_with_a_runbook_and_a_firing_unit_test():
    groups = yaml.safe_load(docs.RULES.read_text(encoding="utf-8"))["groups"]
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    assert REQUIRED_ALERTS <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert len(rule["annotations"].get("runbook", "")) > 40, f"{name} has no runbook line"
        assert 'job="dp-monitor"' in rule["expr"], f"{name} must select the dp-monitor job"
    fired = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
        for case in test.get("alert_rule_test", []) if case.get("exp_alerts")
    }
    assert fired == set(rules), f"rules without a firing unit test: {set(rules) - fired}"


def test_rules_job_name_matches_the_scrape_config():
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text(encoding="utf-8"))
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["dp-monitor"]


def _registry_exposition_names() -> set[str]:
    from prometheus_client import generate_latest

    from monitor.stream.metrics import MonitorMetrics

    return docs.exported_names(generate_latest(MonitorMetrics().registry).decode())


def test_every_metric_in_dashboard_and_rules_is_exported_by_the_service():
    """A renamed metric in monitor/stream/metrics.py breaks this test, not production."""
    exported = _registry_exposition_names()
    used = {(where, name) for where, expr in [*docs.dashboard_queries(), *docs.rule_expressions()]
            for name in docs.metric_names(expr)}
    assert len({n for _, n in used}) >= 15  # the extraction found the queries at all
    missing = sorted((w, n) for w, n in used if n not in exported)
    assert not missing, f"metrics used in deploy/ but not exported: {missing}"


def test_metric_name_extraction_sees_histogram_series():
    expr = "histogram_quantile(0.9, rate(dp_monitor_release_latency_seconds_bucket[5m])) / dp_monitor_info"
    assert docs.metric_names(expr) == {"dp_monitor_release_latency_seconds_bucket", "dp_monitor_info"}
    assert "dp_monitor_release_latency_seconds_bucket" in _registry_exposition_names()
    assert "dp_monitor_release_latency_bucket" not in _registry_exposition_names()
