"""The package and its docs as a new user meets them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def test_the_package_imports_nothing_from_the_source_tree():
    """monitor/docs.py imported bench/ (not installed with the package) by putting the checkout on sys.path."""
    offenders = []
    for path in (REPO / "monitor").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in ("bench", "tests", "deploy")]
        if "sys.path.insert" in path.read_text(encoding="utf-8"):
            offenders.append(f"{path.relative_to(REPO)}: sys.path.insert")
    assert not offenders, offenders


def test_write_block_replaces_only_its_block(tmp_path):
    from monitor.docs import write_block

    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- begin:a -->\nold\n<!-- end:a -->\noutro\n")
    write_block("a", "new\n", page)
    write_block("b", "added", page)
    assert page.read_text() == "intro\n<!-- begin:a -->\nnew\n<!-- end:a -->\noutro\n\n<!-- begin:b -->\nadded\n<!-- end:b -->\n"


def test_docs_cite_no_design_sections_or_issue_numbers():
    """The docs say what they mean in their own words: the design notes and the issues are not in the repository."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = [f"{p.name}: {m.group(0)}" for p in pages
             for m in re.finditer(r"DESIGN(\.md)?[ §]*\d+(\.\d+)?|\(?\b[Ii]ssues? #?\d+\)?|#\d{1,3}\b(?!\w)", p.read_text(encoding="utf-8"))]
    assert not found, found


def test_privacy_page_quotes_the_shipped_epsilon_top_count():
    shipped = yaml.safe_load((REPO / "config.yaml").read_text())["report"]["epsilon_top_count"]
    text = (REPO / "docs" / "privacy.md").read_text(encoding="utf-8")
    quoted = re.findall(r"`report\.epsilon_top_count`\s*\(([0-9.]+) in `config\.yaml`\)", " ".join(text.split()))
    assert quoted and all(float(q) == shipped for q in quoted), (quoted, shipped)


def test_readme_producer_snippet_reaches_the_embedded_broker_as_written():
    """The snippet said localhost:9092 while the embedded broker took a random port."""
    from monitor.docs import current_block
    from monitor.pipeline.broker import DEFAULT_EMBEDDED_PORT

    own = current_block("own-topic", REPO / "README.md")
    snippet = re.search(r'KafkaProducer\(bootstrap_servers="([^"]+)"', own).group(1)
    assert snippet == f"localhost:{DEFAULT_EMBEDDED_PORT}"
    assert f"bootstrap_servers: localhost:{DEFAULT_EMBEDDED_PORT}" in own


def test_readme_names_the_check_of_a_fitted_model_and_explains_the_demo_output():
    """The five steps had no `monitor score`, the only command that showed a blind model; the
    demo output's `page (held)` was not explained."""
    from monitor.docs import current_block

    own = current_block("own-topic", REPO / "README.md")
    fit_step = own[own.index("\n2. "):own.index("\n3. ")]
    assert "monitor score --input" in fit_step and "nearly blind" in fit_step, fit_step
    quick = current_block("quickstart", REPO / "README.md")
    assert "alarm page (held)" in quick
    after = " ".join(quick[quick.index("```\n\n"):].split())
    assert "`page (held)`: the page holds for `alarm.hold_windows` windows at no new cost" in after, after
