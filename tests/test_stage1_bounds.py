"""Stage 1 bounds each person's work before the costly steps (docs/scaling.md).

No broker: ``Stage1._parse_values`` and ``WindowStore.select`` on their own.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np

from monitor.pipeline.events import EventSchema, InvalidEvent
from monitor.pipeline.stage1 import _BISECT_LEAF, Stage1
from monitor.pipeline.windows import ACCEPTED, DUPLICATE_ENTITY, LATE, WindowStore


class _Rec(SimpleNamespace):
    pass


def _values(n: int, bad_at: set[int], iso_at: set[int] = frozenset()) -> list[bytes]:
    out = []
    for i in range(n):
        if i in bad_at:
            out.append(b'{"hr": 1,' if i % 2 else b'{"hr": "x", "spo2": 96, "ts": 5, "who": "a"}')
        elif i in iso_at:  # valid, but only for the per-message path
            out.append(json.dumps({"hr": 70.0 + i, "spo2": 96.0, "ts": "2026-01-01T00:00:05Z", "who": f"p{i}",
                                   "id": f"e{i}"}).encode())
        else:
            out.append(json.dumps({"hr": 70.0 + i, "spo2": 96.0, "ts": 5.0 + i, "who": f"p{i}", "id": f"e{i}"}).encode())
    return out


def _stage(schema: EventSchema) -> Stage1:
    stage = Stage1.__new__(Stage1)  # only the parser: no consumer, no producers
    stage.service = SimpleNamespace(schema=schema)
    return stage


def test_a_malformed_message_costs_a_few_batch_decodes_not_a_per_message_pass():
    schema = EventSchema(["hr", "spo2"], timestamp_field="ts", entity_field="who")
    calls = Counter()
    parse, parse_batch = schema.parse, schema.parse_batch

    def counted_parse(value):
        calls["parse"] += 1
        return parse(value)

    def counted_batch(values):
        calls["batch"] += 1
        calls["batch_messages"] += len(values)
        return parse_batch(values)

    schema.parse, schema.parse_batch = counted_parse, counted_batch
    n, bad_at, iso_at = 5000, {17, 2500, 4999}, {300}
    vals = _values(n, bad_at, iso_at)
    records = [_Rec(value=v, offset=i, partition=0, topic="t", key=None) for i, v in enumerate(vals)]
    dead: Counter = Counter()
    keep, bad, X, ts, entities, ids = _stage(schema)._parse_values(records, vals, dead)

    # The same answer as validating every message on its own.
    expect_keep, expect_ids, expect_reasons = [], [], []
    for i, v in enumerate(vals):
        try:
            ev = parse(v)
        except InvalidEvent as err:
            expect_reasons.append((i, err.reason))
            continue
        expect_keep.append(i)
        expect_ids.append(ev.event_id)
    assert keep.tolist() == expect_keep and ids == expect_ids
    assert [(r.offset, err.reason) for r, err in bad] == expect_reasons
    assert X.shape == (n - len(bad_at), 2) and X[:, 0].tolist() == [70.0 + i for i in expect_keep]
    assert entities == [f"p{i}" for i in expect_keep] and len(ts) == len(expect_keep)
    assert sum(dead.values()) == len(bad_at)
    # Bounded work: the per-message validator sees only the leaves around the refused
    # messages, and the batch decoder a few passes over the poll (bisection), not n calls.
    assert calls["parse"] <= (len(bad_at) + len(iso_at)) * _BISECT_LEAF
    # Each refused message costs at most one halving path: n / 2 + n / 4 + ... < n messages.
    assert calls["batch_messages"] <= n * (len(bad_at) + len(iso_at))
    assert calls["batch"] < 200


def test_duplicates_and_records_created_after_the_close_are_dropped_before_scoring():
    store = WindowStore(size=10, allowed_lateness=2, first_start=0)
    ts = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 15.0])
    created = np.array([1.0, 2.0, 3.0, 12.5, 11.9, 15.0])  # the 4th record: created after window 0's close (12)
    entities = ["flood", "flood", "a", "b", "flood", "flood"]
    sel = store.select(ts, entities=entities, created=created)
    assert sel.counts == {LATE: 1, ACCEPTED: 3, DUPLICATE_ENTITY: 2}
    assert sel.keep.tolist() == [0, 2, 5] and sel.windows == [(0, 2), (1, 1)]
    # Only the kept events reach the model, then the store.
    X = np.arange(6.0).reshape(6, 1)[sel.keep]
    store.insert(sel, X, np.zeros(3, bool), event_ids=["e0", "e2", "e5"], entities=["flood", "a", "flood"],
                 offsets=np.array([0, 2, 5]))
    first = next(store.close_due(12.0))
    assert first.event_ids == ("e0", "e2") and first.X.ravel().tolist() == [0.0, 2.0]
    # Late by its record's creation time however early it is read: the window is still open here.
    assert store.add_one(16.0, (0.0,), False, event_id="x", entity="c", created=22.0) == LATE
    assert store.add_one(16.0, (0.0,), False, event_id="y", entity="c", created=21.9) == ACCEPTED


def _cut_stage(size: float, lateness: float, first_start: float, assigned_at: float, cuts: dict[int, int]):
    """A stage with one partition's window store and recorded cuts, as the watcher leaves them."""
    import threading

    stage = Stage1.__new__(Stage1)  # no consumer, no producers: the log bounds only
    stage.size, stage.lateness = size, lateness
    stage.service = SimpleNamespace(_stop=threading.Event())
    stage._lock = threading.Lock()
    tp = ("events", 0)
    stage.stores = {tp: WindowStore(size, lateness, first_start)}
    stage._assigned_at, stage._cuts, stage._owned, stage._targets = {tp: assigned_at}, {tp: dict(cuts)}, {tp}, {}
    return stage, tp


def test_a_records_window_and_append_bound_do_not_depend_on_when_it_is_read():
    # Window 5 is [50, 60), closing at 62; its cut (the log end then) is offset 6, window 6's is 12.
    offsets = np.arange(10)
    ts = np.full(10, 55.0)
    # Read during window 5 (offsets 0-5 only exist yet): nothing is past a cut, and each was
    # appended before window 5's close.
    early, tp = _cut_stage(10, 2, 50, 0.0, {})
    past, first_close = early._log_bounds(tp, early.stores[tp], ts[:6], offsets[:6], now=55.0)
    assert past is None and first_close.tolist() == [62.0] * 6
    # Read long after (a slow reader, window 5 still open in its store): the same bound for the
    # same records, and the records appended after the cut are past it (late), not in window 5.
    late, tp = _cut_stage(10, 2, 50, 0.0, {5: 6, 6: 12})
    past, first_close = late._log_bounds(tp, late.stores[tp], ts, offsets, now=80.0)
    assert past.tolist() == [False] * 6 + [True] * 4
    assert first_close.tolist() == [62.0] * 6 + [72.0] * 4
    sel = late.stores[tp].select(ts, past_cut=past)
    assert sel.counts == {LATE: 4, ACCEPTED: 6} and sel.keep.tolist() == list(range(6))
    # Window 6 (closed at 72, its cut 12) likewise.
    past, _ = late._log_bounds(tp, late.stores[tp], np.array([65.0, 65.0]), np.array([11, 12]), now=80.0)
    assert past.tolist() == [False, True]


def test_a_window_closed_before_the_assignment_is_cut_at_the_first_highwater_seen():
    # Taken over at 75: windows 5 and 6 (closing at 62 and 72) are rebuilt and cut at the
    # highwater the new owner first saw (20); window 7 (closing at 82) at the watcher's cut.
    stage, tp = _cut_stage(10, 2, 50, 75.0, {7: 30})
    stage._targets[tp] = 20
    ts = np.array([55.0, 55.0, 65.0, 75.0, 75.0])
    offsets = np.array([19, 20, 25, 29, 30])
    past, first_close = stage._log_bounds(tp, stage.stores[tp], ts, offsets, now=90.0)
    assert past.tolist() == [False, True, True, False, True]
    # The append bound counts the cuts of windows closing after the assignment only.
    assert first_close.tolist() == [82.0, 82.0, 82.0, 82.0, 92.0]


def test_a_cut_the_watcher_records_a_moment_after_the_close_is_waited_for():
    import threading

    # On the real clock: window n closed just now (its cut is not recorded yet), at least 2 s
    # before its CUT_TIMEOUT_S (10 s) runs out, or the fallback would take over (the stub has no
    # consumer): up to 2 s of waiting for the next close.
    while True:
        now = time.time()
        n = int(np.floor((now - 2) / 10)) - 1
        if (n + 1) * 10 + 2 > now - 8:
            break
        time.sleep(0.1)
    stage, tp = _cut_stage(10, 2, n * 10, 0.0, {})

    def watcher():
        with stage._lock:
            stage._cuts[tp][n] = 3

    timer = threading.Timer(0.05, watcher)
    timer.start()
    try:
        t0 = time.monotonic()
        past, first_close = stage._log_bounds(tp, stage.stores[tp], np.full(5, n * 10 + 5.0), np.arange(5), now=now)
        waited = time.monotonic() - t0
    finally:
        timer.cancel()
    assert waited >= 0.04
    close = (n + 1) * 10 + 2
    assert past.tolist() == [False] * 3 + [True] * 2
    assert first_close.tolist() == [close] * 3 + [close + 10] * 2
