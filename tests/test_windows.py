"""Tumbling windows: a data-independent schedule, lateness, entity dedupe, held offsets."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.pipeline.windows import ACCEPTED, DUPLICATE_ENTITY, LATE, WindowStore


def add(store, ts, entity=None, partition=0, offset=None, flagged=False, eid=None):
    return store.add_one(ts, (ts, 1.0), flagged, event_id=eid or f"{partition}:{offset}", entity=entity,
                         partition=partition, offset=offset)


def test_windows_close_in_order_on_wall_clock_even_when_empty():
    store = WindowStore(size=10, allowed_lateness=2, first_start=103, n_features=2)
    assert store.next_start == 100 and store.next_close_time == 112
    add(store, 125.0)
    assert list(store.close_due(111.9)) == []
    closed = list(store.close_due(132.0))  # windows 100, 110, 120 are due
    assert [(w.start, w.end, w.n_events) for w in closed] == [(100, 110, 0), (110, 120, 0), (120, 130, 1)]
    assert closed[0].X.shape == (0, 2) and closed[0].flagged.shape == (0,)
    assert closed[2].X.tolist() == [[125.0, 1.0]]


def test_late_events_are_those_before_the_next_window_to_close():
    store = WindowStore(size=10, allowed_lateness=5, first_start=100)
    assert add(store, 99.9) == LATE  # before the first scheduled window
    assert add(store, 109.0) == ACCEPTED
    list(store.close_due(115.0))
    assert add(store, 109.5) == LATE  # its window was released
    assert add(store, 110.0) == ACCEPTED  # allowed lateness: window 110 is still open at 115


def test_one_event_per_entity_per_window():
    store = WindowStore(size=10, allowed_lateness=0, first_start=0)
    assert add(store, 1, entity="p1", eid="a") == ACCEPTED
    assert add(store, 2, entity="p1", eid="b") == DUPLICATE_ENTITY
    assert add(store, 3, entity="p2", eid="c") == ACCEPTED
    assert add(store, 11, entity="p1", eid="d") == ACCEPTED  # next window: allowed again
    first = next(store.close_due(10))
    assert first.event_ids == ("a", "c")


def test_held_offsets_are_the_smallest_per_partition_over_open_windows():
    store = WindowStore(size=10, allowed_lateness=0, first_start=0)
    add(store, 5, partition=0, offset=7)
    add(store, 15, partition=0, offset=3)  # out of order in event time
    add(store, 16, partition=1, offset=40)
    add(store, 6, partition=1, offset=41)
    assert store.held_offsets() == {0: 3, 1: 40}
    list(store.close_due(10))  # window 0 released: only window 10 holds offsets
    assert store.held_offsets() == {0: 3, 1: 40}
    list(store.close_due(20))
    assert store.held_offsets() == {}


def test_drop_partitions_forgets_their_events_and_entities():
    store = WindowStore(size=10, allowed_lateness=0, first_start=0)
    add(store, 1, entity="p1", partition=0, offset=0, eid="a")
    add(store, 2, entity="p2", partition=1, offset=0, eid="b")
    assert store.drop_partitions([1]) == 1
    assert store.held_offsets() == {0: 0}
    assert add(store, 3, entity="p2", partition=0, offset=1, eid="c") == ACCEPTED  # p2 may come back
    assert add(store, 4, entity="p1", partition=0, offset=2, eid="d") == DUPLICATE_ENTITY
    assert next(store.close_due(10)).event_ids == ("a", "c")


def test_close_due_is_lazy_so_a_stop_leaves_later_windows_open():
    store = WindowStore(size=1, allowed_lateness=0, first_start=0)
    gen = store.close_due(100)
    assert next(gen).start == 0
    gen.close()
    assert store.next_start == 1.0


def test_horizon_and_flagged_array():
    store = WindowStore(size=60, allowed_lateness=5, first_start=0)
    assert store.horizon(1000.0) == 1065.0
    add(store, 1, flagged=True)
    add(store, 2, flagged=False)
    w = next(store.close_due(65))
    assert w.flagged.dtype == np.bool_ and w.flagged.tolist() == [True, False]


def test_size_must_be_positive():
    with pytest.raises(ValueError):
        WindowStore(size=0, allowed_lateness=0, first_start=0)


def test_add_batch_matches_add_one_event_by_event():
    """The columnar batch path keeps exactly what add_one keeps, in the same order, with the
    same statuses and held offsets: batches spanning windows, late events, repeated entities,
    batches from several partitions, mixed with single events."""
    from hypothesis import given, settings, strategies as st

    event = st.tuples(st.integers(0, 39), st.sampled_from([None, "p1", "p2", "p3", "p4"]), st.booleans())
    batch = st.tuples(st.integers(0, 2), st.lists(event, min_size=1, max_size=12), st.booleans())

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(st.lists(batch, min_size=1, max_size=6), st.booleans())
    def check(batches, use_entities):
        one = WindowStore(size=10, allowed_lateness=0, first_start=10, n_features=2)
        many = WindowStore(size=10, allowed_lateness=0, first_start=10, n_features=2)
        offset = 0
        for b, (partition, events, single) in enumerate(batches):
            ts = np.array([t + 0.5 for t, _, _ in events])
            X = np.column_stack([ts, np.arange(len(events), dtype=float)])
            flagged = np.array([f for _, _, f in events])
            ids = [f"{b}-{i}" for i in range(len(events))]
            ents = [e or "" for _, e, _ in events] if use_entities else None
            offsets = np.arange(offset, offset + len(events))
            offset += len(events)
            expect: dict[str, int] = {}
            for i in range(len(events)):
                status = one.add_one(ts[i], tuple(X[i]), bool(flagged[i]), event_id=ids[i],
                                     entity=None if ents is None else ents[i], partition=partition, offset=int(offsets[i]))
                expect[status] = expect.get(status, 0) + 1
            if single:  # the same events one by one into the batch store too
                for i in range(len(events)):
                    many.add_one(ts[i], tuple(X[i]), bool(flagged[i]), event_id=ids[i],
                                 entity=None if ents is None else ents[i], partition=partition, offset=int(offsets[i]))
            else:
                assert many.add_batch(ts, X, flagged, event_ids=ids, entities=ents, partition=partition,
                                      offsets=offsets) == expect
            assert many.held_offsets() == one.held_offsets()
            assert many.n_open_events == one.n_open_events
            if b == 2:  # a window closes between batches: later events in it are late
                list(one.close_due(25.0)), list(many.close_due(25.0))
        assert one.drop_partitions([1]) == many.drop_partitions([1])
        for a, c in zip(one.close_due(100.0), many.close_due(100.0)):
            assert (a.start, a.event_ids, a.entities) == (c.start, c.event_ids, c.entities)
            assert a.X.tolist() == c.X.tolist() and a.flagged.tolist() == c.flagged.tolist()

    check()
