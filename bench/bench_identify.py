"""Private anomaly identification: how often the answer is right, DP vs sensitive privacy.

    python bench/bench_identify.py            # writes the `identify` section of docs/benchmarks/identify.md
    python bench/bench_identify.py --no-write # print only

Every record of a dataset is queried once against the whole dataset (the seed's
setting: the record is present, Definition 2.2), for each epsilon and graph. "Correct"
means equal to the exact (beta, r)-anomaly answer; rows split the queries by the
dataset's ground-truth label. Each cell gives the fraction of correct answers from one
seeded draw per query, and in brackets its expectation (the mean over queries of the
mechanism's probability of being correct, computed from the non-private m).

Parameters are chosen per dataset, NOT privately: the features are scaled with the
dataset's own min/max (a stand-in for public domain bounds), and (beta, r) maximise
the F1 agreement of the (beta, r)-anomalies with the ground truth over beta in
{5, 10, 20} and 30 radii from 0.01 to 1.5. In a deployment both are public choices.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from report import write_section  # a sibling: run as python bench/bench_identify.py
from monitor.features import scale_to_unit
from monitor.identify import AnomalyIdentifier

DATASETS = ["4_breastw", "42_WBC", "38_thyroid"]
DATA_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets"
EPSILONS = [0.1, 0.5, 1.0, 2.0]
BETAS = [5, 10, 20]
RADII = np.geomspace(0.01, 1.5, 30)


def load(name: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(DATA_DIR / f"{name}.npz", allow_pickle=False) as z:
        X, y = z["X"].astype(float), z["y"].astype(bool)
    bounds = np.c_[X.min(axis=0), X.max(axis=0)]
    bounds[bounds[:, 1] <= bounds[:, 0], 1] += 1.0  # constant columns
    return scale_to_unit(X, bounds), y


def choose(X: np.ndarray, y: np.ndarray) -> tuple[int, float, float]:
    best = (-1.0, 0, 0.0)
    for beta in BETAS:
        for r in RADII:
            a = AnomalyIdentifier(beta, float(r)).fit(X).exact_answers(X)
            f1 = 2 * np.sum(a & y) / (a.sum() + y.sum())
            best = max(best, (f1, beta, float(r)))
    return best[1], best[2], best[0]


def _cell(sampled: float, expected: float) -> str:
    return f"{sampled:.3f} ({expected:.3f})"


def run() -> tuple[str, dict]:
    rows, figures = [], {}
    setup = []
    for name in DATASETS:
        X, y = load(name)
        beta, r, f1 = choose(X, y)
        ident = AnomalyIdentifier(beta, r).fit(X)
        truth = ident.exact_answers(X)
        graphs = [("DP", None), ("SP k=1", 1), (f"SP k={beta // 2}", beta // 2)]
        setup.append(
            f"| `{name}` | {X.shape[0]} x {X.shape[1]} | {int(y.sum())} | {beta} | {r:.3f} | {f1:.2f} | "
            f"{np.mean(truth[y]):.2f} | {np.mean(truth[~y]):.3f} |"
        )
        for eps in EPSILONS:
            cells = []
            for label, k in graphs:
                expected = ident.probabilities_correct(X, eps, k)
                answers = np.array([a.answer for a in ident.answer_many(X, eps, k, rng=0)])
                right = answers == truth
                for group in (~y, y):
                    cells.append(_cell(right[group].mean(), expected[group].mean()))
                figures[(name, eps, label)] = (right[~y].mean(), right[y].mean(), expected[~y].mean(), expected[y].mean())
            rows.append(f"| `{name}` | {eps:g} | " + " | ".join(cells) + " |")
    # Latency of one answer on the largest dataset (KD-tree built once).
    X, _ = load(DATASETS[-1])
    ident = AnomalyIdentifier(10, 0.1).fit(X)
    t = time.perf_counter()
    for x in X[:500]:
        ident.answer(x, 1.0, 1, rng=0)
    latency_ms = (time.perf_counter() - t) / 500 * 1e3

    header = (
        "| dataset | eps | DP inliers | DP outliers | SP k=1 inliers | SP k=1 outliers | SP k=beta/2 inliers | SP k=beta/2 outliers |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    goal = [figures[(n, 1.0, "SP k=1")][1] for n in DATASETS]
    goal_expected = [figures[(n, 1.0, "SP k=1")][3] for n in DATASETS]
    md = f"""## Private anomaly identification (`monitor identify`)

`python bench/bench_identify.py` (seeded; about 20 s). Each record of the dataset is
asked "is it a (beta, r)-anomaly of the dataset?" once; a cell is the fraction of
answers equal to the exact (beta, r) answer, over the ground-truth inliers or outliers,
from one seeded draw per record, with the expectation over the mechanism's randomness in
brackets. DP: epsilon-DP on the ordinary neighbour graph. SP: (epsilon, k)-sensitive
privacy (Asif et al., Definition 3.2) with the safe lower bound on the distance to flip.

Parameters per dataset (chosen NON-privately, for the benchmark only): features scaled
with the dataset's own min/max; (beta, r) maximise the F1 agreement of the
(beta, r)-anomalies with the labels over beta in {{5, 10, 20}} and 30 radii in [0.01, 1.5].

| dataset | size | outliers | beta | r | F1 vs labels | outliers that are (beta, r)-anomalies | inliers that are |
|---|---|---|---|---|---|---|---|
{chr(10).join(setup)}

{header}
{chr(10).join(rows)}

Goal: sensitive privacy answers at least 95% of the queries about true outliers
correctly at eps = 1. Measured with k = 1 (sampled, expected):
{", ".join(f"`{n}` {g:.3f} ({e:.3f})" for n, g, e in zip(DATASETS, goal, goal_expected))}:
{"met" if min(goal_expected) >= 0.95 else "NOT met"} in expectation on all three datasets.

Why DP is stuck near e^eps / (1 + e^eps) on anomalies: under the seed's definition the
record must be present, and removing it (one change) flips the answer, so the optimal
DP answer is randomized response for every anomaly present once. Sensitive privacy does
not protect that removal (an anomaly is not k-sensitive) and answers correctly with
probability 1 - exp(-eps (m - 1)) / (1 + exp(eps)) with, for k = 1, m >= beta + 1 - c
(c records within r, itself included). For records that are not (beta, r)-anomalies both graphs
use the same m = c - beta, so SP gains on inliers only where they are (beta, r)-anomalies.

One answer (KD-tree query, bound, draw) takes {latency_ms:.2f} ms on `{DATASETS[-1]}`
({X.shape[0]} records, k = 1), excluding the ledger charge.
"""
    return md, figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print the section without writing docs/benchmarks/identify.md")
    args = parser.parse_args()
    md, _ = run()
    print(md)
    if not args.no_write:
        write_section("identify", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
