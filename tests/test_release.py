"""release_report (the detailed report) and the WindowReleaser, with no broker."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from monitor import outliers
from monitor.budget import BudgetAccountant, WindowLedger
from monitor.config import ReportSettings, parse_config
from monitor.data.traffic import Surge, Traffic
from monitor.data.vitals import VITAL_FEATURES, simulate_vitals
from monitor.dp import laplace_count
from monitor.model import GridKNN
from monitor.outliers import candidate_subspaces, global_sensitivity_bound, private_count
from monitor.alarm.reference import reference_for
from monitor.budget.run_state import run_state_path
from monitor.release import WindowReleaser, release_report
from monitor.pipeline.windows import ClosedWindow

NAMES = ["hr", "spo2", "temp"]
MECHANISMS = {"laplace_global", "laplace_smooth", "gaussian_smooth", "student_t_smooth_snapped"}
PUBLIC_FIELDS = {"value", "epsilon", "delta", "mechanism", "accuracy"}  # no true value, no data-dependent scale


@pytest.fixture
def window() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    X = np.clip(rng.normal(0.5, 0.05, size=(300, 3)), 0, 1)
    X[:7, 1] = rng.uniform(0.9, 1.0, 7)  # a few outliers along spo2
    flagged = np.zeros(300, dtype=bool)
    flagged[:12] = True
    return X, flagged


def test_report_shape_and_total_cost(window):
    X, flagged = window
    settings = ReportSettings(top_h=2, epsilon_count=0.8)
    unusual = np.zeros((300, 3))
    unusual[:40, 1] = 1.0  # the flagged events are most unusual in spo2
    rec = release_report(X, flagged, settings, NAMES, rng=3, grid_unusual=unusual, grid_names=["hr", "spo2", "temp"],
                         grid_features=[(0,), (1,), (2,)], normal_share=0.01, reason="alarm")
    assert set(rec) == {"event_count", "outlier_count", "flagged_count", "top_subspaces", "top_subspaces_epsilon", "where",
                        "headline", "epsilon", "delta"}
    assert rec["flagged_count"]["mechanism"] == "laplace_global"
    assert rec["flagged_count"]["epsilon"] == settings.epsilon_flagged and rec["flagged_count"]["delta"] == 0.0
    assert rec["event_count"]["epsilon"] == settings.epsilon_events
    assert rec["outlier_count"]["mechanism"] in MECHANISMS
    assert [t["rank"] for t in rec["top_subspaces"]] == [1, 2]
    for t in rec["top_subspaces"]:
        assert t["features"] == [NAMES[i] for i in t["subspace"]]
        assert set(t["count"]) == PUBLIC_FIELDS
    where = rec["where"]
    assert where["epsilon"] == settings.epsilon_grids and where["mechanism"] == "laplace_global"
    assert [p["rank"] for p in where["parts"]] == [1, 2, 3]  # every part of the histogram is published
    assert where["features"] == [f for p in where["parts"] if p["stands_out"] for f in p["features"]]
    for p in where["parts"]:
        assert set(p["flagged_count"]) == PUBLIC_FIELDS and p["flagged_count"]["epsilon"] == settings.epsilon_grids
    assert sum(p["flagged_count"]["value"] for p in where["parts"]) == pytest.approx(rec["flagged_count"]["value"])
    counts = [rec["outlier_count"], rec["flagged_count"], rec["event_count"]] + [t["count"] for t in rec["top_subspaces"]]
    # The histogram is one release: its epsilon is paid once, whatever the number of parts.
    assert rec["epsilon"] == pytest.approx(sum(p["epsilon"] for p in counts) + rec["top_subspaces_epsilon"] + settings.epsilon_grids)
    assert (rec["epsilon"], rec["delta"]) == settings.cost(len(NAMES), 3)
    for p in counts:  # a public interval only where the noise scale is public
        assert (p["accuracy"] is None) == (p["mechanism"] != "laplace_global"), p
        assert p["value"] >= 0
    assert rec["flagged_count"]["accuracy"] == pytest.approx(math.log(20) / settings.epsilon_flagged)
    # 12 flagged events against Laplace noise of scale 5 per part: nothing stands out for all parts at once.
    assert rec["headline"].startswith("surge in " + where["features"][0] if where["features"] else
                                      "surge, no single feature stands out")
    json.dumps(rec)  # plain JSON types only


def test_shipped_report_costs_at_most_0_3_and_publishes_no_seed_count():
    cfg = parse_config({"features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES]})
    assert cfg.report_cost()[0] <= 0.3 and cfg.report_cost()[1] == 0.0
    repo = Path(__file__).resolve().parent.parent / "config.yaml"
    from monitor.config import load_config
    shipped = load_config(repo)
    assert shipped.report_cost()[0] <= 0.3
    assert shipped.report.epsilon_count is None and shipped.report.top_h == 0
    rec = release_report(np.zeros((5, 5)), np.zeros(5, bool), shipped.report, shipped.feature_names, rng=1)
    assert rec["outlier_count"] is None and rec["top_subspaces"] == []


def test_accuracy_is_the_noise_95_percent_interval_and_never_data_dependent():
    # laplace_count: scale 1/epsilon, so +-ln(20)/epsilon holds 95 % of the draws.
    rels = [laplace_count(50, 0.5, rng=np.random.default_rng(s)) for s in range(4000)]
    acc = rels[0].accuracy
    assert acc == pytest.approx(math.log(20) / 0.5)
    inside = np.mean([abs(r.value - 50) <= acc for r in rels])
    assert 0.94 < inside < 0.96
    # The global outlier count: the public sensitivity bound over epsilon.
    X = np.random.default_rng(0).random((200, 2))
    glob = private_count(X, 3, 0.05, 1.0, 1e-6, mechanism="global", rng=1)
    assert glob.accuracy == pytest.approx(global_sensitivity_bound(3, 2) * math.log(20))
    # Smooth sensitivity: the scale follows the window, so no interval is published.
    assert private_count(X, 3, 0.05, 1.0, 1e-6, mechanism="laplace", rng=1).accuracy is None


def test_seeded_report_is_reproducible_and_unseeded_is_not(window):
    X, flagged = window
    settings = ReportSettings()
    assert release_report(X, flagged, settings, NAMES, rng=9) == release_report(X, flagged, settings, NAMES, rng=9)
    a = release_report(X, flagged, settings, NAMES)
    b = release_report(X, flagged, settings, NAMES)
    assert a["event_count"]["value"] != b["event_count"]["value"]


def test_values_track_the_truth_with_a_large_budget(window):
    X, flagged = window
    settings = ReportSettings(epsilon_count=1e4, epsilon_flagged=1e4, epsilon_events=1e4, top_h=0, delta_count=1e-6)
    rec = release_report(X, flagged, settings, NAMES, rng=0)
    assert rec["flagged_count"]["value"] == pytest.approx(12, abs=0.01)
    assert rec["event_count"]["value"] == pytest.approx(300, abs=0.01)
    true = outliers.count_outliers(X, settings.k, settings.radius)
    assert rec["outlier_count"]["value"] == pytest.approx(true, abs=1.0)
    assert rec["top_subspaces"] == [] and rec["top_subspaces_epsilon"] == 0.0 and rec["where"] is None


def test_empty_window_releases_noise_around_zero_projected_onto_counts():
    settings = ReportSettings()
    values = np.array([release_report(np.zeros((0, 3)), np.zeros(0, bool), settings, NAMES, rng=s)["flagged_count"]["value"]
                       for s in range(400)])
    # Noise is drawn whatever the window holds; the projection only removes impossible
    # (negative) values, so about half the draws land on 0 and the rest spread above it.
    assert values.min() == 0.0 and 0.35 < np.mean(values == 0.0) < 0.65
    assert np.median(values[values > 0]) == pytest.approx(math.log(2) / settings.epsilon_flagged, rel=0.35)


def test_top_h_is_capped_at_the_number_of_subspaces(window):
    X, flagged = window
    settings = ReportSettings(top_h=5, subspace_dims=2, epsilon_top_count=0.5)
    rec = release_report(X, flagged, settings, NAMES, rng=1)
    assert len(rec["top_subspaces"]) == 3 == len(candidate_subspaces(3, 2))
    assert (rec["epsilon"], rec["delta"]) == settings.cost(3)


def test_flagged_must_match_the_window(window):
    X, _ = window
    with pytest.raises(ValueError, match="flagged"):
        release_report(X, np.zeros(3, bool), ReportSettings(), NAMES, rng=1)


# -- the WindowReleaser ------------------------------------------------------------------

@pytest.fixture(scope="module")
def vitals_model() -> GridKNN:
    _, X, _ = simulate_vitals(3000, rng=5)
    return GridKNN(epsilon=1.0, bounds=[(lo, hi) for _, lo, hi in VITAL_FEATURES], contamination=0.05, random_state=0,
                   feature_names=[n for n, _, _ in VITAL_FEATURES]).fit(X)


def _config(tmp_path: Path, **alarm):
    return parse_config({
        "features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
        "stream": {"entity_field": "device_id"},
        "window": {"size_seconds": 300},
        "alarm": {"baseline_warmup_seconds": 3600, **alarm},
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "epsilon": 50.0, "accountant": "basic"},
    })


def _run(config, model, windows: int, surges, seed: int = 1, ledger=None):
    ledger = ledger or WindowLedger(config.budget.ledger)
    b = config.budget
    releaser = WindowReleaser(config, BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant), model, rng=seed)
    traffic = Traffic(people=500, days=1, seed=seed)
    records = []
    for i in range(windows):
        X, entities, _ = traffic.window(i, surges)
        w = ClosedWindow(i * 300.0, (i + 1) * 300.0, X, np.zeros(0, bool), (), tuple(entities))
        records.append(json.loads(releaser.release(w, released_at=(i + 1) * 300.0 + 10).entry.payload))
    return records, ledger


def test_alarm_pages_on_a_clustered_surge_and_stays_quiet_otherwise(tmp_path, vitals_model):
    config = _config(tmp_path)
    surge = Surge(start=20, windows=3, share=0.2, kind="clustered", center=(84.0, 150.0))
    records, ledger = _run(config, vitals_model, 30, [surge])
    states = [r["alarm_detail"]["state"] for r in records]
    # One hour of 5-minute windows: the baseline is released with the 12th, which it then answers.
    assert states[:11] == ["warming_up"] * 11 and states[11] == "quiet"
    assert states[20] == "fired" and records[20]["alarm"] is True
    assert states[21:24] == ["held"] * 3
    assert "fired" not in states[12:20] + states[24:]
    # A page brings a detailed report, paid from the budget; quiet windows cost nothing.
    assert records[20]["report"]["reason"] == "alarm" and records[20]["epsilon"] > 0
    assert all(r["report"] is None for i, r in enumerate(records) if i != 20)
    kinds = [c["kind"] for r in records for c in r["charges"]]
    assert kinds == ["baseline", "alarm_run", "alarm_page", "report"]
    # The page is paid over its whole run (its noise shift covers every window the run
    # answers) and the reference's memory its queries read (the reach before its first
    # window, here the first start's 11 windows: the history holds nothing older), and the
    # run goes on after the hold: no new threshold is charged.
    (_, _, run_start, run_end, _, _), = ledger.span_charges("alarm_run")
    (_, _, page_start, page_end, page_eps, _), = ledger.span_charges("alarm_page")
    assert reference_for(config.alarm, 300).reach_seconds == 2040 * 300  # a week and two hours, once held
    assert (page_start, page_end) == (run_start, run_end) == (records[0]["window_start"], 86400.0)
    assert page_eps == config.alarm.epsilon_page and records[24]["alarm_detail"]["run"] == records[20]["alarm_detail"]["run"]


def test_every_window_is_charged_once_and_replayed_as_stored(tmp_path, vitals_model):
    config = _config(tmp_path)
    records, ledger = _run(config, vitals_model, 16, [])
    before = ledger.charge_counts(-1e12, 1e12)
    again, _ = _run(config, vitals_model, 16, [], seed=2, ledger=ledger)  # same windows, another noise seed
    assert again == records  # stored bytes, not a fresh draw
    assert ledger.charge_counts(-1e12, 1e12) == before


def _restarted(config, ledger, model, seed: int = 4) -> WindowReleaser:
    b = config.budget
    return WindowReleaser(config, BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant), model, rng=seed)


def _go_on(releaser, windows: range, seed: int = 1) -> list[dict]:
    traffic = Traffic(people=500, days=1, seed=seed)
    out = []
    for i in windows:
        X, entities, _ = traffic.window(i, [])
        w = ClosedWindow(i * 300.0, (i + 1) * 300.0, X, np.zeros(0, bool), (), tuple(entities))
        out.append(json.loads(releaser.release(w, released_at=(i + 1) * 300.0 + 10).entry.payload))
    return out


def test_a_restart_goes_on_with_a_quiet_run_and_keeps_the_baseline(tmp_path, vitals_model):
    """A quiet run is one AboveThreshold instance over a restart: the new process takes its saved
    threshold noise, interval and band (``<ledger>.run``, owner-only), charges no new threshold and
    answers as the same run; its charge stays open to its boundary."""
    config = _config(tmp_path)
    records, ledger = _run(config, vitals_model, 14, [])
    before = _restarted(config, ledger, vitals_model)  # what the first process held, read back
    (charge_id, _, start, end, _, _), = ledger.span_charges("alarm_run")
    assert end > records[-1]["window_end"]  # recorded at its longest span
    state_file = run_state_path(config.budget.ledger)
    assert state_file.stat().st_mode & 0o777 == 0o600
    rho = json.loads(state_file.read_text())["rho"]
    assert before.alarm.svt._rho == rho and before.alarm.run == records[-1]["alarm_detail"]["run"]
    assert ledger.span_charges("alarm_run") == [(charge_id, "alarm_run", start, end, config.alarm.epsilon_threshold, 0.0)]
    assert before.baseline.estimate is not None and not before.alarm.needs_run()
    after = _go_on(before, range(14, 20))
    assert [c["kind"] for r in after for c in r["charges"]] == []  # no new threshold
    assert {r["alarm_detail"]["run"] for r in after} == {records[-1]["alarm_detail"]["run"]}
    assert {r["alarm_detail"]["state"] for r in after} == {"quiet"}


def test_a_restart_closes_a_run_that_paged_or_that_the_ledger_does_not_confirm(tmp_path, vitals_model):
    """A run that paged ends at its boundary (its pages are charged up to it), so a restart closes it
    where it stopped and a new run is charged; so too where the saved state names another charge or
    is unreadable. The saved state of a run that ended is removed."""
    config = _config(tmp_path)
    surge = Surge(start=20, windows=3, share=0.2, kind="clustered", center=(84.0, 150.0))
    records, ledger = _run(config, vitals_model, 26, [surge])
    assert records[20]["alarm_detail"]["state"] == "fired"
    releaser = _restarted(config, ledger, vitals_model)
    assert ledger.span_charges("alarm_run")[-1][3] == records[-1]["window_end"] and releaser.alarm.needs_run()
    state_file = run_state_path(config.budget.ledger)
    assert not state_file.exists()
    # A quiet run whose saved state was overwritten (a crash between a run's commit and its save).
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    config = _config(quiet)
    records, ledger = _run(config, vitals_model, 14, [])
    state_file = run_state_path(config.budget.ledger)
    state_file.write_text(state_file.read_text().replace('"charge_id": ', '"charge_id": 9'))
    releaser = _restarted(config, ledger, vitals_model)
    assert ledger.span_charges("alarm_run")[-1][3] == records[-1]["window_end"] and releaser.alarm.needs_run()
    assert not state_file.exists()
    after = _go_on(releaser, range(14, 16))
    assert [c["kind"] for c in after[0]["charges"]] == ["alarm_run"]
    assert after[0]["alarm_detail"]["run"] != records[-1]["alarm_detail"]["run"]
    state_file.write_text("{not json")  # a torn or foreign file: a new run, and the file is gone
    releaser = _restarted(config, ledger, vitals_model, seed=5)
    assert releaser.alarm.needs_run() and not state_file.exists()
    _go_on(releaser, range(16, 18))  # a new run, kept; then its noise altered to one no run draws
    state_file.write_text(state_file.read_text().replace('"rho": ', '"rho": -1'))
    releaser = _restarted(config, ledger, vitals_model, seed=6)
    assert releaser.alarm.needs_run() and not state_file.exists()
    assert ledger.span_charges("alarm_run")[-1][3] == 18 * 300.0  # ended where it stopped


def test_a_resumed_run_takes_only_a_threshold_noise_it_could_have_drawn():
    from monitor.alarm.above_threshold import AboveThreshold

    run = AboveThreshold(epsilon_threshold=0.6, epsilon_positive=0.5, width=4096, rng=1)
    for rho in (-1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="non-negative integer"):
            run.resume(rho)
    run.resume(7)
    assert run.active and run.positives == 0 and run.test_one(10**7, 0) and not run.test_one(-10**7, 0)


def test_a_budget_too_small_for_a_run_suppresses_the_alarm_not_the_window(tmp_path, vitals_model):
    config = _config(tmp_path, epsilon_threshold=0.4, epsilon_page=0.4)
    config = config.model_copy(update={"budget": config.budget.model_copy(update={"epsilon": 0.5})})
    records, ledger = _run(config, vitals_model, 14, [])
    assert records[-1]["alarm_detail"]["state"] == "suppressed" and records[-1]["alarm"] is False
    assert [c["kind"] for r in records for c in r["charges"]] == ["baseline"]


def test_a_budget_that_cannot_pay_a_page_asks_no_question(tmp_path, vitals_model):
    # The filter: the run is open (its threshold paid), but a page would overdraw the
    # period, so the surge window gets no query, hence no page and no unpaid loss.
    config = _config(tmp_path, epsilon_threshold=0.4, epsilon_page=0.4)
    config = config.model_copy(update={"budget": config.budget.model_copy(update={"epsilon": 1.0})})
    surge = Surge(start=14, windows=3, share=0.5, kind="clustered", center=(84.0, 150.0))
    records, ledger = _run(config, vitals_model, 16, [surge])
    assert [c["kind"] for r in records for c in r["charges"]] == ["baseline", "alarm_run"]
    assert {r["alarm_detail"]["state"] for r in records[11:]} == {"suppressed"}
    assert records[14]["alarm_detail"]["run"] is not None and not ledger.span_charges("alarm_page")


@pytest.mark.parametrize("reserve_pages, reported", [(0, True), (200, False)])
def test_pages_come_before_reports(tmp_path, vitals_model, reserve_pages, reported):
    # A report is released only if the budget (50 here) still pays a new run and
    # reserve_pages pages (alarm.epsilon_page each) after it; the page itself is paid either way.
    config = _config(tmp_path)
    config = config.model_copy(update={"report": config.report.model_copy(update={"reserve_pages": reserve_pages})})
    surge = Surge(start=20, windows=3, share=0.2, kind="clustered", center=(84.0, 150.0))
    records, _ = _run(config, vitals_model, 22, [surge])
    assert records[20]["alarm_detail"]["state"] == "fired"
    report = records[20]["report"]
    assert report["reason"] == "alarm" and ("suppressed" not in report) == reported
    if not reported:
        assert report["suppressed"] == "budget" and "report" not in [c["kind"] for c in records[20]["charges"]]


def test_a_quiet_run_goes_on_past_its_boundary_and_counts_once_in_a_period(tmp_path, vitals_model):
    # A quiet run's span grows boundary by boundary (epoch-aligned), so a period that
    # straddles a boundary holds one threshold, not two.
    config = _config(tmp_path, run_seconds=1800)  # 6 windows
    config = config.model_copy(update={"budget": config.budget.model_copy(update={"period_seconds": 3600.0})})
    records, ledger = _run(config, vitals_model, 24, [])
    runs = [(s, e) for _, _, s, e, _, _ in ledger.span_charges("alarm_run")]
    start = 0.0  # the reference's memory is charged too: all it holds, from the first window
    assert runs == [(start, 7200.0)]
    assert len({r["alarm_detail"]["run"] for r in records[11:]}) == 1
    carried = [(i, c["span"]) for i, r in enumerate(records) for c in r["charges"] if c.get("carried_on")]
    assert carried == [(12, [start, 5400.0]), (18, [start, 7200.0])]  # the first window past each boundary
    b, a = config.budget, config.alarm
    accountant = BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant)
    warmup = a.epsilon_baseline_warmup + a.epsilon_baseline_events
    assert accountant.spent(5700.0)[0] == pytest.approx(warmup + a.epsilon_threshold)  # (2100, 5700]: both boundaries
    assert accountant.spent(7200.0)[0] == pytest.approx(a.epsilon_threshold)  # the warm-up span has left


def test_a_run_that_paged_ends_at_its_boundary_and_a_new_one_is_charged(tmp_path, vitals_model):
    # Every page is charged over its run's whole span: a run that paged does not go on. (The
    # first day's page holds for hold_windows here, so that the next run opens within the test.)
    config = _config(tmp_path, run_seconds=1800, trend_hold_windows=3)
    surge = Surge(start=14, windows=3, share=0.2, kind="clustered", center=(84.0, 150.0))
    records, ledger = _run(config, vitals_model, 24, [surge])
    assert records[14]["alarm_detail"]["state"] == "fired"
    runs = [(s, e) for _, _, s, e, _, _ in ledger.span_charges("alarm_run")]
    pages = [(s, e) for _, _, s, e, _, _ in ledger.span_charges("alarm_page")]
    # Each run's charge covers the memory it reads: here all the history holds, from the first window.
    assert runs == [(0.0, 5400.0), (0.0, 7200.0)] and pages == [(0.0, 5400.0)]
    assert records[17]["alarm_detail"]["run"] != records[18]["alarm_detail"]["run"]


def test_alarm_runs_are_numbered_from_one_on_a_fresh_ledger(tmp_path, vitals_model):
    # The ledger's first charge is the warm-up baseline; the first run is still run 1.
    config = _config(tmp_path, run_seconds=1800)
    surge = Surge(start=14, windows=3, share=0.2, kind="clustered", center=(84.0, 150.0))
    records, ledger = _run(config, vitals_model, 24, [surge])
    runs = [r["alarm_detail"]["run"] for r in records if r["alarm_detail"]["run"] is not None]
    assert runs[0] == 1 and sorted(set(runs)) == list(range(1, len(ledger.span_charges("alarm_run")) + 1))
    assert all(c["run"] in set(runs) for r in records for c in r["charges"] if "run" in c)


def test_a_daily_baseline_releases_normal_parts_and_a_report_is_measured_against_them(tmp_path, vitals_model):
    # An hourly refresh (a daily one at this test's scale), with the epsilon that keeps it precise.
    config = _config(tmp_path, baseline_refresh_seconds=3600, epsilon_baseline_flagged=1.0)
    surge = Surge(start=30, windows=3, share=0.2, kind="clustered", center=(84.0, 150.0))
    records, ledger = _run(config, vitals_model, 31, [surge])
    first, daily = [r["baseline"] for r in records if r["baseline"]]
    a = config.alarm
    # The warm-up estimate has no parts and does not pay for them; a daily one does both.
    assert first["normal_parts"] is None
    assert first["epsilon"] == pytest.approx(a.epsilon_baseline_warmup + a.epsilon_baseline_events)
    assert daily["epsilon"] == pytest.approx(config.baseline_cost()[0])
    assert config.baseline_cost()[0] == pytest.approx(a.baseline_epsilon + config.report.epsilon_normal_parts)
    assert [c[4] for c in ledger.span_charges("baseline")] == pytest.approx([first["epsilon"], daily["epsilon"]])
    shares = daily["normal_parts"]
    assert len(shares) == 5 and math.fsum(shares) == pytest.approx(1.0)
    # The page's report: each part's normal is its released share of the baseline's rate
    # times the noisy event count (post-processing of public numbers only).
    page = records[30]
    assert page["alarm"] is True and page["report"]["reason"] == "alarm"
    events = page["report"]["event_count"]["value"]
    normal = sorted(p["normal"] / (events * daily["rate"]) for p in page["report"]["where"]["parts"])
    assert normal == pytest.approx(sorted(shares))
