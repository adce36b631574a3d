"""Surge alarm benchmark (issue 10): does it page on real surges, quickly, rarely falsely?

For each scenario (people online, surge share) it simulates ``--days`` days of 5-minute
windows (``monitor.data.traffic``: +-30 % daily swing, a slow drift of the normal rate,
6 surges a day of 3 windows, alternately clustered and spread), fits the model on the
bundled reference as ``monitor fit`` does, and feeds every window to the production
``WindowReleaser`` with the shipped ``config.yaml`` (seeded noise, a fresh ledger): the
same code ``monitor run`` and ``monitor replay`` call at each window close. The window
source is the only difference from ``monitor replay`` (see the replay check in
BENCHMARKS.md for the same result through the command itself).

Compared on the same windows, at the same false-page count:
- ``exact``: the same statistic without any noise (the limit);
- ``laplace+cusum``: per-window Laplace releases of the statistic at the private
  alarm's mean daily epsilon spread evenly over the day's windows, CUSUM on them;
- ``budget absorption``: w-event privacy (Kellaris et al. 2014), w = one day, same
  daily epsilon, an alarm when a published value exceeds a threshold.

Run: ``OMP_NUM_THREADS=1 python bench/bench_alarm.py --write`` (about 15 min; ``--quick``: 3 days).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import REPO, write_section  # noqa: E402

from monitor.budget import BudgetAccountant, WindowLedger  # noqa: E402
from monitor.config import load_config  # noqa: E402
from monitor.data.traffic import Traffic, plan_surges  # noqa: E402
from monitor.model import GridKNN  # noqa: E402
from monitor.release import WindowReleaser  # noqa: E402
from monitor.stream.windows import ClosedWindow  # noqa: E402

# (people online, surge share, surges per day); the last one measures quiet days.
SCENARIOS = [(10_000, 0.01, 6), (1_000, 0.05, 6), (1_000, 0.0, 0)]


def fit_model(config) -> GridKNN:
    X = np.loadtxt(REPO / "monitor/data/reference-vitals.csv", delimiter=",", skiprows=1)
    return GridKNN(epsilon=config.model.epsilon, bounds=config.bounds, contamination=config.model.contamination,
                   random_state=0, feature_names=config.feature_names).fit(X)


def run_private(config, model, people: int, share: float, per_day: int, days: int, seed: int) -> dict:
    traffic = Traffic(people=people, days=days, window_seconds=config.window.size_seconds, seed=seed)
    surges = plan_surges(days, per_day, traffic.windows_per_day, share, rng=seed + 1)
    truth: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        ledger = WindowLedger(Path(tmp) / "ledger.sqlite")
        b = config.budget
        accountant = BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant)
        releaser = WindowReleaser(config, accountant, model, rng=seed + 2, audit=lambda w, t: truth.append(t))
        size = config.window.size_seconds
        states, reports = [], 0
        t0 = time.perf_counter()
        for i in range(traffic.n_windows):
            X, entities, _ = traffic.window(i, surges)
            window = ClosedWindow(i * size, (i + 1) * size, X, np.zeros(0, bool), (), tuple(entities))
            rec = json.loads(releaser.release(window, released_at=(i + 1) * size).entry.payload)
            states.append(rec["alarm_detail"]["state"])
            reports += rec["report"] is not None and "suppressed" not in rec["report"]
        seconds = time.perf_counter() - t0
        day = traffic.windows_per_day * size
        spent = [accountant.spent((d + 1) * day)[0] for d in range(days)]
        spans = ledger.span_charges()
        alarm_path = []
        for d in range(days):
            lo, hi = d * day, (d + 1) * day
            alarm_path.append(math.fsum(eps for _, kind, s, e, eps, _ in spans if e > lo and s < hi))
        ledger.close()
    return {"states": states, "truth": truth, "surges": surges, "seconds": seconds, "reports": reports,
            "ledger_per_day": spent, "alarm_per_day": alarm_path, "windows_per_day": traffic.windows_per_day}


def _pages(fired: np.ndarray, surges, n: int, hold: int) -> tuple[float, float, int]:
    """(share paged in the surge's first window, share paged within one more, false pages)."""
    in_surge = np.zeros(n, bool)
    for s in surges:
        in_surge[s.start: s.start + s.windows + hold] = True
    d0 = np.mean([fired[s.start] for s in surges]) if surges else float("nan")
    d1 = np.mean([fired[s.start] or fired[s.start + 1] for s in surges]) if surges else float("nan")
    return float(d0), float(d1), int(np.count_nonzero(fired & ~in_surge))


def _with_hold(above: np.ndarray, hold: int) -> np.ndarray:
    fired = np.zeros(above.size, bool)
    i = 0
    while i < above.size:
        if above[i]:
            fired[i] = True
            i += 1 + hold
        else:
            i += 1
    return fired


def _calibrate(score: np.ndarray, surges, hold: int, false_target: int) -> tuple[np.ndarray, float]:
    """The lowest threshold whose false pages do not exceed ``false_target``."""
    n = score.size
    lo, hi = float(np.min(score)), float(np.max(score)) + 1
    for _ in range(50):
        mid = (lo + hi) / 2
        fired = _with_hold(score >= mid, hold)
        if _pages(fired, surges, n, hold)[2] > false_target:
            lo = mid
        else:
            hi = mid
    return _with_hold(score >= hi, hold), hi


def baselines(result: dict, config, daily_epsilon: float, seed: int) -> dict:
    """Exact, Laplace+CUSUM and budget-absorption detectors on the same windows."""
    rng = np.random.default_rng(seed)
    f = np.array([t["alarm_flagged"] for t in result["truth"]], float)
    n = np.array([t["events"] for t in result["truth"]], float)
    W = result["windows_per_day"]
    hold = config.alarm.hold_windows
    surges = result["surges"]
    # tau: the exact flagged rate of the previous day (the private alarm's schedule, no noise).
    tau = np.empty_like(f)
    for d in range(len(f) // W):
        sl = slice(max(0, d - 1) * W, max(1, d) * W)
        tau[d * W:(d + 1) * W] = f[sl].sum() / max(1.0, n[sl].sum())
    a = f - tau * n
    private = np.array([s in ("fired",) for s in result["states"]])
    false_target = _pages(private, surges, len(f), hold)[2]
    out = {"false_target": false_target}
    fired, _ = _calibrate(a, surges, hold, false_target)
    out["exact"] = _pages(fired, surges, len(f), hold)
    # Per-window Laplace at the same daily epsilon, CUSUM (k = half a 1 % surge of the smaller scenario).
    eps_w = daily_epsilon / W
    x = a + rng.laplace(0, 1 / eps_w, a.size)
    k = 5.0
    s = np.zeros_like(x)
    for i in range(1, x.size):
        s[i] = max(0.0, s[i - 1] + x[i] - k)
    fired, _ = _calibrate(s, surges, hold, false_target)
    out["laplace+cusum"] = _pages(fired, surges, len(f), hold)
    # Budget absorption (Kellaris et al. 2014, BA), w = one day: half of eps/w per window
    # tests dissimilarity, the other half is absorbed by publications.
    eps_half = daily_epsilon / (2 * W)
    last, published = 0.0, np.zeros_like(a)
    saved, skip = 0, 0
    for i in range(a.size):
        saved += 1
        if skip:
            skip -= 1
            published[i] = last
            continue
        dis = abs(a[i] - last) + rng.laplace(0, 1 / eps_half)
        budget = eps_half * min(saved, W)
        if dis > 1 / budget:
            last = a[i] + rng.laplace(0, 1 / budget)
            skip, saved = min(saved, W) - 1, 0
        published[i] = last
    fired, _ = _calibrate(published, surges, hold, false_target)
    out["budget absorption"] = _pages(fired, surges, len(f), hold)
    return out


def by_kind(result: dict, kind: str) -> tuple[float, float]:
    fired = np.array([s == "fired" for s in result["states"]])
    sel = [s for s in result["surges"] if s.kind == kind]
    return (float(np.mean([fired[s.start] for s in sel])), float(np.mean([fired[s.start] or fired[s.start + 1] for s in sel])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="3 days, for a smoke run")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--write", action="store_true", help="write the BENCHMARKS.md section and the plot")
    args = ap.parse_args()
    days = 3 if args.quick else args.days
    config = load_config(REPO / "config.yaml")
    model = fit_model(config)
    rows, kinds, comp, cost = [], [], [], []
    results = {}
    for people, share, per_day in SCENARIOS:
        r = run_private(config, model, people, share, per_day, days, args.seed)
        results[(people, share)] = r
        fired = np.array([s == "fired" for s in r["states"]])
        d0, d1, false = _pages(fired, r["surges"], len(fired), config.alarm.hold_windows)
        alarm_day = np.array(r["alarm_per_day"])
        ledger_day = np.array(r["ledger_per_day"])
        quiet_alarm = float(np.median(alarm_day))
        rows.append(f"| {people:,} | {share:.0%} x {per_day}/day | {len(r['surges'])} | {d0:.3f} | {d1:.3f} | {false} ({false * 30 / days:.1f} per 30 days) "
                    f"| {alarm_day.mean():.2f} (max {alarm_day.max():.2f}) | {ledger_day.mean():.2f} (max {ledger_day.max():.2f}) | {r['seconds']:.0f} s |")
        print(rows[-1], flush=True)
        if not per_day:
            continue
        for kind in ("clustered", "spread"):
            k0, k1 = by_kind(r, kind)
            kinds.append(f"| {people:,} | {share:.0%} | {kind} | {k0:.3f} | {k1:.3f} |")
        b = baselines(r, config, float(alarm_day.mean()), args.seed)
        ex = b["exact"]
        comp.append(f"| {people:,} | {share:.0%} | {b['false_target']} | {d0:.3f} / {d1:.3f} | {ex[0]:.3f} / {ex[1]:.3f} "
                    f"| {d1 / ex[1] if ex[1] else float('nan'):.2f} | {b['laplace+cusum'][0]:.3f} / {b['laplace+cusum'][1]:.3f} "
                    f"| {b['budget absorption'][0]:.3f} / {b['budget absorption'][1]:.3f} |")
    a = config.alarm
    first = results[SCENARIOS[0][:2]]
    W = first["windows_per_day"]
    f = np.array([t["alarm_flagged"] for t in first["truth"]], float)
    n = np.array([t["events"] for t in first["truth"]], float)
    rate0, rate1 = f[:W].sum() / n[:W].sum(), f[-W:].sum() / n[-W:].sum()
    text = f"""## Surge alarm (issue 10)

`OMP_NUM_THREADS=1 python bench/bench_alarm.py --write` ({days} simulated days of 5-minute windows, seed {args.seed}).
The shipped `config.yaml` as is: alarm runs of epsilon {a.run_epsilon:g} ({a.epsilon_threshold:g} threshold + {a.epsilon_queries:g} queries),
threshold {a.threshold:g} excess flagged events + {a.z:g} sd, hold {a.hold_windows} windows, daily baseline (epsilon {a.baseline_epsilon:g}),
a detailed report with every page. Traffic: +-30 % daily swing in people online, activity drifting up 8 % per 30 days (normal flagged rate {rate0:.2%} on day 1, {rate1:.2%} on the last day, 10,000 people),
surges of 3 windows each, alternately clustered and spread. Every window went through the production
`WindowReleaser` (model, baseline, alarm, reports, ledger charges), as `monitor run` and `monitor replay` do.
"Paged in window 1": the page came at the close of the surge's first window; "within 1 more": at the latest at the close
of its second. A false page is one outside a surge and its hold.

| people online | surge | surges | paged in window 1 | within 1 more | false pages | alarm path epsilon per day | whole ledger epsilon per day | time |
|---|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + """

By kind of surge:

| people online | surge | kind | paged in window 1 | within 1 more |
|---|---|---|---|---|
""" + "\n".join(kinds) + """

Against the exact (non-private) detector with the same statistic and the same number of false pages, and two
private alternatives at the alarm's mean daily epsilon (window 1 / within 1 more):

| people online | surge | false pages allowed | private alarm | exact (limit) | private / exact | per-window Laplace + CUSUM | budget absorption (w = 1 day) |
|---|---|---|---|---|---|---|---|
""" + "\n".join(comp) + "\n"
    print(text)
    if args.write:
        write_section("alarm", text)


if __name__ == "__main__":
    main()
