"""What a restart costs the alarm on rhythmic traffic, and what rebuilding the reference's history saves.

The rhythm reference keeps about two days of each person's weights in memory; a restart loses
them, and the alarm compares with the plain baseline, then the first day's trend, and with the
days before only once a day has passed. ``WindowReleaser.rebuild`` learns that history again
from the windows already released (their events re-read), charging nothing.

Shared sets replayed as in ``bench_alarm_rhythm.py`` (half the inliers fit the model, the rest
is the normal traffic, a daily wave, the shipped ``config.yaml``, seeded noise), 4 days of which
the restart falls at day 2, 06:00: a new ``WindowReleaser`` on the same ledger, as ``monitor run``
after a stop. Three runs of the same events and surges: no restart, a restart that loses the
history, a restart that rebuilds it. From the restart on: the quiet run's expected false pages
(each quiet window's chance of paging under the run's noise, summed: far less spread than the
pages drawn) and the surge run's expected first-window pages, with the pages drawn beside them.

    OMP_NUM_THREADS=1 python bench/bench_restart.py            # writes the `alarm-restart` section of docs/benchmarks/alarm-rhythm.md
    OMP_NUM_THREADS=1 python bench/bench_restart.py --no-write
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_alarm_real import chances_by_window, fresh_releaser, page_chances  # noqa: E402
from bench_alarm_rhythm import SURGES_PER_DAY, fit_set, parse_rhythm  # noqa: E402
from report import REPO, write_section  # noqa: E402

from monitor.config import load_config  # noqa: E402
from monitor.data.traffic import RowTraffic, plan_surges  # noqa: E402
from monitor.pipeline.windows import ClosedWindow  # noqa: E402
from monitor.release import WindowReleaser  # noqa: E402

DAYS = 4
RESTART_HOUR = 2 * 24 + 6
VARIANTS = ("no restart", "restart, history lost", "restart, history rebuilt")


def run(config, cached, traffic, surges, seed: int, variant: str, restart_at: int) -> dict:
    size = config.window.size_seconds
    window = [0]
    states = []
    with fresh_releaser(config, cached, seed) as (releaser, accountant), page_chances(window) as chances:
        seen: list[ClosedWindow] = []
        for i in range(traffic.n_windows):
            if i == restart_at and variant != "no restart":
                releaser = WindowReleaser(config, accountant, cached, rng=seed + 1)
                if variant == "restart, history rebuilt":
                    reach = releaser.reference.reach_windows
                    releaser.rebuild(seen[-reach:])
            X, entities, _ = traffic.window(i, surges)
            w = ClosedWindow(i * size, (i + 1) * size, X, np.zeros(0, bool), (), tuple(entities))
            seen.append(w)
            window[0] = i
            states.append(json.loads(releaser.release(w, released_at=(i + 1) * size).entry.payload)["alarm_detail"]["state"])
    return {"states": states, "chance_at": chances_by_window(chances, len(states))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["30_satellite", "32_shuttle"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--people", type=int, default=1_500)
    parser.add_argument("--share", type=float, default=0.05)
    parser.add_argument("--rhythm", default="wave 0.5")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    base = load_config(REPO / "config.yaml")
    totals = {v: {"false": 0, "false_expected": 0.0, "first": 0, "first_expected": 0.0, "surges": 0, "suppressed": 0}
              for v in VARIANTS}
    quiet_days = 0.0
    for name in args.sets:
        for seed in args.seeds:
            config, cached, T, A, bounds, *_ = fit_set(base, name, seed)
            size = config.window.size_seconds
            wpd = int(round(86400 / size))
            restart_at = RESTART_HOUR * wpd // 24
            warm = int(np.ceil(config.alarm.baseline_warmup_seconds / size))
            for kind in ("quiet", "surge"):
                traffic_args = dict(people=args.people, days=DAYS, window_seconds=size, seed=seed * 7 + (kind == "quiet"),
                                    rhythm=parse_rhythm(args.rhythm))
                surges = (plan_surges(DAYS, SURGES_PER_DAY, wpd, args.share, rng=seed * 13 + 1, kinds=("rows",),
                                      first=warm + 1, anytime=True) if kind == "surge" else [])
                after = [s for s in surges if s.start >= restart_at]
                if kind == "quiet":
                    quiet_days += (DAYS * wpd - restart_at) / wpd
                for variant in VARIANTS:
                    # The same events for every variant: a fresh generator of the same seed.
                    traffic = RowTraffic(T, A, bounds, **traffic_args)
                    r = run(config, cached, traffic, surges, seed * 101 + (kind == "quiet"), variant, restart_at)
                    t = totals[variant]
                    t["suppressed"] += r["states"][restart_at:].count("suppressed")
                    if kind == "quiet":
                        t["false"] += r["states"][restart_at:].count("fired")
                        t["false_expected"] += float(r["chance_at"][restart_at:].sum())
                    else:
                        t["surges"] += len(after)
                        t["first"] += sum(r["states"][s.start] == "fired" for s in after)
                        t["first_expected"] += float(sum(r["chance_at"][s.start] for s in after))
                    print(name, seed, kind, variant, {k: round(v, 2) for k, v in t.items()}, flush=True)
    rows = [f"| {v} | {t['false']} | {t['false_expected'] * 30 / quiet_days:.2f} | {t['first']} of {t['surges']} | "
            f"{t['first_expected']:.1f} | {t['suppressed']} |" for v, t in totals.items()]
    markdown = f"""### A restart on rhythmic traffic

`OMP_NUM_THREADS=1 python bench/bench_restart.py` (sets {", ".join(args.sets)}; seeds {", ".join(map(str, args.seeds))};
{args.people:,} people, {args.rhythm}, surges of {args.share:.0%} {SURGES_PER_DAY} a day): {DAYS}-day runs through the releaser, the
restart at day 2, 06:00 (a new `WindowReleaser` on the same ledger). Counted from the restart on: {quiet_days:.1f} quiet days
and the surges after it. "Rebuilt": `WindowReleaser.rebuild` learns the reference's history again from the windows
already released before the first window after the restart (what `monitor run` does where the input topic still holds
them).

| | false pages drawn | expected false pages per 30 days | surges paged in window 1 | expected | windows suppressed |
|---|---:|---:|---:|---:|---:|
{chr(10).join(rows)}
"""
    print(markdown)
    if not args.no_write:
        write_section("alarm-restart", markdown)


if __name__ == "__main__":
    main()
