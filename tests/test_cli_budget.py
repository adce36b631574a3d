"""`monitor budget | less`: the latest windows as a user reads them.

A paging window's row in the ledger holds only its own share (the report, 0.45) while its
record says what the window charged in all (the page and the report, 0.95); the window
that opened a run holds 0 in its row. The table shows the record's whole charge and the
alarm state, and piped output keeps every timestamp whole.
"""

from __future__ import annotations

import json
import re

from monitor.budget import WindowLedger
from tests.test_first_hour import monitor, workdir  # noqa: F401 - fixture

START = 1_763_700_000.0


def _record(start: float, state: str, epsilon: float, report=None) -> str:
    return json.dumps({"window_start": start, "window_end": start + 2, "released_at": start + 2.5, "alarm": state == "fired",
                       "alarm_detail": {"state": state}, "report": report, "epsilon": epsilon, "delta": 0.0})


def test_latest_windows_show_the_whole_charge_the_alarm_state_and_whole_timestamps(workdir):  # noqa: F811
    with WindowLedger(workdir / "ledger.sqlite") as led:
        led.add_charge("alarm_run", START, START + 2, 0.6)
        led.record_release(START, START + 2, 0.0, 0.0, _record(START, "quiet", 0.6))  # opened the run
        led.add_charge("alarm_page", START + 2, START + 4, 0.5)
        led.record_release(START + 2, START + 4, 0.45, 0.0, _record(START + 2, "fired", 0.95, {"reason": "alarm"}))
        led.record_suppressed(START + 4, START + 6, reason="budget")
    res = monitor("budget", cwd=workdir)  # stdout is a pipe here, as with `| less`
    assert res.returncode == 0, res.stderr
    rows = {m.group(1): line for line in res.stdout.splitlines() if (m := re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", line))}
    quiet, fired, suppressed = (rows.get(f"2025-11-21T04:40:0{s}Z") for s in (0, 2, 4))
    assert quiet and fired and suppressed, res.stdout
    assert "quiet" in quiet.split() and "0.6" in quiet.split(), quiet
    assert "fired" in fired.split() and "0.95" in fired.split() and "0.45" not in fired.split(), fired
    assert "budget" in suppressed and "0" in suppressed.split(), suppressed
    assert "2025-11-21T04:40:04Z" in fired  # the end time, whole
    recent = json.loads(monitor("budget", "--json", cwd=workdir).stdout)["stream"]["recent"]
    assert [(w["alarm"], w["epsilon"]) for w in recent] == [("quiet", 0.6), ("fired", 0.95), (None, 0.0)]


def test_budget_shows_what_a_person_lost_since_the_ledger_began(workdir):  # noqa: F811
    # The period budget bounds one rolling period; a person present all along lost the sum.
    with WindowLedger(workdir / "ledger.sqlite") as led:
        for day in range(3):
            led.add_charge("alarm_run", START + day * 86400, START + day * 86400 + 2, 0.6)
            led.record_release(START + day * 86400, START + day * 86400 + 2, 0.45, 0.0, _record(START + day * 86400, "quiet", 1.05))
    res = monitor("budget", cwd=workdir)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "since the ledger began" in ln)
    assert "3.15" in line and "lifetime_epsilon" in line, line
    life = json.loads(monitor("budget", "--json", cwd=workdir).stdout)["stream"]["all_time"]
    assert abs(life["epsilon_spent"] - 3.15) < 1e-9 and life["epsilon_limit"] is None


def _alarm_on(workdir) -> None:  # noqa: F811
    import yaml

    cfg = workdir / "config.yaml"
    data = yaml.safe_load(cfg.read_text())
    data["alarm"] = {"enabled": True}
    data["window"]["size_seconds"] = 300.0
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))


def _seen(res) -> str:
    assert res.returncode == 0, res.stderr
    return next(ln for ln in res.stdout.splitlines() if ln.startswith("What the alarm can see"))


def _percents(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"([\d.]+) %(?! of the time)", line)]


def test_budget_says_what_surge_the_alarm_can_see_before_any_baseline(workdir):  # noqa: F811
    # A new user is told which surge a fleet of each size can see, and what the
    # derived threshold costs in false pages, before anything has run.
    from monitor.alarm.calibrate import fleet_rung, level_ladder, visibility_for
    from monitor.budget.plan import _rung_sight, _seen as seen_by
    from monitor.config import load_config
    from monitor.model.file import load_configured

    _alarm_on(workdir)
    line = _seen(monitor("budget", cwd=workdir))
    assert "300 / 1,500 / 10,000 events per window" in line and "95 % of the time" in line, line
    assert "alarm.false_pages_per_30_days 1" in line and "1 / 1 / 1 false pages per 30 days" in line, line
    shares = _percents(line)
    assert len(shares) == 3 and shares[0] > shares[1] > shares[2] > 0, line  # more people: a smaller share pages
    config = load_config(workdir / "config.yaml")
    model, ladder = load_configured(config), level_ladder(config.alarm)
    # Each traffic at the levels it would move the alarm to, its surge weighed as the model weighs it there.
    expected = [seen_by(visibility_for(config, model, n), _rung_sight(model, config.alarm, ladder[fleet_rung(ladder, n)]))
                .smallest_surge_share for n in (300, 1500, 10000)]
    assert shares == [float(f"{100 * s:.2g}") for s in expected], (line, expected)


def test_budget_uses_the_baseline_in_use_and_announces_a_degenerate_one(workdir):  # noqa: F811
    _alarm_on(workdir)
    baseline = {"rate": 0.04, "events_per_window": 1500.0, "span_start": START - 10800, "span_end": START, "span_windows": 36,
                "epsilon": 0.1, "delta": 0.0, "mechanism": "laplace_global", "rate_error": 0.002}
    with WindowLedger(workdir / "ledger.sqlite") as led:
        rec = json.loads(_record(START, "quiet", 0.0))
        led.record_release(START, START + 300, 0.0, 0.0, json.dumps({**rec, "baseline_in_use": baseline}))
    line = _seen(monitor("budget", cwd=workdir))
    assert "1,500 events per window, from the baseline in use" in line, line
    vis = json.loads(monitor("budget", "--json", cwd=workdir).stdout)["plan"]["visibility"]
    assert vis["source"] == "baseline" and len(vis["at"]) == 1
    # The derived threshold holds the configured false-page rate, and a surge of the stated
    # share clears it: larger than the normal spread, smaller than the whole fleet.
    at = vis["at"][0]
    assert 0.5 < at["false_pages_per_30_days"] <= 1.0 + 1e-6, at
    assert at["threshold"] < at["smallest_surge_share"] * 1500 * (1 - 0.04) < 1500, at

    with WindowLedger(workdir / "ledger.sqlite") as led:
        led.record_release(START + 300, START + 600, 0.0, 0.0,
                           json.dumps({**rec, "window_start": START + 300, "baseline_in_use": {**baseline, "rate": 0.0}}))
    line = _seen(monitor("budget", cwd=workdir))
    assert "baseline in use cannot be used" in line and "normal share is 0" in line, line
    assert "300 / 1,500 / 10,000 events per window" in line, line


def test_budget_without_the_model_file_says_so_in_one_line(workdir):  # noqa: F811
    _alarm_on(workdir)
    (workdir / "model.json").unlink()
    res = monitor("budget", cwd=workdir)
    line = _seen(res)
    assert "model.json (model.path) is missing" in line and "monitor fit" in line, line
    assert "Traceback" not in res.stderr


def _rows(path, rows, header="hr,spo2", labels=None) -> None:
    lines = [header + (",is_anomaly" if labels is not None else "")]
    for k, row in enumerate(rows):
        lines.append(",".join(map(str, row)) + (f",{labels[k]}" if labels is not None else ""))
    path.write_text("\n".join(lines) + "\n")


def test_budget_sizes_the_surge_from_a_file_of_the_users_own_anomalies(workdir):  # noqa: F811
    """`monitor budget --anomalies FILE`: the smallest surge is one of events like the file's, at the
    weight the alarm gives them, not the synthetic probe's guess; events the alarm weighs like
    normal ones are said to be invisible; a labelled file gets its AUROC; bad labels one line."""
    import numpy as np

    _alarm_on(workdir)
    rng = np.random.default_rng(1)
    far = np.column_stack([rng.uniform(150, 190, 60), rng.uniform(80, 85, 60)])  # the reference is 75 +- 10, 96 +- 1.5
    usual = np.column_stack([rng.normal(75, 10, 60), rng.normal(96, 1.5, 60)])
    _rows(workdir / "far.csv", far.round(2).tolist())
    _rows(workdir / "usual.csv", usual.round(2).tolist())
    _rows(workdir / "both.csv", np.vstack([far, usual]).round(2).tolist(), labels=[1] * 60 + [0] * 60)
    probe = _percents(_seen(monitor("budget", cwd=workdir)))
    line = _seen(monitor("budget", "--anomalies", "far.csv", cwd=workdir))
    assert "made of events like the 60 anomalies of far.csv (100 % of them weigh fully" in line, line
    assert _percents(line)[:3] <= probe[:3]  # weighed fully: no larger than the probe's surge
    invisible = _seen(monitor("budget", "--anomalies", "usual.csv", cwd=workdir))
    assert invisible.startswith("What the alarm can see: YOUR ANOMALIES ARE INVISIBLE TO THE ALARM"), invisible
    assert "over 100 %" in invisible, invisible
    labelled = _seen(monitor("budget", "--anomalies", "both.csv", "--labels", "is_anomaly", cwd=workdir))
    assert "the 60 anomalies of both.csv" in labelled and "AUROC 1.000" in labelled, labelled
    assert _percents(labelled)[:3] == _percents(line)[:3]
    bad = monitor("budget", "--anomalies", "far.csv", "--labels", "hr", cwd=workdir)
    assert bad.returncode == 2 and "--labels hr: each row needs 1 (an anomaly) or 0 (normal)" in bad.stderr, bad.stderr
    score = monitor("score", "--input", "both.csv", "--labels", "is_anomaly", cwd=workdir)
    assert score.returncode == 0, score.stderr
    assert "the 60 rows labelled 1 weigh 1.000 on average" in score.stdout and "AUROC 1.000" in score.stdout, score.stdout
    assert "monitor budget --anomalies both.csv --labels is_anomaly" in score.stdout


def test_a_fit_the_alarm_cannot_use_says_so_as_an_error_with_advice_that_fixes_it(workdir):  # noqa: F811
    """Too few reference rows for any level the alarm uses: `monitor fit` writes the model but says,
    as an error, that the alarm cannot use it and what would fix it; a set large enough says nothing.
    Where a sparser level is calibrated on this very model, that is the advice, and it holds there."""
    import numpy as np

    from monitor.config import AlarmSettings
    from monitor.model import GridKNN

    _alarm_on(workdir)
    rng = np.random.default_rng(3)
    _rows(workdir / "small.csv", np.column_stack([rng.normal(75, 10, 150), rng.normal(96, 1.5, 150)]).round(2).tolist())
    small = monitor("fit", "--reference", "small.csv", cwd=workdir)
    assert small.returncode == 0, small.stderr
    errors = [ln for ln in small.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "the alarm cannot use it as configured" in errors[0], small.stderr
    assert "too few to calibrate any level the alarm uses" in errors[0] and "fit on at least about" in errors[0], errors
    need = int(errors[0].split("fit on at least about ")[1].split(" ")[0].replace(",", ""))
    _rows(workdir / "large.csv", np.column_stack([rng.normal(75, 10, need), rng.normal(96, 1.5, need)]).round(2).tolist())
    large = monitor("fit", "--reference", "large.csv", cwd=workdir)
    assert large.returncode == 0 and "error:" not in large.stderr, large.stderr  # the advice fixed it
    # A sparser level where this model calibrates one: the advice names it, and it holds on the model.
    from monitor.model.cli import _check_alarm_levels
    from monitor.config import load_config
    import contextlib
    import io

    X = np.column_stack([rng.normal(75, 10, 2000), rng.normal(96, 1.5, 2000)])
    model = GridKNN(epsilon=1.0, bounds=[(30, 220), (70, 100)], contamination=0.05, random_state=0,
                    feature_names=["hr", "spo2"]).fit(X)
    config = load_config(workdir / "config.yaml")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        _check_alarm_levels(model, config, 2000)
    said = err.getvalue()
    if "set alarm.contamination" in said:
        fix = float(said.split("set alarm.contamination ")[1].split(" ")[0])
        settings = AlarmSettings(contamination=fix, contamination_graded=min(0.5, 10 * fix))
        assert model.rate_accuracy(fix).enough
        from monitor.alarm.calibrate import alarm_levels
        assert alarm_levels(model, settings)[1] < 0.999 * model._score_max()


def _days_of_windows(workdir, fired: set[int], days: int = 3) -> None:  # noqa: F811
    """``days`` of answered 5-minute windows, quiet but for the ``fired`` ones (and one held after each)."""
    _alarm_on(workdir)
    size = 300.0
    with WindowLedger(workdir / "ledger.sqlite") as led:
        for i in range(int(days * 86400 / size)):
            state = "fired" if i in fired else "held" if i - 1 in fired else "quiet"
            start = START + i * size
            led.record_release(start, start + size, 0.0, 0.0, json.dumps({"alarm_detail": {"state": state}, "epsilon": 0.0}))
        led.record_suppressed(START + days * 86400, START + days * 86400 + size, reason="budget")


def test_budget_sets_the_pages_it_published_against_the_promise(workdir):  # noqa: F811
    # Six pages in three days: at the promised 1 false page per 30 days, fewer than 1 % of 3-day spans draw that many.
    _days_of_windows(workdir, fired={10, 200, 400, 500, 700, 800})
    pages = json.loads(monitor("budget", "--json", cwd=workdir).stdout)["stream"]["pages"]
    assert (pages["pages"], pages["answered_days"], pages["per_30_days"], pages["beyond_promise"]) == (6, 3.0, 60.0, True)
    res = monitor("budget", cwd=workdir)
    row = next(ln for ln in res.stdout.splitlines() if "alarm pages, last 30 days" in ln)
    assert "6 in 3 days answered (60 per 30 days" in row, row
    warning = next(ln for ln in res.stdout.splitlines() if ln.startswith("Pages:"))
    assert "paged 6 times in 3 days" in warning and "does not foresee" in warning, warning


def test_one_page_in_three_days_is_within_what_the_promise_draws(workdir):  # noqa: F811
    _days_of_windows(workdir, fired={100})
    pages = json.loads(monitor("budget", "--json", cwd=workdir).stdout)["stream"]["pages"]
    assert (pages["pages"], pages["per_30_days"], pages["beyond_promise"]) == (1, 10.0, False)
    assert pages["warning"] is None
    assert not any(ln.startswith("Pages:") for ln in monitor("budget", cwd=workdir).stdout.splitlines())
