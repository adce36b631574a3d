"""The compose stack, the Dockerfile and the Grafana provisioning, checked as far as a
machine without a Docker engine allows: structure, cross-references, existing paths.
Building and running them is left to a machine with an engine (deploy/README.md)."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import yaml

from deploykit import OPERATIONAL_DASHBOARD, dashboard_queries
from monitor import docs
from monitor.cli import COMMANDS
from monitor.config import load_config

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text(encoding="utf-8"))
SERVICES = COMPOSE["services"]
DASH = json.loads(docs.DASHBOARD.read_text(encoding="utf-8"))
OPS_DASH = json.loads(OPERATIONAL_DASHBOARD.read_text(encoding="utf-8"))


def _mounts(service: dict) -> list[tuple[Path, str]]:
    """(host path resolved against deploy/, container path) of each bind mount."""
    out = []
    for vol in service.get("volumes", []):
        src, dst = vol.split(":")[:2]
        if src.startswith((".", "/")):
            out.append(((DEPLOY / src).resolve(), dst))
    return out


def _container_path(service: str, container_file: str) -> Path:
    """Map a path inside a container back to the repo file its bind mount provides."""
    for host, dst in _mounts(SERVICES[service]):
        if container_file == dst or container_file.startswith(dst.rstrip("/") + "/"):
            return host / Path(container_file).relative_to(dst) if container_file != dst else host
    raise AssertionError(f"{container_file} is not mounted into {service}")


def test_compose_has_the_whole_stack_wired_together():
    assert {"kafka", "monitor", "simulator", "prometheus", "alertmanager", "grafana"} <= set(SERVICES)
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")
    env = SERVICES["kafka"]["environment"]
    assert "controller" in env["KAFKA_PROCESS_ROLES"] and "zookeeper" not in json.dumps(env).lower()  # KRaft
    # containers use kafka:9092; producers on the host localhost:9094, published on the loopback only
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092,EXTERNAL://localhost:9094"
    assert "EXTERNAL:PLAINTEXT" in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"] and "EXTERNAL://:9094" in env["KAFKA_LISTENERS"]
    assert SERVICES["kafka"]["ports"] == ["127.0.0.1:9094:9094"]
    for name in ("monitor", "simulator", "model"):
        svc = SERVICES[name]
        # compose resolves the context against the compose file's folder, the dockerfile against the context
        assert (DEPLOY / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == REPO / "Dockerfile"
    assert SERVICES["monitor"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert SERVICES["monitor"]["depends_on"]["model"]["condition"] == "service_completed_successfully"
    # published ports stay on the host's loopback: /metrics is not private
    for svc in SERVICES.values():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), port
    assert set(COMPOSE["volumes"]) >= {v.split(":")[0] for s in SERVICES.values() for v in s.get("volumes", [])
                                       if not v.startswith((".", "/"))}


def test_compose_bind_mounts_point_at_existing_files():
    mounts = [m for svc in SERVICES.values() for m in _mounts(svc)]
    assert len(mounts) >= 5
    for host, _ in mounts:
        assert host.exists(), f"compose mounts {host}, which does not exist"


def test_compose_commands_are_real_monitor_commands_on_a_valid_config():
    cfg_path = _container_path("monitor", "/etc/monitor/config.yaml")
    cfg = load_config(cfg_path)  # raises on any invalid key
    assert cfg.metrics.host == "0.0.0.0" and cfg.stream.bootstrap_servers == "kafka:9092"
    commands = {name for name, *_ in COMMANDS}
    assert SERVICES["monitor"]["command"][0] in commands and SERVICES["simulator"]["command"][0] in commands
    sim = SERVICES["simulator"]["command"]
    assert sim[sim.index("--bootstrap-servers") + 1] == cfg.stream.bootstrap_servers
    # the model service fits from MONITOR_REFERENCE, by default the bundled CSV at the path the image installs it to
    fit = SERVICES["model"]["command"][0]
    assert f"test -f {cfg.model.path}" in fit
    ref = re.search(r"--reference \$\{MONITOR_REFERENCE:-(\S+)\}", fit).group(1)
    assert (REPO / Path(ref).relative_to("/app")).is_file()
    # The operators' Prometheus scrapes both endpoints at the ports the config serves on,
    # the analysts' one only the private endpoint (the trust boundary).
    prom_cfg = yaml.safe_load(_container_path("prometheus", "/etc/prometheus/prometheus.yml").read_text())
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in prom_cfg["scrape_configs"]}
    assert jobs == {"dp-monitor": [f"monitor:{cfg.metrics.port}"], "dp-monitor-operational": [f"monitor:{cfg.metrics.operational_port}"]}
    assert prom_cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    analysts = SERVICES["prometheus-analysts"]
    config_file = next(a.split("=", 1)[1] for a in analysts["command"] if a.startswith("--config.file="))
    analysts_cfg = yaml.safe_load(_container_path("prometheus-analysts", config_file).read_text())
    assert [(j["job_name"], j["static_configs"][0]["targets"]) for j in analysts_cfg["scrape_configs"]] == \
        [("dp-monitor", [f"monitor:{cfg.metrics.port}"])]
    published = {p.rsplit(":", 1)[1] for p in SERVICES["monitor"]["ports"]}
    assert published == {str(cfg.metrics.port), str(cfg.metrics.operational_port)}


def _uids(dash: dict) -> set[str]:
    return ({p["datasource"]["uid"] for p in dash["panels"]} | {t["datasource"]["uid"] for p in dash["panels"] for t in p["targets"]}
            | {v["datasource"]["uid"] for v in dash["templating"]["list"]} | {a["datasource"]["uid"] for a in dash["annotations"]["list"]})


def test_grafana_provisioning_finds_both_dashboards_each_on_its_own_side_of_the_boundary():
    prov = _container_path("grafana", "/etc/grafana/provisioning")
    sources = {d["uid"]: d for d in yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"]}
    assert {d["type"] for d in sources.values()} == {"prometheus"}
    # the analysts' dashboard reads only the analysts' Prometheus (the private job alone) ...
    (analysts_uid,) = _uids(DASH)
    assert sources[analysts_uid]["url"] == "http://prometheus-analysts:9090"
    # ... the operators' dashboard the operators' Prometheus
    (ops_uid,) = _uids(OPS_DASH)
    assert sources[ops_uid]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((prov / "dashboards" / "dashboards.yml").read_text())["providers"][0]
    folder = _container_path("grafana", provider["options"]["path"])
    for path in (docs.DASHBOARD, OPERATIONAL_DASHBOARD):
        assert (folder / path.name).resolve() == path
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _container_path("grafana", home) == docs.DASHBOARD


ANALYST_NEEDS = ("alarm_state", "alarm_pages_total", "alarm_threshold_events", "baseline_flagged_rate",
                 "report_flagged_count{instance=~\"$instance\"} / clamp_min(dp_monitor_report_event_count",
                 "report_outlier_count", "report_where_excess_count", "report_subspace_count", "budget_epsilon_spent", "budget_epsilon_remaining",
                 "windows_released_total")
OPERATOR_NEEDS = ("events_total", "dead_letters_total", "consumer_lag_messages", "release_latency_seconds_bucket",
                  "late_publications_total")


def test_dashboards_have_the_panels_their_readers_need_and_a_sane_layout():
    for dash, needs in ((DASH, ANALYST_NEEDS), (OPS_DASH, OPERATOR_NEEDS)):
        _check_dashboard(dash, needs)
    kinds = {p["title"]: p["type"] for p in DASH["panels"]}
    assert kinds["Surge alarm state"] == "state-timeline"


def test_dashboard_builder_is_the_sdk_build_for_the_grafana_the_stack_runs():
    # grafana-foundation-sdk ships one build per Grafana version (its panel options and
    # schema follow that version), ordered by an epoch: only an exact pin selects ours
    pin = re.search(r'"grafana-foundation-sdk==(\d+![\d.]+)"', (REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert pin, "pin grafana-foundation-sdk to one build in pyproject.toml"
    grafana = pin.group(1).split("!")[1]
    assert SERVICES["grafana"]["image"] == f"grafana/grafana-oss:{grafana}"
    assert importlib.metadata.version("grafana-foundation-sdk") == pin.group(1)
    # the SDK's model defaults hide a state timeline's legend; ours names the states' colours
    timeline = next(p for p in DASH["panels"] if p["title"] == "Surge alarm state")
    assert timeline["options"]["legend"]["showLegend"] is True


def test_the_analysts_dashboard_reads_no_operational_metric():
    operational = {name for name, kind, *_ in docs.registry_families() if "NOT private" in docs.PRIVACY[name]}
    assert len(operational) >= 5
    read = {docs.family_name(n) for _, e in dashboard_queries(docs.DASHBOARD) for n in docs.metric_names(e)}
    assert read and not read & operational
    read_ops = {docs.family_name(n) for _, e in dashboard_queries(OPERATIONAL_DASHBOARD) for n in docs.metric_names(e)}
    assert read_ops and read_ops <= operational


def _check_dashboard(dash: dict, needs: tuple[str, ...]) -> None:
    titles = [p["title"] for p in dash["panels"]]
    assert len(set(titles)) == len(titles)
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for needed in needs:
        assert f"dp_monitor_{needed}" in exprs, needed
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {p['title']} overlaps another"
                cells.add((x, y))
        # readers must see on the panel itself whether its numbers are private
        assert any(tag in p["description"] for tag in ("Differentially private release", "NOT covered", "data-independent")), p["title"]


def test_dockerfile_builds_the_package_and_runs_monitor():
    lines = [l.strip() for l in (REPO / "Dockerfile").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    copies = [l.split()[1:-1] for l in lines if l.startswith("COPY")]
    assert copies, "no COPY line"
    for sources in copies:
        for src in sources:
            assert (REPO / src).exists(), f"COPY {src}: no such path"
    copied = {s for c in copies for s in c}
    # pip install . needs the build config, the readme it names, and the package
    assert {"pyproject.toml", "README.md", "monitor"} <= copied
    assert any(l.startswith("RUN pip install .") for l in lines)
    assert json.loads(next(l for l in lines if l.startswith("ENTRYPOINT")).removeprefix("ENTRYPOINT")) == ["monitor"]
    assert "monitor = \"monitor.cli:main\"" in (REPO / "pyproject.toml").read_text()
    assert any(l.startswith("USER ") and l != "USER root" for l in lines)


def test_dockerignore_keeps_the_context_small_but_not_the_sources():
    ignored = {l.strip() for l in (REPO / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")}
    assert {".git", "tests", "*.sqlite"} <= ignored
    assert not ignored & {"monitor", "pyproject.toml", "README.md"}


def test_alertmanager_routes_to_a_receiver_and_inhibits_real_alerts():
    am = yaml.safe_load(_container_path("alertmanager", "/etc/alertmanager/alertmanager.yml").read_text())
    assert am["route"]["receiver"] in {r["name"] for r in am["receivers"]}
    alerts = {name for name, _ in docs.rule_expressions()}
    named = set()
    for rule in am["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            # `alertname = X` or `alertname =~ "X|Y"`: every name must be one of our rules,
            # or a renamed alert would silently stop being inhibited
            key, _, value = re.split(r"\s*(=~|=)\s*", matcher, maxsplit=1)
            if key == "alertname":
                named.update(value.strip('"').split("|"))
    assert named and named <= alerts, named - alerts


def test_compose_budget_pays_for_pages_and_leaves_the_low_alert_quiet_without_them():
    from monitor.budget.plan import plan_from_config

    cfg = load_config(_container_path("monitor", "/etc/monitor/config.yaml"))
    plan = plan_from_config(cfg)
    assert plan.pages_per_period >= 3, plan.summary()
    assert cfg.budget.epsilon - plan.quiet_epsilon > 0.1 * cfg.budget.epsilon  # DPMonitorBudgetLow fires below 10% left


def test_own_reference_data_is_documented_and_reachable_in_the_containers():
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    assert "## Your own data" in readme and "MONITOR_REFERENCE=/etc/monitor/reference.csv" in readme
    # deploy/monitor/ is mounted whole, so a CSV put there is where MONITOR_REFERENCE points
    assert _container_path("model", "/etc/monitor/reference.csv") == DEPLOY / "monitor" / "reference.csv"
    assert "localhost:9094" in readme
