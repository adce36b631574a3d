"""The cheaper computation of the smooth bound (docs/privacy-count.md, Lemma 4) against brute force.

The bound's F is unchanged (degeneracy + 1 of the 2r edge graph, docs/privacy-count.md);
what changed is how it is found: one pair search (split into two column halves from
SPLIT_MIN_DIM dimensions), degrees from that search beyond GRID_MAX_DIM, and a
bracketed degeneracy search. Each piece is checked here against a slow, obvious
reference on small, float-degenerate windows, up to 12 dimensions.
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.outliers import _compiled, smooth_sensitivity
from monitor.outliers._geometry import (
    EDGE_FACTOR,
    GRID_MAX_DIM,
    SPLIT_MIN_DIM,
    BallPacking,
    _Cores,
    close_pairs,
    degrees,
    degrees_and_pairs,
    scaled,
    sq_dist,
)
from monitor.outliers._oracle import largest_ball_subset, local_sensitivity_brute, smooth_oracle, true_degrees


def _window(rng: np.random.Generator, n: int, d: int, r: float) -> np.ndarray:
    """Scaled rows with duplicates, a dense clump, and pairs at exactly r and 2r along an
    axis (and an ulp either side), plus uniform scatter."""
    c = rng.random(d)
    parts = [rng.random((n, d)) * 4 * r + c, np.tile(c, (3, 1)), c + 0.2 * r * rng.random((max(n // 2, 1), d))]
    for step in (r, 2 * r):
        e = np.zeros(d)
        e[int(rng.integers(d))] = step
        far = c + e
        parts.append(np.vstack([far, np.nextafter(far, np.inf), np.nextafter(far, -np.inf)]))
    return np.vstack(parts)


def _brute_pairs(P: np.ndarray, threshold: float) -> set[tuple[int, int]]:
    D = sq_dist(P[:, None, :], P[None, :, :])
    a, b = np.nonzero(np.triu(D <= threshold, 1))
    return set(zip(a.tolist(), b.tolist()))


@pytest.mark.parametrize("block", [None, 7])
@pytest.mark.parametrize("d", [1, 2, 3, 5, SPLIT_MIN_DIM - 1, SPLIT_MIN_DIM, 10, 12])
def test_close_pairs_finds_exactly_the_pairs_the_predicate_accepts(d, block, monkeypatch):
    if block:  # candidates checked in blocks (memory bound on huge windows): same pairs
        monkeypatch.setattr("monitor.outliers._geometry._PAIR_BLOCK", block)
    rng = np.random.default_rng(d)
    for trial in range(15):
        r = float(rng.choice([0.05, 0.1, 1 / 3]))
        P = _window(rng, int(rng.integers(2, 40)), d, r)
        threshold = EDGE_FACTOR * (4 * r * r)
        a, b, d2 = close_pairs(P, threshold)
        got = list(zip(a.tolist(), b.tolist()))
        assert len(got) == len(set(got))  # each pair once, also when both halves propose it
        assert set(got) == _brute_pairs(P, threshold)
        assert np.array_equal(d2, sq_dist(P[a], P[b]))


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(2, 6).flatmap(lambda d: st.lists(
    st.lists(st.floats(-1e6, 1e6, allow_subnormal=True) | st.sampled_from([0.0, -0.0, 0.1, 0.1 + 2**-56, 1 / 3]),
             min_size=d, max_size=d), min_size=2, max_size=6)))
def test_compiled_squared_distance_has_the_bits_of_sq_dist(rows):
    # The compiled pair check decides the edge predicate: it must compute sq_dist's exact
    # float (same operations, same order, no FMA), or a pair at the threshold could flip.
    P = np.array(rows, dtype=float)
    pairs = np.array([(i, j) for i in range(len(P)) for j in range(i + 1, len(P))], dtype=np.int64)
    want = sq_dist(P[pairs[:, 0]], P[pairs[:, 1]])
    a, b, d2 = _compiled.close_pairs_block(P, pairs, np.arange(len(P)), math.inf, np.empty(len(pairs)))
    assert np.array_equal(d2.view(np.int64), want.view(np.int64))
    for t in want:  # at exactly its own value a pair passes; one ulp below, it fails
        a, b, d2 = _compiled.close_pairs_block(P, pairs, np.arange(len(P)), float(t), np.empty(len(pairs)))
        assert set(d2.tolist()) == {x for x in want.tolist() if x <= t}
        a, b, _ = _compiled.close_pairs_block(P, pairs, np.arange(len(P)), float(np.nextafter(t, -np.inf)), np.empty(len(pairs)))
        assert len(a) == np.count_nonzero(want < t)


@pytest.mark.parametrize("d", [GRID_MAX_DIM + 1, 5, SPLIT_MIN_DIM, 10])
@pytest.mark.parametrize("cap", [3, 40])
def test_degrees_and_pairs_match_brute_force_with_dense_rows(d, cap):
    rng = np.random.default_rng(10 * d + cap)
    r = 0.05
    # A dense cluster (shown dense by the pivot shortcut when cap is small) and scatter
    # around it, so listed rows have neighbours among the dense rows.
    X = np.vstack([0.5 + 0.004 * rng.random((2500, d)), 0.5 + 0.1 * rng.random((300, d)), rng.random((200, d))])
    Y = scaled(X, None)
    deg, rows, a, b = degrees_and_pairs(Y, r, cap)
    assert np.array_equal(deg, degrees(Y, r, cap))
    exact = np.minimum(true_degrees(Y, r), cap)
    assert np.array_equal(deg, exact)
    assert np.all(deg[np.setdiff1d(np.arange(len(Y)), rows)] == cap)
    # The edges are exactly the predicate's pairs among the listed rows.
    assert set(zip(a.tolist(), b.tolist())) == _brute_pairs(Y[rows], EDGE_FACTOR * (4 * r * r))


def _degeneracy_reference(n: int, edges: list[tuple[int, int]]) -> int:
    """Remove a vertex of least degree until none is left; the largest least degree seen."""
    adj = {v: set() for v in range(n)}
    for u, v in edges:
        adj[u].add(v)
        adj[v].add(u)
    best = 0
    while adj:
        v = min(adj, key=lambda x: len(adj[x]))
        best = max(best, len(adj[v]))
        for u in adj.pop(v):
            adj[u].discard(v)
    return best


def test_bracketed_degeneracy_matches_the_reference_for_every_valid_bracket():
    rng = np.random.default_rng(11)
    for trial in range(60):
        n = int(rng.integers(2, 30))
        m = int(rng.integers(1, n * (n - 1) // 2 + 1))
        pairs = {tuple(sorted(rng.choice(n, 2, replace=False).tolist())) for _ in range(m)}
        a = np.array([p[0] for p in pairs], dtype=np.int64)
        b = np.array([p[1] for p in pairs], dtype=np.int64)
        want = _degeneracy_reference(n, list(pairs))
        cores, every = _Cores(n, a, b), np.ones(n, dtype=bool)
        assert cores.degeneracy(every) == want
        for lo in range(1, want + 1):
            for hi in (None, want, want + 1, want + 7):
                assert cores.degeneracy(every, lo, hi) == want


def _core_numbers_reference(n: int, edges: list[tuple[int, int]]) -> list[int]:
    """Remove a vertex of least degree until none is left; a vertex's core number is the
    largest least degree seen up to its removal."""
    adj = {v: set() for v in range(n)}
    for u, v in edges:
        adj[u].add(v)
        adj[v].add(u)
    core, level = [0] * n, 0
    while adj:
        v = min(adj, key=lambda x: len(adj[x]))
        level = max(level, len(adj[v]))
        core[v] = level
        for u in adj.pop(v):
            adj[u].discard(v)
    return core


@pytest.mark.parametrize("relabel", [False, True])
def test_cores_of_masked_subgraphs_match_the_reference(relabel):
    # Core numbers of the whole graph, and the degeneracy and every c-core's emptiness of
    # induced subgraphs (the searches start from the whole graph's cores). Relabelled:
    # the compiled peels run on vertices in another order (BallPacking's spatial order),
    # the answers stay in the caller's labels.
    rng = np.random.default_rng(12)
    for trial in range(40):
        n = int(rng.integers(2, 40))
        m = int(rng.integers(1, n * (n - 1) // 2 + 1))
        pairs = sorted({tuple(sorted(rng.choice(n, 2, replace=False).tolist())) for _ in range(m)})
        a = np.array([p[0] for p in pairs], dtype=np.int64)
        b = np.array([p[1] for p in pairs], dtype=np.int64)
        cores = _Cores(n, a, b, order=rng.permutation(n) if relabel else None)
        assert cores.core.tolist() == _core_numbers_reference(n, pairs)
        for _ in range(5):
            mask = rng.random(n) < rng.uniform(0.2, 1.0)
            rows = np.flatnonzero(mask)
            local = {v: i for i, v in enumerate(rows.tolist())}
            inside = [(local[u], local[v]) for u, v in pairs if u in local and v in local]
            want = _degeneracy_reference(len(rows), inside)
            for lo in range(0, want + 1):
                for hi in (None, want, want + 2):
                    assert cores.degeneracy(mask, lo, hi) == want
            for c in range(0, want + 3):
                assert cores.core_is_empty(mask, c) == (want < c or (c == 0 and rows.size == 0))


@pytest.mark.parametrize("d", [2, 4, SPLIT_MIN_DIM, 10])
def test_ball_packing_remembered_brackets_never_change_a_value(d):
    # The same masks evaluated in random order on one BallPacking (brackets from the
    # values already found) and each on a fresh one (no brackets) agree.
    rng = np.random.default_rng(d)
    P = _window(rng, 60, d, 0.1)
    shared = BallPacking(P, 0.1)
    for trial in range(25):
        mask = rng.random(len(P)) < rng.uniform(0.1, 1.0)
        if trial % 5 == 4:
            mask = mask | (rng.random(len(P)) < 0.05)  # near-copies of an earlier mask
        assert shared.count(mask) == BallPacking(P, 0.1).count(mask)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.sampled_from([4, 6, SPLIT_MIN_DIM, 10]), n=st.integers(3, 8), k=st.integers(1, 3),
       r=st.sampled_from([0.1, 0.3]), beta=st.sampled_from([0.1, 0.5, 1.0]), seed=st.integers(0, 2**32 - 1))
def test_high_dimensional_bound_is_valid_smooth_and_at_least_the_paper_algorithm(d, n, k, r, beta, seed):
    rng = np.random.default_rng(seed)
    # Rows around a centre at scaled distances near r and 2r, some repeated.
    c = rng.random(d)
    u = rng.standard_normal((n, d))
    X = c + (r * math.sqrt(d)) * rng.choice([0.5, 1.0, 2.0], (n, 1)) * u / np.linalg.norm(u, axis=1, keepdims=True)
    X[-1] = X[0]
    s = smooth_sensitivity(X, k, r, beta)
    assert local_sensitivity_brute(X, k, r) <= s
    assert s >= smooth_oracle(X, k, r, beta) * (1 - 1e-12)
    P = scaled(X, None)
    assert BallPacking(P, r).count(np.ones(n, bool)) >= largest_ball_subset(P, r)
    for i in range(n):
        s2 = smooth_sensitivity(np.delete(X, i, axis=0), k, r, beta)
        assert s <= math.exp(beta) * s2 and s2 <= math.exp(beta) * s


def test_large_windows_give_the_bound_of_the_plain_search():
    # Windows big enough for the shortcuts, the split search and the branch and bound:
    # the bound equals the one computed from brute-force degrees and a fresh packing per
    # band (no shared geometry, no brackets), over every t up to a proven horizon.
    rng = np.random.default_rng(3)
    for d in (5, 10):
        X = np.vstack([0.5 + 0.02 * rng.standard_normal((1500, d)), rng.random((150, d))]).clip(0, 1)
        k, r, beta = 3, 0.1, 0.3
        Y = scaled(X, None)
        deg = true_degrees(Y, r)
        best, t = 0.0, 0
        while math.exp(-beta * t) * (len(X) + t + 1) > best or t < 1 / beta:
            hi = Y[(deg >= k - t) & (deg <= k + t)]
            lo = Y[(deg >= k - t - 1) & (deg <= k + t - 1)]
            f = max(BallPacking(P, r).count(np.ones(len(P), bool)) for P in (hi, lo))
            best = max(best, math.exp(-beta * t) * (f + t + 1))
            t += 1
        assert smooth_sensitivity(X, k, r, beta) == pytest.approx(best, rel=1e-9)


def test_top_subspace_counts_equal_the_two_calls_and_count_each_candidate_once(monkeypatch):
    import monitor.outliers.mechanisms as mechanisms
    import monitor.outliers.subspaces as subspaces
    from monitor.outliers import private_count, private_top_subspace_counts, private_top_subspaces

    rng = np.random.default_rng(4)
    X = np.vstack([0.5 + 0.01 * rng.random((400, 4)), rng.random((30, 4))])
    cands = [(0,), (1,), (2,), (3,), (0, 1), (2, 3), (0, 1, 2)]
    for seed in range(5):
        src = np.random.default_rng(seed)
        chosen = private_top_subspaces(X, 3, 0.05, 3, 1.0, cands, rng=src)
        expected = [(c, private_count(X, 3, 0.05, 0.5, 1e-6, subspace=c, rng=src)) for c in chosen]
        assert private_top_subspace_counts(X, 3, 0.05, 3, 1.0, 0.5, 1e-6, cands, rng=np.random.default_rng(seed)) == expected
    calls = []
    real = subspaces.count_outliers
    monkeypatch.setattr(subspaces, "count_outliers", lambda *a, **kw: calls.append(a[3]) or real(*a, **kw))
    monkeypatch.setattr(mechanisms, "count_outliers", lambda *a, **kw: calls.append(a[3]) or real(*a, **kw))
    private_top_subspace_counts(X, 3, 0.05, 3, 1.0, 0.5, 1e-6, cands[:6], rng=0)  # all global (<= 2-D)
    assert sorted(calls) == sorted(cands[:6])


def test_compiled_loops_work_where_numba_cannot_cache(tmp_path):
    # A read-only install with no writable home: numba refuses to cache; the loops are
    # then compiled in memory instead of failing at import.
    import os
    import subprocess
    import sys

    code = (
        "import numba.core.caching as c\n"
        "def refuse(self): raise OSError('read-only')\n"
        "for cls in c.CacheImpl._locator_classes: cls.ensure_cache_path = refuse\n"
        "import numpy as np\n"
        "from monitor.outliers import _compiled as k\n"
        "print(k.peel(*k.adjacency(3, np.array([0, 1]), np.array([1, 2])), np.ones(3, bool), 1))\n"
    )
    env = dict(os.environ, HOME=str(tmp_path / "missing"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3"
