"""The repository stands alone: its reasoning is in docs/design.md, and nothing cites a design
note, a paper's seed number or an issue that a newcomer cannot find in it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DESIGN = REPO / "docs" / "design.md"

# Citations of documents outside the repository: the old design notes ("DESIGN 7",
# "DESIGN section 3.2", "DESIGN.md"), the issue tracker ("issue 26", "(issues 9, 11)",
# "Issue 29.9"), the seed papers by number ("seed 000"), and the notes beside the checkout.
CITATION = re.compile(
    r"\bDESIGN(?:\.md\b|\s*(?:§|section)?\s*\d)"
    r"|\b[Ii]ssues?\s*#?\d"
    r"|\bseed\s+00\d\b"
    r"|shared/(?:DESIGN|INFRA)\.md|shared/seeds\b"
)
SCANNED_DIRS = ("monitor", "docs", "bench", "deploy", "tests")
SCANNED_FILES = ("README.md", "DEVELOPERS.md", "BENCHMARKS.md", "config.yaml")
SUFFIXES = {".py", ".md", ".yml", ".yaml", ".json", ".toml"}


def _scanned() -> list[Path]:
    files = [REPO / name for name in SCANNED_FILES if (REPO / name).is_file()]
    for d in SCANNED_DIRS:
        files += [p for p in (REPO / d).rglob("*")
                  if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return sorted(files)


def _github_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped,
    spaces to hyphens, -1, -2 ... for repeats); fenced code is not a heading."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_citation_pattern_catches_what_it_must_and_nothing_else():
    for text in ("(DESIGN 7)", "DESIGN section 3.2", "see DESIGN.md", "(issue 26)", "issues 9, 11",
                 "Issue 29.9:", "issue #5", "(seed 000, Okada et al.)", "`../shared/DESIGN.md`",
                 "(`../shared/INFRA.md`)"):
        assert CITATION.search(text), text
    for text in ("docs/design.md#floating-point", "the design's reasoning", "an issue with 3 parts",
                 "the seed's outlier count", "rng seed 7", "../shared/datasets/BASELINES.md"):
        assert not CITATION.search(text), text


def test_nothing_cites_a_document_or_issue_outside_the_repository():
    found = []
    for path in _scanned():
        if path == Path(__file__).resolve():
            continue  # its examples above are citations on purpose
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(REPO)}:{i}: {m.group(0)!r} in {line.strip()[:100]}"
                      for m in CITATION.finditer(line)]
    assert not found, "point to docs/design.md or a docs/ page instead:\n" + "\n".join(found)


def test_every_pointer_to_a_page_section_lands_on_a_heading():
    """`docs/design.md#floating-point` in a comment, `alarm.md#replaying-a-file` in a page:
    the page exists and has that heading, so a renamed heading cannot strand its pointers."""
    link = re.compile(r"([\w./-]*?)([\w-]+\.md)#([\w-]+)")
    broken = []
    for path in _scanned():
        for m in link.finditer(path.read_text(encoding="utf-8")):
            prefix, name, anchor = m.groups()
            candidates = (path.parent / prefix / name, REPO / prefix / name, REPO / "docs" / name)
            page = next((c for c in candidates if c.is_file()), None)
            if page is None or anchor not in _github_anchors(page):
                broken.append(f"{path.relative_to(REPO)}: {m.group(0)}")
    assert not broken, broken


def test_design_page_covers_the_reasoning_and_is_linked():
    text = DESIGN.read_text(encoding="utf-8")
    assert 250 <= len(text.splitlines()) <= 450, len(text.splitlines())
    for anchor in ("what-is-protected", "the-model", "outlier-counts", "two-stages", "the-alarm",
                   "graded-weights", "the-baseline", "the-report", "floating-point", "the-budget"):
        assert anchor in _github_anchors(DESIGN), anchor
    assert "(docs/design.md)" in (REPO / "README.md").read_text(encoding="utf-8")
    assert "(design.md)" in (REPO / "docs" / "how-it-works.md").read_text(encoding="utf-8")
    # the code points to it: the float rules and the alarm's reasons are cited where they apply
    pointers = sum(p.read_text(encoding="utf-8").count("docs/design.md#")
                   for p in (REPO / "monitor").rglob("*.py"))
    assert pointers >= 20, pointers
