"""One writer per ledger: an exclusive lock file next to it, held while a monitor runs.

Two monitors writing one window ledger would each decide windows against a budget the
other is also spending, and both would publish. The SQLite ledger itself tolerates the
second writer (it waits for the write lock), so the refusal has to come from here.

The lock is ``flock`` on ``<ledger>.lock``: the kernel drops it when the process dies,
even on SIGKILL, so a crash never leaves a stale lock behind (a file may stay, unlocked and
harmless). A clean release removes the file while still holding the lock; whoever opened
it just before then locks a file that is no longer at the path, notices, and tries again,
so two processes never both hold "the" lock. The file holds the owner's pid, only to name
it in the message. Readers (``monitor budget``) take no lock.

>>> import os, tempfile, pathlib
>>> ledger = pathlib.Path(tempfile.mkdtemp()) / "monitor-ledger.sqlite"
>>> with LedgerLock(ledger):
...     try:
...         LedgerLock(ledger).acquire()
...     except LedgerInUse as err:
...         print("refused:", "in use by another monitor (pid %d)" % os.getpid() in str(err))
refused: True
>>> lock_path(ledger).exists()  # released: nothing left beside the ledger
False
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from monitor.errors import MonitorError

__all__ = ["LedgerLock", "LedgerInUse", "lock_path"]


class LedgerInUse(MonitorError):
    """Another process holds the ledger's lock."""


def lock_path(ledger: str | os.PathLike) -> Path:
    """``monitor-ledger.sqlite`` -> ``monitor-ledger.sqlite.lock``."""
    ledger = Path(ledger)
    return ledger.with_name(ledger.name + ".lock")


class LedgerLock:
    """Exclusive, non-blocking ``flock`` on the ledger's lock file; a context manager."""

    def __init__(self, ledger: str | os.PathLike) -> None:
        self.ledger = Path(ledger)
        self.path = lock_path(ledger)
        self._fd: int | None = None

    def acquire(self) -> "LedgerLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise LedgerInUse(
                    f"ledger {self.ledger.resolve()} is in use by another monitor (pid {owner}): two monitors must never "
                    f"share a privacy ledger. Stop that one, or give this one its own budget.ledger (and metrics.port)"
                ) from None
            if self._still_at_path(fd):
                break
            # The holder released (and removed the file) between our open and our flock:
            # this lock is on a file no one else will ever open again.
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd
        return self

    def _still_at_path(self, fd: int) -> bool:
        try:
            at_path = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            # Removed before unlocking, so that no one can lock this file after us while
            # another process creates and locks a new one at the same path.
            if self._still_at_path(fd):
                self.path.unlink(missing_ok=True)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> "LedgerLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
