"""Write one named section of a Markdown file (BENCHMARKS.md, README.md) in place.

Sections are delimited by ``<!-- begin:NAME -->`` and ``<!-- end:NAME -->`` so that each
benchmark script owns its section and re-running it replaces only that.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def write_section(name: str, markdown: str, path: str | Path = REPO / "BENCHMARKS.md") -> None:
    path = Path(path)
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
