"""Calibrated flag rates; writes the `calibration` block of docs/benchmarks/calibration.md.

    python bench/bench_calibration.py                 # 19 datasets x 3 seeds, epsilon 1 (a few minutes)
    python bench/bench_calibration.py --sweep         # also the split share / bins sweep (choice of defaults)
    python bench/bench_calibration.py --no-write      # print instead of writing docs/benchmarks/calibration.md

Protocol of ../shared/datasets/BASELINES.md (bench_model.splits): 80 % of the inliers are the
reference, the other inliers are unseen normal events. The model is fitted at epsilon 1 with
the shipped calibration (a share of the reference held apart from the grids, a private
score histogram on it); for c in {0.01, 0.05} the threshold is ``threshold_for(c)`` and the
real flag rate is measured on the unseen inliers. The goal: that rate within [c/2, 2c] on
every (set, seed, c) where the model's own rule (``rate_accuracy(c).enough``, what
`monitor fit` warns on) says the held-apart part is large enough. The uncalibrated rate
(calibration_share 0: the quantile of the model's own noisy mass, the behaviour before) and
AUROC with and without the held-apart rows are measured on the same splits.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import all_datasets, splits  # noqa: E402 (a sibling: run as python bench/bench_calibration.py)
from report import write_section  # noqa: E402

import monitor.model.calibration as calibration  # noqa: E402
import monitor.model.estimator as estimator  # noqa: E402
from monitor.model import GridKNN  # noqa: E402

RATES = (0.01, 0.05)
# Rare rates (the alarm's sparser levels): the realised rate with the fitted exponential tail
# (``ScoreHistogram.tail_``) against the counted histogram alone, on the same fits.
RARE_RATES = (0.002, 0.005, 0.01)
SEEDS = (0, 1, 2)
EPSILON = 1.0


def one_dataset(name: str, seeds, share: float | None = None, tails: int | None = None, baseline: bool = True,
                score_share: float | None = None) -> list[dict]:
    """One row per (seed, rate): real flag rate of unseen inliers, the rule's verdict, AUROC."""
    from sklearn.metrics import roc_auc_score

    old = estimator.CALIBRATION_SHARE, calibration.TAIL_PROBS, estimator.SCORE_HISTOGRAM_SHARE
    if score_share is not None:
        estimator.SCORE_HISTOGRAM_SHARE = score_share
    if share is not None:
        estimator.CALIBRATION_SHARE = share
    if tails is not None:
        calibration.TAIL_PROBS = tuple(np.geomspace(0.5, 0.0005, tails).tolist())
    try:
        out = []
        for seed, (R, T, yt, bounds) in zip(seeds, splits(name, seeds)):
            m = GridKNN(epsilon=EPSILON, bounds=bounds, calibration_share=estimator.CALIBRATION_SHARE,
                        random_state=1000 * seed + 1).fit(R)
            s = m.score_samples(T)
            normal = s[yt == 0]
            auc = roc_auc_score(yt, s) if 0 < yt.sum() < len(yt) else float("nan")
            if baseline:
                b = GridKNN(epsilon=EPSILON, bounds=bounds, calibration_share=0.0, random_state=1000 * seed + 1).fit(R)
                sb = b.score_samples(T)
                auc0 = roc_auc_score(yt, sb) if 0 < yt.sum() < len(yt) else float("nan")
            for c in RATES:
                acc = m.rate_accuracy(c)
                row = {"name": name, "seed": seed, "rate": c, "n_ref": len(R), "n_unseen": int((yt == 0).sum()),
                       "held": acc.rows, "real": float((normal > acc.threshold).mean()), "enough": acc.enough,
                       "alpha": acc.rank_accuracy, "auc": auc}
                if baseline:
                    row["real_uncal"] = float((sb[yt == 0] > b.threshold_for(c)).mean())
                    row["auc_uncal"] = auc0
                out.append(row)
            counted = _counted(m.calibration_.score)
            for c in RARE_RATES:
                out.append({"name": name, "seed": seed, "rare": c, "n_unseen": int((yt == 0).sum()),
                            "real": float((normal > m.threshold_for(c)).mean()),
                            "real_counted": float((normal > counted.threshold_for(c)).mean())})
        return out
    finally:
        estimator.CALIBRATION_SHARE, calibration.TAIL_PROBS, estimator.SCORE_HISTOGRAM_SHARE = old


def _counted(h: "calibration.ScoreHistogram") -> "calibration.ScoreHistogram":
    """The same release read by counting alone (no fitted tail): the behaviour before."""
    bare = calibration.ScoreHistogram(h.edges, h.counts, h.epsilon, h.prior)
    object.__setattr__(bare, "tail_", None)
    return bare


def rare_table(rows: list[dict]) -> str:
    """Realised / nominal rate at the rare rates, over the sets whose unseen inliers hold at least
    5 expected events at that rate (below that the realised rate is mostly sampling noise)."""
    lines = ["| c | (set, seed) cases | median real / c, tail fitted | counted | inside [c/2, 2c], tail fitted | counted "
             "| flag no unseen normal event, tail fitted | counted |", "|---|---|---|---|---|---|---|---|"]
    for c in RARE_RATES:
        rs = [r for r in rows if r.get("rare") == c and c * r["n_unseen"] >= 5]
        if not rs:
            continue
        cols = []
        for key in ("real", "real_counted"):
            v = np.array([r[key] for r in rs]) / c
            cols.append((f"{np.median(v):.2f}", f"{int(((v >= 0.5) & (v <= 2)).sum())}", f"{int((v == 0).sum())}"))
        lines.append(f"| {100 * c:g} % | {len(rs)} | {cols[0][0]} | {cols[1][0]} | {cols[0][1]} | {cols[1][1]} | "
                     f"{cols[0][2]} | {cols[1][2]} |")
    return "\n".join(lines)


def inside(r: dict) -> bool:
    return r["rate"] / 2 <= r["real"] <= 2 * r["rate"]


def summary(rows: list[dict]) -> dict:
    enough = [r for r in rows if r["enough"]]
    return {"cases": len(rows), "enough": len(enough), "enough_inside": sum(inside(r) for r in enough),
            "all_inside": sum(inside(r) for r in rows),
            "uncal_inside": sum(r["rate"] / 2 <= r.get("real_uncal", -1) <= 2 * r["rate"] for r in rows)}


SWEEP = [(share, tails, 0.75) for share in (0.15, 0.25, 0.35) for tails in (8, 12, 16)] + [
    (0.25, 4, 0.75), (0.25, 6, 0.75), (0.25, 8, 0.9)]


def sweep(names, combos=SWEEP) -> str:
    lines = ["| calibration share | synthetic-quantile edges | score histogram's share of epsilon | cases the rule calls "
             "large enough | of those inside [c/2, 2c] | all cases inside | mean AUROC |",
             "|---|---|---|---|---|---|---|"]
    for share, tails, score_share in combos:
        rows = [r for n in names for r in one_dataset(n, SEEDS, share, tails, baseline=False, score_share=score_share)
                if "rare" not in r]
        s = summary(rows)
        auc = np.nanmean([r["auc"] for r in rows if r["rate"] == RATES[0]])
        lines.append(f"| {share:g} | {tails} | {score_share:g} | {s['enough']} of {s['cases']} | {s['enough_inside']} | "
                     f"{s['all_inside']} | {auc:.3f} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def table(rows: list[dict], names) -> str:
    lines = ["| dataset | reference rows | held apart (noisy) | unseen inliers | c | real rate, calibrated (3 seeds) | "
             "rule says | uncalibrated (before) | AUROC held apart / all rows to grids |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        for c in RATES:
            rs = [r for r in rows if r["name"] == n and r["rate"] == c]
            real = ", ".join(f"{100 * r['real']:.2f}" + ("" if inside(r) else "*") for r in rs)
            unc = ", ".join(f"{100 * r['real_uncal']:.2f}" for r in rs)
            verdict = sum(r["enough"] for r in rs)
            say = "enough" if verdict == len(rs) else ("warns" if verdict == 0 else f"enough {verdict} of {len(rs)}")
            auc = f"{np.mean([r['auc'] for r in rs]):.3f} / {np.mean([r['auc_uncal'] for r in rs]):.3f}" if c == RATES[0] else ""
            lines.append(f"| {n} | {rs[0]['n_ref']} | {np.mean([r['held'] for r in rs]):.0f} | {rs[0]['n_unseen']} | "
                         f"{100 * c:g} % | {real} | {say} | {unc} | {auc} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-write", action="store_true", help="print instead of writing docs/benchmarks/calibration.md")
    ap.add_argument("--sweep", action="store_true", help="also sweep the split share and the number of bins")
    ap.add_argument("--datasets", nargs="*", default=None, help="subset of the shared datasets (development)")
    a = ap.parse_args(argv)
    names = a.datasets or all_datasets()
    t0 = time.perf_counter()
    sweep_md = sweep(names) if a.sweep else None
    every = [r for n in names for r in one_dataset(n, SEEDS)]
    rows = [r for r in every if "rare" not in r]
    took = time.perf_counter() - t0
    s = summary(rows)
    goal = s["enough_inside"] == s["enough"]
    enough_aucs = np.array([(r["auc"], r["auc_uncal"]) for r in rows if r["rate"] == RATES[0]])
    cmd = "python bench/bench_calibration.py" + (" --sweep" if a.sweep else "")
    md = f"""## Calibrated flag rates

Reproduce: `{cmd}` ({len(SEEDS)} seeds, epsilon {EPSILON:g}; took {took:.0f} s on 2 shared cores).

Protocol of `../shared/datasets/BASELINES.md`: 80 % of the inliers are the reference, the rest
are unseen normal events; bounds as in `bench_model.py`. The fit holds
{100 * estimator.CALIBRATION_SHARE:g} % of the reference rows apart from the grids (hash of each
row with a public seed; parallel composition) and releases a noisy histogram of their scores
(public bins: {calibration.COARSE_BINS} uniform in sqrt(score) and {len(calibration.TAIL_PROBS)} quantiles of a synthetic sample of the released grids, {100 * estimator.SCORE_HISTOGRAM_SHARE:g} % of
the part's epsilon for the model's score, the rest over one histogram per grid).
`threshold_for(c)` is that histogram's (1 - c) quantile, with the synthetic sample's shares as a
public prior worth as many rows as the noise bound of the histogram's total (it matters only
on tiny parts). "Rule says enough": the model's own verdict (`GridKNN.rate_accuracy(c).enough`:
sqrt(rank accuracy^2 + 4 c m) <= c m / 2, m the noisy held-apart rows), on which `monitor fit`
warns. * marks a real rate outside [c/2, 2c]. "uncalibrated (before)": the same data and noise
seed fitted with `calibration_share=0`, its threshold a quantile of the model's own noisy mass.

**Goal** (on every set, 3 seeds, c in {{0.01, 0.05}}: inside [c/2, 2c] wherever the rule says
enough, a warning elsewhere): **{'met' if goal else 'MISSED'}**: {s['enough_inside']} of the {s['enough']}
cases the rule calls large enough are inside; the other {s['cases'] - s['enough']} of {s['cases']} cases
warn (`monitor fit` prints the warning and the rows the rate would need). All cases inside, warned or not: {s['all_inside']} of {s['cases']} calibrated, against
{s['uncal_inside']} of {s['cases']} with the uncalibrated threshold (the model's own noisy mass, before).

AUROC cost of holding rows apart (same splits and noise seeds; mean over sets and seeds):
{np.nanmean(enough_aucs[:, 0]):.3f} with {100 * estimator.CALIBRATION_SHARE:g} % held apart, {np.nanmean(enough_aucs[:, 1]):.3f}
with every row in the grids; the largest per-set fall {np.nanmax(_falls(rows, names)):.3f}.

{table(rows, names)}

Rare rates (the alarm's sparser levels: 0.2 % at 10,000 people). Above the highest score where
the held-apart part's tail count is at least {calibration.TAIL_TRUST:g} times its noise bound, the
shares follow a fitted exponential tail (`ScoreHistogram.tail_`); "counted" reads the same
release by counting alone, as before. Cases with at least 5 expected unseen normal events at c:

{rare_table(every)}
"""
    if sweep_md:
        md += f"""
Choice of the split share and the bins (all sets, 3 seeds, epsilon 1, c in {{0.01, 0.05}}; the
shipped choice is 0.25, 8 edges, 0.75: as many cases called large enough as 0.35, all inside,
with less AUROC given up; more synthetic-quantile edges put more noisy bins above a threshold):

{sweep_md}
"""
    if a.no_write:
        print(md)
    else:
        write_section("calibration", md)
        print(md)
    return 0


def _falls(rows, names) -> list[float]:
    out = []
    for n in names:
        rs = [r for r in rows if r["name"] == n and r["rate"] == RATES[0]]
        out.append(np.mean([r["auc_uncal"] for r in rs]) - np.mean([r["auc"] for r in rs]))
    return out


if __name__ == "__main__":
    sys.exit(main())
