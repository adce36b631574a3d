"""The ledger lock: one writer per ledger across processes, and nothing left beside the ledger.

A clean release removes the lock file; the lock must still keep two processes apart when
one of them opened the file just before the other removed it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap

import pytest

from monitor.lockfile import LedgerInUse, LedgerLock, lock_path

HOLDER = textwrap.dedent("""
    import sys
    from monitor.lockfile import LedgerLock
    lock = LedgerLock(sys.argv[1]).acquire()
    print("held", flush=True)
    sys.stdin.readline()
    lock.release()
""")


def test_another_process_is_refused_and_a_clean_release_leaves_no_file(tmp_path):
    ledger = tmp_path / "monitor-ledger.sqlite"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(ledger)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LedgerInUse, match=f"pid {holder.pid}"):
            LedgerLock(ledger).acquire()
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(30) == 0
    finally:
        holder.kill()
    assert not lock_path(ledger).exists()
    with LedgerLock(ledger):
        assert lock_path(ledger).read_text().strip() == str(os.getpid())
    assert list(tmp_path.iterdir()) == []


def test_a_file_opened_just_before_its_release_is_not_taken_for_the_lock(tmp_path):
    """B opened the lock file, then A released (removing it) and C took a new one: B's flock on
    the old file succeeds, but that file is no longer the lock, so B must not count as holding it."""
    ledger = tmp_path / "monitor-ledger.sqlite"
    a = LedgerLock(ledger).acquire()
    stale = os.open(lock_path(ledger), os.O_RDWR)  # B, between its open and its flock
    try:
        a.release()
        c = LedgerLock(ledger).acquire()
        fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # succeeds: the removed file is unlocked
        assert not LedgerLock(ledger)._still_at_path(stale)  # so acquire() would retry, and be refused by C
        with pytest.raises(LedgerInUse):
            LedgerLock(ledger).acquire()
        c.release()
    finally:
        os.close(stale)
    assert not lock_path(ledger).exists()
