"""Normal traffic's parts (docs/report.md): each daily baseline also releases how the flagged
weight spreads over the report's parts, and pays for it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitor.alarm import BaselineEstimate, BaselineTracker
from monitor.config import parse_config


def _tracker(cap: int | None = 3, eps_parts: float = 0.5, rng=0, warmup: float = 120.0) -> BaselineTracker:
    return BaselineTracker(1.0, 1.0, window_seconds=60, warmup_seconds=warmup, refresh_seconds=240, flag_cap=cap,
                           epsilon_parts=eps_parts, n_parts=3, rng=rng)


def _feed(t: BaselineTracker, start: float, windows: int, heavy: bool) -> None:
    """Windows of 30 people; person "heavy" (when present) weighs 1 in every window, in a
    part that changes each window (the worst case for a per-part bound)."""
    for i in range(windows):
        w = np.array([1.0, 0.0, 0.4, 0.0, 1.0, 0.0] + [0.0] * 24 + ([1.0] if heavy else []))
        parts = np.array([0, 0, 1, 2, 2, 1] + [0] * 24 + ([i % 3] if heavy else []))
        ents = [f"p{j}" for j in range(30)] + (["heavy"] if heavy else [])
        t.learn_one(start + 60 * i, start + 60 * (i + 1), w, ents, parts=parts)


@pytest.mark.parametrize("cap,windows", [(3, 4), (3, 2), (None, 4)])
def test_one_unit_moves_the_parts_by_at_most_the_flagged_totals_sensitivity(cap, windows):
    a, b = _tracker(cap), _tracker(cap)
    _feed(a, 0, windows, heavy=False)
    _feed(b, 0, windows, heavy=True)
    moved = np.abs(b._totals[0].parts - a._totals[0].parts).sum()
    bound = (1 if cap is None else min(cap, windows)) if cap is not None else windows  # no cap: one event per unit
    assert moved == pytest.approx(b._totals[0].flagged - a._totals[0].flagged)  # the parts hold exactly the flagged total
    if cap is not None:
        assert moved == pytest.approx(min(cap, windows))  # reached: the bound is tight
    assert moved <= bound + 1e-12


def test_the_warm_up_estimate_has_no_parts_and_does_not_pay_for_them():
    t = _tracker()
    assert t.epsilon == 2.0  # warm-up: flagged and events only
    _feed(t, 0, 2, heavy=False)
    first = t.release(120)
    assert first.normal_parts is None and first.epsilon == 2.0
    assert t.epsilon == 2.5  # a daily estimate pays epsilon_parts too
    _feed(t, 120, 4, heavy=False)
    second = t.release(360)
    assert second.epsilon == 2.5 and len(second.normal_parts) == 3
    assert math.fsum(second.normal_parts) == pytest.approx(1.0) and min(second.normal_parts) >= 0.0
    again = BaselineEstimate.from_dict(second.as_dict())  # a restart reads it back from the alert record
    assert again == second


def test_parts_need_one_index_per_event_inside_the_range():
    t = _tracker()
    with pytest.raises(ValueError, match="one part per event"):
        t.learn_one(0, 60, np.array([1.0, 0.0]), ["a", "b"])
    with pytest.raises(ValueError, match="outside"):
        t.learn_one(0, 60, np.array([1.0, 0.0]), ["a", "b"], parts=np.array([3, 0]))
    with pytest.raises(ValueError, match="at least 2 parts"):
        BaselineTracker(1.0, 1.0, 60, 120, 240, epsilon_parts=0.1, n_parts=1)


def _released_part0(heavy: bool, seed: int, capture: list) -> float:
    t = _tracker(cap=2, eps_parts=1.0, rng=seed, warmup=60.0)
    _feed(t, 0, 1, heavy=False)
    t.release(60)  # the warm-up estimate
    for i in range(4):  # the heavy unit's weight all in part 0: its count moves by the full cap
        t.learn_one(60 + 60 * i, 120 + 60 * i, np.array([1.0, 0.4] + [0.0] * 28 + ([1.0] if heavy else [])),
                    [f"p{j}" for j in range(30)] + (["heavy"] if heavy else []),
                    parts=np.array([0, 1] + [2] * 28 + ([0] if heavy else [])))
    t.release(300)
    return capture[-1][0]


def test_released_parts_of_neighbouring_spans_are_within_e_to_the_epsilon(monkeypatch):
    # The noisy part totals (what the shares are computed from) on spans that differ by one
    # heavy unit, clipped at 2 weights: every bin's probability ratio within e^epsilon_parts,
    # up to sampling error, and the bound nearly reached in the tails (so too little noise
    # would show).
    import monitor.alarm.baseline as baseline

    capture: list = []
    real = baseline._shares
    monkeypatch.setattr(baseline, "_shares", lambda noisy: (capture.append(np.array(noisy)), real(noisy))[1])
    eps, trials = 1.0, 3000
    s0 = np.array([_released_part0(False, 2 * i, capture) for i in range(trials)])
    s1 = np.array([_released_part0(True, 2 * i + 1, capture) for i in range(trials)])
    edges = np.quantile(np.concatenate([s0, s1]), np.linspace(0, 1, 11))
    h0, _ = np.histogram(s0, edges)
    h1, _ = np.histogram(s1, edges)
    ok = (h0 >= 100) & (h1 >= 100)
    ratios = np.abs(np.log(h1[ok] / h0[ok]))
    assert ratios.max() <= eps + 0.2
    assert ratios.max() >= 0.6 * eps


def test_the_daily_baseline_pays_for_the_parts_only_when_reports_say_where():
    features = [{"name": f"x{i}", "min": 0, "max": 1} for i in range(5)]
    on = parse_config({"features": features})
    off = parse_config({"features": features, "report": {"on_alarm": False}})
    none = parse_config({"features": features, "report": {"epsilon_normal_parts": None}})
    assert on.baseline_cost()[0] == pytest.approx(on.alarm.baseline_epsilon + 0.025)
    assert off.baseline_cost()[0] == none.baseline_cost()[0] == pytest.approx(on.alarm.baseline_epsilon)
    one_feature = parse_config({"features": features[:1]})  # one grid: no 'where', nothing to pay
    assert one_feature.baseline_cost()[0] == pytest.approx(one_feature.alarm.baseline_epsilon)


def test_before_the_parts_are_released_a_wrong_guess_names_nothing_on_quiet_windows():
    # The model's guess of the parts can be far off (on the vitals simulator it gave activity
    # a seventh of the normal flags where live traffic put more than half). The releaser does
    # not rely on it (MODEL_PARTS_ERROR is unbounded): a part is named only beyond the whole
    # normal weight, so quiet windows whose normal flags all sit in a part the guess calls
    # light name a feature in at most 5 % of reports. Taking the guess within a factor 2
    # (the rule before) names that part on most of them.
    from monitor.config import ReportSettings
    from monitor.release import MODEL_PARTS_ERROR
    from monitor.report import release_report

    assert MODEL_PARTS_ERROR == math.inf
    names = ["a", "b", "c", "d", "e"]
    layout = [(i,) for i in range(5)]
    guess = np.array([0.3, 0.3, 0.3, 0.05, 0.05])
    truth = np.array([0.01, 0.01, 0.01, 0.95, 0.02])  # part d holds nearly all normal flags
    rng = np.random.default_rng(21)
    named = {math.inf: 0, 1.0: 0}
    for seed in range(100):
        n = 1500
        flagged = rng.random(n) < 0.02
        U = rng.random((n, 5)) * 0.1
        U[np.arange(n), rng.choice(5, size=n, p=truth)] = 1.0
        for error in named:
            rec = release_report(np.zeros((n, 5)), flagged, ReportSettings(), names, rng=seed, grid_unusual=U,
                                 grid_names=names, grid_features=layout, normal_share=0.02, normal_parts=guess,
                                 normal_error=error)
            named[error] += bool(rec["where"]["features"])
    assert named[math.inf] <= 5
    assert named[1.0] >= 50


def test_a_model_of_one_joint_grid_reports_by_feature(tmp_path):
    """Few features and many rows: the model is one fine joint grid (docs/model.md), which alone
    cannot say which feature makes an event unusual. Its report parts are then the features, and
    each flagged event goes to the one whose change to its most usual value beside the others
    lowers the score most (``GridKNN.part_scores``): one part per event, so the histogram's
    sensitivity is unchanged, and a surge in one feature is named."""
    from monitor.model import GridKNN

    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(75, 10, 8000), rng.normal(96, 1.5, 8000)])
    model = GridKNN(epsilon=1.0, bounds=[(30, 220), (70, 100)], contamination=0.05, random_state=0,
                    feature_names=["hr", "spo2"]).fit(X)
    assert len(model.grids_) == 1 and model.report_parts() == [(0,), (1,)]
    # Each event in one part: the attribution is a function of the event and the public model.
    probe = np.array([[200.0, 96.0], [75.0, 72.0], [200.0, 72.0], [75.0, 96.0]])
    scores = model.part_scores(probe)
    assert scores.shape == (4, 2) and np.all(scores >= 0) and scores[0, 0] > scores[0, 1] and scores[1, 1] > scores[1, 0]
    config, releaser = _reporting_releaser(tmp_path, model, [{"name": "hr", "min": 30, "max": 220},
                                                              {"name": "spo2", "min": 70, "max": 100}])
    assert releaser.grid_names == ["hr", "spo2"] and releaser.report_cost == config.report_cost()
    window = np.column_stack([rng.normal(75, 10, 1500), rng.normal(96, 1.5, 1500)])
    window[:300, 0] = rng.uniform(170, 210, 300)  # a surge in heart rate alone
    assert _where(releaser, window)["features"] == ["hr"]


def _reporting_releaser(tmp_path, model, features: list[dict]):
    """(config, WindowReleaser) reporting on every 300 s window, alarm off, a fresh ledger."""
    from monitor.budget import BudgetAccountant, WindowLedger
    from monitor.config import parse_config
    from monitor.release import WindowReleaser

    config = parse_config({
        "features": features,
        "window": {"size_seconds": 300},
        "alarm": {"enabled": False},
        "report": {"every_seconds": 300, "on_alarm": False},
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "epsilon": 50.0},
    })
    b = config.budget
    return config, WindowReleaser(config, BudgetAccountant(WindowLedger(b.ledger), b.epsilon, b.delta,
                                                           b.period_seconds), model, rng=1)


def _where(releaser, window: np.ndarray) -> dict:
    """The report's 'where' of one released window."""
    import json

    from monitor.pipeline.windows import ClosedWindow

    rec = json.loads(releaser.release(ClosedWindow(0.0, 300.0, window, np.zeros(0, bool), ()), released_at=300.0)
                     .entry.payload)
    return rec["report"]["where"]


def test_a_model_of_many_features_reports_by_feature(tmp_path):
    """From 12 features the model is joint grids only (docs/model.md), so its report parts are the
    features, attributed as for one joint grid. With 12 features it has 12 grids: the report must
    still read each feature's drop, not a grid's calibration histogram of the same index."""
    from monitor.model import GridKNN
    from monitor.report.where import grid_unusual

    rng = np.random.default_rng(1)
    names = [f"f{i}" for i in range(12)]
    model = GridKNN(epsilon=1.0, bounds=[(0, 100)] * 12, contamination=0.05, random_state=0,
                    feature_names=names).fit(rng.normal(50, 5, (3000, 12)))
    assert all(len(g.features) == 3 for g in model.grids_) and len(model.grids_) == 12
    assert not model.parts_are_grids() and model.report_parts() == [(i,) for i in range(12)]
    probe = rng.normal(50, 5, (120, 12))
    off = np.arange(120) % 12
    probe[np.arange(120), off] = 95.0
    assert (grid_unusual(model, probe, model.part_thresholds(0.05)).argmax(axis=1) == off).mean() >= 0.95
    _, releaser = _reporting_releaser(tmp_path, model, [{"name": n, "min": 0, "max": 100} for n in names])
    assert releaser.grid_names == names
    window = rng.normal(50, 5, (1500, 12))
    window[:300, 3] = rng.uniform(85, 95, 300)  # a surge in f3 alone
    assert _where(releaser, window)["features"] == ["f3"]
