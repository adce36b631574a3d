"""The alarm's levels follow the fleet (docs/alarm.md, "What it measures"): a ladder of level
pairs, each rung's baseline totals kept apart, the rung chosen from the released event count,
and the choice kept across a restart."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from monitor.alarm import RESOLUTION, BaselineTracker, RhythmReference
from monitor.alarm.calibrate import (alarm_levels, fleet_rung, level_ladder, normal_weight_moments, rung_levels,
                                     rung_units, weight_units)
from monitor.budget import BudgetAccountant, WindowLedger
from monitor.config import parse_config
from monitor.data.traffic import Traffic
from monitor.data.vitals import VITAL_FEATURES
from monitor.pipeline.windows import ClosedWindow
from monitor.release import WindowReleaser

LADDER = ((0.01, 0.1), (0.005, 0.05), (0.002, 0.02))


def _config(tmp_path, **alarm):
    return parse_config({
        "features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
        "stream": {"entity_field": "device_id"},
        "window": {"size_seconds": 900},
        "alarm": {"baseline_warmup_seconds": 3600, **alarm},
        "report": {"on_alarm": False},
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "epsilon": 12.0, "accountant": "basic"},
    })


def _releaser(config, model, seed: int = 5) -> WindowReleaser:
    b = config.budget
    accountant = BudgetAccountant(WindowLedger(b.ledger), b.epsilon, b.delta, b.period_seconds, b.accountant)
    return WindowReleaser(config, accountant, model, rng=seed)


def _release(releaser: WindowReleaser, people: int, windows: range) -> list[dict]:
    traffic = Traffic(people=people, days=1, seed=3, window_seconds=900)
    out = []
    for i in windows:
        X, entities, _ = traffic.window(i, [])
        w = ClosedWindow(i * 900.0, (i + 1) * 900.0, X, np.zeros(0, bool), (), tuple(entities))
        out.append(json.loads(releaser.release(w, released_at=(i + 1) * 900.0).entry.payload))
    return out


def test_the_ladder_only_moves_to_sparser_levels_and_can_be_turned_off(tmp_path):
    on = _config(tmp_path).alarm
    assert [tuple(round(x, 9) for x in rung) for rung in level_ladder(on)] == [tuple(r) for r in LADDER]
    assert level_ladder(_config(tmp_path, levels_follow_fleet=False).alarm) == ((0.01, 0.1),)
    plain = _config(tmp_path, contamination_graded=None).alarm
    assert [rung[1] for rung in level_ladder(plain)] == [None, None, None]


@pytest.mark.parametrize("events, current, expected", [
    (300, None, 0), (1_500, None, 0), (2_500, None, 1), (3_000, None, 1), (10_000, None, 2), (50_000, None, 2),
    (4_000, 2, 2), (3_000, 2, 1), (2_000, 1, 1), (1_000, 1, 0), (0.0, None, 0),
])
def test_the_rung_puts_about_15_normal_events_above_the_upper_level(events, current, expected):
    assert fleet_rung(LADDER, events, current) == expected


def _weights(rng, people, windows, ladder_rows=3):
    """Per window: the people online and their weight at each rung (a sparser rung weighs less)."""
    out = []
    for _ in range(windows):
        ents = [p for p in people if rng.random() < 0.8]
        base = np.where(rng.random(len(ents)) < 0.4, rng.choice([1.0, 0.6, 0.2, 1e-9], len(ents)), 0.0)
        rows = np.stack([base * (rng.random(len(ents)) < 1.0 / (1 + r)) for r in range(ladder_rows)])
        if "p0" in ents:
            rows[:, ents.index("p0")] = 1.0  # heavy at every rung: reaches each cap
        out.append((ents, rows))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_each_rungs_totals_move_by_at_most_their_own_cap(seed):
    """Removing one person moves each rung's released histograms (the total's two parts, the
    day's profile) by at most that rung's span cap in L1, in the warm-up span and in a daily
    span after it (where the caps differ by rung)."""
    rng = np.random.default_rng(seed)
    people = [f"p{i}" for i in range(40)]
    warm, day = _weights(rng, people, 4), _weights(rng, people, 96)
    for gone in ("p0", "p3"):
        trackers = [BaselineTracker(0.5, 0.5, 900, 3600, 86400, flag_cap=8, release_kappa=True, profile_bins=24,
                                    levels=LADDER, rng=1) for _ in range(2)]
        for span in (warm, day):
            for t, drop in zip(trackers, (None, gone)):
                for w, (ents, rows) in enumerate(span):
                    keep = [i for i, e in enumerate(ents) if e != drop]
                    t.learn_one(w * 900, (w + 1) * 900, rows[:, keep], [ents[i] for i in keep])
            full, less = trackers
            for rung, (a, b) in enumerate(zip(full._totals, less._totals)):
                cap = full.span_cap(rung)
                assert np.abs(np.array([a.squared - b.squared, (a.flagged - a.squared) - (b.flagged - b.squared)])).sum() <= cap + 1e-9
                assert np.abs(a.bins - b.bins).sum() <= cap + 1e-9
                assert a.squared >= -1e-12 and a.flagged - a.squared >= -1e-12
            for t in trackers:
                t.release(len(span) * 900.0 if span is warm else 4 * 900.0 + 86400)
            # Neighbours are compared given the same released values: the next span's caps are a
            # function of the estimate in use.
            less.resume(full.estimate)
        assert full.span_cap(2) <= full.span_cap(0)  # a sparser rung's rate is lower: a smaller cap


def test_the_rung_is_chosen_from_the_released_count_alone():
    """Two spans with the same events and different weights release the same rung with the same
    seed (the count decides, before any weight is read), at the cost of one rung's release."""
    rng = np.random.default_rng(0)
    people = [f"p{i}" for i in range(3_000)]
    estimates = []
    for heavy in (0.0, 0.3):
        t = BaselineTracker(5.0, 5.0, 900, 3600, 86400, flag_cap=16, release_kappa=True, levels=LADDER, rng=4)
        for w in range(4):
            rows = np.stack([(rng.random(len(people)) < share * (1 + heavy)).astype(float) for share, _ in LADDER])
            t.learn_one(w * 900, (w + 1) * 900, rows, people)
        estimates.append(t.release(3600.0))
    single = BaselineTracker(5.0, 5.0, 900, 3600, 86400, flag_cap=16, release_kappa=True, rng=4)
    single.learn_one(0, 900, np.zeros(len(people)), people)
    assert estimates[0].levels == estimates[1].levels == LADDER[1]  # 3,000 a window: 0.5 %
    assert estimates[0].events_per_window == estimates[1].events_per_window
    assert estimates[0].epsilon == estimates[1].epsilon == single.epsilon
    assert estimates[0].rate == pytest.approx(0.005, rel=0.3)  # the chosen rung's own rate


def test_relevel_weighs_the_history_as_if_it_had_been_learnt_at_the_new_levels():
    rng = np.random.default_rng(2)
    people = [f"p{i}" for i in range(50)]
    old, new = (1.0, 2.0), (1.5, 2.5)
    moved = RhythmReference(300, recent_windows=4, seasonal_windows=3, period_seconds=3000)
    direct = RhythmReference(300, recent_windows=4, seasonal_windows=3, period_seconds=3000)
    for i in range(25):
        scores = rng.gamma(2.0, 0.6, len(people))
        moved.learn_one(i, weight_units(scores, *old, RESOLUTION), people, scores=scores)
        direct.learn_one(i, weight_units(scores.astype(np.float32).astype(float), *new, RESOLUTION), people)
    moved.relevel(lambda s: weight_units(s, *new, RESOLUTION))
    now = rng.gamma(2.0, 0.6, len(people))
    units = weight_units(now, *new, RESOLUTION)
    a = moved.compare(25, units, people, m=300, low_units=2400)
    b = direct.compare(25, units, people, m=300, low_units=2400)
    assert a == b and a.mode == "rhythm"
    moved.learn_one(25, units, people)  # no scores: forgotten at the next move
    moved.relevel(lambda s: weight_units(s, *old, RESOLUTION))
    assert 25 not in moved._windows and 24 in moved._windows


def test_a_large_fleet_moves_to_sparser_levels_at_its_first_baseline_and_keeps_them_after_a_restart(tmp_path, vitals_model):
    config = _config(tmp_path)
    releaser = _releaser(config, vitals_model)
    assert releaser.levels == rung_levels(vitals_model, config.alarm)  # the warm-up: as configured
    records = _release(releaser, 3_000, range(6))
    first = next(r for r in records if r["baseline"])
    assert first["baseline"]["levels"] == list(LADDER[1])
    assert records[-1]["baseline_in_use"]["levels"] == list(LADDER[1])
    # Each event weighs at the rung's own pair.
    assert releaser.levels == rung_levels(vitals_model, config.alarm, LADDER[1]) and len(releaser.levels) == 1
    assert releaser.levels[0] == alarm_levels(vitals_model, config.alarm, LADDER[1])
    assert records[-1]["alarm_detail"]["state"] in ("quiet", "fired")  # the alarm answers at the new levels
    # The rhythm reference's history was weighed again at the new levels.
    ids, units, _ = releaser.reference._windows[0]
    scores = releaser.reference._scores[0].astype(float)
    assert np.array_equal(units, rung_units(scores, releaser.levels, RESOLUTION))

    restarted = _releaser(config, vitals_model, seed=6)
    assert restarted.rung == 1 and restarted.baseline.estimate.levels == LADDER[1]
    assert restarted.levels == releaser.levels
    later = _release(restarted, 3_000, range(6, 8))
    assert later[-1]["alarm_detail"]["state"] in ("quiet", "fired")

    # A config whose ladder no longer holds those levels warms up again rather than use them.
    other = _config(tmp_path, contamination=0.02, contamination_graded=0.2)
    assert _releaser(other, vitals_model).baseline.estimate is None


def test_a_small_fleet_keeps_the_configured_levels(tmp_path, vitals_model):
    config = _config(tmp_path)
    releaser = _releaser(config, vitals_model)
    records = _release(releaser, 400, range(6))
    assert records[-1]["baseline_in_use"]["levels"] == list(LADDER[0])
    assert releaser.rung == 0 and releaser.levels == rung_levels(vitals_model, config.alarm)


def test_an_absolute_threshold_pins_the_levels(tmp_path, vitals_model):
    config = _config(tmp_path, threshold=40.0)
    releaser = _releaser(config, vitals_model)
    records = _release(releaser, 3_000, range(6))
    assert records[-1]["baseline_in_use"]["levels"] is None and releaser.rung == 0


def test_a_sparser_rungs_weight_is_its_own_pairs_and_its_moments_follow(vitals_model, tmp_path):
    """A sparser rung weighs at its own pair alone: its weight is that pair's (in [0, 1], so one
    person still moves a window by at most 1), and its normal weight from the model's calibration
    is below the configured pair's."""
    a = _config(tmp_path).alarm
    (dense,) = rung_levels(vitals_model, a)
    (sparse,) = rung_levels(vitals_model, a, LADDER[2])
    assert sparse[0] > dense[0] and sparse[1] > dense[1]  # a fifth of both shares: higher scores
    scores = np.concatenate([np.linspace(dense[0] - 1, sparse[1] + 1, 500), [dense[0], dense[1], sparse[0], sparse[1]]])
    units = rung_units(scores, (sparse,), RESOLUTION)
    assert np.array_equal(units, weight_units(scores, *sparse, RESOLUTION))
    assert units.min() == 0 and units.max() == RESOLUTION
    one = normal_weight_moments(vitals_model, (dense,), 0.01)
    low = normal_weight_moments(vitals_model, (sparse,), 0.01)
    assert 0 < low[0] < one[0] / 2


def test_a_ledger_from_before_the_ladder_resumes_at_the_configured_levels(tmp_path, vitals_model):
    """A baseline released before the levels followed the fleet has no ``levels``: it was taken at
    the configured pair, so a restart resumes it there instead of warming up again."""
    config = _config(tmp_path)
    _release(_releaser(config, vitals_model), 400, range(6))
    with sqlite3.connect(config.budget.ledger) as conn:  # every record as an older version wrote it
        for start, payload in conn.execute("SELECT window_start, payload FROM windows").fetchall():
            record = json.loads(payload)
            for key in ("baseline", "baseline_in_use"):
                if record.get(key):
                    del record[key]["levels"]
            conn.execute("UPDATE windows SET payload = ? WHERE window_start = ?", (json.dumps(record).encode(), start))
    restarted = _releaser(config, vitals_model)
    assert restarted.baseline.estimate is not None and restarted.baseline.estimate.levels == LADDER[0]
    assert restarted.rung == 0
