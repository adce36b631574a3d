"""Reading feature tables for `monitor fit` / `monitor score`: CSV with a header, or npz.

Every problem is a MonitorError naming the file and, where it applies, the row and column.

>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "ref.csv")
>>> _ = open(p, "w").write("id,hr,spo2\\na,60,97\\nb,72,99\\n")
>>> read_features(p, ["spo2", "hr"]).tolist()
[[97.0, 60.0], [99.0, 72.0]]
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from monitor.errors import MonitorError

__all__ = ["InputFileError", "read_features", "csv_rows", "extra_columns"]

# Files larger than this get a progress bar.
_PROGRESS_BYTES = 4 << 20


class InputFileError(MonitorError):
    """A reference or event file that cannot be read as a feature table."""


def read_features(path: str | os.PathLike, names: Sequence[str], progress: bool = True) -> np.ndarray:
    """Columns ``names`` of a CSV (header row) or npz (``X`` [+ ``feature_names``]) file, as floats (n, d)."""
    path = Path(path)
    if not path.exists():
        raise InputFileError(f"{path}: no such file")
    if path.suffix.lower() == ".npz":
        return _read_npz(path, list(names))
    return _read_csv(path, list(names), progress)


def extra_columns(path: str | os.PathLike, names: Sequence[str]) -> list[str]:
    """Columns of the file (CSV header, or an npz ``feature_names``) that are not in ``names``:
    what ``read_features`` ignores. Empty for an npz without names.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "ref.csv")
    >>> _ = open(p, "w").write("id,hr,spo2,label\\na,60,97,0\\n")
    >>> extra_columns(p, ["spo2", "hr"])
    ['id', 'label']
    """
    path = Path(path)
    wanted = set(names)
    if path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as z:
            cols = [str(n) for n in z["feature_names"]] if "feature_names" in z else []
    else:
        header = next((row for _, row in csv_rows(path, progress=False)), [])
        cols = [h.strip() for h in header]
    return [c for c in cols if c not in wanted]


def _read_npz(path: Path, names: list[str]) -> np.ndarray:
    try:
        with np.load(path, allow_pickle=False) as z:
            if "X" not in z:
                raise InputFileError(f"{path}: npz file has no array 'X' (found {sorted(z.files)})")
            X = np.asarray(z["X"], dtype=float)
            file_names = [str(n) for n in z["feature_names"]] if "feature_names" in z else None
    except InputFileError:
        raise
    except (OSError, ValueError) as err:
        raise InputFileError(f"{path}: cannot read npz file: {err}") from None
    if X.ndim != 2:
        raise InputFileError(f"{path}: 'X' must be a 2-D array (rows, features), got shape {X.shape}")
    if file_names is not None:
        missing = [n for n in names if n not in file_names]
        if missing:
            raise InputFileError(f"{path}: feature_names lacks {missing} (has {file_names})")
        X = X[:, [file_names.index(n) for n in names]]
    elif X.shape[1] != len(names):
        raise InputFileError(f"{path}: 'X' has {X.shape[1]} columns but {len(names)} features are configured "
                             f"({names}); add a 'feature_names' array or reorder the columns")
    bad = np.argwhere(~np.isfinite(X))
    if bad.size:
        r, c = bad[0]
        raise InputFileError(f"{path}: row {r}, column {names[c]!r}: value {X[r, c]} is not a finite number")
    return X


def _delimiter(path: Path) -> str:
    """``,`` unless the header line has no comma but semicolons or tabs (Excel in many locales).

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "x.csv")
    >>> _ = open(p, "w").write("hr;spo2\\n60;97\\n")
    >>> _delimiter(Path(p))
    ';'
    """
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as fh:
        header = fh.readline()
    if "," not in header:
        for sep in (";", "\t"):
            if sep in header:
                return sep
    return ","


def csv_rows(path: Path, progress: bool = True) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of a CSV file, header included, with a progress bar on big files.

    A UTF-8 byte-order mark (Excel's "CSV UTF-8") is skipped, and a file whose header is
    separated by ``;`` or tabs is read with that separator.
    """
    size = path.stat().st_size
    show = progress and size > _PROGRESS_BYTES
    done = 0
    delimiter = _delimiter(path)
    with open(path, newline="", encoding="utf-8-sig") as fh:

        def lines():
            nonlocal done
            for line in fh:
                done += len(line)
                yield line

        reader = csv.reader(lines(), delimiter=delimiter)
        if not show:
            for row in reader:
                yield reader.line_num, row
            return
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task(f"reading {path.name}", total=size)
            for i, row in enumerate(reader):
                if i % 20000 == 0:
                    bar.update(task, completed=done)
                yield reader.line_num, row


def _read_csv(path: Path, names: list[str], progress: bool) -> np.ndarray:
    rows = csv_rows(path, progress)
    try:
        _, header = next(rows)
    except StopIteration:
        raise InputFileError(f"{path}: the file is empty (expected a header row naming the features)") from None
    except (UnicodeDecodeError, csv.Error) as err:
        raise InputFileError(f"{path}: not a readable CSV file: {err}") from None
    header = [h.strip() for h in header]
    missing = [n for n in names if n not in header]
    if missing:
        raise InputFileError(f"{path}: header lacks column(s) {missing} (header: {header})")
    cols = [header.index(n) for n in names]
    out: list[list[float]] = []
    try:
        for line, row in rows:
            if not row:
                continue
            if len(row) != len(header):
                raise InputFileError(f"{path}: line {line}: {len(row)} fields, but the header has {len(header)}")
            vals = []
            for c, n in zip(cols, names):
                try:
                    v = float(row[c])
                except ValueError:
                    hint = " (use '.' as the decimal mark)" if "," in row[c] else ""
                    raise InputFileError(f"{path}: line {line}, column {n!r}: {row[c]!r} is not a number{hint}") from None
                if not math.isfinite(v):
                    raise InputFileError(f"{path}: line {line}, column {n!r}: {row[c]!r} is not a finite number")
                vals.append(v)
            out.append(vals)
    except (UnicodeDecodeError, csv.Error) as err:
        raise InputFileError(f"{path}: not a readable CSV file: {err}") from None
    if not out:
        raise InputFileError(f"{path}: no data rows after the header")
    return np.asarray(out, dtype=float)


def read_labelled(path: "str | os.PathLike", names: Sequence[str], labels: "str | None" = None
                  ) -> "tuple[np.ndarray, np.ndarray | None, str]":
    """(rows, labels or None, file name) of a file of known anomalies: columns ``names`` as in
    ``read_features``; ``labels``, the column (an npz's array) saying which rows are anomalies (1)
    and which normal (0), refused in one line unless every row has one and some row is 1."""
    file = Path(path)
    rows = read_features(file, names, progress=False)
    flags = None
    if labels is not None:
        if file.suffix.lower() == ".npz":
            with np.load(file, allow_pickle=False) as z:
                if labels not in z:
                    raise MonitorError(f"--labels {labels}: {file} holds no array {labels!r} (it holds {', '.join(z.files)})")
                flags = np.asarray(z[labels], dtype=float).reshape(-1)
        else:
            flags = read_features(file, [labels], progress=False)[:, 0]
        if flags.shape != (len(rows),) or not np.isin(flags, (0.0, 1.0)).all():
            raise MonitorError(f"--labels {labels}: each row needs 1 (an anomaly) or 0 (normal), one per row of {file}")
        if not flags.any():
            raise MonitorError(f"--labels {labels}: no row of {file} is labelled 1 (an anomaly)")
    return rows, flags, file.name
