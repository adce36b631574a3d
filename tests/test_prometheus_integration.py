"""End to end: `monitor run` on a real broker, scraped by a real Prometheus (Debian's
package, a plain process on 127.0.0.1) loaded with deploy/'s two scrape jobs (private and
operational endpoints) and its alert rules.

One-second windows; the alarm's baseline warms up over the first few, then a CLUSTERED
surge (a quarter of the devices send readings close to one desaturated, tachycardic
point: each other's neighbours, so the seed's distance-based count misses them, the
model's flags do not) must page through the private alarm, and only then. The budget
pays for the baseline, one run's threshold, three pages and one detailed report: then
the alarm is suppressed, which the budget rules must see. Every PromQL expression of both
dashboards and of the rules is evaluated through Prometheus's HTTP API, and the two
endpoints must not share a metric.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from deploykit import OPERATIONAL_DASHBOARD, OPERATIONAL_JOB, PRIVATE_JOB, all_dashboard_queries, dashboard_queries, exported
from monitor import docs

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.prometheus, pytest.mark.broker, pytest.mark.slow]

# MONITOR_UPDATE_FIGURES=1 rewrites docs/figures/dashboard.png from this run.
FIGURE = bool(os.environ.get("MONITOR_UPDATE_FIGURES"))
WINDOW_S = 1.0
WARMUP_WINDOWS = 5
SURGE = (20.0, 8.0)        # clustered surge (start, duration) in seconds after the producer starts
RATE, DEVICES = 150.0, 400  # each device sends about every 2.7 s: at most one event per window
SURGE_FRACTION = 0.25      # about 37 anomalous events per window against about 3 flagged normally
RATE_INTERVAL = "5s"       # Grafana's $__rate_interval for a 1 s scrape interval
# The alarm's parameters: large epsilons and a margin of 12 + 2 sd make its answer
# certain on these counts (normal excess about 0 +- 2, surge excess about 34), so the
# test is about the plumbing, not the noise draws.
ALARM = {"contamination": 0.01, "threshold": 12.0, "z": 2.0, "rate_margin": 0.0, "epsilon_threshold": 4.0, "epsilon_page": 4.0,
         "hold_windows": 1, "baseline_warmup_seconds": WARMUP_WINDOWS * WINDOW_S, "baseline_refresh_seconds": 3600.0,
         "baseline_flag_cap": 1, "epsilon_baseline_flagged": 2.0, "epsilon_baseline_events": 1.0}


def _unavailable() -> str | None:
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        return "prometheus/promtool not installed (Debian package `prometheus`; .ci/run installs it)"
    try:
        importlib.import_module("monitor.pipeline.service")
        importlib.import_module("monitor.release").WindowReleaser  # noqa: B018
    except (ImportError, AttributeError) as err:
        return f"the monitor service is not available yet: {err}"
    return None


if (_reason := _unavailable()) is not None:
    pytest.skip(_reason, allow_module_level=True)


def _load_render():
    spec = importlib.util.spec_from_file_location("deploy_render", REPO / "deploy" / "grafana" / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _load_render()


@dataclass
class Stack:
    prom: str              # Prometheus base URL
    start: float           # when Prometheus started
    end: float             # when the checks began (monitor still running)
    surge: tuple[float, float]  # wall-clock start and end of the surge
    private_text: str      # the live private /metrics output
    operational_text: str  # the live operational /metrics output
    n_grids: int


def write_prometheus_config(folder: Path, ports: dict[str, int]) -> None:
    """deploy/'s scrape jobs named in ``ports`` (job -> our port) and its rules, at test speed, no Alertmanager
    (rule states are read from the API), written to ``folder``/prometheus.yml."""
    cfg = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    cfg["rule_files"] = [str(docs.RULES)]
    cfg.pop("alerting")
    cfg["scrape_configs"] = [j for j in cfg["scrape_configs"] if j["job_name"] in ports]
    for job in cfg["scrape_configs"]:
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[job['job_name']]}"]}]
    (folder / "prometheus.yml").write_text(yaml.safe_dump(cfg), encoding="utf-8")


def spawner(folder: Path, procs: list):
    """spawn(name, *args): a process in ``folder``, its stderr in ``folder``/name.log (a file, not a pipe: a
    chatty process must never block on a full pipe), appended to ``procs`` for the teardown."""

    def spawn(name: str, *args: str) -> subprocess.Popen:
        log = open(folder / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, cwd=folder)
        proc.log_path = folder / f"{name}.log"
        log.close()  # the child holds its own descriptor
        procs.append(proc)
        return proc

    return spawn


def _wait(predicate, timeout: float, what: str, procs=()):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"{what}: {p.args[:3]} exited with {p.returncode}\n{_log_tail(p)}")
        try:
            if value := predicate():
                return value
        except (OSError, RuntimeError):
            pass  # not up yet
        time.sleep(0.5)
    logs = "\n".join(f"--- {p.args[0]}:\n{_log_tail(p)}" for p in procs)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{logs}")


def _log_tail(proc: subprocess.Popen) -> str:
    return proc.log_path.read_text(errors="replace")[-3000:]


def _scalar(prom: str, query: str) -> float:
    result = render.api(prom, "query", query=query)["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def _first_baseline_released(metrics_port: int) -> bool:
    # The first estimate is released with the WARMUP_WINDOWS-th window.
    text = _fetch(f"http://127.0.0.1:{metrics_port}/metrics")
    released = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("dp_monitor_windows_released_total ")]
    return bool(released) and released[0] >= WARMUP_WINDOWS


class _ClusteredProducer(threading.Thread):
    """`monitor simulate`'s pacing and payloads, with a clustered surge."""

    def __init__(self, config, bootstrap: str) -> None:
        super().__init__(daemon=True)
        from monitor.stream.simulate import AnomalyBurst, SimulationPlan, VitalsSource, open_producer

        self.source = VitalsSource(config.features, entity_field=config.stream.entity_field,
                                   timestamp_field=config.stream.timestamp_field, n_devices=DEVICES, seed=4)
        self.plan = SimulationPlan(rate=RATE, duration=600.0, burst=AnomalyBurst(*SURGE, SURGE_FRACTION, kind="clustered"),
                                   malformed_rate=0.03)
        self.producer = open_producer(bootstrap)
        self.topic = config.stream.input_topic
        self.stop_event = threading.Event()
        self.stats = None

    def run(self) -> None:
        from monitor.stream.simulate import run_simulation

        def send(key, value):
            self.producer.send(self.topic, key=key, value=value)

        self.stats = run_simulation(send, self.plan, self.source, stop=self.stop_event)

    def close(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
        self.producer.close(timeout=5)


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    from monitor.config import parse_config
    from monitor.model import GridKNN
    from monitor.pipeline.broker import free_port

    tmp = tmp_path_factory.mktemp("prom-stack")
    metrics_port, ops_port, prom_port = free_port(), free_port(), free_port()
    base = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    run_id = uuid.uuid4().hex[:8]
    config = {
        "features": base["features"],
        "model": {"path": str(tmp / "model.json")},
        "stream": {"input_topic": f"deploy-events-{run_id}", "alerts_topic": f"deploy-alerts-{run_id}",
                   "dead_letter_topic": f"deploy-dead-{run_id}", "group_id": f"deploy-{run_id}",
                   "entity_field": "device_id", "timestamp_field": "ts"},
        "window": {"size_seconds": WINDOW_S, "allowed_lateness_seconds": 0.5, "publish_delay_seconds": 0.2},
        "alarm": ALARM,
        # The shipped privacy parameters of the detailed report; the budget below keeps room
        # for one page after a report, not the shipped report.reserve_pages.
        "report": {**base["report"], "reserve_pages": 1},
        "budget": {"accountant": "basic", "period_seconds": 3600, "delta": 1e-3, "epsilon": 1000.0,
                   "ledger": str(tmp / "ledger.sqlite"), "reference_ledger": str(tmp / "ref.sqlite")},
        "metrics": {"host": "127.0.0.1", "port": metrics_port, "operational_port": ops_port},
    }
    cfg_path = tmp / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    fit = subprocess.run([sys.executable, "-m", "monitor", "fit", "--config", str(cfg_path), "--reference",
                          str(REPO / "monitor" / "data" / "reference-vitals.csv"), "--seed", "1"],
                         capture_output=True, text=True, timeout=120)
    assert fit.returncode == 0, fit.stderr
    # Budget: the baseline, one run's threshold and 2.5 pages, one detailed report, and one
    # more threshold. The first page buys its report (leaving a run that pages once in
    # reserve); the later pages' reports do not fit, the third page is the last that can be
    # paid: the alarm is suppressed from then on.
    parsed = parse_config(config)
    n_grids = len(GridKNN.load(tmp / "model.json").grids_)
    report_eps = parsed.report.cost(len(parsed.features), n_grids)[0]
    # Two baseline estimates, each at its warm-up share: the first over the windows before the
    # traffic (degenerate, announced), the second on traffic (see the producer's start below).
    a = parsed.alarm
    baseline_eps = 2 * (a.epsilon_baseline_warmup + a.epsilon_baseline_events)
    config["budget"]["epsilon"] = baseline_eps + 2 * a.epsilon_threshold + 2.5 * a.epsilon_page + report_eps
    cfg_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    parsed = parse_config(config)

    # Prometheus: deploy/'s two scrape jobs and its rules, at test speed, pointed at our monitor.
    write_prometheus_config(tmp, {PRIVATE_JOB: metrics_port, OPERATIONAL_JOB: ops_port})
    procs: list[subprocess.Popen] = []
    spawn = spawner(tmp, procs)

    producer = None
    try:
        prom_url = f"http://127.0.0.1:{prom_port}"
        start = time.time()
        prom = spawn("prometheus", "prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                     f"--storage.tsdb.path={tmp / 'tsdb'}", "--log.level=warn")
        monitor = spawn("monitor", sys.executable, "-m", "monitor", "run", "--config", str(cfg_path), "--bootstrap-servers",
                        kafka_bootstrap, "--seed", "3", "--log-level", "INFO")
        _wait(lambda: render.api(prom_url, "status/buildinfo"), 30, "Prometheus to start", [prom])
        _wait(lambda: _fetch(f"http://127.0.0.1:{metrics_port}/metrics"), 60, "the monitor's /metrics", [monitor])
        # The traffic starts once the first baseline estimate is out: that estimate saw no
        # events (degenerate, announced) and the alarm warms up once more, on traffic.
        # Starting within the first span instead would make the number of warm-up charges
        # (the budget arithmetic above) and the first estimate's quality depend on timing.
        _wait(lambda: _first_baseline_released(metrics_port), 30, "the first (empty) baseline estimate", [monitor])
        producer = _ClusteredProducer(parsed, kafka_bootstrap)
        t0 = time.time()
        producer.start()
        # Events are stamped with the wall clock and the burst starts SURGE[0] s after the
        # producer's start, so the plan gives the surge's times.
        surge = (t0 + SURGE[0], t0 + SURGE[0] + SURGE[1])
        # The alarm pages on the surge, pages again, then runs out of budget: seen by Prometheus.
        _wait(lambda: _scalar(prom_url, 'ALERTS{alertname="DPMonitorAlarmSuppressed", alertstate="firing"}'),
              SURGE[0] + SURGE[1] + 60, "the alarm to be suppressed for budget, in Prometheus", [prom, monitor])
        private_text = _fetch(f"http://127.0.0.1:{metrics_port}/metrics")
        operational_text = _fetch(f"http://127.0.0.1:{ops_port}/metrics")
        time.sleep(2)  # one more rule evaluation on the final samples
        yield Stack(prom_url, start, time.time(), surge, private_text, operational_text, n_grids)
        producer.close()
        producer = None
        assert _stop(monitor) == 0, _log_tail(monitor)
    finally:
        if producer is not None:
            producer.close()
        for p in reversed(procs):
            _stop(p)


def _range(stack, query: str) -> list[dict]:
    return render.api(stack.prom, "query_range", query=query, start=stack.start, end=stack.end, step=0.5)["result"]


def _times(series: list[dict], value: float = 1.0) -> list[float]:
    return sorted(float(t) for s in series for t, v in s["values"] if float(v) == value)


def test_alert_rules_load_and_evaluate_cleanly(stack):
    groups = render.api(stack.prom, "rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in rules} == {name for name, _ in docs.rule_expressions()}
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"


def test_every_dashboard_and_rule_expression_runs_on_prometheus(stack):
    exprs = [*all_dashboard_queries(RATE_INTERVAL), *docs.rule_expressions()]
    assert len(exprs) > 35
    for where, expr in exprs:
        if where.startswith("variable"):
            expr = f"group by (instance) ({expr})"  # label_values(m, l) is Grafana's, not PromQL
        try:
            render.api(stack.prom, "query_range", query=expr, start=stack.start, end=stack.end, step=1)
        except RuntimeError as err:
            pytest.fail(f"{where}: {expr}\n{err}")


def test_every_panel_returns_data(stack):
    series = render.core_series(stack.prom, stack.start, stack.end, 1, RATE_INTERVAL)
    assert set(series) == set(render.CORE_PANELS)
    for title, lines in series.items():
        assert any(vs for _, _, vs in lines), f"core panel {title!r} returned no data"
    legends = {legend for _, lines in series.items() for legend, _, _ in lines}
    # the labels the legends use exist on the real series
    assert {"fired", "held", "quiet", "warming_up", "suppressed", "baseline flagged per window", "excess that pages",
            "reported window", "flagged", "windows", "reports (alarm)"} <= legends
    budget = {legend: vs for legend, _, vs in series["Privacy budget (epsilon)"]}
    assert budget["left (stream)"][-1] < budget["left (stream)"][0]  # spending shows up
    # every other panel of both dashboards returns data on this run, the snapshots included
    # One grid: no 'where' pick is released. The seed's outlier count is off in the shipped report.
    skip = {"Detailed report: outlier count (seed)", "Detailed report: top subspaces"}
    if stack.n_grids < 2:
        skip.add("Detailed report: where")
    # A report names a feature only when it stands out for all features at once (docs/report.md):
    # where the last report named none, its 'where' series is rightly absent.
    named = "dp_monitor_report_where_excess_count{" in stack.private_text
    for path in (docs.DASHBOARD, OPERATIONAL_DASHBOARD):
        for where, expr in dashboard_queries(path, RATE_INTERVAL):
            if where.startswith(("variable", "annotation")) or where in skip or where in render.CORE_PANELS:
                continue
            if not named and "report_where_excess_count" in expr:
                continue
            assert render.api(stack.prom, "query", query=expr, time=stack.end)["result"], f"{path.name}: {where}: {expr}"


def test_the_surge_pages_through_the_private_alarm_and_only_then(stack):
    surge_from, surge_to = stack.surge
    firing = _times(_range(stack, 'ALERTS{alertname="DPMonitorSurge", alertstate="firing"}'))
    assert firing, "the surge rule never fired"
    # Quiet case: before the surge the alarm ran (state quiet) and never paged.
    quiet = _times(_range(stack, 'dp_monitor_alarm_state{state="quiet"}'))
    assert any(t < surge_from for t in quiet), "the alarm never answered 'quiet' before the surge"
    assert firing[0] >= surge_from, f"paged {surge_from - firing[0]:.1f} s before the surge"
    # Paged within the surge's first windows: close + lateness + delay + scrape + evaluation.
    assert firing[0] <= surge_from + 3 * WINDOW_S + 3, f"paged {firing[0] - surge_from:.1f} s into the surge"
    assert firing[-1] <= surge_to + 6 * WINDOW_S, "still paging long after the surge"
    # The page fired on the alarm's own series, with a detailed report naming the window.
    assert _times(_range(stack, "dp_monitor_alarm"))
    assert _scalar(stack.prom, 'dp_monitor_reports_total{reason="alarm"}') >= 1


def test_the_intake_rule_fires_within_two_windows_of_traffic_that_stops(kafka_bootstrap, tmp_path):
    """A monitor of its own (1 s windows, no alarm, no reports: nothing slow in the loop) scraped
    by a Prometheus of its own, both as the stack above: DPMonitorNoIntake fires while no event
    has come since the start, is quiet while a producer sends, and fires again within 2
    windows of the producer's last event (plus a scrape and an evaluation, 1 s each here)."""
    from monitor.pipeline.broker import free_port
    from monitor.stream.simulate import open_producer

    ops_port, prom_port = free_port(), free_port()
    run_id = uuid.uuid4().hex[:8]
    base = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    config = {
        "features": base["features"],
        "model": {"path": str(tmp_path / "model.json")},
        "stream": {"input_topic": f"intake-events-{run_id}", "alerts_topic": f"intake-alerts-{run_id}",
                   "dead_letter_topic": f"intake-dead-{run_id}", "group_id": f"intake-{run_id}", "timestamp_field": "ts"},
        "window": {"size_seconds": WINDOW_S, "allowed_lateness_seconds": 0.5, "publish_delay_seconds": 0.0},
        "alarm": {"enabled": False},
        "report": {**base["report"], "every_seconds": 86400.0},
        "budget": {"epsilon": 1000.0, "ledger": str(tmp_path / "ledger.sqlite"), "reference_ledger": str(tmp_path / "ref.sqlite")},
        "metrics": {"host": "127.0.0.1", "port": 0, "operational_port": ops_port},
    }
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    fit = subprocess.run([sys.executable, "-m", "monitor", "fit", "--config", str(cfg_path), "--reference",
                          str(REPO / "monitor" / "data" / "reference-vitals.csv"), "--seed", "1"],
                         capture_output=True, text=True, timeout=120)
    assert fit.returncode == 0, fit.stderr
    write_prometheus_config(tmp_path, {OPERATIONAL_JOB: ops_port})
    procs: list[subprocess.Popen] = []
    spawn = spawner(tmp_path, procs)

    prom_url = f"http://127.0.0.1:{prom_port}"

    def firing() -> bool:
        return bool(_scalar(prom_url, 'ALERTS{alertname="DPMonitorNoIntake", alertstate="firing"}'))

    try:
        prom = spawn("prometheus", "prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                     f"--web.listen-address=127.0.0.1:{prom_port}", f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--log.level=warn")
        monitor = spawn("monitor", sys.executable, "-m", "monitor", "run", "--config", str(cfg_path), "--bootstrap-servers",
                        kafka_bootstrap, "--seed", "3", "--log-level", "INFO")
        _wait(lambda: render.api(prom_url, "status/buildinfo"), 30, "Prometheus to start", [prom])
        _wait(firing, 60, "the intake rule to fire on a monitor that has accepted nothing since its start", [prom, monitor])
        assert "no event accepted in the whole window" in monitor.log_path.read_text() or \
            _wait(lambda: "no event accepted in the whole window" in monitor.log_path.read_text(), 10, "the log line")

        producer = open_producer(kafka_bootstrap)
        t_start = time.time()
        sent_until = t_start + 10.0
        resolved = None
        while time.time() < sent_until:
            producer.send(config["stream"]["input_topic"],
                          json.dumps({"ts": time.time(), **{f["name"]: (f["min"] + f["max"]) / 2 for f in config["features"]}}).encode())
            producer.flush()
            if resolved is None and not firing():
                resolved = time.time()
            time.sleep(0.02)
        t_last = time.time()
        producer.close(timeout=5)
        assert resolved is not None and resolved - t_start <= 2 * WINDOW_S + 2.5, "the rule stayed firing on traffic"
        _wait(firing, 30, "the intake rule to fire once the producer stopped", [prom, monitor])
        fired_after = time.time() - t_last
        # quiet while the events flowed (after the first events were scraped), fired within 2 windows + scrape + evaluation
        alerts = render.api(prom_url, "query_range", query='ALERTS{alertname="DPMonitorNoIntake", alertstate="firing"}',
                            start=resolved + 1.0, end=t_last, step=0.5)["result"]
        assert not _times(alerts), f"fired while events flowed: {_times(alerts)}"
        assert fired_after <= 2 * WINDOW_S + 2.5, f"fired {fired_after:.1f} s after the last event"
        # The monitor logs it at its own next check of the wall-clock window, which a loaded machine
        # may run after the rule's evaluation.
        _wait(lambda: "no event accepted in the whole window" in monitor.log_path.read_text().split("events arrive again")[-1],
              10, "the log line once the producer stopped", [monitor])
        assert _stop(monitor) == 0, _log_tail(monitor)
    finally:
        for proc in reversed(procs):
            _stop(proc)


def test_budget_rules_fire_when_the_alarm_cannot_be_paid(stack):
    assert _times(_range(stack, 'ALERTS{alertname="DPMonitorBudgetExhausted", alertstate="firing", ledger="stream"}'))
    assert _times(_range(stack, 'ALERTS{alertname="DPMonitorAlarmSuppressed", alertstate="firing"}'))
    # The monitor itself is up on both endpoints.
    up = render.api(stack.prom, "query", query="up", time=stack.end)["result"]
    assert {s["metric"]["job"]: float(s["value"][1]) for s in up} == {PRIVATE_JOB: 1.0, OPERATIONAL_JOB: 1.0}


def test_the_endpoints_keep_the_trust_boundary(stack):
    private, operational = docs.exported_names(stack.private_text), docs.exported_names(stack.operational_text)
    assert "dp_monitor_alarm" in private and "dp_monitor_events_total" in operational
    assert not private & exported("operational"), f"operational metrics on the private endpoint: {private & exported('operational')}"
    assert not operational & exported("private"), f"private-registry metrics on the operational endpoint: {operational & exported('private')}"
    assert not private & operational


def test_every_metric_name_used_in_deploy_is_served_on_its_side(stack):
    private, operational = docs.exported_names(stack.private_text), docs.exported_names(stack.operational_text)
    for path, served in ((docs.DASHBOARD, private), (OPERATIONAL_DASHBOARD, operational)):
        used = {n for _, e in dashboard_queries(path) for n in docs.metric_names(e)}
        assert used and not used - served, f"{path.name}: not on its endpoint: {sorted(used - served)}"
    used = {n for _, e in docs.rule_expressions() for n in docs.metric_names(e)}
    assert used and not used - (private | operational)


def test_dashboard_figure_renders_from_prometheus(stack, tmp_path):
    out = REPO / "docs" / "figures" / "dashboard.png" if FIGURE else tmp_path / "dashboard.png"
    series = render.core_series(stack.prom, stack.start, stack.end, 1, RATE_INTERVAL)
    render.plot(series, out, subtitle=f"`monitor run` on the embedded broker: {WINDOW_S:g}-s windows, baseline warm-up "
                                     f"{WARMUP_WINDOWS} windows, clustered surge from +{SURGE[0]:g} s to +{sum(SURGE):g} s")
    assert out.stat().st_size > 20_000
