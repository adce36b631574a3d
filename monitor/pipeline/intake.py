"""Notice traffic that stops: a window without events is released as ``quiet``.

A monitor whose producers send elsewhere (a broker left over from a crash, a renamed topic,
a stopped device gateway) releases every window as ``quiet``: to the private alarm an empty
window is a calm one. This watch counts stage 1's accepted events per wall-clock window of
``window.size_seconds`` (the windows' own grid) and

- exports them on the operational endpoint (NOT private): ``dp_monitor_last_accepted_timestamp_seconds``,
  ``dp_monitor_intake_last_window_events``, ``dp_monitor_intake_usual_window_events`` (the mean of
  up to 12 windows before the last) and ``dp_monitor_intake_window_seconds``, which the rules
  ``DPMonitorNoIntake`` and ``DPMonitorIntakeCollapsed`` read (deploy/prometheus/rules);
- logs a WARNING once when a whole window passes without an accepted event (since the start,
  or after traffic), and once when a window falls below ``COLLAPSED`` of the usual count;
  an INFO line when events arrive again.

These are exact counts of raw events, like the other operational metrics: outside the
privacy guarantee, for operators only (docs/privacy.md).

>>> import logging
>>> watch = IntakeWatch(size=60.0, started_at=30.0, where="topic t on 127.0.0.1:9092")
>>> watch.observe(5, now=40.0); watch.tick(now=130.0)   # the partial first window, then [60, 120) empty
>>> watch.last_window, watch.stopped
(0, True)
"""

from __future__ import annotations

import logging
import math
from collections import deque

log = logging.getLogger("monitor.stream")

__all__ = ["IntakeWatch", "COLLAPSED", "HISTORY"]

# A window below this share of the usual count is a collapse (what DPMonitorIntakeCollapsed uses).
COLLAPSED = 0.2
# Windows the usual count is the mean of.
HISTORY = 12
# Below this many events per window as usual, a collapse is not told from noise.
MIN_USUAL = 10.0


class IntakeWatch:
    """Accepted events per wall-clock window; see the module docstring.

    Parameters
    ----------
    size:
        The window length (``window.size_seconds``); windows are ``[n*size, (n+1)*size)``.
    started_at:
        When the process started: the last-accepted time until the first event.
    where:
        Where the events should come from, for the log line (topic and broker).
    metrics:
        ``MonitorMetrics`` or None.
    """

    def __init__(self, size: float, started_at: float, where: str, metrics=None) -> None:
        self.size = float(size)
        self.where = where
        self.metrics = metrics
        self.started_at = float(started_at)
        self._n = math.floor(started_at / self.size)  # the window being counted
        self._whole = False  # the first window is partial: the process started inside it
        self._count = 0
        self._since_start = 0
        self._history: deque[int] = deque(maxlen=HISTORY)
        self.last_window: int | None = None
        self.stopped = False
        self.collapsed = False
        if metrics is not None:
            metrics.intake_window.set(self.size)
            metrics.last_accepted.set(self.started_at)

    @property
    def usual(self) -> float | None:
        """Mean accepted events per window over the windows before the last, or None."""
        return sum(self._history) / len(self._history) if self._history else None

    def observe(self, accepted: int, now: float) -> None:
        """Count ``accepted`` events stage 1 accepted at ``now``."""
        self.tick(now)
        if accepted <= 0:
            return
        self._count += accepted
        self._since_start += accepted
        if self.metrics is not None:
            self.metrics.last_accepted.set(now)
        if self.stopped or self.collapsed:
            log.info("events arrive again (%d accepted in the current window so far)", self._count)
            self.stopped = self.collapsed = False

    def tick(self, now: float) -> None:
        """Close the windows that ended by ``now``."""
        n = math.floor(now / self.size)
        while self._n < n:
            self._close(self._count, self._whole)
            self._n += 1
            self._whole = True
            self._count = 0

    def _close(self, count: int, whole: bool) -> None:
        if not whole:
            return
        usual = self.usual
        self.last_window = count
        if self.metrics is not None:
            self.metrics.intake_last_window.set(count)
            if usual is not None:
                self.metrics.intake_usual_window.set(usual)
        start = self._n * self.size
        if count == 0 and not self.stopped:
            self.stopped = True
            since = ("since the start" if self._since_start == 0 else
                     f"after {usual:.0f} per window before" if usual else "after some")
            log.warning("no event accepted in the whole window [%s, %s) (%s): windows without events are released "
                        "as quiet, so the alarm is blind. Are the producers sending to %s? (Prometheus: "
                        "DPMonitorNoIntake)", _iso(start), _iso(start + self.size), since, self.where)
        elif count > 0 and usual is not None and usual >= MIN_USUAL and count < COLLAPSED * usual and not self.collapsed:
            self.collapsed = True
            log.warning("intake collapsed: %d events accepted in the window [%s, %s), against about %.0f per window "
                        "before: is a producer down, or sending elsewhere than %s? (Prometheus: DPMonitorIntakeCollapsed)",
                        count, _iso(start), _iso(start + self.size), usual, self.where)
        self._history.append(count)


def _iso(t: float) -> str:
    from monitor.budget.plan import iso

    return iso(t)
