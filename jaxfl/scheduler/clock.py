"""The scheduler's virtual clock: a deterministic priority queue of timed events.

Simulated time only moves when an event is popped, so a run's timeline is a pure function of
what was pushed. Events compare by ``(time, priority, client, seq)``:

- ``priority`` comes from the event's kind, so at equal times a FedCompass group timer fires
  before an arrival that lands exactly on ``T_max`` (the paper marks a client late only when
  ``now > T_max``);
- ``client`` breaks ties between clients, as PORT requires (two idle times capped at 30 s give
  identical finish times; PLATO's heap broke on that);
- ``seq`` (push order) makes the order total, so two runs of one config pop the same sequence.

Pure Python; never imports jax.
"""

from __future__ import annotations

import heapq
import math
import operator
from typing import Any, Iterable

__all__ = ["Event", "EventQueue", "DEFAULT_PRIORITIES"]


class Event:
    """One scheduled happening on the virtual clock.

    Ordering and equality use only ``(time, priority, client, seq)``; ``kind`` and ``payload``
    ride along. A plain slotted class rather than a frozen dataclass: a million-client timeline
    creates tens of millions of these, and a frozen dataclass costs twice as much to build.

    Example:
        >>> Event(1.0, 0, 3, 0, "timer") < Event(1.0, 1, 0, 1, "arrival")
        True
    """

    __slots__ = ("time", "priority", "client", "seq", "kind", "payload")

    def __init__(self, time: float, priority: int, client: int, seq: int, kind: str, payload: Any = None):
        self.time = time
        self.priority = priority
        self.client = client
        self.seq = seq
        self.kind = kind
        self.payload = payload

    def key(self) -> tuple:
        """``(time, priority, client, seq)``: what orders events."""
        return (self.time, self.priority, self.client, self.seq)

    def __eq__(self, other) -> bool:
        return isinstance(other, Event) and self.key() == other.key()

    def __lt__(self, other: "Event") -> bool:
        return self.key() < other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        return (f"Event(time={self.time!r}, priority={self.priority!r}, client={self.client!r}, "
                f"seq={self.seq!r}, kind={self.kind!r}, payload={self.payload!r})")

    def __getstate__(self):
        return (self.time, self.priority, self.client, self.seq, self.kind, self.payload)

    def __setstate__(self, state) -> None:
        self.time, self.priority, self.client, self.seq, self.kind, self.payload = state


# Timers before arrivals at equal times, unless a policy says otherwise: the order jaxfl's policies
# were written against, kept so that their schedules stay what they were.
DEFAULT_PRIORITIES: dict[str, int] = {"timer": 0, "arrival": 1, "reply": 2}
# Arrivals before timers at equal times: an update that arrives exactly at a deadline (a FedAvg round's
# round_timeout, FedCompass's T_max, a PORT dispatch's deadline) is on time. With the default order
# a round of homogeneous clients whose timeout equals their round time dropped every update.
ARRIVALS_FIRST: dict[str, int] = {"arrival": 0, "timer": 1, "reply": 2}

# Rebuild the heap once cancelled entries outnumber live ones by this factor, so long runs that
# cancel many timers do not grow the heap without bound.
_COMPACT_FACTOR = 2
_COMPACT_MIN_HEAP = 64


class EventQueue:
    """A min-heap of :class:`Event` with a virtual clock ``now`` and lazy cancellation.

    Args:
        priorities: the complete ``kind -> priority`` table (lower fires first at equal times).
            ``None`` uses :data:`DEFAULT_PRIORITIES`. A given table replaces the default rather
            than extending it, so each policy states every kind it uses.

    Example:
        >>> q = EventQueue()
        >>> _ = q.push(2.0, "arrival", client=1)
        >>> _ = q.push(2.0, "timer")
        >>> q.pop().kind, q.now
        ('timer', 2.0)
    """

    def __init__(self, priorities: dict[str, int] | None = None):
        table = DEFAULT_PRIORITIES if priorities is None else priorities
        for kind, priority in table.items():
            if not isinstance(kind, str) or isinstance(priority, bool) or not isinstance(priority, int):
                raise ValueError(
                    f"priorities must map str -> int; got {kind!r}: {priority!r}"
                )
        self._priorities: dict[str, int] = dict(table)
        # Entries are (time, priority, client, seq, event): tuples compare in C, and the unique
        # seq ends every comparison before it reaches the event.
        self._heap: list[tuple] = []
        # Events pushed for the current instant (a reply to the client that just reported) wait in a
        # heap of their own: pushed onto the main heap, where everything in flight waits, each would
        # sift up its whole depth and down again when popped, though it is due before all of them.
        # Popping takes the smaller of the two tops, so the order is the one a single heap gives.
        self._due_now: list[tuple] = []
        # seq -> event for every event that may still be popped; the heaps may also hold
        # cancelled entries, which are skipped when they surface.
        self._pending: dict[int, Event] = {}
        self._next_seq = 0
        self._now = 0.0

    # (kind, payload) -> seqs of the pending events with that kind and payload, in push order; built
    # by the first find() (most runs never call it) and kept up to date from then on. A class default,
    # so that queues pickled before the index existed restore without one.
    _index: dict[tuple, list[int]] | None = None

    @property
    def now(self) -> float:
        """Time of the last popped event (0.0 before the first pop).

        Example:
            >>> EventQueue().now
            0.0
        """
        return self._now

    @property
    def priorities(self) -> dict[str, int]:
        """A copy of the ``kind -> priority`` table.

        Example:
            >>> EventQueue({"tick": 0}).priorities
            {'tick': 0}
        """
        return dict(self._priorities)

    def push(self, time: float, kind: str, client: int = -1, payload: Any = None) -> Event:
        """Schedule an event of ``kind`` at virtual ``time`` and return it (keep it to cancel).

        ``client`` is -1 for server events. ``payload`` must be JSON-able (dicts with str keys,
        lists, numbers, strings, None) if the queue is to be checkpointed with :meth:`state_dict`.

        Example:
            >>> q = EventQueue()
            >>> q.push(1.5, "arrival", client=4, payload={"version": 2}).time
            1.5
        """
        now, priority = self._now, self._priorities.get(kind)
        # _entry's checks and work, inline for an event that passes them (each dispatch pushes one)
        if (type(time) is float and now <= time < math.inf and priority is not None and type(client) is int
                and client >= -1 and self._index is None):
            seq = self._next_seq
            event = Event(time, priority, client, seq, kind, payload)
            self._next_seq = seq + 1
            self._pending[seq] = event
            heapq.heappush(self._due_now if time == now else self._heap, (time, priority, client, seq, event))
            return event
        entry = self._entry(time, kind, client, payload)
        heapq.heappush(self._due_now if entry[0] == now else self._heap, entry)
        return entry[-1]

    def push_many(self, events: Iterable[tuple[float, str, int, Any]]) -> list[Event]:
        """:meth:`push` of each ``(time, kind, client, payload)`` in turn, with one ``heapify`` instead of a
        heap push each (for many events at once): the same events, seqs and pop order (a dispatch of every client at once,
        FedCompass's warm-up). A refused event raises push's error, with the events before it pending.

        Example:
            >>> q = EventQueue()
            >>> [e.seq for e in q.push_many([(2.0, "arrival", 0, "a"), (1.0, "arrival", 1, "b")])]
            [0, 1]
            >>> q.pop().payload
            'b'
        """
        entries = []
        priorities, pending, now, seq = self._priorities, self._pending, self._now, self._next_seq
        inline = self._index is None  # with find()'s index, each event goes through _entry, which keeps it
        try:
            for time, kind, client, payload in events:
                # _entry's checks and work, inline for the events that pass them (a call per event was a
                # fifth of a 10^6-client warm-up); _entry itself for the others, and its error
                priority = priorities.get(kind)
                if (inline and type(time) is float and now <= time < math.inf and priority is not None
                        and type(client) is int and client >= -1):
                    event = Event(time, priority, client, seq, kind, payload)
                    pending[seq] = event
                    entries.append((time, priority, client, seq, event))
                    seq += 1
                else:
                    self._next_seq = seq
                    entries.append(self._entry(time, kind, client, payload))
                    seq = self._next_seq
        finally:
            self._next_seq = seq
            self._heap.extend(entries)
            heapq.heapify(self._heap)
        return [entry[-1] for entry in entries]

    def _entry(self, time: float, kind: str, client: int, payload: Any) -> tuple:
        """A new pending event's heap entry ``(time, priority, client, seq, event)``, its arguments checked."""
        if type(time) is not float:
            time = float(time)
        if not -math.inf < time < math.inf:
            raise ValueError(f"event time must be finite; got time={time!r} for kind={kind!r}")
        if time < self._now:
            raise ValueError(
                f"event time {time!r} is earlier than the clock (now={self._now!r}); "
                "events cannot be scheduled in the past"
            )
        priority = self._priorities.get(kind)
        if priority is None:
            raise ValueError(
                f"unknown event kind {kind!r}; allowed kinds: {sorted(self._priorities)}"
            )
        if type(client) is not int:
            client = operator.index(client)
        if client < -1:
            raise ValueError(f"client must be >= 0, or -1 for server events; got client={client}")
        seq = self._next_seq
        event = Event(time, priority, client, seq, kind, payload)
        self._next_seq = seq + 1
        self._pending[seq] = event
        if self._index is not None:
            self._add_to_index(event)
        return (time, priority, client, seq, event)

    def pop(self) -> Event:
        """Remove and return the earliest pending event, advancing ``now`` to its time.

        Example:
            >>> q = EventQueue()
            >>> _ = q.push(3.0, "arrival", client=0)
            >>> q.pop().time, q.now
            (3.0, 3.0)
        """
        heap = self._top_heap()
        if heap is None:
            raise IndexError(f"pop from an empty EventQueue (now={self._now!r})")
        return self._take_top(heap)

    def pop_due(self, until: float) -> Event | None:
        """:meth:`pop` if the earliest pending event is at ``until`` or before, else None (also when
        the queue is empty): the simulation's loop in one call instead of :meth:`peek` and :meth:`pop`.

        Example:
            >>> q = EventQueue()
            >>> _ = q.push(3.0, "arrival", client=0)
            >>> q.pop_due(2.0), q.pop_due(3.0).time
            (None, 3.0)
        """
        heap, due_now, pending = self._heap, self._due_now, self._pending  # _top_heap, inlined
        while heap and heap[0][3] not in pending:
            heapq.heappop(heap)
        if due_now:
            while due_now and due_now[0][3] not in pending:
                heapq.heappop(due_now)
            if due_now and (not heap or due_now[0] < heap[0]):
                heap = due_now
        if not heap or heap[0][0] > until:
            return None
        event = heapq.heappop(heap)[-1]  # _take_top, inlined on the simulation's hot path
        del pending[event.seq]
        if self._index is not None:
            self._remove_from_index(event)
        self._now = event.time
        return event

    def _take_top(self, heap: list[tuple]) -> Event:
        event = heapq.heappop(heap)[-1]
        del self._pending[event.seq]
        if self._index is not None:
            self._remove_from_index(event)
        self._now = event.time
        return event

    def peek(self) -> Event | None:
        """The event :meth:`pop` would return next, without removing it; ``None`` if empty.

        Example:
            >>> q = EventQueue()
            >>> q.peek() is None
            True
        """
        heap = self._top_heap()
        return None if heap is None else heap[0][-1]

    def cancel(self, event: Event) -> None:
        """Withdraw a pending event; it will never be popped and no longer counts in ``len``.

        Raises ValueError if the event was already popped or cancelled, or is from another
        queue: silently ignoring that would hide a policy bug (e.g. cancelling a timer that
        already fired).

        Example:
            >>> q = EventQueue()
            >>> timer = q.push(5.0, "timer")
            >>> q.cancel(timer)
            >>> len(q)
            0
        """
        if self._pending.get(event.seq) != event:
            raise ValueError(f"cannot cancel {event!r}: it is not pending in this queue")
        del self._pending[event.seq]
        if self._index is not None:
            self._remove_from_index(event)
        # Lazy deletion keeps cancel O(1); compact only when dead entries dominate.
        entries = len(self._heap) + len(self._due_now)
        if entries > _COMPACT_MIN_HEAP and entries > _COMPACT_FACTOR * (len(self._pending) + 1):
            # in place, both lists keeping their identity
            self._heap[:] = [(*e.key(), e) for e in self._pending.values()]
            self._due_now.clear()
            heapq.heapify(self._heap)

    def find(self, kind: str, payload: Any) -> Event | None:
        """The pending event of ``kind`` whose payload equals ``payload`` (the first pushed), or None.

        O(1) through an index of the pending events by ``(kind, payload)``, built by the first call
        (PORT's urgent pull finds the arrival of every dispatch it recalls). Payloads that cannot be
        hashed (JSON dicts and lists) are looked up by a scan of the pending events.

        Example:
            >>> q = EventQueue()
            >>> _ = q.push(4.0, "arrival", client=2, payload=7)
            >>> q.find("arrival", 7).time, q.find("arrival", 8)
            (4.0, None)
        """
        try:
            key = (kind, payload)
            hash(key)
        except TypeError:
            for event in self._pending.values():
                if event.kind == kind and event.payload == payload:
                    return event
            return None
        if self._index is None:
            self._index = {}
            for event in sorted(self._pending.values(), key=lambda event: event.seq):  # push order
                self._add_to_index(event)
        seqs = self._index.get(key)
        return self._pending[seqs[0]] if seqs else None

    def _add_to_index(self, event: Event) -> None:
        try:
            self._index.setdefault((event.kind, event.payload), []).append(event.seq)
        except TypeError:  # an unhashable payload: find() scans for those
            pass

    def _remove_from_index(self, event: Event) -> None:
        try:
            key = (event.kind, event.payload)
            seqs = self._index.get(key)
        except TypeError:
            return
        if seqs is not None:
            seqs.remove(event.seq)
            if not seqs:
                del self._index[key]

    def __len__(self) -> int:
        return len(self._pending)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def __repr__(self) -> str:
        return f"EventQueue(now={self._now!r}, pending={len(self)})"

    def state_dict(self) -> dict:
        """Plain, JSON-able snapshot (if the payloads are JSON-able) of the pending events and clock.

        Example:
            >>> q = EventQueue()
            >>> _ = q.push(1.0, "timer")
            >>> EventQueue.from_state_dict(q.state_dict()).pop().time
            1.0
        """
        return {
            "priorities": dict(self._priorities),
            "now": self._now,
            "next_seq": self._next_seq,
            "events": [
                {
                    "time": e.time,
                    "priority": e.priority,
                    "client": e.client,
                    "seq": e.seq,
                    "kind": e.kind,
                    "payload": e.payload,
                }
                for e in sorted(self._pending.values())
            ],
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> "EventQueue":
        """Rebuild a queue from :meth:`state_dict`; it pops the same events in the same order.

        Stored priorities and sequence numbers are kept as they were, so the order is exactly
        the original one even if the priority table were later edited.

        Example:
            >>> q = EventQueue.from_state_dict({"priorities": {"timer": 0}, "now": 2.0,
            ...                                 "next_seq": 0, "events": []})
            >>> q.now, len(q)
            (2.0, 0)
        """
        queue = cls(state["priorities"])
        queue._now = float(state["now"])
        queue._next_seq = int(state["next_seq"])
        for record in state["events"]:
            event = Event(
                float(record["time"]),
                int(record["priority"]),
                int(record["client"]),
                int(record["seq"]),
                record["kind"],
                record.get("payload"),
            )
            if event.seq >= queue._next_seq or event.seq in queue._pending:
                raise ValueError(f"corrupt EventQueue state: bad or duplicate seq in {record!r}")
            if event.time < queue._now:
                raise ValueError(f"corrupt EventQueue state: event before now={queue._now!r}: {record!r}")
            queue._pending[event.seq] = event
        queue._heap = [(*e.key(), e) for e in queue._pending.values()]
        heapq.heapify(queue._heap)
        return queue

    def _top_heap(self) -> list[tuple] | None:
        """The heap whose top is the earliest pending event (cancelled entries dropped from both
        tops on the way), or None when nothing is pending."""
        pending = self._pending
        for heap in (self._heap, self._due_now):
            while heap and heap[0][3] not in pending:
                heapq.heappop(heap)
        heap, due_now = self._heap, self._due_now
        if due_now and (not heap or due_now[0] < heap[0]):
            return due_now
        return heap or None

    def __setstate__(self, state: dict) -> None:
        """Queues pickled before the same-instant heap existed restore with an empty one."""
        state.setdefault("_due_now", [])
        self.__dict__.update(state)
