"""What a producer is told about an event it got wrong: the field, and the right cause
(a null is a missing value, not a wrong number; bytes that are not UTF-8 are an encoding
problem, not broken JSON), in the dead letter's detail and in the log line."""

from __future__ import annotations

import json
import logging

import pytest

from monitor.pipeline.events import EventSchema, InvalidEvent
from monitor.pipeline.inputwatch import InputWatch

SCHEMA = EventSchema(["hr", "spo2"], timestamp_field="ts", entity_field="camera_id")


def rejected(value: bytes) -> InvalidEvent:
    with pytest.raises(InvalidEvent) as info:
        SCHEMA.parse(value)
    assert SCHEMA.parse_batch([value]) is None  # the batch path refuses what parse refuses
    return info.value


def logged(bad: InvalidEvent, caplog) -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="monitor.stream"):
        InputWatch(["hr", "spo2"], [(30, 220), (70, 100)], dead_letter_topic="dlq").dead_letters([bad], now=0.0)
    (line,) = [r.getMessage() for r in caplog.records]
    return line


def event(**fields) -> bytes:
    return json.dumps({"hr": 72, "spo2": 97, "ts": 1763700000, "camera_id": "cam-1", **fields}).encode()


def test_a_null_entity_is_called_null_not_a_bad_number(caplog):
    bad = rejected(event(camera_id=None))
    assert bad.reason == "wrong_type" and bad.field == "camera_id"
    assert bad.detail == "field 'camera_id': is null: a missing value"
    line = logged(bad, caplog)
    assert "stream.entity_field" in line and "not null" in line, line
    assert "JSON numbers" not in line, line


def test_a_null_feature_and_a_null_timestamp_are_called_null(caplog):
    bad = rejected(event(hr=None))
    assert (bad.reason, bad.field, bad.detail) == ("wrong_type", "hr", "field 'hr': is null: a missing value")
    assert "feature 'hr' is null" in logged(bad, caplog)
    bad = rejected(event(ts=None))
    assert (bad.reason, bad.detail) == ("bad_timestamp", "field 'ts': is null")
    assert "stream.timestamp_field" in logged(bad, caplog)
    # a number sent as a string keeps the general advice
    bad = rejected(event(hr="72"))
    assert "feature values must be JSON numbers" in logged(bad, caplog)


@pytest.mark.parametrize("value, cause", [
    ('{"hr": 72, "spo2": 97, "ts": 1, "camera_id": "caf\u00e9"}'.encode("latin-1"), "not UTF-8: byte 0xe9 at position 49"),
    ('{"hr": 72, "spo2": 97, "ts": 1, "camera_id": "a"}'.encode("utf-16"), "looks like UTF-16"),
    ('{"hr": 72, "spo2": 97, "ts": 1, "camera_id": "a"}'.encode("utf-16-le"), "looks like UTF-16"),
    ('{"hr": 72, "spo2": 97, "ts": 1, "camera_id": "a"}'.encode("utf-8-sig"), "byte order mark"),
])
def test_bytes_that_are_not_utf8_get_a_word_about_the_encoding(value, cause, caplog):
    bad = rejected(value)
    assert bad.reason == "bad_json" and cause in bad.detail, bad.detail
    line = logged(bad, caplog)
    assert "UTF-8" in line and "encode" in line, line


def test_broken_json_in_utf8_is_still_broken_json():
    bad = rejected(b'{"hr": 72, "spo2": 97,')
    assert bad.reason == "bad_json" and bad.detail.startswith("Invalid JSON"), bad.detail
