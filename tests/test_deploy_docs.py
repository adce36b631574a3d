"""Generated artefacts are up to date: the references in docs/ and the dashboard JSON; the README stays short."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from monitor import docs
from monitor.config import MonitorConfig

REPO = Path(__file__).resolve().parent.parent


def test_docs_references_are_generated_from_the_code():
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


# ---------------------------------------------------------------- the README a new user reads

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_readme_is_short_and_has_what_a_new_user_needs():
    assert len(README) <= 12_500, len(README)
    quick = docs.current_block("quickstart", REPO / "README.md")
    # a venv first (Debian refuses pip outside one); the demo without the test extra
    assert quick.index("python3 -m venv .venv") < quick.index('pip install -e ".[embedded]" && monitor demo')
    assert 'pip install -e ".[test]" && python -m pytest' in quick
    own = docs.current_block("own-topic", REPO / "README.md")
    assert own.count("\n1. ") == 1 and "\n5. " in own
    assert '{"machine_id": "press-7"' in own and "KafkaProducer(" in own and "producer.send(" in own
    # the privacy table names every kind of output: the model, the alarm, its baseline, the
    # detailed report, what is outside the guarantee, the ledgers
    for row in ("model file", "`alarm` of every window", "`alarm_detail`", "baseline rate", "report: event",
                "`monitor replay`'s alerts file", "operational endpoint", "late publications", "input, dead-letter",
                "ledgers (SQLite)"):
        assert f"\n| {row}" in README, row
    table = README[README.index("<!-- begin:privacy-table -->"):README.index("<!-- end:privacy-table -->")]
    for output in ("`run`'s log", "`score`'s output", "replay's dead-letter file", "the rhythm reference's history",
                   "cut"):
        assert output in table, output


def test_every_relative_link_in_the_readme_and_docs_exists():
    import re

    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "deploy" / "README.md"]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not target.startswith(("http://", "https://", "mailto:")):
                assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to {target}, which does not exist"


def test_demo_runs_without_the_test_extra(tmp_path):
    """`monitor demo` as the Quickstart types it, with every test-only package unimportable."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'pytest', 'hypothesis', 'miniball', 'testcontainers', 'sklearn', 'matplotlib'}:\n"
        "            raise ImportError(f'{name} is a test-only package')\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{REPO}"}
    res = subprocess.run([sys.executable, "-m", "monitor", "demo", "--duration", "4", "--window", "1", "--no-live"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "demo summary" in res.stdout and "windows released:" in res.stdout
