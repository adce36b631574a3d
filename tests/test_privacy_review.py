"""The second privacy review's findings, each pinned by a test that failed before its fix.

1. tau may not move inside an AboveThreshold run beyond what the run's noise covers;
2. a window whose ledger transaction fails leaves no trace in the alarm's or the baseline's
   state (a retry must not publish answers whose charges were rolled back);
3. a baseline estimate is charged in every period its span touches, not only the trailing one;
7. the ledger stores no wall-clock time of a release (its latency depends on the data).
"""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from monitor.alarm import RESOLUTION, BaselineEstimate, SurgeAlarm
from monitor.alarm.surge import TAU_BAND
from monitor.budget import BudgetAccountant, WindowLedger
from monitor.config import parse_config
from monitor.data.traffic import Surge, Traffic
from monitor.data.vitals import VITAL_FEATURES, simulate_vitals
from monitor.model import GridKNN
from monitor.release import WindowReleaser
from monitor.pipeline.windows import ClosedWindow
from svt_exact import log_prob as _log_prob

# A cheap threshold and dear pages: the threshold noise is then wide against the queries
# and the exact loss of "quiet, quiet, ..., page" comes close to its worst case, so a
# shortfall in what a run charges shows in the numbers (at 0.6 / 0.5 the same outcome
# stays under the charge although other outcomes do not).
EPS_T, EPS_P = 0.1, 2.0


# -- 1. one tau band per run: the exact privacy loss of a run whose baseline moved ----------

def _worst_loss(m_quiet, m_page, scale_t: float, scale_q: float) -> float:
    """Privacy loss of "every quiet window negative, then one page" between a stream at the
    threshold and the same stream with one more person: flagged in every quiet window (moves
    each by R - m, the largest upward move, which the threshold noise must absorb) and not
    in the paging window (moves it by -m, the farthest from that). ``m_quiet``: the m of each
    block of quiet windows, as (m, count)."""
    here = [(0, False, c) for _, c in m_quiet] + [(0, True, 1)]
    there = [(RESOLUTION - m, False, c) for m, c in m_quiet] + [(-m_page, True, 1)]
    return abs(_log_prob(here, scale_t, scale_q) - _log_prob(there, scale_t, scale_q))


def _base(rate: float) -> BaselineEstimate:
    return BaselineEstimate(rate=rate, events_per_window=1000, span_start=0, span_end=1, span_windows=1, epsilon=0.1)


def test_the_exact_loss_check_sees_a_tau_that_moved_freely_inside_a_run():
    # The review's case: 288 quiet windows, tau 0 for the first half, then a baseline refresh
    # to tau 0.25, then a page. With the statistic rescaled to the new tau and the plain
    # noise, the run loses more than it charged; the check must see it, or it proves
    # nothing below.
    scale_t, scale_q = RESOLUTION / EPS_T, RESOLUTION / EPS_P
    moved = _worst_loss([(0, 144), (RESOLUTION // 4, 144)], RESOLUTION // 4, scale_t, scale_q)
    assert moved > EPS_T + EPS_P + 0.2
    fixed = _worst_loss([(0, 288)], 0, scale_t, scale_q)
    assert fixed <= EPS_T + EPS_P + 1e-9


@pytest.mark.parametrize("new_rate", [0.01, 0.25, 0.9])
def test_a_run_pays_what_it_charged_whatever_the_baseline_does_inside_it(new_rate):
    alarm = SurgeAlarm(EPS_T, EPS_P, threshold=10, z=0, hold_windows=0, rng=0)
    alarm.open_run(1, _base(0.0))
    m_before = alarm.run_rate_units(_base(0.0))
    m_after = alarm.run_rate_units(_base(new_rate))
    assert m_after - m_before <= round(TAU_BAND * RESOLUTION)  # clamped into the run's band
    assert alarm.accepts(_base(new_rate)) == (new_rate <= TAU_BAND / 2 + 1e-12)
    loss = _worst_loss([(m_before, 144), (m_after, 144)], m_after, alarm.svt.threshold_scale, alarm.svt.query_scale)
    assert loss <= EPS_T + EPS_P + 1e-9


def test_a_band_is_centred_on_the_run_rate_and_stays_inside_zero_one():
    for rate in (0.0, 0.02, 0.5, 0.97, 1.0):
        alarm = SurgeAlarm(EPS_T, EPS_P, threshold=10, rng=0)
        alarm.open_run(1, _base(rate))
        lo, hi = alarm._band
        assert 0 <= lo <= round(rate * RESOLUTION) <= hi <= RESOLUTION
        assert hi - lo == round(TAU_BAND * RESOLUTION)
        alarm.close_run()
        assert alarm.accepts(_base(1 - rate))  # no run, no band


# -- the releaser: a baseline that leaves the band ends the run; a failed window leaves no trace

@pytest.fixture(scope="module")
def vitals_model() -> GridKNN:
    _, X, _ = simulate_vitals(3000, rng=5)
    return GridKNN(epsilon=1.0, bounds=[(lo, hi) for _, lo, hi in VITAL_FEATURES], contamination=0.05, random_state=0,
                   feature_names=[n for n, _, _ in VITAL_FEATURES]).fit(X)


def _config(tmp_path, budget=None, report=None, **alarm):
    return parse_config({
        "features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
        "stream": {"entity_field": "device_id"},
        "window": {"size_seconds": 300},
        "alarm": {"baseline_warmup_seconds": 3600, **alarm},
        "report": report or {},
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "epsilon": 50.0, "accountant": "basic", **(budget or {})},
    })


def _windows(n_windows: int, surges=(), seed: int = 1):
    traffic = Traffic(people=500, days=1, seed=seed)
    for i in range(n_windows):
        X, entities, _ = traffic.window(i, list(surges))
        yield ClosedWindow(i * 300.0, (i + 1) * 300.0, X, np.zeros(0, bool), (), tuple(entities))


def _releaser(config, model, seed=1):
    b = config.budget
    ledger = WindowLedger(b.ledger)
    return WindowReleaser(config, BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant), model, rng=seed)


class _FailOnce:
    """Makes the ledger's next window INSERT raise, once (a full disk, a locked file)."""

    def __init__(self, ledger: WindowLedger, at_start: float, error: Exception) -> None:
        self.ledger, self.at_start, self.error, self.fired = ledger, at_start, error, False
        self._record = ledger.record_release

    def __call__(self, window_start, *args, **kwargs):
        if window_start == self.at_start and not self.fired:
            self.fired = True
            raise self.error
        return self._record(window_start, *args, **kwargs)


def _charges_paid(ledger: WindowLedger) -> list[str]:
    return sorted(kind for _, kind, *_ in ledger.span_charges())


@pytest.mark.parametrize("error", [sqlite3.OperationalError("database or disk is full"), OSError(28, "No space left")])
@pytest.mark.parametrize("fail_at", ["page", "run_and_baseline"])
def test_a_retried_window_publishes_only_answers_that_were_paid(tmp_path, vitals_model, error, fail_at):
    config = _config(tmp_path)
    surge = Surge(start=14, windows=3, share=0.6, kind="clustered", center=(84.0, 150.0))
    windows = list(_windows(17, [surge]))
    # Reference: the same windows with no failure.
    reference = _releaser(_config(tmp_path / "ref"), vitals_model)
    ref_records = [json.loads(reference.release(w, w.end + 5).entry.payload) for w in windows]
    paging = next(i for i, r in enumerate(ref_records) if r["alarm_detail"]["state"] == "fired")
    opening = next(i for i, r in enumerate(ref_records) if any(c["kind"] == "alarm_run" for c in r["charges"]))
    assert any(c["kind"] == "baseline" for c in ref_records[opening]["charges"])
    target = windows[paging if fail_at == "page" else opening]

    releaser = _releaser(config, vitals_model)
    ledger = releaser.ledger
    ledger.record_release = _FailOnce(ledger, target.start, error)
    records = []
    for w in windows:
        try:
            out = releaser.release(w, w.end + 5)
        except (sqlite3.OperationalError, OSError):
            assert w is target
            out = releaser.release(w, w.end + 5)  # the service's retry
        records.append(json.loads(out.entry.payload))
    assert ledger.record_release.fired
    # Every run a record names is a charge the ledger holds, and every page was paid.
    runs = set(range(1, len(ledger.span_charges("alarm_run")) + 1))  # runs are numbered 1, 2, ...
    for r in records:
        if r["alarm_detail"]["run"] is not None:
            assert r["alarm_detail"]["run"] in runs, r
    pages = sum(r["alarm_detail"]["state"] == "fired" for r in records)
    assert pages == len(ledger.span_charges("alarm_page"))
    held_runs = {r["alarm_detail"]["run"] for r in records if r["alarm_detail"]["state"] == "held"}
    fired_runs = {r["alarm_detail"]["run"] for r in records if r["alarm_detail"]["state"] == "fired"}
    assert held_runs <= fired_runs  # no "held" without the page that paid for it
    # Every charge the records list is in the ledger, once.
    listed = sorted(c["kind"] for r in records for c in r["charges"] if c["kind"] != "report" and not c.get("carried_on"))
    assert listed == _charges_paid(ledger)
    # A baseline in use was released by a record (paid), never only drawn.
    released = {json.dumps(r["baseline"], sort_keys=True) for r in records if r["baseline"]}
    for r in records:
        if r["baseline_in_use"]:
            assert json.dumps(r["baseline_in_use"], sort_keys=True) in released


def test_a_baseline_refresh_that_leaves_the_band_ends_the_run(tmp_path, vitals_model):
    # A baseline refresh far from the run's rate: the run ends where it stopped answering
    # and a new one, centred on the new rate, answers from that window on.
    config = _config(tmp_path, baseline_refresh_seconds=3600)
    releaser = _releaser(config, vitals_model)
    windows = list(_windows(30))
    records = []
    for i, w in enumerate(windows):
        if i == 23:  # the refresh is due at the end of this window: pretend the rate jumped
            for totals in releaser.baseline._totals:  # at every rung of the levels
                totals.flagged = int(0.5 * releaser.baseline._events)
        records.append(json.loads(releaser.release(w, w.end + 5).entry.payload))
    refreshed = next(i for i, r in enumerate(records) if r["baseline"] and i > 11)
    assert records[refreshed]["baseline"]["rate"] > 0.3
    old_run, new_run = records[refreshed - 1]["alarm_detail"]["run"], records[refreshed]["alarm_detail"]["run"]
    assert old_run is not None and new_run not in (None, old_run)
    run_spans = [(s, e) for _, _, s, e, *_ in releaser.ledger.span_charges("alarm_run")]  # run n is the n-th
    assert run_spans[old_run - 1][1] == windows[refreshed].start


# -- 3. a baseline is paid in every period its span touches -------------------------------

def test_a_baseline_charge_never_overdraws_an_earlier_period(tmp_path, vitals_model):
    # Budget 1.0 per hour. The warm-up estimate (0.55 over [0, 3300)), then the next one
    # (0.55 over [3300, 6900)): the trailing hour of the second holds only itself, but the
    # hour ending at 3600 holds both (1.1). Checking the trailing period alone overdrew it.
    config = _config(tmp_path, budget={"epsilon": 1.0, "period_seconds": 3600},
                     enabled=False, epsilon_threshold=0.2, epsilon_page=0.2,
                     baseline_warmup_seconds=3300, baseline_refresh_seconds=3600,
                     epsilon_baseline_flagged=0.45, epsilon_baseline_events=0.1, epsilon_baseline_warmup=0.45)
    releaser = _releaser(config, vitals_model)
    for w in _windows(26):
        releaser.release(w, w.end + 5)
    b = config.budget
    acc = BudgetAccountant(releaser.ledger, b.epsilon, b.delta, b.period_seconds, b.accountant)
    ends = sorted({e for e in np.arange(300.0, 26 * 300.0 + 1, 300.0)} | {s + 1e-6 for _, _, s, *_ in releaser.ledger.span_charges()})
    worst = max(acc.spent(t)[0] for t in ends)
    assert worst <= b.epsilon + 1e-9


# -- 7. no wall-clock time in the ledger --------------------------------------------------

def test_the_ledger_stores_scheduled_times_not_the_wall_clock(tmp_path, vitals_model):
    config = _config(tmp_path)
    releaser = _releaser(config, vitals_model)
    for w in _windows(14):
        releaser.release(w, w.end + 5)
    with sqlite3.connect(config.budget.ledger) as conn:
        windows = conn.execute("SELECT window_end, recorded_at FROM windows").fetchall()
        charges = conn.execute("SELECT span_start, recorded_at FROM charges").fetchall()
    assert windows and all(rec == end + 5 for end, rec in windows)
    assert charges and all(rec == start for start, rec in charges)


# -- 6. adaptive charges (alarm, baselines, reports) compose by basic composition, whatever the accountant

def test_pld_adds_every_adaptive_charge_and_composes_only_fixed_windows(tmp_path):
    ledger = WindowLedger(tmp_path / "l.sqlite")
    acc = BudgetAccountant(ledger, epsilon=4.0, delta=1e-5, period_seconds=86400, accountant="pld")
    for i in range(30):  # an alarm run's pages: charged from its outputs, inside one run
        ledger.add_charge("alarm_page", 0.0, 3600.0, 0.1, 0.0)
    assert acc.spent(3600.0)[0] == pytest.approx(3.0)  # basic, not the PLD of 30 x 0.1
    # Ten more pages would compose to under 4 by PLD, but not by basic composition.
    for _ in range(10):
        assert acc.fits_span(0.0, 3600.0, (0.1, 0.0), "alarm_page")
        ledger.add_charge("alarm_page", 0.0, 3600.0, 0.1, 0.0)
    assert not acc.fits_span(0.0, 3600.0, (0.1, 0.0), "alarm_page")
    assert not acc.decide(3300.0, 3600.0, (0.1, 0.0), "alarm_run").released
    # Reports (window rows) are adaptive too (a report exists after a page, or if the budget
    # the pages left admits it): they add up as well, 40 of 0.1 on top of the run's 1.0.
    acc2 = BudgetAccountant(WindowLedger(tmp_path / "m.sqlite"), epsilon=5.0, delta=1e-5, period_seconds=86400, accountant="pld")
    acc2.ledger.add_charge("alarm_run", 0.0, 86400.0, 1.0, 0.0)
    assert sum(acc2.release(i * 60.0, i * 60.0 + 60, (0.1, 1e-8), lambda d: "{}").entry.released for i in range(88)) == 40
    assert acc2.spent(88 * 60.0)[0] == pytest.approx(5.0)
    # Only windows of a cost fixed by the calendar compose by PLD: 88 of (0.1, 1e-8) cost 3.99.
    acc3 = BudgetAccountant(WindowLedger(tmp_path / "f.sqlite"), epsilon=4.0, delta=1e-5, period_seconds=86400, accountant="pld",
                            fixed_schedule=True)
    for i in range(88):
        assert acc3.release(i * 60.0, i * 60.0 + 60, (0.1, 1e-8), lambda d: "{}").entry.released
    assert acc3.spent(88 * 60.0)[0] == pytest.approx(3.991, abs=0.01)


# -- 8. a cap over the ledger's whole history ------------------------------------------------

def test_a_lifetime_cap_bounds_what_a_person_loses_over_many_periods(tmp_path):
    config = parse_config({"features": [{"name": "x", "min": 0, "max": 1}], "alarm": {"enabled": False, "epsilon_threshold": 0.2, "epsilon_page": 0.2},
                           "budget": {"epsilon": 1.0, "period_seconds": 3600, "lifetime_epsilon": 2.5,
                                      "ledger": str(tmp_path / "l.sqlite")}})
    acc = BudgetAccountant.from_settings(WindowLedger(config.budget.ledger), config.budget)
    # One 0.5 window an hour: each hour alone is within 1.0, but only five fit the lifetime.
    outcomes = [acc.release(h * 3600.0, h * 3600.0 + 60, (0.5, 0.0), lambda d: json.dumps(d.budget_record()))
                for h in range(8)]
    assert [o.entry.released for o in outcomes] == [True] * 5 + [False] * 3
    last = json.loads(outcomes[4].entry.payload)
    assert last["epsilon_lifetime_spent"] == pytest.approx(2.5) and last["epsilon_lifetime_limit"] == 2.5
    assert not acc.fits_span(0.0, 8 * 3600.0, (0.1, 0.0), "alarm_page")


# -- a baseline's per-person cap, summed in floats

@pytest.mark.parametrize("cap", [1, 3, 16])
def test_a_persons_clipped_weight_is_exact_in_floats_and_never_above_the_cap(cap):
    """Weights reach the baseline as integer units over RESOLUTION (a power of two), so every
    clipped share, every running total and the room left under the cap are exact binary
    fractions: one person's clipped sum is at most the cap exactly, and the flagged total with
    and without them differs by exactly that sum (the Laplace release's sensitivity holds in
    floats, not only for reals). Adversarial: the smallest weights, weights that leave
    1 / RESOLUTION of room, a person crossing the cap within one window's weight."""
    from monitor.alarm.baseline import _SpanTotals

    assert RESOLUTION & (RESOLUTION - 1) == 0
    rng = np.random.default_rng(cap)
    windows = []
    for _ in range(400):
        units = rng.choice([1, RESOLUTION - 1, RESOLUTION, RESOLUTION // 3, int(rng.integers(0, RESOLUTION + 1))], size=6)
        windows.append(units / RESOLUTION)

    def totals(people):
        t = _SpanTotals(0, 0)
        for w in windows:
            keep = [k for k in range(6) if f"p{k}" in people]
            t.add(w[keep], [f"p{k}" for k in keep], None, cap, None)
        return t

    everyone = {f"p{k}" for k in range(6)}
    full = totals(everyone)
    for k in range(6):
        person = f"p{k}"
        assert full.per_unit[person] <= cap  # exactly: no ulp above
        without = totals(everyone - {person})
        assert full.flagged - without.flagged == full.per_unit[person]  # exact, in floats
        assert 0.0 <= full.squared - without.squared <= full.per_unit[person]


def test_a_warm_up_with_too_little_traffic_pays_its_count_only_and_tries_again(tmp_path, vitals_model):
    """No traffic: a warm-up whose released event count (released first) says too little traffic
    releases nothing more and costs epsilon_baseline_events alone, and the next span is a warm-up
    again; one whose count came out at MIN_BASELINE_EVENTS_PER_WINDOW or above by its noise pays in
    full, as before (the count's noise is some 50 events a window at its epsilon). Once the traffic
    comes the alarm answers."""
    from monitor.alarm.calibrate import MIN_BASELINE_EVENTS_PER_WINDOW

    def releaser(seed):
        config = parse_config({
            "features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
            "stream": {"entity_field": "device_id"},
            "window": {"size_seconds": 900},
            "alarm": {"baseline_warmup_seconds": 3600},
            "report": {"on_alarm": False},
            "budget": {"ledger": str(tmp_path / f"ledger-{seed}.sqlite"), "epsilon": 12.0, "accountant": "basic"},
        })
        b = config.budget
        return config.alarm, WindowReleaser(config, BudgetAccountant(WindowLedger(b.ledger), b.epsilon, b.delta,
                                                                     b.period_seconds, b.accountant), vitals_model, rng=seed)

    def release(r, i, traffic=None):
        X, entities, _ = traffic.window(i) if traffic is not None else (np.zeros((0, 5)), [], None)
        w = ClosedWindow(i * 900.0, (i + 1) * 900.0, X, np.zeros(0, bool), (), tuple(entities))
        return json.loads(r.release(w, released_at=(i + 1) * 900.0).entry.payload)

    count_only = 0
    for seed in range(8):
        a, r = releaser(seed)
        full = a.epsilon_baseline_warmup + a.epsilon_baseline_events
        for i in range(12):
            rec = release(r, i)
            for charge in rec["charges"]:
                if charge["kind"] != "baseline":
                    continue
                if rec["baseline"]["events_per_window"] < MIN_BASELINE_EVENTS_PER_WINDOW:
                    count_only += 1
                    assert charge["epsilon"] == pytest.approx(a.epsilon_baseline_events)
                    assert rec["baseline"]["epsilon"] == pytest.approx(a.epsilon_baseline_events)
                    assert rec["alarm_detail"]["state"] == "warming_up"
                else:
                    assert charge["epsilon"] == pytest.approx(full)
    assert count_only >= 8  # most empty warm-ups, and each tried again one warm-up later
    # A quiet start, then traffic: the alarm starts after a warm-up of the traffic.
    a, r = releaser(1)
    many = Traffic(people=400, days=1, seed=1, window_seconds=900)
    records = [release(r, i, many if i >= 8 else None) for i in range(20)]
    assert any(rec["alarm_detail"]["state"] == "quiet" for rec in records[12:])
