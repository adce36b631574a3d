"""A user's first hour, second pass: what they type after `monitor run` starts.

Real processes on the embedded broker: the start-up line gives the bootstrap string to
paste (Kafka's 9092 when free), `monitor run` logs each window's alarm state and epsilon,
and `monitor alerts` reads the alerts topic as a table, as JSON lines and with --follow.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monitor.budget.plan import duration, iso
from tests.streamkit import wait_for
from tests.test_first_hour import ENV, monitor, start_monitor, stop, workdir  # noqa: F401 - fixture

PASTE = re.compile(r"connect with bootstrap_servers=(\S+?)\. ")
RELEASED = re.compile(r"window \[(\S+), (\S+)\) released: alarm (\S+), epsilon ([0-9.e+-]+)")


def test_run_says_where_to_connect_logs_each_window_and_alerts_prints_them(workdir):  # noqa: F811
    log = workdir / "run.log"
    proc = start_monitor("run", cwd=workdir, log=log)
    try:
        wait_for(lambda: PASTE.search(log.read_text()) or proc.poll() is not None, 60, "the start-up line")
        bootstrap = PASTE.search(log.read_text()).group(1)
        host, port = bootstrap.rsplit(":", 1)
        assert host == "127.0.0.1"
        if port != "9092":  # 9092 was taken on this machine: the log says so and names the port used
            assert "port 9092 is taken" in log.read_text() and f"listens on {port}" in log.read_text()
        wait_for(lambda: len(RELEASED.findall(log.read_text())) >= 2, 60, "two windows released")
        lines = RELEASED.findall(log.read_text())
        # each window's line: the alarm's state and what the window charged (a report every window here)
        assert all(float(eps) > 0 for *_, eps in lines), lines
        assert "; report (schedule): " in log.read_text()

        table = monitor("alerts", "--bootstrap-servers", bootstrap, cwd=workdir)
        assert table.returncode == 0, table.stderr
        head, *rows = table.stdout.splitlines()
        assert head.split()[:4] == ["window", "(UTC)", "alarm", "epsilon"] and "report" in head
        assert len(rows) >= 2 and "window(s) on fh.alerts" in table.stderr
        first_start = lines[0][0]
        row = next(r for r in rows if r.startswith(first_start))
        assert f"{float(lines[0][3]):.3g}" in row.split(), row
        if port == "9092":  # no flag needed: the embedded broker's default port
            plain = monitor("alerts", cwd=workdir)
            assert plain.returncode == 0 and len(plain.stdout.splitlines()) >= len(rows) + 1, plain.stderr

        as_json = monitor("alerts", "--json", "--bootstrap-servers", bootstrap, cwd=workdir)
        records = [json.loads(x) for x in as_json.stdout.splitlines()]
        assert len(records) >= len(rows) and len({r["window_start"] for r in records}) == len(records)
        assert all({"window_start", "alarm", "epsilon", "report"} <= set(r) for r in records)
        # the report column: the report's own headline when it has one, else a summary naming its reason
        report = next(r for r in records if row.startswith(iso(r["window_start"])))["report"]
        assert (report.get("headline") or "schedule") in row, (row, report)

        with open(workdir / "follow.out", "wb") as out:
            follow = subprocess.Popen([sys.executable, "-m", "monitor", "alerts", "--follow", "--bootstrap-servers", bootstrap],
                                      cwd=workdir, env=ENV, stdout=out, stderr=subprocess.PIPE)
        try:
            newest = records[-1]["window_start"]
            wait_for(lambda: len((workdir / "follow.out").read_text().splitlines()) > len(records) + 1, 30,
                     "--follow to print a window published after it started")
        finally:
            follow.send_signal(signal.SIGINT)
            assert follow.wait(10) in (0, 130)
        assert b"Traceback" not in follow.stderr.read()
        assert newest is not None
    finally:
        stop(proc)


def test_alerts_without_a_topic_yet_is_one_line(workdir):  # noqa: F811
    from tests.test_first_hour import one_line_error

    res = monitor("alerts", "--bootstrap-servers", _closed(), cwd=workdir)
    one_line_error(res, "cannot reach Kafka")


def _closed() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_budget_plan_says_what_a_restart_costs(workdir):  # noqa: F811
    import yaml

    config = workdir / "config.yaml"
    data = yaml.safe_load(config.read_text())
    data["alarm"] = {"enabled": True}
    config.write_text(yaml.safe_dump(data))
    res = monitor("budget", cwd=workdir)
    out = " ".join(res.stdout.split())
    report = json.loads(monitor("budget", "--json", cwd=workdir).stdout)
    threshold, plan = report["stream"]["costs"]["alarm_run"]["epsilon"], report["plan"]
    assert ("each restart (Ctrl-C and start again, a crash, a deploy) goes on with a quiet alarm run (its noisy threshold "
            f"kept in <ledger>.run); after a page it opens a new alarm run: epsilon {threshold:g}") in out, out
    # Charged over what a restart rebuilds (two days and the hours before), not the whole reach (a week and them).
    assert 0 < plan["restart_reach_seconds"] < plan["reach_seconds"] / 3, plan
    assert f"from {duration(plan['restart_reach_seconds'])} before the restart on" in out, out
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert "stops it cleanly; a restart goes on with a quiet alarm run, after a page opens a new one: `alarm.epsilon_threshold`" in readme


def test_alerts_reads_a_backtests_file_without_a_config_or_a_broker(tmp_path):
    """`monitor alerts --input alerts.jsonl`: the table the topic gives, each window once; a line
    that is not a record stops it with one line naming it, before any output."""
    from tests.test_first_hour import one_line_error

    quiet = {"window_start": 1763700000.0, "window_end": 1763700300.0, "alarm": False, "epsilon": 0.0,
             "alarm_detail": {"state": "quiet"}, "report": None}
    page = {"window_start": 1763700300.0, "window_end": 1763700600.0, "alarm": True, "epsilon": 0.78,
            "alarm_detail": {"state": "fired"}, "report": {"reason": "alarm", "headline": "surge in spo2: +41 flagged (+-12)"}}
    alerts = tmp_path / "alerts.jsonl"
    alerts.write_text("".join(json.dumps(r) + "\n" for r in (quiet, page, page)))  # the page twice: shown once

    res = monitor("alerts", "--input", "alerts.jsonl", cwd=tmp_path)  # no config.yaml here
    assert res.returncode == 0, res.stderr
    head, *rows = res.stdout.splitlines()
    assert head.split()[:4] == ["window", "(UTC)", "alarm", "epsilon"] and len(rows) == 2, res.stdout
    assert rows[1].split()[:3] == ["2025-11-21T04:45:00Z-04:50:00", "fired", "0.78"], rows
    assert rows[1].endswith("surge in spo2: +41 flagged (+-12)") and rows[0].split()[1] == "quiet", rows
    assert "2 window(s) in alerts.jsonl" in res.stderr
    as_json = monitor("alerts", "--input", "alerts.jsonl", "--json", cwd=tmp_path)
    assert [json.loads(x) for x in as_json.stdout.splitlines()] == [quiet, page]

    with open(alerts, "a") as f:
        f.write('{"ts": 1763700600}\n')
    bad = monitor("alerts", "--input", "alerts.jsonl", cwd=tmp_path)
    one_line_error(bad, "--input alerts.jsonl line 4: not an alert record")
    assert bad.stdout == ""
    one_line_error(monitor("alerts", "--input", "alerts.jsonl", "--follow", cwd=tmp_path), "--follow", "--input")
    one_line_error(monitor("alerts", "--input", "missing.jsonl", cwd=tmp_path), "cannot read --input missing.jsonl")
