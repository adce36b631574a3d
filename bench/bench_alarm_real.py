"""Surge alarm on real labelled data: does it page where an exact detector would?

For every set of ``../shared/datasets`` with enough rows (at least 3,000), the inliers are
split in two halves: one is the reference ``monitor fit`` fits the model on (with the
shipped ``config.yaml``, only the features changed: one per column, public bounds = the
set's min and max), the other is the normal traffic. A day of 5-minute windows (+-30 %
daily swing) follows the shipped warm-up, and 6 surges of 3 windows after it send the
set's outliers (kind ``rows``) from a share of the people online. Every window goes to the
production ``WindowReleaser`` (seeded noise, a fresh ledger): the code ``monitor replay``
runs at each window close (``monitor/stream/replay.py``: parse, window, then the same
``WindowReleaser.release``), without the JSON file in between. The model's scores are
computed once per distinct row (``CachedScores``; a window's rows are copies of the pool's
rows): the same numbers ``score_samples`` returns, so the releaser decides exactly what
replay would decide.

Compared on the same windows:
- ``private``: the shipped alarm; a surge counts when it pages in its FIRST window;
- ``exact, same level``: flagged events at the alarm's ``contamination`` minus the EXACT
  normal rate times the events, paging above the smallest constant that keeps 1 false
  page per 30 days (from 300 simulated quiet days of the same traffic);
- ``exact, best level``: the same at the single flag level (of 0.1 % to 20 % of normal
  events) that pages most, chosen in hindsight per data set; ``one level`` chooses one
  level for every data set;
- ``exact kNN scores``: the exact detector again, its events flagged by EXACT kNN (distance to
  the 5th nearest reference row, min-max scaled with the same public bounds) instead of the
  private model: the limit a private monitor is measured against, where the two above share
  the private model's ranking.
Quiet days (no surge) count false pages. ``--kinds`` adds the simulated anomaly kinds
(``monitor.data.anomalies``) on the same real traffic.

Run: ``OMP_NUM_THREADS=1 python bench/bench_alarm_real.py --seeds 3 --write`` (see
docs/benchmarks/alarm-real.md for the time; ``--seeds 1 --sets 2_annthyroid`` for a quick look).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import REPO, write_run  # noqa: E402

from monitor.alarm.above_threshold import AboveThreshold  # noqa: E402
from monitor.alarm.units import RESOLUTION  # noqa: E402
from monitor.budget import BudgetAccountant, WindowLedger  # noqa: E402
from monitor.config import MonitorConfig, load_config  # noqa: E402
from monitor.data.traffic import RowTraffic, plan_surges  # noqa: E402
from monitor.model import GridKNN  # noqa: E402
from monitor.model.cli import model_from_config  # noqa: E402
from monitor.release import WindowReleaser  # noqa: E402
from monitor.pipeline.windows import ClosedWindow  # noqa: E402

SHARED = REPO.parent / "shared" / "datasets"
MIN_ROWS = 3000
SCALES = [(1500, 0.05), (10_000, 0.01)]
LEVELS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
SURGES_PER_DAY = 6
QUIET_DAYS_SIMULATED = 300  # for the exact detector's constant: 10 exceedances in 300 days = 1 per 30


def datasets() -> list[str]:
    out = []
    for p in sorted(SHARED.glob("*.npz"), key=lambda p: int(p.stem.split("_")[0])):
        with np.load(p, allow_pickle=False) as d:
            if d["X"].shape[0] >= MIN_ROWS:
                out.append(p.stem)
    return out


def load_set(name: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(reference rows, normal traffic rows, anomalous rows, public bounds)."""
    with np.load(SHARED / f"{name}.npz", allow_pickle=False) as d:
        X, y = d["X"].astype(np.float64), d["y"].astype(int)
    inl, out = X[y == 0], X[y == 1]
    perm = np.random.default_rng(seed).permutation(inl.shape[0])
    half = inl.shape[0] // 2
    lo, hi = X.min(axis=0), X.max(axis=0)
    hi = np.where(hi > lo, hi, lo + 1.0)
    return inl[perm[:half]], inl[perm[half:]], out, np.c_[lo, hi]


def make_config(base: MonitorConfig, bounds: np.ndarray, ledger: Path) -> MonitorConfig:
    data = base.model_dump(mode="json")
    data["features"] = [{"name": f"f{j}", "min": float(lo), "max": float(hi)} for j, (lo, hi) in enumerate(bounds)]
    data["budget"]["ledger"] = str(ledger)
    return MonitorConfig.model_validate(data)


def fit_model(config: MonitorConfig, R: np.ndarray, seed: int) -> GridKNN:
    return model_from_config(config, seed).fit(R)  # as `monitor fit` builds it


class ExactKNN:
    """Exact kNN's score: the distance to the ``k``-th nearest reference row, every feature min-max
    scaled with the public bounds (``bench_model_tail.exact_knn``). Not private: the limit."""

    def __init__(self, R: np.ndarray, bounds: np.ndarray, k: int = 5) -> None:
        from scipy.spatial import cKDTree

        self._lo, self._span, self._k = bounds[:, 0], bounds[:, 1] - bounds[:, 0], k
        self._tree = cKDTree((R - self._lo) / self._span)

    def score_samples(self, X) -> np.ndarray:
        u = np.clip((np.asarray(X, dtype=np.float64) - self._lo) / self._span, 0.0, 1.0)
        return self._tree.query(u, k=self._k)[0][:, self._k - 1]


class CachedScores:
    """The model, with ``score_samples`` computed once per distinct row (the traffic reuses
    a pool of rows); everything else is the model's own. ``last`` holds the latest scores."""

    def __init__(self, model: GridKNN, pools: list[np.ndarray]) -> None:
        self._model = model
        rows = np.unique(np.concatenate(pools), axis=0)
        self._keys = _keys(rows)
        order = np.argsort(self._keys)
        self._keys = self._keys[order]
        self._scores = model.score_samples(rows)[order]
        self.last = np.zeros(0)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def score_samples(self, X) -> np.ndarray:
        X = np.ascontiguousarray(X, dtype=np.float64)
        keys = _keys(X)
        idx = np.clip(np.searchsorted(self._keys, keys), 0, self._keys.size - 1)
        hit = self._keys[idx] == keys
        out = np.empty(X.shape[0])
        out[hit] = self._scores[idx[hit]]
        if (~hit).any():
            out[~hit] = self._model.score_samples(X[~hit])
        self.last = out
        return out


def _keys(X: np.ndarray) -> np.ndarray:
    X = np.ascontiguousarray(X, dtype=np.float64)
    return X.view(np.dtype((np.void, X.dtype.itemsize * X.shape[1]))).reshape(-1)


@contextlib.contextmanager
def fresh_releaser(config: MonitorConfig, model, seed: int):
    """A production WindowReleaser on a fresh ledger (seeded noise): (releaser, accountant)."""
    with tempfile.TemporaryDirectory() as tmp:
        ledger = WindowLedger(Path(tmp) / "ledger.sqlite")
        b = config.budget
        accountant = BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant)
        try:
            yield WindowReleaser(config, accountant, model, rng=seed), accountant
        finally:
            ledger.close()


def released_windows(releaser: WindowReleaser, model, traffic, surges):
    """Every window of ``traffic`` through ``releaser``, in order: (index, rows, their scores, alert record).
    Scored here, not read back from the releaser's last call: a page's report scores other
    rows too (the model's synthetic sample) after the window's."""
    size = releaser.config.window.size_seconds
    for i in range(traffic.n_windows):
        X, entities, _ = traffic.window(i, surges)
        scores = model.score_samples(X)
        window = ClosedWindow(i * size, (i + 1) * size, X, np.zeros(0, bool), (), tuple(entities))
        yield i, X, scores, json.loads(releaser.release(window, released_at=(i + 1) * size).entry.payload)


def page_chance(gap: float, query_scale: float, threshold_scale: float) -> float:
    """P[E_q - E_t >= gap] for the run's two one-sided noises (exponential, of these scales: the folded
    discrete Laplace's tail at the alarm's resolution, ``calibrate._svt_noise_density``): the chance
    that a window whose statistic lies ``gap`` below its bar pages."""
    a, b = float(query_scale), float(threshold_scale)
    if gap >= 0:
        return a / (a + b) * math.exp(-gap / a)
    return 1.0 - b / (a + b) * math.exp(gap / b)


@contextlib.contextmanager
def page_chances(window: list):
    """While open, every query the alarm asks adds (window index, its chance of paging, from its own
    statistic and the run's noise) to a list: a quiet run's expected false pages, with far less
    spread than the pages it happened to draw. A measurement: it reads the private statistic."""
    found: list = []
    ask = AboveThreshold.test_one

    def test_one(svt, query: int, threshold: int) -> bool:
        found.append((window[0], page_chance((int(threshold) - int(query)) / RESOLUTION, svt.query_scale / RESOLUTION,
                                             svt.threshold_scale / RESOLUTION)))
        return ask(svt, query, threshold)

    AboveThreshold.test_one = test_one
    try:
        yield found
    finally:
        AboveThreshold.test_one = ask


def chances_by_window(chances: list, windows: int) -> np.ndarray:
    """Each window's summed chance of paging, from what ``page_chances`` collected."""
    at = np.zeros(windows)
    for i, chance in chances:
        at[i] += chance
    return at


def replay_day(config: MonitorConfig, model: CachedScores, traffic: RowTraffic, surges, seed: int,
               levels: np.ndarray, kappa: float | None = None, exact: "tuple[CachedScores, np.ndarray] | None" = None) -> dict:
    """One day through WindowReleaser; per window the state, the events and the exact flagged count at each level.
    ``kappa`` (a diagnostic, not private) replaces the threshold's kappa from the model's calibration; ``exact``
    (exact kNN's scores and levels) adds each window's count above those levels (``F_knn``)."""
    window = [0]
    with fresh_releaser(config, model, seed) as (releaser, accountant), page_chances(window) as chances:
        if kappa is not None:
            releaser.alarm.kappa = kappa
        states, n, F, F_knn, thresholds, epsilons = [], [], [], [], [], []
        for i, X, scores, rec in released_windows(releaser, model, traffic, surges):
            window[0] = i + 1  # the next window's queries
            states.append(rec["alarm_detail"]["state"])
            thresholds.append(rec["alarm_detail"].get("threshold"))
            epsilons.append(rec["epsilon"])
            n.append(X.shape[0])
            F.append((scores[:, None] > levels[None, :]).sum(axis=0))
            if exact is not None:
                F_knn.append((exact[0].score_samples(X)[:, None] > exact[1][None, :]).sum(axis=0))
        day_spent = accountant.spent(traffic.n_windows * config.window.size_seconds)[0]
    return {"states": states, "n": np.array(n), "F": np.array(F), "F_knn": np.array(F_knn), "spent": day_spent, "thresholds": thresholds,
            "alarm_threshold": releaser.level_hi, "chance_at": chances_by_window(chances, len(states))}


def exact_constants(n: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per level, the smallest constant C with at most one window of f - p n >= C per 30 quiet
    days of this traffic profile (f ~ Binomial(n, p): the traffic's rows are drawn at random)."""
    days = QUIET_DAYS_SIMULATED
    nn = np.tile(n, days)
    out = np.empty(p.size)
    for j, pj in enumerate(p):
        stat = rng.binomial(nn, pj) - pj * nn
        k = days // 30 + 1  # the (days/30 + 1)-th largest value: days/30 windows lie above it
        out[j] = np.partition(stat, -k)[-k] + 1e-9
    return out


def fit_set(base: MonitorConfig, name: str, seed: int):
    """A set as every alarm benchmark fits it: its config, the model, its cached scores, the
    traffic pools and bounds, the normal rows' scores, the exact levels (LEVELS of normal
    events above each) and the real flagged share at ``alarm.contamination``."""
    R, T, A, bounds = load_set(name, seed)
    with tempfile.TemporaryDirectory() as tmp:
        config = make_config(base, bounds, Path(tmp) / "unused.sqlite")
    model = fit_model(config, R, seed)
    cached = CachedScores(model, [T, A])
    normal_scores = cached.score_samples(T)
    levels = np.quantile(normal_scores, 1.0 - np.array(LEVELS))
    flagged_share = float((normal_scores > model.threshold_for(config.alarm.contamination)).mean())
    return config, model, cached, T, A, bounds, normal_scores, levels, flagged_share


def run_one(base: MonitorConfig, name: str, people: int, share: float, seed: int, quiet: bool = True,
            kind: str = "rows", traffic_kappa: bool = False) -> dict:
    config, model, cached, T, A, bounds, normal_scores, levels, flagged_share = fit_set(base, name, seed)
    p = (normal_scores[:, None] > levels[None, :]).mean(axis=0)  # the EXACT normal rate at each level
    knn = CachedScores(ExactKNN(load_set(name, seed)[0], bounds), [T, A])  # the same reference rows
    knn_normal = knn.score_samples(T)
    knn_levels = np.quantile(knn_normal, 1.0 - np.array(LEVELS))
    p_knn = (knn_normal[:, None] > knn_levels[None, :]).mean(axis=0)
    kappa = None
    if traffic_kappa:  # the diagnostic: the traffic's own E[w^2] / E[w] (an oracle, not private)
        from monitor.alarm.calibrate import alarm_levels, graded_weights
        w = graded_weights(normal_scores, *alarm_levels(model, config.alarm))
        kappa = float(min(1.0, (w ** 2).mean() / w.mean())) if w.mean() > 0 else None
    size = config.window.size_seconds
    warm = int(math.ceil(config.alarm.baseline_warmup_seconds / size))
    wpd = int(round(86400 / size))
    days = {}
    for label, per_day in (("surge", SURGES_PER_DAY), ("quiet", 0)) if quiet else (("surge", SURGES_PER_DAY),):
        traffic = RowTraffic(T, A, bounds, people=people, days=1, window_seconds=size, seed=seed * 7 + (label == "quiet"))
        surges = plan_surges(1, per_day, wpd, share, rng=seed * 13 + 1, kinds=(kind,), first=warm + 1) if per_day else []
        t0 = time.perf_counter()
        res = replay_day(config, cached, traffic, surges, seed * 101 + (label == "quiet"), levels, kappa,
                         (knn, knn_levels) if per_day else None)
        res["seconds"] = time.perf_counter() - t0
        res["surges"] = [s.start for s in surges]
        days[label] = res
    rng = np.random.default_rng(seed + 555)
    C = exact_constants(days["surge"]["n"], p, rng)
    day = days["surge"]
    starts = np.array(day["surges"], dtype=int)
    stat = day["F"][starts] - p[None, :] * day["n"][starts, None]
    exact_first = (stat >= C[None, :]).sum(axis=0)  # per level
    C_knn = exact_constants(day["n"], p_knn, rng)
    stat_knn = day["F_knn"][starts] - p_knn[None, :] * day["n"][starts, None]
    exact_knn_first = (stat_knn >= C_knn[None, :]).sum(axis=0)
    private_first = sum(day["states"][s] == "fired" for s in starts)
    out = {"set": name, "kind": kind, "people": people, "share": share, "seed": seed, "surges": int(starts.size),
           "private_first": int(private_first), "exact_first": exact_first.tolist(),
           "exact_knn_first": exact_knn_first.tolist(),
           # Each surge's chance of paging in its first window (``page_chances``): less spread than the pages drawn.
           "private_first_expected": float(day["chance_at"][starts].sum()),
           "flagged_share": flagged_share, "seconds": [d["seconds"] for d in days.values()],
           "surge_day_epsilon": day["spent"], "pages_surge_day": sum(s == "fired" for s in day["states"])}
    if "quiet" in days:
        q = days["quiet"]
        out["false_pages"] = sum(s == "fired" for s in q["states"])
        out["expected_false_pages"] = float(q["chance_at"].sum())
        out["quiet_day_epsilon"] = q["spent"]
        first_thr = next((t for t in q["thresholds"] if t is not None), None)
        out["quiet_threshold"] = first_thr
    return out


PREFACE = """Every shared set with 3,000+ rows; per seed, half the inliers fit the model as `monitor fit` does
(shipped `config.yaml`, only the features changed; public bounds = the set's min and max), the other half is
the traffic: one day of 5-minute windows (+-30 % daily swing), 6 surges of 3 windows after the 3-hour warm-up,
their anomalies the set's outliers (`rows`) or a simulated kind applied to normal rows (subtle shift, stuck
sensor, correlated drift, far outlier). Windows go through the production `WindowReleaser` (what `monitor
replay` runs per window) with scores computed once per distinct row. A surge counts when it pages in its
first window. The exact detector: flagged events minus the exact normal rate times the events, above the
smallest constant with 1 false page per 30 days (300 simulated quiet days of the same traffic), at the
alarm's level, at the best single level of 0.1 % to 20 % for all sets (one level) or for each set and kind
(hindsight per set). One quiet day per set, seed and scale counts false pages; the alarm's expected rate
is 1 per 30 days, so about 0.6 are expected in 18 quiet days."""

PAIRS_HI = (0.002, 0.005, 0.01, 0.02, 0.05)
PAIRS_RATIO = (1, 3, 10, 30)  # contamination_graded / contamination; 1 = the plain flag


def sweep_levels(base: MonitorConfig, sets: list[str], kinds: list[str], seeds: int, scales) -> str:
    """Expected first-window pages of the private alarm (its derived threshold and noise,
    computed, not replayed) for each (contamination, contamination_graded) pair, summed over
    data sets, kinds and seeds; with the exact detector at the best level per set beside it."""
    from monitor.alarm.calibrate import _tail, baseline_rate_error, false_page_threshold, graded_weights
    from monitor.data.anomalies import apply_recipe, draw_recipe

    a = base.alarm
    size = base.window.size_seconds
    warm = int(math.ceil(a.baseline_warmup_seconds / size))
    z = 3.69  # one window in 8,640 (30 days) above it, Gaussian
    pairs = [(hi, hi * r) for hi in PAIRS_HI for r in PAIRS_RATIO if hi * r < 0.5]
    total = {(p, sc): 0.0 for p in pairs for sc in scales}
    exact_best = {sc: 0.0 for sc in scales}
    for name in sets:
        for seed in range(1, seeds + 1):
            R, T, A, bounds = load_set(name, seed)
            with tempfile.TemporaryDirectory() as tmp:
                config = make_config(base, bounds, Path(tmp) / "unused.sqlite")
            model = fit_model(config, R, seed)
            s_norm = model.score_samples(T)
            rng = np.random.default_rng(seed)
            for kind in kinds:
                if kind == "rows":
                    s_anom = model.score_samples(A)
                else:
                    rows = T[rng.integers(T.shape[0], size=(6, 200))]
                    stats = RowTraffic(T, None, bounds, people=10).stats
                    s_anom = np.concatenate([model.score_samples(apply_recipe(draw_recipe(kind, stats, rng), r, stats, rng))
                                             for r in rows])
                levels = np.quantile(s_norm, 1.0 - np.array(LEVELS))
                for sc in scales:
                    people, share = sc
                    n, k = float(people), share * people
                    best = 0.0
                    for t in levels:
                        pn, qa = float((s_norm > t).mean()), float((s_anom > t).mean())
                        sd = math.sqrt(k * qa * (1 - qa) + (n - k) * pn * (1 - pn))
                        C = z * math.sqrt(n * pn * (1 - pn))
                        best = max(best, float(_tail(C - k * (qa - pn), sd, 1e-9, 1e-9)) if sd > 0 else float(k * (qa - pn) >= C))
                    exact_best[sc] += 6 * best
                    for hi, lo in pairs:
                        t_hi = model.threshold_for(hi)
                        t_lo = model.threshold_for(lo) if lo > hi else t_hi
                        wn, wa = graded_weights(s_norm, t_lo, t_hi), graded_weights(s_anom, t_lo, t_hi)
                        tau = float(wn.mean())
                        kappa = float((wn ** 2).mean() / tau) if tau > 0 else 1.0
                        err = baseline_rate_error(tau, n, warm, a.epsilon_baseline_warmup, a.epsilon_baseline_events,
                                                  min(a.baseline_flag_cap, warm), warm)
                        thr = false_page_threshold(rate=tau, events=n, rate_error=err, epsilon_threshold=a.epsilon_threshold,
                                                   epsilon_page=a.epsilon_page, false_pages_per_30_days=a.false_pages_per_30_days,
                                                   window_seconds=size, kappa=kappa, swing=a.traffic_swing)
                        mean = k * (float(wa.mean()) - tau)
                        sd = math.sqrt(k * float(wa.var()) + (n - k) * float(wn.var()))
                        total[((hi, lo), sc)] += 6 * _tail(round(thr - mean, 6), round(sd, 6), 1 / a.epsilon_page, 1 / a.epsilon_threshold)
    lines = ["| contamination | contamination_graded | " + " | ".join(f"{p:,}/{s:.0%}: expected pages" for p, s in scales) + " |",
             "|---|---|" + "---|" * len(scales)]
    for hi, lo in pairs:
        lines.append(f"| {hi:g} | {'-' if lo == hi else f'{lo:g}'} | " + " | ".join(f"{total[((hi, lo), sc)]:.1f}" for sc in scales) + " |")
    lines.append("| exact, best level per set | | " + " | ".join(f"{exact_best[sc]:.1f}" for sc in scales) + " |")
    return "\n".join(lines)


def summarise(results: list[dict], contamination: float) -> str:
    j_same = LEVELS.index(contamination) if contamination in LEVELS else int(np.argmin(np.abs(np.array(LEVELS) - contamination)))
    with_knn = all("exact_knn_first" in r for r in results)
    knn_head = "exact kNN scores, best one level | private / exact kNN scores | " if with_knn else ""
    lines = ["| scale | kinds | surges | private, paged in window 1 | exact, same level | exact, best one level | "
             "exact, best level per set | private / best one level | private / best per set | " + knn_head
             + "false pages (quiet days) | epsilon of a day without a page (max) |",
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if with_knn else "")]
    kinds_all = sorted({r["kind"] for r in results})
    groups = [("rows", ["rows"])] if "rows" in kinds_all else []
    synthetic = [k for k in kinds_all if k != "rows"]
    if synthetic:
        groups += [("simulated kinds", synthetic), ("all", kinds_all)]
    for people, share in sorted({(r["people"], r["share"]) for r in results}):
        for label, kinds in groups:
            rs = [r for r in results if r["people"] == people and r["share"] == share and r["kind"] in kinds]
            surges = sum(r["surges"] for r in rs)
            priv = sum(r["private_first"] for r in rs)
            same = sum(r["exact_first"][j_same] for r in rs)
            by_set: dict[str, np.ndarray] = {}
            for r in rs:
                key = f"{r['set']}/{r['kind']}"
                by_set[key] = by_set.get(key, 0) + np.array(r["exact_first"])
            best_each = int(sum(v.max() for v in by_set.values()))
            best_one = int(max(sum(by_set.values())))
            knn_cells = ""
            if with_knn:
                knn_one = int(max(sum(np.array(r["exact_knn_first"]) for r in rs)))
                knn_cells = f"{knn_one} | {priv / max(knn_one, 1):.2f} | "
            quiet = [r for r in rs if "false_pages" in r]
            fp = sum(r["false_pages"] for r in quiet)
            qe = max((r["quiet_day_epsilon"] for r in quiet if r["false_pages"] == 0), default=float("nan"))
            # What the pages average to (each surge's and quiet window's chance), where the results say.
            expected = (f" ({sum(r['private_first_expected'] for r in rs):.1f} expected)"
                        if all("private_first_expected" in r for r in rs) else "")
            quiet_expected = (f" ({sum(r['expected_false_pages'] for r in quiet):.2f} expected)"
                              if all("expected_false_pages" in r for r in quiet) else "")
            lines.append(f"| {people:,} people, {share:.0%} surges | {label} | {surges} | {priv}{expected} | {same} | {best_one} | "
                         f"{best_each} | {priv / max(best_one, 1):.2f} | {priv / max(best_each, 1):.2f} | {knn_cells}"
                         f"{fp} in {len(quiet)} days{quiet_expected} | {qe:.2f} |")
    lines += ["", "Per data set (both scales, all seeds): the real flagged share of normal traffic at alarm.contamination "
              f"({contamination:g}) over the configured rate, and first-window pages, private / exact at the set's best level:", "",
              "| data set | kind | flagged share / configured | private | exact, best level | best level |"
              + (" exact kNN scores, best level |" if with_knn else ""), "|---|---|---|---|---|---|" + ("---|" if with_knn else "")]
    for key in sorted({(r["set"], r["kind"]) for r in results}):
        rs = [r for r in results if (r["set"], r["kind"]) == key]
        ex = sum(np.array(r["exact_first"]) for r in rs)
        fs = [r["flagged_share"] / contamination for r in rs]
        lines.append(f"| {key[0]} | {key[1]} | {min(fs):.2f} to {max(fs):.2f} | {sum(r['private_first'] for r in rs)} | "
                     f"{int(ex.max())} | {LEVELS[int(np.argmax(ex))]:g} |"
                     + (f" {int(sum(np.array(r['exact_knn_first']) for r in rs).max())} |" if with_knn else ""))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=1, help="seeds run from this one (more seeds in another process)")
    ap.add_argument("--sets", nargs="*", help="data sets (default: every set with at least 3,000 rows)")
    ap.add_argument("--scales", nargs="*", default=None, help="people:share, e.g. 1500:0.05 10000:0.01")
    ap.add_argument("--kinds", nargs="*", default=["rows"], help="anomaly kinds: rows (the set's outliers) and/or "
                    "subtle_shift stuck_sensor correlated_drift far_outlier")
    ap.add_argument("--config", default=str(REPO / "config.yaml"))
    ap.add_argument("--legacy", action="store_true", help="the alarm before graded weights, for comparison: the plain flag at "
                    "alarm.contamination and the absolute threshold 21 + 1 sd + 10 %% of the expected count")
    ap.add_argument("--kappa", choices=("model", "traffic"), default="model", help="the threshold's kappa: the model's "
                    "calibration (shipped) or the traffic's own E[w^2] / E[w] (a diagnostic oracle; not with --write)")
    ap.add_argument("--sweep", action="store_true", help="choose the two levels: expected pages per pair (computed)")
    ap.add_argument("--json", type=Path, help="write every result here")
    ap.add_argument("--from-json", type=Path, help="summarise (and --write) results saved with --json, without running")
    ap.add_argument("--command", help="with --from-json: the command that produced them, for docs/benchmarks/alarm-real.md")
    ap.add_argument("--seconds", type=float, help="with --from-json: how long that run took")
    ap.add_argument("--write", action="store_true", help="write the section of docs/benchmarks/alarm-real.md")
    args = ap.parse_args()
    if args.kappa == "traffic" and args.write:
        ap.error("--kappa traffic is a diagnostic: it writes no section")
    base = load_config(args.config)
    if args.legacy:
        data = base.model_dump(mode="json")
        data["alarm"].update(threshold=21.0, z=1.0, rate_margin=0.1, contamination_graded=None)
        base = MonitorConfig.model_validate(data)
    sets = args.sets or datasets()
    scales = [(int(s.split(":")[0]), float(s.split(":")[1])) for s in args.scales] if args.scales else SCALES
    if args.sweep:
        t0 = time.perf_counter()
        table = sweep_levels(base, sets, args.kinds, args.seeds, scales)
        print(table)
        if args.write:
            write_run("alarm-real-levels", "Choosing the alarm's two levels", table, time.perf_counter() - t0,
                      one_core=False)
        return
    results = []
    t0 = time.perf_counter()
    if args.from_json:
        results = json.loads(args.from_json.read_text())
    for people, share in ([] if args.from_json else scales):
        for name in sets:
            for kind in args.kinds:
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    # Quiet days do not depend on the anomaly kind: one per set, seed and scale.
                    r = run_one(base, name, people, share, seed, quiet=kind == args.kinds[0], kind=kind,
                                traffic_kappa=args.kappa == "traffic")
                    results.append(r)
                    print(f"{people:>6} {share:.2f} {name:16s} {kind:16s} seed {seed}: private {r['private_first']}/{r['surges']} "
                          f"({r['private_first_expected']:.2f} expected), "
                          f"exact same {r['exact_first'][LEVELS.index(0.01)]}, best {max(r['exact_first'])}, "
                          f"exact kNN best {max(r['exact_knn_first'])}, "
                          f"false {r.get('false_pages')}, flagged share {r['flagged_share']:.4f}, quiet eps "
                          f"{r.get('quiet_day_epsilon', float('nan')):.2f}, T {r.get('quiet_threshold')}, "
                          f"{sum(r['seconds']):.0f} s", flush=True)
    table = summarise(results, base.alarm.contamination)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.write:
        took = args.seconds if args.seconds is not None else time.perf_counter() - t0
        write_run("alarm-real-legacy" if args.legacy else "alarm-real",
                  "Surge alarm on real labelled data" + (" - the alarm before it (--legacy)" if args.legacy else ""),
                  f"{PREFACE}\n\n{table}", took, args.command)


if __name__ == "__main__":
    main()
