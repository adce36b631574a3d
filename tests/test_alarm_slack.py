"""The run's slack against the rhythm reference follows the reference (monitor.alarm.slack): the clip's
lift worked out exactly, counted in the threshold, and a run that opens once the reference knows the
day narrower than the configured slack, with its noise and its clip at that interval."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest

from monitor.alarm import RESOLUTION, BaselineEstimate, SurgeAlarm
from monitor.alarm.slack import clip_lift, expected_lift
from monitor.alarm.units import rhythm_interval
from monitor.data.traffic import Surge

from test_alarm_rhythm import _release_days, _vitals_releaser

RHYTHM = [1 / 12] * 12 + [0.1] * 10 + [-1 / 24] * 24  # the rhythm mode's prediction over two days of history
TREND = [-0.2, -2 / 15, -1 / 15, 0.0, 1 / 15, 2 / 15, 0.2, 4 / 15, 1 / 3, 0.4]  # the first day's, through 10 windows


def _brute_force(coefficients, level, kappa, low, slope=0.0):
    """E[((1 + slope) sum c_j w_j - low)+] over every pattern of two-point weights (kappa w.p. level / kappa)."""
    p = level / kappa
    total = 0.0
    for pattern in itertools.product((0, 1), repeat=len(coefficients)):
        x = (1 + slope) * kappa * sum(c for c, b in zip(coefficients, pattern) if b)
        total += p ** sum(pattern) * (1 - p) ** (len(pattern) - sum(pattern)) * max(0.0, x - low)
    return total


@pytest.mark.parametrize("coefficients,low", [
    ([0.4, 0.4, 0.2], 0.4),            # a sum at exactly the low end lifts nothing
    ([0.25, 0.25, 0.25, 0.25], 0.5),   # duplicates: many patterns at one value
    ([0.6, -0.3, 0.5, -0.1, 0.3], 0.3),  # negative coefficients (the hour before, a trend's first windows)
    ([1.0, 0.0, 0.0], 0.25),           # zeros (a bridged window's share moved away)
    ([0.1] * 10, 0.15),
])
@pytest.mark.parametrize("level,kappa", [(0.05, 1.0), (0.03, 0.6), (0.2, 0.37)])
@pytest.mark.parametrize("slope", [0.0, 0.3])
def test_the_lift_is_exact_against_every_weight_pattern(coefficients, low, level, kappa, slope):
    """The lattice's sum agrees with enumerating every pattern of weights, adversarial predictions
    included (exact ties at the low end, duplicates, negative and zero coefficients), to the
    lattice's rounding of the coefficients (1/400 of a weight each)."""
    got = clip_lift(coefficients, level, kappa, low, slope)
    want = _brute_force(coefficients, level, kappa, low, slope)
    assert got == pytest.approx(want, abs=len(coefficients) / 400 * (1 + slope) * level + 1e-12)


@pytest.mark.parametrize("coefficients", [RHYTHM, TREND])
def test_the_lift_agrees_with_simulated_people(coefficients):
    """For the shipped predictions (46 and 10 windows: too many patterns to enumerate), 400,000
    simulated light people, each window's weight drawn afresh, are lifted by the clip as the lattice
    says, within four standard errors."""
    rng = np.random.default_rng(11)
    level, kappa, low = 0.03, 0.6, 0.2
    c = np.asarray(coefficients)
    flagged = rng.random((400_000, c.size)) < level / kappa
    two_point = np.clip(flagged * kappa @ c - low, 0, None)
    assert clip_lift(c, level, kappa, low) == pytest.approx(two_point.mean(), rel=4 * two_point.std() / 632 / two_point.mean())


def test_the_lift_falls_with_the_slack_and_grows_with_the_level_and_slope():
    lifts = [clip_lift(RHYTHM, 0.03, 0.6, low) for low in (0.1, 0.2, 0.3, 0.4, 0.6)]
    assert all(a > b for a, b in zip(lifts, lifts[1:])) and lifts[-1] < 1e-9
    assert clip_lift(RHYTHM, 0.06, 0.6, 0.3) > clip_lift(RHYTHM, 0.03, 0.6, 0.3)
    assert clip_lift(RHYTHM, 0.03, 0.6, 0.3, slope=0.4) > clip_lift(RHYTHM, 0.03, 0.6, 0.3)
    assert expected_lift(RHYTHM, 0.03, 0.6, 3000, 0.3) == pytest.approx(2 * expected_lift(RHYTHM, 0.03, 0.6, 1500, 0.3))
    with pytest.raises(ValueError, match="kappa"):
        clip_lift(RHYTHM, 0.03, 0.0, 0.3)


def test_the_threshold_counts_the_lift_of_its_interval():
    """The level line with the prediction counted lies above the one without by what narrowing the
    interval adds to the clip's lift: nothing at the configured slack, many events at a slack of 0.05,
    where the clip would otherwise lift the statistic into false pages."""
    wide, narrow = round(0.5 * RESOLUTION), round(0.05 * RESOLUTION)
    alarm = SurgeAlarm(0.6, 0.5, None, false_pages_per_30_days=1.0, kappa=0.6, traffic_swing=0.3, slack_units=wide)
    est = BaselineEstimate(rate=0.03, events_per_window=1500, span_start=0, span_end=1, span_windows=1, epsilon=0.1,
                           kappa=0.6)

    def line(slack, prediction):
        return alarm.level_line(est, 0.225, 0.0, 1.0, 0.01, rhythm_interval(0.03, slack), prediction)[2]

    assert line(wide, RHYTHM) == line(wide, ())
    assert line(wide, TREND) == line(wide, ())
    assert line(narrow, RHYTHM) > line(narrow, ()) + 20
    # The threshold without the lift falls with the slack (the pages' noise narrows) ...
    assert line(narrow, ()) < line(wide, ())
    # ... and with it, it is lowest in between: what a run's slack is chosen by.
    middle = min(line(s, RHYTHM) for s in range(round(0.1 * RESOLUTION), wide, round(0.05 * RESOLUTION)))
    assert middle < min(line(wide, RHYTHM), line(narrow, RHYTHM))


def test_a_run_opens_narrower_once_the_reference_knows_the_day(tmp_path, vitals_model):
    """Three days of 400 people with a surge a day (each page ends its run at midnight): the runs of the
    first two days open at the configured slack or near it, the third day's, against two days of
    history, narrower; its noise covers exactly its interval and the published thresholds are the
    alarm's own, lift included."""
    releaser = _vitals_releaser(tmp_path, vitals_model, epsilon=12.0)
    opened = []
    open_run = releaser.alarm.open_run

    def spy(run_id, baseline=None, slack_units=None):
        opened.append((run_id, slack_units))
        return open_run(run_id, baseline, slack_units)

    releaser.alarm.open_run = spy
    surges = [Surge(start=w, windows=1, share=0.3, kind="clustered", center=(84.0, 150.0)) for w in (40, 130, 230)]
    details = _release_days(releaser, 3, surges)
    configured = releaser.reference.slack_units
    assert [s for _, s in opened][0] == configured  # the first day's trend: the configured slack
    assert opened[-1][1] < configured
    alarm = releaser.alarm
    assert alarm.slack_units == opened[-1][1]
    assert alarm.low_units == alarm._band[1] + alarm.slack_units  # the clip the reference gets (RhythmReference.compare)
    assert alarm.svt.width == RESOLUTION + alarm.low_units and alarm.svt.drift == 0
    assert [d["state"] for d in details].count("fired") == 3
    # Each answer states its run's slack (public): the first day's the configured one, the last the narrower.
    answered = [d for d in details if d["state"] in ("quiet", "fired", "held")]
    assert answered[0]["slack"] == configured / RESOLUTION
    assert answered[-1]["slack"] == opened[-1][1] / RESOLUTION
    # A run lasts the day and the lift grows with the level: the slack is chosen by the thresholds at the
    # profile's quietest, middle and busiest parts, so a day that is busy by day opens wider than one at the
    # night's level all day (where the lift is least).
    est, index = releaser.baseline.estimate, 3 * 96

    def slack(shape):
        return releaser._slack_for(index, dataclasses.replace(est, profile_shape=shape, profile=shape))

    switch = tuple(2.5 if 7 <= h < 19 else 0.5 for h in range(24))
    assert slack(switch) > slack((0.5,) * 24)
