"""Surge alarm on real labelled data with a daily rhythm: false pages on quiet days, surges against the exact detector.

The shared sets of ``bench_alarm_real.py`` (at least 3,000 rows), fitted and replayed as there
(half the inliers fit the model with the shipped ``config.yaml``; the other half is the normal
traffic; every window through the production ``WindowReleaser`` with cached scores, seeded
noise and a fresh ledger per run), but the traffic has a rhythm (``monitor.data.rhythm``):
normal rows are drawn at window w with weight exp(a(w) . u), u a row's standardised principal
components on the traffic pool:

- ``stationary`` (gamma 0: the stationary goal, measured in the same run);
- ``wave G``: a(w) = G sin(2 pi w / 288) along the first component;
- ``switch G``: night weighting -G, day weighting +G, the mixture moving between them over one
  hour (12 windows) at 07:00 and 19:00;
- ``weekly G``: the wave on weekdays, on Saturday and Sunday along the second component
  (the runs start on a Friday so that they cross both changes);
- ``taylor S``: a real curve, half-hourly electricity demand in England and Wales over 12 weeks
  of summer 2000 (``bench/curves/taylor.csv``, from the PyPI package pmdarima): the events per
  window follow the demand in proportion (in place of ``--swing``), and the rows are tilted along
  the first component by the normalised demand, at the strength that swings the alarm's flagged
  weight to S (max / mean over the run; ``strength_for_swing``, per set). S is a swing here, not
  a strength. Runs start on a Wednesday (seed k: week 2k - 1 for the quiet run, 2k for the surge
  run, of the 12), so a 7-day run meets a Saturday compared with Friday and Thursday.

Events per window follow the existing +-30 % daily swing. For every window the generator knows
the TRUE expected flagged share of normal events at each flag level (``RowTraffic.expected``),
which defines the EXACT detector: f_w - r_w n_w at one flag level, paging above the smallest
constant with 1 false page per 30 days (from at least 300 simulated quiet days of the same
rhythm and volume: f ~ Binomial(n_w, r_w)); ``exact, best level per set`` picks that level in
hindsight per data set. A private surge counts when it pages in its FIRST window.

Per scale and rhythm: quiet runs (no surge) give the false pages per 30 days, the alarm's
flagged weight's swing over the day (max / mean of its true expected value per event), and the
windows answered against those suppressed (the budget spent); surge runs (6 a day, 3 windows
each, after the 3-hour warm-up, at any window: ``--grid-surges`` puts them on ``plan_surges``'
grid of slots, where most recur at the hour of one the day before) give first-window pages,
private against exact. False pages are also counted from the second day of each run on: the
alarm learns the day's shape from the day before. ``from day 2: expected per 30 days`` reads each
quiet window's statistic (private: a measurement only) and sums its chance of paging under the
run's noise (``page_chances``): what the false pages average to, with far less spread than the
few pages a run draws, against the promise of ``alarm.false_pages_per_30_days``. The surge runs'
results carry the same for the surges (``private_first_expected``, ``..._day1``): each surge's
chance of paging in its first window, summed, to compare two settings on a few seeds.

``--trend-error`` measures, without replaying, how far the first day's trend (the rhythm
reference's "recent" mode) misses each rhythm: what ``alarm.trend_error`` must cover.

Run: ``OMP_NUM_THREADS=1 python bench/bench_alarm_rhythm.py --quick`` (one set, one seed,
wave 0.5), ``... --write`` for docs/benchmarks/alarm-rhythm.md (see the page for the time).
``--alarm-config KEY=VALUE`` (repeatable; ``alarm.`` is implied, ``section.key`` for others)
compares alarm settings without editing anything.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_alarm_real import (LEVELS, CachedScores, chances_by_window, datasets, fresh_releaser, page_chances,  # noqa: E402
                              released_windows)
from bench_alarm_real import fit_set as fit_real_set  # noqa: E402
from report import REPO, write_run  # noqa: E402

from monitor.alarm.reference import trend_coefficients  # noqa: E402
from monitor.budget.plan import ANSWERED, pages_measured  # noqa: E402
from monitor.config import MonitorConfig, load_config  # noqa: E402
from monitor.data.rhythm import Rhythm, RowRhythm, strength_for_swing  # noqa: E402
from monitor.data.traffic import RowTraffic, plan_surges  # noqa: E402

SCALES = [(1500, 0.05), (10_000, 0.01)]
RHYTHMS = ["stationary", "wave 0.25", "wave 0.5", "wave 1.0", "switch 0.5", "weekly 0.5"]
SURGES_PER_DAY = 6
QUIET_DAYS_SIMULATED = 300  # at least: for the exact detector's constant (10 exceedances in 300 days = 1 per 30)
WEEKLY_FIRST_DAY = 4        # day 0 is a Monday: weekly runs start on a Friday
CURVES = {"taylor": Path(__file__).resolve().parent / "curves" / "taylor.csv"}  # half-hourly, day 0 a Monday
CURVE_FIRST_DAY = 2         # curve runs start on a Wednesday (of the week the seed picks)


def load_curve(name: str) -> tuple[int, ...]:
    """A committed curve (``CURVES``): its values, a day's 48 half-hours a line, day 0 a Monday."""
    rows = [line for line in CURVES[name].read_text().splitlines() if line and not line.startswith("#")]
    return tuple(int(v) for line in rows for v in line.split(","))


def check_curve() -> None:
    """The committed Taylor table is pmdarima's ``load_taylor()`` value for value (the extra ``curves``)."""
    try:
        from pmdarima.datasets import load_taylor
    except ImportError as err:
        raise SystemExit(f"--check-curve needs pmdarima (pip install '.[curves]'): {err}")
    ours = np.array(load_curve("taylor"), dtype=float)
    theirs = np.asarray(load_taylor(), dtype=float)
    if ours.shape != theirs.shape or not np.array_equal(ours, theirs):
        raise SystemExit(f"bench/curves/taylor.csv differs from pmdarima's load_taylor() ({ours.shape} vs {theirs.shape})")
    print(f"bench/curves/taylor.csv: the same {ours.size} values as pmdarima's load_taylor()")


def parse_rhythm(label: str) -> Rhythm:
    """``stationary`` | ``wave G`` | ``switch G`` | ``weekly G`` | ``taylor S`` (also ``wave:G``).
    A curve's S is the flagged weight's swing, which needs the set (``curve_strength``): here its
    strength is 0 (the curve's volume alone)."""
    parts = label.replace(":", " ").split()
    if parts[0] in ("stationary", "none"):
        return Rhythm("none", 0.0)
    if parts[0] in CURVES:
        target = float(parts[1]) if len(parts) > 1 else 2.0
        if not target >= 1.0:
            raise ValueError(f"a curve's number is the flagged weight's swing (max / mean), at least 1, got {target}")
        curve = load_curve(parts[0])
        return Rhythm("curve", 0.0, curve=curve, volume=Rhythm("curve", curve=curve).curve_volume)
    return Rhythm(parts[0], float(parts[1]) if len(parts) > 1 else 0.5)


def curve_target(label: str) -> "float | None":
    """A curve rhythm's target swing of the flagged weight (None for the other kinds)."""
    parts = label.replace(":", " ").split()
    return (float(parts[1]) if len(parts) > 1 else 2.0) if parts[0] in CURVES else None


def first_day_of(rhythm: Rhythm, seed: int, kind: str) -> int:
    """The rhythm's day a run starts on: a Friday for ``weekly``; for a curve a Wednesday of the
    week the seed and the run's kind pick (quiet and surge runs on different weeks); else 0."""
    if rhythm.kind == "weekly":
        return WEEKLY_FIRST_DAY
    if rhythm.kind == "curve":
        week = (2 * (seed - 1) + (kind == "surge")) % max(1, rhythm.curve_days // 7)
        return 7 * week + CURVE_FIRST_DAY
    return 0


def curve_strength(rhythm: Rhythm, target: float, T: np.ndarray, weight: np.ndarray, first_day: int, days: int,
                   wpd: int) -> Rhythm:
    """The curve rhythm at the strength that swings ``weight`` (per normal row) to ``target`` over the run."""
    times = first_day + np.arange(days * wpd) / wpd
    g = strength_for_swing(rhythm, RowRhythm(T, rhythm), weight, times, target)
    return Rhythm(rhythm.kind, g, curve=rhythm.curve, curve_slots=rhythm.curve_slots, volume=rhythm.volume,
                  weekend=rhythm.weekend)


def _join_strengths(tokens: list[str]) -> list[str]:
    """``wave 0.5`` given unquoted arrives as two tokens: a number joins the kind before it."""
    out: list[str] = []
    for tok in tokens:
        try:
            float(tok)
        except ValueError:
            out.append(tok)
            continue
        if not out or len(out[-1].replace(":", " ").split()) != 1:
            raise SystemExit(f"--rhythms: {tok} follows no rhythm kind")
        out[-1] = f"{out[-1]} {tok}"
    return out


def apply_overrides(base: MonitorConfig, overrides: list[str]) -> MonitorConfig:
    """``KEY=VALUE`` settings (VALUE read as YAML; KEY under ``alarm`` unless it names a section)."""
    data = base.model_dump(mode="json")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--alarm-config expects KEY=VALUE, got {item!r}")
        path = key.split(".") if "." in key else ["alarm", key]
        node = data
        for part in path[:-1]:
            node = node[part]
        if path[-1] not in node:
            raise SystemExit(f"--alarm-config: unknown setting {'.'.join(path)}")
        node[path[-1]] = yaml.safe_load(value)
    return MonitorConfig.model_validate(data)


def alarm_weights(model, config: MonitorConfig, scores: np.ndarray) -> np.ndarray:
    """The alarm's per-event weight (graded flag) of each score, as the releaser weighs it: one
    column per rung of its levels (``calibrate.level_ladder``; one column for an alarm without)."""
    try:
        from monitor.alarm.calibrate import alarm_levels, graded_weights
    except ImportError:  # the alarm's API moved: its upper level's plain flag
        return (scores > model.threshold_for(config.alarm.contamination)).astype(float)[:, None]
    try:
        from monitor.alarm.calibrate import level_ladder, rung_levels
        rungs = [rung_levels(model, config.alarm, shares) for shares in level_ladder(config.alarm)]
    except ImportError:
        rungs = [[alarm_levels(model, config.alarm)]]
    return np.stack([np.mean([graded_weights(scores, lo, hi) for lo, hi in levels], axis=0) for levels in rungs], axis=1)


def replay(config: MonitorConfig, model: CachedScores, traffic: RowTraffic, surges, seed: int,
           levels: np.ndarray, pool_flags: np.ndarray, pool_weight: np.ndarray) -> dict:
    """Consecutive days through one WindowReleaser (one ledger): per window the alarm's state,
    the events, the exact flagged count per level, and the TRUE normal rate per level and of the alarm's weight;
    per day, the expected pages (``page_chances``)."""
    window = [0]
    with fresh_releaser(config, model, seed) as (releaser, accountant), page_chances(window) as chances:
        states, modes, n, F, R, W, own = [], [], [], [], [], [], []
        for i, X, scores, rec in released_windows(releaser, model, traffic, surges):
            window[0] = i + 1  # the next window's queries
            states.append(rec["alarm_detail"]["state"])
            modes.append(rec["alarm_detail"].get("compared_with"))
            n.append(X.shape[0])
            F.append((scores[:, None] > levels[None, :]).sum(axis=0))
            R.append(traffic.expected(i, pool_flags))
            W.append(traffic.expected(i, pool_weight))
            rows = traffic.own_rows(i)
            if rows is not None:  # persistent people: what the exact detector's quiet spread is drawn from
                own.append((rows.size, np.rint(pool_flags[rows].sum(axis=0)).astype(int),
                            traffic.rhythm.expected(traffic.time_of(i), pool_flags)))
        day = traffic.windows_per_day * config.window.size_seconds
        spent = [accountant.spent((d + 1) * day)[0] for d in range(traffic.days)]
        rung = getattr(releaser, "rung", 0)  # the levels the alarm weighs at since its first baseline
    people = None
    if own:
        online, heavy, fresh = (np.array(x) for x in zip(*own))
        people = {"online": online, "heavy": heavy, "fresh": fresh, "persistence": traffic.persistence,
                  "absence": traffic.absence}
    chance_at = chances_by_window(chances, len(states))
    day = np.minimum(np.arange(len(states)) // traffic.windows_per_day, traffic.days - 1)
    expected = np.bincount(day, weights=chance_at, minlength=traffic.days)
    return {"states": states, "modes": modes, "n": np.array(n), "F": np.array(F), "r": np.array(R), "w": np.array(W)[:, rung],
            "spent": spent, "people": people, "expected": expected, "chance_at": chance_at}


def exact_constants(n: np.ndarray, r: np.ndarray, rng: np.random.Generator, days: float,
                    people: "dict | None" = None) -> np.ndarray:
    """Per level, the smallest C with at most one window of f - r n >= C per 30 quiet days of this
    profile (n per window, r per window and level; f ~ Binomial(n, r): rows are drawn independently).
    With persistent people (``replay``'s ``people``) the exact detector knows everyone's own row:
    of the people online, the heavy ones (own row flagged) flag with probability (1 - absence)
    persistence, everyone with (1 - absence)(1 - persistence) times the fresh rows' rate, and the
    events are Binomial(online, 1 - absence): a narrower spread than independent rows'."""
    reps = int(math.ceil(QUIET_DAYS_SIMULATED / days))
    total_days = reps * days
    k = int(total_days // 30) + 1  # the k-th largest value: total_days / 30 windows lie above it
    if people is None:
        nn = np.tile(n, reps)
    else:
        online, stay, keep = np.tile(people["online"], reps), 1.0 - people["absence"], people["persistence"]
        nn = rng.binomial(online, stay)
    out = np.empty(r.shape[1])
    for j in range(r.shape[1]):
        rr = np.tile(r[:, j], reps)
        if people is None:
            f = rng.binomial(nn, rr)
        else:
            f = (rng.binomial(np.tile(people["heavy"][:, j], reps), stay * keep)
                 + rng.binomial(online, stay * (1.0 - keep) * np.tile(people["fresh"][:, j], reps)))
        stat = f - rr * nn
        out[j] = np.partition(stat, -k)[-k] + 1e-9
    return out


def run_traffic(label: str, fitted, seed: int, kind: str, people: int, days: int, window_seconds: float,
                swing: float, persistence: float = 0.0, absence: float = 0.0) -> RowTraffic:
    """The traffic of one run (``kind``: "quiet" or "surge") of ``run_config``: its rhythm from the
    label, a curve's strength for this set's flagged weight over the run's days, its first day and
    its seed."""
    _, _, T, A, bounds, _, _, pool_weight, _ = fitted
    rhythm = parse_rhythm(label)
    first_day = first_day_of(rhythm, seed, kind)
    target = curve_target(label)
    if target is not None:  # the strength for this set's flagged weight over this run's days
        rhythm = curve_strength(rhythm, target, T, pool_weight[:, 0], first_day, days, int(round(86400 / window_seconds)))
    return RowTraffic(T, A, bounds, people=people, days=days, window_seconds=window_seconds, swing=swing,
                      seed=seed * 7 + (kind == "quiet"), rhythm=rhythm, first_day=first_day,
                      persistence=persistence, absence=absence)


def run_config(base: MonitorConfig, name: str, seed: int, scales, rhythms: list[str], days: int,
               quiet_days: int, fitted=None, swing: float = 0.3, anytime: bool = True, persistence: float = 0.0,
               absence: float = 0.0):
    """Every scale and rhythm of one data set and seed (the model fitted once), one result at a time
    (``persistence``, ``absence``: ``RowTraffic``'s people)."""
    if fitted is None:
        fitted = fit_set(base, name, seed)
    config, cached, T, A, bounds, levels, pool_flags, pool_weight, flagged_share = fitted
    size = config.window.size_seconds
    warm = int(math.ceil(config.alarm.baseline_warmup_seconds / size))
    wpd = int(round(86400 / size))
    for people, share in scales:
        for label in rhythms:
            rhythm = parse_rhythm(label)
            target = curve_target(label)
            runs = {}
            strengths = {}
            for kind, n_days in (("quiet", quiet_days), ("surge", days)):
                if n_days <= 0:
                    continue
                traffic = run_traffic(label, fitted, seed, kind, people, n_days, size, swing, persistence, absence)
                if target is not None:
                    strengths[kind] = traffic.rhythm.rhythm.strength
                surges = (plan_surges(n_days, SURGES_PER_DAY, wpd, share, rng=seed * 13 + 1, kinds=("rows",), first=warm + 1,
                                       anytime=anytime)
                          if kind == "surge" else [])
                t0 = time.perf_counter()
                res = replay(config, cached, traffic, surges, seed * 101 + (kind == "quiet"), levels, pool_flags, pool_weight)
                res["seconds"] = time.perf_counter() - t0
                res["surges"] = surges
                runs[kind] = res
            rng = np.random.default_rng(seed + 555)
            # The exact detector's constant for each run's own profile of volume and true rate.
            C = {k: exact_constants(v["n"], v["r"], rng, len(v["n"]) / wpd, v["people"]) for k, v in runs.items()}
            r = {"set": name, "seed": seed, "people": people, "share": share, "rhythm": label,
                 "flagged_share": flagged_share, "seconds": sum(x["seconds"] for x in runs.values())}
            if strengths:
                r["strength"] = strengths
            if persistence or absence:
                r.update(persistence=persistence, absence=absence)
            if "quiet" in runs:
                q = runs["quiet"]
                st = q["states"]
                live = q["w"][warm:]
                # When each false page fell: (day of the week, 0 a Monday; hour), for rhythms with weekends.
                start = first_day_of(rhythm, seed, "quiet")
                r["false_page_times"] = [((start + i // wpd) % 7, (i % wpd) * 24 / wpd) for i, state in enumerate(st)
                                         if state == "fired"]
                r.update(quiet_days=len(st) / wpd, false_pages=st.count("fired"), false_pages_day1=st[:wpd].count("fired"), answered=sum(s in ANSWERED for s in st),
                         suppressed=st.count("suppressed"), warming=st.count("warming_up"), windows=len(st),
                         swing=float(q["w"].max() / q["w"].mean()) if q["w"].mean() > 0 else float("nan"),
                         rate_min=float(live.min()), rate_max=float(live.max()),
                         quiet_epsilon=max(q["spent"]),
                         exact_false=((q["F"] - q["r"] * q["n"][:, None]) >= C["quiet"][None, :]).sum(axis=0).tolist(),
                         expected_false_pages=float(q["expected"].sum()), expected_false_pages_day1=float(q["expected"][0]),
                         # Where the promise is spent: each quiet window's chance of paging and how it was compared.
                         quiet_chance_at=[round(float(x), 7) for x in q["chance_at"]], quiet_modes=q["modes"],
                         quiet_first_weekday=int(start),
                         # What `monitor budget` would say at the run's end (monitor.budget.plan.pages_measured).
                         budget_warning=pages_measured([((i + 1) * size, state) for i, state in enumerate(st)], len(st) * size,
                                                       size, config.alarm.false_pages_per_30_days)["beyond_promise"])
            if "surge" in runs:
                s = runs["surge"]
                starts = np.array([p.start for p in s["surges"]], dtype=int)
                stat = s["F"][starts] - s["r"][starts] * s["n"][starts, None]
                later = starts >= wpd  # from the second day on: the alarm has seen a day of the rhythm
                r.update(surges=int(starts.size), private_first=sum(s["states"][i] == "fired" for i in starts),
                         # Each surge's chance of paging in its first window, from its statistic and the run's noise:
                         # the expected count, with far less spread than the pages drawn (a measurement).
                         private_first_expected=float(s["chance_at"][starts].sum()),
                         private_first_expected_day1=float(s["chance_at"][starts[~later]].sum()),
                         exact_first=(stat >= C["surge"][None, :]).sum(axis=0).tolist(),
                         surges_day2=int(later.sum()), private_first_day2=sum(s["states"][i] == "fired" for i in starts[later]),
                         exact_first_day2=(stat[later] >= C["surge"][None, :]).sum(axis=0).tolist(),
                         surge_suppressed=s["states"].count("suppressed"),
                         surge_pages=s["states"].count("fired"),
                         # Pages in no surge's windows: false pages on the surge runs' days, which the
                         # quiet runs' count does not see (a surge's page next to a ramp changes later days).
                         surge_run_false=sum(state == "fired" and not any(p.covers(i) for p in s["surges"])
                                             for i, state in enumerate(s["states"])))
            yield r


def fit_set(base: MonitorConfig, name: str, seed: int):
    config, model, cached, T, A, bounds, normal_scores, levels, flagged_share = fit_real_set(base, name, seed)
    pool_flags = (normal_scores[:, None] > levels[None, :]).astype(float)
    pool_weight = alarm_weights(model, config, normal_scores)
    return config, cached, T, A, bounds, levels, pool_flags, pool_weight, flagged_share


def _range(values) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f} - {hi:.2f}"


def summarise(results: list[dict]) -> str:
    lines = ["| scale | rhythm | flagged weight's swing (max / mean) | quiet days | false pages | per 30 days | "
             "from day 2: per 30 days | from day 2: expected per 30 days | first days that paged | a deployment's first 30 days | windows answered / suppressed | epsilon in a quiet run's day (max) | exact false pages "
             "| surges | private, window 1 | exact, best level per set | private / exact | exact, best one level | "
             "private / exact at one level | from day 2: private / exact | surge runs: windows suppressed | "
             "surge runs: pages outside surges |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {label: k for k, label in enumerate(dict.fromkeys(r["rhythm"] for r in results))}
    for people, share in sorted({(r["people"], r["share"]) for r in results}):
        for label in sorted({r["rhythm"] for r in results}, key=order.get):
            rs = [r for r in results if (r["people"], r["share"], r["rhythm"]) == (people, share, label)]
            if not rs:  # a rhythm measured at another scale only
                continue
            q = [r for r in rs if "false_pages" in r]
            s = [r for r in rs if "surges" in r]
            qd = sum(r["quiet_days"] for r in q)
            fp = sum(r["false_pages"] for r in q)
            per30 = f"{30 * fp / qd:.1f}" if qd else "-"
            # Legacy results (saved before day 1 was counted apart) say "-".
            later_days = qd - len(q)
            if later_days > 0 and all("false_pages_day1" in r for r in q):
                day1 = sum(r["false_pages_day1"] for r in q)
                later = f"{30 * (fp - day1) / later_days:.1f}"
                # A deployment meets its first day once: that day's chance of a false page, then 29 days at
                # the later days' rate (the benchmark's short runs hold a first day in every few quiet days).
                first = f"{sum(r['false_pages_day1'] > 0 for r in q)} / {len(q)}"
                deployment = f"{day1 / len(q) + 29 * (fp - day1) / later_days:.1f}"
            else:
                later = first = deployment = "-"
            # Each quiet window's chance of paging, from its own statistic and the run's noise (``page_chances``).
            if later_days > 0 and all("expected_false_pages" in r for r in q):
                expected = sum(r["expected_false_pages"] - r["expected_false_pages_day1"] for r in q)
                later_expected = f"{30 * expected / later_days:.2f}"
            else:
                later_expected = "-"
            ans, sup = sum(r["answered"] for r in q), sum(r["suppressed"] for r in q)
            # The exact detector's own false pages at the level it is scored at per set: a check of its constant.
            by_set: dict[str, np.ndarray] = {}
            for r in s:
                by_set[r["set"]] = by_set.get(r["set"], 0) + np.array(r["exact_first"])
            best = {k: int(np.argmax(v)) for k, v in by_set.items()}
            exact_best = int(sum(by_set[k][best[k]] for k in by_set))
            # The "best single level": one level for every set, the best in hindsight.
            one_level = int(max(sum(by_set.values()))) if by_set else 0
            exact_fp = sum(r["exact_false"][best.get(r["set"], LEVELS.index(0.01))] for r in q)
            priv = sum(r["private_first"] for r in s)
            # The same from the second day of each surge run on, at the level chosen above (legacy results: "-").
            if s and all("private_first_day2" in r for r in s):
                priv2 = sum(r["private_first_day2"] for r in s)
                exact2 = sum(r["exact_first_day2"][best[r["set"]]] for r in s)
                day2 = f"{priv2} / {exact2} = {priv2 / max(exact2, 1):.2f}"
            else:
                day2 = "-"
            lines.append(
                f"| {people:,} / {share:.0%} | {label} | {_range([r['swing'] for r in q])} | {qd:.0f} | {fp} | {per30} | {later} | "
                f"{later_expected} | {first} | {deployment} | "
                f"{ans} / {sup} | {max((r['quiet_epsilon'] for r in q), default=float('nan')):.2f} | {exact_fp} | "
                f"{sum(r['surges'] for r in s)} | {priv} | {exact_best} | {priv / max(exact_best, 1):.2f} | {one_level} | "
                f"{priv / max(one_level, 1):.2f} | {day2} | "
                f"{sum(r['surge_suppressed'] for r in s)} | "
                f"{sum(r['surge_run_false'] for r in s) if s and all('surge_run_false' in r for r in s) else '-'} |")
    return "\n".join(lines)


WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def by_weekday(results: list[dict]) -> str:
    """Quiet runs' false pages by day of the week (where they fell), and their hours, per scale and rhythm."""
    lines = []
    for people, share in sorted({(r["people"], r["share"]) for r in results}):
        for label in dict.fromkeys(r["rhythm"] for r in results):
            runs = [r for r in results if (r["people"], r["share"], r["rhythm"]) == (people, share, label) and "false_pages" in r]
            times = [t for r in runs for t in r.get("false_page_times", [])]
            if times:
                days = ", ".join(f"{WEEKDAYS[d]} {sum(t[0] == d for t in times)}" for d in sorted({t[0] for t in times}))
                hours = np.bincount([int(h) // 3 for _, h in times], minlength=8)
                spread = ", ".join(f"{3 * k:02d}-{3 * k + 3:02d} h {c}" for k, c in enumerate(hours) if c)
                warned = [r["budget_warning"] for r in runs if "budget_warning" in r]
                said = f"; `monitor budget` warns at the end of {sum(warned)} of {len(warned)} runs" if warned else ""
                lines.append(f"- {people:,} / {label}: {days} (by hour: {spread}){said}{_second_week(runs)}")
    return "\n".join(lines)


def _second_week(runs: list[dict]) -> str:
    """The expected false pages per 30 days from each quiet run's eighth day on (a week of history:
    the same weekday a week back exists), where the runs are that long."""
    long = [r for r in runs if r["quiet_days"] > 7 and "quiet_chance_at" in r]
    if not long:
        return ""
    wpd = round(len(long[0]["quiet_chance_at"]) / long[0]["quiet_days"])
    expected = sum(sum(r["quiet_chance_at"][7 * wpd:]) for r in long)
    days = sum(r["quiet_days"] - 7 for r in long)
    return f"; from day 8 (a week of history): expected {30 * expected / days:.2f} per 30 days over {days:.0f} days"


def per_set(results: list[dict]) -> str:
    lines = ["| data set | rhythm | swing | false pages / quiet days (both scales) | suppressed windows | private / exact best, both scales |",
             "|---|---|---|---|---|---|"]
    order = {label: k for k, label in enumerate(dict.fromkeys(r["rhythm"] for r in results))}
    for name in sorted({r["set"] for r in results}):
        for label in sorted({r["rhythm"] for r in results if r["set"] == name}, key=order.get):
            rs = [r for r in results if r["set"] == name and r["rhythm"] == label]
            q = [r for r in rs if "false_pages" in r]
            s = [r for r in rs if "surges" in r]
            ex = 0
            for sc in {(r["people"], r["share"]) for r in s}:
                ex += int(sum(np.array(r["exact_first"]) for r in s if (r["people"], r["share"]) == sc).max())
            lines.append(f"| {name} | {label} | {_range([r['swing'] for r in q])} | {sum(r['false_pages'] for r in q)} / "
                         f"{sum(r['quiet_days'] for r in q):.0f} | {sum(r['suppressed'] for r in q)} | "
                         f"{sum(r['private_first'] for r in s)} / {ex} |")
    return "\n".join(lines)


# What the --trend-error section says above its table.
TREND_ERROR_PREFACE = """Before a day of history the rhythm reference predicts each person's window from the least-squares line
through their last `alarm.trend_windows` (10) windows; the predictions' sum is the same line through the window
totals. Here that line runs through the TRUE aggregate (w_w - tau) n_w of one day at 10,000 people (w_w the expected
weight per normal event, n_w the events with their +-30 % swing, tau the night warm-up's rate), with no sampling
noise: its miss, as a share of the window's normal flagged count, is what `alarm.trend_error` (0.02) stands for.
A smooth wave within the goal's swing of 2.5 x is missed by at most 0.007 of the normal count, one of up to 2.8 x by
0.028; a shift change within the hour by up to 1.35 at its kinks, which no margin covers (the first day pages
there: docs/alarm.md). Before this was measured the margin was 0.05."""

# The sections this script writes, and what each adds to the title.
TITLES = {"alarm-rhythm": "", "alarm-rhythm-before": " - before (the alarm with one daily baseline rate)",
          "alarm-rhythm-large-fleet": " - a large fleet with sparser levels",
          "alarm-rhythm-weekend": " - a weekend that differs, with alarm.weekend_days",
          "alarm-rhythm-persistent": " - persistent people",
          "alarm-rhythm-real-curve": " - a real demand curve with its weekends"}

PREFACE = """Every shared set with 3,000+ rows, fitted and replayed as in [alarm-real.md](alarm-real.md) (half the
inliers fit the model with the shipped `config.yaml`; the production `WindowReleaser` per 5-minute window, seeded
noise, a fresh ledger per run), with a rhythm in the normal traffic: rows drawn at window w with weight
exp(a(w) . u), u a row's standardised principal components on the traffic pool (`monitor.data.rhythm`). `wave G`:
a = G sin(2 pi w / 288) on the first component; `switch G`: -G by night, +G by day, the mixture moving over one hour
at 07:00 and 19:00; `weekly G`: the wave on weekdays, on the second component on Saturday and Sunday (runs start on a
Friday); `stationary`: gamma 0. Events per window swing +-30 % over the day (`--swing`). A run is several consecutive days through
one releaser and ledger. Swing: max / mean over the run of the TRUE expected weight per normal event the alarm counts
(its graded flag). Quiet days count false pages; each quiet run starts with a first day (no history yet), so a
deployment's first 30 days count the first days' false pages once (their share of runs that paged on the first day,
`first days that paged`) and 29 days at the later days' rate. `from day 2: expected per 30 days`: the false pages
those days average to, each quiet window's chance of paging from its own statistic and the run's noise summed (a
measurement that reads the private statistic; far less spread than the few pages drawn). `answered` windows got a yes/no (quiet, fired, held),
`suppressed` ones none (the budget was spent). Surges: 6 a day, 3 windows each, the set's outliers from a share of the people online,
counted when they page in their first window. Exact: f_w - r_w n_w at one flag level with r_w each window's TRUE
normal rate, above the smallest constant with 1 false page per 30 days (300+ simulated quiet days of the same rhythm),
at the best level in hindsight per data set, and at the best one level for every set (`best one level`: the goal's
best single level); `exact false pages` is the per-set detector on the quiet days (expected about
1 per 30). `surge runs: pages outside surges`: pages in none of a surge's windows on the surge runs' days,
false pages the quiet runs cannot show (a surge that paged next to a ramp changes the next days there)."""


# What the real curve's section says above its table (the columns are those of the sections above).
CURVE_PREFACE = """Traffic shaped by a real curve: half-hourly electricity demand in England and Wales, 12 weeks from Monday
5 June 2000 (Taylor 2003; `bench/curves/taylor.csv`, copied from PyPI's pmdarima, `--check-curve`). The events per
window follow the demand in proportion (0.62 to 1.30 times the mean number online; a weekend day 16 to 20 % lower), and the
normal rows are tilted along their first principal component by the normalised demand, at the strength that swings
the alarm's flagged weight (its TRUE expected value per normal event, max / mean over the run) to the rhythm's number:
`taylor 2` = 2x, `taylor 3` = 3x, found per set (`strength_for_swing`); where no strength up to 8 reaches it the swing
column says what was reached. Persistent people keep their first day's own rows 8 windows in 10, so their mixture
swings less. Each run is 7 days from a Wednesday (seed 1: the quiet runs on the curve's first week, the surge runs on its second), so the
rhythm mode meets a Saturday compared with Friday and Thursday and a Monday compared with Sunday and Saturday. Every
window through the production `WindowReleaser` (shipped `config.yaml`, seeded noise, a fresh ledger per run);
surges, the exact detector and the columns as in the sections above (6 surges a day of the set's outliers, counted
in their first window; exact: the rate-knowing detector at 1 false page per 30 days, best level per set)."""


def trend_errors(base: MonitorConfig, sets: list[str], rhythms: list[str], people: int = 10_000,
                 swing: float = 0.3) -> list[dict]:
    """How far the first day's trend misses each rhythm, as a share of the normal flagged count:
    the least-squares line through the last ``alarm.trend_windows`` windows of the aggregate
    G_w = (w_w - tau) n_w, extrapolated one window, against G itself (w_w the TRUE expected weight
    per normal event, n_w the events, tau the rate of the 3-hour warm-up at night). The sum of the
    reference's per-person predictions is that line (the coefficients are the same for every person),
    so this is the prediction's error before any sampling noise."""
    size = base.window.size_seconds
    wpd = int(round(86400 / size))
    warm = int(math.ceil(base.alarm.baseline_warmup_seconds / size))
    k = base.alarm.trend_windows
    coef = trend_coefficients(range(k), k)
    out = []
    for name in sets:
        _, _, T, A, bounds, _, _, pool_weight, _ = fit_set(base, name, 1)
        for label in rhythms:
            rhythm = parse_rhythm(label)
            traffic = RowTraffic(T, A, bounds, people=people, days=1, window_seconds=size, swing=swing, seed=1,
                                 rhythm=rhythm, first_day=WEEKLY_FIRST_DAY if rhythm.kind == "weekly" else 0)
            w = np.array([np.atleast_1d(traffic.expected(i, pool_weight))[0] for i in range(wpd)])
            n = np.array([traffic.online(i) for i in range(wpd)], dtype=float)
            g = (w - w[:warm].mean()) * n
            miss = np.array([g[i] - coef @ g[i - k:i] for i in range(k, wpd)]) / (w[k:] * n[k:])
            out.append({"set": name, "rhythm": label, "swing": float(w.max() / w.mean()),
                        "rms": float(np.sqrt(np.mean(miss ** 2))), "max": float(np.abs(miss).max())})
    return out


def first_day_misses(base: MonitorConfig, sets: list[str], label: str, seeds: range, quiet_days: int,
                     people: int = 1500, swing: float = 0.3) -> str:
    """``--first-day-misses``: on each quiet run's first day (the traffic ``run_config`` replays, the same
    seeds), how far each line and parabola through the last windows, extrapolated one window, misses the
    TRUE expected flagged weight of the window (events, before any sampling noise; positive: the prediction
    lies under it, which lifts the statistic toward a page). The first day's predictions are these lines;
    a parabola is what a curved ramp would need."""
    size = base.window.size_seconds
    wpd = int(round(86400 / size))
    warm = int(math.ceil(base.alarm.baseline_warmup_seconds / size))
    fits = {f"line {base.alarm.steady_windows}": (base.alarm.steady_windows, 1),
            f"line {base.alarm.trend_windows}": (base.alarm.trend_windows, 1),
            "parabola 18": (18, 2), "parabola 24": (24, 2), "parabola 36": (36, 2)}
    coef = {k: (np.vander([float(n)], d + 1) @ np.linalg.pinv(np.vander(np.arange(n, dtype=float), d + 1))).ravel()
            for k, (n, d) in fits.items()}
    lines = ["| set | seed | window of the short line's largest miss | expected weight there | " + " | ".join(coef) + " |",
             "|---|---|---|---|" + "---|" * len(coef)]
    for name in sets:
        for seed in seeds:
            fitted = fit_set(base, name, seed)
            pool_weight = fitted[7]
            traffic = run_traffic(label, fitted, seed, "quiet", people, quiet_days, size, swing)
            g = np.array([np.atleast_1d(traffic.expected(i, pool_weight))[0] * traffic.online(i) for i in range(wpd)])
            miss = {k: np.array([g[i] - c @ g[i - c.size:i] for i in range(warm, wpd)]) for k, c in coef.items()}
            at = int(np.argmax(miss[f"line {base.alarm.trend_windows}"]))
            lines.append(f"| {name} | {seed} | {warm + at} ({(warm + at) * size / 3600:.2f} h) | {g[warm + at]:.0f} | "
                         + " | ".join(f"{m[at]:.1f} (largest {m.max():.1f})" for m in miss.values()) + " |")
    return "\n".join(lines)


def trend_error_table(rows: list[dict]) -> str:
    lines = ["| data set | rhythm | flagged weight's swing (max / mean) | trend's miss / normal count: root mean square | largest |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['set']} | {r['rhythm']} | {r['swing']:.2f} | {r['rms']:.4f} | {r['max']:.3f} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one set, one seed, wave 0.5 (and both scales)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1): more seeds for rows run before")
    ap.add_argument("--sets", nargs="*", help="data sets (default: every set with at least 3,000 rows)")
    ap.add_argument("--scales", nargs="*", help="people:share, e.g. 1500:0.05 10000:0.01 (default both)")
    ap.add_argument("--rhythms", nargs="*", help=f"rhythms, e.g. 'wave 0.5' or wave:0.5, or 'taylor 2' (the real curve, its number the flagged weight's swing) (default: {', '.join(RHYTHMS)})")
    ap.add_argument("--days", type=int, default=3, help="days of a surge run (default 3)")
    ap.add_argument("--quiet-days", type=int, default=3, help="days of a quiet run (default 3)")
    ap.add_argument("--swing", type=float, default=0.3, help="events per window swing by +-this share over the day (default 0.3)")
    ap.add_argument("--persistence", type=float, default=0.0, help="each window a person sends their own row for the hour "
                    "with this probability (default 0: independent rows)")
    ap.add_argument("--absence", type=float, default=0.0, help="a person online skips a window with this probability "
                    "(default 0)")
    ap.add_argument("--grid-surges", action="store_true", help="surges on plan_surges' grid of slots, where most recur at the "
                    "hour of one the day before (default: at any window, as independent surges would)")
    ap.add_argument("--config", default=str(REPO / "config.yaml"))
    ap.add_argument("--alarm-config", action="append", default=[], metavar="KEY=VALUE",
                    help="override a setting (alarm.KEY, or SECTION.KEY), e.g. false_pages_per_30_days=1; repeatable")
    ap.add_argument("--json", type=Path, help="write every result here")
    ap.add_argument("--from-json", type=Path, nargs="*", help="summarise (and --write) saved results without running")
    ap.add_argument("--command", help="with --from-json: the command that produced them")
    ap.add_argument("--seconds", type=float, help="with --from-json: how long that run took")
    ap.add_argument("--section", default="alarm-rhythm", choices=tuple(TITLES),
                    help="the page section --write replaces")
    ap.add_argument("--note", default="", help="a line written under the section's title (e.g. which alarm ran)")
    ap.add_argument("--appendix", type=Path, help="a markdown file written at the section's end (e.g. a before and after)")
    ap.add_argument("--write", action="store_true", help="write the section of docs/benchmarks/alarm-rhythm.md")
    ap.add_argument("--trend-error", action="store_true", help="how far the first day's trend misses each rhythm (no replay)")
    ap.add_argument("--first-day-misses", action="store_true", help="how far the first day's lines and a parabola miss "
                    "the true expected weight of each quiet run's first day (no replay; --rhythms: one)")
    ap.add_argument("--check-curve", action="store_true", help="check bench/curves/taylor.csv against pmdarima (extra 'curves')")
    args = ap.parse_args()
    if args.check_curve:
        check_curve()
        return
    base = apply_overrides(load_config(args.config), args.alarm_config)
    sets = args.sets or (["38_thyroid"] if args.quick else datasets())
    seeds = 1 if args.quick else args.seeds
    scales = [(int(s.split(":")[0]), float(s.split(":")[1])) for s in args.scales] if args.scales else SCALES
    rhythms = _join_strengths(args.rhythms) if args.rhythms else (["wave 0.5"] if args.quick else RHYTHMS)
    for label in rhythms:
        try:
            parse_rhythm(label)
        except (ValueError, IndexError) as err:
            ap.error(f"--rhythms {label!r}: {err}")
    t0 = time.perf_counter()
    if args.trend_error:
        table = trend_error_table(trend_errors(base, sets, rhythms if args.rhythms else [r for r in RHYTHMS if r.startswith(("wave", "switch"))]))
        print(table)
        if args.write:
            write_run("alarm-trend-error", "How far the first day's trend misses each rhythm",
                      f"{TREND_ERROR_PREFACE}\n\n{table}", time.perf_counter() - t0, one_core=False)
        return
    if args.first_day_misses:
        print(first_day_misses(base, sets, rhythms[0], range(args.first_seed, args.first_seed + seeds), args.quiet_days,
                               *(scales[0][:1] if args.scales else ())))
        return
    results: list[dict] = []
    for path in args.from_json or []:
        results += json.loads(path.read_text())
    for name in ([] if args.from_json else sets):
        for seed in range(args.first_seed, args.first_seed + seeds):
            fitted = fit_set(base, name, seed)
            for r in run_config(base, name, seed, scales, rhythms, args.days, args.quiet_days, fitted, args.swing,
                                   anytime=not args.grid_surges, persistence=args.persistence, absence=args.absence):
                results.append(r)
                print(f"{r['people']:>6} {name:16s} seed {seed} {r['rhythm']:12s}: swing {r.get('swing', float('nan')):.2f}, "
                      f"false {r.get('false_pages')} in {r.get('quiet_days', 0):.0f} d, suppressed {r.get('suppressed')}, "
                      f"private {r.get('private_first')}/{r.get('surges')}, exact best {max(r.get('exact_first', [0]))}, "
                      f"{r['seconds']:.0f} s", flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    if len({r.get("persistence", 0.0) for r in results}) > 1:  # both kinds of people in one table: say which
        for r in results:
            if r.get("persistence") and "persistent" not in r["rhythm"]:
                r["rhythm"] += f", persistent {r['persistence']:g} / absent {r['absence']:g}"
    table, detail = summarise(results), per_set(results)
    when = by_weekday(results)
    if when:
        detail += "\n\nWhere the quiet runs' false pages fell (day of the week, window start):\n\n" + when
    print(table)
    print()
    print(detail)
    if args.write:
        took = args.seconds if args.seconds is not None else time.perf_counter() - t0
        note = f"{args.note}\n\n" if args.note else ""
        write_run(args.section, "Surge alarm on rhythmic traffic" + TITLES[args.section],
                  f"{note}{CURVE_PREFACE if args.section == 'alarm-rhythm-real-curve' else PREFACE}\n\n{table}\n\n"
                  f"Per data set:\n\n{detail}" + (f"\n\n{args.appendix.read_text().strip()}" if args.appendix else ""),
                  took, args.command)


if __name__ == "__main__":
    main()
