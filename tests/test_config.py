from pathlib import Path

import pytest

from monitor.config import ConfigError, load_config, parse_config

REPO = Path(__file__).resolve().parent.parent
BASE = {"features": [{"name": "hr", "min": 30, "max": 220}, {"name": "spo2", "min": 70, "max": 100}]}


def test_repository_config_is_valid():
    cfg = load_config(REPO / "config.yaml")
    assert cfg.feature_names[0] == "heart_rate"
    assert cfg.model.path.is_absolute() or cfg.model.path.parent == REPO


def test_unknown_key_names_its_path():
    with pytest.raises(ConfigError, match=r"window\.size_second: unknown key"):
        parse_config({**BASE, "window": {"size_second": 3}})


def test_bad_bounds_name_the_feature():
    with pytest.raises(ConfigError, match=r"features\[spo2\]: max \(60.0\) must be greater than min \(70.0\)"):
        parse_config({"features": [{"name": "hr", "min": 30, "max": 220}, {"name": "spo2", "min": 70, "max": 60}]})


def test_negative_epsilon_is_refused():
    with pytest.raises(ConfigError, match=r"report\.epsilon_count"):
        parse_config({**BASE, "report": {"epsilon_count": -1}})


def test_the_first_days_steady_line_must_go_through_more_windows_than_its_trend():
    with pytest.raises(ConfigError, match=r"alarm: steady_windows \(36\) must be 0 \(none\) or more than trend_windows \(40\)"):
        parse_config({**BASE, "alarm": {"trend_windows": 40}})
    assert parse_config({**BASE, "alarm": {"trend_windows": 40, "steady_windows": 0}}).alarm.steady_windows == 0
    with pytest.raises(ConfigError, match=r"alarm\.curve_windows: removed: the first day's steady line"):
        parse_config({**BASE, "alarm": {"curve_windows": 36}})


def test_the_first_days_steady_line_must_go_through_more_windows_than_the_short_one():
    with pytest.raises(ConfigError, match=r"alarm: steady_windows \(10\) must be 0 \(none\) or more than trend_windows \(10\)"):
        parse_config({**BASE, "alarm": {"steady_windows": 10}})
    assert parse_config({**BASE, "alarm": {"steady_windows": 0}}).alarm.steady_windows == 0


def test_keys_of_earlier_versions_say_what_replaced_them():
    with pytest.raises(ConfigError, match=r"release: renamed `report`"):
        parse_config({**BASE, "release": {"top_h": 1}})
    with pytest.raises(ConfigError, match=r"metrics.outlier_alert_level: removed"):
        parse_config({**BASE, "metrics": {"outlier_alert_level": 150}})


def test_a_report_or_run_costing_more_than_the_budget_is_refused():
    with pytest.raises(ConfigError, match="one detailed report costs .* more than the period budget"):
        parse_config({**BASE, "budget": {"epsilon": 0.2}})
    with pytest.raises(ConfigError, match="an alarm run that pages once costs .* more than the period budget"):
        parse_config({**BASE, "budget": {"epsilon": 1.0}, "alarm": {"epsilon_page": 0.9}})


def test_the_alarm_keys_of_earlier_versions_say_what_replaced_them():
    with pytest.raises(ConfigError, match=r"alarm.epsilon_queries: renamed `alarm.epsilon_page`"):
        parse_config({**BASE, "alarm": {"epsilon_queries": 0.4}})
    with pytest.raises(ConfigError, match=r"alarm.max_run_seconds: renamed `alarm.run_seconds`"):
        parse_config({**BASE, "alarm": {"max_run_seconds": 3600}})


def test_relative_paths_resolve_against_the_config_folder(tmp_path):
    (tmp_path / "c.yaml").write_text("features:\n  - {name: a, min: 0, max: 1}\nmodel: {path: m.json}\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.model.path == tmp_path / "m.json"
    assert cfg.budget.ledger == tmp_path / "monitor-ledger.sqlite"


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_smooth_mechanism_with_zero_delta_is_refused_at_start(mechanism):
    with pytest.raises(ConfigError, match=rf"report.delta_top_count must be positive with report.mechanism '{mechanism}'"):
        parse_config({**BASE, "report": {"mechanism": mechanism, "top_h": 1, "delta_top_count": 0}})
    # Pure mechanisms need no delta.
    parse_config({**BASE, "report": {"mechanism": "student_t", "delta_count": 0, "delta_top_count": 0}})
