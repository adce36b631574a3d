"""Generated artefacts are up to date: the README's references and the dashboard JSON."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from monitor import docs
from monitor.config import MonitorConfig

REPO = Path(__file__).resolve().parent.parent


def test_readme_references_are_generated_from_the_code():
    res = subprocess.run([sys.executable, "-m", "monitor.docs", "--check"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_config_reference_lists_every_key_of_the_model():
    ref = docs.config_reference()
    for section, field in MonitorConfig.model_fields.items():
        for key in getattr(field.annotation, "model_fields", {}):  # the nested sections
            assert f"`{section}.{key}`" in ref, (section, key)
    assert "`features[].max`" in ref and "`report.mechanism` | `auto` \\| `global`" in ref


def test_every_exported_metric_has_a_privacy_class_and_a_reference_row():
    names = [name for name, *_ in docs.registry_families()]
    assert set(names) == set(docs.PRIVACY), "classify new metrics in monitor/docs.py PRIVACY"
    ref = docs.metrics_reference()
    for name in names:
        assert f"| `{name}` |" in ref
    # the private/operational split must be visible where operators look
    assert "| `dp_monitor_events_total` | counter | `status` |" in ref and "**NOT private**" in ref


def test_dashboard_json_is_generated_from_its_script():
    res = subprocess.run([sys.executable, "deploy/grafana/dashboard.py", "--check"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
