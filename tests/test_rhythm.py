"""Rhythmic traffic (monitor.data.rhythm): the oracle's true rate is what the windows hold, and gamma 0 is stationary."""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitor.data.rhythm import Rhythm, RowRhythm, principal_scores, strength_for_swing
from monitor.data.traffic import RowTraffic


def _pool(seed: int = 3, n: int = 3000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 2))
    # Correlated, skewed columns: the first component is not one column, and the tails are uneven.
    return np.c_[z[:, 0] + 0.5 * z[:, 1], np.exp(0.4 * z[:, 0]), z[:, 1] - 0.3 * z[:, 0]]


def _flags(X: np.ndarray) -> np.ndarray:
    """Two "flag levels" of a fixed model: far from the centre, at a 5 % and a 1 % share of the pool."""
    d = np.linalg.norm((X - X.mean(axis=0)) / X.std(axis=0), axis=1)
    return (d[:, None] > np.quantile(d, [0.95, 0.99])[None, :]).astype(float)


def _week_curve() -> tuple[float, ...]:
    """A week of half-hours (day 0 a Monday) shaped like demand: low at night, high by day, lower at the weekend."""
    h = np.arange(7 * 48) / 48
    day = 1.0 + 0.5 * np.sin(2 * np.pi * (h - 0.3))
    return tuple(day * np.where((h // 1) % 7 >= 5, 0.8, 1.0))


@pytest.mark.parametrize("rhythm", [Rhythm("wave", 1.0), Rhythm("switch", 0.5), Rhythm("weekly", 0.5),
                                    Rhythm("curve", 1.5, curve=_week_curve(), volume=0.3)],
                         ids=["wave", "switch", "weekly", "curve"])
def test_oracle_rate_is_the_generated_windows_flagged_share(rhythm):
    X = _pool()
    flags = _flags(X)
    t = RowTraffic(X, None, np.array([[-50.0, 50.0]] * 3), people=400, days=2, seed=7, rhythm=rhythm, first_day=4)
    n, F, R = [], [], []
    lookup = {row.tobytes(): k for k, row in enumerate(X)}
    for i in range(t.n_windows):
        W, _, _ = t.window(i)
        n.append(W.shape[0])
        F.append(flags[[lookup[row.tobytes()] for row in W]].sum(axis=0))
        R.append(t.expected(i, flags))
    n, F, R = np.array(n, float), np.array(F), np.array(R)
    # The rhythm moves the true rate (else the test below would prove nothing) ...
    assert R[:, 0].max() / R[:, 0].mean() > 1.3
    # ... and per block of windows (2 hours), the flagged count matches n * the oracle's rate
    # within binomial noise, while the stationary rate would not.
    blocks = np.arange(t.n_windows) // 24
    z_oracle, z_flat = [], []
    for b in np.unique(blocks):
        m = blocks == b
        for j in range(2):
            sd = math.sqrt((n[m] * R[m, j] * (1 - R[m, j])).sum())
            z_oracle.append((F[m, j].sum() - (n[m] * R[m, j]).sum()) / sd)
            z_flat.append((F[m, j].sum() - n[m].sum() * flags[:, j].mean()) / sd)
    z_oracle, z_flat = np.abs(z_oracle), np.abs(z_flat)
    assert z_oracle.max() < 4.5
    assert np.mean(z_oracle ** 2) < 1.6  # chi-square per degree of freedom near 1
    assert z_flat.max() > 6


def test_gamma_zero_is_stationary_and_draws_what_plain_traffic_draws():
    X = _pool()
    flags = _flags(X)
    bounds = np.array([[-50.0, 50.0]] * 3)
    plain = RowTraffic(X, None, bounds, people=200, days=1, seed=11)
    for rhythm in (Rhythm("wave", 0.0), Rhythm("switch", 0.0), Rhythm("weekly", 0.0), Rhythm("none", 1.0)):
        t = RowTraffic(X, None, bounds, people=200, days=1, seed=11, rhythm=rhythm)
        for i in (0, 70, 150, 250):
            assert np.allclose(t.expected(i, flags), flags.mean(axis=0), rtol=0, atol=1e-12)
        assert rhythm.stationary
    a = RowTraffic(X, None, bounds, people=200, days=1, seed=11, rhythm=Rhythm("wave", 0.0))
    for i in range(0, 288, 37):
        assert np.array_equal(a.window(i)[0], plain.window(i)[0])


def test_principal_scores_are_standardised_and_follow_the_main_direction():
    X = _pool()
    u = principal_scores(X, 2)
    assert np.allclose(u.mean(axis=0), 0, atol=1e-9) and np.allclose(u.std(axis=0), 1, atol=1e-9)
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 1e-6
    # The first component explains more of the standardised columns than the second.
    Z = (X - X.mean(axis=0)) / X.std(axis=0)
    r2 = [sum(np.corrcoef(u[:, j], Z[:, c])[0, 1] ** 2 for c in range(3)) for j in range(2)]
    assert r2[0] > r2[1]
    # Deterministic sign: the same pool gives the same scores.
    assert np.array_equal(u, principal_scores(X.copy(), 2))


def test_switch_moves_over_one_hour_twice_a_day_and_weekends_differ():
    r = Rhythm("switch", 0.5)
    assert r.day_share(3.0) == 0.0 and r.day_share(12.0) == 1.0 and r.day_share(22.0) == 0.0
    assert r.day_share(7.5) == pytest.approx(0.5) and r.day_share(19.5) == pytest.approx(0.5)
    # In 5-minute windows the move takes 12 windows: window 84 (07:00) is night, 96 (08:00) day.
    shares = [r.day_share(24.0 * w / 288) for w in range(80, 100)]
    assert shares.index(1.0) - max(k for k, s in enumerate(shares) if s == 0.0) == 12
    rr = RowRhythm(_pool(), Rhythm("weekly", 1.0))
    friday, saturday = rr.probabilities(4.25), rr.probabilities(5.25)
    assert friday @ rr.u[:, 0] > 0.5 and abs(friday @ rr.u[:, 1]) < 0.3
    assert saturday @ rr.u[:, 1] > 0.5 and abs(saturday @ rr.u[:, 0]) < 0.3


def test_volume_rhythm_integrates_its_rate():
    r = Rhythm("none", volume=0.3)
    grid = np.linspace(0, 1.7, 20001)
    numeric = np.sum([r.volume_factor(t) for t in grid[:-1]]) * (grid[1] - grid[0])
    assert r.cumulative_volume(1.7) == pytest.approx(numeric, rel=1e-3)
    assert r.volume_factor(0.25) == pytest.approx(1.3) and r.volume_factor(0.75) == pytest.approx(0.7)


def test_rhythm_refuses_bad_settings():
    with pytest.raises(ValueError, match="kind"):
        Rhythm("hourly")
    with pytest.raises(ValueError, match="strength"):
        Rhythm("wave", -1.0)
    with pytest.raises(ValueError, match="volume"):
        Rhythm("wave", volume=1.5)


def test_persistent_people_keep_their_own_row_and_the_oracle_stays_exact():
    X = _pool()
    flags = _flags(X)
    bounds = np.array([[-50.0, 50.0]] * 3)
    t = RowTraffic(X, None, bounds, people=400, days=2, seed=5, rhythm=Rhythm("wave", 0.5), persistence=0.8, absence=0.1)
    lookup = {row.tobytes(): k for k, row in enumerate(X)}
    sent_own, online, sent, F, R, n = 0, 0, 0, [], [], []
    for i in range(t.n_windows):
        W, ents, _ = t.window(i)
        rows = np.array([lookup[row.tobytes()] for row in W])
        own = dict(zip((f"p-{d:05d}" for d in t.order[: t.online(i)]), t.own_rows(i)))
        sent_own += sum(own[e] == r for e, r in zip(ents, rows))
        online, sent = online + t.online(i), sent + len(ents)
        F.append(flags[rows].sum(axis=0))
        R.append(t.expected(i, flags))
        n.append(len(ents))
    # A tenth of the people online skip each window; of those who send, about 0.8 send their own row.
    assert sent / online == pytest.approx(0.9, abs=0.01)
    assert sent_own / sent == pytest.approx(0.8 + 0.2 / len(X), abs=0.02)
    # The oracle's rate is the windows' flagged share (per 2-hour block, within the sampling noise).
    F, R, n = np.array(F), np.array(R), np.array(n, float)
    blocks = np.arange(t.n_windows) // 24
    z = [(F[blocks == b, j].sum() - (n[blocks == b] * R[blocks == b, j]).sum())
         / math.sqrt((n[blocks == b] * R[blocks == b, j] * (1 - R[blocks == b, j])).sum())
         for b in np.unique(blocks) for j in range(2)]
    assert np.abs(z).max() < 4.5
    # Each person keeps one own row for an hour, moving to the next at their own minute: from one window
    # to the next about a twelfth of them move, an hour later nearly all have; the same hour a day later, none.
    a, b, c, d = t.own_rows(100), t.own_rows(101), t.own_rows(112), t.own_rows(100 + 288)
    k = min(a.size, b.size, c.size, d.size)
    assert np.mean(a[:k] != b[:k]) == pytest.approx(1 / 12, abs=0.04)
    assert np.mean(a[:k] == c[:k]) < 0.1 and np.array_equal(a[:k], d[:k])


def test_persistence_zero_replays_independent_rows_and_bad_shares_are_refused():
    X = _pool()
    bounds = np.array([[-50.0, 50.0]] * 3)
    plain = RowTraffic(X, None, bounds, people=200, days=1, seed=11)
    same = RowTraffic(X, None, bounds, people=200, days=1, seed=11, persistence=0.0, absence=0.0)
    assert same.own_rows(3) is None
    for i in range(0, 288, 41):
        assert np.array_equal(same.window(i)[0], plain.window(i)[0])
    for key in ("persistence", "absence"):
        with pytest.raises(ValueError, match=key):
            RowTraffic(X, None, bounds, people=10, **{key: 1.0})


def test_curve_rhythm_follows_its_values_weekends_included():
    curve = _week_curve()
    r = Rhythm("curve", 1.0, curve=curve, volume=0.4)
    x = np.asarray(curve)
    c = (x - x.mean()) / np.abs(x - x.mean()).max()
    assert r.curve_days == 7 and r.curve_volume == pytest.approx(np.abs(x - x.mean()).max() / x.mean())
    # At slot starts the normalised values, linear in between, and the same a week later.
    assert [r.shape(k / 48) for k in (0, 17, 300)] == pytest.approx([c[0], c[17], c[300]])
    assert r.shape(17.5 / 48) == pytest.approx((c[17] + c[18]) / 2)
    assert r.shape(7 + 17 / 48) == pytest.approx(c[17]) and r.shape(-1 / 96) == pytest.approx((c[-1] + c[0]) / 2)
    assert r.components(17 / 48) == [(1.0, pytest.approx((c[17], 0.0)))]
    # Saturday noon is lower than Friday noon, in make-up and in volume.
    assert r.shape(5.5) < r.shape(4.5) and r.volume_factor(5.5) < r.volume_factor(4.5)
    grid = np.linspace(0, 9.3, 200_001)
    numeric = np.sum([r.volume_factor(t) for t in grid[:-1:10]]) * (grid[10] - grid[0])
    assert r.cumulative_volume(9.3) == pytest.approx(numeric, rel=1e-3)
    # RowTraffic sends people * the volume factor, from a population large enough for the peak.
    X = _pool()
    t = RowTraffic(X, None, np.array([[-50.0, 50.0]] * 3), people=300, days=7, seed=2, rhythm=r, first_day=0)
    assert t.population >= 300 * 1.4
    assert [t.online(i) for i in (0, 150, 1600)] == [round(300 * r.volume_factor(i / 288)) for i in (0, 150, 1600)]
    assert len(t.window(1600)[1]) == t.online(1600)
    # Without a volume the curve tilts the rows only, and the number online keeps its daily swing.
    flat = RowTraffic(X, None, np.array([[-50.0, 50.0]] * 3), people=300, days=1, seed=2,
                      rhythm=Rhythm("curve", 1.0, curve=curve))
    assert flat.online(72) == round(300 * 1.3)


def test_strength_for_swing_reaches_the_target_and_curves_refuse_bad_settings():
    X = _pool()
    flags = _flags(X)[:, 0]
    r = Rhythm("curve", 0.0, curve=_week_curve())
    times = np.arange(7 * 48) / 48
    rr = RowRhythm(X, r)
    for target in (1.5, 3.0):
        g = strength_for_swing(r, rr, flags, times, target)
        assert RowRhythm(X, Rhythm("curve", g, curve=_week_curve())).swing(flags, times) == pytest.approx(target, abs=1e-3)
    assert strength_for_swing(r, rr, flags, times, 1e6, most=2.0) == 2.0
    with pytest.raises(ValueError, match="swing"):
        strength_for_swing(r, rr, flags, times, 0.5)
    with pytest.raises(ValueError, match="whole days"):
        Rhythm("curve", 1.0, curve=(1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="constant"):
        Rhythm("curve", 1.0, curve=(2.0,) * 48)
    with pytest.raises(ValueError, match="only a rhythm of kind 'curve'"):
        Rhythm("wave", 1.0, curve=_week_curve())
