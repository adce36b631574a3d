"""Beyond axis-aligned grids (issue 27, part 2): do grids over other coordinates reach the
worst confirm-group set? Writes the `model-projections` block of docs/benchmarks/model.md.

    python bench/bench_projection_ceiling.py          # about a minute on one core

letter (32 integer features, 1,200 reference records) is the confirm group's worst set and
the one no axis-aligned layout gets to 0.90 of exact kNN (``bench_layout_ceiling.py``).
On the same splits as ``bench_model.py`` it compares, at epsilon 1:

- the shipped model (grids over the scaled features);
- grids over the top k principal components of the reference set, computed EXACTLY (not
  privately): an optimistic ceiling for any private low-dimensional basis (a private PCA
  pays epsilon and only loses accuracy), with exact kNN in the same k coordinates beside it;
- grids over k coordinates of a public random rotation (a seed: free in privacy), clipped to
  public bounds +-1 around the box's centre.

If exact kNN itself falls well short in the top components, no grid over them can close
the gap: the outliers live in structure that a few directions do not hold.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from scipy.spatial import cKDTree  # noqa: E402

from bench_model import exact_knn_scores, splits  # noqa: E402 (a sibling: run as python bench/bench_projection_ceiling.py)
from report import write_section  # noqa: E402
from monitor.model import GridKNN  # noqa: E402

COMPONENTS = (2, 4, 8, 16)


def _auc(y, s) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, s))


def one_split(R, T, y, bounds, seed: int) -> dict:
    lo, span = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    Rs, Ts = (R - lo) / span, np.clip((T - lo) / span, 0, 1)
    out = {"knn": _auc(y, exact_knn_scores(R, T, bounds)),
           "grids": _auc(y, GridKNN(epsilon=1.0, bounds=bounds, random_state=seed).fit(R).score_samples(T))}
    mu = Rs.mean(axis=0)
    _, V = np.linalg.eigh(np.cov((Rs - mu).T))
    V = V[:, ::-1]
    d = R.shape[1]
    Q, _ = np.linalg.qr(np.random.default_rng(1000 + seed).normal(size=(d, d)))  # public: a seed, not the data
    for k in COMPONENTS:
        if k > d:
            continue
        r, t = (Rs - mu) @ V[:, :k], (Ts - mu) @ V[:, :k]
        out[f"knn pca{k}"] = _auc(y, cKDTree(r).query(t, k=5)[0][:, 4])
        b = np.column_stack([r.min(axis=0), r.max(axis=0)])  # the data's own range: optimistic again
        out[f"grids pca{k}"] = _auc(y, GridKNN(epsilon=1.0, bounds=b, random_state=seed).fit(r).score_samples(t))
        pb = np.array([[-1.0, 1.0]] * k)
        r, t = np.clip((Rs - 0.5) @ Q[:, :k], -1, 1), np.clip((Ts - 0.5) @ Q[:, :k], -1, 1)
        out[f"grids rotation{k}"] = _auc(y, GridKNN(epsilon=1.0, bounds=pb, random_state=seed).fit(r).score_samples(t))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="20_letter")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    rows = [one_split(R, T, y, b, s) for s, (R, T, y, b) in zip(range(args.seeds), splits(args.dataset, range(args.seeds)))]
    keys = list(rows[0])
    knn = np.mean([r["knn"] for r in rows])
    lines = [
        f"## Beyond axis-aligned grids: {args.dataset} (issue 27)",
        "",
        f"Epsilon 1, {args.seeds} splits of `bench_model.py`; AUROC and its ratio to exact kNN on all features "
        f"({knn:.3f}). *pca k*: the top k principal components of the reference set, EXACT (an optimistic "
        "ceiling for a private basis); *rotation k*: k coordinates of a public random rotation, clipped to +-1.",
        "",
        "| coordinates | AUROC | of exact kNN |",
        "|---|---|---|",
    ]
    for key in keys:
        v = np.mean([r[key] for r in rows])
        lines.append(f"| {key} | {v:.3f} | {v / knn:.2f} |")
    lines += ["", f"Reproduce: `python bench/bench_projection_ceiling.py --seeds {args.seeds}` ({time.time() - t0:.0f} s on one core)."]
    md = "\n".join(lines)
    print(md)
    if not args.no_write:
        write_section("model-projections", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
