"""Warn in the log about input that is silently hurting the releases.

Two things a producer gets wrong without any error on its side:

- events rejected for one reason again and again, e.g. a misspelt field
  (``missing_field`` for ``temperature``): every one goes to the dead-letter topic and
  the windows release noise over nothing;
- feature values far outside the public bounds (``1e9``, ``-999`` sentinels): they are
  clipped to the bounds (the privacy analysis needs that), so they distort every window
  they land in without a word.

Each kind of problem (reason and field, or feature) is logged at WARNING the first
time it is seen, then at most once per ``interval`` seconds with the count since the last
line, so a flood of bad events costs a few log lines, not one per event. What the interval
holds back is logged once it is due, whether or not more bad events come (``flush``, every
batch), and all of it when the monitor stops. Out-of-bounds
values are also counted in ``dp_monitor_values_out_of_bounds_total{feature}``.
These are exact operational numbers about raw events (NOT private), like the dead-letter
counts; the log line carries counts and the configured bounds only, never a value. The
log is for operators only, outside the guarantee (docs/privacy.md lists it).

>>> import logging, numpy as np
>>> watch = InputWatch(["hr"], [(30.0, 220.0)], dead_letter_topic="dlq", interval=60.0)
>>> watch.out_of_bounds(np.array([[72.0], [-999.0], [1e9]]), now=0.0)
{'hr': 2}
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Iterable, Sequence

import numpy as np

log = logging.getLogger("monitor.stream")

__all__ = ["InputWatch"]

_HINTS = {
    "missing_field": "check the producer's field names against features[].name (and stream.timestamp_field, stream.entity_field)",
    "wrong_type": "feature values must be JSON numbers",
    "not_finite": "feature values must be finite numbers (no NaN or Infinity)",
    "bad_json": "messages must be UTF-8 JSON objects",
    "not_object": "each message must be one JSON object",
    "too_large": "raise stream.max_message_bytes if such messages are expected",
    "bad_timestamp": "timestamps must be epoch seconds or ISO 8601, and not beyond now + window + lateness",
    "late": "late events are not counted in any window",
}


# Reasons whose event-level hint replaces the general one (which would be wrong for the field:
# "feature values must be JSON numbers" said of a null entity id).
_HINT_IS_WHOLE = {"wrong_type", "bad_json", "bad_timestamp"}


class InputWatch:
    """Rate-limited WARNING lines about dead letters and out-of-bounds values."""

    def __init__(
        self,
        feature_names: Sequence[str],
        bounds: Sequence[tuple[float, float]],
        *,
        dead_letter_topic: str,
        interval: float = 60.0,
        counter=None,
    ) -> None:
        self.feature_names = list(feature_names)
        self._lo = np.array([b[0] for b in bounds], dtype=float)
        self._hi = np.array([b[1] for b in bounds], dtype=float)
        self.bounds = list(bounds)
        self.topic = dead_letter_topic
        self.interval = float(interval)
        self._counter = counter  # prometheus Counter with a `feature` label, or None
        self._pending: Counter[tuple] = Counter()
        self._last: dict[tuple, float] = {}

    def dead_letters(self, rejected: Iterable, now: float) -> None:
        """Note the InvalidEvents of one batch (``reason``, ``field``) and warn when due."""
        for bad in rejected:
            self._pending[("dead", bad.reason, getattr(bad, "field", None), getattr(bad, "hint", None))] += 1
        self.flush(now)

    def out_of_bounds(self, X: np.ndarray, now: float) -> dict[str, int]:
        """Count the raw values of a batch outside the public bounds; returns them per feature."""
        if X.size == 0:
            return {}
        outside = ((X < self._lo) | (X > self._hi)).sum(axis=0)
        found = {self.feature_names[j]: int(n) for j, n in enumerate(outside) if n}
        for name, n in found.items():
            self._pending[("bounds", name)] += n
            if self._counter is not None:
                self._counter.labels(feature=name).inc(n)
        if found:
            self.flush(now)
        return found

    def flush(self, now: float, held: bool = False) -> None:
        """Log each held-back count whose interval has passed (``held``: every one, at a stop)."""
        for key, n in list(self._pending.items()):
            last = self._last.get(key)
            if not held and last is not None and now - last < self.interval:
                continue
            since = "" if last is None else f" in the last {now - last:.0f} s"
            log.warning(self._message(key, n, since))
            self._last[key] = now
            del self._pending[key]

    def _message(self, key: tuple, n: int, since: str) -> str:
        if key[0] == "bounds":
            name = key[1]
            lo, hi = self.bounds[self.feature_names.index(name)]
            return (f"feature {name!r}: {n} values outside its public bounds [{lo:g}, {hi:g}]{since} were clipped to them: "
                    f"check the producer for sentinel values (-999, 1e9) or units, or widen features[].min/max "
                    f"(from domain knowledge, never from the data)")
        _, reason, field, hint = key
        what = f"field {field!r}" if field else "no field"
        general = _HINTS.get(reason, "see the reason header of the dead letters")
        if hint and reason in _HINT_IS_WHOLE:
            general = ""  # the event's own hint says it for its field (a null, an entity, an encoding)
        return (f"{n} events{since} went to the dead-letter topic {self.topic} with reason {reason} ({what}): "
                + (f"{hint}; " if hint and general else hint or "") + general)
