"""``monitor budget``: what the privacy ledgers have spent and what is left.

Reads both ledgers named in the config while the service may be writing them (SQLite
WAL: readers never block the writer). A missing ledger file means nothing was spent;
the command says so and does not create the file.

>>> import argparse
>>> p = argparse.ArgumentParser(); configure_budget(p)
>>> p.parse_args(["--config", "c.yaml", "--json"]).json
True
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["configure_budget", "budget_report", "run_budget"]

RECENT_WINDOWS = 10


def configure_budget(parser: argparse.ArgumentParser) -> None:
    from monitor.cli import add_config_option

    add_config_option(parser, "names the ledgers and the budget")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
    parser.add_argument("--anomalies", metavar="FILE",
                        help="events you know are anomalies (CSV with a header, or npz with X): the smallest surge "
                             "of such events that pages, at the weight the alarm gives them")
    parser.add_argument("--labels", metavar="COLUMN",
                        help="with --anomalies: the column (npz: y) that says which rows are anomalies (1) and which "
                             "normal (0); the AUROC of the score is measured against the normal ones")
    parser.add_argument("--verbose", action="store_true",
                        help="also say how the alarm compares each window and at which levels it weighs events")
    parser.add_argument(
        "--at",
        type=float,
        default=None,
        help="event time (epoch seconds) whose rolling period to report; default: end of the last recorded window",
    )
    parser.set_defaults(func=run_budget)


def budget_report(config: Any, at: float | None = None, now: float | None = None, anomalies=None) -> dict[str, Any]:
    """Both ledgers and the plan as one JSON-ready dict. ``config`` is a MonitorConfig; ``anomalies``:
    (rows, labels or None, name) of a file of known anomalies (``monitor.model.io.read_labelled``)."""
    import time

    now = time.time() if now is None else now
    plan = {**_plan_report(config, now), "visibility": _visibility_report(config, anomalies)}
    return {"stream": _stream_report(config, at), "plan": plan, "reference": _reference_report(config)}


def _visibility_report(config: Any, anomalies=None) -> dict[str, Any]:
    """What the alarm can see, at the traffic of the baseline in the ledger's last released
    record when there is one (public: released values, the config and the model file)."""
    from monitor.budget.ledger import WindowLedger
    from monitor.budget.plan import visibility_report

    record = None
    if config.budget.ledger.exists():
        with WindowLedger(config.budget.ledger) as led:
            last = led.last_released()
        if last is not None and last.payload:
            record = json.loads(last.payload)
    return visibility_report(config, record, anomalies=anomalies)


def _plan_report(config: Any, now: float) -> dict[str, Any]:
    """What the budget pays for (public: the config alone)."""
    from monitor.budget.plan import PLD_DELTA_NOTE, iso, plan_from_config

    plan = plan_from_config(config)
    out: dict[str, Any] = {
        "now": iso(now),
        "quiet_period_epsilon": plan.quiet_epsilon,
        "page_epsilon": plan.page_epsilon,
        "one_page_period_epsilon": plan.one_page_epsilon,
        "pages_per_period": plan.pages_per_period,
        # A run is charged from this far before its first window (the history its queries read), so
        # the pages one period pays are those of the runs answering within counted_seconds.
        "reach_seconds": plan.reach_seconds,
        "counted_seconds": plan.counted_seconds,
        "restart_epsilon": plan.restart_epsilon,
        "restart_reach_seconds": plan.restart_reach_seconds,  # what a restart's first run is charged from
        "summary": plan.summary(),
        "restart_note": plan.restart_note(),
        "first_day_epsilon": plan.first_day_epsilon,
        "first_day_note": plan.first_day_note(),
        "advice": plan.advice(),
    }
    if plan.accountant == "pld":
        out["delta_note"] = PLD_DELTA_NOTE
    return out


def _stream_report(config: Any, at: float | None) -> dict[str, Any]:
    from monitor.budget.accountant import BudgetAccountant
    from monitor.budget.ledger import WindowLedger
    from monitor.budget.plan import MEASURED_DAYS, pages_measured

    b = config.budget
    report_cost = config.report_cost()
    report: dict[str, Any] = {
        "ledger": str(b.ledger),
        "exists": b.ledger.exists(),
        "accountant": b.accountant,
        "period_seconds": b.period_seconds,
        "epsilon_limit": b.epsilon,
        "delta_limit": b.delta,
        # What each kind of charge costs (from the config alone): the alarm pays per run
        # and per page, never per quiet window; a detailed report per page.
        "costs": {
            "alarm_run": {"epsilon": config.alarm.epsilon_threshold, "delta": 0.0},
            "alarm_page": {"epsilon": config.alarm.epsilon_page, "delta": 0.0},
            "baseline": {"epsilon": config.baseline_cost()[0], "delta": 0.0},
            "report": {"epsilon": report_cost[0], "delta": report_cost[1]},
        },
    }
    if not report["exists"]:
        return report
    with WindowLedger(b.ledger) as led:
        acc = BudgetAccountant.from_settings(led, b)
        at = led.last_window_end() if at is None else at
        report["at"] = at
        if at is None:
            return report
        eps, delta = acc.spent(at)
        entries = led.entries()
        report.update(
            period_start=at - b.period_seconds,
            in_period=led.counts(at - b.period_seconds, at),
            epsilon_spent=eps,
            delta_spent=delta,
            epsilon_remaining=max(0.0, b.epsilon - eps),
            all_time={
                "released": sum(e.released for e in entries),
                "suppressed": sum(not e.released for e in entries),
                # What a person present for the ledger's whole history has lost at most
                # (basic composition of everything): the period budget bounds one period only.
                "epsilon_spent": led.total_epsilon(),
                "epsilon_limit": b.lifetime_epsilon,
            },
            unpublished=len(led.unpublished()),
            span_charges=[
                {"kind": kind, "span_start": s0, "span_end": s1, "epsilon": e, "delta": d}
                for _, kind, s0, s1, e, d in led.span_charges(after=at - b.period_seconds) if s0 < at
            ],
            recent=[_recent(e) for e in entries[-RECENT_WINDOWS:]],
        )
        if config.alarm.enabled and config.alarm.threshold is None:
            report["pages"] = pages_measured(_states(entries, at - MEASURED_DAYS * 86400.0), at,
                                             config.window.size_seconds, config.alarm.false_pages_per_30_days)
    return report


def _states(entries: list, since: float) -> "list[tuple[float, str | None]]":
    """(window_end, alarm state) of the released windows ending after ``since``, from their records."""
    return [(e.window_end, (json.loads(e.payload).get("alarm_detail") or {}).get("state"))
            for e in entries if e.released and e.payload and e.window_end > since]


def _recent(e: Any) -> dict[str, Any]:
    """One ledger window for "Latest windows": its whole charge (every charge it made, an
    alarm run opened, a page, a baseline, a report: the record's ``epsilon``, as published),
    not the row's own share, and the alarm's state."""
    record = json.loads(e.payload) if e.payload else {}
    detail = record.get("alarm_detail") or {}
    return {
        "window_start": e.window_start,
        "window_end": e.window_end,
        "status": e.status,
        "alarm": detail.get("state"),
        "epsilon": record.get("epsilon", e.epsilon),
        "delta": record.get("delta", e.delta),
        "published": e.published,
        "reason": e.reason,
    }


def _reference_report(config: Any) -> dict[str, Any]:
    from monitor.budget.reference import ReferenceLedger

    b = config.budget
    report: dict[str, Any] = {"ledger": str(b.reference_ledger), "exists": b.reference_ledger.exists(), "epsilon_limit": b.reference_epsilon}
    if not report["exists"]:
        return report
    with ReferenceLedger(b.reference_ledger, b.reference_epsilon, b.reference_sensitive_epsilon) as ref:
        eps, delta = ref.spent()
        report.update(
            epsilon_spent=eps,
            delta_spent=delta,
            epsilon_remaining=ref.remaining(),
            # One total per privacy notion: epsilons of different notions are never added up.
            notions={n: {"epsilon_spent": ref.spent(n)[0], "epsilon_limit": ref.limit(n), "epsilon_remaining": ref.remaining(n)}
                     for n in ref.notions()},
            charges=[
                {"charged_at": c.charged_at, "purpose": c.purpose, "notion": c.notion, "epsilon": c.epsilon, "delta": c.delta, "note": c.note}
                for c in ref.entries()
            ],
        )
    return report


def run_budget(args: argparse.Namespace) -> int:
    from monitor.config import load_config

    from monitor.model.io import read_labelled

    config = load_config(args.config)
    if args.labels and not args.anomalies:
        from monitor.errors import MonitorError

        raise MonitorError("--labels needs --anomalies FILE: the file whose rows it labels")
    anomalies = read_labelled(args.anomalies, config.feature_names, args.labels) if args.anomalies else None
    report = budget_report(config, at=args.at, anomalies=anomalies)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _render(report, verbose=args.verbose)
    return 0


def _time(t: float) -> str:
    from monitor.budget.plan import iso

    return iso(t)


def _render_plan(console, plan: dict[str, Any], verbose: bool = False) -> None:
    console.print(f"[bold]Plan[/] (as of {plan['now']}): {plan['summary']}.")
    if plan.get("first_day_note"):
        console.print(f"  First day: {plan['first_day_note']}.")
    if plan.get("restart_note"):
        console.print(f"  Restarts: {plan['restart_note']}.")
    if plan["advice"]:
        console.print(f"  {plan['advice']}.")
    if "delta_note" in plan:
        console.print(f"  PLD: {plan['delta_note']}.")
    if plan.get("visibility"):
        # One unbroken line, so that `monitor budget | grep` finds it whole.
        console.print(f"[bold]What the alarm can see[/]: {plan['visibility']['summary']}.", soft_wrap=True)
        details = plan["visibility"].get("details") or []
        if verbose:
            for line in details:
                console.print(f"  - {line}.", soft_wrap=True)
        elif details:
            console.print("  (`monitor budget --verbose`: how the alarm compares each window, and its levels.)")


def _render(report: dict[str, Any], verbose: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        # Piped or redirected: rich would assume 80 columns and cut the timestamps.
        console = Console(width=200)
    s = report["stream"]
    if not s["exists"] or s.get("at") is None:
        console.print(f"Stream ledger [bold]{s['ledger']}[/]: no window recorded yet, nothing has been spent.")
    else:
        summary = Table(title=f"Stream budget ({s['accountant']} accountant), period ending {_time(s['at'])}", show_header=False)
        summary.add_column(style="bold")
        summary.add_column()
        summary.add_row("rolling period", f"{s['period_seconds']:g} s, from {_time(s['period_start'])}")
        summary.add_row("windows released / suppressed", f"{s['in_period']['released']} / {s['in_period']['suppressed']} in the period "
                        f"({s['all_time']['released']} / {s['all_time']['suppressed']} in all)")
        summary.add_row("epsilon spent / limit", f"{s['epsilon_spent']:.4g} / {s['epsilon_limit']:g}")
        summary.add_row("epsilon left", f"{s['epsilon_remaining']:.4g}")
        life = s["all_time"]
        summary.add_row("epsilon since the ledger began (per person, at most)",
                        f"{life['epsilon_spent']:.4g}" + (f" / lifetime limit {life['epsilon_limit']:g}" if life["epsilon_limit"]
                                                          else " (no budget.lifetime_epsilon cap)"))
        summary.add_row("delta spent / limit", f"{s['delta_spent']:.3g} / {s['delta_limit']:.3g}")
        c = s["costs"]
        summary.add_row("one alarm run / page / baseline / report costs",
                        f"epsilon {c['alarm_run']['epsilon']:g} / {c['alarm_page']['epsilon']:g} / {c['baseline']['epsilon']:g} "
                        f"/ {c['report']['epsilon']:g}")
        kinds = [x["kind"] for x in s["span_charges"]]
        summary.add_row("alarm runs, pages and baselines in the period",
                        f"{kinds.count('alarm_run')} run(s), {kinds.count('alarm_page')} page(s), {kinds.count('baseline')} baseline estimate(s)")
        if "pages" in s:
            summary.add_row(f"alarm pages, last {s['pages']['days']} days", s["pages"]["summary"])
        summary.add_row("awaiting republish", str(s["unpublished"]))
        summary.add_row("ledger", s["ledger"])
        console.print(summary)
        if s.get("pages", {}).get("warning"):
            console.print(f"[bold yellow]Pages[/]: {s['pages']['warning']}.", soft_wrap=True)
        recent = Table(title="Latest windows (epsilon: all the window charged, as its record says)")
        for col in ("start", "end", "status", "alarm", "epsilon", "delta", "published"):
            recent.add_column(col, no_wrap=True)
        for w in s["recent"]:
            status = w["status"] if w["reason"] is None else f"{w['status']} ({w['reason']})"
            recent.add_row(_time(w["window_start"]), _time(w["window_end"]), status, w.get("alarm") or "-",
                           f"{w['epsilon']:.4g}", f"{w['delta']:.3g}",
                           "-" if w["status"] != "released" else "yes" if w["published"] else "no")
        console.print(recent)
    _render_plan(console, report["plan"], verbose)

    r = report["reference"]
    if not r["exists"]:
        console.print(f"Reference ledger [bold]{r['ledger']}[/]: no query recorded yet, nothing has been spent "
                      f"(limit epsilon {r['epsilon_limit']:g}).")
        return
    charges = Table(title=f"Reference budget (epsilon-DP): spent {r['epsilon_spent']:.4g} of {r['epsilon_limit']:g}, "
                          f"{r['epsilon_remaining']:.4g} left (delta spent {r['delta_spent']:.3g})")
    for col in ("when", "purpose", "notion", "epsilon", "delta", "note"):
        charges.add_column(col)
    for c in r["charges"]:
        charges.add_row(_time(c["charged_at"]), c["purpose"], c["notion"], f"{c['epsilon']:g}", f"{c['delta']:.3g}", c["note"])
    console.print(charges)
    for notion, t in r["notions"].items():
        if notion != "dp":
            console.print(f"{notion} answers: spent {t['epsilon_spent']:.4g} of {t['epsilon_limit']:g} "
                          f"(a separate total: sensitive privacy is not epsilon-DP, and its epsilon is never added to the DP total)")
