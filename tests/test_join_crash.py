"""No window released over a partial assignment after a SIGKILL during the join.

`monitor run` (both stages, a real subprocess) on 3 input partitions, 2-second windows,
50 devices keyed by device (also the entity field), events produced in real time. The
service is killed with SIGKILL while it joins the consumer groups, several times in a
row, and restarted each time: the dead members stay in the group until their sessions
time out, so the restarted process first gets only some partitions. Stage 2 must not
release a window until every input partition has reported it (or the public grace has
passed, longer than a session timeout plus a rejoin). Afterwards, from the test-only
audit file and the ledger:

- every produced event is counted in exactly one released window, none is lost;
- every window is in the ledger once, consecutive, each charged the window cost;
- every alert matches its ledger row byte for byte.
"""

from __future__ import annotations

import random
import time

import pytest

from streamkit import (
    KeyedPacer,
    ServiceProcess,
    audit_line_count,
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
    wait_for,
    window_cost,
    write_config,
    write_model,
)

pytestmark = [pytest.mark.slow, pytest.mark.broker]

SEED = 20261123
WINDOW = 2.0
LATENESS = 1.0
GRACE = 20.0  # > session timeout (2 s on the test broker) + rejoin + catch-up
DEVICES = 50
RATE = 20.0
PARTITIONS = 3
ROUNDS = 2  # each round: several kills during the join, then a restart that settles
KILLS_PER_ROUND = 2


def _joining(service: ServiceProcess) -> bool:
    """The process is up and talking to the broker, before its groups have settled."""
    path = service._log_path
    return bool(path and path.exists() and "metrics on" in path.read_text(errors="replace"))


def test_sigkill_during_the_join_counts_every_event_once(tmp_path, fresh_broker):
    require_service()
    rng = random.Random(SEED)
    bootstrap = fresh_broker.bootstrap_servers
    prefix = "join"
    model = write_model(tmp_path / "model.json", seed=SEED)
    # No cap on the backlog (window.max_catch_up_windows): on a slow machine the kills in a row kept
    # the monitor down for more than 24 windows, and the oldest were suppressed with their events.
    config = write_config(tmp_path, bootstrap=bootstrap, model_path=model, prefix=prefix, window_seconds=WINDOW,
                          lateness_seconds=LATENESS, grace_seconds=GRACE, entity_field="device_id",
                          window={"max_catch_up_windows": None})
    create_topic(bootstrap, f"{prefix}.events", partitions=PARTITIONS)
    audit = tmp_path / "audit.jsonl"
    service = ServiceProcess(config, bootstrap, audit, seed=SEED, logs=tmp_path / "logs")
    pacer = KeyedPacer(bootstrap, f"{prefix}.events", rate=RATE, seed=SEED, devices=DEVICES, window=WINDOW)
    try:
        service.start()
        wait_for(lambda: audit_line_count(audit) >= 1, 60, "the first window release", on_timeout=service.log_tail)
        pacer.start()
        for _ in range(ROUNDS):
            before = audit_line_count(audit)
            wait_for(lambda: audit_line_count(audit) >= before + 2, 60, "releases before the kills",
                     on_timeout=service.log_tail)
            service.kill()
            for _ in range(KILLS_PER_ROUND):
                service.start()
                wait_for(lambda: _joining(service), 30, "the restarted process to reach the broker",
                         interval=0.02, on_timeout=service.log_tail)
                time.sleep(rng.uniform(0.0, 1.5))  # inside the join of one of the two groups
                service.kill()
                time.sleep(rng.uniform(0.0, 2 * WINDOW))  # windows fall due while it is down
            service.start()
        time.sleep(2 * WINDOW)
        pacer.stop()
        wait_for(lambda: any(float(w["window_end"]) > pacer.last_ts for w in read_audit(audit)), 90,
                 "the window of the last event", interval=0.1, on_timeout=service.log_tail)
        service.ensure_alive()
        assert service.terminate() == 0, service.log_tail()
    finally:
        service.cleanup()
        if pacer._thread.is_alive():
            pacer.stop()

    produced = set(pacer.entity)
    assert len(set(pacer.partition.values())) == PARTITIONS
    windows = audit_windows(read_audit(audit))
    counted = check_events_counted_once(windows, produced, WINDOW)
    assert counted == len(produced) > 10 * RATE
    entries = ledger_rows(tmp_path / "ledger.sqlite")
    cost = window_cost(config)
    starts = check_ledger_schedule(entries, WINDOW, cost)
    assert set(windows) == set(starts), "audited windows and ledger windows differ"
    assert abs(check_budget_spent(entries, cost) - len(starts) * cost[0]) < 1e-6
    stats = check_alerts_match_ledger(read_topic(bootstrap, f"{prefix}.alerts"), entries)
    assert stats["windows"] == len(starts)
    assert service.kills == ROUNDS * (1 + KILLS_PER_ROUND)
    print(f"\njoin crash: {service.kills} SIGKILLs ({ROUNDS * KILLS_PER_ROUND} during the join), {len(starts)} windows, "
          f"{counted} events from {DEVICES} devices on {PARTITIONS} partitions counted once")
