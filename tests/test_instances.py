"""Several processes, one answer (docs/scaling.md).

One input topic with 3 partitions, events keyed by ``device_id`` (also the entity
field), produced once. The same input is then monitored three times, each time by a
fresh consumer group with its own ledger, audit file and alerts topic:

- m = 1: one ``monitor run`` (both stages in one process);
- m = 2: two ``monitor run --stage 1`` processes and one ``monitor run --stage 2``;
- m = 3: three ``--stage 1`` processes and one ``--stage 2``.

Each run must count every produced event in exactly one window (test-only audit file),
release every window once (ledger consecutive, each charged the window cost, alerts
equal to the ledger), and the true contents of every window (its event ids) must be the
same in all three runs: the number of stage-1 processes does not change what a window
is. The stage-1 processes of one run split the input partitions between them (their logs).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from streamkit import (
    KeyedPacer,
    ServiceProcess,
    assigned,
    audit_windows,
    check_alerts_match_ledger,
    check_budget_spent,
    check_events_counted_once,
    check_ledger_schedule,
    create_topic,
    ledger_rows,
    read_audit,
    read_topic,
    require_service,
    stop_processes,
    wait_for,
    window_cost,
    write_config,
    write_model,
)

pytestmark = [pytest.mark.slow, pytest.mark.broker]

SEED = 20261122
WINDOW = 2.0
LATENESS = 1.0
GRACE = 300.0  # the backlog is produced before the runs: its windows must still be within grace
PRODUCE_SECONDS = 10.0
RATE = 20.0
DEVICES = 40
PARTITIONS = 3
PREFIX = "multi"


def run_config(tmp_path: Path, bootstrap: str, model: Path, stage1: int, last_ts: float) -> tuple[Path, dict, list]:
    """Monitor the input with ``stage1`` stage-1 processes (0 = one process running both)."""
    name = f"m{max(stage1, 1)}"
    directory = tmp_path / name
    directory.mkdir()
    config = write_config(directory, bootstrap=bootstrap, model_path=model, prefix=PREFIX, window_seconds=WINDOW,
                          lateness_seconds=LATENESS, grace_seconds=GRACE, entity_field="device_id",
                          group=f"{PREFIX}-{name}")
    text = config.read_text().replace(f"alerts_topic: {PREFIX}.alerts", f"alerts_topic: {PREFIX}.alerts.{name}")
    # Each fresh consumer group counts the backlog produced before the runs (docs/operations.md).
    text = text.replace("\nwindow:\n", "\nwindow:\n  first_window: backlog\n", 1)
    assert "first_window: backlog" in text
    config.write_text(text)
    audit = directory / "audit.jsonl"
    logs = directory / "logs"
    if stage1 == 0:
        procs = [ServiceProcess(config, bootstrap, audit, seed=SEED, logs=logs)]
        ingest = procs
    else:
        ingest = [ServiceProcess(config, bootstrap, audit, seed=SEED, logs=logs, stage="1", name=f"stage1-{i}")
                  for i in range(stage1)]
        procs = ingest + [ServiceProcess(config, bootstrap, audit, seed=SEED, logs=logs, stage="2", name="stage2")]
    tails = lambda: "\n".join(p.log_tail() for p in procs)  # noqa: E731
    try:
        for p in ingest:
            p.start()
        # All stage-1 processes in the group with a share each before stage 2 starts, so
        # the shards really come from several processes (plus re-sent attempts).
        wait_for(lambda: all(assigned(p) for p in ingest)
                 and sorted(sum((assigned(p) for p in ingest), [])) == list(range(PARTITIONS)),
                 60, f"the {len(ingest)} stage-1 processes to split the partitions", interval=0.1, on_timeout=tails)
        shares = [assigned(p) for p in ingest]
        for p in procs[len(ingest):]:
            p.start()
        wait_for(lambda: any(float(w["window_end"]) > last_ts for w in read_audit(audit)), 120,
                 "the window of the last event", interval=0.2, on_timeout=tails)
        stop_processes(procs)
    finally:
        for p in procs:
            p.cleanup()
    return config, audit_windows(read_audit(audit)), shares


def test_one_two_and_three_stage1_processes_give_the_same_windows(tmp_path, fresh_broker):
    require_service()
    t0 = time.monotonic()
    bootstrap = fresh_broker.bootstrap_servers
    model = write_model(tmp_path / "model.json", seed=SEED)
    create_topic(bootstrap, f"{PREFIX}.events", partitions=PARTITIONS)
    pacer = KeyedPacer(bootstrap, f"{PREFIX}.events", rate=RATE, seed=SEED, devices=DEVICES, window=WINDOW)
    pacer.start()
    time.sleep(PRODUCE_SECONDS)
    pacer.stop()
    produced = set(pacer.entity)
    assert len(set(pacer.partition.values())) == PARTITIONS

    contents: dict[int, dict[float, list[str]]] = {}
    summary = []
    for m in (0, 2, 3):
        config, windows, shares = run_config(tmp_path, bootstrap, model, m, pacer.last_ts)
        n = max(m, 1)
        assert len(shares) == n and all(shares), f"m={n}: a stage-1 process got no partition: {shares}"
        counted = check_events_counted_once(windows, produced, WINDOW, note=f"(m={n})")
        assert counted == len(produced)
        entries = ledger_rows(config.parent / "ledger.sqlite")
        cost = window_cost(config)
        starts = check_ledger_schedule(entries, WINDOW, cost)
        assert set(starts) == set(windows), f"m={n}: audited and ledger windows differ"
        assert abs(check_budget_spent(entries, cost) - len(starts) * cost[0]) < 1e-6
        stats = check_alerts_match_ledger(read_topic(bootstrap, f"{PREFIX}.alerts.m{n}"), entries)
        assert stats["windows"] == stats["records"] == len(starts)
        contents[n] = {s: w["event_ids"] for s, w in windows.items() if w["event_ids"]}
        summary.append(f"m={n}: partitions {shares}, {len(starts)} windows, {counted} events")

    assert contents[1] == contents[2] == contents[3], "the windows' true contents depend on the number of processes"
    print(f"\ninstances: {len(produced)} events of {DEVICES} devices on {PARTITIONS} partitions, "
          f"{len(contents[1])} windows with events, identical for 1, 2 and 3 stage-1 processes; "
          + "; ".join(summary) + f"; {time.monotonic() - t0:.0f} s")
