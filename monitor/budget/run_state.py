"""The open alarm run's state beside the ledger, so that a restart goes on with a quiet run.

A run is one AboveThreshold instance: its noisy threshold is drawn once and its charge
(``alarm.epsilon_threshold``) counts once in every period its span touches. A restart used to
end it and open a new one, whose threshold counted again in every period of the history it
reads: with a restart a day, a quiet period held three or four thresholds instead of one
(docs/benchmarks/budget.md). Going on needs the run's threshold noise, which is SECRET (the
guarantee of its answers rests on it; never published, never in the ledger, which ``monitor
budget`` readers see): it is kept in ``<ledger>.run``, mode 0600, inside the trust boundary
like the input topic. Written after the commit of the window that opened the run (a crash
before it leaves the previous file, which names another charge); read at start, where it is
used only if the ledger agrees (``WindowReleaser._resumable_run``); removed when the run ends.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("monitor.stream")

__all__ = ["RUN_STATE_VERSION", "forget_run", "load_run", "run_state_path", "save_run"]

RUN_STATE_VERSION = 1


def run_state_path(ledger_path: "str | Path") -> Path:
    """``<ledger>.run``: where the open run's state is kept."""
    path = Path(ledger_path)
    return path.with_name(path.name + ".run")


def save_run(path: Path, state: dict) -> None:
    """Write ``state`` atomically (a temporary file, fsync, rename), readable by its owner only."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older temporary file keeps its mode through O_CREAT
        os.write(fd, json.dumps({"version": RUN_STATE_VERSION, **state}).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_run(path: Path) -> "dict | None":
    """The state saved by ``save_run``, or None (none, unreadable, or of another version: a new
    run opens, as before a restart could go on with one)."""
    try:
        state = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("the open alarm run's state %s is unreadable (%s): a new run opens", path, err)
        return None
    if not isinstance(state, dict) or state.get("version") != RUN_STATE_VERSION:
        log.warning("the open alarm run's state %s is of another version: a new run opens", path)
        return None
    return state


def forget_run(path: Path) -> None:
    """Remove the state of a run that ended (its threshold noise is not kept longer than needed). A
    file that cannot be removed is only logged: it names a run the ledger no longer holds open, so no
    start goes on with it, and a release must not fail for it."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as err:
        log.warning("the ended alarm run's state %s cannot be removed (%s); no restart will use it", path, err)
