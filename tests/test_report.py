"""The report's 'where' (its privacy on neighbouring windows), the consistency projection, adversarial inputs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from monitor.budget import BudgetAccountant, WindowLedger
from monitor.config import ConfigError, ReportSettings, parse_config
from monitor.data.traffic import Traffic
from monitor.data.vitals import VITAL_FEATURES
from monitor.pipeline.windows import ClosedWindow
from monitor.release import WindowReleaser
from monitor.dp import noise_source
from monitor.report import candidate_parts, part_counts, project_nested, project_partition, release_parts, release_report

NAMES = ["temperature", "vibration", "current", "rpm", "pressure"]
FEATURES = [{"name": n, "min": 0, "max": 1} for n in NAMES]


# -- the 'where' histogram's guarantee on neighbouring windows ---------------------------------

def _window_pair(rng: np.random.Generator, n: int, g: int):
    """A small window (alarm flags, per-grid unusualness) and its neighbour with one event added."""
    flagged = rng.random(n) < 0.5
    U = rng.random((n, g))
    return (flagged, U), (np.append(flagged, rng.random() < 0.8), np.vstack([U, rng.random(g)]))


@pytest.mark.parametrize("seed", range(20))
def test_the_parts_histogram_moves_by_at_most_one_in_total_on_a_neighbour(seed):
    rng = np.random.default_rng(seed)
    (f0, U0), (f1, U1) = _window_pair(rng, 15, 5)
    c0, c1 = part_counts(f0, U0, range(5)), part_counts(f1, U1, range(5))
    assert np.abs(c1 - c0).sum() <= 1 and np.all(c1 >= c0)
    assert c0.sum() == f0.sum()  # every flagged event is in exactly one part


def _laplace_density(x: np.ndarray, centre: np.ndarray, scale: float) -> float:
    return float(np.prod(np.exp(-np.abs(x - centre) / scale) / (2 * scale)))


@pytest.mark.parametrize("seed", range(4))
def test_the_released_histogram_is_epsilon_dp_on_neighbouring_windows(seed):
    # Density ratio of the released vector at the draws of either window: within e^eps.
    eps = 0.5
    rng = np.random.default_rng(seed)
    (f0, U0), (f1, U1) = _window_pair(rng, 12, 4)
    c0, c1 = part_counts(f0, U0, range(4)), part_counts(f1, U1, range(4))
    src = noise_source(seed)
    worst = 0.0
    for _ in range(500):
        x = np.array([r.value for r in release_parts(c0, eps, src)])
        worst = max(worst, abs(math.log(_laplace_density(x, c0, 1 / eps) / _laplace_density(x, c1, 1 / eps))))
    assert worst <= eps + 1e-9
    assert (worst > 0.9 * eps) == bool(np.any(c0 != c1))  # the bound is reached where a count moved


def test_the_pick_by_largest_noisy_part_follows_report_noisy_max():
    # Argmax of the released histogram is report-noisy-max with Laplace noise: the seeded
    # draws pick the larger count about as often as the exact two-candidate formula says.
    eps, gap = 0.2, 10.0
    src = noise_source(11)
    wins = np.mean([release_parts(np.array([gap, 0.0]), eps, src)[0].value > release_parts(np.array([0.0]), eps, src)[0].value
                    for _ in range(8000)])
    # P(L1 - L2 > -gap) for independent Laplace(1/eps): 1 - 0.5 e^{-eps gap}(1 + eps gap / 2)
    exact = 1 - 0.5 * math.exp(-eps * gap) * (1 + eps * gap / 2)
    assert abs(wins - exact) < 0.02


def test_candidates_are_the_one_feature_grids_when_there_are_two():
    assert candidate_parts([(0, 1, 2), (2, 3, 4), (0,), (3,)], 4) == [2, 3]
    assert candidate_parts([(0, 1, 2), (2, 3, 4), (0,)], 3) == [0, 1, 2]
    assert candidate_parts(None, 3) == [0, 1, 2]


def test_parts_count_each_flagged_event_once_by_its_most_unusual_grid():
    flagged = np.array([True, False, True, True])
    U = np.array([[0.9, 0.1], [0.9, 0.1], [0.2, 0.5], [np.nan, 0.3]])
    assert part_counts(flagged, U, [0, 1]).tolist() == [1.0, 2.0]  # NaN never wins


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


@settings(max_examples=300, deadline=None)
@given(finite, finite, st.lists(finite, min_size=0, max_size=8), st.lists(st.floats(1e-4, 1e4), min_size=10, max_size=10))
def test_partition_projection_keeps_parts_non_negative_summing_to_a_whole_within_events(e, f, parts, w):
    e2, f2, p = project_partition(e, f, parts, w[0], w[1], w[2:2 + len(parts)])
    assert e2 >= f2 >= 0 and np.all(p >= 0) and np.all(p <= f2)
    if len(parts):
        assert abs(p.sum() - f2) <= 1e-9 * max(1.0, f2)


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
    return rng.random((n, 8))


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
    settings_ = ReportSettings(epsilon_count=1.0, top_h=2)
    for seed in range(20):
        rec = release_report(X, flagged, settings_, NAMES, rng=seed, grid_unusual=G, grid_names=GRID_NAMES,
                             grid_features=LAYOUT, normal_share=0.01, reason="alarm")
        n_, f_ = rec["event_count"]["value"], rec["flagged_count"]["value"]
        assert 0 <= f_ <= n_ and math.isfinite(n_)
        assert 0 <= rec["outlier_count"]["value"] <= n_
        assert sum(p["flagged_count"]["value"] for p in rec["where"]["parts"]) == pytest.approx(f_, abs=1e-6)
        for part in rec["where"]["parts"]:
            assert 0 <= part["flagged_count"]["value"] <= f_
            assert part["excess"]["value"] >= 0 and part["features"][0] in NAMES and len(part["features"]) == 1
        for t in rec["top_subspaces"]:
            assert 0 <= t["count"]["value"] <= n_
        assert rec["headline"].startswith("surge")


def _carried(rng, n: int, carriers: dict[int, tuple[int, int]], spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """A window of n events whose flagged ones are most unusual by a given grid: ``carriers``
    maps a grid to the [start, stop) rows it carries. (flags, grid_unusual)."""
    flagged = np.zeros(n, bool)
    flagged[:max(stop for _, stop in carriers.values())] = True
    U = rng.random((n, 8)) * spread
    for grid, (start, stop) in carriers.items():
        U[start:stop, grid] = 2.0 * spread  # above every other grid's value
    return flagged, U


def test_the_where_names_the_feature_that_carries_the_flags():
    # 300 events, 40 flagged; the flagged ones are most unusual in 'current' (one-feature grid 5).
    rng = np.random.default_rng(0)
    n = 300
    flagged, U = _carried(rng, n, {5: (0, 40)})
    names = []
    for seed in range(50):
        rec = release_report(rng.random((n, 5)), flagged, ReportSettings(), NAMES, rng=seed, grid_unusual=U,
                             grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.01, reason="alarm")
        names.append(tuple(rec["where"]["features"]))
    assert names.count(("current",)) >= 45


def test_two_features_that_carry_a_surge_are_both_named_and_a_normal_heavy_one_is_not():
    rng = np.random.default_rng(1)
    n = 1500
    # temperature carries 120 flagged events, vibration 100, rpm 40: what normal traffic puts
    # there (its share of the normal flags), so rpm does not stand out
    flagged, U = _carried(rng, n, {3: (0, 120), 4: (120, 220), 6: (220, 260)}, spread=0.1)
    normal_parts = [0.05, 0.05, 0.05, 0.8, 0.05]
    rec = release_report(rng.random((n, 5)), flagged, ReportSettings(), NAMES, rng=2, grid_unusual=U,
                         grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.033, normal_parts=normal_parts,
                         reason="alarm")
    assert rec["where"]["features"] == ["temperature", "vibration"]
    assert rec["headline"].startswith("surge in temperature+vibration: +")
    assert len(rec["where"]["parts"]) == 5  # the whole histogram is published


def test_a_guessed_normal_does_not_let_a_heavy_feature_lead_on_its_own():
    # The guess says rpm holds half of normal traffic's flags (37.5 of 75 here); the stream
    # holds 80 there (it is heavier than guessed) and a surge of 50 in temperature. Taken at
    # face value rpm stands out too; counting the guess's own error (its size) only
    # temperature does.
    rng = np.random.default_rng(3)
    n = 1500
    flagged, U = _carried(rng, n, {3: (0, 50), 6: (50, 130)}, spread=0.1)  # temperature: the surge; rpm
    guess = [0.125, 0.125, 0.125, 0.5, 0.125]
    kw = dict(grid_unusual=U, grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.05, normal_parts=guess,
              reason="alarm")
    settings = ReportSettings(epsilon_grids=5.0, epsilon_events=5.0)
    face = [release_report(rng.random((n, 5)), flagged, settings, NAMES, rng=seed, **kw) for seed in range(20)]
    careful = [release_report(rng.random((n, 5)), flagged, settings, NAMES, rng=seed, normal_error=1.0, **kw)
               for seed in range(20)]
    assert all("rpm" in r["where"]["features"] for r in face)
    assert all(r["where"]["features"] == ["temperature"] for r in careful)
    # The published excess is the same point estimate; only its interval widens.
    rpm = [[p for p in r["where"]["parts"] if p["features"] == ["rpm"]][0] for r in (face[0], careful[0])]
    assert rpm[0]["excess"]["value"] == pytest.approx(rpm[1]["excess"]["value"])
    assert rpm[1]["excess"]["accuracy"] > rpm[0]["excess"]["accuracy"] + 30


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
    assert set(acc) == {"epsilon_events", "epsilon_flagged", "epsilon_grids"}
    assert all(2 * half < cfg.report.max_events for half in acc.values())
    assert cfg.report_cost()[0] <= 0.3


# -- graded weights (integer units) ---------------------------------------------------------------

@pytest.mark.parametrize("seed", range(10))
def test_weighted_parts_move_by_at_most_one_full_weight_on_a_neighbour(seed):
    rng = np.random.default_rng(seed)
    res = 4096
    units = rng.integers(0, res + 1, 15)
    U = rng.random((15, 4))
    u1, U1 = np.append(units, rng.integers(0, res + 1)), np.vstack([U, rng.random(4)])
    c0, c1 = part_counts(units, U, range(4)), part_counts(u1, U1, range(4))
    assert np.abs(c1 - c0).sum() <= res and c0.sum() == units.sum()


def test_a_report_on_weights_is_in_events_with_the_same_intervals():
    res = 4096
    rng = np.random.default_rng(0)
    units = rng.integers(0, res + 1, 200)
    U = rng.random((200, 8))
    kw = dict(grid_unusual=U, grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.05)
    big = ReportSettings(epsilon_events=1e4, epsilon_flagged=1e4, epsilon_grids=1e4)
    rec = release_report(rng.random((200, 5)), units, big, NAMES, rng=1, resolution=res, **kw)
    assert rec["flagged_count"]["value"] == pytest.approx(units.sum() / res, abs=0.01)
    assert rec["flagged_count"]["accuracy"] == pytest.approx(math.log(20) / 1e4)
    with pytest.raises(ValueError, match="integer units"):
        release_report(rng.random((200, 5)), units * 2, big, NAMES, rng=1, resolution=res, **kw)


# -- naming only what stands out: simultaneous intervals ----------------------------------------

from monitor.report import error_quantile, released_parts_scale, simultaneous_low  # noqa: E402


def _quiet_window(rng: np.random.Generator, n: int, normal_share: float, pi: np.ndarray):
    """A window of normal traffic only: each event flagged with the normal share, its part drawn
    from the normal shares (grids 3..7 of LAYOUT)."""
    flagged = rng.random(n) < normal_share
    U = rng.random((n, 8)) * 0.1
    U[np.arange(n), 3 + rng.choice(5, size=n, p=pi)] = 1.0
    return flagged, U


def test_quiet_windows_name_a_feature_at_most_at_the_stated_rate():
    # 300 quiet windows against the exact normal shares: a feature is named in at most alpha
    # of them (all five intervals hold at once with 95 %), and the headline says so.
    rng = np.random.default_rng(11)
    pi = np.array([0.05, 0.05, 0.1, 0.6, 0.2])
    named = 0
    for seed in range(300):
        flagged, U = _quiet_window(rng, 1500, 0.02, pi)
        rec = release_report(np.zeros((1500, 5)), flagged, ReportSettings(), NAMES, rng=seed, grid_unusual=U,
                             grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.02, normal_parts=pi,
                             reason="schedule")
        w = rec["where"]
        assert w["features"] == [f for p in w["parts"] if p["stands_out"] for f in p["features"]]
        if w["features"]:
            named += 1
        else:
            assert rec["headline"].startswith("no single feature stands out")
    assert named <= 0.05 * 300


def test_a_single_feature_surge_stands_out_and_nothing_else_does():
    rng = np.random.default_rng(4)
    pi = np.array([0.05, 0.05, 0.1, 0.6, 0.2])
    flagged, U = _quiet_window(rng, 1500, 0.02, pi)
    flagged[:60] = True  # 60 flagged events, all most unusual in 'current' (grid 5)
    U[:60] = 0.0
    U[:60, 5] = 1.0
    rec = release_report(np.zeros((1500, 5)), flagged, ReportSettings(), NAMES, rng=3, grid_unusual=U,
                         grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.02, normal_parts=pi, reason="alarm")
    parts = rec["where"]["parts"]
    assert rec["where"]["features"] == ["current"]
    assert [p["stands_out"] for p in parts] == [True, False, False, False, False]  # ranked by the low end
    assert rec["headline"].startswith("surge in current: +")
    assert rec["where"]["level"] == pytest.approx(0.95)


def test_no_single_feature_stands_out_says_so_with_the_flagged_excess():
    rng = np.random.default_rng(5)
    pi = np.full(5, 0.2)
    flagged, U = _quiet_window(rng, 1500, 0.02, pi)
    flagged[:25] = True  # 25 extra flagged events spread over the five features: 5 each
    rec = release_report(np.zeros((1500, 5)), flagged, ReportSettings(), NAMES, rng=8, grid_unusual=U,
                         grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.02, normal_parts=pi, reason="alarm")
    total = rec["where"]["excess"]
    assert rec["where"]["features"] == [] and not any(p["stands_out"] for p in rec["where"]["parts"])
    said = f"{total['value']:+.0f} flagged (+-{total['accuracy']:.0f})"
    # An interval wider than the excess reads as what it is: within the noise.
    assert rec["headline"] == (f"surge, no single feature stands out, and the excess over normal, {said}, is within its noise"
                               if abs(total["value"]) <= total["accuracy"] else
                               f"surge, no single feature stands out: {said} beyond normal")
    # The flagged excess is the noisy flagged count less the normal share of the noisy events.
    assert total["value"] == pytest.approx(rec["flagged_count"]["value"] - 0.02 * rec["event_count"]["value"])


@pytest.mark.parametrize("parts_scale,share_sd,normal_error", [(0.0, 0.0, 0.0), (0.3, 0.005, 0.0), (0.0, 0.0, 1.0)])
def test_the_low_ends_hold_for_all_parts_at_once(parts_scale, share_sd, normal_error):
    # Monte Carlo over every error the bound counts: the drawn parts' Laplace noise, the
    # window's normal traffic (Poisson), the event count's noise, the released shares' noise
    # and the rate's error. All five low ends lie below the true excesses in >= 95 % of draws.
    rng = np.random.default_rng(7)
    n, share, eps = 1500, 0.02, ReportSettings()
    pi = np.array([0.05, 0.05, 0.1, 0.6, 0.2])
    excess = np.array([0.0, 40.0, 0.0, 0.0, 10.0])
    misses = ignored = 0
    trials = 600
    for _ in range(trials):
        counts = rng.poisson(share * n * pi) + excess
        drawn = counts + rng.laplace(0.0, 1.0 / eps.epsilon_grids, 5)
        noisy_n = n + rng.laplace(0.0, 1.0 / eps.epsilon_events)
        noisy_share = share + rng.normal(0.0, share_sd) if share_sd else share
        noisy_pi = np.maximum(pi + rng.laplace(0.0, parts_scale, 5), 0.0) if parts_scale else pi
        if normal_error:  # a guess that says half the truth: within its stated error
            noisy_pi = pi / (1.0 + normal_error)
        kw = dict(epsilon_parts=eps.epsilon_grids, epsilon_events=eps.epsilon_events, normal_error=normal_error,
                  share=noisy_share)
        low = simultaneous_low(drawn, noisy_share * noisy_pi, noisy_n, parts_scale=parts_scale, share_sd=share_sd, **kw)
        misses += bool(np.any(low > excess))
        ignored += bool(np.any(simultaneous_low(drawn, noisy_share * noisy_pi, noisy_n, **kw) > excess))
    # Bonferroni over nearly disjoint misses is nearly tight: with exact normals the rate sits
    # just under 5 %, so allow three binomial standard deviations of Monte Carlo error.
    bound = 0.05 * trials + 3 * math.sqrt(trials * 0.05 * 0.95)
    assert misses <= bound
    if parts_scale or share_sd:
        assert ignored > bound  # the normal's own noise must be counted, or the bound fails
    else:
        assert misses >= 0.02 * trials  # not vacuous: near its level


def test_a_guessed_normal_with_no_bound_names_only_a_part_above_the_whole_normal_weight():
    # normal_error = inf (the releaser's guess before the baseline's parts): a part whose own
    # count is below the whole normal weight (30 here) never stands out, whatever the guess.
    rng = np.random.default_rng(9)
    guess = np.array([0.01, 0.01, 0.01, 0.01, 0.96])  # says rpm holds almost nothing
    flagged = np.zeros(1500, bool)
    flagged[:28] = True
    U = rng.random((1500, 8)) * 0.1
    U[:28, 6] = 1.0  # 28 flagged in rpm: below the whole normal 0.02 x 1500 = 30
    kw = dict(grid_unusual=U, grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.02, normal_parts=guess)
    for seed in range(20):
        assert release_report(np.zeros((1500, 5)), flagged, ReportSettings(), NAMES, rng=seed, normal_error=math.inf,
                              **kw)["where"]["features"] == []
    trusted = [release_report(np.zeros((1500, 5)), flagged, ReportSettings(), NAMES, rng=s, **kw) for s in range(20)]
    assert sum("rpm" in r["where"]["features"] for r in trusted) >= 10  # the guess taken at its word would name it


def test_error_quantile_matches_the_exact_tails_and_stays_conservative():
    assert error_quantile([5.0], 0.0, 0.0, 0.025) == pytest.approx(5.0 * math.log(20.0), abs=0.1)
    assert error_quantile([], 0.0, 2.0, 0.025) == pytest.approx(1.96 * 2.0, abs=0.05)
    assert error_quantile([], 4.0, 0.0, 0.01) >= 5.0  # Poisson(4) exceeds 8 with 2 %, 9 with 0.8 %
    # A sum is wider than each part, and narrower than the sum of the parts' own quantiles.
    both = error_quantile([5.0, 2.0], 3.0, 1.0, 0.001)
    assert error_quantile([5.0], 0.0, 0.0, 0.001) < both < (5.0 + 2.0) * math.log(500.0) + 3.0 + 3.3
    assert error_quantile([math.inf], 0.0, 0.0, 0.05) == math.inf


def test_released_parts_scale_follows_the_baselines_noise():
    # Laplace(cap / epsilon) on a span's part totals, over the span's normal weight.
    assert released_parts_scale(16, 0.025, 0.01, 1500.0, 288) == pytest.approx(640.0 / 4320.0)
    assert released_parts_scale(None, 0.5, 0.01, 1000.0, 10) == pytest.approx(2.0 / 100.0)  # no cap: one event a unit
    assert released_parts_scale(16, None, 0.01, 1500.0, 288) == 0.0
    assert released_parts_scale(16, 0.025, 0.0, 1500.0, 288) == math.inf


@pytest.mark.parametrize("seed", range(5))
def test_the_released_where_histogram_moves_by_at_most_one_event_on_a_neighbour(seed):
    # The alarm's graded weights in units: a neighbour (one event added, any weight in
    # [0, resolution]) moves the histogram by at most one full weight in L1; drawn with the same
    # seeded noise, the released (noisy) histograms differ by exactly that move.
    res = 16
    rng = np.random.default_rng(seed)
    units = rng.integers(0, res + 1, 40)
    U = rng.random((40, 5))
    extra_u, extra_U = int(rng.integers(0, res + 1)), rng.random(5)
    c0 = part_counts(units, U, range(5))
    c1 = part_counts(np.append(units, extra_u), np.vstack([U, extra_U]), range(5))
    assert np.abs(c1 - c0).sum() == extra_u <= res
    r0 = release_parts(c0, 0.2, noise_source(seed), res)
    r1 = release_parts(c1, 0.2, noise_source(seed), res)
    assert np.abs(np.array([x.value for x in r1]) - [x.value for x in r0]).sum() == pytest.approx(extra_u)
    assert all((x.epsilon, x.delta, x.mechanism) == (0.2, 0.0, "laplace_global") for x in r0)


def test_the_reports_where_states_its_guarantee():
    rng = np.random.default_rng(2)
    flagged, U = _quiet_window(rng, 300, 0.05, np.full(5, 0.2))
    rec = release_report(np.zeros((300, 5)), flagged, ReportSettings(), NAMES, rng=1, grid_unusual=U,
                         grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.05)
    w = rec["where"]
    assert (w["epsilon"], w["delta"], w["mechanism"]) == (0.2, 0.0, "laplace_global")
    assert all((p["flagged_count"]["epsilon"], p["flagged_count"]["delta"]) == (0.2, 0.0) for p in w["parts"])
    assert (rec["epsilon"], rec["delta"]) == ReportSettings().cost(5, len(LAYOUT)) == (pytest.approx(0.28), 0.0)
    # Seeded: the same seed gives the same report, another seed another one.
    again = release_report(np.zeros((300, 5)), flagged, ReportSettings(), NAMES, rng=1, grid_unusual=U,
                           grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.05)
    assert again == rec
    other = release_report(np.zeros((300, 5)), flagged, ReportSettings(), NAMES, rng=2, grid_unusual=U,
                           grid_names=GRID_NAMES, grid_features=LAYOUT, normal_share=0.05)
    assert other["where"]["parts"] != w["parts"]


def _scheduled_config(tmp_path):
    """Vital signs, one device per event, a report on every 5-minute window."""
    return parse_config({
        "features": [{"name": n, "min": lo, "max": hi} for n, lo, hi in VITAL_FEATURES],
        "stream": {"entity_field": "device_id"}, "window": {"size_seconds": 300},
        "alarm": {"baseline_warmup_seconds": 3600}, "report": {"every_seconds": 300},
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "epsilon": 1000.0, "accountant": "basic"},
    })


def test_scheduled_reports_normal_comes_from_the_reports_already_published(tmp_path, vitals_model):
    # With a report on every window, a report's normal per part is post-processing of the
    # reports published in the last two hours (their part counts over their event counts),
    # once there are 12 of them: rebuilt here from the alert records alone.
    model = vitals_model
    config = _scheduled_config(tmp_path)
    b = config.budget
    rel = WindowReleaser(config, BudgetAccountant(WindowLedger(b.ledger), b.epsilon, b.delta, b.period_seconds,
                                                  b.accountant), model, rng=4)
    traffic = Traffic(people=300, days=1, seed=2)
    records = []
    for i in range(16):
        X, ents, _ = traffic.window(i, [])
        w = ClosedWindow(i * 300.0, (i + 1) * 300.0, X, np.zeros(0, bool), (), tuple(ents))
        records.append(json.loads(rel.release(w, released_at=(i + 1) * 300.0).entry.payload))
    assert all(r["report"]["reason"] == "schedule" for r in records)
    for i in range(12, 16):
        past = [r["report"] for r in records[:i]]
        events = sum(r["event_count"]["value"] for r in past)
        report = records[i]["report"]
        for part in report["where"]["parts"]:
            held = sum(p["flagged_count"]["value"] for r in past for p in r["where"]["parts"] if p["grid"] == part["grid"])
            assert part["normal"] == pytest.approx(held / events * report["event_count"]["value"])
    # Before 12 reports the normal came from elsewhere (the model's guess here): not that sum.
    early = records[5]["report"]
    past = [r["report"] for r in records[:5]]
    first = early["where"]["parts"][0]
    held = sum(p["flagged_count"]["value"] for r in past for p in r["where"]["parts"] if p["grid"] == first["grid"])
    assert first["normal"] != pytest.approx(held / sum(r["event_count"]["value"] for r in past) * early["event_count"]["value"])


def test_a_restarted_releaser_reads_the_published_reports_back(tmp_path, vitals_model):
    # After a restart the normal parts come from the same published reports: the ledger's.
    model = vitals_model
    config = _scheduled_config(tmp_path)
    b = config.budget
    ledger = WindowLedger(b.ledger)

    def releaser():
        return WindowReleaser(config, BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant), model,
                              rng=4)

    rel = releaser()
    traffic = Traffic(people=300, days=1, seed=2)
    for i in range(13):
        X, ents, _ = traffic.window(i, [])
        rel.release(ClosedWindow(i * 300.0, (i + 1) * 300.0, X, np.zeros(0, bool), (), tuple(ents)), released_at=(i + 1) * 300.0)
    again = releaser()
    assert again.report_history.normal(13 * 300.0) is not None
    for got, want in zip(again.report_history.normal(13 * 300.0), rel.report_history.normal(13 * 300.0)):
        assert np.allclose(got, want)
    assert json.loads(ledger.get(12 * 300.0).payload)["report"]["reason"] == "schedule"
