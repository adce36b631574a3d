"""Event validation: every malformed message gets the right dead-letter reason."""

from __future__ import annotations

import json

import pytest

from monitor.config import MonitorConfig
from monitor.pipeline.events import DEAD_LETTER_REASONS, EventSchema, InvalidEvent, parse_timestamp


@pytest.fixture
def schema() -> EventSchema:
    return EventSchema(["hr", "spo2"], timestamp_field="ts", entity_field="patient", max_message_bytes=200)


def good(**over) -> bytes:
    body = {"hr": 72, "spo2": 97.5, "ts": 1763700000.5, "patient": "p1", "id": "e1", **over}
    return json.dumps(body).encode()


def test_valid_event_keeps_features_in_config_order(schema):
    ev = schema.parse(good())
    assert ev.features == (72.0, 97.5)
    assert ev.timestamp == 1763700000.5
    assert ev.entity == "p1" and ev.event_id == "e1"


def test_integer_entity_and_id_become_strings(schema):
    ev = schema.parse(good(patient=17, id=3))
    assert (ev.entity, ev.event_id) == ("17", "3")


def test_iso_timestamp_with_and_without_offset(schema):
    assert schema.parse(good(ts="2025-11-21T04:40:00Z")).timestamp == 1763700000.0
    assert schema.parse(good(ts="2025-11-21T05:40:00+01:00")).timestamp == 1763700000.0
    assert schema.parse(good(ts="2025-11-21T04:40:00")).timestamp == 1763700000.0  # naive = UTC


@pytest.mark.parametrize(
    "value, reason",
    [
        (b'{"hr": 72, "spo2":', "bad_json"),
        (b"\xff\xfe\x00", "bad_json"),
        (b"", "bad_json"),
        (None, "bad_json"),
        (b"[1, 2]", "not_object"),
        (b'"hello"', "not_object"),
        (json.dumps({"spo2": 97, "ts": 1, "patient": "p"}).encode(), "missing_field"),
        (json.dumps({"hr": 72, "spo2": 97, "ts": 1}).encode(), "missing_field"),  # entity
        (json.dumps({"hr": 72, "spo2": 97, "patient": "p"}).encode(), "missing_field"),  # timestamp
        (good(hr="72"), "wrong_type"),
        (good(hr=True), "wrong_type"),
        (good(hr=None), "wrong_type"),
        (good(spo2=[97]), "wrong_type"),
        (good(patient=1.5), "wrong_type"),
        (b'{"hr": NaN, "spo2": 97, "ts": 1, "patient": "p"}', "not_finite"),
        (b'{"hr": Infinity, "spo2": 97, "ts": 1, "patient": "p"}', "not_finite"),
        (b'{"hr": 1e999, "spo2": 97, "ts": 1, "patient": "p"}', "not_finite"),
        (good(note="x" * 300), "too_large"),
        (good(ts="yesterday"), "bad_timestamp"),
        (good(ts=None), "bad_timestamp"),
        (good(ts=-5), "bad_timestamp"),
        (b'{"hr": 72, "spo2": 97, "ts": NaN, "patient": "p"}', "bad_timestamp"),
    ],
)
def test_malformed_events_get_their_reason(schema, value, reason):
    assert reason in DEAD_LETTER_REASONS
    with pytest.raises(InvalidEvent) as err:
        schema.parse(value)
    assert err.value.reason == reason


def test_reason_detail_names_the_field(schema):
    with pytest.raises(InvalidEvent) as err:
        schema.parse(good(spo2="high"))
    assert "'spo2'" in err.value.detail


def test_feature_names_need_not_be_identifiers():
    schema = EventSchema(["heart-rate", "blood pressure"])
    assert schema.parse(b'{"heart-rate": 1, "blood pressure": 2.5}').features == (1.0, 2.5)
    assert schema.parse(b'{"heart-rate": 1, "blood pressure": 2.5}').timestamp is None


def test_schema_from_config():
    cfg = MonitorConfig.model_validate(
        {"features": [{"name": "a", "min": 0, "max": 1}], "stream": {"timestamp_field": None, "max_message_bytes": 10}}
    )
    schema = EventSchema.from_config(cfg)
    assert schema.parse(b'{"a": 0.5}').features == (0.5,)
    with pytest.raises(InvalidEvent, match="too_large"):
        schema.parse(b'{"a": 0.5, "b": 1}')


def test_parse_timestamp_rejects_garbage():
    with pytest.raises(InvalidEvent):
        parse_timestamp("2025-13-45")
    assert parse_timestamp(0) == 0.0


# Field values that parse() accepts and rejects, to mix into batches.
_VALUES = [72, 97.5, 0, -3.25, 1e308, 2**70, True, None, "72", [], {}, "2025-11-21T04:40:00Z", -1.0, 1763700000]
_RAW = [b"", b"{", b"[]", b"1,2", b'{"hr": 1e999}', b'{"hr": NaN}', b'{},{"hr":"', b'"}', b"x" * 300,
        b"\xc3\x28", b'{"hr": 72, "patient": "\xff"}', b"\xef\xbb\xbf{}"]  # not UTF-8, and a byte-order mark


def test_parse_batch_hands_deep_nesting_to_the_per_message_path():
    # msgspec raises RecursionError here (not a MsgspecError); one such message must not stop stage 1.
    big = EventSchema(["hr", "spo2"], timestamp_field=None, entity_field=None, max_message_bytes=10**6)
    deep = b'{"hr": 72, "spo2": 97, "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    assert big.parse_batch([b'{"hr": 72, "spo2": 97}', deep]) is None
    with pytest.raises(InvalidEvent, match="bad_json"):
        big.parse(deep)


def test_parse_batch_accepts_exactly_what_parse_accepts(schema):
    """Batches mixing valid and malformed messages (wrong types, NaN, huge ints, bools,
    messages that are only valid when joined): parse_batch returns None whenever any
    message is invalid, and otherwise exactly the per-message results."""
    from hypothesis import given, settings, strategies as st

    value = st.sampled_from(_VALUES + [...])
    body = st.fixed_dictionaries({"hr": value, "spo2": value, "ts": value, "patient": st.sampled_from(["p1", 7, True, None, 1.5, ...]),
                                  "id": st.sampled_from(["e1", 3, None, 2.5, ...])})
    message = st.one_of(body.map(lambda d: json.dumps({k: v for k, v in d.items() if v is not ...}).encode()),
                        st.sampled_from(_RAW), st.just(good()), st.just(good(patient=17, id=3)))

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(st.lists(message, min_size=1, max_size=6))
    def check(values):
        results = []
        for v in values:
            try:
                results.append(schema.parse(v))
            except InvalidEvent:
                results.append(None)
        batch = schema.parse_batch(values)
        if any(r is None for r in results):
            assert batch is None
            return
        if batch is None:  # allowed (e.g. an ISO timestamp takes the per-message path)
            return
        assert batch.X.tolist() == [list(r.features) for r in results]
        assert batch.timestamps.tolist() == [r.timestamp for r in results]
        assert batch.entities == [r.entity for r in results]
        assert batch.event_ids == [r.event_id for r in results]

    check()
    # And the fast path is taken for plain valid batches.
    assert schema.parse_batch([good(), good(patient=17, id=3)]) is not None
