"""Malformed input: 10,000 bad messages mixed with valid ones.

The service must not crash; every malformed message must reach the dead-letter topic
with its original bytes and the right ``reason`` header (checked as a multiset of
(bytes, reason) pairs, so even identical empty messages are all accounted for); every
valid message must be counted in exactly one released window (audit file).

The generator covers every reason: bad JSON (truncated, trailing bytes, binary garbage,
invalid UTF-8, lone surrogates, nesting past the parser's limit, empty message), JSON
that is not an object, missing fields, wrong types (strings, booleans, null, lists, a
float id), NaN / Infinity / 1e999, oversized messages, and bad timestamps (not ISO 8601,
negative, boolean, beyond the acceptance horizon).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter

import pytest

from streamkit import (
    ServiceProcess,
    audit_line_count,
    audit_windows,
    check_events_counted_once,
    create_topic,
    encode,
    make_producer,
    read_audit,
    read_topic,
    require_service,
    valid_event,
    wait_for,
    write_config,
    write_model,
)

pytestmark = [pytest.mark.slow, pytest.mark.broker]

SEED = 7
N_MALFORMED = 10_000
N_VALID = 2_000
MAX_BYTES = 4096
WINDOW = 1.0
LATENESS = 5.0  # slack for a loaded machine: valid events must not turn late
SPREAD = 3.0  # seconds over which the mix is produced (event time = send time)


def _base(i: int, now: float) -> dict:
    return {"id": f"m-{i:05d}", "ts": now, "hr": 80.0, "spo2": 95.0}


def _dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def malformed(i: int, now: float, rng: random.Random) -> tuple[bytes, str]:
    """The i-th malformed message (unique bytes where the kind allows) and its reason."""
    kind = i % 30
    b = _base(i, now)
    if kind == 0:
        return _dumps(b)[: rng.randrange(1, 20)] + f"#{i}".encode(), "bad_json"  # truncated
    if kind == 1:
        return _dumps(b) + b" trailing", "bad_json"
    if kind == 2:
        return bytes([0xFF, 0xFE]) + rng.randbytes(rng.randrange(1, 200)), "bad_json"  # binary garbage
    if kind == 3:
        return _dumps(b).replace(b'"m-', b'"\xc3\x28m-'), "bad_json"  # invalid UTF-8 inside a string
    if kind == 4:
        return _dumps(b).replace(b'"m-', b'"\\ud800m-'), "bad_json"  # lone surrogate escape
    if kind == 5:
        depth = rng.randrange(300, 1500)  # past the parser's nesting limit, under MAX_BYTES
        return b'{"id":"m-%05d","x":' % i + b"[" * depth + b"]" * depth + b"}", "bad_json"
    if kind == 6:
        return (b"" if i % 60 == 6 else b"   \n\t "), "bad_json"  # empty / only blanks
    if kind == 7:
        return f"{{'id': 'm-{i:05d}', 'hr': 1}}".encode(), "bad_json"  # Python repr, not JSON
    if kind == 8:
        return _dumps([b["id"], 1, 2]), "not_object"
    if kind == 9:
        return _dumps(rng.choice([f"m-{i:05d}", i, i + 0.5, None, True])), "not_object"
    if kind == 10:
        del b["hr"]
        return _dumps(b), "missing_field"
    if kind == 11:
        del b["spo2"]
        return _dumps(b), "missing_field"
    if kind == 12:
        del b["ts"]
        return _dumps(b), "missing_field"
    if kind == 13:
        b["hr"] = "72"
        return _dumps(b), "wrong_type"
    if kind == 14:
        b["spo2"] = rng.choice([True, False])
        return _dumps(b), "wrong_type"
    if kind == 15:
        b["hr"] = None
        return _dumps(b), "wrong_type"
    if kind == 16:
        b["spo2"] = [95.0]
        return _dumps(b), "wrong_type"
    if kind == 17:
        b["hr"] = {"value": 72}
        return _dumps(b), "wrong_type"
    if kind == 18:
        b["id"] = [i]
        return _dumps(b), "wrong_type"
    if kind == 19:
        return _dumps(b).replace(b'"hr":80.0', b'"hr":NaN'), "not_finite"
    if kind == 20:
        return _dumps(b).replace(b'"spo2":95.0', b'"spo2":Infinity'), "not_finite"
    if kind == 21:
        return _dumps(b).replace(b'"hr":80.0', b'"hr":-Infinity'), "not_finite"
    if kind == 22:
        return _dumps(b).replace(b'"hr":80.0', b'"hr":1e999'), "not_finite"
    if kind == 23:
        b["note"] = "x" * (MAX_BYTES + rng.randrange(1, 5000))  # otherwise valid
        return _dumps(b), "too_large"
    if kind == 24:
        return f"m-{i:05d}".encode() + rng.randbytes(MAX_BYTES + 10), "too_large"
    if kind == 25:
        b["ts"] = rng.choice(["yesterday", "2026-02-30T00:00:00", "2026-11-21T05:00:00+99:00", ""])
        return _dumps(b), "bad_timestamp"
    if kind == 26:
        b["ts"] = -rng.uniform(1, 1e9)
        return _dumps(b), "bad_timestamp"
    if kind == 27:
        b["ts"] = rng.choice([True, None, [now], {"s": now}])
        return _dumps(b), "bad_timestamp"
    if kind == 28:
        return _dumps(b).replace(b'"ts":' + json.dumps(now).encode(), b'"ts":NaN'), "bad_timestamp"
    # kind 29: far beyond the acceptance horizon (now + window + lateness)
    b["ts"] = now + rng.uniform(3600, 1e9)
    return _dumps(b), "bad_timestamp"


def test_malformed_messages_go_to_dead_letter_and_valid_ones_are_counted(tmp_path, fresh_broker):
    require_service()
    rng = random.Random(SEED)
    bootstrap = fresh_broker.bootstrap_servers
    prefix = "fuzz"
    model = write_model(tmp_path / "model.json", seed=SEED)
    config = write_config(tmp_path, bootstrap=bootstrap, model_path=model, prefix=prefix,
                          window_seconds=WINDOW, lateness_seconds=LATENESS, max_message_bytes=MAX_BYTES)
    create_topic(bootstrap, f"{prefix}.events", partitions=2)
    audit = tmp_path / "audit.jsonl"
    service = ServiceProcess(config, bootstrap, audit, seed=SEED, logs=tmp_path / "logs")
    expected_dead: Counter[tuple[bytes, str]] = Counter()
    valid_ids: set[str] = set()
    producer = make_producer(bootstrap)
    try:
        service.start()
        wait_for(lambda: audit_line_count(audit) >= 1, 90, "the first window release", on_timeout=service.log_tail)

        # Valid and malformed messages shuffled together, sent in real time over SPREAD s.
        kinds = ["bad"] * N_MALFORMED + ["ok"] * N_VALID
        rng.shuffle(kinds)
        n_bad = n_ok = 0
        start = time.monotonic()
        futures = []
        for j, kind in enumerate(kinds):
            now = time.time()
            if kind == "ok":
                event = valid_event(f"v-{n_ok:05d}", now, rng)
                if n_ok % 10 == 0:  # valid variants: ISO 8601 time, integer features, extra fields
                    event["ts"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
                    event["hr"] = int(event["hr"])
                    event["extra"] = {"nested": [1, 2, 3]}
                value = encode(event)
                valid_ids.add(event["id"])
                n_ok += 1
            else:
                value, reason = malformed(n_bad, now, rng)
                expected_dead[(value, reason)] += 1
                n_bad += 1
            futures.append(producer.send(f"{prefix}.events", value))
            ahead = start + SPREAD * (j + 1) / len(kinds) - time.monotonic()
            if ahead > 0.01:
                time.sleep(ahead)
        producer.flush(timeout=60)
        for f in futures:
            f.get(timeout=30)
        last_ts = time.time()
        assert set(reason for _, reason in expected_dead) == {
            "bad_json", "not_object", "missing_field", "wrong_type", "not_finite", "too_large", "bad_timestamp"}

        wait_for(lambda: any(float(w["window_start"]) > last_ts for w in read_audit(audit)), 60,
                 "the windows of the last events", interval=0.1, on_timeout=service.log_tail)
        service.ensure_alive()  # no crash on any of them
        late = service.metric("dp_monitor_events_total", status="late")
        by_reason = Counter()
        for (_, reason), n in expected_dead.items():
            by_reason[reason] += n
        metered = {r: service.metric("dp_monitor_dead_letters_total", reason=r) for r in by_reason}
        assert service.terminate() == 0, service.log_tail()
    finally:
        service.cleanup()
        producer.close(timeout=5)

    dead = read_topic(bootstrap, f"{prefix}.dead-letter", timeout=60)
    got = Counter((r.value or b"", (r.header("reason") or b"").decode()) for r in dead)
    missing = expected_dead - got
    unexpected = got - expected_dead
    assert not missing and not unexpected, (
        f"dead-letter topic differs from the malformed input: {sum(missing.values())} missing "
        f"(e.g. {list(missing)[:3]}), {sum(unexpected.values())} unexpected (e.g. {list(unexpected)[:3]})")
    assert len(dead) == N_MALFORMED

    windows = audit_windows(read_audit(audit))
    counted = check_events_counted_once(windows, valid_ids, WINDOW, note=f"(service counted {late} late)")
    assert counted == N_VALID
    assert metered == {r: float(n) for r, n in by_reason.items()}, "dead-letter metrics differ from the input"
    print(f"\nfuzz: {N_MALFORMED} malformed -> dead-letter with reasons {dict(sorted(by_reason.items()))}; "
          f"{counted} valid counted once in {len(windows)} windows")
