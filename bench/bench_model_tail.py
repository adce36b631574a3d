"""The private model where the alarm looks: true-positive rate at 1 %, 5 % and 10 % of normal
events flagged, against exact kNN on the same reference rows; writes the `model-tail` section of
docs/benchmarks/model.md.

    python bench/bench_model_tail.py --jobs 2                  # 6 seeds, sizes 1,000 / 3,000 / 20,000
    python bench/bench_model_tail.py --seeds 1 --sizes 3000 --no-write --variants default tail
    python bench/bench_model_tail.py --oracle --seeds 3          # where the tail's information lies
    python bench/bench_model_tail.py --ceiling --seeds 6 --jobs 2  # below half of kNN: every layout of a family
    python bench/bench_model_tail.py --grid-ceiling --seeds 3 --jobs 2  # the most a grid of noisy counts gives (d = 3)
    python bench/bench_model_tail.py --race --seeds 3 --jobs 2   # private RACE sketches beside the grids

Protocol, per shared set and seed s (rng = default_rng(s)):
- reference: min(size, 60 % of the inliers) inliers drawn at random (a size is run on a set
  only where 60 % of its inliers reach it, 3,000 always as min(3,000, 60 %));
- thresholds: up to 5,000 of the other (unseen) inliers; the threshold at rate c is the
  (1 - c) quantile of their scores, for every model alike (so the figure is the model's
  ranking in its tail, not its calibration, which `flag rate` reports separately);
- positives: every outlier of the set; TPR = share of them scoring above the threshold;
- exact kNN: distance to the 5th nearest reference row; both scaled with the same public
  bounds (the whole set's min/max, as domain knowledge would give them);
- the private models at model.epsilon = 1 with seeded noise 1000 s + 1.
"Ratio" = private TPR / exact kNN's TPR, counted where exact kNN's TPR >= 0.3.
The 20,000-row cases: "sim_skin3" (`skin_like`: a simulated 3-feature set of 100,000 inliers whose
outliers only a fine joint grid sees), "sim_gauss3" (`gauss_far`: one Gaussian blob, outliers far
from all data: the opposite shape), 32_shuttle[:3] and [:4] (its first 3 and 4 features) and
32_shuttle (d = 9). One more many-feature set: "sk_optdigits" (`optdigits_like`: the 8 x 8 digits scikit-learn
ships, built as the public optdigits outlier set is, digit 0 the outliers), where the model fails as it does on a
held-out 64-feature set.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
sys.path.insert(0, str(REPO))

RATES = (0.01, 0.05, 0.1)
SIZES = (1000, 3000, 20000)
REF_SHARE = 0.6
N_THRESHOLD = 5000
TPR_FLOOR = 0.3
EPSILON = 1.0
# name -> (file stem, columns or None)
EXTRA = {"32_shuttle[:3]": ("32_shuttle", [0, 1, 2]), "32_shuttle[:4]": ("32_shuttle", [0, 1, 2, 3]),
         "sim_skin3": (None, None), "sim_gauss3": (None, None), "sk_optdigits": (None, None)}
LOW_D_LARGE = ("32_shuttle", "32_shuttle[:3]", "32_shuttle[:4]", "sim_skin3", "sim_gauss3")


def gauss_far(seed: int = 0, n_in: int = 100000, n_out: int = 2000, d: int = 3):
    """The opposite shape: normal data one Gaussian blob (mean 50, sd 15 per feature, clipped to
    [0, 100]), outliers uniform in the cube at least 3.5 sd from its centre: far from all data,
    in cells that hold nothing. Fixed seed."""
    g = np.random.default_rng(seed)
    Xi = np.clip(g.normal(50, 15, (n_in, d)), 0, 100)
    Xo = np.empty((0, d))
    while len(Xo) < n_out:
        u = g.uniform(0, 100, (4 * n_out, d))
        Xo = np.vstack([Xo, u[np.linalg.norm((u - 50) / 15, axis=1) > 3.5]])
    return np.r_[Xi, Xo[:n_out]], np.r_[np.zeros(n_in), np.ones(n_out)].astype(int)


def skin_like(seed: int = 0, n_in: int = 100000, n_out: int = 20000, gap: float = 25.0):
    """A simulated 3-feature set shaped like a held-out 3-feature set of 245,000 rows (colour values in
    [0, 255], many rows, outliers that no single feature separates): inliers are 12 broad
    blobs and 10 % uniform noise, thinned to 5 % within ``gap`` of a curved band; outliers are
    a dense, narrow band along it, every coordinate inside the inliers' range. Only a fine
    joint grid over all three features sees them. Fixed seed: the same set every run."""
    g = np.random.default_rng(seed)
    centres, sds, w = g.uniform(20, 235, (12, 3)), g.uniform(10, 45, (12, 3)), g.dirichlet(np.ones(12) * 2)

    def band(t):
        return np.c_[0.55 * t + 40, 0.8 * t + 5, t]

    knots = band(np.linspace(60, 240, 50))
    parts, have = [], 0
    while have < n_in:
        comp = g.choice(12, n_in, p=w)
        Xi = centres[comp] + sds[comp] * g.standard_normal((n_in, 3))
        u = g.random(n_in) < 0.1
        Xi[u] = g.uniform(0, 255, (int(u.sum()), 3))
        near = np.linalg.norm(Xi[:, None, :] - knots[None, :, :], axis=2).min(axis=1)
        parts.append(Xi[(near > gap) | (g.random(n_in) < 0.05)])
        have += len(parts[-1])
    Xo = band(g.uniform(60, 240, n_out)) + g.standard_normal((n_out, 3)) * np.array([4.0, 4.0, 6.0])
    X = np.clip(np.r_[np.concatenate(parts)[:n_in], Xo], 0, 255).round()
    return X, np.r_[np.zeros(n_in), np.ones(n_out)].astype(int)


def optdigits_like(seed: int = 0, n_out: int = 150):
    """64 features (8 x 8 pixel counts, 0 to 16): the 1,797 digits scikit-learn ships (UCI optdigits' test
    part), built as the public optdigits outlier set is (ODDS): the digits 1 to 9 are the inliers, ``n_out``
    zeros drawn at random the outliers. Fixed seed."""
    from sklearn.datasets import load_digits

    X, digit = load_digits(return_X_y=True)
    zeros = np.random.default_rng(seed).choice(np.flatnonzero(digit == 0), n_out, replace=False)
    X = np.r_[X[digit != 0], X[zeros]].astype(np.float64)
    return X, np.r_[np.zeros(int((digit != 0).sum())), np.ones(n_out)].astype(int)


def datasets() -> list[str]:
    names = sorted((p.stem for p in (SHARED / "datasets").glob("*.npz")), key=lambda n: int(n.split("_")[0]))
    return names + list(EXTRA)


def load(name: str) -> tuple[np.ndarray, np.ndarray]:
    stem, cols = EXTRA.get(name, (name, None))
    if name == "sim_skin3":
        return skin_like()
    if name == "sim_gauss3":
        return gauss_far()
    if name == "sk_optdigits":
        return optdigits_like()
    z = np.load(SHARED / "datasets" / f"{stem}.npz")
    X, y = np.asarray(z["X"], dtype=np.float64), np.asarray(z["y"]).astype(int)
    return (X if cols is None else X[:, cols]), y


def variants() -> dict:
    """Model name -> factory(epsilon, bounds, seed) of an unfitted model."""
    from monitor.model import GridKNN

    out = {"default": lambda e, b, s: GridKNN(epsilon=e, bounds=b, random_state=s)}
    if "score_power" in GridKNN.__init__.__code__.co_varnames:  # (absent in a checkout before it: A/B runs)
        out["arithmetic mean (before)"] = lambda e, b, s: GridKNN(epsilon=e, bounds=b, random_state=s, score_power=1.0)
    return out


# Tried on the sets with d <= 4, not kept (docs/benchmarks/model.md, "A count in the nearest cells"): the fine
# grid's score as the noisy count in the L1 ball of depth 1 (k far above any such count: every event ranks by
# it), and the kNN radius at depth 1. Only with --variants NAME.
TRIALS = {
    "v4 rule": dict(layout_rule="v4"),  # the layout rule before the tail rule (2026-12)
    "count, depth 1": dict(max_depth=1, k=1e9),
    "count, depth 1, 16 bins": dict(max_depth=1, k=1e9, bins=16),
    "kNN, depth 1, k 30": dict(max_depth=1, k=30.0),
    "kNN, k 15": dict(k=15.0),
    "kNN, depth 3, k 30": dict(max_depth=3, k=30.0),
    # Tried on the sets with d >= 12 (docs/benchmarks/model.md, "Many features: what hides sk_optdigits' zeros").
    "4 features a grid": dict(group_size=4),
    "no one-feature grids": dict(marginals=0),
    "4 features a grid, no one-feature grids": dict(group_size=4, marginals=0),
    # Tried with the power mean over the grids (docs/benchmarks/model.md, "One score from many grids").
    "score power 2": dict(score_power=2.0),
    "score power 3": dict(score_power=3.0),
    # Tried on the fine grid beyond 20,000 rows (docs/benchmarks/model.md, "The most a grid of noisy counts").
    "16 bins": dict(bins=16),
    "depth 3": dict(max_depth=3),
    "depth 4": dict(max_depth=4),
    "kNN, k 12": dict(k=12.0),
}


def trial(name: str):
    from monitor.model import GridKNN

    opts = TRIALS[name]
    return lambda e, b, s: GridKNN(epsilon=e, bounds=b, random_state=s, **opts)


def exact_knn(R: np.ndarray, Y: np.ndarray, bounds: np.ndarray, k: int = 5) -> np.ndarray:
    from scipy.spatial import cKDTree

    lo, span = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    return cKDTree((R - lo) / span).query(np.clip((Y - lo) / span, 0, 1), k=k)[0][:, k - 1]


def tprs(s_in: np.ndarray, s_out: np.ndarray) -> list[float]:
    return [float((s_out > np.quantile(s_in, 1 - c)).mean()) for c in RATES]


def run_all(fn, work: list, jobs: int) -> list:
    """``fn`` over ``work``, in ``jobs`` processes."""
    if jobs <= 1:
        return [fn(w) for w in work]
    from multiprocessing import Pool

    with Pool(jobs) as pool:
        return pool.map(fn, work, chunksize=1)


def split(name: str, size: int, seed: int):
    """The protocol's rows of one (set, size, seed): (X, public bounds, reference, unseen inliers, outliers, n_ref)."""
    X, y = load(name)
    lo, hi = X.min(axis=0), X.max(axis=0)
    bounds = np.c_[lo, np.where(hi > lo, hi, lo + 1.0)]
    rng = np.random.default_rng(seed)
    inl, out = np.flatnonzero(y == 0), np.flatnonzero(y == 1)
    perm = rng.permutation(inl)
    n_ref = min(size, int(REF_SHARE * inl.size))
    return X, bounds, X[perm[:n_ref]], X[perm[n_ref:n_ref + N_THRESHOLD]], X[out], n_ref


def one(args) -> list[dict]:
    """Rows for one (set, size, seed): exact kNN and every model variant."""
    name, size, seed, names = args
    from sklearn.metrics import roc_auc_score

    X, bounds, R, I, O, n_ref = split(name, size, seed)
    yy = np.r_[np.zeros(len(I)), np.ones(len(O))]
    rows = []

    def row(method, s_in, s_out, fit_s=0.0, model=None):
        r = {"set": name, "d": X.shape[1], "size": size, "n_ref": n_ref, "seed": seed, "method": method,
             "tpr": tprs(s_in, s_out), "auroc": float(roc_auc_score(yy, np.r_[s_in, s_out])), "fit_s": fit_s}
        if model is not None:  # realised flag rate of the model's own calibrated thresholds
            r["flag"] = [float((s_in > model.threshold_for(c)).mean()) for c in RATES]
        rows.append(r)

    k_in, k_out = exact_knn(R, I, bounds), exact_knn(R, O, bounds)
    row("exact kNN", k_in, k_out)
    facts = variants()
    for m in names:
        t0 = time.perf_counter()
        model = (facts[m] if m in facts else trial(m))(EPSILON, bounds, 1000 * seed + 1).fit(R)
        fit_s = time.perf_counter() - t0
        row(m, model.score_samples(I), model.score_samples(O), fit_s, model)
    return rows


def oracle_one(args) -> dict:
    """Where a set's tail information lies (``--oracle``): exact kNN's TPR at 1 % and 5 %, and that of ONE
    count per event, the reference rows within radius f x r_c of it (r_c: exact kNN's 5th-neighbour distance
    at the rate's threshold) plus Laplace noise of scale 1 / epsilon: what a single epsilon-DP count query
    about that event's neighbourhood would give, alone. A summary that answers every event's query at once
    (a model) cannot do better than each query asked alone; at f > 1 the count stands for a summary that
    knows positions only to within (f - 1) r_c (a grid's cell)."""
    name, size, seed = args
    from scipy.spatial import cKDTree

    X, bounds, *rows, n_ref = split(name, size, seed)
    lo, span = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    R, I, O = ((Z - lo) / span for Z in rows)
    tree = cKDTree(R)
    k_in, k_out = tree.query(I, k=5)[0][:, 4], tree.query(O, k=5)[0][:, 4]
    noise = np.random.default_rng(1000 * seed + 7)
    row = {"set": name, "d": X.shape[1], "n_ref": n_ref, "size": size, "exact": tprs(k_in, k_out)[:2], "count": {}}
    for c in RATES[:2]:
        r = float(np.quantile(k_in, 1 - c))
        for f in ORACLE_RADII:
            s_in, s_out = (-(tree.query_ball_point(Z, f * r, return_length=True) + noise.laplace(0, 1 / EPSILON, len(Z)))
                           for Z in (I, O))
            row["count"][f"{c}/{f}"] = float((s_out > np.quantile(s_in, 1 - c)).mean())
    return row


ORACLE_RADII = (1.0, 1.5, 2.0)
ORACLE_CASES = (("sim_skin3", 20000), ("sim_skin3", 3000), ("20_letter", 3000), ("37_Stamps", 3000),
                ("28_pendigits", 3000), ("32_shuttle[:3]", 20000))


def oracle_section(seeds: int, jobs: int) -> str:
    work = [(n, s, seed) for n, s in ORACLE_CASES for seed in range(seeds)]
    rows = run_all(oracle_one, work, jobs)
    lines = ["| set | d | ref rows | exact kNN TPR 1 / 5 % | one noisy count at r, 1.5 r, 2 r: 1 % | 5 % |", "|---|---|---|---|---|---|"]
    for name, size in ORACLE_CASES:
        rs = [r for r in rows if (r["set"], r["size"]) == (name, size)]
        ex = np.mean([r["exact"] for r in rs], axis=0)
        cells = [" / ".join(f"{np.mean([r['count'][f'{c}/{f}'] for r in rs]):.2f}" for f in ORACLE_RADII) for c in RATES[:2]]
        lines.append(f"| {name} | {rs[0]['d']} | {rs[0]['n_ref']:,} | {ex[0]:.2f} / {ex[1]:.2f} | {cells[0]} | {cells[1]} |")
    return ("### Where the tail's information lies: one noisy count per event (2026-12)\n\n"
            f"Reproduce: `python bench/bench_model_tail.py --oracle --seeds {seeds}` (`oracle_one`'s docstring). Per event, "
            "the number of reference rows within f times exact kNN's radius at the rate (r), plus Laplace noise of one "
            "epsilon-1 query, ranked like a score; the same reference and unseen rows as above, mean over "
            f"{seeds} seeds.\n\n" + "\n".join(lines) + "\n")


# --race: a private RACE sketch (the issue's candidate), every (rows, hashes, width) of a small family.
RACE_SETS = ("20_letter", "sk_optdigits", "sim_skin3", "28_pendigits", "18_Ionosphere", "21_Lymphography", "45_wine",
             "38_thyroid", "30_satellite", "6_cardio", "23_mammography")
RACE_FAMILY = tuple((r, k, c) for r in (4, 16, 64) for k in (1, 2, 4, 8) for c in (0.25, 0.5, 1.0, 2.0))


def race_scores(U: np.ndarray, rows: int, hashes: int, width: float, epsilon: float, rng, buckets: int = 1 << 12):
    """A private RACE sketch (Coleman & Shrivastava, "A one-pass distributed and private sketch for kernel sums",
    CCS 2021): ``rows`` arrays of ``buckets`` counters, each indexed by ``hashes`` concatenated p-stable L2 hashes
    of all features (width ``width``); a record adds 1 to one counter of every array (L1 sensitivity ``rows``), so
    every counter gets Laplace(rows / epsilon). An event's score is minus its mean counter: low density ranks high."""
    d = U.shape[1]
    A, B = rng.standard_normal((rows, hashes, d)), rng.uniform(0, width, (rows, hashes))
    mult = rng.integers(1, 1 << 31, (rows, hashes))

    def cells(Z):
        h = np.floor((np.einsum("rkd,nd->nrk", A, Z) + B[None]) / width).astype(np.int64)
        return (h * mult[None]).sum(axis=2) % buckets

    at = cells(U)
    counts = np.stack([np.bincount(at[:, r], minlength=buckets) for r in range(rows)]).astype(float)
    counts += rng.laplace(0.0, rows / epsilon, counts.shape)
    return lambda Z: -counts[np.arange(rows)[None, :], cells(Z)].mean(axis=1)


def race_one(args) -> dict:
    """``--race``: exact kNN, the default model and every sketch of ``RACE_FAMILY`` on one (set, seed) at 3,000
    rows; the sketch's width is c x sqrt(hashes) x sqrt(d) x n^(-1/d) (the spacing of n points in the cube: public)."""
    name, seed = args
    X, bounds, R, I, O, n_ref = split(name, 3000, seed)
    row = {"set": name, "d": X.shape[1], "n_ref": n_ref, "exact": tprs(exact_knn(R, I, bounds), exact_knn(R, O, bounds))}
    model = variants()["default"](EPSILON, bounds, 1000 * seed + 1).fit(R)
    row["default"] = tprs(model.score_samples(I), model.score_samples(O))
    lo, span = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    U, UI, UO = (np.clip((Z - lo) / span, 0, 1) for Z in (R, I, O))
    spacing = np.sqrt(X.shape[1]) * n_ref ** (-1.0 / X.shape[1])
    for rows, hashes, c in RACE_FAMILY:
        score = race_scores(U, rows, hashes, c * np.sqrt(hashes) * spacing, EPSILON, np.random.default_rng(1000 * seed + 7))
        row[f"{rows},{hashes},{c}"] = tprs(score(UI), score(UO))
    return row


def race_section(seeds: int, jobs: int) -> str:
    rows = run_all(race_one, [(n, seed) for n in RACE_SETS for seed in range(seeds)], jobs)
    keys = [f"{r},{k},{c}" for r, k, c in RACE_FAMILY]
    mean = {(n, m): np.mean([r[m] for r in rows if r["set"] == n], axis=0) for n in RACE_SETS for m in ["exact", "default", *keys]}
    out, summary = [], []
    for i, rate in ((0, "1 %"), (1, "5 %")):
        sets = [n for n in RACE_SETS if mean[n, "exact"][i] >= 0.3]
        ratio = {m: [mean[n, m][i] / mean[n, "exact"][i] for n in sets] for m in ["default", *keys]}
        fixed = max(keys, key=lambda m: np.median(ratio[m]))
        best = [max(mean[n, m][i] for m in keys) / mean[n, "exact"][i] for n in sets]
        summary.append(f"- at {rate} ({len(sets)} sets): the default model's ratio median {np.median(ratio['default']):.2f}, "
                       f"worst {min(ratio['default']):.2f}; the best sketch of the family for every set ({fixed}: rows, "
                       f"hashes, width) median {np.median(ratio[fixed]):.2f}, worst {min(ratio[fixed]):.2f}; the best "
                       f"sketch picked per set on its answers median {np.median(best):.2f}")
        out.append((rate, sets, ratio, fixed, best))
    lines = ["| set | d | ref rows | rate | exact kNN TPR | default: ratio | best sketch for every set: ratio | best sketch for this set, picked on its answers: ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for rate, sets, ratio, fixed, best in out:
        for j, n in enumerate(sets):
            r0 = next(r for r in rows if r["set"] == n)
            lines.append(f"| {n} | {r0['d']} | {r0['n_ref']:,} | {rate} | {mean[n, 'exact'][0 if rate == '1 %' else 1]:.2f} | "
                         f"{ratio['default'][j]:.2f} | {ratio[fixed][j]:.2f} | {best[j]:.2f} |")
    return ("### A private RACE sketch beside the grids: tried, not kept (2026-12-08)\n\n"
            f"Reproduce: `python bench/bench_model_tail.py --race --seeds {seeds} --jobs 2` (`race_one`'s docstring). "
            f"The sets at 3,000 rows where exact kNN flags at least 0.3, epsilon 1, mean over {seeds} seeds; "
            f"{len(RACE_FAMILY)} sketches (4, 16 or 64 arrays of 4,096 counters; 1, 2, 4 or 8 hashes; four widths). "
            "Ratio = TPR / exact kNN's.\n\n" + "\n".join(summary) + "\n\n" + "\n".join(lines) + "\n")


DEPTH_CASES = (("sim_skin3", 20000), ("sim_skin3", 3000), ("sim_gauss3", 20000), ("sim_gauss3", 3000),
               ("32_shuttle[:3]", 20000), ("32_shuttle[:4]", 20000))


def depths_one(args) -> dict:
    """``--depths``: the default model's one fine joint grid read at two search depths, and both together (an
    event as unusual as it is at the more unusual of the two: the larger of its two normal shares below,
    ``max(F1(s1), F2(s2))``). F from half the unseen inliers (optimistic: real rows, no noise) or from the
    model's own synthetic sample (what a rule without a second release could use); TPR on the other half."""
    name, size, seed = args
    from monitor.features import scale_to_unit
    from monitor.model import GridKNN

    _, bounds, R, I, O, n_ref = split(name, size, seed)
    model = GridKNN(epsilon=EPSILON, bounds=bounds, random_state=1000 * seed + 1).fit(R)
    row = {"set": name, "size": size, "n_ref": n_ref, "exact": tprs(exact_knn(R, I, bounds), exact_knn(R, O, bounds))[:2]}
    if len(model.grids_) != 1:
        return row
    grid, half = model.grids_[0], len(I) // 2
    syn = model._synthetic(np.random.default_rng(0))
    at = {depth: [grid.score_fast(Z, model.k_, depth, False) for Z in (scale_to_unit(I, bounds), scale_to_unit(O, bounds), syn)]
          for depth in (1, 2)}
    for depth in (1, 2):
        row[f"depth {depth}"] = tprs(at[depth][0][half:], at[depth][1])[:2]

    def share_below(ref, x):
        return np.searchsorted(np.sort(ref), x, side="right") / len(ref)

    for label, ref in (("both, F from real rows", lambda d: at[d][0][:half]), ("both, F from the synthetic sample", lambda d: at[d][2])):
        s_in, s_out = (np.maximum(share_below(ref(1), at[1][j]), share_below(ref(2), at[2][j])) for j in (0, 1))
        row[label] = tprs(s_in[half:], s_out)[:2]
    return row


DEPTH_COLUMNS = ("depth 2", "depth 1", "both, F from real rows", "both, F from the synthetic sample")


def depths_section(seeds: int, jobs: int) -> str:
    work = [(n, s, seed) for n, s in DEPTH_CASES for seed in range(seeds)]
    rows = run_all(depths_one, work, jobs)
    lines = ["| set | ref rows | exact kNN TPR 1 / 5 % | " + " | ".join(f"{c}: 1 / 5 %" for c in DEPTH_COLUMNS) + " |",
             "|---|---|---|" + "---|" * len(DEPTH_COLUMNS)]
    for name, size in DEPTH_CASES:
        rs = [r for r in rows if (r["set"], r["size"]) == (name, size) and "depth 2" in r]
        if not rs:
            continue
        cells = [" / ".join(f"{v:.2f}" for v in np.mean([r[c] for r in rs], axis=0)) for c in ("exact",) + DEPTH_COLUMNS]
        lines.append(f"| {name} | {rs[0]['n_ref']:,} | " + " | ".join(cells) + " |")
    return ("### The fine grid read at two depths (2026-12)\n\n"
            f"Reproduce: `python bench/bench_model_tail.py --depths --seeds {seeds}` (`depths_one`'s docstring). The "
            "default model's one joint grid (sets with d <= 4), its kNN score at search depth 2 (the default) and 1, "
            f"and both together; TPR on every outlier, mean over {seeds} seeds.\n\n" + "\n".join(lines) + "\n")


GRID_CASES = (("sim_skin3", 20000), ("sim_skin3", 60000), ("sim_gauss3", 20000), ("sim_gauss3", 60000))
GRID_WIDTHS = (0.25, 0.5, 1.0, 1.5)  # a cell's width over exact kNN's radius at 1 %
GRID_RADII = (1.0, 1.25, 1.5)  # the ball's radius over it


def ball_mass(H: np.ndarray, Z: np.ndarray, radius: float) -> np.ndarray:
    """The mass of histogram ``H`` (bins^d cells over [0, 1]^d) in the cells whose centres lie within ``radius``
    of each row of ``Z``."""
    bins, d = H.shape[0], H.ndim
    cells = np.minimum((Z * bins).astype(np.int64), bins - 1)
    m = int(np.ceil(radius * bins)) + 1
    offs = np.stack(np.meshgrid(*[np.arange(-m, m + 1)] * d, indexing="ij"), axis=-1).reshape(-1, d)
    out = np.empty(len(Z))
    for s in range(0, len(Z), 500):
        nb = cells[s:s + 500, None, :] + offs[None]
        inside = np.all((nb >= 0) & (nb < bins), axis=2)
        inside &= np.linalg.norm((nb + 0.5) / bins - Z[s:s + 500, None, :], axis=2) <= radius
        out[s:s + 500] = np.where(inside, H[tuple(np.clip(nb, 0, bins - 1)[..., a] for a in range(d))], 0.0).sum(axis=1)
    return out


def grid_ceiling_one(args) -> dict:
    """``--grid-ceiling``: the most a flat grid of noisy counts could give a set's 1 % tail, with the answers'
    help. Per seed: r, exact kNN's 5th-neighbour distance at the unseen inliers' 99th percentile (not private:
    an oracle); one histogram of EVERY reference row (none held apart), cells of width f x r, Laplace noise of
    scale 1 / epsilon per cell (one grid: no composition), negative values kept (no bias); an event's score is
    minus the noisy mass of the cells whose centres lie within g x r of it, for every (f, g) of GRID_WIDTHS x
    GRID_RADII, and the same cells with exact counts (ties broken at random: integer masses tie at the
    threshold). Beside it the default model on the same rows and ONE noisy count within r per event
    (``oracle_one``)."""
    name, size, seed = args
    from scipy.spatial import cKDTree

    from monitor.model import GridKNN

    _, bounds, R, I, O, n_ref = split(name, size, seed)
    model = GridKNN(epsilon=EPSILON, bounds=bounds, random_state=1000 * seed + 1).fit(R)
    default = tprs(model.score_samples(I), model.score_samples(O))[0]
    lo, span = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    R, I, O = (np.clip((Z - lo) / span, 0, 1) for Z in (R, I, O))
    tree = cKDTree(R)
    k_in, k_out = tree.query(I, k=5)[0][:, 4], tree.query(O, k=5)[0][:, 4]
    r = float(np.quantile(k_in, 1 - RATES[0]))
    noise = np.random.default_rng(1000 * seed + 11)
    one = [-(tree.query_ball_point(Z, r, return_length=True) + noise.laplace(0, 1 / EPSILON, len(Z))) for Z in (I, O)]
    row = {"set": name, "size": size, "n_ref": n_ref, "r": r, "exact kNN": tprs(k_in, k_out)[0],
           "default": default, "one count": tprs(*one)[0], "bins": model.grid_bins_, "grids": {}}
    for f in GRID_WIDTHS:
        bins = int(np.ceil(1.0 / (f * r)))
        H = np.histogramdd(R, bins=[np.linspace(0.0, 1.0, bins + 1)] * R.shape[1])[0]
        noisy = H + noise.laplace(0, 1 / EPSILON, H.shape)
        for g in GRID_RADII:
            exact = [-ball_mass(H, Z, g * r) + noise.uniform(0, 0.5, len(Z)) for Z in (I, O)]
            row["grids"][(f, g)] = [tprs(-ball_mass(noisy, I, g * r), -ball_mass(noisy, O, g * r))[0], tprs(*exact)[0]]
    return row


def grid_ceiling_section(seeds: int, jobs: int) -> str:
    t0 = time.perf_counter()
    rows = run_all(grid_ceiling_one, [(n, s, seed) for n, s in GRID_CASES for seed in range(seeds)], jobs)
    lines = ["| set | ref rows | exact kNN TPR at 1 % | the default model (its bins) | one noisy count within r | "
             "best grid of noisy counts (cell width, ball radius) | the same cells, exact counts |", "|---|---|---|---|---|---|---|"]
    cases = {case: [r for r in rows if (r["set"], r["size"]) == case] for case in GRID_CASES}
    for (name, size), rs in cases.items():
        best = max(rs[0]["grids"], key=lambda fg: np.mean([r["grids"][fg][0] for r in rs]))
        mean = {c: np.mean([r[c] for r in rs]) for c in ("exact kNN", "default", "one count")}
        lines.append(f"| {name} | {rs[0]['n_ref']:,} | {mean['exact kNN']:.2f} | {mean['default']:.2f} ({rs[0]['bins'][0]}) | "
                     f"{mean['one count']:.2f} | {np.mean([r['grids'][best][0] for r in rs]):.2f} ({best[0]:g} r, {best[1]:g} r) | "
                     f"{np.mean([r['grids'][best][1] for r in rs]):.2f} |")
    pairs = list(rows[0]["grids"])
    lines += ["", "Every pair, noisy counts (cell width / ball radius, in r):", "",
              "| set | ref rows | " + " | ".join(f"{f:g} / {g:g}" for f, g in pairs) + " |", "|---|---|" + "---|" * len(pairs)]
    for (name, size), rs in cases.items():
        lines.append(f"| {name} | {rs[0]['n_ref']:,} | " + " | ".join(f"{np.mean([r['grids'][fg][0] for r in rs]):.2f}" for fg in pairs) + " |")
    took = time.perf_counter() - t0
    return ("### The most a grid of noisy counts could flag at 1 % (2026-12-07)\n\n"
            f"Reproduce: `python bench/bench_model_tail.py --grid-ceiling --seeds {seeds} --jobs {jobs}` ({took:.0f} s; "
            "`grid_ceiling_one`'s docstring). Cells of width 0.25 to 1.5 times exact kNN's radius r at 1 %, balls of 1 to "
            "1.5 r, every reference row counted, noise of one epsilon-1 grid; the pair best on average, picked looking "
            f"at the answers. TPR at 1 %, mean over {seeds} seeds.\n\n" + "\n".join(lines) + "\n")


CEILING_CASES = (("20_letter", 3000), ("sk_optdigits", 3000))


def ceiling_one(args) -> dict:
    """``--ceiling``: where a set stays below half of exact kNN's TPR, is it the layout or the information? Per
    seed: every layout of ``bench_layout_ceiling``'s family (grids of 1 to 8 features, 2 to 32 bins, 2 to 64 grids,
    k fixed or the rule's) fitted privately at model.epsilon; the default layout with exact counts (epsilon 1e6:
    what the grids could hold without noise); the Mahalanobis distance from the exact covariance and from one
    released under pure DP at model.epsilon (``bench_projection_ceiling.dp_mean_covariance``)."""
    name, size, seed = args
    from bench_layout_ceiling import layouts
    from bench_projection_ceiling import dp_mean_covariance, mahalanobis
    from monitor.model import GridKNN

    _, bounds, R, I, O, n_ref = split(name, size, seed)
    row = {"set": name, "size": size, "n_ref": n_ref, "d": R.shape[1],
           "exact kNN": tprs(exact_knn(R, I, bounds), exact_knn(R, O, bounds))[:2], "layouts": {}}

    def tpr_of(model):
        return tprs(model.score_samples(I), model.score_samples(O))[:2]

    row["default"] = tpr_of(GridKNN(epsilon=EPSILON, bounds=bounds, random_state=1000 * seed + 1).fit(R))
    row["default, exact counts"] = tpr_of(GridKNN(epsilon=1e6, bounds=bounds, random_state=1000 * seed + 1).fit(R))
    for p, b, g, k in layouts():
        if p <= R.shape[1]:
            m = GridKNN(epsilon=EPSILON, bounds=bounds, group_size=p, bins=b, n_grids=g, marginals=0, k=k,
                        random_state=1000 * seed + 1).fit(R)
            row["layouts"][(p, b, g, k)] = tpr_of(m)
    lo, span = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    X, Ti, To = ((np.clip((Z - lo) / span, 0, 1) - 0.5) for Z in (R, I, O))  # |x_i| <= 1/2: a public bound
    mu, C = X.mean(axis=0), np.cov(X.T)
    row["Mahalanobis, exact covariance"] = tprs(mahalanobis(Ti, mu, C), mahalanobis(To, mu, C))[:2]
    mu, C = dp_mean_covariance(X, EPSILON, np.random.default_rng(2000 + seed))
    row[f"Mahalanobis, covariance at epsilon {EPSILON:g} (pure DP)"] = tprs(mahalanobis(Ti, mu, C), mahalanobis(To, mu, C))[:2]
    return row


CEILING_COLUMNS = ("default", "default, exact counts", "Mahalanobis, exact covariance",
                   f"Mahalanobis, covariance at epsilon {EPSILON:g} (pure DP)")


def ceiling_section(seeds: int, jobs: int) -> str:
    from bench_layout_ceiling import describe

    t0 = time.perf_counter()
    rows = run_all(ceiling_one, [(n, s, seed) for n, s in CEILING_CASES for seed in range(seeds)], jobs)
    h = seeds // 2
    lines = ["| set | d | ref rows | rate | exact kNN TPR | half of it | " + " | ".join(CEILING_COLUMNS)
             + " | layouts | best layout, picked on every seed | picked on the first half of the seeds -> judged on the rest |",
             "|---|---|---|---|---|---|" + "---|" * (len(CEILING_COLUMNS) + 3)]
    for name, size in CEILING_CASES:
        rs = [r for r in rows if (r["set"], r["size"]) == (name, size)]
        for i, rate in enumerate(("1 %", "5 %")):
            ex = np.mean([r["exact kNN"][i] for r in rs])
            fam = {lay: np.array([r["layouts"][lay][i] for r in rs]) for lay in rs[0]["layouts"]}
            best = max(fam, key=lambda lay: fam[lay].mean())
            half = max(fam, key=lambda lay: fam[lay][:h].mean())
            cells = [f"{np.mean([r[c][i] for r in rs]):.2f}" for c in CEILING_COLUMNS]
            lines.append(f"| {name} | {rs[0]['d']} | {rs[0]['n_ref']:,} | {rate} | {ex:.2f} | {ex / 2:.2f} | "
                         + " | ".join(cells) + f" | {len(fam)} | {fam[best].mean():.2f} ({describe(best)}) | "
                         f"{fam[half][:h].mean():.2f} -> {fam[half][h:].mean():.2f} ({describe(half)}) |")
    took = time.perf_counter() - t0
    return ("### Below half of exact kNN: the layout or the information? (2026-12-03)\n\n"
            f"Reproduce: `python bench/bench_model_tail.py --ceiling --seeds {seeds} --jobs {jobs}` ({took:.0f} s; "
            "`ceiling_one`'s docstring). The sets at 3,000 rows whose TPR stays below half of exact kNN's at a rate "
            f"the alarm uses; TPR mean over {seeds} seeds, same rows as the section above. \"Best layout\" is chosen "
            "by looking at the answers: no grid layout of the family does better.\n\n" + "\n".join(lines) + "\n")


def work_list(sets, sizes, seeds) -> list[tuple[str, int, int]]:
    out = []
    for name in sets:
        _, y = load(name)
        n_in = int((y == 0).sum())
        for size in sizes:
            if size != 3000 and REF_SHARE * n_in < size:
                continue
            if size == 20000 and name not in LOW_D_LARGE:
                continue
            for seed in seeds:
                out.append((name, size, seed))
    return out


def table(rows, methods, size) -> tuple[str, dict]:
    sets = [s for s in dict.fromkeys(r["set"] for r in rows if r["size"] == size)]
    head = ("| set | d | ref rows | exact kNN TPR 1 / 5 / 10 % | AUROC | "
            + " | ".join(f"{m}: TPR 1 / 5 / 10 % | ratio 1 / 5 % | AUROC ratio | flag rate 1 / 5 %" for m in methods) + " |")
    lines = [head, "|---|---|---|---|---|" + "---|---|---|---|" * len(methods)]
    summ = {m: {"r1": [], "r5": [], "auc": [], "r1_all": {}, "r5_all": {}} for m in methods}
    for s in sets:
        sel = [r for r in rows if r["set"] == s and r["size"] == size]
        knn = [r for r in sel if r["method"] == "exact kNN"]
        kt = np.mean([r["tpr"] for r in knn], axis=0)
        ka = np.mean([r["auroc"] for r in knn])
        cells = [f"{s} | {knn[0]['d']} | {knn[0]['n_ref']:,} | " + " / ".join(f"{v:.2f}" for v in kt) + f" | {ka:.3f}"]
        for m in methods:
            mr = [r for r in sel if r["method"] == m]
            if not mr:
                cells.append(" - | - | - | -")
                continue
            t = np.mean([r["tpr"] for r in mr], axis=0)
            a = np.mean([r["auroc"] for r in mr])
            fl = np.mean([r["flag"] for r in mr], axis=0)
            rat = [t[i] / kt[i] if kt[i] >= TPR_FLOOR else None for i in (0, 1)]
            for key, i in (("r1", 0), ("r5", 1)):
                if rat[i] is not None:
                    summ[m][key].append(rat[i])
                    summ[m][key + "_all"][s] = rat[i]
            if ka >= 0.6:
                summ[m]["auc"].append(a / ka)
            cells.append(" / ".join(f"{v:.2f}" for v in t) + " | "
                         + " / ".join("-" if v is None else f"{v:.2f}" for v in rat)
                         + f" | {a / ka:.3f} | " + " / ".join(f"{v:.3f}" for v in fl[:2]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), summ


def summary_lines(summ, size) -> list[str]:
    out = []
    for m, s in summ.items():
        if not s["r1"] and not s["r5"]:
            continue
        parts = []
        for key, lab in (("r1", "1 %"), ("r5", "5 %")):
            v = np.array(s[key])
            if v.size:
                worst = min(s[key + "_all"], key=s[key + "_all"].get)
                parts.append(f"at {lab} median {np.median(v):.2f}, worst {v.min():.2f} ({worst}) over {v.size} sets")
        auc = np.mean(s["auc"]) if s["auc"] else float("nan")
        goal = ""
        if size == 3000:
            ok = all(np.median(s[k]) >= 0.8 and min(s[k]) >= 0.5 for k in ("r1", "r5") if s[k])
            goal = f" (goal: median >= 0.8 and every set >= 0.5 at 1 % and 5 %: **{'met' if ok else 'MISSED'}**)"
        elif size == 20000:
            low = {n: v for n, v in s["r1_all"].items() if load(n)[0].shape[1] <= 4}
            ok = bool(low) and min(low.values()) >= 0.9
            goal = (" (goal: >= 0.9 at 1 % on the sets with d <= 4, "
                    + ", ".join(f"{n} {v:.2f}" for n, v in low.items()) + f": **{'met' if ok else 'MISSED'}**)")
        out.append(f"- {size:,} rows, {m}: TPR ratio " + "; ".join(parts) + f"; AUROC ratio mean {auc:.3f}" + goal)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--sets", nargs="+", default=None)
    ap.add_argument("--variants", nargs="+", default=None,
                    help=f"model variants (default: all): default, 'arithmetic mean (before)', or the trials {list(TRIALS)}")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--oracle", action="store_true", help="one noisy count per event instead (oracle_one)")
    ap.add_argument("--depths", action="store_true", help="the fine grid read at two depths instead (depths_one)")
    ap.add_argument("--ceiling", action="store_true", help="every layout of a family where a set stays below half of kNN")
    ap.add_argument("--grid-ceiling", action="store_true", help="the best a grid of noisy counts could flag at 1 %% (d <= 4)")
    ap.add_argument("--race", action="store_true", help="private RACE sketches beside the default model (race_one)")
    a = ap.parse_args(argv)
    for flag, section, name in ((a.depths, depths_section, "model-tail-depths"), (a.oracle, oracle_section, "model-tail-oracle"),
                                (a.ceiling, ceiling_section, "model-tail-ceiling"),
                                (a.grid_ceiling, grid_ceiling_section, "model-tail-grid-ceiling"),
                                (a.race, race_section, "model-tail-race")):
        if flag:
            sys.path.insert(0, str(REPO / "bench"))
            md = section(a.seeds, a.jobs)
            print(md)
            if not a.no_write:
                from report import write_section

                write_section(name, md)
            return 0
    names = a.variants or list(variants())
    work = [(n, s, seed, names) for n, s, seed in work_list(a.sets or datasets(), a.sizes, range(a.seeds))]
    t0 = time.perf_counter()
    parts = run_all(one, work, a.jobs)
    rows = [r for p in parts for r in p]
    took = time.perf_counter() - t0
    body, summaries = [], []
    for size in a.sizes:
        if not any(r["size"] == size for r in rows):
            continue
        t, s = table(rows, names, size)
        body.append(f"**{size:,} reference rows** (or 60 % of the inliers where fewer), mean over {a.seeds} seed(s):\n\n{t}\n")
        summaries += summary_lines(s, size)
    fit = max((r["fit_s"] for r in rows if r["method"] != "exact kNN"), default=0.0)
    cmd = "python bench/bench_model_tail.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = (f"## The tail: true-positive rate at the alarm's flag rates (2026-12)\n\n"
          f"Reproduce: `{cmd.strip()}` ({took:.0f} s; longest fit {fit:.1f} s). Protocol: `bench/bench_model_tail.py`'s "
          "docstring: reference = min(size, 60 % of the inliers) inliers, thresholds from up to 5,000 unseen inliers "
          "(the same empirical quantile for every model), TPR on every outlier, exact kNN = distance to the 5th "
          "neighbour among the same reference rows with the same public min-max bounds, model.epsilon 1. Ratio = "
          "private TPR / exact kNN's, shown where exact kNN's is >= 0.3. Flag rate = the share of the unseen inliers "
          "above the model's own calibrated threshold for 1 % and 5 % (goal within [c/2, 2c] where the held-apart "
          "part is large enough).\n\n" + "\n".join(summaries) + "\n\n" + "\n".join(body))
    if a.no_write:
        print(md)
    else:
        sys.path.insert(0, str(REPO / "bench"))
        from report import write_section

        write_section("model-tail", md)
        print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
