"""`monitor replay` as a user runs it: a JSON-lines file in, one alert record per window out.

Real processes (`monitor fit`, `monitor replay`, `monitor alerts`), real files and real
ledgers: the replay must page on a clustered surge, send a malformed line to the dead
letters with its reason, charge one backtest ledger per input content that remembers (a
window is drawn once, however often or under whatever name the data is replayed, and the
lifetime cap holds across replays), charge a given ledger once however often the same
range is replayed, list each page in its summary, refuse a ledger a running monitor holds,
and leave neither a partial output file nor a lock file behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from monitor.budget import WindowLedger
from monitor.budget.plan import iso
from monitor.data.traffic import Surge, Traffic

REPO = Path(__file__).resolve().parent.parent
T0 = 1_700_000_050.0  # not on the window grid: the first whole window starts at 1_700_000_100
WINDOW = 300.0
WINDOWS = 20
SURGE_AT = 15  # window index from T0's first whole window
FIRST = 1_700_000_100.0


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


def _run(workdir: Path, out: str, *extra: str, start: str = str(T0), end: str = str(T0 + (WINDOWS + 1) * WINDOW)):
    return _monitor("replay", "--input", "events.jsonl", "--start", start, "--end", end, "--output", out, *extra, cwd=workdir)


def _replay(workdir: Path, out: str, *extra: str, **times: str) -> list[dict]:
    res = _run(workdir, out, *extra, **times)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in (workdir / out).read_text().splitlines()]


@pytest.fixture(scope="module")
def records(workdir) -> list[dict]:
    return _replay(workdir, "alerts.jsonl", "--ledger", "monitor-ledger.sqlite")


def test_replay_writes_every_window_in_order_and_pages_on_the_surge(workdir, records):
    starts = [r["window_start"] for r in records]
    assert len(records) == WINDOWS and starts == sorted(starts) and all(b - a == WINDOW for a, b in zip(starts, starts[1:]))
    assert all(isinstance(r["alarm"], bool) for r in records)
    states = [r["alarm_detail"]["state"] for r in records]
    assert states[:11] == ["warming_up"] * 11 and "fired" not in states[:SURGE_AT]
    assert states[SURGE_AT] == "fired" and records[SURGE_AT]["report"]["reason"] == "alarm"
    dead = (workdir / "alerts.jsonl.dead-letter.jsonl").read_text().splitlines()
    assert len(dead) == 1 and json.loads(dead[0])["line"] == 1 and json.loads(dead[0])["reason"] == "missing_field"


def test_replaying_the_same_range_into_a_given_ledger_charges_nothing_and_writes_what_was_stored(workdir, records):
    with WindowLedger(workdir / "monitor-ledger.sqlite") as led:
        before = led.charge_counts(-1e12, 1e12)
    again = _replay(workdir, "again.jsonl", "--ledger", "monitor-ledger.sqlite")
    assert again == records
    with WindowLedger(workdir / "monitor-ledger.sqlite") as led:
        assert led.charge_counts(-1e12, 1e12) == before


def _events_digest(workdir: Path, input_name: str) -> str:
    from monitor.config import load_config
    from monitor.stream.replay import scan_input

    return scan_input(load_config(workdir / "config.yaml"), workdir / input_name).events_digest


def _backtest_ledger(workdir: Path, input_name: str, stem: str | None = None) -> Path:
    """Where a fresh backtest ledger of ``input_name`` is: named by its events' digest."""
    digest = _events_digest(workdir, input_name)[:16]
    return workdir / "backtest-ledgers" / f"{stem or Path(input_name).stem}-{digest}.sqlite"


def _other_data(workdir: Path, name: str) -> Path:
    """events.jsonl and one more valid event, long before --start (so no window changes):
    other events, so a backtest ledger of their own, apart from the other tests'."""
    shutil.copyfile(workdir / "events.jsonl", workdir / name)
    with open(workdir / name, "a") as f:
        f.write(json.dumps({"device_id": f"extra-{name}", "ts": T0 - 100 * WINDOW, "heart_rate": 70.0, "spo2": 97.0,
                            "skin_temp": 34.0, "resp_rate": 14.0, "activity": 1.0}) + "\n")
    return workdir / name


def _summary(res: subprocess.CompletedProcess) -> str:
    return " ".join(res.stdout.split())


def test_a_backtest_charges_the_inputs_own_ledger_which_remembers_and_lists_each_page(workdir, records):
    """`--start 2023-11-14T22:14:10Z` is accepted and echoed as written; a backtest charges the
    input's backtest ledger (the config's ledger untouched), its summary lists each page (time,
    headline, epsilon) and what the ledger has spent, and a second run writes the stored
    records byte for byte and charges nothing: no fresh noise to average."""
    config_ledger = workdir / "monitor-ledger.sqlite"
    mtime = config_ledger.stat().st_mtime_ns
    ledger = _backtest_ledger(workdir, "events.jsonl")
    start, end = "2023-11-14T22:14:10Z", "2023-11-14T23:59:10+00:00"  # T0 and T0 + 21 windows
    res = _run(workdir, "bt.jsonl", start=start, end=end)
    assert res.returncode == 0, res.stderr
    assert "[2023-11-14T22:14:10Z, 2023-11-14T23:59:10Z)" in res.stderr and "e+09" not in res.stderr + res.stdout
    assert "the backtest ledger of this input" in res.stderr and str(ledger.relative_to(workdir)) in res.stderr
    out = _summary(res)
    assert "outside [--start, --end)" in out and " 0 outside" in out, out
    assert f"windows {WINDOWS} of 300 s, {WINDOWS} written pages" in out, out
    first = [json.loads(x) for x in (workdir / "bt.jsonl").read_text().splitlines()]
    assert [r["window_start"] for r in first] == [r["window_start"] for r in records]
    assert first != records  # drawn in its own ledger, not the given ledger's stored records
    assert config_ledger.stat().st_mtime_ns == mtime
    # each page: its time, its report's headline and what it cost
    fired = [r for r in first if r["alarm_detail"]["state"] == "fired"]
    assert fired and f"pages {len(fired)} " in out, out
    for r in fired:
        assert f"{iso(r['window_start'])} {r['report']['headline']} (epsilon {r['epsilon']:.3g})" in out, out
    with WindowLedger(ledger) as led:
        assert len(led.entries()) == WINDOWS
        total = led.total_epsilon()
    charged = float(out.split("epsilon charged ")[1].split()[0])
    assert charged == pytest.approx(sum(r["epsilon"] for r in first), rel=1e-3) and total == pytest.approx(charged, rel=1e-3)
    assert f"{total:.4g} since the ledger began (no cap" in out and str(ledger.relative_to(workdir)) in out, out
    assert not list(workdir.rglob("*.lock")), list(workdir.rglob("*.lock"))  # no stray lock file

    # the same backtest again: the stored records byte for byte, nothing charged
    written = (workdir / "bt.jsonl").read_bytes()
    again = _run(workdir, "bt.jsonl", start=start, end=end)
    assert again.returncode == 0, again.stderr
    assert (workdir / "bt.jsonl").read_bytes() == written
    out = _summary(again)
    assert f"{WINDOWS} of them as stored in the ledger by an earlier replay" in out and "epsilon charged 0 by" in out, out
    assert f"{total:.4g} since the ledger began" in out, out
    with WindowLedger(ledger) as led:
        assert led.total_epsilon() == total

    # another setting on the same data: --redraw draws afresh, charged on top of the first draw
    redrawn = _run(workdir, "bt.jsonl", "--redraw", start=start, end=end)
    assert redrawn.returncode == 0, redrawn.stderr
    draw2 = ledger.with_name(ledger.stem + ".draw2.sqlite")
    assert f"a fresh draw in {draw2.relative_to(workdir)}" in redrawn.stderr, redrawn.stderr
    fresh = (workdir / "bt.jsonl").read_bytes()
    assert fresh != written
    out = _summary(redrawn)
    charged2 = float(out.split("epsilon charged ")[1].split()[0])
    assert charged2 > 0 and "draw 2: it holds the charges of draws 1 to 1 too" in out, out
    with WindowLedger(draw2) as led:
        assert led.total_epsilon() == pytest.approx(total + charged2, rel=1e-3)
    assert f"{total + charged2:.4g} since the ledger began" in out, out
    with WindowLedger(ledger) as led:
        assert led.total_epsilon() == total  # the first draw is kept as it was
    # a plain replay now writes the latest draw as stored
    assert _run(workdir, "bt.jsonl", start=start, end=end).returncode == 0
    assert (workdir / "bt.jsonl").read_bytes() == fresh
    assert sorted(p.name for p in (workdir / "backtest-ledgers").iterdir() if "events-" in p.name) == sorted(
        [ledger.name, draw2.name])


def test_replays_of_the_same_data_add_up_against_one_lifetime_cap(workdir):
    """Three replays of one content (the second over a longer range, the third a copy under
    another name with another setting) charge one ledger: the first pays the baseline and the
    alarm run, the second a run and the page but not the report the lifetime cap no longer pays
    for, the third nothing (its records are the stored ones, byte for byte, not a fresh draw)."""
    _other_data(workdir, "capped.jsonl")
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    # Pays the first replay's baseline and alarm run (0.87), then the second's own run (0.6: a
    # replay resumes like a restart) and its page (0.5), but not the page's report (0.28).
    config["budget"]["lifetime_epsilon"] = 2.0
    (workdir / "capped.yaml").write_text(yaml.safe_dump(config))
    ledger = _backtest_ledger(workdir, "capped.jsonl")

    def replay(name: str, out: str, config: str, windows: int) -> tuple[str, list[dict]]:
        res = _monitor("replay", "-c", config, "--input", name, "--start", str(T0), "--end", str(FIRST + windows * WINDOW),
                       "--output", out, cwd=workdir)
        assert res.returncode == 0, res.stderr
        assert str(ledger.relative_to(workdir)) in res.stderr, res.stderr
        return _summary(res), [json.loads(x) for x in (workdir / out).read_text().splitlines()]

    out1, first = replay("capped.jsonl", "capped-1.jsonl", "capped.yaml", SURGE_AT)  # warm-up, baseline, quiet run
    spent1 = sum(r["epsilon"] for r in first)
    assert spent1 > 0 and "pages 0" in out1 and f"{spent1:.4g} since the ledger began (cap 2)" in out1, out1

    out2, second = replay("capped.jsonl", "capped-2.jsonl", "capped.yaml", WINDOWS)
    assert second[:SURGE_AT] == first  # stored, not redrawn
    assert f"{SURGE_AT} of them as stored" in out2, out2
    page = second[SURGE_AT]
    assert page["alarm_detail"]["state"] == "fired" and page["report"] == {"reason": "alarm", "suppressed": "budget"}
    assert page["budget"]["epsilon_lifetime_limit"] == 2.0
    with WindowLedger(ledger) as led:
        total = led.total_epsilon()
    assert total == pytest.approx(spent1 + page["epsilon"]) and spent1 < total <= 2.0
    assert page["budget"]["epsilon_lifetime_spent"] == pytest.approx(total)
    assert f"{total:.4g} since the ledger began (cap 2)" in out2 and "alarm: suppressed (budget)" in out2, out2

    # the same bytes under another name, with another setting: the same ledger, the stored records
    shutil.copyfile(workdir / "capped.jsonl", workdir / "capped-copy.jsonl")
    config["report"]["epsilon_grids"] = 0.4
    (workdir / "capped-b.yaml").write_text(yaml.safe_dump(config))
    out3, third = replay("capped-copy.jsonl", "capped-3.jsonl", "capped-b.yaml", WINDOWS)
    assert (workdir / "capped-3.jsonl").read_bytes() == (workdir / "capped-2.jsonl").read_bytes()
    assert f"{WINDOWS} of them as stored" in out3 and "epsilon charged 0 by" in out3, out3
    with WindowLedger(ledger) as led:
        assert led.total_epsilon() == total
    assert [p.name for p in (workdir / "backtest-ledgers").glob("capped*")] == [ledger.name]

    # a fresh draw is charged on top, so the cap leaves it nothing to page or report with
    res = _monitor("replay", "-c", "capped.yaml", "--input", "capped.jsonl", "--start", str(T0),
                   "--end", str(FIRST + WINDOWS * WINDOW), "--output", "capped-4.jsonl", "--redraw", cwd=workdir)
    assert res.returncode == 0, res.stderr
    fourth = [json.loads(x) for x in (workdir / "capped-4.jsonl").read_text().splitlines()]
    assert not any(r["alarm_detail"]["state"] == "fired" or r["report"] for r in fourth)
    with WindowLedger(ledger.with_name(ledger.stem + ".draw2.sqlite")) as led:
        assert total <= led.total_epsilon() <= 2.0
        assert led.total_epsilon() == pytest.approx(total + sum(r["epsilon"] for r in fourth))


def test_alerts_reads_a_backtests_file_with_the_topics_display(workdir, records):
    """`monitor alerts --input alerts.jsonl`: the replay's output as the same table (or JSON
    lines) the alerts topic gives, without a config or a broker."""
    res = _monitor("alerts", "--input", "alerts.jsonl", cwd=workdir)
    assert res.returncode == 0, res.stderr
    head, *rows = res.stdout.splitlines()
    assert head.split()[:4] == ["window", "(UTC)", "alarm", "epsilon"] and len(rows) == len(records)
    assert f"{len(records)} window(s) in alerts.jsonl" in res.stderr
    paged = records[SURGE_AT]
    row = rows[SURGE_AT].split()
    assert row[0].startswith(iso(paged["window_start"])) and row[1] == "fired" and row[2] == f"{paged['epsilon']:.3g}"
    assert rows[SURGE_AT].endswith(paged["report"]["headline"])
    as_json = _monitor("alerts", "--input", "alerts.jsonl", "--json", cwd=workdir)
    assert [json.loads(x) for x in as_json.stdout.splitlines()] == records


def test_epoch_milliseconds_for_start_get_a_hint(workdir):
    res = _run(workdir, "ms.jsonl", start=str(int(T0 * 1000)))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "looks like milliseconds" in res.stderr and str(int(T0)) in res.stderr, res.stderr
    assert not (workdir / "ms.jsonl").exists()


@pytest.mark.parametrize("end", [T0 - 3600, T0])
def test_end_before_start_is_said_plainly(workdir, end):
    res = _run(workdir, "reversed.jsonl", end=str(end))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "--end" in res.stderr and ("is before --start" if end < T0 else "is the same as --start") in res.stderr, res.stderr
    assert "hold no whole window" not in res.stderr
    assert not (workdir / "reversed.jsonl").exists()


def test_replay_over_windows_the_ledger_holds_as_suppressed_does_not_crash(workdir, records):
    """After a restart a ledger holds a `catch_up` span (no payload); replaying over it crashed."""
    ledger = workdir / "restarted.sqlite"
    with WindowLedger(ledger) as led:
        led.record_suppressed(FIRST + 2 * WINDOW, FIRST + 6 * WINDOW, reason="catch_up")
        led.record_suppressed(FIRST + 8 * WINDOW, FIRST + 9 * WINDOW, reason="budget")
    res = _run(workdir, "restarted.jsonl", "--ledger", str(ledger))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    written = [json.loads(x)["window_start"] for x in (workdir / "restarted.jsonl").read_text().splitlines()]
    skipped = {FIRST + i * WINDOW for i in (2, 3, 4, 5, 8)}
    assert len(written) == WINDOWS - 5 and not skipped & set(written)
    assert "5 suppressed in the ledger" in " ".join(res.stdout.split()), res.stdout


def test_replay_refuses_a_ledger_a_running_monitor_holds(workdir):
    """Replay into a live ledger spent that monitor's budget without a word."""
    from monitor.lockfile import LedgerLock

    ledger = workdir / "live.sqlite"
    (workdir / "live-out.jsonl").write_text("earlier output\n")
    with LedgerLock(ledger):  # as `monitor run` holds it
        res = _run(workdir, "live-out.jsonl", "--ledger", str(ledger))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"pid {os.getpid()}" in res.stderr and "running monitor" in res.stderr and "Leave out --ledger" in res.stderr
    assert (workdir / "live-out.jsonl").read_text() == "earlier output\n"
    assert not ledger.exists()


def test_a_failed_replay_leaves_no_partial_output(workdir, monkeypatch):
    from monitor.config import load_config
    from monitor.release import WindowReleaser
    from monitor.stream.replay import replay

    calls = []
    real = WindowReleaser.release

    def failing(self, window, released_at):
        calls.append(window.start)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        return real(self, window, released_at)

    monkeypatch.setattr(WindowReleaser, "release", failing)
    monkeypatch.chdir(workdir)  # the config's relative ledger folder
    _other_data(workdir, "failing.jsonl")
    out = workdir / "failed.jsonl"
    with pytest.raises(OSError):
        replay(load_config(workdir / "config.yaml"), workdir / "failing.jsonl", T0, T0 + (WINDOWS + 1) * WINDOW, out,
               workdir / "failed.dead.jsonl", rng=1)
    assert len(calls) == 5 and not out.exists()
    assert not [p for p in workdir.glob("*failed.jsonl*")] and not list(workdir.rglob("*.lock"))
    # the windows released before the failure stay charged: a rerun writes them as stored
    with WindowLedger(_backtest_ledger(workdir, "failing.jsonl")) as led:
        assert len(led.entries()) == 4


def _variants(path: Path) -> dict[str, bytes]:
    """The same events in four other forms: a blank line appended, each line's keys in
    reverse order, the lines shuffled, and compact JSON with integral floats as integers
    (what `jq -c` writes)."""
    data = path.read_bytes()
    lines = data.splitlines()

    def compact(obj):
        return {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in obj.items()}

    shuffled = list(lines)
    np.random.default_rng(5).shuffle(shuffled)
    return {
        "blank": data + b"\n",
        "keys": b"".join(json.dumps(dict(reversed(json.loads(x).items()))).encode() + b"\n" for x in lines),
        "lines": b"\n".join(shuffled) + b"\n",
        "compact": b"".join(json.dumps(compact(json.loads(x)), separators=(",", ":")).encode() + b"\n" for x in lines),
    }


def test_the_same_events_in_another_form_share_one_ledger_and_other_events_do_not(workdir):
    """A blank line, reordered keys, reordered lines or `jq -c` are the same events: the
    replay finds their ledger and writes its windows as stored (no new draw, no charge, no
    new ledger file). One event changed is other data: a ledger of its own, charged."""
    base = _other_data(workdir, "same.jsonl")
    folder = workdir / "backtest-ledgers"
    ledger = _backtest_ledger(workdir, "same.jsonl")
    end = str(FIRST + WINDOWS * WINDOW)
    first = _monitor("replay", "--input", "same.jsonl", "--start", str(T0), "--end", end, "--output", "same-out.jsonl",
                     cwd=workdir)
    assert first.returncode == 0, first.stderr
    written = (workdir / "same-out.jsonl").read_bytes()
    with WindowLedger(ledger) as led:
        total = led.total_epsilon()
    assert total > 0
    files = sorted(p.name for p in folder.iterdir())
    variants = _variants(base)
    assert len(set(variants.values()) | {base.read_bytes()}) == 5  # five different files
    for name, data in variants.items():
        (workdir / f"same-{name}.jsonl").write_bytes(data)
        assert _events_digest(workdir, f"same-{name}.jsonl") == _events_digest(workdir, "same.jsonl"), name
        res = _monitor("replay", "--input", f"same-{name}.jsonl", "--start", str(T0), "--end", end,
                       "--output", f"same-{name}-out.jsonl", cwd=workdir)
        assert res.returncode == 0, res.stderr
        out = _summary(res)
        assert f"{WINDOWS} of them as stored" in out and "epsilon charged 0 by" in out, (name, out)
        assert str(ledger.relative_to(workdir)) in res.stderr, (name, res.stderr)
        assert (workdir / f"same-{name}-out.jsonl").read_bytes() == written, name
        assert sorted(p.name for p in folder.iterdir()) == files, name
        with WindowLedger(ledger) as led:
            assert led.total_epsilon() == total, name

    # one event's heart rate one beat higher: other events, another ledger, drawn and charged
    lines = base.read_text().splitlines()
    event = json.loads(lines[100])
    event["heart_rate"] += 1.0
    lines[100] = json.dumps(event)
    (workdir / "same-but-one.jsonl").write_text("\n".join(lines) + "\n")
    other = _backtest_ledger(workdir, "same-but-one.jsonl", stem="same_but_one")
    assert other != ledger and not other.exists()
    res = _monitor("replay", "--input", "same-but-one.jsonl", "--start", str(T0), "--end", end,
                   "--output", "same-but-one-out.jsonl", cwd=workdir)
    assert res.returncode == 0, res.stderr
    assert "of them as stored" not in _summary(res) and other.exists(), _summary(res)
    with WindowLedger(other) as led:
        assert led.total_epsilon() > 0
    with WindowLedger(ledger) as led:
        assert led.total_epsilon() == total


def test_a_ledger_named_by_the_files_bytes_is_taken_over_not_forgotten(workdir):
    """A backtest ledger named the old way (sha256 of the file's bytes) is the next replay's:
    renamed to the events' name and its windows written as stored; where the events have a
    ledger already, the old one's charges are added to it (once) and the file is kept aside."""
    base = _other_data(workdir, "legacy.jsonl")
    end = str(FIRST + WINDOWS * WINDOW)
    folder = workdir / "backtest-ledgers"

    def run(out: str) -> str:
        res = _monitor("replay", "--input", "legacy.jsonl", "--start", str(T0), "--end", end, "--output", out, cwd=workdir)
        assert res.returncode == 0, res.stderr
        return _summary(res)

    run("legacy-1.jsonl")
    new = _backtest_ledger(workdir, "legacy.jsonl")
    with WindowLedger(new) as led:
        total = led.total_epsilon()
    old = folder / f"legacy-{hashlib.sha256(base.read_bytes()).hexdigest()[:16]}.sqlite"
    os.replace(new, old)  # as an earlier version named it
    out = run("legacy-2.jsonl")
    assert "taken over" in out and f"{WINDOWS} of them as stored" in out and "epsilon charged 0 by" in out, out
    assert new.exists() and not old.exists()
    assert (workdir / "legacy-2.jsonl").read_bytes() == (workdir / "legacy-1.jsonl").read_bytes()
    with WindowLedger(new) as led:
        assert led.total_epsilon() == pytest.approx(total)

    # both: the old one's charges join the events' ledger once, the old file is kept aside
    shutil.copyfile(new, old)
    out = run("legacy-3.jsonl")
    assert "its charges added to" in out and f"{WINDOWS} of them as stored" in out, out
    assert not old.exists() and old.with_name(old.name + f".folded-into-{new.stem.rsplit('-', 1)[1]}").exists()
    with WindowLedger(new) as led:
        assert led.total_epsilon() == pytest.approx(2 * total)
    out = run("legacy-4.jsonl")
    assert "taken over" not in out
    with WindowLedger(new) as led:
        assert led.total_epsilon() == pytest.approx(2 * total)
    assert (workdir / "legacy-4.jsonl").read_bytes() == (workdir / "legacy-1.jsonl").read_bytes()


def test_a_file_out_of_time_order_releases_what_the_sorted_file_releases(workdir, monkeypatch):
    """Streaming closes a window once the rest of the file holds none of its events: a
    shuffled file keeps every event (none late) and, with the same noise, releases the same
    records as the sorted one; the sorted file holds a few windows open at a time, the
    shuffled one all of them."""
    from monitor.config import load_config
    from monitor.stream import replay as replay_module

    monkeypatch.chdir(workdir)
    monkeypatch.setattr(replay_module, "_BATCH_LINES", 512)  # many batches in this small file
    config = load_config(workdir / "config.yaml")
    lines = (workdir / "events.jsonl").read_bytes().splitlines()
    shuffled = list(lines)
    np.random.default_rng(8).shuffle(shuffled)
    (workdir / "order-shuffled.jsonl").write_bytes(b"\n".join(shuffled) + b"\n")
    results = {}
    for name in ("events.jsonl", "order-shuffled.jsonl"):
        s = replay_module.replay(config, workdir / name, T0, FIRST + WINDOWS * WINDOW, workdir / f"order-{name}.out",
                                 workdir / f"order-{name}.dead", rng=7, ledger_path=workdir / f"order-{name}.sqlite")
        results[name] = s
    a, b = results["events.jsonl"], results["order-shuffled.jsonl"]
    assert a["accepted"] == b["accepted"] == len(lines) - 1 and "late" not in a and "late" not in b
    assert (workdir / "order-events.jsonl.out").read_bytes() == (workdir / "order-order-shuffled.jsonl.out").read_bytes()
    assert a["open_windows_peak"] <= 3 and b["open_windows_peak"] == WINDOWS  # a batch spans 3 windows at most
    assert a["dead_letter"] == b["dead_letter"] == 1


def test_a_file_that_changes_during_the_replay_is_refused(workdir, monkeypatch):
    """The ledger was picked by the first pass's digest: events appended while the second
    pass reads would be released under another file's ledger."""
    from monitor.config import load_config
    from monitor.errors import MonitorError
    from monitor.stream import replay as replay_module

    monkeypatch.chdir(workdir)
    monkeypatch.setattr(replay_module, "_BATCH_LINES", 512)
    monkeypatch.setattr(replay_module, "_PROGRESS_LINES", 512)
    path = _other_data(workdir, "growing.jsonl")

    def append(_lines: int) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({"device_id": "late-comer", "ts": FIRST + 3 * WINDOW, "heart_rate": 70.0, "spo2": 97.0,
                                "skin_temp": 34.0, "resp_rate": 14.0, "activity": 1.0}) + "\n")

    out = workdir / "growing-out.jsonl"
    with pytest.raises(MonitorError, match="changed during the replay"):
        replay_module.replay(load_config(workdir / "config.yaml"), path, T0, FIRST + WINDOWS * WINDOW, out,
                             workdir / "growing.dead", rng=1, progress=append)
    assert not out.exists() and not list(workdir.rglob("*.lock"))
