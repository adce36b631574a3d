"""Speed and utility of the private grid-kNN model; writes the `model` block of docs/benchmarks/model.md.

    python bench/bench_model.py            # full: 19 datasets x 6 epsilons x 10 seeds (about 5 min)
    python bench/bench_model.py --quick    # 3 seeds (development)

Protocol of ../shared/datasets/BASELINES.md on all 19 shared datasets: fit on 80 % of the
inliers, test on the rest plus the outliers, exact kNN (k = 5) as the non-private
reference, computed here for every dataset with the same splits (`knn_baseline.split`).
Caveat: the private model needs PUBLIC bounds; here they are the reference split's
min/max, treated as public domain knowledge so that the numbers compare with the
baseline's scaling.

The datasets are split once, before any tuning, into a "choose" group (the 7 of
BASELINES.md, on which the layout rule was chosen) and a "confirm" group (the 12 others),
reported separately.
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
sys.path.insert(0, str(SHARED / "tools"))

from report import write_section  # noqa: E402 (a sibling: run as python bench/bench_model.py)
from monitor.model import GridKNN, default_layout  # noqa: E402
from monitor.model._defaults import SIZE_SHARE  # noqa: E402
from monitor.model.estimator import LEGACY_OPTIONS  # noqa: E402
from monitor.model._grid import NoisyGrid, _cells  # noqa: E402

EPSILONS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
CHOOSE = ("21_Lymphography", "29_Pima", "43_WDBC", "18_Ionosphere", "6_cardio", "32_shuttle", "23_mammography")
# Variant per dataset: BASELINES.md's advice for the 7 it covers; for the others "cap10" when
# capping changes the test set and still leaves at least 10 outliers, else "all".
VARIANT = {"21_Lymphography": "all", "43_WDBC": "all", "23_mammography": "all", "29_Pima": "cap10",
           "18_Ionosphere": "cap10", "6_cardio": "cap10", "32_shuttle": "cap10"}
KNN_FLOOR = 0.6  # the ratio goals count datasets where exact kNN reaches this AUROC
FIG = REPO / "docs" / "figures"


def all_datasets() -> list[str]:
    return sorted((p.stem for p in (SHARED / "datasets").glob("*.npz")), key=lambda n: int(n.split("_")[0]))


def variant(name: str, y: np.ndarray) -> str:
    if name in VARIANT:
        return VARIANT[name]
    n_in = int((y == 0).sum())
    m = min(int(y.sum()), (n_in - int(np.floor(0.8 * n_in))) // 9)
    return "cap10" if 10 <= m < int(y.sum()) else "all"


# -- speed --------------------------------------------------------------------------------
def speed(quick: bool) -> tuple[list[str], dict]:
    rows, key = [], {}
    rng = np.random.default_rng(0)
    for d, weighted in ((10, False), (10, True), (8, False), (30, False)):
        X = rng.normal(0.5, 0.1, (20000, d))
        t0 = time.perf_counter()
        m = GridKNN(epsilon=1.0, bounds=[(0, 1)] * d, contamination=0.05, weighted=weighted).fit(X)  # OpenDP noise
        fit_s = time.perf_counter() - t0
        joint = sum(len(g) > 1 for g in m.groups_)
        for n in (1000, 100000):
            Y = rng.normal(0.5, 0.15, (n, d))
            best = min(_timed(m.score_samples, Y) for _ in range(3 if quick else 7))
            marg = len(m.grids_) - joint
            rows.append(f"| {d} | {'wkNN' if weighted else 'kNN'} | {joint} x {m.grid_bins_[0]}^{len(m.groups_[0])}"
                        + (f" + {marg} x {m.grid_bins_[-1]}" if marg else "") + f" | {n:,} | {n / best:,.0f} | {fit_s:.2f} |")
            if d == 10 and not weighted and n == 100000:
                key["events_per_s_d10"] = n / best
    return rows, key


def _timed(f, *a) -> float:
    t = time.perf_counter()
    f(*a)
    return time.perf_counter() - t


# -- utility ------------------------------------------------------------------------------
def exact_grid_model(model: GridKNN, R: np.ndarray) -> GridKNN:
    """The same layout with EXACT counts and k = 5: what the layout alone can reach (not private)."""
    from monitor.features import scale_to_unit

    model._validate()
    model._set_layout(len(R), model.epsilon * (1 - SIZE_SHARE))  # the true size: this reference is not private
    U = scale_to_unit(R, model.bounds_)
    grids = []
    for g, b in zip(model.groups_, model.grid_bins_):
        strides = b ** np.arange(len(g) - 1, -1, -1, dtype=np.int64)
        keys, counts = np.unique((_cells(U[:, list(g)], b) * strides).sum(axis=1), return_counts=True)
        grids.append(NoisyGrid(g, b, keys, counts.astype(float)))
    model.grids_, model.k_, model.n_features_in_, model.threshold_ = grids, 5.0, U.shape[1], None
    return model


def v1_layout_model(bounds, eps: float, seed: int) -> GridKNN:
    """The first layout rule ("v1"), for comparison: disjoint pairs of features in order, 6 bins,
    k = max(4, G / eps), keep-threshold ln(10) noise scales (odd d: the last pair wraps
    around to feature 0 instead of v1's one triple)."""
    import monitor.model.estimator as est

    d = len(bounds)
    g = -(-d // 2)

    class V1(GridKNN):
        def fit(self, X, y=None):
            old, est._FALSE_CELLS_DENSE = est._FALSE_CELLS_DENSE, 0.05
            try:
                return super().fit(X, y)
            finally:
                est._FALSE_CELLS_DENSE = old

    return V1(epsilon=eps, bounds=bounds, group_size=2, n_grids=g, bins=6, k=max(4.0, g / eps), marginals=0,
              random_state=seed)


def splits(name: str, seeds) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(reference R, test T, test labels, bounds) per seed, as BASELINES.md splits them; the
    bounds are the reference split's min/max, treated as public (as the baseline's scaling)."""
    from knn_baseline import load, split

    X, y = load(str(SHARED / "datasets" / f"{name}.npz"))
    var = variant(name, y)
    out = []
    for seed in seeds:
        ref, ti, to = split(y, seed, var)
        R, T = X[ref], X[np.concatenate([ti, to])]
        lo, hi = R.min(axis=0), R.max(axis=0)
        out.append((R, T, np.r_[np.zeros(len(ti)), np.ones(len(to))], np.c_[lo, np.where(hi > lo, hi, lo + 1.0)]))
    return out


def exact_knn_scores(R: np.ndarray, T: np.ndarray, bounds: np.ndarray, k: int = 5) -> np.ndarray:
    """Exact kNN score (distance to the k-th nearest reference point) of T, both scaled by
    the bounds as BASELINES.md scales them: the non-private reference."""
    from scipy.spatial import cKDTree

    lo, span = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    return cKDTree((R - lo) / span).query(np.clip((T - lo) / span, 0, 1), k=k)[0][:, k - 1]


def one_dataset(args) -> list[tuple]:
    """(dataset, method, epsilon, seed, AUROC, AP) rows for one dataset."""
    name, epsilons, seeds = args
    from sklearn.metrics import average_precision_score, roc_auc_score

    out = []
    for seed, (R, T, yt, bounds) in zip(seeds, splits(name, seeds)):

        def row(method, eps, s):
            return (name, method, eps, seed, roc_auc_score(yt, s), average_precision_score(yt, s))

        out.append(row("kNN k=5 (exact)", None, exact_knn_scores(R, T, bounds)))
        out.append(row("grid, exact counts", None, exact_grid_model(GridKNN(epsilon=1.0, bounds=bounds), R).score_samples(T)))
        for eps in epsilons:
            m = GridKNN(epsilon=eps, bounds=bounds, random_state=1000 * seed + int(eps * 1000)).fit(R)
            out.append(row("DP grid kNN", eps, m.score_samples(T)))
        m = GridKNN(epsilon=1.0, bounds=bounds, weighted=True, random_state=1000 * seed + 7).fit(R)
        out.append(row("DP grid wkNN", 1.0, m.score_samples(T)))
        out.append(row("v1 layout", 1.0, v1_layout_model(bounds, 1.0, 1000 * seed + 1000).fit(R).score_samples(T)))
        m = GridKNN(epsilon=1.0, bounds=bounds, random_state=1000 * seed + 1000, **LEGACY_OPTIONS).fit(R)
        out.append(row("v4 rule", 1.0, m.score_samples(T)))
    return out


def utility(datasets, epsilons, seeds, jobs: int) -> list[tuple]:
    work = [(n, epsilons, list(seeds)) for n in datasets]
    if jobs > 1:
        from multiprocessing import Pool

        with Pool(jobs) as pool:
            parts = pool.map(one_dataset, work)
    else:
        parts = [one_dataset(w) for w in work]
    return [r for p in parts for r in p]


def _vals(res, name, method, eps, i=4) -> np.ndarray:
    return np.array([r[i] for r in sorted(res, key=lambda r: r[3]) if r[0] == name and r[1] == method and r[2] == eps])


def monotonicity(res, name, epsilons) -> tuple[float, float, bool]:
    """Largest fall of mean AUROC from any epsilon to a larger one, its noise, and whether it exceeds it.

    Noise = 2 standard errors of the paired per-seed difference (same splits) + 0.005.
    When some fall exceeds its noise, that fall (the largest excess) is reported.
    """
    pairs = []
    for i, a in enumerate(epsilons):
        for b in epsilons[i + 1:]:
            va, vb = _vals(res, name, "DP grid kNN", a), _vals(res, name, "DP grid kNN", b)
            se = (va - vb).std(ddof=1) / np.sqrt(va.size) if va.size > 1 else 0.0
            pairs.append((va.mean() - vb.mean(), 2 * se + 0.005))
    bad = [p for p in pairs if p[0] > p[1]]
    if bad:
        drop, noise = max(bad, key=lambda p: p[0] - p[1])
        return drop, noise, True
    drop, noise = max(pairs, key=lambda p: p[0])
    return drop, noise, False


def group_table(res, names, epsilons) -> tuple[str, dict]:
    lines = ["| dataset | d | variant | exact kNN | grid, exact counts | " + " | ".join(f"eps {e:g}" for e in epsilons)
             + " | ratio at eps 1 | wkNN eps 1 | v1 layout eps 1 | v4 rule eps 1 | largest fall (noise) |",
             "|---|---|---|---|---|" + "---|" * len(epsilons) + "---|---|---|---|---|"]
    ratios, falls, chance, v1, v4 = {}, [], [], {}, {}
    for n in names:
        knn = _vals(res, n, "kNN k=5 (exact)", None).mean()
        ex = _vals(res, n, "grid, exact counts", None).mean()
        means = [_vals(res, n, "DP grid kNN", e) for e in epsilons]
        r1 = means[epsilons.index(1.0)].mean() / knn
        v1_auc = _vals(res, n, "v1 layout", 1.0).mean()
        v4_auc = _vals(res, n, "v4 rule", 1.0).mean()
        if knn >= KNN_FLOOR:
            ratios[n] = r1
            v1[n] = v1_auc / knn
            v4[n] = v4_auc / knn
        drop, noise, bad = monotonicity(res, n, epsilons)
        falls.append(bad)
        low = means[0]
        at_chance = knn >= KNN_FLOOR and low.mean() - 2 * low.std(ddof=1) / np.sqrt(low.size) <= 0.5
        chance.append(at_chance)
        d = _dims(n)
        lines.append(f"| {n} | {d} | {_var(n)} | {knn:.3f} | {ex:.3f} | "
                     + " | ".join(f"{v.mean():.3f}" + (" (chance)" if i == 0 and at_chance else "") for i, v in enumerate(means))
                     + f" | {r1:.3f}{'' if knn >= KNN_FLOOR else ' (kNN < 0.6: not counted)'} | "
                     f"{_vals(res, n, 'DP grid wkNN', 1.0).mean():.3f} | {v1_auc:.3f} | {v4_auc:.3f} | {max(drop, 0):.3f} ({noise:.3f}){' **FALLS**' if bad else ''} |")
    r = np.array(list(ratios.values()))
    summary = {"mean": r.mean(), "worst": r.min(), "worst_name": min(ratios, key=ratios.get), "n": r.size,
               "falls": sum(falls), "chance": sum(chance), "v1_mean": np.mean(list(v1.values())),
               "v1_worst": min(v1.values()), "v4_mean": np.mean(list(v4.values())), "v4_worst": min(v4.values()),
               "v4_worst_name": min(v4, key=v4.get)}
    return "\n".join(lines), summary


_DIMS: dict[str, tuple[int, str]] = {}


def _dims(n):
    return _DIMS[n][0]


def _var(n):
    return _DIMS[n][1]


def layouts_table(dims, epsilons, sizes=(100, 1000, 10000)) -> str:
    lines = ["| d | n | " + " | ".join(f"eps {e:g}" for e in epsilons) + " |", "|---|---|" + "---|" * len(epsilons)]
    for d in sorted(set(dims)):
        for n in sizes:
            cells = []
            for e in epsilons:
                lay = default_layout(d, e * (1 - SIZE_SHARE), n)
                joint = [(g, b) for g, b in zip(lay.groups, lay.bins) if len(g) > 1 or d == 1]
                marg = len(lay.groups) - len(joint)
                cells.append(f"{len(joint)} x {joint[0][1]}^{len(joint[0][0])}"
                             + (f" + {marg} x {lay.bins[-1]}" if marg else "") + f", k {lay.k:.0f}")
            lines.append(f"| {d} | {n:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(res, names, epsilons) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    FIG.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(4, 5, figsize=(20, 14), sharex=True)
    for ax, n in zip(axes.flat, names):
        v = [_vals(res, n, "DP grid kNN", e) for e in epsilons]
        ax.errorbar(epsilons, [x.mean() for x in v], yerr=[x.std(ddof=1) if x.size > 1 else 0 for x in v],
                    fmt="o-", capsize=3, label="DP grid kNN")
        ax.axhline(_vals(res, n, "kNN k=5 (exact)", None).mean(), color="red", label="exact kNN k=5")
        ax.axhline(_vals(res, n, "grid, exact counts", None).mean(), color="green", ls=":", label="grid, exact counts")
        ax.set_xscale("log")
        ax.set_title(f"{n} ({'choose' if n in CHOOSE else 'confirm'})")
        ax.set_xlabel("epsilon")
        ax.set_ylabel("AUROC")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(loc="lower right", fontsize=8)
    fig.suptitle("AUROC vs epsilon: private grid kNN (default layout) vs exact kNN; mean ± std over seeds")
    fig.tight_layout()
    f = FIG / "model_auroc_vs_epsilon.png"
    fig.savefig(f, dpi=70)
    plt.close(fig)
    return str(f.relative_to(REPO))


def main(argv=None) -> int:
    from knn_baseline import load

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 seeds, short timings")
    ap.add_argument("--jobs", type=int, default=1, help="processes for the utility part (1 = one core)")
    ap.add_argument("--no-write", action="store_true", help="print instead of writing docs/benchmarks/model.md")
    ap.add_argument("--layout-seed", type=int, default=None,
                    help="public seed of the bagged feature draws (default: the shipped LAYOUT_SEED)")
    a = ap.parse_args(argv)
    if a.layout_seed is not None:
        import monitor.model._defaults as layout_rule

        layout_rule.LAYOUT_SEED = a.layout_seed
    names = all_datasets()
    confirm = [n for n in names if n not in CHOOSE]
    for n in names:
        X, y = load(str(SHARED / "datasets" / f"{n}.npz"))
        _DIMS[n] = (X.shape[1], variant(n, y))
    seeds = range(3) if a.quick else range(10)
    load_avg = os.getloadavg()[0]
    speed_rows, key = speed(a.quick)
    t0 = time.perf_counter()
    res = utility(names, EPSILONS, seeds, a.jobs)
    util_s = time.perf_counter() - t0
    t_choose, s_choose = group_table(res, list(CHOOSE), EPSILONS)
    t_confirm, s_confirm = group_table(res, confirm, EPSILONS)
    fig = plot(res, list(CHOOSE) + confirm, EPSILONS)
    cmd = "python bench/bench_model.py" + (" --quick" if a.quick else "") + (f" --jobs {a.jobs}" if a.jobs > 1 else "")

    def goal_line(label, s):
        ok = s["mean"] >= 0.97 and s["worst"] >= 0.90
        return (f"- {label}: mean ratio {s['mean']:.3f}, worst {s['worst']:.3f} ({s['worst_name']}) over {s['n']} "
                f"datasets with kNN >= {KNN_FLOOR}: **{'met' if ok else 'MISSED'}** (goal mean >= 0.97, worst >= 0.90); "
                f"AUROC falls by more than noise as epsilon grows on {s['falls']} dataset(s); "
                f"at chance at eps 0.1 on {s['chance']}. The v1 layout (the first rule): mean "
                f"{s['v1_mean']:.3f}, worst {s['v1_worst']:.3f}. The v4 rule (before the tail rule, 2026-12): mean "
                f"{s['v4_mean']:.3f}, worst {s['v4_worst']:.3f} ({s['v4_worst_name']}).")

    md = f"""## Private grid-kNN model

Reproduce: `{cmd}` ({len(seeds)} seeds{', QUICK run' if a.quick else ''}; utility part took {util_s:.0f} s).
Load average at start: {load_avg:.1f} on 2 cores shared with other work, so timings are pessimistic.

### Speed (`score_samples`, one core, OMP_NUM_THREADS=1, best of several runs)

| d | score | layout (joint grids + 1-feature grids) | batch | events/s | fit s (20k rows, OpenDP noise; first row includes importing OpenDP) |
|---|---|---|---|---|---|
{chr(10).join(speed_rows)}

Goal: at least 300,000 events/s at d = 10: {key['events_per_s_d10']:,.0f} events/s
(**{'met' if key['events_per_s_d10'] >= 3e5 else 'MISSED'}**). Each grid's score is read from a table of
sub-cells computed once per model (post-processing), so an event costs one lookup per grid.

### Utility at every epsilon, two groups (protocol of `../shared/datasets/BASELINES.md`)

The 19 shared datasets were split BEFORE tuning: "choose" = the 7 of BASELINES.md (the first
layout rule was chosen on these), "confirm" = the 12 others. Caveat, stated honestly: the
confirm group is no longer a clean check. It was run twice while the previous rule was made
(its thyroid failures added the one-feature grids), and the current rule (second
round: a noisy record count sizes the layout; a one-feature grid per feature; 3^3 joint grids;
k >= sqrt(n)) was made looking at BOTH groups many times, after studying why annthyroid, letter,
wine and Hepatitis failed. The rule's constants have reasons (noise-vs-count arithmetic,
docs/model.md), but they were checked on these same sets. The 16 held-out sets will judge again.
Third round: the joint grids beyond the first cover of consecutive-feature windows are drawn by
feature bagging instead of shifted windows (letter 0.691 -> 0.739 of kNN, and it no longer falls
with epsilon). The public layout seed is a lottery on the smallest sets: with layout seeds 1, 2
and 3 instead of 0 (`--layout-seed N --no-write`), Ionosphere (180 records, all grids bagged)
scores 0.869, 0.855 and 0.846 of kNN, so the choose group's worst case passes on seed 0's draw;
the group means move by up to 0.010 (choose) and 0.023 (confirm).
Fourth round: the fit holds 25 % of the reference rows apart from the grids to
calibrate rates (docs/model.md, "Calibrated flags"; section "Calibrated flag rates"), so the
grids see 75 % of the rows. At eps 1 this moved the choose group from mean 0.979 / worst 0.915
to 0.971 / 0.891 (Ionosphere: 135 rows left to the grids; its layout-seed lottery above spans
0.846 to 0.915) and the confirm group from 0.951 / 0.739 to 0.940 / 0.726 (letter).
`model.calibration_share: 0` gives the grids every row again, with uncalibrated rates.
Fifth round (2026-12): the "tail" rule, chosen by the true-positive rate at the alarm's flag
rates (section "The tail" below, `bench/bench_model_tail.py`): half of k's sqrt(n) term; from
12 features about 3 joint grids a feature where n affords them beside every one-feature grid;
for 2 to 4 features one fine joint grid where the noisy size gives it 6 or more bins per axis
(none of these 19 sets has so few features). "v4 rule eps 1" is the rule before it, same splits
and noise seeds: wine loses 0.032 (2 standard errors of the paired difference: 0.027), glass
0.012, cardio 0.008; Ionosphere gains 0.009.
Previous rule (layout from d and epsilon only), same protocol: choose mean 0.973 / worst 0.924,
confirm mean 0.875 / worst 0.686 (2_annthyroid); 5 datasets falling, 1 at chance at eps 0.1.

Bounds: the reference split's min/max, treated as public (as the baseline's scaling); in
deployment they come from config.yaml, never from the data. Variant per dataset: BASELINES.md's
advice for its 7, else `cap10` when that leaves at least 10 outliers, else `all`. Exact kNN
(k = 5) computed here on the same splits. "grid, exact counts": the eps = 1 layout with exact
counts and k = 5 (not private; what the layout alone reaches; sized with the true record count). Ratio = DP AUROC at eps 1 / exact
kNN AUROC. "v1 layout": the first layout rule (disjoint pairs, 6 bins, k = max(4, G/eps),
keep-threshold ln(10) noise scales), same splits. Largest fall: the largest drop of mean AUROC from one epsilon to any larger one, with
its noise (2 standard errors of the paired per-seed difference + 0.005); **FALLS** when above it.
"(chance)": mean AUROC at eps 0.1 within 2 standard errors of 0.5. On 39_vertebral exact kNN scores
below chance (0.45): a less noisy model ranks more like kNN, so its AUROC falls as epsilon grows.
Where the rule misses, `python bench/bench_layout_ceiling.py` measures how far any layout gets
(section "Grid-kNN: how far any layout gets where the rule misses").

Goals at eps = 1:

{goal_line('choose', s_choose)}
{goal_line('confirm', s_confirm)}

**Choose** (AUROC, mean over {len(seeds)} seeds):

{t_choose}

**Confirm** (AUROC, mean over {len(seeds)} seeds):

{t_confirm}

Default layout by d, record count n (in the fit: the noisy count) and epsilon (joint grids x
bins^features + one-feature grids x bins, and k):

{layouts_table(sorted({_dims(n) for n in names} | {3, 64, 166}), EPSILONS)}

Figure: `{fig}` (AUROC vs epsilon per dataset, mean ± std over seeds, with exact kNN and the
exact-count grid).
"""
    if a.no_write:
        print(md)
    else:
        write_section("model", md)
        print(md[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
