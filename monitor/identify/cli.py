"""`monitor identify`: private "is this record an anomaly of the reference data?" answers.

Every answer is charged to the reference-data ledger BEFORE it is computed (purpose
"identify", its epsilon); when the ledger cannot pay, the command stops and says so.

    monitor identify --config config.yaml --reference ref.csv \\
        --record '{"heart_rate": 180, "spo2": 82, "skin_temp": 39, "resp_rate": 30, "activity": 0.2}' \\
        --beta 5 --radius 0.1 --epsilon 0.5 --sensitive 1 --include-record
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from monitor.errors import MonitorError

__all__ = ["configure_identify", "run_identify", "IdentifyInputError", "parse_record"]


class IdentifyInputError(MonitorError):
    """A query record or parameter of `monitor identify` that cannot be used."""


def configure_identify(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="config.yaml declaring the features, their public bounds and the reference ledger")
    parser.add_argument("--reference", required=True, help="reference data: CSV with a header, or npz with X")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--record", help="one record as a JSON object keyed by feature name")
    what.add_argument("--records", help="a batch: JSON lines (.jsonl, .json, .ndjson), CSV with a header, or npz with X")
    parser.add_argument("--beta", type=int, required=True, help="anomaly when at most BETA records (itself included) lie within the radius")
    parser.add_argument("--radius", type=float, required=True, help="radius r in the scaled [0,1] feature space (Euclidean)")
    parser.add_argument("--epsilon", type=float, required=True, help="epsilon charged for EACH answer")
    parser.add_argument("--sensitive", type=int, metavar="K", default=None,
                        help="(epsilon, K)-sensitive privacy instead of epsilon-DP: far more accurate on anomalies")
    parser.add_argument("--include-record", action="store_true",
                        help="answer over the reference data plus the record (for records not in the reference data)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per answer instead of a table")
    parser.add_argument("--seed", type=int, default=None, help="seeded randomness, FOR TESTS ONLY: seeded answers are not private")
    parser.set_defaults(func=run_identify)


def parse_record(text: str, names: Sequence[str], where: str = "--record") -> list[float]:
    """The feature values of one JSON object, in ``names`` order (other keys are ignored).

    >>> parse_record('{"hr": 60, "spo2": 97, "id": "a"}', ["spo2", "hr"])
    [97.0, 60.0]
    """
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise IdentifyInputError(f"{where}: not valid JSON: {err.msg} (column {err.colno})") from None
    if not isinstance(obj, dict):
        raise IdentifyInputError(f"{where}: expected a JSON object keyed by feature name, got {type(obj).__name__}")
    missing = [n for n in names if n not in obj]
    if missing:
        raise IdentifyInputError(f"{where}: missing feature(s) {missing}")
    out = []
    for n in names:
        v = obj[n]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise IdentifyInputError(f"{where}: feature {n!r} must be a finite number, got {v!r}")
        out.append(float(v))
    return out


def _read_records(args: argparse.Namespace, names: list[str]) -> np.ndarray:
    if args.record is not None:
        return np.array([parse_record(args.record, names)])
    path = Path(args.records)
    if path.suffix.lower() in {".jsonl", ".json", ".ndjson"}:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise IdentifyInputError(f"{path}: cannot read: {err.strerror}") from None
        rows = [parse_record(line, names, f"{path}: line {i}") for i, line in enumerate(lines, 1) if line.strip()]
        if not rows:
            raise IdentifyInputError(f"{path}: no records")
        return np.array(rows)
    from monitor.model.io import read_features

    return read_features(path, names)


def _check_arguments(args: argparse.Namespace) -> None:
    if args.beta < 1:
        raise IdentifyInputError(f"--beta must be an integer >= 1, got {args.beta}")
    if not (args.radius > 0 and math.isfinite(args.radius)):
        raise IdentifyInputError(f"--radius must be a positive number, got {args.radius}")
    if not (args.epsilon > 0 and math.isfinite(args.epsilon)):
        raise IdentifyInputError(f"--epsilon must be a positive number, got {args.epsilon}")
    if args.sensitive is not None and args.sensitive < 1:
        raise IdentifyInputError(f"--sensitive must be an integer >= 1, got {args.sensitive}")


def run_identify(args: argparse.Namespace) -> int:
    from monitor.budget import BudgetExhausted, ReferenceLedger
    from monitor.config import load_config
    from monitor.dp import noise_source
    from monitor.features import scale_to_unit
    from monitor.identify.mechanism import AnomalyIdentifier
    from monitor.model.io import read_features

    _check_arguments(args)
    cfg = load_config(args.config)
    names = cfg.feature_names
    records = _read_records(args, names)
    reference = read_features(args.reference, names)
    ident = AnomalyIdentifier(args.beta, args.radius, include_record=args.include_record).fit(scale_to_unit(reference, cfg.bounds))
    queries = scale_to_unit(records, cfg.bounds)
    source = noise_source(args.seed)
    graph = "dp" if args.sensitive is None else f"sensitive k={args.sensitive}"
    note = f"beta={args.beta} radius={args.radius:g} {graph}" + (" include-record" if args.include_record else "")
    answers = []
    # A sensitive-privacy answer is charged under its own notion: its epsilon is on another
    # neighbour graph and must never be added to the DP total of the fit.
    notion = "dp" if args.sensitive is None else f"sensitive:k={args.sensitive}"
    with ReferenceLedger(cfg.budget.reference_ledger, cfg.budget.reference_epsilon, cfg.budget.reference_sensitive_epsilon) as ledger:
        try:
            for q in queries:
                # Charge first: a crash after the charge wastes budget, never leaks an unpaid answer.
                ledger.charge("identify", args.epsilon, note=note, notion=notion)
                answers.append(ident.answer(q, args.epsilon, args.sensitive, rng=source))
        except BudgetExhausted as err:
            _print(answers, args)
            raise BudgetExhausted(f"{err}; answered {len(answers)} of {len(queries)} record(s), refused the rest") from None
        spent, _ = ledger.spent(notion)
        remaining = ledger.remaining(notion)
        limit = ledger.limit(notion)
    _print(answers, args)
    if not args.json:
        what = "reference budget" if notion == "dp" else f"reference budget for {notion} answers (separate from the DP total)"
        print(f"{what}: spent {spent:g} of {limit:g} epsilon, {remaining:g} left")
    return 0


def _print(answers: list, args: argparse.Namespace) -> None:
    if not answers:
        return
    if args.json:
        for i, a in enumerate(answers):
            print(json.dumps({"record": i, "answer": a.answer, **a.as_dict()}))
        return
    from rich.console import Console
    from rich.table import Table

    a0 = answers[0]
    guarantee = f"{a0.epsilon:g}-DP" if a0.sensitive_k is None else f"({a0.epsilon:g}, k={a0.sensitive_k})-sensitive privacy"
    table = Table(title=f"({a0.beta}, {a0.radius:g})-anomaly? {guarantee}, each answer right with probability >= {a0.probability_correct:.3f}")
    table.add_column("record", justify="right")
    table.add_column("answer")
    for i, a in enumerate(answers):
        table.add_row(str(i), "anomaly" if a.answer else "not an anomaly")
    Console(soft_wrap=True).print(table)
