"""Benchmarks of the private outlier core: noise, top-h accuracy, speed.

    OMP_NUM_THREADS=1 python bench/bench_core.py            # full run, writes docs/benchmarks/outliers.md (core)
    OMP_NUM_THREADS=1 python bench/bench_core.py --quick    # smaller, for development (no write)
    OMP_NUM_THREADS=1 python bench/bench_core.py --cost     # only the float-fix noise and release-cost tables

Noise is measured as the standard deviation of repeated releases: the smooth bound is
computed once per (window, beta) and the mechanism's noise is drawn many times through
the same code path ``private_count`` uses.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import numpy as np

from report import REPO, write_section
from monitor.dp import noise_source
from monitor.outliers import (
    choose_mechanism,
    count_outliers,
    global_sensitivity_bound,
    paper_global_sensitivity_lower_bound,
    private_top_subspace_counts,
    private_top_subspaces,
    smooth_sensitivity,
)
from monitor.config import ReportSettings
from monitor.outliers import private_count
from monitor.outliers.mechanisms import _T_DOF, _draw, _smooth_params, _t_split, student_t_float_loss
from monitor.outliers.sensitivity import _smooth
from monitor.outliers.subspaces import _select

EPSILONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
FIGURE = REPO / "docs" / "figures" / "core_noise_vs_epsilon.png"
COMMAND = "OMP_NUM_THREADS=1 python bench/bench_core.py"


# -- data ----------------------------------------------------------------------------------
def synthetic1(rng: np.random.Generator) -> np.ndarray:
    """The paper's Synthetic 1: 45 rows N(0, I2), 5 rows N((20, 20), 100 I2); unscaled."""
    return np.vstack([rng.standard_normal((45, 2)), 20 + 10 * rng.standard_normal((5, 2))])


def synthetic2(rng: np.random.Generator) -> np.ndarray:
    """The paper's Synthetic 2: 490 rows N(0, I10); 10 rows N(20, 100) in columns 0, 1."""
    X = rng.standard_normal((500, 10))
    X[490:, :2] = 20 + 10 * rng.standard_normal((10, 2))
    return X


def sensor_window(n: int, d: int, rng: np.random.Generator, outliers: float = 0.01) -> np.ndarray:
    """A monitoring-like window in [0, 1]^d: correlated features (five operating modes
    on a 3-dimensional latent space, mapped linearly to d features, small sensor noise)
    plus a fraction of uniformly scattered anomalies."""
    latent = min(d, 3)
    m = n - int(round(outliers * n))
    modes = rng.uniform(-1, 1, (5, latent))
    z = modes[rng.integers(0, 5, m)] + 0.15 * rng.standard_normal((m, latent))
    A = rng.standard_normal((latent, d)) / math.sqrt(latent)
    X = 0.5 + 0.12 * (z @ A) + 0.005 * rng.standard_normal((m, d))
    return np.vstack([X, rng.random((n - m, d))]).clip(0, 1)


# -- noise -----------------------------------------------------------------------------------
def noise_table(X, k, r, delta, reps, rng, epsilons=EPSILONS):
    """Rows of measured noise std per epsilon for every mechanism of the comparison."""
    dim = X.shape[1]
    gs = global_sensitivity_bound(k, dim)
    source = noise_source(rng)
    rows = []
    for eps in epsilons:
        row = {"eps": eps}
        paper_gs = paper_global_sensitivity_lower_bound(k, dim) * math.sqrt(2 * math.log(2 / delta)) / eps
        row["paper_global_gauss"] = float(np.std(source.gaussian(paper_gs, reps)))
        row["global_laplace"] = float(np.std(source.laplace(gs / eps, reps)))
        smooth = {}
        for mech in ("laplace", "gaussian", "student_t"):
            beta, div = _smooth_params(mech, eps, delta)
            smooth[mech] = smooth_sensitivity(X, k, r, beta)
            capped = min(smooth[mech], gs) / div
            row[mech] = float(np.std(_draw(mech, capped, source, reps, epsilon=eps)))
        beta, div = _smooth_params("gaussian", eps, delta)
        # The paper's mechanism as published: Theorem 2 with the uncapped smooth bound.
        row["paper_smooth_gauss"] = float(np.std(_draw("gaussian", smooth["gaussian"] / div, source, reps)))
        auto = choose_mechanism(eps, delta, k, dim)
        row["auto_mech"] = auto
        row["auto"] = row["global_laplace"] if auto == "global" else row[auto]
        row["S_laplace"] = smooth["laplace"]
        rows.append(row)
    return rows


def format_noise(title, rows, q, note=""):
    head = (
        f"**{title}** (true count q = {q}{note})\n\n"
        "| eps | paper GS Gaussian (2dk+1, not DP) | global Laplace (kK+1) | paper smooth Gaussian | "
        "smooth Laplace | smooth Student t | **auto** (picks) | auto / global | auto / paper smooth |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['eps']:.1f} | {r['paper_global_gauss']:.1f} | {r['global_laplace']:.1f} | {r['paper_smooth_gauss']:.1f} | "
        f"{r['laplace']:.1f} | {r['student_t']:.1f} | **{r['auto']:.1f}** ({r['auto_mech']}) | "
        f"{r['auto'] / r['global_laplace']:.2f} | {r['auto'] / r['paper_smooth_gauss']:.3f} |\n"
        for r in rows
    )
    return head + body


# -- top-h -----------------------------------------------------------------------------------
def top_h_table(runs, rng):
    """Precision and recall of the planted subspaces {0}, {1} on Synthetic 2."""
    truth = {(0,), (1,)}
    cands = [(j,) for j in range(10)]
    epsilons, hs = (0.2, 0.4, 0.8, 1.6, 3.2), (1, 2, 3)
    hits = {(e, h): 0 for e in epsilons for h in hs}
    source = noise_source(rng)
    for _ in range(runs):
        X = synthetic2(rng)
        # Utilities once per data set; the selection is private_top_subspaces' own _select.
        util = [count_outliers(X, 3, 0.13, s) / global_sensitivity_bound(3, 1) for s in cands]
        for e in epsilons:
            for h in hs:
                hits[e, h] += len(truth & {cands[i] for i in _select(util, h, e, source)})
    lines = ["| eps | " + " | ".join(f"h={h} precision | h={h} recall" for h in hs) + " |",
             "|---|" + "---|---|" * len(hs)]
    for e in epsilons:
        cells = []
        for h in hs:
            cells += [f"{hits[e, h] / (runs * h):.2f}", f"{hits[e, h] / (runs * 2):.2f}"]
        lines.append(f"| {e} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- speed -----------------------------------------------------------------------------------
def speed(n, rng, eps=1.0, delta=1e-6, k=3, r=0.03):
    X = sensor_window(n, 10, rng)
    beta = _smooth_params("laplace", eps, delta)[0]
    one = [(j,) for j in range(10)]
    two = [(i, j) for i in range(10) for j in range(i + 1, 10)]
    out = {}
    t0 = time.perf_counter()
    q_full, s_full = _smooth(X, k, r, beta, None)
    out["full space (10-D) count + smooth bound"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in one:
        _smooth(X, k, r, beta, s)
    out["10 one-dimensional counts + smooth bounds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in two:
        _smooth(X, k, r, beta, s)
    out["45 two-dimensional counts + smooth bounds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    private_top_subspaces(X, k, r, 3, eps, one + two, rng=rng)
    out["top-3 of the 55 subspaces (exponential mechanism)"] = time.perf_counter() - t0
    return out, q_full, s_full


def scaling(sizes, rng, eps=1.0, delta=1e-6, k=3, r=0.03, d=5):
    beta = _smooth_params("laplace", eps, delta)[0]
    lines = ["| window size | full space (5-D): count + smooth bound [s] | one 2-D subspace [s] | count only, full space [s] |",
             "|---|---|---|---|"]
    for n in sizes:
        X = sensor_window(n, d, rng)
        t0 = time.perf_counter()
        _smooth(X, k, r, beta, None)
        t1 = time.perf_counter()
        _smooth(X, k, r, beta, (0, 1))
        t2 = time.perf_counter()
        count_outliers(X, k, r)
        t3 = time.perf_counter()
        lines.append(f"| {n:,} | {t1 - t0:.2f} | {t2 - t1:.2f} | {t3 - t2:.2f} |")
    return "\n".join(lines)


def oracle_table(rng, windows=30):
    """Our bound vs the paper's exponential algorithm on small windows, by dimension."""
    from monitor.outliers._oracle import smooth_oracle

    lines = ["| subspace dim | windows | ours = paper | median ours / paper | max ours / paper |", "|---|---|---|---|---|"]
    for d in (1, 2, 3, 4, 5):
        ratios = []
        for _ in range(windows):
            X = rng.random((int(rng.integers(6, 12)), d))
            k, r, beta = int(rng.integers(1, 4)), float(rng.uniform(0.1, 0.4)), float(rng.uniform(0.1, 1.0))
            ratios.append(smooth_sensitivity(X, k, r, beta) / smooth_oracle(X, k, r, beta))
        ratios = np.array(ratios)
        lines.append(f"| {d} | {windows} | {np.mean(np.isclose(ratios, 1)):.0%} | {np.median(ratios):.2f} | {ratios.max():.2f} |")
    return "\n".join(lines)


# -- Student's t snapping (docs/privacy-count.md, Lemma 2) ----------------------------------
def snapping_section(rng, quick):
    """Noise of the count at epsilon_count 0.8, before and after the snapping."""
    st = ReportSettings(epsilon_count=0.8, delta_count=1e-9)
    eps, delta, k, r = st.epsilon_count, st.delta_count, st.k, st.radius
    loss, g = student_t_float_loss(eps)
    windows = {
        "tight window: 200 events near 0.5 (5-D)": 0.5 + 0.01 * rng.standard_normal((200, 5)),
        "sensor-like window, 10,000 events (5-D)": sensor_window(10_000, 5, rng),
    }
    reps = 2000 if quick else 20000
    lines = ["| window | S before / after | std before (unsnapped, eps 0.8) | std after (snapped, eps 0.8 - loss) | "
             "measured std after (production path, seeded) | change |", "|---|---|---|---|---|---|"]
    gs = global_sensitivity_bound(k, 5)
    for name, X in windows.items():
        beta0, s0 = _t_split(eps)  # the unsnapped mechanism spent all of eps on the continuous guarantee
        beta1, s1 = _smooth_params("student_t", eps, delta)
        S0 = min(smooth_sensitivity(X, k, r, beta0), gs)
        S1 = min(smooth_sensitivity(X, k, r, beta1), gs)
        z = math.sqrt(_T_DOF / (_T_DOF - 2))
        before, after = z * S0 / s0, z * S1 / s1
        source = noise_source(rng)
        measured = float(np.std(_draw("student_t", S1 / s1, source, reps, epsilon=eps)))
        lines.append(f"| {name} | {S0:.3f} / {S1:.3f} | {before:.3f} | {after:.3f} | {measured:.2f} | "
                     f"{(after / before - 1) * 100:+.2f} % |")
    return (f"### Student's t count at the shipped settings: noise before and after the float fix\n\n"
            f"Shipped `release` settings: 5 features, k={k}, r={r}, eps={eps}, delta={delta} (auto picks "
            f"`{choose_mechanism(eps, delta, k, 5)}`). The release is now snapped to multiples of g = 2^{int(math.log2(g))} "
            f"and the charged float loss is {loss:.2e} of the {eps} (docs/privacy-count.md). Std of the t noise is "
            "sqrt(3) S / s; the grid adds at most g^2/12 of variance.\n\n" + "\n".join(lines))


# -- release cost vs plain counts (docs/privacy-count.md, Lemma 4) -----------------------------
def _timed(fn, at_least=0.5, most=50):
    """(wall, cpu) seconds per call of fn, averaged over repeats until at_least CPU seconds
    (small windows take milliseconds: one call is mostly timer and scheduler noise)."""
    w, c, calls = time.perf_counter(), time.process_time(), 0
    while calls < most and (calls == 0 or time.process_time() - c < at_least):
        fn()
        calls += 1
    return (time.perf_counter() - w) / calls, (time.process_time() - c) / calls


def release_cost(X, k=5, r=0.1, h=3, rng=None):
    """(plain, release) (wall, cpu) seconds: the plain counts of the full space and of every
    1-D and 2-D subspace, vs the full private release of those (count with its bound,
    top-h over the subspaces, the h counts), as ``release_report`` computes them."""
    d = X.shape[1]
    st = ReportSettings(epsilon_count=0.8, delta_count=1e-9)
    cands = [(j,) for j in range(d)] + [(i, j) for i in range(d) for j in range(i + 1, d)]

    def plain():
        count_outliers(X, k, r)
        for c in cands:
            count_outliers(X, k, r, c)

    def release():
        private_count(X, k, r, st.epsilon_count, st.delta_count, rng=rng)
        private_top_subspace_counts(X, k, r, min(h, len(cands)), st.epsilon_top, st.epsilon_top_count,
                                    st.delta_top_count, cands, rng=rng)

    return _timed(plain), _timed(release)


def diffuse(n, d, rng):
    return rng.standard_normal((n, d))


# The commit before the cheaper smooth-bound computation: its S is computed on the
# same windows in a subprocess, to show the bound's value did not change.
COST_REFERENCE = "c58dcf1"


def full_space_beta(d):
    """beta of the full-space count's smooth mechanism at the shipped settings (None when
    auto picks the global mechanism, as in 1-D and 2-D)."""
    st = ReportSettings(epsilon_count=0.8, delta_count=1e-9)
    mech = choose_mechanism(st.epsilon_count, st.delta_count, st.k, d)
    return None if mech == "global" else _smooth_params(mech, st.epsilon_count, st.delta_count)[0]


def reference_bounds(windows, ref=COST_REFERENCE):
    """S of each (X, beta) window computed by the code at git commit ``ref`` (None where
    beta is None), or None for all when the reference cannot be checked out."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        try:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "monitor"], check=True, capture_output=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        except (OSError, subprocess.CalledProcessError):
            return [None] * len(windows)
        np.savez(f"{tmp}/windows.npz", *[X for X, _ in windows])
        betas = [b for _, b in windows]
        code = ("import sys, json, numpy as np; from monitor.outliers import smooth_sensitivity; "
                f"W = np.load('{tmp}/windows.npz'); betas = {betas!r}; "
                "print(json.dumps([None if b is None else smooth_sensitivity(W[f'arr_{i}'], 5, 0.1, b) "
                "for i, b in enumerate(betas)]))")
        env = dict(os.environ, PYTHONPATH=tmp, OMP_NUM_THREADS="1")
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp, check=True, capture_output=True, text=True)
        return __import__("json").loads(out.stdout)


def release_cost_section(rng, quick, max_events=1_000_000):
    sizes = [n for n in ([1_000, 10_000] if quick else [1_000, 10_000, 100_000, 1_000_000]) if n <= max_events]
    rows, windows = [], []
    for kind, make in (("diffuse N(0, I)", diffuse), ("structured (sensor-like)", lambda n, d, g: sensor_window(n, d, g))):
        for d in (2, 5, 10):
            for n in sizes:
                if n == 1_000_000 and (d == 10 or (d == 5 and kind.startswith("diffuse"))):
                    continue  # see the note under the table
                X = make(n, d, rng)
                (pw, pc), (rw, rc) = release_cost(X, rng=rng)
                beta = full_space_beta(d)
                S = None if beta is None else smooth_sensitivity(X, 5, 0.1, beta)
                rows.append((kind, d, n, pc, rc, rw, S))
                windows.append((X if beta is not None and n <= 100_000 else X[:0], beta if n <= 100_000 else None))
    before = reference_bounds(windows)
    lines = ["| data | d | events | plain counts cpu [s] | full release cpu [s] | release / plain (cpu) | "
             f"release wall [s] | S after | S before ({COST_REFERENCE}) |", "|---|---|---|---|---|---|---|---|---|"]
    worst = 0.0
    for (kind, d, n, pc, rc, rw, S), S0 in zip(rows, before):
        worst = max(worst, rc / pc)
        fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
        lines.append(f"| {kind} | {d} | {n:,} | {pc:.2f} | {rc:.2f} | {rc / pc:.2f} | {rw:.2f} | {fmt(S)} | {fmt(S0)} |")
    X = diffuse(10_000 if quick else 100_000, 10, rng)
    (pw, pc), (rw, rc) = release_cost(X, rng=rng)
    return ("### Release cost vs the plain counts\n\n"
            "Full release = the full-space count with its smooth bound "
            "(auto at epsilon_count 0.8, the float-fix table's setting, where auto picks the smooth Student's t from 3-D; at the shipped 0.05 it picks the global bound up to 6-D, which needs no smooth bound) + top-3 over all 1-D "
            "and 2-D subspaces (their counts) + the 3 chosen counts (global mechanism in 1-D and 2-D, centred on the "
            "counts the selection computed, as `release_report` does); plain = the "
            "non-private counts of the same subspaces. k=5, r=0.1, one thread. CPU seconds of this process per "
            "release (windows that take under 0.5 s are repeated and averaged; the "
            "machine is shared: CPU time too grows with the other jobs' load). S = the full-space smooth bound at the "
            "shipped beta (\"-\": auto uses the global mechanism in 2-D), after this change and at commit "
            f"{COST_REFERENCE} (before it; windows up to 100,000 events). 1,000,000-event windows of diffuse 5-D and 10-D take minutes each: they are measured on their own (`--diffuse-million`, next section).\n\n" + "\n".join(lines)
            + f"\n\nWorst release / plain ratio: {worst:.2f} (goal <= 2; before this change 5.92, diffuse 5-D "
            f"100,000). The diffuse 10-D window ({X.shape[0]:,} x 10-D from N(0, I), diffuse): release {rc:.2f} s cpu / "
            f"{rw:.2f} s wall, plain counts {pc:.2f} s cpu (before this change: 9.40 s cpu release, 4.64 s plain; "
            "goal < 5 s).")


def plot(panels, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    styles = [("paper_global_gauss", "paper GS Gaussian (2dk+1, not DP)", "k:"),
              ("global_laplace", "global Laplace (kK+1)", "C0-"),
              ("paper_smooth_gauss", "paper smooth Gaussian (Thm 2)", "C3--"),
              ("laplace", "smooth Laplace (NRS)", "C1-."),
              ("student_t", "smooth Student t", "C2-."),
              ("auto", "auto (default)", "k-")]
    for ax, (title, rows) in zip(axes[0], panels):
        eps = [r["eps"] for r in rows]
        for key, label, style in styles:
            ax.plot(eps, [r[key] for r in rows], style, label=label, lw=2 if key == "auto" else 1)
        ax.set_yscale("log")
        ax.set_xlabel("epsilon")
        ax.set_title(title, fontsize=9)
    axes[0][0].set_ylabel("std of released count")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller run for development; does not write")
    parser.add_argument("--cost", action="store_true", help="only the float-fix and release-cost tables (section core_cost)")
    parser.add_argument("--max-events", type=int, default=1_000_000, help="largest window of the release-cost table")
    parser.add_argument("--diffuse-million", action="store_true",
                        help="only the 1,000,000-event diffuse 5-D and 10-D windows the cost table leaves out (section core_cost_million)")
    args = parser.parse_args()
    quick = args.quick
    if args.cost:
        return cost_main(quick, args.max_events)
    if args.diffuse_million:
        return diffuse_million_main()
    reps = 2000 if quick else 20000
    rng = np.random.default_rng(2026)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    parts = [f"Reproduce: `{COMMAND}` (about {{minutes}} min; `--quick` for a smaller run). "
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores shared with other jobs "
             f"(1-min load average {load:.1f} at start: timings are pessimistic), one thread."]

    # Noise on the paper's Synthetic 1.
    X1 = synthetic1(rng)
    rows1 = noise_table(X1, 3, 1.1, 0.01, reps, rng)
    parts.append("### Noise: the paper's Synthetic 1 (50 rows, 2-D, k=3, r=1.1, delta=0.01)\n\n"
                 + format_noise("Synthetic 1", rows1, count_outliers(X1, 3, 1.1)))
    at07 = next(r for r in rows1 if r["eps"] == 0.7)
    parts.append(
        "The paper reports smooth noise std below 7 for eps >= 0.7 (its Figure 3). Under its own Theorem 2 that is "
        f"impossible: S >= 1, so std >= 1/alpha = 5 sqrt(2 ln 200)/0.7 = {5 * math.sqrt(2 * math.log(200)) / 0.7:.1f} "
        f"at eps = 0.7; with the smooth bound of this window (S = "
        f"{smooth_sensitivity(X1, 3, 1.1, _smooth_params('gaussian', 0.7, 0.01)[0]):.1f}) we measure "
        f"{at07['paper_smooth_gauss']:.1f}. Its global curve uses 2dk+1 = 13, a lower bound, so it is not a valid "
        "mechanism either. In 2-D the valid global Laplace (6k+1 = 19) is the mechanism to beat, and auto picks it."
    )

    # Noise on larger windows.
    panels = [("Synthetic 1 (50 rows, 2-D, delta=0.01)", rows1)]
    tables = {"Synthetic 1": rows1}
    sizes = [(10_000, 2), (10_000, 5), (10_000, 8), (5_000, 8)]
    for n, d in sizes if not quick else [(5_000, 8), (5_000, 2)]:
        X = sensor_window(n, d, rng)
        rows = noise_table(X, 3, 0.03, 1e-6, reps, rng)
        title = f"{n:,} events, {d}-D (k=3, r=0.03, delta=1e-6)"
        parts.append(f"### Noise: {title}\n\n" + format_noise(title, rows, count_outliers(X, 3, 0.03),
                     note=f"; S at the Laplace beta, eps=1: {rows[-1]['S_laplace']:.1f}"))
        tables[f"{n:,} x {d}-D"] = rows
        if d == 8:
            panels.append((title, rows))
    plot(panels, FIGURE)
    parts.append(f"![noise vs epsilon](../figures/{FIGURE.name})")  # relative to docs/benchmarks/

    worst_global = max(r["auto"] / r["global_laplace"] for rows in tables.values() for r in rows)
    worst_paper = max(r["auto"] / r["paper_smooth_gauss"] for rows in tables.values() for r in rows)
    key8 = "5,000 x 8-D" if "5,000 x 8-D" in tables else None
    goals = [
        f"- Default never noisier than the valid global Laplace: worst measured ratio {worst_global:.2f} "
        "(1.00 = auto picked the global mechanism itself).",
        f"- Default at most 0.2x the paper's Gaussian smooth mechanism: worst ratio {worst_paper:.3f}.",
    ]
    if key8:
        ok = [r["eps"] for r in tables[key8] if r["auto"] <= 0.1 * r["global_laplace"]]
        r01 = tables[key8][0]
        beta_t = _smooth_params("student_t", 0.1, 0.0)
        floor = max(math.exp(-beta_t[0] * t) * (t + 1) for t in range(2000))
        goals.append(
            f"- At most 0.1x the global Laplace on the 8-D 5,000-event window: met for eps >= {min(ok):.1f} "
            f"(ratio {min(r['auto'] / r['global_laplace'] for r in tables[key8]):.2f} at best); at eps = 0.1 the ratio "
            f"is {r01['auto'] / r01['global_laplace']:.2f}, and no window can push the Student t noise lower: every U_t >= t + 1, so "
            f"S >= max_t exp(-beta t)(t + 1) = {floor:.0f} at beta = eps/16, a noise std of at least "
            f"{math.sqrt(3) * floor / beta_t[1]:.0f} vs {r01['global_laplace']:.0f}."
        )
    parts.insert(1, "### Goals\n\n" + "\n".join(goals) + "\n- Speed: see below.")
    parts.append("### Our bound vs the paper's Algorithms 1-2 (miniball), small random windows\n\n"
                 "The exact clique number in 1-D makes the bound equal to the paper's; from 2-D on, degeneracy + 1 of "
                 "the 2r-graph is an upper bound (polynomial time instead of O(2^|P|) smallest-enclosing-ball calls; "
                 "the exact 2-D angular sweep was dropped because it is not 1-Lipschitz in floats).\n\n"
                 + oracle_table(rng, 10 if quick else 30))

    # Top-h.
    runs = 100 if quick else 1000
    parts.append(f"### Top-h subspaces: the paper's Synthetic 2 (500 rows, 10-D, k=3, r=0.13, 1-D subspaces), {runs} runs\n\n"
                 "Precision = planted subspaces {0}, {1} among the h picks / h; recall = found / 2. "
                 "A fresh data set per run.\n\n" + top_h_table(runs, rng))

    # Speed.
    n_speed = 20_000 if quick else 100_000
    times, q, s = speed(n_speed, rng)
    total = sum(times.values())
    goal = "goal < 10 s: " + ("met" if total < 10 else "NOT met")
    parts.append(f"### Speed: one window of {n_speed:,} events in 10-D (k=3, r=0.03, eps=1, delta=1e-6), one core\n\n"
                 "| part | seconds |\n|---|---|\n"
                 + "".join(f"| {k} | {v:.2f} |\n" for k, v in times.items())
                 + f"| **total** | **{total:.2f}** ({goal}) |\n\n"
                 f"Full-space count {q}, smooth bound {s:.1f} (never released).")
    scale_sizes = [1_000, 10_000] if quick else [1_000, 10_000, 100_000, 1_000_000]
    parts.append("### Scaling (sensor-like window, 5-D, k=3, r=0.03, eps=1, delta=1e-6)\n\n" + scaling(scale_sizes, rng))

    minutes = (time.perf_counter() - started) / 60
    text = "\n\n".join(parts).replace("{minutes}", f"{minutes:.0f}")
    print(text)
    if not quick:
        write_section("core", "## Private outlier core\n\n" + text)


def cost_main(quick: bool, max_events: int = 1_000_000) -> None:
    """The float-fix and release-cost tables, in their own section (a few minutes without --quick)."""
    rng = np.random.default_rng(2027)
    started = time.perf_counter()
    load = os.getloadavg()[0]
    parts = [snapping_section(rng, quick), release_cost_section(rng, quick, max_events)]
    minutes = (time.perf_counter() - started) / 60
    flag = "" if max_events >= 1_000_000 else f" --max-events {max_events}"
    text = (f"Reproduce: `{COMMAND} --cost{flag}` (about {minutes:.0f} min). Machine: {os.cpu_count()} cores shared with "
            f"other jobs (1-min load average {load:.1f} at start), one thread.\n\n" + "\n\n".join(parts))
    print(text)
    if not quick:
        write_section("core_cost", "## Private outlier core: float safety and release cost\n\n" + text)


def diffuse_million_main() -> None:
    """The two 1,000,000-event windows the cost table leaves out (minutes each, several GB)."""
    import resource

    rng = np.random.default_rng(2028)
    started = time.perf_counter()
    lines = ["| data | d | events | plain counts cpu [s] | full release cpu [s] | release / plain (cpu) | release wall [s] |",
             "|---|---|---|---|---|---|---|"]
    worst = 0.0
    for d in (5, 10):
        X = diffuse(1_000_000, d, rng)
        (pw, pc), (rw, rc) = release_cost(X, rng=rng)
        lines.append(f"| diffuse N(0, I) | {d} | 1,000,000 | {pc:.1f} | {rc:.1f} | {rc / pc:.2f} | {rw:.1f} |")
        worst = max(worst, rc / pc)
        print(lines[-1], flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    minutes = (time.perf_counter() - started) / 60
    text = (f"Reproduce: `{COMMAND} --diffuse-million` (about {minutes:.0f} min, peak memory {peak:.1f} GB). The same "
            "measure as the table above (k=5, r=0.1, one thread, one release each, epsilon_count 0.8) on the two "
            "windows it leaves out.\n\n" + "\n".join(lines)
            + f"\n\nWorst release / plain: {worst:.2f} (goal <= 2: {'met' if worst <= 2 else '**NOT met**'}; before the "
              "compiled loops 3.13 in 5-D and 2.00 in 10-D). The smooth bound needs every pair within 2r, 2^5 = 32 times "
              "the volume of the r-balls the plain count probes: on the 5-D window about 81 M edges, whose kd-tree search "
              "(scipy's query_pairs, about 35 s) is now most of the release. The candidates' distance check and the "
              "k-core questions about that graph (the whole graph's core numbers once, then about 40 peels of induced "
              "subgraphs) run as compiled loops (numba) over vertices relabelled in a kd-tree's leaf order: on this "
              "window about 22 s -> 3 s for the check and 65 s -> 17 s for the cores (measured alone), same S (56.016). In 10-D the pair "
              "search splits the columns; the two halves' searches propose about 170 M candidates for 38,000 edges, "
              "checked by the same compiled loop. At the shipped epsilon_count (0.05) auto uses the global bound in 5-D "
              "and computes no smooth bound. The machine's speed moves both columns (41.8 s plain one day, 32.9 s "
              "another, same code).")
    print(text)
    write_section("core_cost_million", "### Release cost: 1,000,000 diffuse events in 5-D and 10-D\n\n" + text)


if __name__ == "__main__":
    main()
