"""The report's 'where' (its privacy on neighbouring windows), the consistency projection, adversarial inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from monitor.config import ConfigError, ReportSettings, parse_config
from monitor.dp import noise_source
from monitor.report import candidate_parts, part_counts, pick_parts, project_nested, release_report

NAMES = ["temperature", "vibration", "current", "rpm", "pressure"]
FEATURES = [{"name": n, "min": 0, "max": 1} for n in NAMES]


# -- the pick's guarantee: exact output distributions on neighbouring windows ---------------

def _pick_probabilities(scores: np.ndarray, scale: float) -> np.ndarray:
    """P(argmax(scores + Exponential(scale))), exactly (numerical integration): the seeded
    report-noisy-max that ``NoiseSource.top_k`` draws for one pick."""
    lo, hi = scores.min(), scores.max() + 60 * scale
    x = np.linspace(lo, hi, 400_001)
    z = np.clip((x[None, :] - scores[:, None]) / scale, 0, None)
    cdf = np.where(x[None, :] >= scores[:, None], 1 - np.exp(-z), 0.0)
    pdf = np.where(x[None, :] >= scores[:, None], np.exp(-z) / scale, 0.0)
    out = np.empty(len(scores))
    for i in range(len(scores)):
        others = np.prod(np.delete(cdf, i, axis=0), axis=0)
        out[i] = np.trapezoid(pdf[i] * others, x)
    return out / out.sum()


def _window_pair(rng: np.random.Generator, n: int, g: int):
    """A small window (alarm flags, per-grid flags) and its neighbour with one event added."""
    flagged = rng.random(n) < 0.5
    G = rng.random((n, g)) < 0.4
    extra_f = rng.random() < 0.8
    extra_G = rng.random(g) < 0.5
    return (flagged, G), (np.append(flagged, extra_f), np.vstack([G, extra_G]))


@pytest.mark.parametrize("seed", range(6))
def test_the_pick_is_epsilon_dp_on_neighbouring_windows(seed):
    eps, share, events_noisy = 0.7, 0.05, 20.0
    rng = np.random.default_rng(seed)
    (f0, G0), (f1, G1) = _window_pair(rng, 12, 4)
    cands = [0, 1, 2, 3]
    c0, c1 = part_counts(f0, G0, cands), part_counts(f1, G1, cands)
    assert np.all((c1 - c0 >= 0) & (c1 - c0 <= 1))  # monotone, sensitivity 1
    # The scores pick_parts uses, given the (already released) noisy event count.
    p0 = _pick_probabilities(c0 - share * events_noisy, 1 / eps)
    p1 = _pick_probabilities(c1 - share * events_noisy, 1 / eps)
    ratio = np.maximum(p0 / p1, p1 / p0)
    assert ratio.max() <= math.exp(eps) * (1 + 1e-4)  # numerical integration: about 1e-5
    # ... and the neighbour is told apart at all when a count moved (the pick reads the counts).
    assert (ratio.max() > 1.01) == bool(np.any(c1 != c0))


def test_the_seeded_pick_draws_the_distribution_the_guarantee_is_about():
    counts = np.array([3.0, 5.0, 4.0, 0.0])
    eps = 0.8
    exact = _pick_probabilities(counts, 1 / eps)
    src = noise_source(7)
    draws = np.bincount([pick_parts(counts, np.zeros(4), 0.0, 1, eps, src)[0] for _ in range(20000)], minlength=4) / 20000
    assert np.abs(draws - exact).max() < 0.015


def test_the_pick_on_one_raised_count_comes_close_to_its_bound():
    # The worst neighbour for a monotone pick: one count goes up by 1, all others stay.
    # The ratio approaches e^eps (so a mistaken scale, e.g. half of 1/eps, would fail above).
    eps = 0.7
    p0 = _pick_probabilities(np.array([0.0, 0.0, 0.0]), 1 / eps)
    p1 = _pick_probabilities(np.array([1.0, 0.0, 0.0]), 1 / eps)
    assert math.exp(eps) * 0.8 < p1[0] / p0[0] <= math.exp(eps) * (1 + 1e-4)
    p_half = _pick_probabilities(np.array([1.0, 0.0, 0.0]), 0.5 / eps)
    assert p_half[0] / _pick_probabilities(np.array([0.0, 0.0, 0.0]), 0.5 / eps)[0] > math.exp(eps)


def test_candidates_are_the_one_feature_grids_when_there_are_two():
    assert candidate_parts([(0, 1, 2), (2, 3, 4), (0,), (3,)], 4) == [2, 3]
    assert candidate_parts([(0, 1, 2), (2, 3, 4), (0,)], 3) == [0, 1, 2]
    assert candidate_parts(None, 3) == [0, 1, 2]


def test_parts_count_flagged_events_only_so_they_are_parts_of_the_flagged_count():
    flagged = np.array([True, False, True, True])
    G = np.array([[1, 1], [1, 1], [0, 1], [1, 1]], bool)
    assert part_counts(flagged, G, [0, 1]).tolist() == [2.0, 3.0]


# -- the projection -------------------------------------------------------------------------

finite = st.floats(-1e6, 1e6, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(finite, min_size=2, max_size=6), st.lists(st.floats(1e-4, 1e4), min_size=6, max_size=6), st.data())
def test_projection_is_never_negative_and_no_part_exceeds_its_whole(values, weights, data):
    m = len(values)
    parents = [-1] + [data.draw(st.integers(-1, i - 1)) for i in range(1, m)]
    x = project_nested(values, weights[:m], parents)
    assert np.all(x >= 0)
    for i, p in enumerate(parents):
        if p >= 0:
            assert x[i] <= x[p]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-500, 5000, allow_nan=False), min_size=3, max_size=5), st.data())
def test_projection_is_the_closest_consistent_point(values, data):
    # Against random consistent points: none is closer (weighted) than the projection.
    m = len(values)
    parents = [-1, 0] + [1] * (m - 2)  # events >= flagged >= each part, the report's tree
    w = np.array(data.draw(st.lists(st.floats(0.01, 10), min_size=m, max_size=m)))
    y = np.array(values)
    x = project_nested(y, w, parents)
    best = float(np.dot(w, (x - y) ** 2))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    for _ in range(300):
        z = np.empty(m)
        z[0] = abs(rng.normal(x[0], 100))
        z[1] = rng.uniform(0, z[0])
        z[2:] = rng.uniform(0, z[1], m - 2)
        assert np.dot(w, (z - y) ** 2) >= best - 1e-6 * (1 + best)


def test_projection_fixes_the_issue_example_and_keeps_consistent_values():
    # flagged 23 but a part 89: both meet in between, weighted by their precision.
    x = project_nested([300.0, 23.0, 89.0], [1 / 100**2, 1 / 60**2, 1 / 30**2], [-1, 0, 1])
    assert x[0] == 300.0 and x[1] == x[2] and 23 < x[2] < 89
    assert project_nested([300.0, 40.0, 12.0], [1, 1, 1], [-1, 0, 1]).tolist() == [300.0, 40.0, 12.0]


@pytest.mark.parametrize("bad", [[float("nan"), 1.0], [float("inf"), 1.0]])
def test_projection_refuses_non_finite_values(bad):
    with pytest.raises(ValueError, match="finite"):
        project_nested(bad, [1.0, 1.0], [-1, 0])


def test_projection_refuses_a_child_before_its_parent():
    with pytest.raises(ValueError, match="parent"):
        project_nested([1.0, 2.0], [1.0, 1.0], [1, -1])


# -- the report on adversarial windows --------------------------------------------------------

def _grids(n: int, rng) -> np.ndarray:
    return rng.random((n, 8)) < 0.5


LAYOUT = [(0, 1, 2), (2, 3, 4), (0, 3, 4)] + [(i,) for i in range(5)]
GRID_NAMES = ["+".join(NAMES[i] for i in g) for g in LAYOUT]


@pytest.mark.parametrize("case", ["empty", "all_flagged", "duplicates", "corners", "one_event"])
def test_adversarial_windows_give_consistent_finite_reports(case):
    rng = np.random.default_rng(3)
    n = {"empty": 0, "one_event": 1}.get(case, 400)
    X = rng.random((n, 5))
    if case == "duplicates":
        X[:] = X[0]
    if case == "corners":
        X = rng.integers(0, 2, (n, 5)).astype(float)
    flagged = np.ones(n, bool) if case in ("all_flagged", "duplicates") else rng.random(n) < 0.1
    G = _grids(n, rng)
    settings_ = ReportSettings(top_grids=3, epsilon_count=1.0, top_h=2)
    for seed in range(20):
        rec = release_report(X, flagged, settings_, NAMES, rng=seed, grid_flagged=G, grid_names=GRID_NAMES,
                             grid_features=LAYOUT, normal_share=0.01, reason="alarm")
        n_, f_ = rec["event_count"]["value"], rec["flagged_count"]["value"]
        assert 0 <= f_ <= n_ and math.isfinite(n_)
        assert 0 <= rec["outlier_count"]["value"] <= n_
        for part in rec["where"]["parts"]:
            assert 0 <= part["flagged_count"]["value"] <= f_
            assert part["excess"]["value"] >= 0 and part["features"][0] in NAMES and len(part["features"]) == 1
        for t in rec["top_subspaces"]:
            assert 0 <= t["count"]["value"] <= n_
        assert rec["where"]["features"] and rec["headline"].startswith("surge in ")


def test_the_where_names_the_feature_that_carries_the_flags():
    # 300 events, 40 flagged; the flagged ones are unusual in 'current' (one-feature grid 4).
    rng = np.random.default_rng(0)
    n = 300
    flagged = np.zeros(n, bool)
    flagged[:40] = True
    G = rng.random((n, 8)) < 0.01
    G[:40, 3 + 2] = True
    names = []
    for seed in range(50):
        rec = release_report(rng.random((n, 5)), flagged, ReportSettings(), NAMES, rng=seed, grid_flagged=G,
                             grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.01, reason="alarm")
        names.append(tuple(rec["where"]["features"]))
    assert names.count(("current",)) >= 45


def test_a_later_part_is_named_only_when_its_excess_is_clear():
    rng = np.random.default_rng(1)
    n = 1500
    flagged = np.zeros(n, bool)
    flagged[:300] = True
    G = np.zeros((n, 8), bool)
    G[:300, 3] = True  # temperature: all 300
    G[:200, 4] = True  # vibration: 200, far above its normal share
    rec = release_report(rng.random((n, 5)), flagged, ReportSettings(top_grids=3, epsilon_grid_count=0.5), NAMES, rng=2,
                         grid_flagged=G, grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.01, reason="alarm")
    assert rec["where"]["features"] == ["temperature", "vibration"]
    assert len(rec["where"]["parts"]) == 3  # the third pick is published, not named
    assert rec["headline"].startswith("surge in temperature+vibration: +")


# -- the config check: no epsilon on a count that is noise ----------------------------------------

def test_a_count_wider_than_any_window_is_refused_at_config_check():
    with pytest.raises(ConfigError, match=r"report\.epsilon_count.*13,241.*report\.max_events"):
        parse_config({"features": FEATURES, "report": {"epsilon_count": 0.05}})
    with pytest.raises(ConfigError, match=r"report\.epsilon_top_count"):
        parse_config({"features": FEATURES, "report": {"top_h": 1, "max_events": 2000}})
    # Where the epsilon makes the interval narrower than a window, the seed's count is allowed.
    cfg = parse_config({"features": FEATURES, "report": {"top_h": 1, "epsilon_top_count": 0.2, "max_events": 2000}})
    assert cfg.report.count_accuracies(5, 9)["epsilon_top_count"] * 2 < 2000


def test_every_count_the_shipped_config_publishes_is_narrower_than_its_plausible_range():
    from pathlib import Path

    from monitor.config import load_config

    cfg = load_config(Path(__file__).resolve().parent.parent / "config.yaml")
    acc = cfg.report.count_accuracies(len(cfg.features), 9)
    assert set(acc) == {"epsilon_events", "epsilon_flagged", "epsilon_grid_count"}
    assert all(2 * half < cfg.report.max_events for half in acc.values())
    assert cfg.report_cost()[0] <= 0.3
