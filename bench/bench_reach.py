"""What charging the rhythm reference's memory costs: each alarm run is charged from its first
window less the reach its queries read (about 2 days and 2 hours on the shipped config), so the
rolling period counts the runs of the days after it too (docs/budget.md, "What a run reads").

    OMP_NUM_THREADS=1 python bench/bench_reach.py            # writes the `budget-reach` section of docs/benchmarks/budget.md
    OMP_NUM_THREADS=1 python bench/bench_reach.py --no-write # print only

Each scenario streams days of simulated wearables through the real ``WindowReleaser`` with the
shipped ``config.yaml`` (seeded noise, a fresh ledger), once as shipped and once with every run
charged from its first window only (the charge before the fix, which undercounted), and reports
the worst rolling 24 hours of the ledger, the pages given, the windows the alarm had to suppress
and the runs that read less history because the budget could not pay for all of it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import REPO, write_section  # noqa: E402
from bench_alarm import _pages, fit_model  # noqa: E402

from monitor.budget import BudgetAccountant, WindowLedger  # noqa: E402
from monitor.budget.plan import plan_from_config  # noqa: E402
from monitor.config import load_config  # noqa: E402
from monitor.data.traffic import Traffic, plan_surges  # noqa: E402
from monitor.pipeline.windows import ClosedWindow  # noqa: E402
from monitor.release import WindowReleaser  # noqa: E402

# (name, people, surge share, surges per day, days, a restart each day at noon)
SCENARIOS = [("quiet", 1_000, 0.0, 0, 7, False), ("a surge a day", 1_000, 0.05, 1, 7, False),
             ("six surges a day", 1_000, 0.05, 6, 7, False), ("twelve surges a day", 1_000, 0.05, 12, 7, False),
             ("quiet, a restart a day", 1_000, 0.0, 0, 7, True), ("a surge a day, a restart a day", 1_000, 0.05, 1, 7, True),
             ("six surges a day, a restart a day", 1_000, 0.05, 6, 7, True)]


class _ChargedFromFirstWindow(WindowReleaser):
    """The charge before the fix: a run's span began at its first window, whatever it read."""

    def _run_start(self, window, cost):
        return window.start if self._fits(window, cost, kind="alarm_run") else None


class _NewRunAtEachRestart(WindowReleaser):
    """Before 2026-12-08: a restart ended the open run and charged a new one."""

    def _resumable_run(self, last_end):
        return None


def run(config, model, releaser_class, people: int, share: float, per_day: int, days: int, seed: int,
        restarts: bool = False) -> dict:
    traffic = Traffic(people=people, days=days, window_seconds=config.window.size_seconds, seed=seed)
    surges = plan_surges(days, per_day, traffic.windows_per_day, share, rng=seed + 1)
    size = config.window.size_seconds
    with tempfile.TemporaryDirectory() as tmp:
        ledger = WindowLedger(Path(tmp) / "ledger.sqlite")
        b = config.budget
        accountant = BudgetAccountant(ledger, b.epsilon, b.delta, b.period_seconds, b.accountant)
        releaser = releaser_class(config, accountant, model, rng=seed + 2)
        states, reaches, seen = [], [], []
        for i in range(traffic.n_windows):
            if restarts and i > traffic.windows_per_day and i % traffic.windows_per_day == traffic.windows_per_day // 2:
                # A restart at noon: a new process rebuilds the last two days (monitor.pipeline.history).
                releaser = releaser_class(config, accountant, model, rng=seed + 2 + i)
                rebuilt = seen[-releaser.reference.rebuilt_windows:]
                releaser.rebuild(rebuilt, since=rebuilt[0].start)
            X, entities, _ = traffic.window(i, surges)
            window = ClosedWindow(i * size, (i + 1) * size, X, np.zeros(0, bool), (), tuple(entities))
            if restarts:
                seen.append(window)
            rec = json.loads(releaser.release(window, released_at=(i + 1) * size).entry.payload)
            states.append(rec["alarm_detail"]["state"])
            if any(c["kind"] == "alarm_run" and not c.get("carried_on") for c in rec["charges"]):
                ref = releaser.reference  # a run reads less where the budget chose less than the history holds
                reaches.append((ref.run_reach_windows, ref.run_first_index is not None and ref.held_windows(ref.run_first_index)))
        day = traffic.windows_per_day * size
        # The worst rolling 24 hours: the ledger's spend in every period ending at a window's end
        # from the second day on (the first day holds the warm-up).
        rolling = [accountant.spent((i + 1) * size)[0] for i in range(traffic.windows_per_day, traffic.n_windows)]
        quiet_days = [accountant.spent((d + 1) * day)[0] for d in range(1, days)
                      if not any(d * traffic.windows_per_day <= s.start < (d + 1) * traffic.windows_per_day for s in surges)]
        ledger.close()
    fired = np.array([s == "fired" for s in states])
    in_first, _, false = _pages(fired, surges, len(states), config.alarm.hold_windows)
    full = plan_from_config(config).reach_seconds / size
    return {"rolling_max": max(rolling), "quiet_day_max": max(quiet_days, default=float("nan")), "pages": int(fired.sum()),
            "surges": len(surges), "first_window": in_first, "false": false, "suppressed": states.count("suppressed"),
            "runs": len(reaches), "short_runs": sum(r is not None and r < min(full, held) for r, held in reaches)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", help="run the scenarios whose name contains this")
    args = parser.parse_args()
    config = load_config(REPO / "config.yaml")
    model = fit_model(config)
    plan = plan_from_config(config)
    rows = []
    for name, people, share, per_day, days, restarts in SCENARIOS:
        if args.only and args.only not in name:
            continue
        before = (("a new run at each restart (before)", _NewRunAtEachRestart) if restarts else
                  ("charged from the first window (before)", _ChargedFromFirstWindow))
        for label, cls in (("as shipped", WindowReleaser), before):
            r = run(config, model, cls, people, share, per_day, days, args.seed, restarts)
            paged = f"{r['first_window'] * r['surges']:.0f} of {r['surges']}" if r["surges"] else "-"
            quiet = "-" if np.isnan(r["quiet_day_max"]) else f"{r['quiet_day_max']:.2f}"
            rows.append(f"| {name} | {label} | {r['rolling_max']:.2f} | {quiet} | {r['pages']} | {paged} | "
                        f"{r['false']} | {r['suppressed']} | {r['runs']} ({r['short_runs']} read less) |")
            print(rows[-1], flush=True)
    markdown = f"""### What charging the reference's memory costs

`OMP_NUM_THREADS=1 python bench/bench_reach.py` (seed {args.seed}): 1,000 simulated wearables through the real
`WindowReleaser`, the shipped `config.yaml` (budget epsilon {config.budget.epsilon:g} a rolling day, 5-minute windows,
the reach {plan.reach_seconds / 3600:.0f} h), 7 days each; surges of 5 % of the people. "Before" charged each run from
its first window only, which the rolling-period bound did not cover (a person's windows are read by the runs of the
next two days, and of the week after on a day unlike the days before it). The restart rows start a new process at noon
each day from the second (a new releaser rebuilding the last two days, as `monitor/pipeline/history.py` does); "before"
there opened a new run at each restart, where a quiet run now goes on (before 2026-12-08). Worst rolling day: the
ledger's spend in the worst 24 hours from the second day on; quiet UTC day: the worst period ending at midnight after a
day without a surge; "read less": runs opened with a shorter reach than the history held, the budget's choice.

| scenario | charge | worst rolling day | worst quiet UTC day | pages | surges paged in window 1 | false pages | windows suppressed | runs opened |
|---|---|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

The plan (`monitor budget`): {plan.summary()}.
"""
    print(markdown)
    if not args.no_write:
        write_section("budget-reach", markdown)


if __name__ == "__main__":
    main()
