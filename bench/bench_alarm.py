"""Surge alarm benchmark: does it page on real surges, quickly, rarely falsely?

For each scenario (people online, surge share) it simulates ``--days`` days of 5-minute
windows (``monitor.data.traffic``: +-30 % daily swing, a slow drift of the normal rate,
6 surges a day of 3 windows, alternately clustered and spread), fits the model on the
bundled reference as ``monitor fit`` does, and feeds every window to the production
``WindowReleaser`` with the shipped ``config.yaml`` (seeded noise, a fresh ledger): the
same code ``monitor run`` and ``monitor replay`` call at each window close. The window
source is the only difference from ``monitor replay`` (see the replay check in
docs/benchmarks/alarm.md for the same result through the command itself).

Compared on the same windows, at the same false-page count:
- ``exact``: the same statistic without any noise (the limit);
- ``laplace+cusum``: per-window Laplace releases of the statistic at the private
  alarm's mean daily epsilon spread evenly over the day's windows, CUSUM on them;
- ``budget absorption``: w-event privacy (Kellaris et al. 2014), w = one day, same
  daily epsilon, an alarm when a published value exceeds a threshold.

Run: ``OMP_NUM_THREADS=1 python bench/bench_alarm.py --write`` (about 15 min; ``--quick``: 3 days;
``--reserve-sweep``: report.reserve_pages 1, 4, 6 and 8 over 10 seeds, about 15 min; ``--per-person``: what
capping each person's flagged windows per run would drop, under a minute).
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
from monitor.pipeline.windows import ClosedWindow  # noqa: E402

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
        states, thresholds, reports = [], [], 0
        t0 = time.perf_counter()
        for i in range(traffic.n_windows):
            X, entities, _ = traffic.window(i, surges)
            window = ClosedWindow(i * size, (i + 1) * size, X, np.zeros(0, bool), (), tuple(entities))
            rec = json.loads(releaser.release(window, released_at=(i + 1) * size).entry.payload)
            states.append(rec["alarm_detail"]["state"])
            thresholds.append(rec["alarm_detail"].get("threshold"))
            reports += rec["report"] is not None and "suppressed" not in rec["report"]
        seconds = time.perf_counter() - t0
        day = traffic.windows_per_day * size
        spans = ledger.span_charges()  # the alarm path: runs, pages, baselines

        def alarm_path(lo: float, hi: float) -> float:
            return math.fsum(eps for _, kind, s, e, eps, _ in spans if e > lo and s < hi)

        # Per UTC day (the runs' calendar), and the worst rolling day (any 24 h ending at a window's end).
        spent = [accountant.spent((d + 1) * day)[0] for d in range(days)]
        alarm_days = [alarm_path(d * day, (d + 1) * day) for d in range(days)]
        ends = [(i + 1) * size for i in range(traffic.windows_per_day, traffic.n_windows)]
        rolling_ledger = max((accountant.spent(t)[0] for t in ends), default=float("nan"))
        rolling_alarm = max((alarm_path(t - day, t) for t in ends), default=float("nan"))
        ledger.close()
    return {"states": states, "thresholds": thresholds, "truth": truth, "surges": surges, "seconds": seconds, "reports": reports,
            "ledger_per_day": spent, "alarm_per_day": alarm_days, "rolling_ledger_max": rolling_ledger,
            "rolling_alarm_max": rolling_alarm, "windows_per_day": traffic.windows_per_day}


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
    f = np.array([t["alarm_weight"] for t in result["truth"]], float)  # the alarm's own statistic: graded weights
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


def plot_day(result: dict, config, out: Path, day: int) -> None:
    """One simulated day: the true statistic a_i against its public threshold, surges shaded, pages marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    W = result["windows_per_day"]
    sl = slice(day * W, (day + 1) * W)
    f = np.array([t["alarm_weight"] for t in result["truth"]], float)[sl]
    n = np.array([t["events"] for t in result["truth"]], float)[sl]
    rate = f.sum() / n.sum()
    hours = np.arange(W) * config.window.size_seconds / 3600
    fig, ax = plt.subplots(figsize=(10, 3.6))
    ax.plot(hours, f - rate * n, lw=0.8, color="0.3", label="true excess weighted flags (never published)")
    thr = np.array([np.nan if t is None else t for t in result["thresholds"][sl]], float)
    ax.plot(hours, thr, color="tab:orange", label="threshold T_i (public: from the released baseline)")
    for s in result["surges"]:
        if day * W <= s.start < (day + 1) * W:
            h0 = (s.start - day * W) * config.window.size_seconds / 3600
            ax.axvspan(h0, h0 + s.windows * config.window.size_seconds / 3600, color="tab:red", alpha=0.15, lw=0)
    fired = [i - day * W for i, st in enumerate(result["states"]) if st == "fired" and day * W <= i < (day + 1) * W]
    ax.plot(hours[fired], (f - rate * n)[fired], "v", color="tab:red", label="page (private alarm)")
    ax.set_xlabel("hour of the day")
    ax.set_ylabel("events")
    ax.set_title("1,000 people, 5 % surges (shaded): the private alarm's pages", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _verdict(ok: bool) -> str:
    return "met" if ok else "**NOT met**"


def by_kind(result: dict, kind: str) -> tuple[float, float]:
    fired = np.array([s == "fired" for s in result["states"]])
    sel = [s for s in result["surges"] if s.kind == kind]
    return (float(np.mean([fired[s.start] for s in sel])), float(np.mean([fired[s.start] or fired[s.start + 1] for s in sel])))


def replay_check(days: int = 1, people: int = 1000, share: float = 0.05, seed: int = 11) -> str:
    """The same pipeline through the command itself: write events as JSON lines, run
    ``monitor replay`` in a subprocess (production noise), and read its alerts back."""
    import subprocess

    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        config = yaml.safe_load((REPO / "config.yaml").read_text())
        config["model"]["path"] = str(tmp / "model.json")
        config["budget"].update(ledger=str(tmp / "ledger.sqlite"), reference_ledger=str(tmp / "ref.sqlite"))
        (tmp / "config.yaml").write_text(yaml.safe_dump(config))
        subprocess.run([sys.executable, "-m", "monitor", "fit", "-c", str(tmp / "config.yaml"), "--reference",
                        str(REPO / "monitor/data/reference-vitals.csv")], check=True, capture_output=True)
        traffic = Traffic(people=people, days=days, seed=seed)
        surges = plan_surges(days, 6, traffic.windows_per_day, share, rng=seed + 1)
        t0 = 1_700_000_100.0
        size = traffic.window_seconds
        rng = np.random.default_rng(seed)
        lines = 0
        with open(tmp / "events.jsonl", "w") as f:
            for i in range(traffic.n_windows):
                X, entities, _ = traffic.window(i, surges)
                ts = t0 + i * size + rng.uniform(0, size - 1e-3, len(X))
                for x, e, t in zip(X, entities, ts):
                    f.write(json.dumps({"device_id": e, "ts": round(float(t), 3), **dict(zip(traffic.sim.feature_names, map(float, x)))}) + "\n")
                    lines += 1
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "monitor", "replay", "-c", str(tmp / "config.yaml"), "--input", str(tmp / "events.jsonl"),
                        "--start", str(t0), "--end", str(t0 + traffic.n_windows * size), "--output", str(tmp / "alerts.jsonl")],
                       check=True, capture_output=True)
        seconds = time.perf_counter() - start
        records = [json.loads(line) for line in (tmp / "alerts.jsonl").read_text().splitlines()]
    fired = np.array([r["alarm_detail"]["state"] == "fired" for r in records])
    warm = config["alarm"]["baseline_warmup_seconds"] / size
    live = [s for s in surges if s.start >= warm]
    d0, d1, false = _pages(fired, live, len(fired), config["alarm"]["hold_windows"])
    return (f"`monitor replay` itself ({days} day, {people:,} people, {len(live)} surges of {share:.0%} after the 3-hour warm-up, "
            f"{lines:,} events as JSON lines, production noise): {len(records)} alert records in window order, paged in "
            f"window 1 for {d0:.0%} of the surges and within 1 more for {d1:.0%}, {false} false page(s); "
            f"{seconds:.0f} s ({lines / seconds:,.0f} events/s), `python bench/bench_alarm.py --replay-check --write`.")


def reserve_sweep(reserves=(1, 4, 6, 8), seeds=range(1, 11), days: int = 10) -> str:
    """Pages before reports: 1,000 people, 5 % surges 6 times a day, per report.reserve_pages."""
    base = load_config(REPO / "config.yaml")
    model = fit_model(base)
    rows = []
    for reserve in reserves:
        config = base.model_copy(update={"report": base.report.model_copy(update={"reserve_pages": reserve})})
        w1, suppressed, hit, reports, pages, ledger, false = [], 0, 0, 0, 0, [], 0
        for seed in seeds:
            r = run_private(config, model, 1_000, 0.05, 6, days, seed)
            states = r["states"]
            fired = np.array([s == "fired" for s in states])
            d0, _, fp = _pages(fired, r["surges"], len(states), config.alarm.hold_windows)
            w1.append(d0)
            false += fp
            suppressed += states.count("suppressed")
            hit += sum(states[s.start] == "suppressed" for s in r["surges"])
            reports, pages = reports + r["reports"], pages + int(fired.sum())
            ledger.append(float(np.mean(r["ledger_per_day"])))
        n_surges = 6 * days * len(seeds)
        rows.append(f"| {reserve} | {np.mean(w1):.3f} (min {min(w1):.3f}) | {false} | {suppressed:,} | {hit} of {n_surges} "
                    f"| {reports} of {pages} ({reports / pages:.0%}) | {np.mean(ledger):.2f} |")
        print(rows[-1], flush=True)
    return f"""### Pages before reports (`report.reserve_pages`)

`OMP_NUM_THREADS=1 python bench/bench_alarm.py --reserve-sweep --write`: {len(seeds)} seeds x {days} days, 1,000 people,
5 % surges 6 times a day, `config.yaml` but for `report.reserve_pages` (a report only if the budget still pays a new run
and that many pages). A page's charge spans its run, so a rolling 24 hours on such days holds two days' pages; reports
released while there was room can leave none for the next page, and the alarm then says `suppressed`. Paged in window 1
counts every surge, those in the first day's 3-hour warm-up too (about 1 % of them in 10-day runs: none can page).

| reserve_pages | paged in window 1, mean over seeds | false pages | windows suppressed | surges met by a suppressed alarm | reports with pages | whole ledger per UTC day |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}
"""


def per_person(caps=(2, 3, 4, 6, 8, 12), days: int = 7, seed: int = 7) -> str:
    """Would charging pages only to the people they count (a cap of L flagged windows per
    person and run) pay less? What the cap would drop from the alarm's flagged counts."""
    config = load_config(REPO / "config.yaml")
    model = fit_model(config)
    a = config.alarm
    threshold = model.threshold_for(a.contamination)
    strict = model.threshold_for(a.contamination / 10)  # a 10 times rarer flag
    tau = a.contamination  # about the normal flagged rate
    rows, spread, rarer = [], [], []
    for people, share, _ in SCENARIOS[:2]:
        traffic = Traffic(people=people, days=days, window_seconds=config.window.size_seconds, seed=seed)
        surges = plan_surges(days, 6, traffic.windows_per_day, share, rng=seed + 1)
        W = traffic.windows_per_day
        # per cap: kept and all flags of surge anomalies, per surge window; of normal events, per quiet window
        surge = {L: [] for L in caps}
        quiet = {L: [] for L in caps}
        per_day: list[int] = []
        hits = np.zeros(2)  # surge anomalies: flagged at the strict threshold, all of them
        for day in range(days):
            flags: dict[str, int] = {}
            for i in range(day * W, (day + 1) * W):
                X, entities, anomalous = traffic.window(i, surges)
                scores = model.score_samples(X)
                flagged = scores > threshold
                hits += ((scores > strict) & anomalous).sum(), anomalous.sum()
                before = np.array([flags.get(e, 0) for e in entities])
                late = i % W >= 0.75 * W
                for L in caps:
                    kept = flagged & (before < L)
                    if anomalous.any():
                        surge[L].append(((kept & anomalous).sum(), (flagged & anomalous).sum()))
                    else:
                        quiet[L].append((kept.sum(), flagged.sum(), late))
                # only normal flags count towards the cap: surge flags would use it up faster (kinder to the cap)
                for e in np.asarray(entities)[flagged & ~anomalous]:
                    flags[e] = flags.get(e, 0) + 1
            per_day += list(flags.values())
        counts = np.array(per_day)
        spread.append(f"| {people:,} | {counts.size:,} | {counts.mean():.1f} | {np.percentile(counts, 99):.0f} | {counts.max()} |")
        shipped = np.array(surge[caps[0]])[:, 1].sum()  # every flag of a surge anomaly, before any cap
        rarer.append(f"{people:,} people: {hits[0] / hits[1]:.0%} of the surge anomalies, against {shipped / hits[1]:.0%} at the shipped flag")
        for L in caps:
            s, q = np.array(surge[L], float), np.array(quiet[L], float)
            late = q[q[:, 2] > 0]
            bound = min(a.epsilon_threshold + 6 * a.epsilon_page, tau * a.epsilon_threshold + (L + 6 * tau) * a.epsilon_page)
            rows.append(f"| {people:,} | {share:.0%} | {L} | {s[:, 0].sum() / s[:, 1].sum():.3f} (worst window "
                        f"{np.min(s[:, 0] / np.maximum(1, s[:, 1])):.2f}) | {q[:, 0].sum() / q[:, 1].sum():.3f} | "
                        f"{late[:, 0].sum() / late[:, 1].sum():.3f} | {bound:.2f} |")
        print("\n".join(rows[-len(caps):]), flush=True)
    return f"""### Charging a page only to the people it counts (per-person accounting)

`OMP_NUM_THREADS=1 python bench/bench_alarm.py --per-person --write` ({days} simulated days, seed {seed}, the shipped model
and `alarm.contamination` {a.contamination:g}; no noise: this counts what a cap would drop). docs/proofs/alarm-run.md#why-every-person-pays-for-every-page
has the argument: if each person's flagged windows in a run were capped at L, a run
would cost at most min(epsilon_threshold + c epsilon_page, tau epsilon_threshold + (L + c tau) epsilon_page) for c pages:
beyond the cap, a page adds only tau epsilon_page. It pays only if the cap drops few flags. Flagged windows per person and UTC day, normal events only, over the
person-days with at least one:

| people online | person-days | mean | 99th percentile | max |
|---|---|---|---|---|
{chr(10).join(spread)}

Share of the flags a cap of L per person and UTC day keeps, and the alarm path's bound on a day of 6 pages (the shipped
run pays {a.epsilon_threshold + 6 * a.epsilon_page:.2f} for them):

| people online | surge | L | surge anomalies' flags kept | normal flags kept, whole day | normal flags kept, last quarter of the day | alarm path bound, 6 pages |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

A 10 times rarer flag (`alarm.contamination` {a.contamination / 10:g}) would make flagged windows rarer, but it misses the
surges: it flags, at {"; at ".join(rarer)}.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="3 days, for a smoke run")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--write", action="store_true", help="write the docs/benchmarks/alarm.md section and the plot")
    ap.add_argument("--replay-check", action="store_true", help="only run one day through the `monitor replay` command")
    ap.add_argument("--reserve-sweep", action="store_true", help="only compare report.reserve_pages (10 seeds x 10 days)")
    ap.add_argument("--per-person", action="store_true", help="only measure what a per-person flag cap would drop (7 days)")
    args = ap.parse_args()
    # the single-measurement modes: (chosen, section of docs/benchmarks/alarm.md, what writes it)
    modes = ((args.per_person, "alarm-per-person", per_person), (args.reserve_sweep, "alarm-reserve", reserve_sweep),
             (args.replay_check, "alarm-replay", lambda: "### Through `monitor replay`\n\n" + replay_check()))
    for chosen, section, measure in modes:
        if chosen:
            text = measure()
            print(text)
            if args.write:
                write_section(section, text)
            return
    days = 3 if args.quick else args.days
    config = load_config(REPO / "config.yaml")
    model = fit_model(config)
    rows, kinds, comp, cost, goals = [], [], [], [], []
    results = {}
    for people, share, per_day in SCENARIOS:
        r = run_private(config, model, people, share, per_day, days, args.seed)
        results[(people, share)] = r
        fired = np.array([s == "fired" for s in r["states"]])
        d0, d1, false = _pages(fired, r["surges"], len(fired), config.alarm.hold_windows)
        alarm_day = np.array(r["alarm_per_day"])
        ledger_day = np.array(r["ledger_per_day"])
        if per_day:
            goals.append(f"- {people:,} people, {share:.0%} surges: paged within 1 window {d0:.1%} (goal 95 %: {_verdict(d0 >= 0.95)}); "
                         f"false pages {false * 30 / days:.1f} per 30 days (goal <= 1: {_verdict(false * 30 / days <= 1)}); whole ledger "
                         f"{ledger_day.mean():.2f} per UTC day with {per_day} surges (goal <= 2: {_verdict(ledger_day.max() <= 2)})")
        else:
            goals.append(f"- quiet days, {people:,} people: alarm path {alarm_day.mean():.2f} per UTC day (max {alarm_day.max():.2f}), "
                         f"{r['rolling_alarm_max']:.2f} in the worst rolling 24 h (goal <= 1 per day: {_verdict(alarm_day[1:].max() <= 1)} per UTC day after "
                         f"the first, which pays the warm-up estimate; {_verdict(r['rolling_alarm_max'] <= 1)} on rolling days); false pages "
                         f"{false * 30 / days:.1f} per 30 days")
        quiet_alarm = float(np.median(alarm_day))
        rows.append(f"| {people:,} | {share:.0%} x {per_day}/day | {len(r['surges'])} | {d0:.3f} | {d1:.3f} | {false} ({false * 30 / days:.1f} per 30 days) "
                    f"| {alarm_day.mean():.2f} (max {alarm_day.max():.2f}; rolling {r['rolling_alarm_max']:.2f}) "
                    f"| {ledger_day.mean():.2f} (max {ledger_day.max():.2f}; rolling {r['rolling_ledger_max']:.2f}) | {r['seconds']:.0f} s |")
        print(rows[-1], flush=True)
        if not per_day:
            continue
        for kind in ("clustered", "spread"):
            k0, k1 = by_kind(r, kind)
            kinds.append(f"| {people:,} | {share:.0%} | {kind} | {k0:.3f} | {k1:.3f} |")
        b = baselines(r, config, float(alarm_day.mean()), args.seed)
        ex = b["exact"]
        ratio = d1 / ex[1] if ex[1] else float("nan")
        goals.append(f"- {people:,} people, {share:.0%}: private / exact detector {ratio:.2f} (goal >= 0.9: {_verdict(ratio >= 0.9)})")
        comp.append(f"| {people:,} | {share:.0%} | {b['false_target']} | {d0:.3f} / {d1:.3f} | {ex[0]:.3f} / {ex[1]:.3f} "
                    f"| {ratio:.2f} | {b['laplace+cusum'][0]:.3f} / {b['laplace+cusum'][1]:.3f} "
                    f"| {b['budget absorption'][0]:.3f} / {b['budget absorption'][1]:.3f} |")
    a = config.alarm
    first = results[SCENARIOS[0][:2]]
    W = first["windows_per_day"]
    f = np.array([t["alarm_weight"] for t in first["truth"]], float)
    n = np.array([t["events"] for t in first["truth"]], float)
    rate0, rate1 = f[:W].sum() / n[:W].sum(), f[-W:].sum() / n[-W:].sum()
    figure = REPO / "docs" / "figures" / "alarm_day.png"
    if args.write:
        plot_day(results[SCENARIOS[1][:2]], config, figure, day=min(2, days - 1))
    text = f"""## Surge alarm

`OMP_NUM_THREADS=1 python bench/bench_alarm.py --write` ({days} simulated days of 5-minute windows, seed {args.seed}).
The shipped `config.yaml` as is: alarm runs on the UTC-day calendar (a run's threshold costs epsilon {a.epsilon_threshold:g}; a quiet run goes on past midnight, one that paged ends there), epsilon {a.epsilon_page:g} per page, quiet windows free;
graded weights between the levels {a.contamination_graded:g} and {a.contamination:g} of normal events exceed (at 10,000 people, with `alarm.levels_follow_fleet`, at a fifth of both levels; the exact detector then counts that weight), each window against the same people's recent and day-old windows (`alarm.follow_rhythm`), the threshold from {a.false_pages_per_30_days:g} false page per 30 days at the released traffic, hold {a.hold_windows} windows, daily baseline (epsilon {config.baseline_cost()[0]:g}),
a detailed report (epsilon {config.report_cost()[0]:.2f}) with every page the budget leaves room for (a new run and {config.report.reserve_pages} more pages). Traffic: +-30 % daily swing in people online, activity drifting up 8 % per 30 days (normal mean weight {rate0:.2%} on day 1, {rate1:.2%} on the last day, 10,000 people),
surges of 3 windows each, alternately clustered and spread. Every window went through the production
`WindowReleaser` (model, baseline, alarm, reports, ledger charges), as `monitor run` and `monitor replay` do.
"Paged in window 1": the page came at the close of the surge's first window; "within 1 more": at the latest at the close
of its second. A false page is one outside a surge and its hold. Epsilon per day: the mean and the max over UTC days
(the runs' calendar), and the worst rolling 24 hours (what the budget checks; a rolling day that straddles the end of a run that paged overlaps two runs).
A page is charged over its run's whole span (its noise covers every window the run answered), and a quiet run goes on
for days: one page, false or not, adds 0.5 to every day of the run that gave it.
Figure: `docs/figures/alarm_day.png` (one day of the 1,000-people scenario: the statistic, the public threshold, the
surges and the pages).

| people online | surge | surges | paged in window 1 | within 1 more | false pages | alarm path epsilon per day | whole ledger epsilon per day | time |
|---|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + """

Goals:

""" + "\n".join(goals) + """

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
