"""Continual private surge alarms (docs/alarm.md; proofs: docs/proofs/README.md): private maths only, no broker.

- ``AboveThreshold``: sparse vector runs over exact integer queries;
- ``BaselineTracker`` / ``BaselineEstimate``: the normal flagged rate, released on a public schedule;
- ``SurgeAlarm`` / ``AlarmAnswer``: one private yes/no per window, paying only when it pages;
- ``RhythmReference``: what a window is compared with, following the traffic's daily rhythm.
"""

from monitor.alarm.above_threshold import AboveThreshold
from monitor.alarm.baseline import BaselineEstimate, BaselineTracker
from monitor.alarm.reference import Comparison, RhythmReference
from monitor.alarm.surge import RESOLUTION, AlarmAnswer, SurgeAlarm

__all__ = ["AboveThreshold", "BaselineEstimate", "BaselineTracker", "SurgeAlarm", "AlarmAnswer", "RESOLUTION",
           "RhythmReference", "Comparison"]
