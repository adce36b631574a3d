"""The surge statistic's integer units, shared by the alarm and its calibration.

The statistic RESOLUTION a_i = U_i - m n_i is an integer (U_i the window's weight units, m
the run's tau in 1 / RESOLUTION), so every comparison is exact (docs/design.md#floating-point). A run's tau may
move within a public band of width TAU_BAND (``monitor.alarm.surge``); why the interval and the band
keep a run's guarantee: docs/proofs/alarm-run.md.
"""

from __future__ import annotations

__all__ = ["RESOLUTION", "TAU_BAND", "BAND_UNITS", "rate_units", "band_around", "rhythm_interval"]

# Integer units per event of the statistic: tau is a multiple of 1 / RESOLUTION.
RESOLUTION = 1 << 12
# Width of the band a run's tau may move in (public). Normal flagged rates drift by far
# less within a run; the price is page noise 10 % wider, against a new run's threshold
# (epsilon_threshold) every time a refreshed baseline moved tau at all.
TAU_BAND = 0.1
BAND_UNITS = round(TAU_BAND * RESOLUTION)


def rate_units(rate: float) -> int:
    """A rate in [0, 1] as the statistic's m, in 1 / RESOLUTION (post-processing: rounded)."""
    return round(min(1.0, max(0.0, rate)) * RESOLUTION)


def band_around(rate: float) -> tuple[int, int]:
    """A run's band of width TAU_BAND inside [0, 1] (in 1 / RESOLUTION), centred on ``rate`` where it fits.

    >>> band_around(0.5), band_around(0.0)
    ((1843, 2253), (0, 410))
    """
    lo = min(max(rate_units(rate) - BAND_UNITS // 2, 0), RESOLUTION - BAND_UNITS)
    return lo, lo + BAND_UNITS


def rhythm_interval(rate: float, slack_units: int) -> tuple[int, int]:
    """(width, reach) of a run against the rhythm reference, in 1 / RESOLUTION: each term lies in
    [-(top of the tau band + slack), RESOLUTION]; the pages' noise covers the width, the
    threshold's the larger move in one direction (``AboveThreshold``).

    >>> rhythm_interval(0.03, 2048)
    (6554, 4096)
    """
    low = band_around(rate)[1] + int(slack_units)
    return RESOLUTION + low, max(RESOLUTION, low)
