"""`monitor fit` and `monitor score`: fit the private model once, score files with it."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

__all__ = ["configure_fit", "configure_score", "run_fit", "run_score"]


def configure_fit(parser: argparse.ArgumentParser) -> None:
    from monitor.cli import add_config_option

    add_config_option(parser, "features, public bounds, model settings, reference ledger")
    parser.add_argument("--reference", required=True, help="reference inliers: CSV with a header, or npz with X")
    parser.add_argument("--out", help="model file to write (default: model.path from the config)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seeded noise, FOR TESTS ONLY: a seeded model is not private in practice")
    parser.set_defaults(func=run_fit)


def configure_score(parser: argparse.ArgumentParser) -> None:
    from monitor.cli import add_config_option

    parser.add_argument("--model", help="model file written by `monitor fit` (default: model.path from the config)")
    parser.add_argument("--input", required=True, help="events to score: CSV with a header, or npz with X")
    parser.add_argument("--output", help="CSV to write: the input columns + score + flag (default: print a summary)")
    parser.add_argument("--labels", metavar="COLUMN",
                        help="the column (npz: y) saying which rows are anomalies (1) and which normal (0): the AUROC "
                             "of the score, and the alarm's weights of the anomalies alone")
    add_config_option(parser, "names the model file, and the model is refused if its features differ; "
                              "not read when --model is given without --config")
    parser.set_defaults(func=run_score, config=None)


def _charge_reference_ledger(cfg, epsilon: float, reference: Path) -> tuple[float, float]:
    """Charge the fit's epsilon to the reference-data ledger (docs/design.md#the-budget), before fitting.

    Charging first means a fit that fails afterwards still counts: the noise may have
    been drawn, and a budget that errs on the side of spending is the safe one.
    Returns (spent, remaining) after the charge. Raises BudgetExhausted (exit 2, plain
    message naming what can be done instead) when the reference budget cannot pay.
    """
    from monitor.budget import ReferenceLedger
    from monitor.errors import BudgetExhausted

    limit = cfg.budget.reference_epsilon
    with ReferenceLedger(cfg.budget.reference_ledger, limit) as ledger:
        try:
            ledger.charge("fit", epsilon, note=f"monitor fit --reference {reference}")
        except BudgetExhausted:
            spent, left = ledger.spent()[0], ledger.remaining()
            raise BudgetExhausted(_refusal(cfg, epsilon, spent, left)) from None
        return ledger.spent()[0], ledger.remaining()


def _refusal(cfg, epsilon: float, spent: float, left: float) -> str:
    """Why the fit is refused and what to do instead, most useful first."""
    ledger, limit = cfg.budget.reference_ledger, cfg.budget.reference_epsilon
    steps = ["keep the model you have: to flag more or fewer events change model.threshold or "
             "model.contamination in the config (post-processing, free, no refit)"]
    if left > 0:
        steps.append(f"or fit with model.epsilon at most {left:.4g} (the rest of the budget; a smaller "
                     f"epsilon gives a noisier model)")
    steps.append("or fit on NEW reference data (records not used by earlier fits) with a new "
                 "budget.reference_ledger file")
    return (f"reference budget exhausted: this fit needs epsilon {epsilon:.4g} but {spent:.4g} of "
            f"budget.reference_epsilon = {limit:.4g} is already spent (ledger {ledger}) and the reference "
            f"budget never refills. Next step: " + "; ".join(steps) + ".")


WEAK_CELL_SIGNAL = 0.25  # below this many noise scales per average cell the counts are mostly noise


def _warn_weak_signal(model, n_rows: int) -> None:
    """Say so when the reference set is too small for the epsilon: the fit succeeds, but
    its scores are mostly noise (at 0.07 and 0.12 two shared benchmarks scored at chance)."""
    signal = model.cell_signal_
    if signal is None or signal >= WEAK_CELL_SIGNAL:
        return
    times = 1.0 / max(signal, 1e-9)  # the layout rule aims at one noise scale per average cell
    print(f"warning: the model is mostly noise: with {n_rows} reference rows at model.epsilon={model.epsilon:g} a grid's "
          f"average cell holds {signal:.2f} noise scales of records (under {WEAK_CELL_SIGNAL}), so its scores may be little "
          f"better than chance. Fit on about {times:.0f}x more reference rows, or with about {times:.0f}x the "
          f"epsilon, to reach one noise scale per cell (docs/model.md)", file=sys.stderr)


CLIP_WARN_SHARE = 0.01  # warn when the bounds clip more than this share of a feature's reference values


def _warn_clipping(X: np.ndarray, names, bounds) -> None:
    """Say which features' bounds clip a large share of the reference rows, and how much.

    These shares are exact counts of the private reference data, deliberately NOT
    privatised: `monitor fit` runs inside the trust boundary, the operator who runs it
    already holds the reference file, and the shares go to that operator's terminal only.
    They are never written to the model file, the ledger or any published output (the
    model file stays a pure epsilon-DP release).
    """
    b = np.asarray(bounds, dtype=float)
    low, high = (X < b[:, 0]).mean(axis=0), (X > b[:, 1]).mean(axis=0)
    bad = [i for i in range(len(names)) if low[i] + high[i] > CLIP_WARN_SHARE]
    if not bad:
        return
    parts = "; ".join(f"{names[i]}: {100 * (low[i] + high[i]):.1f} % ({100 * low[i]:.1f} % below min {b[i, 0]:g}, "
                      f"{100 * high[i]:.1f} % above max {b[i, 1]:g})" for i in bad)
    print(f"warning: the configured bounds clip more than {100 * CLIP_WARN_SHARE:g} % of the reference rows of "
          f"{len(bad)} feature(s): {parts}. Clipped values all score as the bound itself, so the model cannot tell "
          f"them apart: widen features[].min/max in the config if these values are normal (bounds must come from "
          f"domain knowledge, not from the data). These shares are exact and shown only here, to you; they are "
          f"not stored in the model file", file=sys.stderr)


def _report_calibration(model, rates) -> None:
    """The calibration's accuracy for each configured rate; a warning where the held-apart part
    is too small for it (post-processing of the model's release)."""
    if model.calibration_ is None:
        return
    for label, c in rates:
        acc = model.rate_accuracy(c)
        expected = c * acc.rows
        line = (f"calibration ({label} {c:g}): threshold {acc.threshold:.4g}, from about {acc.rows:.0f} held-apart "
                f"reference rows ({100 * model.calibration_share_:g} %, model.calibration_share), expected "
                f"{expected:.1f} of them above it, rank accuracy +-{acc.rank_accuracy:.1f} rows (95 %)")
        if acc.enough:
            print(line + f": the real flag rate should land within [{c / 2:g}, {2 * c:g}]")
        else:
            print(f"warning: {line}: too few held-apart rows for the rate {c:g} (need about {acc.rows_needed:.0f}); "
                  f"the real flag rate may fall outside [{c / 2:g}, {2 * c:g}]. Use a larger rate, more reference "
                  f"rows, a larger model.calibration_share or a larger model.epsilon", file=sys.stderr)


def _levels(model, cfg) -> tuple[tuple[float, float], str] | None:
    """The score levels that flag: the alarm's (when it is on), else the model's threshold."""
    from monitor.alarm.calibrate import alarm_levels

    a = getattr(cfg, "alarm", None)
    if a is not None and a.enabled:
        graded = f", alarm.contamination_graded {a.contamination_graded:g}" if a.contamination_graded else ""
        return alarm_levels(model, a), f"the alarm's levels (alarm.contamination {a.contamination:g}{graded})"
    if model.threshold_ is None:
        return None
    return (model.threshold_, model.threshold_), f"the model's threshold {model.threshold_:.4g}"


def _report_sight(model, cfg, n_rows: int) -> None:
    """Say whether the model can flag anything (``monitor.model.sight``: a probe of the
    released model with public randomness, never the reference rows)."""
    from monitor.model.sight import model_sight

    levels = _levels(model, cfg)
    if levels is None:
        return
    (t_lo, t_hi), which = levels
    s = model_sight(model, t_lo, t_hi)
    if not s.has_room:
        print("sight: not measured: on every feature the bulk of the reference data (the 1-99 % range of the model's "
              "mass) reaches within a tenth of the public min/max, so no event lies outside it and anomalies lie inside "
              "the features' ranges; `monitor score --input FILE --labels COL` on events you know are anomalies says what "
              "the model makes of them, `monitor budget --anomalies FILE` the smallest surge of them that pages (docs/model.md)")
        return
    probe = (f"events pushed far outside the bulk of its reference data (one feature at a time, a tenth of its public "
             f"range beyond its 1-99 % range) weigh {s.sight:.2f} more than normal ones on average at {which}, and "
             f"{100 * s.flagged_share:.0f} % of them weigh fully")
    check = "check it with `monitor score --input` on events you know are anomalies (docs/model.md)"
    if not s.blind:
        print(f"sight: the model can flag: {probe}; {check}")
        return
    enough = s.advice()
    todo = (f"for {len(cfg.feature_names)} features, fit on {enough}" if enough else
            f"refit with more reference rows or a larger model.epsilon (its cells already hold a few noise scales of "
            f"records: with {len(cfg.feature_names)} features an event unusual in one feature alone is diluted among "
            f"its {len(model.grids_)} grids), or raise alarm.contamination (a lower upper level)")
    print(f"warning: the model is nearly blind: with {n_rows} reference rows at model.epsilon="
          f"{model.epsilon:g}, {probe}: a surge of such events will hardly page, whatever `monitor budget` says of "
          f"the threshold. Next step: {todo}; {check}", file=sys.stderr)


# Upper alarm levels offered where the configured one cannot flag (each with a tenth of it as the graded level).
_ALARM_RATES = (0.01, 0.02, 0.05, 0.1, 0.2)


def _check_alarm_levels(model, cfg, n_rows: int) -> None:
    """An error-level message where the alarm cannot use the model as configured: its upper level
    lies at the top of the scores the model can give (no event weighs fully, so no surge pages), or
    the held-apart rows are too few for every level it uses. The advice is checked on this model:
    the sparsest upper level (with a graded level 10 times as wide) whose threshold lies below
    that top and whose rate the held-apart rows calibrate; or, where none does, the rows needed."""
    from monitor.alarm.calibrate import alarm_levels

    a = getattr(cfg, "alarm", None)
    if a is None or not a.enabled or model.calibration_ is None:
        return
    top = model._score_max()
    _, t_hi = alarm_levels(model, a)
    at_top = t_hi >= 0.999 * top  # the last score bin: only events with no mass anywhere near reach it
    levels = [a.contamination] + ([a.contamination_graded] if a.contamination_graded else [])
    uncalibrated = not any(model.rate_accuracy(c).enough for c in levels)
    if not (at_top or uncalibrated):
        return
    why = "; ".join(
        ([f"the alarm's upper level (alarm.contamination {a.contamination:g}) lies at the top of the scores this model "
          f"can give ({top:.4g}): hardly any event can weigh fully, so a surge will hardly page"] if at_top else [])
        + ([f"the {model.rate_accuracy(a.contamination).rows:.0f} held-apart reference rows are too few to calibrate any "
            f"level the alarm uses ({', '.join(f'{c:g}' for c in levels)})"] if uncalibrated else []))
    fix = next((c for c in _ALARM_RATES if c >= a.contamination and model.threshold_for(c) < 0.999 * top
                and model.rate_accuracy(c).enough), None)
    if fix is not None:
        todo = (f"set alarm.contamination {fix:g} and alarm.contamination_graded {min(0.5, 10 * fix):g} (checked on "
                "this model: its level then lies below the top and its rate is calibrated; a free change, no refit), "
                "knowing that sparser surges will not page")
    else:
        need = model.rate_accuracy(a.contamination).rows_needed
        share = getattr(model, "calibration_share_", 0.25) or 0.25
        todo = (f"fit on at least about {need / share:,.0f} reference rows ({need:,.0f} held apart at "
                f"model.calibration_share {share:g}; this file has {n_rows:,})")
    print(f"error: the model is written, but the alarm cannot use it as configured: {why}. To fix it, {todo}; "
          "`monitor budget --anomalies FILE` then says what surge of your anomalies pages", file=sys.stderr)


def model_from_config(cfg, seed: "int | None" = None):
    """The unfitted GridKNN that `monitor fit` fits: every ``model.*`` setting of the config
    (``seed`` None = production noise; an int, reproducible: tests and benchmarks)."""
    from monitor.model.estimator import GridKNN

    ms = cfg.model
    return GridKNN(bins=ms.bins, k=ms.k, epsilon=ms.epsilon, bounds=cfg.bounds, max_depth=ms.max_depth,
                   weighted=ms.weighted, contamination=ms.contamination, threshold=ms.threshold,
                   random_state=seed, feature_names=cfg.feature_names, calibration_share=ms.calibration_share,
                   layout_rule=ms.layout_rule, score_power=ms.score_power)


def run_fit(args: argparse.Namespace) -> int:
    from monitor.config import load_config
    from monitor.model.io import extra_columns, read_features

    cfg = load_config(args.config)
    X = read_features(args.reference, cfg.feature_names)
    ignored = extra_columns(args.reference, cfg.feature_names)
    if ignored:
        print(f"note: {args.reference} has {len(ignored)} column(s) that are not configured features, ignored: "
              f"{', '.join(ignored)}", file=sys.stderr)
    _warn_clipping(X, cfg.feature_names, cfg.bounds)
    ms = cfg.model
    model = model_from_config(cfg, args.seed)
    # Charged before the noisy cells exist: a refused charge releases nothing.
    spent, left = _charge_reference_ledger(cfg, ms.epsilon, Path(args.reference))
    model.fit(X)
    out = Path(args.out) if args.out else ms.path
    model.save(out)
    thr = "none" if model.threshold_ is None else f"{model.threshold_:.4g}"
    joint = sum(len(g) > 1 for g in model.groups_)
    print(f"wrote {out}: {len(model.grids_)} grids ({joint} joint, {len(model.grids_) - joint} one-feature) "
          f"over {len(cfg.feature_names)} features, epsilon={model.epsilon_spent_:g} (pure DP), threshold={thr}; "
          f"{X.shape[0]} reference rows read (the file holds no raw count: the reference data may be deleted); "
          f"layout chosen from a noisy row count of {model.n_estimate_:.0f} (epsilon {model.size_epsilon_:g} of the "
          f"{model.epsilon_spent_:g})")
    _warn_weak_signal(model, X.shape[0])
    rates = [("model.contamination", ms.contamination)] if ms.contamination is not None else []
    alarm_c = getattr(getattr(cfg, "alarm", None), "contamination", None)
    if alarm_c is not None and alarm_c != ms.contamination:
        rates.append(("alarm.contamination", alarm_c))
    _report_calibration(model, rates)
    _report_sight(model, cfg, X.shape[0])
    _check_alarm_levels(model, cfg, X.shape[0])
    fits_left = int(left // ms.epsilon + 1e-9) if ms.epsilon > 0 else 0
    print(f"reference budget: spent {spent:.4g} of {cfg.budget.reference_epsilon:.4g} "
          f"(budget.reference_epsilon), {left:.4g} left: {fits_left} more fit(s) at model.epsilon={ms.epsilon:g}; "
          f"it never refills. Changing the threshold later is free: model.threshold or model.contamination "
          f"in the config (docs/model.md)")
    return 0


def run_score(args: argparse.Namespace) -> int:
    from monitor.model.estimator import GridKNN
    from monitor.model.io import csv_rows, read_features

    config = None
    if args.model and args.config is None:
        model = GridKNN.load(args.model)
    else:
        from monitor.cli import DEFAULT_CONFIG
        from monitor.config import load_config
        from monitor.model.file import load_configured

        config = load_config(args.config or DEFAULT_CONFIG)
        model = load_configured(config, args.model)
    path = Path(args.input)
    Y = read_features(path, model.feature_names_)
    scores = model.score_samples(Y)
    flags = (scores > model.threshold_).astype(int) if model.threshold_ is not None else None
    if args.output:
        with open(args.output, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            extra = ["score"] + (["flag"] if flags is not None else [])
            if path.suffix.lower() == ".npz":
                w.writerow(list(model.feature_names_) + extra)
                rows = (list(map(repr, y)) for y in Y.tolist())
            else:
                src = (r for _, r in csv_rows(path, progress=False) if r)
                w.writerow(next(src) + extra)
                rows = src
            for i, row in enumerate(rows):
                w.writerow(row + [f"{scores[i]:.6g}"] + ([flags[i]] if flags is not None else []))
        print(f"wrote {args.output}: {len(scores)} events scored"
              + (f", {int(flags.sum())} flagged" if flags is not None else ""))
        return 0
    q = np.quantile(scores, [0.5, 0.9, 0.99])
    print(f"{len(scores)} events scored: median {q[0]:.4g}, p90 {q[1]:.4g}, p99 {q[2]:.4g}, max {scores.max():.4g}")
    if flags is not None:
        print(f"flagged (score > {model.threshold_:.4g}): {int(flags.sum())} ({100 * flags.mean():.2f} %)")
    else:
        print("the model has no threshold (neither threshold nor contamination was set): nothing flagged")
    if config is not None and config.alarm.enabled:
        _report_alarm_weights(config, model, path, Y, args.labels)
    elif args.labels:
        print("--labels: the alarm's weights need the config (--config, or config.yaml here)", file=sys.stderr)
    return 0


def _report_alarm_weights(config, model, path: Path, Y: np.ndarray, labels: "str | None") -> None:
    """What the alarm makes of these rows (``monitor.alarm.anomalies``): the share it weighs fully,
    their mean weight, with labels the AUROC; the surge share that pages is ``monitor budget``'s."""
    from monitor.alarm.anomalies import anomaly_sight
    from monitor.model.io import read_labelled

    flags = read_labelled(path, config.feature_names, labels)[1] if labels else None
    s = anomaly_sight(model, config.alarm, Y, flags)
    which = f"the {s.rows} rows labelled 1" if flags is not None else f"the {s.rows} rows"
    print(f"at the alarm's levels {which} weigh {s.mean_weight:.3f} on average (normal events {s.normal_weight:.3f}); "
          f"{100 * s.full_share:.1f} % of them weigh fully" + ("" if s.auroc is None else f"; AUROC {s.auroc:.3f}"))
    print(f"the smallest surge of such events that pages at your traffic: `monitor budget --anomalies {path}"
          + (f" --labels {labels}`" if labels else "`"))


if __name__ == "__main__":  # pragma: no cover
    from monitor.cli import main

    sys.exit(main())
