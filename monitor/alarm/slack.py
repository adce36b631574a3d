"""How narrow a run's interval against the rhythm reference may be (docs/alarm.md#traffic-with-a-daily-rhythm;
the interval's proof: docs/proofs/rhythm-interval.md).

Each person's term against the rhythm reference is clipped to [-L, 1] with L = the top of the
run's tau band + the slack (``SurgeAlarm.open_run``), and the pages' noise grows with the width
1 + L: it is the largest cost of privacy left in the statistic (measured by ``bench_alarm_ceiling.py``:
docs/benchmarks/alarm-rhythm.md#the-statistics-ceiling-on-stationary-traffic). A narrower interval
has one price, the clip at -L: a person who weighs nothing now but whose prediction is heavy
(flagged in the windows the prediction weighs most) has a term below -L, and clipping it lifts the
statistic. How much is a matter of the prediction's coefficients (public: the calendar and which
windows paged) and of the share of people weighed (public: the released rate, profile and kappa),
so the threshold can count it (``SurgeAlarm.level_line``, at every level its line covers) and a run
can choose its slack from it before its first query (``WindowReleaser``: once the reference
compares with the days before, the slack whose threshold, lift included, is lowest; the first day's
trend keeps the configured slack). The guarantee is unchanged: the run's noise covers whatever
interval it opened with, and the clip keeps every term inside it.

The model. A person who weighs nothing now and sent an event in every window of the prediction
has the term -(1 + beta) sum_j c_j w_j (``RhythmReference.compare``, beta the level line's slope;
the rate's part cancels: the coefficients sum to 1). Each w_j is drawn afresh at the level h with
E[w^2] = kappa h: the two-point weight kappa with probability h / kappa is the one with that mean
and second moment. The expected lift is then n (1 - h / kappa) E[(-term - L)+], worked out exactly
over a lattice of the coefficients (``clip_lift``). People who keep their weight from window to
window are more like their own past, which makes the lift smaller; a heavy person missing now makes
it larger, and that is what the configured slack (0.5) was chosen for: it stays the most a run uses.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["clip_lift", "expected_lift", "SLACK_STEP"]

# Slacks are tried in steps of a twentieth: few derivations of the threshold per run.
SLACK_STEP = 0.05
# The lattice the coefficients are rounded to (in weight units): fine against a slack step.
_LATTICE = 1.0 / 400


def clip_lift(coefficients: Sequence[float], level: float, kappa: float, low: float, slope: float = 0.0) -> float:
    """E[(X - ``low``)+] with X = (1 + ``slope``) sum_j c_j w_j and each w_j = ``kappa`` with
    probability ``level`` / ``kappa``, else 0, independently: by how much, on average, the clip of
    one person's term at -``low`` lifts the statistic, for a person who weighs nothing now and sent
    an event in every window of the prediction (module docstring). Exact up to the coefficients'
    rounding to 1/400 of a weight.

    >>> round(clip_lift([1.0], 0.1, 1.0, 0.5), 6)    # weighs 1 w.p. 0.1: lifted by 0.5 then
    0.05
    >>> round(clip_lift([0.5, 0.5], 0.1, 1.0, 0.75), 6)    # both weigh 1 w.p. 0.01
    0.0025
    """
    c = np.asarray(coefficients, dtype=float).reshape(-1)
    if not (0.0 < kappa <= 1.0) or level < 0 or low < 0 or slope < 0:
        raise ValueError(f"need 0 < kappa <= 1 and level, low, slope >= 0, got {kappa!r}, {level!r}, {low!r}, {slope!r}")
    p = min(1.0, level / kappa)
    if c.size == 0 or p == 0.0:
        return 0.0
    steps = np.rint((1.0 + slope) * kappa * c / _LATTICE).astype(np.int64)
    steps = steps[steps != 0]
    offset = int(-steps[steps < 0].sum())
    dist = np.zeros(offset + int(steps[steps > 0].sum()) + 1)
    dist[offset] = 1.0
    for s in steps:  # one two-point weight at a time
        moved = np.zeros_like(dist)
        if s > 0:
            moved[s:] = dist[:-s]
        else:
            moved[:s] = dist[-s:]
        dist = (1.0 - p) * dist + p * moved
    values = (np.arange(dist.size) - offset) * _LATTICE
    return float(np.dot(dist, np.clip(values - low, 0.0, None)))


def expected_lift(coefficients: Sequence[float], level: float, kappa: float, events: float, low: float,
                  slope: float = 0.0) -> float:
    """By how much the clip at -``low`` lifts a window's statistic on average, in events: ``events``
    people, a share ``level`` of the weight expected (the busiest hour's), ``kappa`` = E[w^2] / E[w], a
    prediction with these ``coefficients`` (summing to 1) and the level line's ``slope``; the people
    light now (1 - ``level`` / ``kappa`` of them) times ``clip_lift``. Public inputs only.

    >>> rhythm = [1 / 12] * 12 + [0.1] * 10 + [-1 / 24] * 24     # two days of history
    >>> [round(expected_lift(rhythm, 0.03, 0.6, 1500, low), 2) for low in (0.2, 0.3, 0.6)]
    [0.45, 0.01, 0.0]
    """
    return max(float(events), 0.0) * (1.0 - min(1.0, level / kappa)) * clip_lift(coefficients, level, kappa, low, slope)
