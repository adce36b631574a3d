"""Write one named section of a benchmark page in place.

Sections are delimited by ``<!-- begin:NAME -->`` and ``<!-- end:NAME -->`` so that each
benchmark script owns its section and re-running it replaces only that. Each section lives on
one page of ``docs/benchmarks/`` (``PAGES``); BENCHMARKS.md is only the index of those pages.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES_DIR = REPO / "docs" / "benchmarks"

# The page of docs/benchmarks/ each section is written to, by area. A script that writes a
# new section adds it here (and the page to BENCHMARKS.md's index); an unknown name is refused
# rather than appended to some page nobody reads.
PAGES: dict[str, str] = {
    "core": "outliers.md",
    "core_cost": "outliers.md",
    "core_cost_million": "outliers.md",
    "model": "model.md",
    "model-ceiling": "model.md",
    "model-projections": "model.md",
    "model-tail": "model.md",
    "model-tail-oracle": "model.md",
    "model-tail-depths": "model.md",
    "model-tail-ceiling": "model.md",
    "model-tail-grid-ceiling": "model.md",
    "model-tail-race": "model.md",
    "calibration": "calibration.md",
    "budget": "budget.md",
    "budget-reach": "budget.md",
    "stream": "stream.md",
    "replay": "replay.md",
    "identify": "identify.md",
    "alarm": "alarm.md",
    "alarm-replay": "alarm.md",
    "alarm-reserve": "alarm.md",
    "alarm-per-person": "alarm.md",
    "alarm-real": "alarm-real.md",
    "alarm-real-levels": "alarm-real.md",
    "alarm-real-legacy": "alarm-real.md",
    "alarm-sizing": "alarm-real.md",
    "alarm-rhythm": "alarm-rhythm.md",
    "alarm-rhythm-before": "alarm-rhythm.md",
    "alarm-ceiling": "alarm-rhythm.md",
    "alarm-rhythm-large-fleet": "alarm-rhythm.md",
    "alarm-rhythm-weekend": "alarm-rhythm.md",
    "alarm-rhythm-persistent": "alarm-rhythm.md",
    "alarm-rhythm-real-curve": "alarm-rhythm.md",
    "alarm-restart": "alarm-rhythm.md",
    "alarm-trend-error": "alarm-rhythm.md",
    "report": "report.md",
    "report-stream": "report.md",
    "report-stream-persistent": "report.md",
}


def page_for(name: str) -> Path:
    """The page of docs/benchmarks/ that holds section ``name``."""
    try:
        return PAGES_DIR / PAGES[name]
    except KeyError:
        raise KeyError(f"section {name!r} has no page: add it to bench/report.py's PAGES") from None


def write_section(name: str, markdown: str, path: str | Path | None = None) -> None:
    """Replace section ``name`` of ``path`` (default: its page, ``page_for(name)``) with ``markdown``."""
    path = page_for(name) if path is None else Path(path)
    begin, end = f"<!-- begin:{name} -->", f"<!-- end:{name} -->"
    with open(path.with_suffix(path.suffix + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        block = f"{begin}\n{markdown.strip()}\n{end}"
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            text = head + block + tail
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


def write_run(name: str, title: str, body: str, seconds: float, command: str | None = None,
              one_core: bool = True) -> None:
    """Write section ``name`` as a titled run: the command that reproduces it (this script's own
    command line unless ``command``), how long it took, then ``body``."""
    cmd = command or " ".join([f"OMP_NUM_THREADS=1 python bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    write_section(name, f"### {title}\n\n`{cmd}` ({seconds:.0f} s{' on 1 core' if one_core else ''})\n\n{body.strip()}\n")
