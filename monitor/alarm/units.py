"""The surge statistic's integer units, shared by the alarm and its calibration.

The statistic RESOLUTION a_i = U_i - m n_i is an integer (U_i the window's weight units, m
the run's tau in 1 / RESOLUTION), so every comparison is exact (DESIGN 8). A run's tau may
move within a public band of width TAU_BAND (``monitor.alarm.surge``).
"""

from __future__ import annotations

__all__ = ["RESOLUTION", "TAU_BAND", "BAND_UNITS"]

# Integer units per event of the statistic: tau is a multiple of 1 / RESOLUTION.
RESOLUTION = 1 << 12
# Width of the band a run's tau may move in (public). Normal flagged rates drift by far
# less within a run; the price is page noise 10 % wider, against a new run's threshold
# (epsilon_threshold) every time a refreshed baseline moved tau at all.
TAU_BAND = 0.1
BAND_UNITS = round(TAU_BAND * RESOLUTION)
