"""The benchmark pages: BENCHMARKS.md indexes one page per area under docs/benchmarks/,
and every bench script writes its sections into the page that holds them."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES_DIR = REPO / "docs" / "benchmarks"
MARKER = re.compile(r"<!-- (begin|end):(\S+) -->")


def _bench_report():
    # bench/ is not a package and not installed: load the shared helper from its file
    spec = importlib.util.spec_from_file_location("bench_report_helper", REPO / "bench" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _written_sections(script: Path) -> set[str]:
    """Section names a script passes to write_section or write_run (literals, either arm of a
    conditional, or the names in a table it loops over, as bench_alarm.py's modes)."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("write_section", "write_run") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant):
                names.add(first.value)
            elif isinstance(first, ast.IfExp):
                names |= {a.value for a in (first.body, first.orelse) if isinstance(a, ast.Constant)}
            else:  # a variable: the section-like literals of the script (`alarm-...`)
                names |= {s for s in strings if re.fullmatch(r"[a-z_]+(-[a-z]+)+", s)}
    return names


def test_every_section_is_on_its_page_exactly_once():
    report = _bench_report()
    pages = sorted(PAGES_DIR.glob("*.md"))
    assert {p.name for p in pages} == set(report.PAGES.values())
    found: dict[str, list[str]] = {}
    for page in pages:
        for kind, name in MARKER.findall(page.read_text(encoding="utf-8")):
            if kind == "begin":
                found.setdefault(name, []).append(page.name)
    assert found == {name: [page] for name, page in report.PAGES.items()}
    index = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert not MARKER.search(index), "BENCHMARKS.md is the index only: sections live in docs/benchmarks/"
    assert len(index) < 5000


def test_every_bench_script_writes_only_sections_that_have_a_page():
    report = _bench_report()
    written = {}
    for script in sorted((REPO / "bench").glob("bench_*.py")):
        for name in _written_sections(script):
            written.setdefault(name, []).append(script.name)
    assert set(written) == set(report.PAGES), set(written) ^ set(report.PAGES)


def test_the_index_links_every_page_with_what_it_measures_and_a_command():
    index = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
    lines = [line for line in index.splitlines() if "](docs/benchmarks/" in line]
    linked = [re.search(r"\]\(docs/benchmarks/([^)]+)\)", line).group(1) for line in lines]
    assert sorted(linked) == sorted(p.name for p in PAGES_DIR.glob("*.md"))
    for line in lines:
        assert re.search(r"\): \S.+`(OMP_NUM_THREADS=1 )?python bench/bench_\w+\.py", line), line


def test_relative_links_in_the_benchmark_pages_exist():
    for page in [REPO / "BENCHMARKS.md", *sorted(PAGES_DIR.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not target.startswith(("http://", "https://")):
                assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to {target}"


def test_write_section_replaces_the_section_on_its_page_only(tmp_path, monkeypatch):
    report = _bench_report()
    for page in PAGES_DIR.glob("*.md"):
        (tmp_path / page.name).write_text(page.read_text(encoding="utf-8"), encoding="utf-8")
    before = {p.name: p.read_text(encoding="utf-8") for p in tmp_path.glob("*.md")}
    monkeypatch.setattr(report, "PAGES_DIR", tmp_path)
    report.write_section("alarm-real-levels", "### new levels\n\nmeasured")
    after = {p.name: p.read_text(encoding="utf-8") for p in tmp_path.glob("*.md")}
    changed = [name for name in before if before[name] != after[name]]
    assert changed == ["alarm-real.md"]
    assert "<!-- begin:alarm-real-levels -->\n### new levels\n\nmeasured\n<!-- end:alarm-real-levels -->" in after["alarm-real.md"]
    # the page's other sections and its header are kept
    old_head, old_rest = before["alarm-real.md"].split("<!-- begin:alarm-real-levels -->")
    assert after["alarm-real.md"].startswith(old_head) and after["alarm-real.md"].endswith(old_rest.split("<!-- end:alarm-real-levels -->")[1])
    with pytest.raises(KeyError, match="PAGES"):
        report.write_section("no-such-section", "x")
