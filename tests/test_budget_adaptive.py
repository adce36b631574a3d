"""Under `budget.accountant: pld`, every adaptively triggered charge adds by basic composition.

PLD composition is proven for charges fixed in advance. The stream's charges are not: a
page exists only when the alarm fires, a report only after a page (or, when scheduled,
only if the budget the pages left admits it), a baseline only if that budget admits it.
No PLD privacy-filter theorem covers such a sequence, so they must add up exactly as
under basic composition (docs/budget.md).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from monitor.budget import BudgetAccountant, WindowLedger, basic_spend, pld_epsilon
from monitor.budget.accountant import BASIC_KINDS

DAY = 86400.0
WINDOW = 300.0
EPSILON, DELTA = 12.0, 1e-6
# The shipped config's costs: a run's threshold, a page, the warm-up and daily baselines, a report.
RUN, PAGE, WARMUP, BASELINE, REPORT = 0.6, 0.5, 0.27, 0.1, 0.28


def _day_of_pages(ledger: WindowLedger, pages: int = 12, scheduled_reports: int = 6) -> None:
    """A UTC day: the warm-up baseline, two refreshes, two alarm runs, pages with their
    reports (window rows) and a few scheduled reports."""
    ledger.add_charge("baseline", 0.0, 3600.0, WARMUP)
    ledger.add_charge("baseline", 3600.0, 43200.0, BASELINE)
    ledger.add_charge("baseline", 43200.0, DAY, BASELINE)
    ledger.add_charge("alarm_run", 3600.0, DAY, RUN)
    ledger.add_charge("alarm_run", DAY, 2 * DAY, RUN)  # the next run: touches periods ending after midnight
    for i in range(pages):
        start = 7200.0 + i * 3 * WINDOW
        ledger.add_charge("alarm_page", 3600.0, DAY, PAGE)
        ledger.record_release(start, start + WINDOW, REPORT, 0.0, "{}")
    for i in range(scheduled_reports):
        start = 50000.0 + i * 4 * WINDOW
        ledger.record_release(start, start + WINDOW, REPORT, 0.0, "{}")


def _basic_sum(ledger: WindowLedger, t: float) -> tuple[float, float]:
    """Brute force: the sum of every charge touching (t - DAY, t]."""
    windows = [(c.epsilon, c.delta) for c in ledger.charges(t - DAY, t)]
    spans = [(eps, d) for _, _, s, e, eps, d in ledger.span_charges() if s < t and e > t - DAY]
    both = windows + spans
    return math.fsum(e for e, _ in both), math.fsum(d for _, d in both)


def test_on_a_day_of_pages_pld_spends_the_basic_sum_of_the_adaptive_kinds(tmp_path: Path) -> None:
    with WindowLedger(tmp_path / "day.sqlite") as ledger:
        _day_of_pages(ledger)
        pld = BudgetAccountant(ledger, EPSILON, DELTA, DAY, "pld")
        basic = BudgetAccountant(ledger, EPSILON, DELTA, DAY, "basic")
        for t in (3600.0, 7200.0, 20000.0, 43200.0, 60000.0, DAY, DAY + 7200.0, 1.5 * DAY):
            assert pld.spent(t) == pytest.approx(_basic_sum(ledger, t), abs=1e-12), t
            assert pld.spent(t) == pytest.approx(basic.spent(t), abs=1e-12), t
        # The check above could fail: had the reports and baselines gone into the PLD group,
        # the day would have cost less.
        counts, apart = ledger.split_charge_counts(0.0, DAY, ())
        assert not apart and pld_epsilon(counts, DELTA) < basic_spend(counts)[0] - 0.3
        # Pages (over their run) and reports are admitted alike by both accountants.
        for kind, cost in (("alarm_page", (PAGE, 0.0)), ("baseline", (BASELINE, 0.0))):
            assert pld.fits_span(3600.0, 60000.0, cost, kind) == basic.fits_span(3600.0, 60000.0, cost, kind)
        a, b = pld.decide(70000.0, 70300.0, (REPORT, 0.0)), basic.decide(70000.0, 70300.0, (REPORT, 0.0))
        assert (a.released, a.epsilon_spent, a.delta_spent) == (b.released, b.epsilon_spent, b.delta_spent)


def test_a_report_admitted_under_pld_never_exceeds_what_basic_composition_allows(tmp_path: Path) -> None:
    with WindowLedger(tmp_path / "reports.sqlite") as ledger:
        _day_of_pages(ledger, pages=4, scheduled_reports=0)
        acc = BudgetAccountant(ledger, EPSILON, DELTA, DAY, "pld")
        admitted = 0
        t = 30000.0
        while t < DAY - WINDOW:
            d = acc.decide(t, t + WINDOW, (REPORT, 0.0))
            if not d.released:
                break
            # Every report the PLD accountant lets through fits by basic composition.
            assert _basic_sum(ledger, t + WINDOW)[0] + REPORT <= EPSILON + 1e-9
            ledger.record_release(t, t + WINDOW, REPORT, 0.0, "{}")
            admitted += 1
            t += WINDOW
        assert t < DAY - WINDOW, "the budget never ran out"
        spent = _basic_sum(ledger, t + WINDOW)[0]
        assert spent <= EPSILON + 1e-9 < spent + REPORT  # refused exactly where the sum would pass the limit
        # Composed by PLD, the same period would have held at least 10 more reports.
        counts, _ = ledger.split_charge_counts(t + WINDOW - DAY, t + WINDOW, ())
        counts[(REPORT, 0.0)] += 10
        assert pld_epsilon(counts, DELTA) <= EPSILON
        # The run, four pages with their reports, the warm-up and the first refresh (the
        # second starts later), and the rest in reports: the basic count exactly.
        assert admitted == math.floor((EPSILON - (RUN + 4 * PAGE + WARMUP + BASELINE) + 1e-9) / REPORT) - 4


def test_pld_composes_only_fixed_cost_windows_on_a_calendar(tmp_path: Path) -> None:
    assert set(BASIC_KINDS) == {"alarm_run", "alarm_page", "baseline", "report"}
    with WindowLedger(tmp_path / "fixed.sqlite") as ledger:
        acc = BudgetAccountant(ledger, EPSILON, DELTA, DAY, "pld", fixed_schedule=True)
        released = sum(acc.release(i * WINDOW, (i + 1) * WINDOW, (REPORT, 0.0), lambda d: "{}").entry.released
                       for i in range(80))
        assert released == 64  # 42 by basic composition
        # A fixed schedule holds no adaptive charge: PLD would then compose a sequence
        # stopped by released answers.
        with pytest.raises(ValueError, match="fixed_schedule"):
            acc.fits_span(0.0, 80 * WINDOW, (PAGE, 0.0), "alarm_page")
        ledger.add_charge("alarm_page", 0.0, DAY, PAGE)
        with pytest.raises(ValueError, match="fixed_schedule"):
            acc.spent(80 * WINDOW)


def test_the_releaser_under_pld_publishes_what_it_publishes_under_basic(tmp_path: Path) -> None:
    # A real day of pages through the WindowReleaser, with a budget that runs out: every
    # decision and every spend must be the same under both accountants.
    import json

    import numpy as np

    from monitor.config import parse_config
    from monitor.data.traffic import Surge, Traffic
    from monitor.data.vitals import VITAL_FEATURES, simulate_vitals
    from monitor.model import GridKNN
    from monitor.release import WindowReleaser
    from monitor.pipeline.windows import ClosedWindow

    _, X, _ = simulate_vitals(3000, rng=5)
    model = GridKNN(epsilon=1.0, bounds=[(lo, hi) for _, lo, hi in VITAL_FEATURES], contamination=0.05, random_state=0,
                    feature_names=[n for n, _, _ in VITAL_FEATURES]).fit(X)
    surges = [Surge(start=s, windows=2, share=0.3, kind="clustered", center=(84.0, 150.0)) for s in (14, 20, 26, 32)]
    records = {}
    for kind in ("basic", "pld"):
        config = parse_config({
            "features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
            "stream": {"entity_field": "device_id"}, "window": {"size_seconds": 300},
            "alarm": {"baseline_warmup_seconds": 3600, "run_seconds": 3600},
            "report": {"every_seconds": 1800},
            "budget": {"ledger": str(tmp_path / f"{kind}.sqlite"), "epsilon": 4.0, "accountant": kind},
        })
        b = config.budget
        releaser = WindowReleaser(config, BudgetAccountant.from_settings(WindowLedger(b.ledger), b), model, rng=3)
        traffic = Traffic(people=500, days=1, seed=3)
        out = []
        for i in range(40):
            X_w, entities, _ = traffic.window(i, surges)
            w = ClosedWindow(i * 300.0, (i + 1) * 300.0, X_w, np.zeros(0, bool), (), tuple(entities))
            rec = json.loads(releaser.release(w, released_at=(i + 1) * 300.0 + 10).entry.payload)
            rec["budget"].pop("accountant")
            out.append(rec)
        records[kind] = out
    kinds = [c["kind"] for r in records["basic"] for c in r["charges"]]
    assert {"alarm_run", "alarm_page", "baseline", "report"} <= set(kinds), kinds
    assert any(r["report"] and r["report"].get("suppressed") for r in records["basic"])  # the budget ran out
    assert records["pld"] == records["basic"]
