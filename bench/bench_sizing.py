"""`monitor budget --anomalies FILE` against a replay: does a surge of the share it states page in its first window?

For each shared set (fitted and replayed as in ``bench_alarm_real.py``: half the inliers fit the
model with the shipped ``config.yaml``, the rest is the normal traffic, the outliers are the
anomalies file), a quiet day through the releaser gives the baseline in use; the budget's
visibility with the outliers as the anomalies file states the smallest surge share that pages
within one window 95 % of the time at that traffic. Then two more days of the same traffic with
surges of that share, and of half of it, made of those outliers: how many page in their first
window (drawn, and expected from each surge's own statistic and the run's noise).

    OMP_NUM_THREADS=1 python bench/bench_sizing.py            # writes the `alarm-sizing` section of docs/benchmarks/alarm-real.md
    OMP_NUM_THREADS=1 python bench/bench_sizing.py --no-write
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_alarm_real import chances_by_window, fit_set, fresh_releaser, page_chances  # noqa: E402
from report import REPO, write_section  # noqa: E402

from monitor.budget.plan import visibility_report  # noqa: E402
from monitor.config import load_config  # noqa: E402
from monitor.data.traffic import RowTraffic, plan_surges  # noqa: E402
from monitor.pipeline.windows import ClosedWindow  # noqa: E402

SURGES_PER_DAY = 6


def replay(config, cached, traffic, surges, seed):
    """Every window through a fresh releaser: (states, each window's chance of paging, last record)."""
    size = config.window.size_seconds
    window = [0]
    states, last = [], None
    with fresh_releaser(config, cached, seed) as (releaser, _), page_chances(window) as chances:
        for i in range(traffic.n_windows):
            X, entities, _ = traffic.window(i, surges)
            w = ClosedWindow(i * size, (i + 1) * size, X, np.zeros(0, bool), (), tuple(entities))
            window[0] = i
            last = json.loads(releaser.release(w, released_at=(i + 1) * size).entry.payload)
            states.append(last["alarm_detail"]["state"])
    return states, chances_by_window(chances, len(states)), last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["30_satellite", "32_shuttle", "6_cardio"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--people", type=int, default=1_500)
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    base = load_config(REPO / "config.yaml")
    rows = []
    for name in args.sets:
        config, model, cached, T, A, bounds, *_ = fit_set(base, name, args.seed)
        size = config.window.size_seconds
        wpd = int(round(86400 / size))
        warm = int(np.ceil(config.alarm.baseline_warmup_seconds / size))
        quiet = RowTraffic(T, A, bounds, people=args.people, days=1, window_seconds=size, seed=args.seed * 7)
        _, _, record = replay(config, cached, quiet, [], args.seed * 101)
        vis = visibility_report(config, record, model=model, anomalies=(A, None, name))
        share = vis.get("smallest_surge_share", vis["at"][0]["smallest_surge_share"])  # the share it states
        sight = vis["sight"]
        found = [name, f"{100 * sight['full_share']:.0f} %", f"{sight['mean_weight']:.2f}", f"{100 * share:.2g} %"]
        for k, at in enumerate((share, share / 2)):
            traffic = RowTraffic(T, A, bounds, people=args.people, days=args.days, window_seconds=size,
                                 seed=args.seed * 7 + 1)
            surges = plan_surges(args.days, SURGES_PER_DAY, wpd, min(at, 1.0), rng=args.seed * 13 + k, kinds=("rows",),
                                 first=warm + 1, anytime=True)
            states, chance, _ = replay(config, cached, traffic, surges, args.seed * 101 + 1)
            for part in ([s for s in surges if s.start < wpd], [s for s in surges if s.start >= 2 * wpd]):
                paged = sum(states[s.start] == "fired" for s in part)
                expected = float(sum(chance[s.start] for s in part))
                found.append(f"{paged} of {len(part)} ({expected / max(len(part), 1):.2f})")
        rows.append("| " + " | ".join(found) + " |")
        print(rows[-1], flush=True)
    markdown = f"""### Sizing from a file of anomalies (`monitor budget --anomalies`)

`OMP_NUM_THREADS=1 python bench/bench_sizing.py` (seed {args.seed}, {args.people:,} people, stationary traffic): the
share `monitor budget --anomalies` states for each set's outliers at the traffic of the baseline in use after a quiet
day (it pages within one window 95 % of the time, it says), then {args.days} days of the same traffic with
{SURGES_PER_DAY} surges a day of that share, and of half of it, made of those outliers. Paged in window 1: drawn, and
in brackets the mean chance from each surge's own statistic and the run's noise; the first day (the alarm follows the
last hours' trend) apart from the days from the third on (it compares with the same hours of the two days before),
where the stated share is derived.

| set | outliers weighed fully | their mean weight | stated share | that share, first day | that share, from the third day | half of it, first day | half of it, from the third day |
|---|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}
"""
    print(markdown)
    if not args.no_write:
        write_section("alarm-sizing", markdown)


if __name__ == "__main__":
    main()
