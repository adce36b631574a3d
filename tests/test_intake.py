"""Traffic that stops or collapses is logged once and exported for the operational rules
(monitor/pipeline/intake.py; the rules' own tests: deploy/prometheus/tests)."""

from __future__ import annotations

import logging

import pytest

from monitor.pipeline.intake import IntakeWatch
from monitor.pipeline.metrics import MonitorMetrics

WHERE = "topic vitals on 127.0.0.1:9092"


def sample(metrics: MonitorMetrics, name: str) -> float | None:
    return metrics.operational.get_sample_value(name)


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.fixture
def metrics() -> MonitorMetrics:
    return MonitorMetrics()


def test_no_event_since_the_start_is_logged_once_after_the_first_whole_window(caplog, metrics):
    caplog.set_level(logging.INFO, logger="monitor.stream")
    watch = IntakeWatch(60.0, started_at=1030.0, where=WHERE, metrics=metrics)
    assert sample(metrics, "dp_monitor_last_accepted_timestamp_seconds") == 1030.0  # the start, until an event
    assert sample(metrics, "dp_monitor_intake_window_seconds") == 60.0
    watch.tick(1079.0)  # [1020, 1080) is partial: the process started inside it
    assert not warnings(caplog) and watch.last_window is None
    watch.tick(1141.0)  # [1080, 1140) passed without an event
    (line,) = warnings(caplog)
    assert "no event accepted in the whole window" in line and "since the start" in line and WHERE in line, line
    assert sample(metrics, "dp_monitor_intake_last_window_events") == 0
    watch.tick(1500.0)
    assert len(warnings(caplog)) == 1  # once per stop, not once per window


def test_traffic_that_stops_then_comes_back(caplog, metrics):
    caplog.set_level(logging.INFO, logger="monitor.stream")
    watch = IntakeWatch(10.0, started_at=0.0, where=WHERE, metrics=metrics)
    for t in range(0, 50):
        watch.observe(3, now=t + 0.5)  # 30 per window
    assert sample(metrics, "dp_monitor_last_accepted_timestamp_seconds") == 49.5
    assert sample(metrics, "dp_monitor_intake_last_window_events") == 30
    assert sample(metrics, "dp_monitor_intake_usual_window_events") == 30
    assert not warnings(caplog)
    watch.tick(61.0)  # [50, 60) empty
    (line,) = warnings(caplog)
    assert "after 30 per window before" in line, line
    watch.observe(3, now=60.5)
    assert any("events arrive again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    for t in range(61, 90):
        watch.observe(3, now=t + 0.5)
    watch.tick(90.0)
    assert len(warnings(caplog)) == 1  # traffic as before: neither stopped nor collapsed again
    watch.tick(101.0)  # [90, 100) empty: a second stop, a second line
    assert len(warnings(caplog)) == 2


def test_a_collapse_is_logged_and_exported_against_the_windows_before(caplog, metrics):
    caplog.set_level(logging.INFO, logger="monitor.stream")
    watch = IntakeWatch(10.0, started_at=0.0, where=WHERE, metrics=metrics)
    for t in range(0, 40):
        watch.observe(10, now=t + 0.5)  # 100 per window
    for t in range(40, 50):
        if t % 2 == 0:
            watch.observe(1, now=t + 0.5)  # 5 in [40, 50)
    watch.tick(50.0)
    assert sample(metrics, "dp_monitor_intake_last_window_events") == 5
    assert sample(metrics, "dp_monitor_intake_usual_window_events") == 100  # the windows before the last
    (line,) = warnings(caplog)
    assert "intake collapsed: 5 events" in line and "about 100 per window" in line, line
    # a drop to half is no collapse
    caplog.clear()
    watch2 = IntakeWatch(10.0, started_at=0.0, where=WHERE)
    for t in range(0, 40):
        watch2.observe(10 if t < 30 else 5, now=t + 0.5)
    watch2.tick(40.0)
    assert not warnings(caplog)


def test_too_little_usual_traffic_is_not_called_a_collapse(caplog):
    caplog.set_level(logging.INFO, logger="monitor.stream")
    watch = IntakeWatch(10.0, started_at=0.0, where=WHERE)
    for t in range(0, 30):
        watch.observe(1 if t % 2 == 0 else 0, now=t + 0.5)  # 5 per window
    watch.observe(1, now=30.5)
    watch.tick(40.0)
    assert not warnings(caplog)
