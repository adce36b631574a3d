"""The "tail" layout rule: one fine joint grid for 2 to 4 features where the noisy
size allows, k without a sqrt(n) term; its privacy on neighbouring reference sets, adversarial
inputs, the file's record of the rule, and calibration on a large low-dimensional set."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monitor.model import GridKNN, ModelFileError, default_layout
from monitor.model._defaults import FINE_MAX_CELLS, FINE_MIN_BINS, K_MIN, K_SQRT_TAIL, RHO_FINE
from monitor.model._format import _canonical
from monitor.model._grid import _cells

B3 = [(0.0, 1.0)] * 3


def _fine(n=8000, d=3, seed=0):
    return np.random.default_rng(seed).normal(0.5, 0.12, (n, d)).clip(0, 1)


def test_the_fine_grid_follows_the_arithmetic_and_only_the_noisy_size():
    for d in (2, 3, 4):
        for n in (50, 500, 3000, 20000, 10**6):
            lay = default_layout(d, 0.95, n)
            fine = len(lay.groups) == 1 and lay.groups[0] == tuple(range(d))
            b = lay.bins[0]
            if fine:  # every cell holds RHO_FINE noise scales on average, and is noised densely
                assert b >= FINE_MIN_BINS and b**d <= max(n * 0.95 / RHO_FINE, FINE_MIN_BINS**d)
                assert b**d <= FINE_MAX_CELLS and lay.k == pytest.approx(max(K_MIN, 1 / 0.95, K_SQRT_TAIL * n**0.5))
            else:  # the arithmetic gives fewer than FINE_MIN_BINS: the coarse grids as before
                assert np.floor((n * 0.95 / RHO_FINE) ** (1 / d) + 1e-9) < FINE_MIN_BINS
    # d = 1 and d >= 5 never get it; explicit settings turn it off
    assert len(default_layout(1, 1.0, 10**6).groups) == 1 and default_layout(1, 1.0, 10**6).bins == (32,)
    assert all(len(g) <= 3 for g in default_layout(5, 1.0, 10**6).groups)
    assert len(default_layout(3, 1.0, 10**6, marginals=3).groups) == 4
    assert default_layout(3, 1.0, 20000, rule="v4").bins == (3, 32, 32, 32)
    with pytest.raises(ValueError, match="layout rule"):
        default_layout(3, 1.0, 100, rule="finest")


def test_a_fitted_model_uses_the_layout_of_its_own_noisy_size():
    m = GridKNN(bounds=B3, random_state=3).fit(_fine())
    lay = default_layout(3, m.epsilon - m.size_epsilon_, m.grid_rows_estimate_)
    assert m.groups_ == lay.groups == ((0, 1, 2),) and m.grid_bins_ == lay.bins and m.k_ == lay.k
    assert m.grid_epsilons_ == pytest.approx([0.95])  # one grid: no composition inside the grids' part


def test_neighbouring_reference_sets_change_one_cell_by_one_at_the_same_noise():
    # Float-level: D and D' = D + one row, the same noise seed. The size release moves by the
    # row (so the layout, a function of it, is the same here), and the fine grid's released
    # values are the same floats except the one cell the row falls in, which moves by 1 (up to
    # the rounding of one addition). That is a sensitivity-1 histogram with Laplace noise on
    # every cell, empty or not: epsilon-DP by parallel composition over the cells.
    D = _fine(6000)
    row = np.array([[0.97, 0.03, 0.51]])
    D2 = np.vstack([D, row])
    a = GridKNN(bounds=B3, random_state=11, calibration_share=0.0).fit(D)
    b = GridKNN(bounds=B3, random_state=11, calibration_share=0.0).fit(D2)
    assert b.n_estimate_ - a.n_estimate_ == pytest.approx(1.0, abs=1e-9)
    assert a.groups_ == b.groups_ and a.grid_bins_ == b.grid_bins_
    ga, gb = a.grids_[0], b.grids_[0]
    bins = ga.bins
    cell = int((_cells(row, bins) * ga._strides).sum())
    dense_a = np.zeros(ga.n_cells)
    dense_a[ga.keys] = ga.values
    dense_b = np.zeros(gb.n_cells)
    dense_b[gb.keys] = gb.values
    diff = dense_b - dense_a
    others = np.delete(np.arange(ga.n_cells), cell)
    # kept cells (noisy value > 0) are the same except possibly the row's own cell
    assert np.array_equal(np.setdiff1d(ga.keys, [cell]), np.setdiff1d(gb.keys, [cell]))
    assert np.all(diff[others] == 0.0)
    assert diff[cell] == pytest.approx(1.0, abs=1e-9) or (cell not in ga.keys) or (cell not in gb.keys)
    assert abs(diff[cell]) <= 1.0 + 1e-9


def test_with_calibration_one_row_moves_one_part_by_one_row():
    # The held-apart split is a per-row hash (public seed): the added row lands in exactly one
    # part, so either the grid moves by one count in one cell (as above) or the grid is the
    # same and only the held-apart histograms see the row.
    D = _fine(6000, seed=1)
    row = np.array([[0.2, 0.8, 0.5]])
    a = GridKNN(bounds=B3, random_state=5).fit(D)
    b = GridKNN(bounds=B3, random_state=5).fit(np.vstack([D, row]))
    if a.grid_bins_ != b.grid_bins_:  # the size release crossed a layout boundary: nothing to compare
        pytest.skip("layout boundary")
    ga, gb = a.grids_[0], b.grids_[0]
    dense = [np.zeros(ga.n_cells), np.zeros(gb.n_cells)]
    dense[0][ga.keys], dense[1][gb.keys] = ga.values, gb.values
    changed = np.flatnonzero(dense[0] != dense[1])
    assert changed.size <= 1
    if changed.size:
        assert abs(dense[1][changed[0]] - dense[0][changed[0]]) <= 1.0 + 1e-9


@pytest.mark.parametrize("case", ["duplicates", "cell_edges", "constant_feature", "one_row", "outside_bounds"])
def test_adversarial_reference_sets_fit_and_score(case, tmp_path):
    rng = np.random.default_rng(2)
    if case == "duplicates":
        X = np.tile([[0.25, 0.5, 0.75]], (9000, 1))
    elif case == "cell_edges":  # every value exactly on a cell edge of a 15-bin grid, 0 and 1 included
        X = rng.integers(0, 16, (9000, 3)) / 15.0
    elif case == "constant_feature":
        X = np.c_[rng.normal(0.5, 0.1, (9000, 2)).clip(0, 1), np.full(9000, 0.3)]
    elif case == "one_row":
        X = np.array([[0.5, 0.5, 0.5]])
    else:
        X = rng.normal(0.5, 2.0, (9000, 3))  # most rows clipped to the public bounds
    m = GridKNN(bounds=B3, random_state=4, contamination=0.05).fit(X)
    probe = np.array([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.25, 0.5, 0.75], [2.0, -1.0, 0.5]])
    s = m.score_samples(probe)
    assert np.all(np.isfinite(s)) and np.all(s >= 0)
    assert np.isfinite(m.threshold_for(0.01)) and np.isfinite(m.threshold_for(0.1))
    if case != "one_row":
        assert len(m.grids_) == 1 and m.grid_bins_[0] >= FINE_MIN_BINS  # n large: the fine grid
        for g in m.grids_:  # the value 1.0 lies in the last cell, never outside the grid
            assert g.keys.size == 0 or g.keys.max() < g.n_cells
    else:
        assert len(m.grids_) >= 3  # n of about 1: the coarse rule's fewest grids
    if case == "duplicates":  # the only occupied cell scores lowest
        assert s[3] == s.min()
    m.save(tmp_path / "m.json")
    again = GridKNN.load(tmp_path / "m.json")
    assert np.array_equal(again.score_samples(probe), s)


def test_the_file_records_the_rule_and_old_files_load_as_v4(tmp_path):
    X = _fine(4000)
    for rule in ("tail", "v4"):
        m = GridKNN(bounds=B3, random_state=0, layout_rule=rule).fit(X)
        m.save(tmp_path / f"{rule}.json")
        doc = json.loads((tmp_path / f"{rule}.json").read_text())
        assert doc["private"]["layout"]["name"] == rule
        back = GridKNN.load(tmp_path / f"{rule}.json")
        assert back.layout_rule == rule and back.grid_bins_ == m.grid_bins_
        assert np.array_equal(back.score_samples(X[:50]), m.score_samples(X[:50]))
    # a file from before the rule had a name: it was fitted by the v4 rule, and scores as saved
    import hashlib

    doc = json.loads((tmp_path / "v4.json").read_text())
    del doc["private"]["layout"]["name"]
    doc["sha256"] = hashlib.sha256(_canonical(doc["private"])).hexdigest()
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = GridKNN.load(tmp_path / "old.json")
    assert old.layout_rule == "v4" and old.grid_bins_ == (3, 32, 32, 32)
    # a rule this monitor does not know is refused, saying which it knows
    doc["private"]["layout"]["name"] = "quadtree"
    doc["sha256"] = hashlib.sha256(_canonical(doc["private"])).hexdigest()
    (tmp_path / "new.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match="unknown layout rule 'quadtree'.*'tail' and 'v4'"):
        GridKNN.load(tmp_path / "new.json")
    with pytest.raises(ValueError, match="layout_rule"):
        GridKNN(bounds=B3, layout_rule="quadtree").fit(X)


def test_calibration_holds_with_the_fine_grid():
    # 20,000 reference rows of a 3-feature set: the held-apart part (about 5,000 rows) is
    # large enough for 5 % and 10 % (and, by the rule, nearly for 1 %); the realised flag
    # rates on unseen normal data land inside [c/2, 2c].
    rng = np.random.default_rng(8)
    X = rng.normal(0.5, 0.12, (20000, 3)).clip(0, 1)
    Y = rng.normal(0.5, 0.12, (40000, 3)).clip(0, 1)
    m = GridKNN(bounds=B3, random_state=9).fit(X)
    assert len(m.grids_) == 1
    s = m.score_samples(Y)
    for c in (0.01, 0.05, 0.1):
        rate = float((s > m.threshold_for(c)).mean())
        assert c / 2 <= rate <= 2 * c, (c, rate)


def test_the_fine_grid_sees_joint_outliers_that_the_v4_rule_misses():
    # Outliers inside every feature's range but off the data's joint shape (a diagonal band
    # of normal data, outliers across it): the fine joint grid ranks them above the normal
    # tail, the coarse grids and the one-feature grids cannot.
    rng = np.random.default_rng(12)
    t = rng.random(20000)
    X = np.c_[t, t, rng.random(20000)] + rng.normal(0, 0.03, (20000, 3))
    X = X.clip(0, 1)
    u = rng.uniform(0.2, 0.8, 200)
    O = np.c_[u, 1 - u, rng.random(200)].clip(0, 1)
    O = O[np.abs(O[:, 0] - O[:, 1]) > 0.2]
    Y = (np.c_[(t2 := rng.random(5000)), t2, rng.random(5000)] + rng.normal(0, 0.03, (5000, 3))).clip(0, 1)
    tprs = {}
    for rule in ("tail", "v4"):
        m = GridKNN(bounds=B3, random_state=13, layout_rule=rule).fit(X)
        thr = np.quantile(m.score_samples(Y), 0.99)
        tprs[rule] = float((m.score_samples(O) > thr).mean())
    assert tprs["tail"] >= 0.9 and tprs["tail"] > tprs["v4"] + 0.2, tprs


def test_many_features_get_joint_grids_only():
    # From 12 features the tail rule puts each feature in about 3 joint grids (v4: 2) and gives no
    # one-feature grid (v4: one a feature): the v4 rule's joint grids first, then more as n affords.
    big, big4 = default_layout(16, 0.95, 2250), default_layout(16, 0.95, 2250, rule="v4")
    assert [len(g) for g in big.groups] == [3] * 16
    assert sum(len(g) == 3 for g in big4.groups) == 11 and sum(len(g) == 1 for g in big4.groups) == 16
    assert big.groups[:11] == big4.groups[:11]  # the same first grids, then more
    for d, n, joint in ((32, 900, 24), (21, 745, 21), (16, 750, 16), (64, 690, 24), (12, 200, 7)):
        lay = default_layout(d, 0.95, n)
        assert [len(g) for g in lay.groups] == [3] * joint
        if 3 * joint >= d:  # the first cover holds every feature (optdigits' 64: 22 windows, then 2 bagged)
            assert sorted({f for g in lay.groups for f in g}) == list(range(d))
    assert default_layout(11, 0.95, 10**6).groups == default_layout(11, 0.95, 10**6, rule="v4").groups
    # an explicit number of one-feature grids still gets them
    assert sum(len(g) == 1 for g in default_layout(16, 0.95, 2250, marginals=16).groups) == 16


def test_monitor_fit_takes_the_layout_rule_from_the_config(tmp_path, capsys):
    from monitor.cli import main
    from monitor.config import ConfigError, parse_config

    X = np.clip(np.random.default_rng(3).normal(50, 10, (4000, 3)), 0, 100)
    with open(tmp_path / "ref.csv", "w") as fh:
        fh.write("a,b,c\n" + "\n".join(",".join(f"{v:.3f}" for v in row) for row in X) + "\n")
    features = "features:\n" + "".join(f"  - {{name: {n}, min: 0, max: 100}}\n" for n in "abc")
    for rule, bins in (("tail", None), ("v4", (3, 32, 32, 32))):
        cfg = tmp_path / f"{rule}.yaml"
        cfg.write_text(features + f"model: {{layout_rule: {rule}}}\nbudget: {{reference_ledger: {tmp_path / rule}.sqlite}}\n")
        out = tmp_path / f"{rule}.json"
        assert main(["fit", "--config", str(cfg), "--reference", str(tmp_path / "ref.csv"), "--out", str(out), "--seed", "1"]) == 0
        m = GridKNN.load(out)
        assert m.layout_rule == rule
        assert (len(m.grids_) == 1) if bins is None else (m.grid_bins_ == bins)
    with pytest.raises(ConfigError, match=r"model\.layout_rule"):
        parse_config({"features": [{"name": n, "min": 0, "max": 100} for n in "abc"], "model": {"layout_rule": "quadtree"}})


def test_a_model_of_joint_grids_only_draws_its_sample_given_the_features_already_drawn():
    """The model's public sample (calibration's prior, the sight probe, the report's normal parts)
    draws each joint grid given the features earlier grids set, where the layout has no one-feature
    grid: in the layout's order the disjoint first windows would set their features independently,
    and on correlated data such points score far above the real rows."""
    rng = np.random.default_rng(0)
    X = np.clip(50 + 15 * rng.normal(0, 1, (3000, 1)) + rng.normal(0, 2, (3000, 12)), 0, 100)
    m = GridKNN(epsilon=1.0, bounds=[(0, 100)] * 12, random_state=0).fit(X)
    assert all(len(g.features) == 3 for g in m.grids_)
    order = [g.features for g, _ in m._synthesis_order()]
    assert sorted(order) == sorted(g.features for g in m.grids_)
    for i in range(1, len(order)):  # each grid shares a feature with those drawn before it, while one does
        before = {f for g in order[:i] for f in g}
        assert set(order[i]) & before or not any(set(g) & before for g in order[i:])
    U = m._synthetic(np.random.default_rng(1))
    assert np.corrcoef(U[:, 0], U[:, 11])[0, 1] > 0.5  # windows 0-2 and 9-11 drawn given each other
    v4 = GridKNN(epsilon=1.0, bounds=[(0, 100)] * 12, random_state=0, layout_rule="v4").fit(X)
    assert [g.features for g, _ in v4._synthesis_order()] == [g.features for g in v4.grids_]


# -- one score from many grids: their power mean (score_power) ---------------------------------

def _many(n=3000, d=8, seed=0):
    return np.random.default_rng(seed).normal(0.5, 0.1, (n, d)).clip(0, 1)


def test_the_score_is_the_power_mean_of_the_grids_scores():
    X = _many()
    probe = np.r_[_many(200, seed=1), np.random.default_rng(2).random((200, 8))]
    m = GridKNN(bounds=[(0.0, 1.0)] * 8, random_state=0).fit(X)
    S = m.grid_scores(probe)
    assert m.score_power == 1.5 and S.shape[1] > 1
    assert np.allclose(m.score_samples(probe), np.mean(S**1.5, axis=1) ** (1 / 1.5))
    # between the grids' mean and their largest: inside the calibration's public range
    s = m.score_samples(probe)
    assert np.all(s >= S.mean(axis=1) - 1e-12) and np.all(s <= S.max(axis=1) + 1e-12)
    assert np.all(S.max(axis=1) <= m._score_max())
    flat = GridKNN(bounds=[(0.0, 1.0)] * 8, random_state=0, score_power=1.0).fit(X)
    assert np.array_equal(flat.score_samples(probe), S.mean(axis=1))


def test_an_event_far_out_in_one_grid_outranks_one_a_little_out_in_every_grid():
    # Two events with the same arithmetic mean over four grids: one far out in a single grid
    # (what most real anomalies look like: a few features off), one a little out everywhere.
    m = GridKNN(bounds=[(0.0, 1.0)] * 8, random_state=0).fit(_many())
    one, every = np.array([[6.0, 0.0, 0.0, 0.0]]), np.array([[1.5, 1.5, 1.5, 1.5]])
    assert m._combine(one)[0] > m._combine(every)[0] + 0.5
    m.score_power = 1.0
    assert m._combine(one)[0] == pytest.approx(m._combine(every)[0])


def test_the_score_power_is_in_the_file_and_old_files_keep_the_arithmetic_mean(tmp_path):
    import hashlib

    X, probe = _many(), _many(100, seed=3)
    m = GridKNN(bounds=[(0.0, 1.0)] * 8, random_state=0, contamination=0.05).fit(X)
    m.save(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["private"]["layout"]["score_power"] == 1.5  # checksummed: the histograms hold this score
    back = GridKNN.load(tmp_path / "m.json")
    assert back.score_power == 1.5 and np.array_equal(back.score_samples(probe), m.score_samples(probe))
    # a file from before it: its calibration was released for the arithmetic mean, so it keeps it
    del doc["private"]["layout"]["score_power"]
    doc["sha256"] = hashlib.sha256(_canonical(doc["private"])).hexdigest()
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = GridKNN.load(tmp_path / "old.json")
    assert old.score_power == 1.0
    assert np.array_equal(old.score_samples(probe), old.grid_scores(probe).mean(axis=1))
    # editing it would read the released histograms in the wrong units: the checksum refuses it
    doc["private"]["layout"]["score_power"] = 3.0
    (tmp_path / "edited.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match="checksum"):
        GridKNN.load(tmp_path / "edited.json")
    for bad in (0.5, "2", True, 9):
        doc["private"]["layout"]["score_power"] = bad
        doc["sha256"] = hashlib.sha256(_canonical(doc["private"])).hexdigest()
        (tmp_path / "bad.json").write_text(json.dumps(doc))
        with pytest.raises(ModelFileError, match=r"layout\.score_power must be a number in \[1, 8\]"):
            GridKNN.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="score_power"):
        GridKNN(bounds=[(0.0, 1.0)] * 8, score_power=0.5).fit(X)


def test_calibrated_rates_hold_under_the_power_mean():
    # The held-apart rows' histogram is released for the model's own score: the realised flag
    # rates on unseen normal data land inside [c/2, 2c] (10 features: 16 grids combined).
    rng = np.random.default_rng(4)
    X, Y = rng.normal(0.5, 0.1, (12000, 10)).clip(0, 1), rng.normal(0.5, 0.1, (20000, 10)).clip(0, 1)
    m = GridKNN(bounds=[(0.0, 1.0)] * 10, random_state=0).fit(X)
    s = m.score_samples(Y)
    for c in (0.05, 0.1):
        assert c / 2 <= (s > m.threshold_for(c)).mean() <= 2 * c


def test_monitor_fit_takes_the_score_power_from_the_config(tmp_path):
    from monitor.cli import main
    from monitor.config import ConfigError, parse_config

    X = _many(3000)
    names = [f"f{i}" for i in range(8)]
    with open(tmp_path / "ref.csv", "w") as fh:
        fh.write(",".join(names) + "\n" + "\n".join(",".join(f"{v:.4f}" for v in row) for row in X) + "\n")
    features = "features:\n" + "".join(f"  - {{name: {n}, min: 0, max: 1}}\n" for n in names)
    for power in (None, 1, 3):
        tag = f"p{power}"
        model = "" if power is None else f"model: {{score_power: {power}}}\n"
        cfg = tmp_path / f"{tag}.yaml"
        cfg.write_text(features + model + f"budget: {{reference_ledger: {tmp_path / tag}.sqlite}}\n")
        out = tmp_path / f"{tag}.json"
        assert main(["fit", "--config", str(cfg), "--reference", str(tmp_path / "ref.csv"), "--out", str(out), "--seed", "1"]) == 0
        m = GridKNN.load(out)
        assert m.score_power == (1.5 if power is None else power)
        S = m.grid_scores(X[:50])
        assert np.allclose(m.score_samples(X[:50]), np.mean(S**m.score_power, axis=1) ** (1 / m.score_power))
    with pytest.raises(ConfigError, match=r"model\.score_power"):
        parse_config({"features": [{"name": n, "min": 0, "max": 1} for n in names], "model": {"score_power": 0.5}})


def test_the_config_s_score_power_default_and_bounds_are_the_model_s():
    # config.py spells them as literals (it imports the model lazily): they must not drift apart.
    from monitor.config import ModelSettings
    from monitor.model._defaults import SCORE_POWER, SCORE_POWER_MAX

    field = ModelSettings.model_fields["score_power"]
    bounds = {type(m).__name__: m for m in field.metadata}
    assert field.default == SCORE_POWER == GridKNN().score_power
    assert bounds["Ge"].ge == 1 and bounds["Le"].le == SCORE_POWER_MAX
