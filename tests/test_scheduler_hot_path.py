"""The scheduler's fast paths give exactly what the plain ones gave (issue 13: scheduler throughput):
the (kind, payload) index of EventQueue.find, the EventLog row writer, the idle pool's drawn-ahead
uniforms and its exchange, FedCompass's heap of fastest members, and the GC threshold of a run."""
import array
import csv
import dataclasses
import gc
import io
import pickle
import random

import numpy as np
import pytest

from jaxfl.algorithms.fedasync import FedAsync
from jaxfl.algorithms.fedbuff import FedBuff
from jaxfl.algorithms.fedcompass import REFERENCE_CODE, FedCompass
from jaxfl.runlog import EventLog, read_events
from jaxfl.scheduler.clock import EventQueue
from jaxfl.scheduler.pool import SELECTION_STREAM, IdlePool
from jaxfl.scheduler.simulation import EVENT_LOG_FIELDS, Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from jaxfl.scheduler.staleness import make_staleness
from tests.conftest import RecordingBackend


def scan(queue, kind, payload):
    """find() as it was: the first pushed pending event of kind whose payload equals payload."""
    matches = [e for e in queue._pending.values() if e.kind == kind and e.payload == payload]
    return min(matches, key=lambda e: e.seq) if matches else None


def test_find_through_its_index_agrees_with_a_scan_while_events_come_and_go():
    rng = random.Random(0)
    queue = EventQueue()
    assert queue.find("arrival", 0) is None  # builds the (empty) index
    live = []
    for step in range(3000):
        action = rng.random()
        if action < 0.5 or not live:
            payload = rng.choice([rng.randrange(40), None, "x", {"round": rng.randrange(3)}, [1, 2]])
            live.append(queue.push(queue.now + rng.random(), rng.choice(["arrival", "timer", "reply"]),
                                   rng.randrange(5), payload))
        elif action < 0.8:
            popped = queue.pop()
            live = [e for e in live if e.seq != popped.seq]
        else:
            queue.cancel(live.pop(rng.randrange(len(live))))
        if step % 7 == 0:
            for kind in ("arrival", "timer"):
                for payload in (rng.randrange(40), None, "x", {"round": 1}, [1, 2]):
                    assert queue.find(kind, payload) == scan(queue, kind, payload)
    # the index holds exactly the pending events with hashable payloads
    indexed = sorted(seq for seqs in queue._index.values() for seq in seqs)
    assert indexed == sorted(e.seq for e in queue._pending.values() if not isinstance(e.payload, (dict, list)))
    restored = pickle.loads(pickle.dumps(queue))  # a checkpoint keeps the index in step
    event = restored.find("arrival", 3)
    assert event == scan(restored, "arrival", 3)
    if event is not None:
        restored.cancel(event)
        assert restored.find("arrival", 3) == scan(restored, "arrival", 3)


def test_pop_due_pops_only_what_is_due():
    queue = EventQueue()
    timer = queue.push(1.0, "timer")
    queue.push(2.0, "arrival", client=1)
    queue.cancel(timer)
    assert queue.pop_due(1.5) is None and len(queue) == 1 and queue.now == 0.0
    assert queue.pop_due(2.0).client == 1 and queue.now == 2.0
    assert queue.pop_due(float("inf")) is None and not queue


def fedbuff_simulation(clients=300, log=None, **options):
    return Simulation(FedBuff(5, 4, make_staleness("polynomial", alpha=0.9, a=0.5), concurrency=40, seed=3),
                      ClientSpeeds(SpeedConfig(model="exp"), clients, seed=1), np.full(clients, 1 / clients),
                      RecordingBackend(), max_updates=60, log=log, **options)


@pytest.mark.parametrize("format", ["csv", "parquet"])
def test_rows_through_the_row_writer_are_the_rows_a_dict_writer_writes(tmp_path, format):
    if format == "parquet":
        pytest.importorskip("pyarrow")
    rows = []
    fedbuff_simulation(log=rows.append, wall_clock=lambda: 1.25).run()  # the dict path
    expected = io.StringIO(newline="")
    writer = csv.DictWriter(expected, EVENT_LOG_FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    # a small buffer, so that rows are spilled many times on the way
    with EventLog(str(tmp_path), format=format, buffer_rows=7) as log:
        simulation = fedbuff_simulation(log=log, wall_clock=lambda: 1.25)  # rows as tuples, through its row_writer
        simulation.run()
        assert log.rows == len(rows) > 500
    if format == "csv":
        assert (tmp_path / "events.csv").read_bytes().decode() == expected.getvalue()
    else:
        read = read_events(str(tmp_path))
        assert read["time"].tolist() == [row["time"] for row in rows]
        assert read["event"].tolist() == [row["event"] for row in rows]
        assert read["client"].tolist() == [row["client"] for row in rows]
        assert read["staleness"].tolist() == [-1 if row["staleness"] is None else row["staleness"] for row in rows]
        assert read["detail"].tolist() == [row["detail"] for row in rows]


def test_a_row_writer_for_other_fields_projects_onto_the_logs_columns(tmp_path):
    with EventLog(str(tmp_path), fields=("time", "event")) as log:
        log.row_writer(EVENT_LOG_FIELDS)((0.5, "timer", -1, None, 3, None, None, None, None))
        with pytest.raises(ValueError, match="lack this log's field"):
            log.row_writer(("time",))
    assert (tmp_path / "events.csv").read_text().splitlines() == ["time,event", "0.5,timer"]


def test_a_log_with_a_row_writer_gets_tuples_and_anything_else_is_refused_before_the_run():
    class TupleLog:  # any object with EventLog's row_writer: the simulation writes through it
        def __init__(self):
            self.fields, self.rows = None, []

        def row_writer(self, fields):
            self.fields = fields
            return self.rows.append

    dicts, tuples = [], TupleLog()
    fedbuff_simulation(log=dicts.append).run()
    fedbuff_simulation(log=tuples).run()
    assert tuples.fields == EVENT_LOG_FIELDS
    assert [dict(zip(EVENT_LOG_FIELDS, values)) for values in tuples.rows] == dicts
    with pytest.raises(TypeError, match="log='events.csv' is not allowed: a function taking one dict per row"):
        fedbuff_simulation(log="events.csv")


def test_a_simulation_pickled_mid_run_goes_on_exactly_as_the_uninterrupted_one(tmp_path):
    whole = []
    fedbuff_simulation(log=whole.append).run()
    first = []
    simulation = fedbuff_simulation(log=first.append)
    simulation.max_updates = 25
    simulation.run()
    restored = pickle.loads(pickle.dumps(simulation))
    second = []
    restored.attach(RecordingBackend(), second.append)
    restored.max_updates = 60
    restored.run()
    assert first + second == whole


def reference_draws(num_clients, seed, operations):
    """The pool as it was: numpy arrays and one scalar random() per draw."""
    clients, position = np.arange(num_clients), np.arange(num_clients)
    idle = num_clients
    rng = np.random.default_rng(np.random.SeedSequence([seed, SELECTION_STREAM, 0]))
    taken = []
    for operation, client in operations:
        if operation == "give_back":
            at = int(position[client])
            first_busy = int(clients[idle])
            clients[at], clients[idle] = first_busy, client
            position[first_busy], position[client] = at, idle
            idle += 1
        else:
            index = int(rng.random() * idle)
            last = idle - 1
            chosen, moved = int(clients[index]), int(clients[last])
            clients[index], clients[last] = moved, chosen
            position[moved], position[chosen] = index, last
            idle = last
            taken.append(chosen)
    return taken


def test_the_idle_pool_draws_exactly_as_with_one_random_call_per_draw_across_pickles():
    rng = random.Random(5)
    pool, busy, operations, taken = IdlePool(50, seed=9), [], [], []
    for step in range(2000):  # several blocks of drawn-ahead uniforms
        if busy and (len(busy) == 50 or rng.random() < 0.5):
            client = busy.pop(rng.randrange(len(busy)))
            if rng.random() < 0.5:
                operations += [("give_back", client), ("take", None)]
                busy.append(pool.exchange(client))
                taken.append(busy[-1])
            else:
                operations.append(("give_back", client))
                pool.give_back(client)
        else:
            operations.append(("take", None))
            busy.append(pool.take())
            taken.append(busy[-1])
        if step % 333 == 0:
            pool = pickle.loads(pickle.dumps(pool))
    assert taken == reference_draws(50, 9, operations)


def test_an_idle_pool_pickled_before_array_arrays_restores_and_draws_on():
    pool = IdlePool(20, seed=2)
    draws = [pool.take() for _ in range(5)]
    old = IdlePool.__new__(IdlePool)
    old.__dict__.update(clients=np.arange(20, dtype=np.int64), position=np.arange(20, dtype=np.int64), idle=20,
                        _rng=np.random.default_rng(np.random.SeedSequence([2, SELECTION_STREAM, 0])))
    state = dict(old.__dict__)  # what a pickle of the old layout holds
    restored = IdlePool.__new__(IdlePool)
    restored.__setstate__(state)
    assert [restored.take() for _ in range(5)] == draws


class CheckedCompass(FedCompass):
    """FedCompass whose heap of fastest members is checked against a scan of the members."""

    checks = 0

    def _fastest(self, group_id, group):
        members = group.pending if self.options.fastest_over == "pending" else group.pending | set(group.arrived)
        fastest = super()._fastest(group_id, group)
        assert fastest == min(self.clients[m].speed for m in members)
        CheckedCompass.checks += 1
        return fastest


@pytest.mark.parametrize("options", [None, REFERENCE_CODE])
def test_fedcompass_fastest_member_from_its_heap_is_the_scanned_minimum(options):
    kwargs = {} if options is None else {"options": options}
    CheckedCompass.checks = 0
    clients = 120
    simulation = Simulation(CheckedCompass(4, 20, lambda s: 1.0, **kwargs),
                            ClientSpeeds(SpeedConfig(model="exp", speed_change_prob=0.2), clients, seed=4),
                            np.full(clients, 1 / clients), RecordingBackend(), max_updates=500)
    simulation.run()
    assert CheckedCompass.checks > 200
    simulation.policy.check_invariants()


def test_a_run_raises_the_gc_threshold_and_puts_it_back():
    before = gc.get_threshold()
    seen = []
    fedbuff_simulation(after_event=lambda sim: seen.append(gc.get_threshold()[0])).run()
    assert gc.get_threshold() == before and min(seen) >= 50_000


def test_the_event_logs_buffered_rows_do_not_start_the_collections_of_a_run(tmp_path):
    # each buffered row is a tuple the collector tracks until the log writes it out: at a threshold of
    # 50,000, below the 65,536-row buffer, the rows alone started collections that scanned them all
    # (6 in this run, 7 in a 10^4-client timing-only one: 4-11 % of FedCompass's events/s)
    from jaxfl.algorithms.fedcompass import PAPER

    clients, collections = 1000, []

    def count(phase, info):
        if phase == "start" and info["generation"] == 0:
            collections.append(info)

    with EventLog(str(tmp_path), format="csv") as log:
        simulation = Simulation(FedCompass(4, 20, make_staleness("polynomial"), options=PAPER),
                                ClientSpeeds(SpeedConfig(model="exp"), clients, seed=0),
                                np.full(clients, 1 / clients), RecordingBackend(), max_updates=20_000, log=log)
        gc.callbacks.append(count)
        try:
            simulation.run()
        finally:
            gc.callbacks.remove(count)
        assert log.rows > 2 * log.buffer_rows
    assert len(collections) <= 1


def test_dispatch_fills_every_field_of_its_record():
    simulation = Simulation(FedBuff(5, 4, make_staleness("constant", alpha=1.0)),
                            ClientSpeeds(SpeedConfig(jitter=0.0, latency=0.5), 3, seed=0), np.full(3, 1 / 3),
                            RecordingBackend(), client_lr_decay=0.5)
    simulation.client_rounds[2] = 2
    record = simulation.dispatch(2, 4, lr_scale=0.8, fetch_step=3)
    assert dataclasses.asdict(record) == {
        "id": 0, "client": 2, "version": 0, "steps": 4, "client_round": 2, "start_time": 0.0,
        "arrival_time": 4 * 0.15 + 1.0, "status": "in_flight", "aggregated_in": None, "drop_reason": None,
        "lr_scale": 0.8 * 0.25, "fetch_step": 3, "fetch_version": None, "fetched": False,
        "step_time": (4 * 0.15 + 1.0 - 1.0) / 4, "planned_steps": None}
    assert simulation.client_rounds[2] == 3 and len(simulation.records) == 1 and simulation.records[0] is record


def fedasync_simulation(log):
    clients = 200
    return Simulation(FedAsync(5, make_staleness("polynomial", alpha=0.9, a=0.5), rule="fedcompass", concurrency=30, seed=2),
                      ClientSpeeds(SpeedConfig(model="exp"), clients, seed=5), np.full(clients, 1 / clients),
                      RecordingBackend(), max_updates=120, log=log)


def test_a_fedasync_simulation_pickled_before_the_array_columns_and_the_staleness_memo_goes_on_exactly():
    whole = []
    fedasync_simulation(whole.append).run()
    first = []
    simulation = fedasync_simulation(first.append)
    simulation.max_updates = 50
    simulation.run()
    assert simulation.policy._staleness_weights  # st(s) memoised by s
    state = pickle.loads(pickle.dumps(simulation)).__dict__
    # the layout of earlier checkpoints: numpy columns, no memo
    state["busy_time"] = np.array(state["busy_time"])
    state["client_rounds"] = np.array(state["client_rounds"], dtype=np.int64)
    state["speeds"]._rounds_done = np.array(state["speeds"]._rounds_done, dtype=np.int64)
    del state["policy"].__dict__["_staleness_weights"]
    old = Simulation.__new__(Simulation)
    old.__dict__.update(state)
    restored = pickle.loads(pickle.dumps(old))
    assert type(restored.busy_time) is array.array and type(restored.client_rounds) is array.array
    assert type(restored.speeds._rounds_done) is array.array and restored.policy._staleness_weights == {}
    second = []
    restored.attach(RecordingBackend(), second.append)
    restored.max_updates = 120
    restored.run()
    assert first + second == whole


def test_fedasync_weights_each_update_by_st_of_its_staleness_times_its_client_weight():
    simulation = fedasync_simulation(None)
    staleness = make_staleness("polynomial", alpha=0.9, a=0.5)
    seen = []
    aggregate = simulation.aggregate

    def checked(contributions, **options):
        (dispatch, coefficient), = contributions
        record = simulation.records[dispatch]
        assert coefficient == float(staleness(simulation.version - record.version)) * (1 / 200)
        seen.append(simulation.version - record.version)
        return aggregate(contributions, **options)

    simulation.aggregate = checked
    simulation.run()
    assert len(seen) == 120 and len(set(seen)) > 3  # several staleness values, each from the memo after its first
