"""Validation of incoming JSON events against the configured features.

Every message either becomes an :class:`Event` or raises :class:`InvalidEvent` with one
of the dead-letter reasons of DEVELOPERS.md (``bad_json``, ``not_object``,
``missing_field``, ``wrong_type``, ``not_finite``, ``too_large``, ``bad_timestamp``).
pydantic-core parses and validates the raw bytes in one pass (about 1 us per event).

>>> schema = EventSchema(["hr", "spo2"], timestamp_field="ts")
>>> schema.parse(b'{"hr": 72, "spo2": 97.5, "ts": 1763700000}').features
(72.0, 97.5)
>>> try:
...     schema.parse(b'{"hr": "72", "spo2": 97.5, "ts": 1}')
... except InvalidEvent as err:
...     print(err)
wrong_type: field 'hr': Input should be a valid number
"""

from __future__ import annotations

import difflib
import math
from operator import attrgetter, itemgetter
from datetime import datetime, timezone
from typing import NamedTuple, Sequence, Union

import msgspec
import numpy as np
from pydantic import ConfigDict, TypeAdapter, ValidationError
from typing_extensions import NotRequired, TypedDict

__all__ = ["Event", "EventBatch", "EventSchema", "InvalidEvent", "DEAD_LETTER_REASONS", "HORIZON_HINT"]

DEAD_LETTER_REASONS = ("bad_json", "not_object", "missing_field", "wrong_type", "not_finite", "too_large", "bad_timestamp")

# pydantic error types -> dead-letter reason; anything else is a wrong type.
_REASON_BY_ERROR = {
    "json_invalid": "bad_json",
    "json_type": "bad_json",
    "dict_type": "not_object",
    "missing": "missing_field",
    "finite_number": "not_finite",
}

# The event id used in audit lines; optional in events.
ID_FIELD = "id"

# Epoch seconds beyond this (the year 5138) are epoch milliseconds sent by mistake.
MILLISECONDS_ABOVE = 1e11
_MS_HINT = "looks like milliseconds since the epoch: send seconds (milliseconds / 1000) or ISO 8601"
# Why an event with a readable timestamp is refused all the same (stage 1's horizon check).
HORIZON_HINT = ("in the future: beyond the acceptance horizon (when the record was appended + window + lateness); "
                "check the producer's clock and its time zone (ISO 8601 without an offset is read as UTC)")


class InvalidEvent(ValueError):
    """A message that cannot be monitored; ``reason`` is its dead-letter reason."""

    def __init__(self, reason: str, detail: str, field: str | None = None, hint: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.field = field  # the event field at fault, when there is one (for the log's hint)
        # What to do about it, for the log: names and advice only, never an event's value.
        self.hint = hint


class Event(NamedTuple):
    """One valid event: raw feature values in config order, and its bookkeeping fields."""

    features: tuple[float, ...]
    timestamp: float | None  # epoch seconds; None when the Kafka timestamp is used
    entity: str | None = None
    event_id: str | None = None


class EventBatch(NamedTuple):
    """A batch of messages that are all valid, as columns."""

    X: np.ndarray  # (n, d) raw feature values, config order
    timestamps: np.ndarray | None  # (n,) epoch seconds; None when the Kafka timestamp is used
    entities: list[str] | None
    event_ids: list[str | None]


_TS, _ENTITY, _ID = attrgetter("ts_"), attrgetter("entity_"), attrgetter("id_")


def _batch_decoder(feature_names: list[str], timestamp_field: str | None, entity_field: str | None):
    """A msgspec decoder of one event into a struct with the shape :meth:`EventSchema.parse`
    validates (attributes f0..f{d-1}, ts_, entity_, id_; JSON names by ``rename``), and a
    getter per feature; (None, []) when the fields overlap (a feature named like the
    timestamp, entity or id field): parse_batch then always defers to ``parse``."""
    names = [*feature_names, *([timestamp_field] if timestamp_field else []), *([entity_field] if entity_field else [])]
    if len(set(names)) != len(names) or ID_FIELD in names:
        return None, []
    fields: list[tuple] = [(f"f{i}", float) for i in range(len(feature_names))]
    rename = {f"f{i}": name for i, name in enumerate(feature_names)}
    if timestamp_field:
        fields.append(("ts_", Union[float, str]))
        rename["ts_"] = timestamp_field
    if entity_field:
        fields.append(("entity_", Union[str, int]))
        rename["entity_"] = entity_field
    fields.append(("id_", Union[str, int], msgspec.UNSET))  # absent and null differ: null is a wrong type
    rename["id_"] = ID_FIELD
    shape = msgspec.defstruct("EventShape", fields, rename=rename, gc=False)
    return msgspec.json.Decoder(shape).decode, [attrgetter(f"f{i}") for i in range(len(feature_names))]


class EventSchema:
    """The shape an event must have, built from the config's features.

    Parameters
    ----------
    feature_names:
        JSON fields holding the numeric features (ints and floats accepted; strings,
        booleans, null, NaN and infinities are not).
    timestamp_field:
        Event-time field: epoch seconds (number) or an ISO 8601 string (UTC when it has
        no offset). None: the caller uses the Kafka record timestamp.
    entity_field:
        Privacy-unit field (string or integer), required when set.
    max_message_bytes:
        Larger messages are rejected before parsing.
    """

    def __init__(
        self,
        feature_names: Sequence[str],
        *,
        timestamp_field: str | None = None,
        entity_field: str | None = None,
        max_message_bytes: int = 65536,
    ) -> None:
        self.feature_names = list(feature_names)
        self.timestamp_field = timestamp_field
        self.entity_field = entity_field
        self.max_message_bytes = max_message_bytes
        fields: dict = {name: float for name in self.feature_names}
        if timestamp_field:
            fields[timestamp_field] = Union[float, str]
        if entity_field:
            fields[entity_field] = Union[str, int]
        if ID_FIELD not in fields:
            fields[ID_FIELD] = NotRequired[Union[str, int]]
        # Functional TypedDict: feature names need not be Python identifiers.
        shape = TypedDict("EventShape", fields)  # type: ignore[misc]
        # strict: "72" and true are wrong types, not numbers; allow_inf_nan=False: the
        # JSON extensions NaN/Infinity (and 1e999) are rejected as not finite.
        shape.__pydantic_config__ = ConfigDict(strict=True, allow_inf_nan=False)  # type: ignore[attr-defined]
        # The core validator itself: TypeAdapter.validate_json adds a Python-level wrapper
        # per call, a quarter of the cost at 100k events/s.
        self._validate_json = TypeAdapter(shape).validator.validate_json
        # itemgetter of one name returns a scalar, of several a tuple: normalise once here.
        getter = itemgetter(*self.feature_names)
        self._features = (lambda obj: (getter(obj),)) if len(self.feature_names) == 1 else getter
        self._decode, self._feature_getters = _batch_decoder(self.feature_names, timestamp_field, entity_field)

    @classmethod
    def from_config(cls, config) -> "EventSchema":
        """The schema of a ``MonitorConfig``."""
        s = config.stream
        return cls(
            config.feature_names,
            timestamp_field=s.timestamp_field,
            entity_field=s.entity_field,
            max_message_bytes=s.max_message_bytes,
        )

    def parse(self, value: bytes | None) -> Event:
        """Validate one message's bytes; raise :class:`InvalidEvent` when they do not fit."""
        if not value:
            raise InvalidEvent("bad_json", "empty message")
        if len(value) > self.max_message_bytes:
            raise InvalidEvent("too_large", f"{len(value)} bytes, more than max_message_bytes={self.max_message_bytes}")
        try:
            obj = self._validate_json(value)
        except ValidationError as err:
            raise self._invalid(err) from None
        timestamp = None
        if self.timestamp_field:
            timestamp = obj[self.timestamp_field]
            if timestamp.__class__ is not float or not 0 <= timestamp < MILLISECONDS_ABOVE:  # fast path: epoch seconds
                timestamp = parse_timestamp(timestamp, self.timestamp_field)
        entity = str(obj[self.entity_field]) if self.entity_field else None
        event_id = obj.get(ID_FIELD)
        return Event(self._features(obj), timestamp, entity, None if event_id is None else str(event_id))

    def parse_batch(self, values: Sequence[bytes | None]) -> EventBatch | None:
        """All of ``values`` as columns when every one is valid; None when any is not.

        msgspec decodes each message straight into a typed struct (types checked in C; the
        structs are invisible to the garbage collector, which otherwise spends more time
        on a batch's short-lived dicts than the parsing itself), and the columns are read
        with one C-level map each. On None the caller validates each message with
        :meth:`parse`, so a rejected message always gets the same reason and detail.
        Accepts exactly what :meth:`parse` accepts, or returns None.
        """
        if self._decode is None or not values or not all(values) or max(map(len, values)) > self.max_message_bytes:
            return None
        try:
            # Each message on its own (joining them into one array would let two broken
            # messages make one valid pair).
            objs = list(map(self._decode, values))
        except Exception:  # noqa: BLE001 - not only MsgspecError: UnicodeDecodeError, RecursionError on deep nesting
            return None  # the per-message path, the one authority on rejections, finds which and why
        features = [list(map(get, objs)) for get in self._feature_getters]  # floats already (ints converted)
        X = np.array(features, dtype=float).T
        if not np.isfinite(X).all():  # cannot happen from JSON, but parse() would refuse it
            return None
        timestamps = None
        if self.timestamp_field:
            col = list(map(_TS, objs))
            if set(map(type, col)) != {float}:
                return None  # ISO strings: the per-message path
            timestamps = np.array(col, dtype=float)
            if not (np.isfinite(timestamps).all() and (timestamps >= 0).all() and (timestamps < MILLISECONDS_ABOVE).all()):
                return None
        entities = None
        if self.entity_field:
            entities = list(map(_ENTITY, objs))
            if set(map(type, entities)) != {str}:
                entities = [str(e) for e in entities]
        ids = list(map(_ID, objs))
        if set(map(type, ids)) != {str}:
            ids = [None if i is msgspec.UNSET else str(i) for i in ids]
        return EventBatch(X, timestamps, entities, ids)

    def _invalid(self, err: ValidationError) -> InvalidEvent:
        errors = err.errors(include_url=False)
        first = errors[0]
        loc = first["loc"]
        field = str(loc[0]) if loc else None
        reason = _REASON_BY_ERROR.get(first["type"], "wrong_type")
        if reason == "missing_field":
            return self._missing([str(e["loc"][0]) for e in errors if e["type"] == "missing" and e["loc"]], first.get("input"))
        if reason == "bad_json":
            encoding = _encoding_problem(first.get("input"))
            if encoding is not None:
                return InvalidEvent("bad_json", encoding, None, _ENCODING_HINT)
        null = "input" in first and first["input"] is None and field is not None
        if field is not None and field == self.timestamp_field:
            what = "is null" if null else "must be epoch seconds or an ISO 8601 string"
            return InvalidEvent("bad_timestamp", f"field {field!r}: {what}", field,
                                f"the timestamp field {field!r} (stream.timestamp_field) must be epoch seconds or ISO 8601"
                                + (", not null" if null else ""))
        if field is not None and field == self.entity_field:
            what = "is null: a missing value" if null else first["msg"]
            return InvalidEvent(reason, f"field {field!r}: {what}", field,
                                f"the entity field {field!r} (stream.entity_field) must be a string or an integer naming "
                                "the person or device" + (", not null" if null else ""))
        if null:
            return InvalidEvent(reason, f"field {field!r}: is null: a missing value", field,
                                f"feature {field!r} is null: send a number, or leave a reading without it out of the stream")
        where = f"field {field!r}: " if field is not None else ""
        return InvalidEvent(reason, where + first["msg"], field)

    def _missing(self, missing: list[str], obj) -> InvalidEvent:
        """Every missing field, and for each the event's unknown field it is probably misspelt as."""
        expected = {*self.feature_names, self.timestamp_field, self.entity_field, ID_FIELD}
        unknown = [k for k in obj if k not in expected] if isinstance(obj, dict) else []
        guesses = []
        for name in missing:
            close = difflib.get_close_matches(name, unknown, n=1, cutoff=0.6)
            if close:
                guesses.append(f"{close[0]!r} for {name!r}")
                unknown.remove(close[0])
        names = ", ".join(map(repr, missing))
        hint = f"missing {names}" + (f" (did you mean {' and '.join(guesses)}?)" if guesses else "")
        return InvalidEvent("missing_field", f"field{'s' if len(missing) > 1 else ''} {names}: Field required"
                            + (f"; did you mean {' and '.join(guesses)}?" if guesses else ""), missing[0], hint)


_ENCODING_HINT = "JSON must be UTF-8: encode the producer's messages as UTF-8 (Python: json.dumps(event).encode())"


def _encoding_problem(value) -> str | None:
    """Why the bytes of a message that is not JSON are not even text, or None where they are UTF-8.

    >>> _encoding_problem('{"name": "caf\u00e9"}'.encode("latin-1"))
    'not UTF-8: byte 0xe9 at position 13 cannot be decoded (Latin-1 or Windows-1252 text?)'
    >>> _encoding_problem(b'{"hr": 1}') is None
    True
    """
    if not isinstance(value, (bytes, bytearray)):
        return None
    if value[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(value) > 1 and value.count(0) >= len(value) // 3):
        return "not UTF-8: the message looks like UTF-16 (a byte order mark or NUL bytes between characters)"
    if value[:3] == b"\xef\xbb\xbf":
        return "starts with a UTF-8 byte order mark, which JSON does not allow"
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as err:
        return (f"not UTF-8: byte 0x{value[err.start]:02x} at position {err.start} cannot be decoded "
                "(Latin-1 or Windows-1252 text?)")
    return None


def parse_timestamp(value: float | str, field: str = "timestamp") -> float:
    """Epoch seconds from a number or an ISO 8601 string (naive = UTC).

    >>> parse_timestamp("2025-11-21T04:40:00Z")
    1763700000.0
    >>> parse_timestamp(1763700000)
    1763700000.0
    >>> parse_timestamp(1763700000000)
    Traceback (most recent call last):
    ...
    monitor.pipeline.events.InvalidEvent: bad_timestamp: field 'timestamp': 1763700000000 looks like milliseconds since the epoch: send seconds (milliseconds / 1000) or ISO 8601
    """
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidEvent("bad_timestamp", f"field {field!r}: {value[:40]!r} is not ISO 8601", field) from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return dt.timestamp()
    ts = float(value)
    if not math.isfinite(ts) or ts < 0:
        raise InvalidEvent("bad_timestamp", f"field {field!r}: {ts!r} is not a valid epoch time", field)
    if ts >= MILLISECONDS_ABOVE:
        raise InvalidEvent("bad_timestamp", f"field {field!r}: {ts:.0f} {_MS_HINT}", field, _MS_HINT)
    return ts
