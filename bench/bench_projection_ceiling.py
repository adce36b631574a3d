"""Beyond axis-aligned grids: do grids over other coordinates reach the
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
  public bounds +-1 around the box's centre;
- where the outliers are: the Mahalanobis distance with the EXACT covariance, in all
  components and in the top 16 only, and with a covariance released under pure
  epsilon-DP at epsilon 1 (Laplace noise on the sums of x x^T, x and the count of the
  centred, scaled rows: the only basis a pure-DP fit could whiten with);
- one-feature grids over the differences of the 32 most correlated feature pairs, the
  pairs picked with the EXACT correlations (optimistic: a private pick would pay for it).

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
PAIRS = 32
COVARIANCE_EPSILONS = (1, 10, 30)  # 10 and 30: as 10 or 30 times the records at epsilon 1


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
    out.update(_covariance(Rs, Ts, y, seed))
    out.update(_pair_differences(Rs, Ts, y, bounds, seed))
    return out


def mahalanobis(T: np.ndarray, mu: np.ndarray, C: np.ndarray, top: int | None = None) -> np.ndarray:
    w, V = np.linalg.eigh((C + C.T) / 2)
    w, V = np.maximum(w[::-1], 1e-3 * max(w.max(), 1e-9)), V[:, ::-1]
    Z = (T - mu) @ V / np.sqrt(w)
    return (Z[:, :top] ** 2).sum(axis=1)


def dp_mean_covariance(X: np.ndarray, eps: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The mean and covariance of rows X with every |x_i| <= 1/2 (a public bound), released under pure
    epsilon-DP. One row moves the upper triangle of sum x x^T by at most (sum |x_i|)^2 / 2 + sum x_i^2 / 2
    in L1, the sum x by d / 2, the count by 1: 80 % / 10 % / 10 % of epsilon, Laplace noise."""
    n, d = X.shape
    E = np.triu(rng.laplace(0.0, ((d / 2) ** 2 / 2 + d / 8) / (0.8 * eps), (d, d)))
    S = X.T @ X + E + np.triu(E, 1).T
    m = X.sum(axis=0) + rng.laplace(0.0, (d / 2) / (0.1 * eps), d)
    n_hat = max(n + rng.laplace(0.0, 1 / (0.1 * eps)), 2.0)
    return m / n_hat, S / n_hat - np.outer(m, m) / n_hat ** 2


def _covariance(Rs, Ts, y, seed: int) -> dict:
    """The Mahalanobis distance, exact and from a pure-DP covariance at epsilon 1."""
    X, T = Rs - 0.5, Ts - 0.5  # centred on the box: |x_i| <= 1/2, a public bound
    mu, C = X.mean(axis=0), np.cov(X.T)
    out = {"mahalanobis, exact covariance": _auc(y, mahalanobis(T, mu, C)),
           "mahalanobis, exact, top 16 components": _auc(y, mahalanobis(T, mu, C, 16))}
    rng = np.random.default_rng(2000 + seed)
    for eps in COVARIANCE_EPSILONS:
        mu_dp, C_dp = dp_mean_covariance(X, eps, rng)
        out[f"mahalanobis, covariance at epsilon {eps:g} (pure DP)"] = _auc(y, mahalanobis(T, mu_dp, C_dp))
        if eps == 1:
            mu_1, C_1 = mu_dp, C_dp
    # The private-PCA lead: grids over the top 16 components of that covariance. Its release
    # took epsilon 1 already, so the grids' own epsilon 1 makes this an epsilon-2 model.
    V = np.linalg.eigh((C_1 + C_1.T) / 2)[1][:, ::-1][:, :16]
    r, t = (X - mu_1) @ V, (T - mu_1) @ V
    b = np.column_stack([r.min(axis=0), r.max(axis=0)])  # the data's own range: optimistic
    out["grids pca16, covariance at epsilon 1 (pure DP)"] = _auc(
        y, GridKNN(epsilon=1.0, bounds=b, random_state=seed).fit(r).score_samples(t))
    return out


def _pair_differences(Rs, Ts, y, bounds, seed: int) -> dict:
    """One-feature grids over x_i -+ x_j for the most correlated pairs (picked exactly)."""
    d = Rs.shape[1]
    C = np.nan_to_num(np.corrcoef(Rs.T))
    iu = np.triu_indices(d, 1)
    top = np.argsort(-np.abs(C[iu]))[:PAIRS]
    pairs = [(iu[0][o], iu[1][o], np.sign(C[iu[0][o], iu[1][o]])) for o in top]

    def diff(Z):  # in [0, 1] for Z in [0, 1]
        return np.column_stack([(Z[:, i] - s * Z[:, j]) / 2 + (0.5 if s > 0 else 0.0) for i, j, s in pairs])

    box = np.array([[0.0, 1.0]] * len(pairs))
    m = GridKNN(epsilon=1.0, bounds=box, random_state=seed, bins=16, n_grids=len(pairs), group_size=1).fit(diff(Rs))
    return {f"grids over {PAIRS} pair differences (16 bins)": _auc(y, m.score_samples(diff(Ts)))}


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
        f"## Beyond axis-aligned grids: {args.dataset}",
        "",
        f"Epsilon 1, {args.seeds} splits of `bench_model.py`; AUROC and its ratio to exact kNN on all features "
        f"({knn:.3f}). *pca k*: the top k principal components of the reference set, EXACT (an optimistic "
        "ceiling for a private basis); *rotation k*: k coordinates of a public random rotation, clipped to +-1. "
        "*mahalanobis*: distance in the whitened reference set, with the exact covariance or one released with "
        "Laplace noise (pure DP; epsilon 10 or 30 is worth what 10 or 30 times the records would be at epsilon 1); *pair differences*: one-feature grids over x_i -+ x_j for the "
        f"{PAIRS} most correlated pairs, picked with the exact correlations (optimistic).",
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
