"""`monitor replay` as a user runs it: a JSON-lines file in, one alert record per window out.

Real processes (`monitor fit`, `monitor replay`), real files and a real ledger: the
replay must page on a clustered surge, send a malformed line to the dead letters with
its reason, and charge the ledger once however often the same range is replayed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from monitor.budget import WindowLedger
from monitor.data.traffic import Surge, Traffic

REPO = Path(__file__).resolve().parent.parent
T0 = 1_700_000_050.0  # not on the window grid: the first whole window starts at 1_700_000_100
WINDOW = 300.0
WINDOWS = 20
SURGE_AT = 15  # window index from T0's first whole window


def _monitor(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monitor", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("replay")
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["alarm"].update(baseline_warmup_seconds=12 * WINDOW)
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    fit = _monitor("fit", "--reference", str(REPO / "monitor/data/reference-vitals.csv"), "--seed", "1", cwd=tmp)
    assert fit.returncode == 0, fit.stderr
    traffic = Traffic(people=500, days=1, seed=3)
    surge = Surge(start=SURGE_AT, windows=2, share=0.3, kind="clustered", center=(84.0, 150.0))
    rng = np.random.default_rng(3)
    first = np.ceil(T0 / WINDOW) * WINDOW
    with open(tmp / "events.jsonl", "w") as f:
        f.write('{"device_id": "broken", "ts": "not a time"}\n')
        for i in range(WINDOWS):
            X, entities, _ = traffic.window(i, [surge])
            for x, e in zip(X, entities):
                event = {"device_id": e, "ts": float(first + i * WINDOW + rng.uniform(0, WINDOW - 1)),
                         **dict(zip(traffic.sim.feature_names, map(float, x)))}
                f.write(json.dumps(event) + "\n")
    return tmp


def _replay(workdir: Path, out: str) -> list[dict]:
    res = _monitor("replay", "--input", "events.jsonl", "--start", str(T0), "--end", str(T0 + (WINDOWS + 1) * WINDOW),
                   "--output", out, cwd=workdir)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in (workdir / out).read_text().splitlines()]


@pytest.fixture(scope="module")
def records(workdir) -> list[dict]:
    return _replay(workdir, "alerts.jsonl")


def test_replay_writes_every_window_in_order_and_pages_on_the_surge(workdir, records):
    starts = [r["window_start"] for r in records]
    assert len(records) == WINDOWS and starts == sorted(starts) and all(b - a == WINDOW for a, b in zip(starts, starts[1:]))
    assert all(isinstance(r["alarm"], bool) for r in records)
    states = [r["alarm_detail"]["state"] for r in records]
    assert states[:11] == ["warming_up"] * 11 and "fired" not in states[:SURGE_AT]
    assert states[SURGE_AT] == "fired" and records[SURGE_AT]["report"]["reason"] == "alarm"
    dead = (workdir / "alerts.jsonl.dead-letter.jsonl").read_text().splitlines()
    assert len(dead) == 1 and json.loads(dead[0])["line"] == 1 and json.loads(dead[0])["reason"] == "missing_field"


def test_replaying_the_same_range_again_charges_nothing_and_writes_what_was_stored(workdir, records):
    with WindowLedger(workdir / "monitor-ledger.sqlite") as led:
        before = led.charge_counts(-1e12, 1e12)
    again = _replay(workdir, "again.jsonl")
    assert again == records
    with WindowLedger(workdir / "monitor-ledger.sqlite") as led:
        assert led.charge_counts(-1e12, 1e12) == before
