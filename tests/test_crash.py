"""Crash safety of `monitor run` (docs/design.md#the-budget): SIGKILL at random moments, then restart.

One run of at least 20 one-second windows on a real broker (3 input partitions, events
produced in real time), the service killed with SIGKILL six times and restarted each
time: twice at seeded random moments, and four times inside a window's close sequence
(audit line -> ledger commit -> publish -> mark published; see KILL_MODES), including
twice after the alert reached the broker but before the ledger marked it published, so
that window really is published twice. Afterwards:

- every window is in the ledger exactly once, consecutive, each charged the window cost,
  so the spent budget is windows x cost (and the i-th alert record states i x cost
  spent), and every entry is marked published;
- every alert record (first publication and re-publications after restart, keyed by the
  window start) is byte-identical to the ledger payload, at least one window was
  published twice, and no window was published twice without the ``republished`` header;
- a window audited twice (crash between audit and ledger commit) has identical lines;
- every valid event (unique ``id``, produced in real time) is counted in exactly one
  released window, according to the test-only audit file (true window contents).
"""

from __future__ import annotations

import random
import time

import pytest

from streamkit import (
    KeyedPacer,
    EventPacer,
    ServiceProcess,
    audit_line_count,
    audit_windows,
    check_alerts_match_ledger,
    check_budget_spent,
    check_events_counted_once,
    check_ledger_schedule,
    create_topic,
    ledger_rows,
    file_stamp,
    kill_between_publish_and_mark,
    read_audit,
    read_topic,
    require_service,
    start_with_traffic,
    stop_processes,
    wait_for,
    window_cost,
    write_config,
    write_model,
)

pytestmark = [pytest.mark.slow, pytest.mark.broker]

SEED = 20261121
WINDOW = 1.0
LATENESS = 2.0  # generous: on a loaded 2-core machine a real-time event may take a while
MIN_WINDOWS = 20
# Where each SIGKILL lands: "random" = a seeded random moment; "audit" = a few ms after a
# window's audit line appears (audit -> ledger commit: the window is closed again after the
# restart); "ledger" = as soon as the ledger's WAL is written after an audit line (ledger
# commit -> publish: the stored record is re-published after the restart); "published" =
# after the alert reached the broker but before the ledger marks it published (the window
# is then published twice: the first publication and the re-publication must be equal).
KILL_MODES = ["random", "audit", "published", "ledger", "random", "published"]
KILLS = len(KILL_MODES)
RATE = 25.0  # valid events per second


def test_sigkill_at_random_moments_loses_and_repeats_nothing(tmp_path, fresh_broker):
    require_service()
    rng = random.Random(SEED)
    bootstrap = fresh_broker.bootstrap_servers
    prefix = "crash"
    model = write_model(tmp_path / "model.json", seed=SEED)
    config = write_config(tmp_path, bootstrap=bootstrap, model_path=model, prefix=prefix,
                          window_seconds=WINDOW, lateness_seconds=LATENESS)
    create_topic(bootstrap, f"{prefix}.events", partitions=3)
    audit = tmp_path / "audit.jsonl"
    service = ServiceProcess(config, bootstrap, audit, seed=SEED, logs=tmp_path / "logs")
    pacer = EventPacer(bootstrap, f"{prefix}.events", rate=RATE, seed=SEED)
    released = lambda: len(audit_windows(read_audit(audit)))  # noqa: E731
    caught = 0  # kills that landed between an alert's publication and its mark
    try:
        service.start()
        # A fresh service schedules windows from its start time: events from before it
        # would be late, so produce from the first release on.
        wait_for(lambda: audit_line_count(audit) >= 1, 90, "the first window release", on_timeout=service.log_tail)
        pacer.start()

        for i, mode in enumerate(KILL_MODES):
            before = audit_line_count(audit)
            # Progress since the last restart first, so the kills do not all land in start-up.
            wait_for(lambda: audit_line_count(audit) >= before + 2, 60, f"releases before kill {i + 1}",
                     on_timeout=service.log_tail)
            service.ensure_alive()
            if mode == "published":
                caught += kill_between_publish_and_mark(service, audit, tmp_path / "ledger.sqlite", bootstrap,
                                                        f"{prefix}.alerts")
                service.start()
                continue
            if mode == "random":
                time.sleep(rng.uniform(0.0, 1.5 * WINDOW))
            else:
                # Right after an audit line: inside the ledger commit / publish / mark sequence.
                seen = audit_line_count(audit)
                wait_for(lambda: audit_line_count(audit) > seen, 30, "an audit line to kill after",
                         interval=0.001, on_timeout=service.log_tail)
                if mode == "audit":
                    time.sleep(rng.uniform(0.0, 0.005))
                else:
                    wal = tmp_path / "ledger.sqlite-wal"
                    before_commit = file_stamp(wal)
                    wait_for(lambda: file_stamp(wal) != before_commit, 10, "the ledger commit", interval=0.0005,
                             on_timeout=service.log_tail)
                    # Sometimes before the publish, sometimes between its ack and mark_published.
                    time.sleep(rng.uniform(0.0, 0.008))
            service.kill()
            service.start()

        wait_for(lambda: released() >= MIN_WINDOWS, 120, f"{MIN_WINDOWS} released windows", interval=0.2,
                 on_timeout=service.log_tail)
        pacer.pause()
        last_ts = pacer.last_ts
        wait_for(lambda: any(float(w["window_end"]) > last_ts for w in read_audit(audit)), 60,
                 "the window of the last event", interval=0.1, on_timeout=service.log_tail)
        service.ensure_alive()
        assert service.terminate() == 0, service.log_tail()
    finally:
        service.cleanup()  # first: a failing pacer.stop() must not leak the process
        pacer.stop()

    lines = read_audit(audit)
    windows = audit_windows(lines)  # fails if a window was audited twice with different contents
    entries = ledger_rows(tmp_path / "ledger.sqlite")
    cost = window_cost(config)
    starts = check_ledger_schedule(entries, WINDOW, cost)
    assert len(starts) >= MIN_WINDOWS
    assert set(windows) == set(starts), "audited windows and ledger windows differ"
    spent = check_budget_spent(entries, cost)

    counted = check_events_counted_once(windows, set(pacer.ids), WINDOW)
    assert counted == len(pacer.ids) > MIN_WINDOWS * RATE * 0.5

    alerts = read_topic(bootstrap, f"{prefix}.alerts")
    stats = check_alerts_match_ledger(alerts, entries)
    assert stats["windows"] == len(starts)
    assert service.kills == KILLS
    # Each "published" kill (retried over a few windows) lands between the publication and
    # its mark, so those windows really were published twice, identically.
    assert caught >= 1 and stats["published_twice"] >= caught

    print(f"\ncrash: {len(starts)} windows, {service.kills} SIGKILLs, {counted} events counted once, "
          f"spent epsilon {spent:.3f} = {len(starts)} x {cost[0]:g}, "
          f"{len(lines) - len(windows)} windows audited twice, {stats['records']} alert records "
          f"({stats['republished']} republished, {stats['published_twice']} windows published twice; "
          f"{caught} kills between publish and mark)")


SPLIT_KILLS = 6


def test_sigkill_any_process_of_a_two_stage_deployment(tmp_path, fresh_broker):
    """Two `monitor run --stage 1` processes and one `--stage 2` on 3 input partitions,
    events keyed by device in real time; SIGKILL a seeded random process at a random
    moment, six times, restarting it each time. Every produced event is counted in
    exactly one window, every window is in the ledger once and charged once, every
    alert equals its ledger row (docs/budget.md, crash safety)."""
    require_service()
    rng = random.Random(SEED + 7)
    bootstrap = fresh_broker.bootstrap_servers
    prefix = "split"
    model = write_model(tmp_path / "model.json", seed=SEED)
    config = write_config(tmp_path, bootstrap=bootstrap, model_path=model, prefix=prefix, window_seconds=WINDOW,
                          lateness_seconds=LATENESS, grace_seconds=20.0, entity_field="device_id")
    create_topic(bootstrap, f"{prefix}.events", partitions=3)
    audit = tmp_path / "audit.jsonl"
    logs = tmp_path / "logs"
    procs = [ServiceProcess(config, bootstrap, audit, seed=SEED, logs=logs, stage="1", name=f"stage1-{i}") for i in range(2)]
    procs.append(ServiceProcess(config, bootstrap, audit, seed=SEED, logs=logs, stage="2", name="stage2"))
    pacer = KeyedPacer(bootstrap, f"{prefix}.events", rate=RATE, seed=SEED, devices=40, window=WINDOW)
    tails = lambda: "\n".join(p.log_tail() for p in procs)  # noqa: E731
    killed = []
    try:
        for p in procs:
            p.start()
        wait_for(lambda: audit_line_count(audit) >= 2, 90, "the first releases", on_timeout=tails)
        pacer.start()
        for _ in range(SPLIT_KILLS):
            before = audit_line_count(audit)
            wait_for(lambda: audit_line_count(audit) >= before + 2, 60, "releases before the next kill", on_timeout=tails)
            victim = rng.choice(procs)
            time.sleep(rng.uniform(0.0, 1.5 * WINDOW))
            victim.kill()
            killed.append(victim.name)
            victim.start()
        before = audit_line_count(audit)
        wait_for(lambda: audit_line_count(audit) >= before + 3, 60, "releases after the last kill", on_timeout=tails)
        pacer.stop()
        wait_for(lambda: any(float(w["window_end"]) > pacer.last_ts for w in read_audit(audit)), 90,
                 "the window of the last event", interval=0.1, on_timeout=tails)
        stop_processes(procs)
    finally:
        for p in procs:
            p.cleanup()
        if pacer._thread.is_alive():
            pacer.stop()

    windows = audit_windows(read_audit(audit))
    counted = check_events_counted_once(windows, set(pacer.entity), WINDOW)
    assert counted == len(pacer.entity) > 10 * RATE * 0.5
    entries = ledger_rows(tmp_path / "ledger.sqlite")
    cost = window_cost(config)
    starts = check_ledger_schedule(entries, WINDOW, cost)
    assert set(windows) == set(starts)
    assert abs(check_budget_spent(entries, cost) - len(starts) * cost[0]) < 1e-6
    stats = check_alerts_match_ledger(read_topic(bootstrap, f"{prefix}.alerts"), entries)
    assert stats["windows"] == len(starts)
    print(f"\nsplit crash: SIGKILLed {killed}; {len(starts)} windows, {counted} events counted once, "
          f"{stats['republished']} alerts republished")


def test_a_downtime_longer_than_the_grace_keeps_the_missed_windows_events(tmp_path, fresh_broker):
    """SIGKILL, then down for several windows while events keep arriving: the missed windows
    are released from the backlog after the restart (``window.max_catch_up_windows``), each
    with its events, which the input topic still holds; none is dropped as late."""
    require_service()
    bootstrap = fresh_broker.bootstrap_servers
    prefix = "downtime"
    grace = 1.0
    model = write_model(tmp_path / "model.json", seed=SEED)
    # No cap on the backlog (window.max_catch_up_windows, 24 windows): on a loaded machine the restart
    # alone took longer than 24 one-second windows, and the oldest were suppressed with their events.
    config = write_config(tmp_path, bootstrap=bootstrap, model_path=model, prefix=prefix, window_seconds=WINDOW,
                          lateness_seconds=LATENESS, grace_seconds=grace, window={"max_catch_up_windows": None})
    create_topic(bootstrap, f"{prefix}.events", partitions=3)
    audit = tmp_path / "audit.jsonl"
    service = ServiceProcess(config, bootstrap, audit, seed=SEED, logs=tmp_path / "logs")
    pacer = EventPacer(bootstrap, f"{prefix}.events", rate=RATE, seed=SEED)
    try:
        before = start_with_traffic(service, pacer, audit, releases=2)
        service.kill()
        time.sleep(2 * (LATENESS + grace) + 2 * WINDOW)  # well past every missed window's lateness and grace
        service.start()
        wait_for(lambda: audit_line_count(audit) >= before + 12, 90, "the backlog's releases", on_timeout=service.log_tail)
        pacer.pause()
        last_ts = pacer.last_ts
        wait_for(lambda: any(float(w["window_end"]) > last_ts for w in read_audit(audit)), 60,
                 "the window of the last event", interval=0.1, on_timeout=service.log_tail)
        assert service.terminate() == 0, service.log_tail()
    finally:
        service.cleanup()
        pacer.stop()
    windows = audit_windows(read_audit(audit))
    assert check_events_counted_once(windows, set(pacer.ids), WINDOW) == len(pacer.ids)
    check_ledger_schedule(ledger_rows(tmp_path / "ledger.sqlite"), WINDOW, window_cost(config))
