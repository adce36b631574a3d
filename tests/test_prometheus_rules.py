"""The alert rules and the Prometheus configs, checked with Debian's promtool, and every
metric name in the rules and the dashboards checked against the side of the trust
boundary it belongs to (private registry on metrics.port, operational on
metrics.operational_port)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploykit import GROUP_JOB, OPERATIONAL_DASHBOARD, OPERATIONAL_JOB, PRIVATE_JOB, dashboard_queries, exported, rules_by_group
from monitor import docs
from monitor.config import MetricsSettings

REPO = Path(__file__).resolve().parent.parent
PROM = REPO / "deploy" / "prometheus"
RULE_TESTS = PROM / "tests" / "dp-monitor.test.yml"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian package `prometheus`; .ci/run installs it)"
)

# What operators need on day one; each must exist and be unit-tested both ways.
REQUIRED_ALERTS = {
    "DPMonitorSurge", "DPMonitorNoRelease", "DPMonitorBudgetLow", "DPMonitorBudgetExhausted",
    "DPMonitorReferenceBudgetExhausted", "DPMonitorAlarmSuppressed", "DPMonitorDown",
    "DPMonitorOperationalDown", "DPMonitorConsumerLagHigh", "DPMonitorDeadLetterRateHigh",
    "DPMonitorNoIntake", "DPMonitorIntakeCollapsed",
}


def _promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def _rules() -> dict[str, dict]:
    return {r["alert"]: r for rules in rules_by_group().values() for r in rules}


@needs_promtool
def test_promtool_check_config_and_rules():
    res = _promtool("check", "config", "prometheus.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 rule files found" in res.stdout  # the glob in rule_files really matches our file
    res = _promtool("check", "config", "prometheus-analysts.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    res = _promtool("check", "rules", str(docs.RULES))
    assert res.returncode == 0, res.stdout + res.stderr


@needs_promtool
def test_promtool_rule_unit_tests_pass():
    res = _promtool("test", "rules", str(RULE_TESTS))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@needs_promtool
@pytest.mark.parametrize("alert, good, broken", [
    # a surge rule that pages whatever the alarm says
    ("DPMonitorSurge", 'dp_monitor_alarm{job="dp-monitor"} == 1', 'dp_monitor_alarm{job="dp-monitor"} >= 0'),
    # a surge rule without its freshness term (a stale 1 would page forever)
    ("DPMonitorSurge", "<= on(instance, job) 2 * dp_monitor_window_size_seconds", "<= on(instance, job) 200 * dp_monitor_window_size_seconds"),
    # a dead-letter rule on the private job
    ("DPMonitorConsumerLagHigh", 'dp_monitor_consumer_lag_messages{job="dp-monitor-operational"}', 'dp_monitor_consumer_lag_messages'),
    # an intake rule that waits 3 windows (the goal: within 2), or that ignores whether the process is scraped
    ("DPMonitorNoIntake", '> on(instance, job) dp_monitor_intake_window_seconds', '> on(instance, job) 3 * dp_monitor_intake_window_seconds'),
    ("DPMonitorNoIntake", 'up{job="dp-monitor-operational"} == 1', 'up{job="dp-monitor-operational"} >= 0'),
    # a collapse rule that calls every window a collapse, or one that needs the intake to halve 10 times
    ("DPMonitorIntakeCollapsed", "< on(instance, job) 0.2 *", "< on(instance, job) 2 *"),
    ("DPMonitorIntakeCollapsed", "< on(instance, job) 0.2 *", "< on(instance, job) 0.001 *"),
])
def test_rule_unit_tests_catch_a_broken_rule(tmp_path, alert, good, broken):
    """The unit tests are not vacuous: each mutation must make promtool fail on that alert."""
    text = docs.RULES.read_text(encoding="utf-8")
    assert good in text
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "dp-monitor.yml").write_text(text.replace(good, broken, 1), encoding="utf-8")
    (tmp_path / "tests").mkdir()
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    res = _promtool("test", "rules", f"tests/{RULE_TESTS.name}", cwd=tmp_path)
    assert res.returncode != 0 and f"alertname: {alert}" in res.stdout + res.stderr


def test_every_alert_has_a_runbook_and_a_firing_and_a_quiet_unit_test():
    rules = _rules()
    assert REQUIRED_ALERTS <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert len(rule["annotations"].get("runbook", "")) > 40, f"{name} has no runbook line"
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
             for case in test.get("alert_rule_test", [])]
    fired = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert fired == set(rules), f"rules without a firing unit test: {set(rules) - fired}"
    assert quiet == set(rules), f"rules without a quiet unit test: {set(rules) - quiet}"


def test_the_page_is_the_private_alarm():
    surge = _rules()["DPMonitorSurge"]
    assert surge["labels"]["severity"] == "critical"
    assert 'dp_monitor_alarm{job="dp-monitor"} == 1' in surge["expr"]
    runbook = surge["annotations"]["runbook"] + surge["annotations"]["description"]
    for needed in ("private", "where", "counts", "headline"):
        assert needed in runbook, needed
    assert _rules()["DPMonitorAlarmSuppressed"]["expr"].startswith('dp_monitor_alarm_state{job="dp-monitor", state="suppressed"} == 1')


def test_rules_stay_on_their_side_of_the_trust_boundary():
    private, operational = exported("private"), exported("operational")
    groups = rules_by_group()
    assert set(groups) == set(GROUP_JOB)
    for group, rules in groups.items():
        job = GROUP_JOB[group]
        allowed = private if job == PRIVATE_JOB else operational
        for rule in rules:
            expr, name = rule["expr"], rule["alert"]
            assert f'job="{job}"' in expr, f"{name} must select the {job} job"
            other = OPERATIONAL_JOB if job == PRIVATE_JOB else PRIVATE_JOB
            assert f'job="{other}"' not in expr, f"{name} joins both jobs"
            used = docs.metric_names(expr)
            assert used <= allowed, f"{name} ({group}) reads {sorted(used - allowed)} from the other side"
            assert rule["labels"]["boundary"] == ("private" if job == PRIVATE_JOB else "operational"), name


def test_no_rule_text_says_the_reference_budget_refills():
    for name, rule in _rules().items():
        text = " ".join(rule["annotations"].values()).lower()
        assert "rolls over" not in text and "until the period" not in text, name
        if "reference" in text:
            assert "never refills" in text, f"{name} mentions the reference ledger without saying it never refills"


def test_scrape_jobs_split_the_trust_boundary():
    ops = yaml.safe_load((PROM / "prometheus.yml").read_text(encoding="utf-8"))
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in ops["scrape_configs"]}
    defaults = MetricsSettings()
    assert jobs == {PRIVATE_JOB: [f"monitor:{defaults.port}"], OPERATIONAL_JOB: [f"monitor:{defaults.operational_port}"]}
    analysts = yaml.safe_load((PROM / "prometheus-analysts.yml").read_text(encoding="utf-8"))
    assert [(j["job_name"], j["static_configs"][0]["targets"]) for j in analysts["scrape_configs"]] == \
        [(PRIVATE_JOB, [f"monitor:{defaults.port}"])]
    assert "rule_files" not in analysts  # the operational group would cross the boundary


def test_every_metric_in_dashboards_and_rules_is_exported_on_its_side():
    """A renamed metric in monitor/pipeline/metrics.py breaks this test, not production; an
    operational metric on the analysts' dashboard (or the reverse) breaks it too."""
    for path, side in ((docs.DASHBOARD, "private"), (OPERATIONAL_DASHBOARD, "operational")):
        names = exported(side)
        used = {(where, n) for where, expr in dashboard_queries(path) for n in docs.metric_names(expr)}
        assert len({n for _, n in used}) >= (15 if side == "private" else 5)  # the extraction found the queries
        missing = sorted((w, n) for w, n in used if n not in names)
        assert not missing, f"{path.name} reads metrics its endpoint does not serve: {missing}"


def test_the_two_registries_share_no_metric_name():
    assert not exported("private") & exported("operational")


def test_metric_name_extraction_sees_histogram_series():
    expr = "histogram_quantile(0.9, rate(dp_monitor_release_latency_seconds_bucket[5m])) / dp_monitor_info"
    assert docs.metric_names(expr) == {"dp_monitor_release_latency_seconds_bucket", "dp_monitor_info"}
    assert "dp_monitor_release_latency_seconds_bucket" in exported("operational")
    assert "dp_monitor_release_latency_bucket" not in exported("operational")
