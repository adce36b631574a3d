"""``monitor demo``: the whole job on one machine, with nothing to set up.

It starts the embedded broker, writes the demo configuration (``monitor/data/
demo-config.yaml`` plus the broker's address) to a work directory, fits the private
model on the bundled reference vitals (``monitor fit``), runs the monitor service
in-process, and feeds it simulated wearables for ``--duration`` seconds with an anomaly
burst in the middle (``monitor simulate``'s generator, in a background thread). Every
released window appears in a live table, or as one plain line when stdout is not a
terminal (CI) or with ``--no-live``. It ends with a summary and exit code 0.

What the table shows are the DP releases, exactly as published on the alerts topic
and /metrics. The "burst" column is the simulator's ground truth, shown so that one
can judge the releases; the monitor itself never sees it.

>>> import argparse
>>> p = argparse.ArgumentParser(); configure_demo(p)
>>> p.parse_args([]).duration
30.0
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from monitor.data import DEMO_CONFIG, REFERENCE_CSV
from monitor.errors import MonitorError
from monitor.stream.simulate import AnomalyBurst, SimulationPlan, SimulationStats, VitalsSource, open_producer, run_simulation

__all__ = ["configure_demo", "run_demo", "write_demo_config", "ReleaseBoard", "BurstVerdict", "burst_verdict"]

_DEMO_DEVICES = 200
_DEMO_RATE = 200.0          # events per second: each device about once a second
_ANOMALY_FRACTION = 0.2     # 40 devices, clustered: each other's neighbours, invisible to the seed's outlier count
_MALFORMED_RATE = 0.005     # a few dead letters to show that path too
_READY_TIMEOUT_S = 30.0


def configure_demo(parser: argparse.ArgumentParser) -> None:
    """Options of ``monitor demo``."""
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of simulated events (default 30)")
    parser.add_argument("--window", type=float, default=None, help="window length in seconds (default 3, from the demo config)")
    parser.add_argument("--workdir", help="directory for the config, model and ledgers, kept afterwards "
                        "(a previous demo's files there are replaced); default: a temporary directory, removed at exit")
    parser.add_argument("--no-live", action="store_true", help="plain lines instead of the live table (automatic when stdout is not a terminal)")
    parser.add_argument("--seed", type=int, help="seed of the simulated people (the privacy noise is never seeded)")
    parser.set_defaults(func=run_demo)


def write_demo_config(workdir: Path, bootstrap_servers: str, window_seconds: float | None = None) -> Path:
    """Write the demo configuration, pointed at ``bootstrap_servers``, to workdir/config.yaml.

    >>> import tempfile
    >>> from monitor.config import load_config
    >>> cfg = load_config(write_demo_config(Path(tempfile.mkdtemp()), "127.0.0.1:9092"))
    >>> cfg.stream.bootstrap_servers, cfg.window.size_seconds, cfg.model.path.name
    ('127.0.0.1:9092', 3.0, 'model.json')
    """
    from monitor.config import load_config

    data = yaml.safe_load(DEMO_CONFIG.read_text(encoding="utf-8"))
    data["stream"]["bootstrap_servers"] = bootstrap_servers
    if window_seconds is not None:
        data["window"]["size_seconds"] = window_seconds
    path = Path(workdir) / "config.yaml"
    header = ("# Written by `monitor demo` from monitor/data/demo-config.yaml; the broker below was the\n"
              "# demo's embedded one and is gone after the demo.\n")
    path.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    load_config(path)  # fail here, not in the service thread, if the window option broke it
    return path


# --- what the demo shows ------------------------------------------------------------


def _noisy(count: dict) -> str:
    """A released count with its public 95 % interval, when it has one: "19 +-12"."""
    acc = count.get("accuracy")
    return f"{count['value']:.0f}" + ("" if acc is None else f" +-{acc:.0f}")


@dataclass(frozen=True)
class BurstVerdict:
    """Did the private alarm page on the injected burst, and only there?"""

    paged: bool
    burst_windows: int
    first_page_delay: float | None   # seconds from the burst's start to the end of the first paging window
    false_pages: int                 # pages in windows the burst did not touch
    top_grid: str | None             # the grid the burst's detailed report named

    def describe(self) -> str:
        if not self.burst_windows:
            return "not judged: no window covered the burst (try a longer --duration)"
        where = f"; its detailed report points at {self.top_grid}" if self.top_grid else ""
        false = f"; {self.false_pages} false page(s)" if self.false_pages else "; no false page"
        if self.paged:
            return f"PAGED {self.first_page_delay:.1f} s after the burst began (at the close of its window){where}{false}"
        return f"NOT paged in the {self.burst_windows} window(s) it touched{false}"


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def burst_verdict(records: list[dict], stats: SimulationStats) -> BurstVerdict:
    """Compare the alarm's published answers with the simulator's ground truth."""
    touched = paged = 0
    delay = grid = None
    false = 0
    for r in records:
        s, e = r["window_start"], r["window_end"]
        fired = (r.get("alarm_detail") or {}).get("state") == "fired"
        covered = stats.burst_from is not None and _overlap(s, e, stats.burst_from, stats.burst_to) > 0
        if covered:
            touched += 1
            if fired and not paged:
                paged, delay = 1, e - stats.burst_from
                report = r.get("report") or {}
                # The report's 'where' names features; records stored before it name a top grid.
                grid = "+".join((report.get("where") or {}).get("features") or []) or (report.get("top_grid") or {}).get("grid")
        elif fired:
            false += 1
    return BurstVerdict(bool(paged), touched, delay, false, grid)


class ReleaseBoard:
    """The released windows so far, as a rich table or plain lines.

    ``burst_of(start, end)`` is the share of a window the simulator's burst covered
    (ground truth, for the viewer only).
    """

    MAX_ROWS = 16

    def __init__(self, burst_of=lambda start, end: 0.0) -> None:
        self.records: list[dict] = []
        self._burst_of = burst_of
        self._lock = threading.Lock()

    def add(self, record: dict) -> None:
        with self._lock:
            self.records.append(record)

    @staticmethod
    def _clock(t: float) -> str:
        return time.strftime("%H:%M:%S", time.localtime(t))

    @staticmethod
    def _alarm(record: dict) -> str:
        state = (record.get("alarm_detail") or {}).get("state", "?")
        return {"fired": "PAGE", "held": "page (held)", "warming_up": "warming up"}.get(state, state)

    @staticmethod
    def _report(record: dict) -> str:
        report = record.get("report")
        if not report:
            return "-"
        if "suppressed" in report:
            return f"suppressed ({report['suppressed']})"
        if report.get("headline"):
            return f"{report['headline']}; events {_noisy(report['event_count'])}"
        grid = report.get("top_grid")  # records stored before the report's 'where'
        where = f"grid {grid['grid']} ({_noisy(grid['flagged_count'])} flagged), " if grid else ""
        outliers = f", outliers {_noisy(report['outlier_count'])}" if report.get("outlier_count") else ""
        return f"{where}events {_noisy(report['event_count'])}, flagged {_noisy(report['flagged_count'])}{outliers}"

    def _burst_label(self, record: dict) -> str:
        share = self._burst_of(record["window_start"], record["window_end"])
        return "" if share <= 0 else ("whole window" if share >= 0.999 else f"{100 * share:.0f} % of it")

    def line(self, record: dict, number: int) -> str:
        """One plain-text line per released window (CI, ``--no-live``)."""
        b = record["budget"]
        burst = self._burst_label(record)
        burst = f"  <- burst injected ({burst})" if burst else ""
        return (f"window {number:>3} {self._clock(record['window_start'])}-{self._clock(record['window_end'])}  "
                f"alarm {self._alarm(record):<11}  report {self._report(record)}  "
                f"epsilon spent {b['epsilon_spent']:.2f} left {b['epsilon_remaining']:.2f}{burst}")

    def table(self, status: str = ""):
        from rich.table import Table

        table = Table(title="Released windows (every number is differentially private)", caption=status, caption_justify="left")
        for name, justify in (("#", "right"), ("window", "left"), ("private alarm", "center"),
                              ("detailed report (noisy)", "left"), ("epsilon spent / left", "right"), ("burst*", "center")):
            table.add_column(name, justify=justify)
        with self._lock:
            records = list(enumerate(self.records, start=1))[-self.MAX_ROWS:]
        for number, r in records:
            burst = self._burst_label(r)
            b = r["budget"]
            table.add_row(
                str(number), f"{self._clock(r['window_start'])}-{self._clock(r['window_end'])}",
                self._alarm(r), self._report(r),
                f"{b['epsilon_spent']:.2f} / {b['epsilon_remaining']:.2f}", f"[red]{burst}[/red]" if burst else "",
                style="bold" if r.get("alarm") else None,
            )
        return table


# --- the run ------------------------------------------------------------------------


class _Background(threading.Thread):
    """A daemon thread that keeps the exception that ended it."""

    def __init__(self, name: str, target) -> None:
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self.error: BaseException | None = None
        self.result = None

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            self.error = err


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo; returns the exit code (0 when it ran through)."""
    from rich.console import Console

    from monitor.config import load_config
    from monitor.pipeline.broker import EmbeddedBroker

    if not args.duration > 0:
        raise MonitorError(f"--duration must be positive, got {args.duration}")
    console = Console(highlight=False, soft_wrap=True)
    live = console.is_terminal and not args.no_live
    started = time.monotonic()
    temporary = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="monitor-demo-") if temporary else args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        _forget_previous_demo(workdir)
        with EmbeddedBroker() as broker:
            console.print(f"embedded broker on {broker.bootstrap_servers} (in memory)")
            config_path = write_demo_config(workdir, broker.bootstrap_servers, args.window)
            console.print(f"config: {config_path}")
            _fit_model(config_path)
            config = load_config(config_path)
            return _run_pipeline(config, args, console, live, started, workdir, temporary)
    finally:
        if temporary:
            shutil.rmtree(workdir, ignore_errors=True)


def _forget_previous_demo(workdir: Path) -> None:
    # A ledger left by an earlier demo would make the service release every 3 s window
    # since then (the schedule resumes after the ledger's last window).
    for pattern in ("monitor-ledger.sqlite*", "reference-ledger.sqlite*", "model.json"):
        for old in workdir.glob(pattern):
            old.unlink()


def _fit_model(config_path: Path) -> None:
    """``monitor fit`` on the bundled reference data: the same code path a user runs."""
    from monitor.cli import main

    rc = main(["fit", "--config", str(config_path), "--reference", str(REFERENCE_CSV)])
    if rc != 0:
        raise MonitorError(f"fitting the demo model failed (monitor fit exited {rc})")


def _run_pipeline(config, args, console, live: bool, started: float, workdir: Path, temporary: bool) -> int:
    from monitor.pipeline.service import MonitorService

    plan = SimulationPlan(
        rate=_DEMO_RATE, duration=args.duration, malformed_rate=_MALFORMED_RATE,
        burst=AnomalyBurst(start=0.5 * args.duration, duration=max(0.2 * args.duration, 2 * config.window.size_seconds),
                           fraction=_ANOMALY_FRACTION, kind="clustered"),
    )
    source = VitalsSource(config.features, entity_field=config.stream.entity_field,
                          timestamp_field=config.stream.timestamp_field, n_devices=_DEMO_DEVICES, seed=args.seed)
    progress: dict[str, SimulationStats] = {}

    def burst_of(start: float, end: float) -> float:
        s = progress.get("stats")
        if not s or s.burst_from is None or end <= start:
            return 0.0
        return _overlap(start, end, s.burst_from, s.burst_to) / (end - start)

    board = ReleaseBoard(burst_of)

    def on_release(record: dict) -> None:
        board.add(record)
        if not live:
            console.print(board.line(record, len(board.records)))

    service = MonitorService(config, on_release=on_release)
    service_thread = _Background("monitor-service", service.run)
    service_thread.start()
    stop_producing = threading.Event()
    producer_thread = None
    producer = None
    try:
        ready_by = time.monotonic() + _READY_TIMEOUT_S
        while not service.wait_ready(0.2):
            if not service_thread.is_alive():
                raise service_thread.error or MonitorError("the monitor service stopped before it was ready")
            if time.monotonic() > ready_by:
                raise MonitorError(f"the monitor service was not ready within {_READY_TIMEOUT_S:.0f} s")
        console.print(f"metrics: {service.metrics_url}")
        console.print(f"producing {plan.total_events} events from {_DEMO_DEVICES} simulated wearables over {args.duration:g} s; "
                      f"a clustered anomaly burst (spo2 down, heart rate up, {_ANOMALY_FRACTION:.0%} of them) from "
                      f"+{plan.burst.start:g} s for {plan.burst.duration:g} s; the alarm's baseline needs the first "
                      f"{config.alarm.baseline_warmup_seconds:g} s")
        producer = open_producer(config.stream.bootstrap_servers, config.stream.kafka)
        topic = config.stream.input_topic

        def produce() -> SimulationStats:
            return run_simulation(lambda k, v: producer.send(topic, key=k, value=v), plan, source,
                                  stop=stop_producing, on_progress=lambda s: progress.__setitem__("stats", s))

        producer_thread = _Background("simulator", produce)
        producer_thread.start()
        _watch(console, board, live, service_thread, producer_thread, progress, config)
        stats = producer_thread.result
    finally:
        stop_producing.set()
        if producer_thread is not None:
            producer_thread.join(10)
        if producer is not None:
            producer.close(timeout=5)
        metrics_text = _scrape(service.metrics_url)
        service.stop()
        service_thread.join(30)
    if service_thread.error:
        raise service_thread.error
    if producer_thread.error:
        raise producer_thread.error
    _print_summary(console, board, stats, config, service, metrics_text, time.monotonic() - started, workdir, temporary)
    return 0


def _watch(console, board: ReleaseBoard, live: bool, service_thread, producer_thread, progress, config) -> None:
    """Show releases until the simulator is done and the window of its last event is out.

    Windows close by the clock (end + allowed lateness), so after the last event the
    demo waits at most one window, the lateness and a margin.
    """
    grace = config.window.size_seconds + config.window.allowed_lateness_seconds + 5.0
    deadline: list[float] = []

    def finished() -> bool:
        if not service_thread.is_alive():
            return True
        if producer_thread.is_alive():
            return False
        stats = producer_thread.result
        if stats is None or stats.last_ts is None:
            return True
        if not deadline:
            deadline.append(time.monotonic() + grace)
        last = board.records[-1]["window_end"] if board.records else float("-inf")
        return last >= stats.last_ts or time.monotonic() > deadline[0]

    def status() -> str:
        s = progress.get("stats")
        if s is None:
            return "starting the simulator..."
        burst = "  [red]anomaly burst on[/red]" if s.in_burst else ""
        done = "  (done; waiting for the last window to close)" if not producer_thread.is_alive() else ""
        return f"events sent {s.events}, malformed {s.malformed_total}{burst}{done}   * burst = the simulator's ground truth, not a release"

    if live:
        from rich.live import Live

        with Live(board.table(status()), console=console, refresh_per_second=4) as view:
            while not finished():
                time.sleep(0.25)
                view.update(board.table(status()))
            view.update(board.table(status()))
    else:
        while not finished():
            time.sleep(0.2)
    if not service_thread.is_alive():
        raise service_thread.error or MonitorError("the monitor service stopped unexpectedly")
    if producer_thread.error:
        raise producer_thread.error


def _scrape(url: str | None) -> str:
    if not url:
        return ""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def _metric_total(text: str, name: str) -> float | None:
    """Sum of every sample of ``name`` (all label sets) in a Prometheus text page."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return total if seen else None


def _print_summary(console, board: ReleaseBoard, stats: SimulationStats, config, service, metrics_text: str,
                   wall: float, workdir: Path, temporary: bool) -> None:
    records = board.records
    counts = service.counts
    # A quiet run that goes on past its boundary is listed again (carried_on): one threshold.
    charges = [c for r in records for c in r.get("charges", []) if not c.get("carried_on")]
    alarm_eps = sum(c["epsilon"] for c in charges if c["kind"] in ("alarm_run", "alarm_page", "baseline"))
    report_eps = sum(c["epsilon"] for c in charges if c["kind"] == "report")
    runs = sum(c["kind"] == "alarm_run" for c in charges)
    console.print("")
    console.print("[bold]demo summary[/bold]")
    console.print(f"  windows released: {len(records)} of {config.window.size_seconds:g} s; "
                  f"pages: {sum((r.get('alarm_detail') or {}).get('state') == 'fired' for r in records)}")
    console.print(f"  events sent: {stats.events} ({stats.malformed_total} malformed on purpose); monitor: "
                  f"{counts.get('accepted', 0)} accepted, {counts.get('duplicate_entity', 0)} dropped as a device's 2nd+ event "
                  f"in a window, {counts.get('late', 0)} late, {counts.get('dead_letter', 0)} dead letters")
    verdict = burst_verdict(records, stats)
    console.print(f"  anomaly burst ({stats.burst_devices} devices, {stats.anomalous} anomalous events): {verdict.describe()}")
    a = config.alarm
    console.print(f"  privacy: the alarm path spent epsilon {alarm_eps:.2f} per person ({runs} alarm run(s) of "
                  f"{a.epsilon_threshold:g}, {a.epsilon_page:g} per page, and the baseline), detailed reports {report_eps:.2f}; delta 0.")
    # The shipped settings (the config's defaults are config.yaml's), not the demo's warm-up shares.
    shipped = type(config)(features=config.features)
    day = shipped.alarm.epsilon_threshold + shipped.baseline_cost()[0]
    console.print(f"  with config.yaml's 5-minute windows the alarm costs about {day:.2f} "
                  f"per person on a UTC day without a page, plus {shipped.alarm.epsilon_page:g} and one report per page "
                  "(docs/benchmarks/alarm.md, \"Surge alarm\")")
    scraped = "served while running" if metrics_text else "not reachable at the end"
    console.print(f"  metrics: {service.metrics_url} ({scraped}); operational metrics (not private): {service.operational_metrics_url}")
    where = "removed (use --workdir DIR to keep them)" if temporary else f"kept in {workdir}"
    console.print(f"  config, model and ledgers: {where}")
    console.print(f"  run time: {wall:.1f} s")
