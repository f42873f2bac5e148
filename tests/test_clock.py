"""Tests for the scheduler's virtual clock (jaxfl.scheduler.clock)."""

import json
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxfl.scheduler.clock import DEFAULT_PRIORITIES, Event, EventQueue


def _key(event):
    return (event.time, event.priority, event.client, event.seq)


def _drain(queue):
    events = []
    while len(queue):
        events.append(queue.pop())
    return events


def test_orders_by_time_then_priority_then_client_then_seq():
    queue = EventQueue()
    queue.push(2.0, "arrival", client=0)
    queue.push(1.0, "reply", client=0)
    queue.push(1.0, "arrival", client=5)
    queue.push(1.0, "arrival", client=3)
    queue.push(1.0, "timer")
    queue.push(0.5, "reply", client=9)
    popped = [(e.time, e.kind, e.client) for e in _drain(queue)]
    assert popped == [
        (0.5, "reply", 9),
        (1.0, "timer", -1),
        (1.0, "arrival", 3),
        (1.0, "arrival", 5),
        (1.0, "reply", 0),
        (2.0, "arrival", 0),
    ]


def test_identical_keys_pop_in_push_order():
    queue = EventQueue()
    for index in range(10):
        queue.push(4.0, "arrival", client=7, payload=index)
    assert [e.payload for e in _drain(queue)] == list(range(10))


def test_capped_idle_ties_break_by_client_id():
    # PORT §5.2: clients 22 and 41 both capped at 30 s finish together; lower id first,
    # whichever was pushed first.
    queue = EventQueue()
    queue.push(30.0, "arrival", client=41)
    queue.push(30.0, "arrival", client=22)
    assert [queue.pop().client, queue.pop().client] == [22, 41]


def test_now_advances_on_pop_and_peek_does_not_move_it():
    queue = EventQueue()
    assert queue.now == 0.0 and queue.peek() is None
    queue.push(3.0, "arrival", client=1)
    queue.push(1.5, "timer")
    assert queue.peek().time == 1.5 and queue.now == 0.0
    assert queue.pop().time == 1.5 and queue.now == 1.5
    assert queue.pop().time == 3.0 and queue.now == 3.0


def test_pop_empty_raises_index_error():
    with pytest.raises(IndexError, match="empty"):
        EventQueue().pop()


def test_cancel_removes_event_and_len_excludes_it():
    queue = EventQueue()
    timer = queue.push(1.0, "timer", payload="group-0")
    queue.push(2.0, "arrival", client=0)
    assert len(queue) == 2
    queue.cancel(timer)
    assert len(queue) == 1
    assert queue.peek().kind == "arrival"
    assert [e.kind for e in _drain(queue)] == ["arrival"]


def test_cancel_twice_or_after_pop_raises():
    queue = EventQueue()
    timer = queue.push(1.0, "timer")
    queue.cancel(timer)
    with pytest.raises(ValueError, match="not pending"):
        queue.cancel(timer)
    arrival = queue.push(1.0, "arrival", client=0)
    queue.pop()
    with pytest.raises(ValueError, match="not pending"):
        queue.cancel(arrival)


def test_many_cancellations_compact_the_heap():
    queue = EventQueue()
    events = [queue.push(float(i), "timer") for i in range(1000)]
    for event in events[:-1]:
        queue.cancel(event)
    assert len(queue) == 1
    assert len(queue._heap) < 200  # compaction kept dead entries bounded
    assert queue.pop() is events[-1]


def test_events_pushed_at_the_current_instant_pop_in_key_order_with_the_rest():
    """Events due now (a reply to the client that reported) wait in a small heap of their own; every
    way of taking events merges the two heaps by key, and cancelling, compacting and pickling see both."""
    queue = EventQueue()
    for client in range(40):
        queue.push(1.0 + client // 2, "arrival", client=client, payload=client)
    first = queue.pop_due(math.inf)
    assert (first.time, first.client) == (1.0, 0)
    reply = queue.push(queue.now, "reply", client=0)
    timer = queue.push(queue.now, "timer")
    late_arrival = queue.push(queue.now, "arrival", client=5)
    dropped = queue.push(queue.now, "reply", client=3)
    assert len(queue._due_now) == 4 and len(queue._heap) == 39  # kept apart from the 39 in flight
    queue.cancel(dropped)
    assert queue.peek() is timer
    restored = pickle.loads(pickle.dumps(queue))
    state = dict(queue.__dict__)
    del state["_due_now"]  # a queue pickled before the same-instant heap existed
    old = EventQueue.__new__(EventQueue)
    old.__setstate__(state)
    assert old._due_now == [] and old.peek().client == 1  # its events were all on the one heap
    # client 1's arrival, on the main heap since the start, pops between the timer and client 5's (1 < 5)
    expected = [(1.0, "timer", -1), (1.0, "arrival", 1), (1.0, "arrival", 5), (1.0, "reply", 0), (2.0, "arrival", 2)]
    assert [(e.time, e.kind, e.client) for e in (queue.pop_due(2.0) for _ in range(5))] == expected
    assert [(e.time, e.kind, e.client) for e in (restored.pop() for _ in range(5))] == expected
    assert reply.seq not in queue._pending and late_arrival.seq not in queue._pending
    # a compaction (many cancelled timers) folds what waits for the instant into the main heap
    timers = [queue.push(queue.now, "timer", payload=i) for i in range(200)]
    for event in timers[1:]:
        queue.cancel(event)
    assert queue._due_now == [] and queue.pop() is timers[0]


def test_push_equal_to_now_is_allowed_but_earlier_is_rejected():
    queue = EventQueue()
    queue.push(5.0, "arrival", client=0)
    queue.pop()
    queue.push(5.0, "timer")  # same instant: fine
    with pytest.raises(ValueError, match="4.99"):
        queue.push(4.99, "arrival", client=0)


@pytest.mark.parametrize("bad_time", [math.nan, math.inf, -math.inf])
def test_push_rejects_non_finite_times(bad_time):
    with pytest.raises(ValueError, match="finite"):
        EventQueue().push(bad_time, "timer")


def test_push_rejects_unknown_kind_and_bad_client():
    with pytest.raises(ValueError, match="'trigger'"):
        EventQueue().push(1.0, "trigger")
    with pytest.raises(ValueError, match="client"):
        EventQueue().push(1.0, "arrival", client=-2)


def test_custom_priority_table_replaces_default():
    queue = EventQueue({"arrival": 0, "trigger": 1})
    queue.push(1.0, "trigger")
    queue.push(1.0, "arrival", client=3)
    assert queue.pop().kind == "arrival"
    with pytest.raises(ValueError, match="'timer'"):
        queue.push(1.0, "timer")
    assert DEFAULT_PRIORITIES == {"timer": 0, "arrival": 1, "reply": 2}


def test_event_ordering_ignores_kind_and_payload():
    assert Event(1.0, 1, 2, 3, "a", {"x": 1}) == Event(1.0, 1, 2, 3, "b", None)
    assert Event(1.0, 0, 9, 9, "timer") < Event(1.0, 1, 0, 0, "arrival")


def test_state_dict_round_trip_through_json_preserves_pop_order():
    queue = EventQueue()
    queue.push(1.0, "arrival", client=2, payload={"version": 0})
    queue.pop()
    cancelled = queue.push(3.0, "timer", payload={"group": 1})
    for client in (4, 1, 3):
        queue.push(2.0, "arrival", client=client, payload={"version": client})
    queue.push(2.0, "timer", payload={"group": 0})
    queue.cancel(cancelled)

    restored = EventQueue.from_state_dict(json.loads(json.dumps(queue.state_dict())))
    assert restored.now == queue.now == 1.0
    assert len(restored) == len(queue) == 4
    # New pushes after restore must continue the sequence numbering identically.
    queue.push(2.0, "timer", payload="late")
    restored.push(2.0, "timer", payload="late")
    original = [(_key(e), e.kind, e.payload) for e in _drain(queue)]
    assert [(_key(e), e.kind, e.payload) for e in _drain(restored)] == original
    assert [k[0][0] for k in original] == [2.0] * 5


# Few distinct times and clients so that ties at every level of the key are common.
_push_op = st.tuples(
    st.just("push"),
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 1e-9, 1e9]),
    st.sampled_from(sorted(DEFAULT_PRIORITIES)),
    st.integers(min_value=-1, max_value=3),
)
_ops = st.lists(
    st.one_of(_push_op, st.tuples(st.just("cancel"), st.integers(0, 10**6)), st.just(("pop",))),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_property_pops_sorted_and_each_live_event_exactly_once(ops):
    queue = EventQueue()
    pushed, cancelled, popped = [], set(), []
    for op in ops:
        if op[0] == "push":
            _, offset, kind, client = op
            # Offsets relative to now keep pushes legal while pops interleave.
            pushed.append(queue.push(queue.now + offset, kind, client=client))
        elif op[0] == "cancel":
            live = [e for e in pushed if e.seq not in cancelled and e not in popped]
            if live:
                victim = live[op[1] % len(live)]
                queue.cancel(victim)
                cancelled.add(victim.seq)
        elif len(queue):
            expected = min(e for e in pushed if e.seq not in cancelled and e not in popped)
            event = queue.pop()
            assert event is expected
            popped.append(event)
    popped.extend(_drain(queue))

    times = [e.time for e in popped]
    assert times == sorted(times)  # the clock never runs backwards
    live_seqs = sorted(e.seq for e in pushed if e.seq not in cancelled)
    assert sorted(e.seq for e in popped) == live_seqs  # each live event exactly once


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100, allow_nan=False), st.sampled_from(["timer", "arrival", "reply"]),
                          st.integers(-1, 5)), max_size=60))
def test_property_batch_pushes_pop_in_key_order(pushes):
    queue = EventQueue()
    events = [queue.push(t, kind, client=c) for t, kind, c in pushes]
    assert [_key(e) for e in _drain(queue)] == sorted(_key(e) for e in events)


def test_push_many_equals_repeated_pushes():
    pushes = [(3.0, "arrival", 2, 7), (1.0, "timer", -1, "g"), (1.0, "arrival", 0, 8), (0.0, "reply", 4, None),
              (3.0, "arrival", 2, 9)]
    one_by_one, bulk = EventQueue(), EventQueue()
    for queue in (one_by_one, bulk):
        queue.push(0.5, "arrival", client=1, payload=6)
        assert queue.find("arrival", 6) is not None  # an index, kept up to date by both
    pushed = [one_by_one.push(*push) for push in pushes]
    bulk_pushed = bulk.push_many(iter(pushes))
    assert [(_key(e), e.kind, e.payload) for e in bulk_pushed] == [(_key(e), e.kind, e.payload) for e in pushed]
    assert bulk.find("arrival", 9) is bulk_pushed[-1]
    assert [(_key(e), e.payload) for e in _drain(bulk)] == [(_key(e), e.payload) for e in _drain(one_by_one)]
    # a refused event: push's own error, the events before it pending as after the pushes that succeeded
    queue = EventQueue()
    with pytest.raises(ValueError, match="unknown event kind 'trigger'"):
        queue.push_many([(2.0, "arrival", 0, None), (1.0, "trigger", 0, None), (3.0, "arrival", 1, None)])
    assert len(queue) == 1 and queue.pop().time == 2.0
