"""The figure of docs/alarm.md: two days of rhythmic traffic through the production WindowReleaser.

One shared set (``30_satellite`` by default) fitted and replayed as ``bench_alarm_rhythm.py`` does
(half its inliers fit the model with the shipped ``config.yaml``, the other half is the traffic),
1,500 people a window, a daily wave of 0.5 along the traffic's first principal component, the
usual +-30 % daily swing in people online, and 3 surges a day of 5 % of the people (3 windows
each, after the 3-hour warm-up). For every window it records the statistic the alarm asks about
and the bar it is compared with (each ``AboveThreshold.test_one`` call, as ``page_chances`` reads
it: a measurement, not a release) and the window's state, and plots them with the pages.

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=. python bench/figure_alarm_days.py`` (about 20 s on one core;
writes docs/figures/alarm_two_days.png; ``--set``, ``--people``, ``--rhythm``, ``--seed`` for others).
Needs matplotlib (``pip install matplotlib``), which the monitor itself does not use.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_alarm_real import fit_set, fresh_releaser, released_windows  # noqa: E402
from bench_alarm_rhythm import parse_rhythm  # noqa: E402
from report import REPO  # noqa: E402

from monitor.alarm.above_threshold import AboveThreshold  # noqa: E402
from monitor.alarm.units import RESOLUTION  # noqa: E402
from monitor.config import load_config  # noqa: E402
from monitor.data.traffic import RowTraffic, plan_surges  # noqa: E402


def record(set_name: str, people: int, share: float, rhythm: str, days: int, seed: int) -> dict:
    base = load_config(REPO / "config.yaml")
    config, model, cached, T, A, bounds, *_ = fit_set(base, set_name, seed)
    size = config.window.size_seconds
    wpd = int(round(86400 / size))
    warm = int(np.ceil(config.alarm.baseline_warmup_seconds / size))
    traffic = RowTraffic(T, A, bounds, people=people, days=days, window_seconds=size, swing=0.3,
                         seed=seed * 7, rhythm=parse_rhythm(rhythm))
    surges = plan_surges(days, 3, wpd, share, rng=seed * 13 + 1, kinds=("rows",), first=warm + 1, anytime=True)
    asked: dict[int, tuple[float, float]] = {}
    window = [0]
    ask = AboveThreshold.test_one

    def test_one(svt, query: int, threshold: int) -> bool:
        asked[window[0]] = (query / RESOLUTION, threshold / RESOLUTION)
        return ask(svt, query, threshold)

    AboveThreshold.test_one = test_one
    states, modes = [], []
    try:
        with fresh_releaser(config, cached, seed) as (releaser, _):
            for i, _X, _scores, rec in released_windows(releaser, cached, traffic, surges):
                window[0] = i + 1
                states.append(rec["alarm_detail"]["state"])
                modes.append(rec["alarm_detail"].get("compared_with"))
    finally:
        AboveThreshold.test_one = ask
    n = len(states)
    stat = np.full(n, np.nan)
    bar = np.full(n, np.nan)
    for i, (q, t) in asked.items():
        if i < n:
            stat[i], bar[i] = q, t
    return {"states": states, "modes": modes, "stat": stat, "bar": bar, "surges": surges, "size": size,
            "label": f"{set_name}, {people:,} people, {rhythm}, {len(surges)} surges of {share:.0%}"}


def plot(run: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = np.arange(len(run["states"])) * run["size"] / 3600
    fig, ax = plt.subplots(figsize=(11, 4.2), dpi=110)
    for s in run["surges"]:
        ax.axvspan(s.start * run["size"] / 3600, (s.start + s.windows) * run["size"] / 3600,
                   color="tab:orange", alpha=0.18, lw=0)
    ax.plot(hours, run["stat"], lw=0.8, color="tab:blue", label="statistic (excess weighted events)")
    ax.plot(hours, run["bar"], lw=1.2, color="black", label="threshold (before the run's noise)")
    fired = [i for i, s in enumerate(run["states"]) if s == "fired"]
    held = [i for i, s in enumerate(run["states"]) if s == "held"]
    top = np.nanmax(run["stat"]) if np.isfinite(run["stat"]).any() else 1.0
    ax.scatter(hours[fired], np.full(len(fired), top * 1.05), marker="v", color="tab:red", zorder=3, label="page")
    ax.scatter(hours[held], np.full(len(held), top * 1.05), marker="|", color="tab:red", alpha=0.5, zorder=3,
               label="held (no query)")
    ax.axvline(24, color="grey", ls=":", lw=1)
    ax.set_xlabel("hours since start (UTC); shaded: the surges' windows; dotted: the second day")
    ax.set_ylabel("weighted events")
    ax.set_xlim(0, hours[-1] + run["size"] / 3600)
    ax.set_title(run["label"], fontsize=10)
    ax.legend(loc="lower right", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", default="30_satellite")
    p.add_argument("--people", type=int, default=1500)
    p.add_argument("--share", type=float, default=0.05)
    p.add_argument("--rhythm", default="wave 0.5")
    p.add_argument("--days", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", type=Path, default=REPO / "docs" / "figures" / "alarm_two_days.png")
    args = p.parse_args()
    run = record(args.set, args.people, args.share, args.rhythm, args.days, args.seed)
    plot(run, args.output)
    fired = run["states"].count("fired")
    hit = sum(run["states"][s.start] == "fired" for s in run["surges"])
    print(f"{run['label']}: {fired} pages, {hit} of {len(run['surges'])} surges paged in their first window; "
          f"modes {sorted({m for m in run['modes'] if m})}; wrote {args.output}")


if __name__ == "__main__":
    main()
