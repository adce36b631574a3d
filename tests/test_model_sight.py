"""Can the model flag anything? The public probe of a released model (monitor.model.sight)."""

from __future__ import annotations

import csv
from importlib import resources

import numpy as np
import pytest

from monitor.alarm.calibrate import alarm_levels
from monitor.config import AlarmSettings
from monitor.model import GridKNN
from monitor.model.sight import SIGHT_BLIND, model_sight

VITALS_BOUNDS = [(30, 220), (70, 100), (30, 42), (4, 40), (0, 10)]


def vitals() -> np.ndarray:
    with resources.files("monitor.data").joinpath("reference-vitals.csv").open() as fh:
        return np.array(list(csv.reader(fh))[1:], dtype=float)


def fit(rows: int, seed: int) -> GridKNN:
    return GridKNN(epsilon=1.0, bounds=VITALS_BOUNDS, contamination=0.05, random_state=seed).fit(vitals()[:rows])


@pytest.mark.parametrize("seed", [1, 3, 4])
def test_a_few_hundred_rows_are_blind_and_the_bundled_data_is_not(seed):
    small, full = fit(357, seed), fit(4000, seed)
    s_small = model_sight(small, *alarm_levels(small, AlarmSettings()))
    s_full = model_sight(full, *alarm_levels(full, AlarmSettings()))
    assert s_small.blind and s_small.sight < SIGHT_BLIND, s_small
    assert not s_full.blind and s_full.sight > 0.8 and s_full.flagged_share > 0.8, s_full
    # what would be enough: more rows or more epsilon, only for the blind one
    assert s_small.rows_needed > 1000 and s_small.epsilon_needed > 2.0, s_small
    assert s_full.rows_needed is None and s_full.advice() == ""


def test_the_probe_is_public_post_processing_of_the_model_file(tmp_path):
    """The model file alone gives the same measure: only released cells and public seeds go in."""
    m = fit(357, 1)
    m.save(tmp_path / "model.json")
    loaded = GridKNN.load(tmp_path / "model.json")
    levels = alarm_levels(m, AlarmSettings())
    assert alarm_levels(loaded, AlarmSettings()) == levels
    assert model_sight(loaded, *levels) == model_sight(m, *levels)


def test_a_blind_probe_matches_real_far_off_rows():
    """Rows with one feature far outside the normal range: a blind model leaves most of them
    under its upper level, a sighted one flags almost all."""
    rng = np.random.default_rng(7)
    X = vitals()
    far = X[rng.integers(0, 4000, 400)].copy()
    far[:, 3] = rng.uniform(34, 40, 400)  # resp_rate, normal about 12 to 22
    small, full = fit(357, 4), fit(4000, 4)
    t_small = alarm_levels(small, AlarmSettings())[1]
    t_full = alarm_levels(full, AlarmSettings())[1]
    assert (small.score_samples(far) > t_small).mean() < 0.2
    assert (full.score_samples(far) > t_full).mean() > 0.8
