"""release_window: the private part of the alert record, with no broker."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monitor.config import ReleaseSettings

from monitor import outliers
from monitor.outliers import candidate_subspaces
from monitor.release import release_window

NAMES = ["hr", "spo2", "temp"]
MECHANISMS = {"laplace_global", "laplace_smooth", "gaussian_smooth", "student_t_smooth_snapped"}


@pytest.fixture
def window() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    X = np.clip(rng.normal(0.5, 0.05, size=(300, 3)), 0, 1)
    X[:7, 1] = rng.uniform(0.9, 1.0, 7)  # a few outliers along spo2
    flagged = np.zeros(300, dtype=bool)
    flagged[:12] = True
    return X, flagged


def test_record_shape_and_total_cost(window):
    X, flagged = window
    settings = ReleaseSettings(top_h=2)
    rec = release_window(X, flagged, settings, NAMES, rng=3)
    assert set(rec) == {"outlier_count", "flagged_count", "top_subspaces", "top_subspaces_epsilon", "epsilon", "delta"}
    assert rec["flagged_count"]["mechanism"] == "laplace_global"
    assert rec["flagged_count"]["epsilon"] == settings.epsilon_flagged and rec["flagged_count"]["delta"] == 0.0
    assert rec["outlier_count"]["mechanism"] in MECHANISMS
    assert rec["outlier_count"]["epsilon"] == settings.epsilon_count
    assert [t["rank"] for t in rec["top_subspaces"]] == [1, 2]
    for t in rec["top_subspaces"]:
        assert t["features"] == [NAMES[i] for i in t["subspace"]]
        assert set(t["count"]) == {"value", "epsilon", "delta", "mechanism"}
        assert t["count"]["epsilon"] == settings.epsilon_top_count
    parts = [rec["outlier_count"], rec["flagged_count"]] + [t["count"] for t in rec["top_subspaces"]]
    assert rec["epsilon"] == pytest.approx(sum(p["epsilon"] for p in parts) + rec["top_subspaces_epsilon"])
    # A pure mechanism (Student's t, global Laplace) reports delta 0 though delta was budgeted.
    assert rec["delta"] >= sum(p["delta"] for p in parts)
    assert (rec["epsilon"], rec["delta"]) == settings.window_cost(len(NAMES))
    json.dumps(rec)  # plain JSON types only


def test_seeded_release_is_reproducible_and_unseeded_is_not(window):
    X, flagged = window
    settings = ReleaseSettings()
    assert release_window(X, flagged, settings, NAMES, rng=9) == release_window(X, flagged, settings, NAMES, rng=9)
    a = release_window(X, flagged, settings, NAMES)
    b = release_window(X, flagged, settings, NAMES)
    assert a["flagged_count"]["value"] != b["flagged_count"]["value"]


def test_values_track_the_truth_with_a_large_budget(window):
    X, flagged = window
    settings = ReleaseSettings(epsilon_count=1e4, epsilon_flagged=1e4, top_h=0, delta_count=1e-6)
    rec = release_window(X, flagged, settings, NAMES, rng=0)
    assert rec["flagged_count"]["value"] == pytest.approx(12, abs=0.01)
    true = outliers.count_outliers(X, settings.k, settings.radius)
    assert rec["outlier_count"]["value"] == pytest.approx(true, abs=1.0)
    assert rec["top_subspaces"] == [] and rec["top_subspaces_epsilon"] == 0.0


def test_empty_window_releases_noise_around_zero():
    settings = ReleaseSettings(top_h=1)
    values = [release_window(np.zeros((0, 3)), np.zeros(0, bool), settings, NAMES, rng=s)["flagged_count"]["value"]
              for s in range(200)]
    assert abs(np.mean(values)) < 3 * np.std(values) / np.sqrt(200) + 1e-9
    assert np.std(values) > 0


def test_top_h_is_capped_at_the_number_of_subspaces(window):
    X, flagged = window
    settings = ReleaseSettings(top_h=5, subspace_dims=2)
    rec = release_window(X, flagged, settings, NAMES, rng=1)
    assert len(rec["top_subspaces"]) == 3 == len(candidate_subspaces(3, 2))
    assert (rec["epsilon"], rec["delta"]) == settings.window_cost(3)
    uncapped = settings.epsilon_count + settings.epsilon_flagged + settings.epsilon_top + settings.top_h * settings.epsilon_top_count
    assert rec["epsilon"] < uncapped  # the record states what is really spent


def test_flagged_must_match_the_window(window):
    X, _ = window
    with pytest.raises(ValueError, match="flagged"):
        release_window(X, np.zeros(3, bool), ReleaseSettings(), NAMES, rng=1)
