"""A quiet alarm run goes on over a SIGKILL and a restart of `monitor run` (docs/budget.md, "A
restart"): the alerts after the restart carry the same run, the ledger holds one alarm_run
charge, and the run's threshold noise stays beside the ledger, owner-only."""

from __future__ import annotations

import json

import pytest
import yaml

from streamkit import EventPacer, ServiceProcess, audit_line_count, require_service, wait_for, write_config, write_model

from monitor.budget import WindowLedger
from monitor.budget.run_state import run_state_path

pytestmark = [pytest.mark.slow, pytest.mark.broker]

SEED = 20261208


def _alarm_runs(ledger_path) -> list[tuple]:
    with WindowLedger(ledger_path) as ledger:
        return ledger.span_charges("alarm_run")


def test_a_quiet_run_goes_on_over_a_sigkill_and_a_restart(tmp_path, fresh_broker):
    require_service()
    bootstrap = fresh_broker.bootstrap_servers
    model = write_model(tmp_path / "model.json", seed=SEED)
    config = write_config(tmp_path, bootstrap=bootstrap, model_path=model, prefix="keep", window_seconds=1.0,
                          lateness_seconds=1.0)
    data = yaml.safe_load(config.read_text())
    data["alarm"] = {"enabled": True, "baseline_warmup_seconds": 4.0}
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    ledger = tmp_path / "ledger.sqlite"
    state_file = run_state_path(ledger)
    audit = tmp_path / "audit.jsonl"
    service = ServiceProcess(config, bootstrap, audit, seed=SEED, logs=tmp_path / "logs")
    pacer = EventPacer(bootstrap, "keep.events", rate=100.0, seed=SEED)
    try:
        service.start()
        wait_for(lambda: audit_line_count(audit) >= 1, 90, "the first release", on_timeout=service.log_tail)
        pacer.start()
        wait_for(lambda: state_file.exists() and _alarm_runs(ledger), 60, "an alarm run", on_timeout=service.log_tail)
        saved = json.loads(state_file.read_text())
        assert state_file.stat().st_mode & 0o777 == 0o600
        service.kill()
        before = audit_line_count(audit)
        service.start()
        wait_for(lambda: audit_line_count(audit) >= before + 4, 90, "releases after the restart",
                 on_timeout=service.log_tail)
        service.terminate()
    finally:
        pacer.stop()
        if service.alive:
            service.kill()
    (charge_id, _, start, end, _, _), = _alarm_runs(ledger)  # no second threshold charged
    assert charge_id == saved["charge_id"] and start == saved["span"][0]
    assert json.loads(state_file.read_text())["rho"] == saved["rho"]
    with WindowLedger(ledger) as led:
        records = [json.loads(e.payload) for e in led.entries() if e.released]
    answered = [r["alarm_detail"] for r in records if r["alarm_detail"].get("run") is not None]
    assert len(answered) >= 4 and {d["run"] for d in answered} == {saved["run"]}
    assert {d["state"] for d in answered} == {"quiet"}
