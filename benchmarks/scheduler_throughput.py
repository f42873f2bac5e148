"""Scheduler throughput: events per second of timing-only runs against the number of clients.

For each algorithm and federation size, the scheduler, the speed model and the algorithm's policy
run on the virtual clock with no training (``timing_only``), writing the event log as a run does.
It reports queue events/s, event-log rows/s, the wall seconds, the seconds per 10^5 aggregations
and the growth of peak host memory, so that anything costing O(clients) per event shows up as a
falling rate along a row. FedAsync and FedBuff keep ``--concurrency`` clients in flight (default
1,000, the FedBuff paper's); FedCompass dispatches every client, as its paper does, so its run
begins with one dispatch per client before the first event: ``start s`` is that warm-up, and
``ev/s after`` the event rate after it. ``cpu ev/s`` divides by the process's CPU seconds rather
than wall seconds: on a shared machine it moves less with the other processes' load.

``cpu rnd/s`` counts client rounds (dispatches that came back) per CPU second: the work the
algorithms have in common. A queue event is not the same unit for each: a FedAsync or FedBuff
round is two events (the arrival, then the server's reply that dispatches the client again),
a FedCompass round one (its arrival; the group's reassignments are dispatched inside it), with
a timer event per group besides.

    python benchmarks/scheduler_throughput.py                   # 10^3 … 10^6 clients, 20,000 updates
    python benchmarks/scheduler_throughput.py --quick           # seconds: 10^3 and 10^4 clients
    python benchmarks/scheduler_throughput.py --json out.json
    python benchmarks/scheduler_throughput.py --breakdown --clients 10000   # µs per event, and where they go
    python benchmarks/scheduler_throughput.py --log-format csv   # the event log forced to one format
    python benchmarks/scheduler_throughput.py --log-rows 10000000   # write and read a 10^7-row event log

The event log is opened as a timing-only run opens it (``--log-format run``: "auto", starting in
Parquet when the run's update budget promises more rows than the switch), or forced to ``auto``
(CSV, converted to Parquet past 200,000 rows), ``csv`` or ``parquet``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxfl import algorithms  # noqa: E402
from jaxfl.config import RunConfig, validate  # noqa: E402
from _report import check_at_least, validated  # noqa: E402  (benchmarks/_report.py: it imports no jax)
from jaxfl.experiment import _expected_event_rows  # noqa: E402
from jaxfl.runlog import EVENT_LOG_FIELDS, EventLog, _pyarrow, read_events  # noqa: E402
from jaxfl.scheduler.simulation import Simulation, TimingBackend  # noqa: E402
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig  # noqa: E402

import numpy as np  # noqa: E402


LOG_FORMATS = ("run", "auto", "csv", "parquet")
log_format = "run"  # --log-format


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on a Mac
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def open_event_log(run_dir: str, config: RunConfig, policy) -> EventLog:
    """The event log as a timing-only run of ``config`` opens it, or forced to ``--log-format``."""
    if log_format == "run":
        return EventLog(run_dir, expected_rows=_expected_event_rows(config, policy))
    return EventLog(run_dir, format=log_format)


def measure(algorithm: str, clients: int, updates: int, concurrency: int | None, folder: str) -> dict:
    # buffer_size only where the algorithm reads it (elsewhere it is refused with a warning)
    buffer = {"buffer_size": 10} if algorithm == "fedbuff" else {}
    config = validate(RunConfig(algorithm=algorithm, clients=clients, max_updates=updates, timing_only=True,
                                concurrency=None if algorithm == "fedcompass" else min(concurrency, clients),
                                local_steps=20, progress=False, **buffer))
    rss_before = peak_rss_mb()
    start = time.perf_counter()
    policy = algorithms.build(config).policy()
    start_seconds = 0.0
    policy_start = policy.start

    def timed_start(sim):  # the policy's first dispatches, timed apart from the events
        nonlocal start_seconds
        began = time.perf_counter()
        policy_start(sim)
        start_seconds = time.perf_counter() - began

    policy.start = timed_start
    speeds = ClientSpeeds(SpeedConfig(model=config.heterogeneity, mean=config.speed_mean, jitter=config.jitter),
                          clients, seed=config.seed)
    run_dir = tempfile.mkdtemp(dir=folder)
    with open_event_log(run_dir, config, policy) as log:
        # the EventLog itself, as a run passes it: the simulation then hands it rows as tuples
        simulation = Simulation(policy, speeds, np.full(clients, 1.0 / clients), TimingBackend(),
                                max_updates=updates, log=log)
        setup = time.perf_counter() - start
        run_start, cpu_start = time.perf_counter(), time.process_time()
        simulation.run()
        log.flush()
        run_seconds, cpu_seconds = time.perf_counter() - run_start, time.process_time() - cpu_start
        rows = log.rows
    counts = simulation.accounting()
    rounds = counts["dispatched"] - counts["in_flight"]  # client rounds that came back (no faults here)
    return {"algorithm": algorithm, "clients": clients, "updates": simulation.version,
            "in_flight": counts["in_flight"], "events": simulation.events_processed,
            "log_rows": rows, "setup_s": round(setup, 3), "run_s": round(run_seconds, 3),
            "start_s": round(start_seconds, 3), "cpu_s": round(cpu_seconds, 3),
            "events_per_s": round(simulation.events_processed / run_seconds),
            "events_per_s_after_start": round(simulation.events_processed / max(run_seconds - start_seconds, 1e-9)),
            "events_per_cpu_s": round(simulation.events_processed / max(cpu_seconds, 1e-9)),
            "client_rounds": rounds, "rounds_per_cpu_s": round(rounds / max(cpu_seconds, 1e-9)),
            "rows_per_s": round(rows / run_seconds),
            "s_per_1e5_updates": round(run_seconds * 1e5 / max(simulation.version, 1), 2),
            "peak_rss_growth_mb": round(peak_rss_mb() - rss_before, 1)}


def cpu_per_event(algorithm: str, clients: int, updates: int, concurrency: int, folder: str, log: bool) -> dict:
    """CPU µs per queue event of one timing-only run, with or without the event log, and the run's
    counts per event (log rows, dispatches, aggregations)."""
    buffer = {"buffer_size": 10} if algorithm == "fedbuff" else {}
    config = validate(RunConfig(algorithm=algorithm, clients=clients, max_updates=updates, timing_only=True,
                                concurrency=None if algorithm == "fedcompass" else min(concurrency, clients),
                                local_steps=20, progress=False, **buffer))
    speeds = ClientSpeeds(SpeedConfig(model=config.heterogeneity, mean=config.speed_mean, jitter=config.jitter),
                          clients, seed=config.seed)
    policy = algorithms.build(config).policy()
    with open_event_log(tempfile.mkdtemp(dir=folder), config, policy) as events:
        simulation = Simulation(policy, speeds, np.full(clients, 1.0 / clients),
                                TimingBackend(), max_updates=updates, log=events if log else None)
        began = time.process_time()
        simulation.run()
        events.flush()
        seconds = time.process_time() - began
        count = simulation.events_processed
        return {"us": seconds * 1e6 / count, "rows": events.rows / count,
                "dispatches": len(simulation.records) / count, "aggregations": simulation.version / count}


def aggregation_cost(clients: int, repeats: int = 20_000) -> float:
    """CPU µs of one FedAsync aggregation of one arrived update (``Simulation.aggregate`` with the
    timing-only backend, no log row), timed over ``repeats`` records made arrived beforehand."""
    from jaxfl.scheduler.simulation import ARRIVED, IN_FLIGHT, Policy

    simulation = Simulation(Policy(), ClientSpeeds(SpeedConfig(model="exp"), clients, seed=0),
                            np.full(clients, 1.0 / clients), TimingBackend())
    records = []
    for client in range(repeats):  # each made arrived at once: a client trains one dispatch at a time
        records.append(simulation.dispatch(client % clients, 20))
        records[-1].status = ARRIVED
        simulation.training[client % clients] = 0
    simulation._counts[IN_FLIGHT] -= repeats
    simulation._counts[ARRIVED] += repeats
    aggregate = simulation.aggregate
    began = time.process_time()
    for record in records:
        aggregate([(record.id, 0.5)])
    return (time.process_time() - began) * 1e6 / repeats


def compass_group_costs(clients: int, groups: int, repeats: int = 2_000) -> dict:
    """CPU µs of FedCompass's JOINGROUP (a bisection of the open groups by T_a, here one that finds
    none), of the paper's scan it replaces (``_join_choice_scan``, the same choice) and of CREATEGROUP
    with its timer (the index of the open groups by T_exp, then the group deleted again), with
    ``groups`` groups open, on the policy's own objects."""
    from jaxfl.algorithms.fedcompass import ClientState, FedCompass
    from jaxfl.scheduler.staleness import make_staleness

    policy = FedCompass(4, 20, make_staleness("constant", alpha=1.0))
    simulation = Simulation(policy, ClientSpeeds(SpeedConfig(model="exp"), clients, seed=0),
                            np.full(clients, 1.0 / clients), TimingBackend())
    policy.clients = [ClientState(speed=0.1 + (client % 97) / 1000) for client in range(clients)]
    groups = min(groups, clients - 2)  # one client creates groups beyond them, one scans
    for client in range(groups):
        policy._create(simulation, client)
    policy.clients[-1].speed = 1e-9  # q far above Q_max for every group: a full scan that joins none
    began = time.process_time()
    for _ in range(repeats):
        policy._join_choice(clients - 1, 0.0)
    join = (time.process_time() - began) * 1e6 / repeats
    began = time.process_time()
    for _ in range(repeats):
        policy._join_choice_scan(clients - 1, 0.0)
    join_scan = (time.process_time() - began) * 1e6 / repeats
    began = time.process_time()
    for _ in range(repeats // 10):  # each new group deleted again (its timer cancelled): `groups` open throughout
        policy._create(simulation, groups)
        policy._delete(simulation, policy._next_group - 1)
    create = (time.process_time() - began) * 1e6 / (repeats // 10)
    return {"join": join, "join_scan": join_scan, "create": create}


def first_wave_draws(clients: int = 1 << 16) -> dict:
    """CPU µs per client of a first wave's speed draws (every client's first round, as FedCompass's
    warm-up draws them): one ``round_duration`` per client, and ``round_durations`` of them all (its
    ziggurat tables measured beforehand, once per process), on two ClientSpeeds of ``clients`` clients."""
    from jaxfl.scheduler.speeds import _ziggurat_tables

    _ziggurat_tables()
    alone, bulk = (ClientSpeeds(SpeedConfig(model="exp"), clients, seed=1) for _ in range(2))
    began = time.process_time()
    for client in range(clients):
        alone.round_duration(client, 20)
    alone_us = (time.process_time() - began) * 1e6 / clients
    began = time.process_time()
    bulk.round_durations(range(clients), 20)
    return {"alone": alone_us, "bulk": (time.process_time() - began) * 1e6 / clients}


class _RecordedCalls:
    """A policy's calls on its simulation, recorded per handler (None ends a handler's calls), for
    :class:`_Replay`: what the policy asked for, without how it decided."""

    def __init__(self, simulation: Simulation):
        self.calls, self._timers = [], {}
        for name in ("dispatch", "dispatch_many", "aggregate", "set_timer", "cancel"):
            setattr(self, f"_{name}", getattr(simulation, name))
            setattr(simulation, name, getattr(self, name))

    def dispatch(self, client, steps, lr_scale=1.0, detail=None):
        self.calls.append(("dispatch", client, steps, lr_scale, detail))
        return self._dispatch(client, steps, lr_scale, detail)

    def dispatch_many(self, clients, steps):
        self.calls.append(("dispatch_many", list(clients), steps))
        return self._dispatch_many(clients, steps)

    def aggregate(self, contributions, mode="delta", server_optimizer=True, payload=None):
        self.calls.append(("aggregate", list(contributions), server_optimizer))
        return self._aggregate(contributions, mode, server_optimizer, payload)

    def set_timer(self, time_, payload=None):
        event = self._set_timer(time_, payload)
        self._timers[event.seq] = len(self._timers)
        self.calls.append(("set_timer", time_, payload))
        return event

    def cancel(self, event):
        self.calls.append(("cancel", self._timers[event.seq]))
        return self._cancel(event)


class _Replay:
    """A policy that makes the recorded calls again, handler by handler: the same events, dispatches,
    aggregations and log rows as the recorded policy, with none of its own work."""

    def __init__(self, recorded: list, priorities: dict):
        self.recorded, self.position, self.timers, self.priorities = recorded, 0, [], priorities

    def _replay(self, sim, *_):
        recorded, position = self.recorded, self.position
        while (call := recorded[position]) is not None:
            position += 1
            if call[0] == "dispatch":
                sim.dispatch(*call[1:])
            elif call[0] == "aggregate":
                sim.aggregate(call[1], server_optimizer=call[2])
            elif call[0] == "set_timer":
                self.timers.append(sim.set_timer(*call[1:]))
            elif call[0] == "cancel":
                sim.cancel(self.timers[call[1]])
            else:  # the start: Simulation.run pauses collections around it, as for FedCompass's
                sim.dispatch_many(*call[1:])
        self.position = position + 1

    start = on_arrival = on_timer = _replay


def compass_own_cost(clients: int, updates: int, folder: str, repeats: int = 2) -> dict:
    """CPU µs per event of a FedCompass timing-only run with its event log, and of a replay of the
    same run's simulation calls (:class:`_Replay`: the scheduler, the speed draws, the queue and the
    log alone); the difference is FedCompass's own work. Best of ``repeats`` of each, alternating."""
    config = validate(RunConfig(algorithm="fedcompass", clients=clients, max_updates=updates, timing_only=True,
                                local_steps=20, progress=False))

    def run(policy=None, record=False):
        speeds = ClientSpeeds(SpeedConfig(model=config.heterogeneity, mean=config.speed_mean, jitter=config.jitter),
                              clients, seed=config.seed)
        policy = policy or algorithms.build(config).policy()
        with open_event_log(tempfile.mkdtemp(dir=folder), config, policy) as events:
            simulation = Simulation(policy, speeds, np.full(clients, 1.0 / clients), TimingBackend(),
                                    max_updates=updates, log=events)
            recorder = None
            if record:
                recorder = _RecordedCalls(simulation)
                for name in ("start", "on_arrival", "on_timer"):
                    handler = getattr(policy, name)
                    setattr(policy, name, lambda *args, _handler=handler: (_handler(*args), recorder.calls.append(None)))
            began = time.process_time()
            simulation.run()
            events.flush()
            return (time.process_time() - began) * 1e6 / simulation.events_processed, simulation, recorder

    _, recorded_run, recorder = run(record=True)
    compass, replay = [], []
    for _ in range(repeats):
        compass.append(run()[0])
        us, replayed, _ = run(_Replay(recorder.calls, recorded_run.policy.priorities))
        assert (replayed.events_processed, replayed.version) == (recorded_run.events_processed, recorded_run.version)
        replay.append(us)
    return {"compass": min(compass), "replay": min(replay)}


def breakdown(clients: int, updates: int, concurrency: int, folder: str, algorithms_: list[str]) -> dict:
    """Where an event's CPU microseconds go, per algorithm: the whole event with and without the
    event log and the run's counts per event; then the parts of the paths timed alone (µs per call,
    the scheduler's own objects)."""
    import timeit

    from jaxfl.scheduler.clock import EventQueue
    from jaxfl.scheduler.pool import IdlePool
    from jaxfl.scheduler.simulation import DispatchRecord

    def per_call(statement, number=20_000) -> float:  # CPU time, as the events are timed: steadier on a shared machine
        return round(min(timeit.repeat(statement, number=number, repeat=3, timer=time.process_time)) * 1e6 / number, 3)

    speeds = ClientSpeeds(SpeedConfig(model="exp"), clients, seed=0)
    draw_clients = iter(np.random.default_rng(0).integers(clients, size=200_000).tolist())
    queue = EventQueue()
    for client in range(concurrency):
        queue.push(float(client), "arrival", client, client)
    pool = IdlePool(clients, seed=0)
    busy = [pool.take() for _ in range(concurrency)]
    log = EventLog(tempfile.mkdtemp(dir=folder), format="csv")
    write = log.row_writer(EVENT_LOG_FIELDS)
    row = (1234.5678901234, "dispatch", 4321, 98765, 4567, None, 20, None, None)

    def queue_round():  # one arrival popped and pushed again later, as each dispatch does
        event = queue.pop_due(math.inf)
        queue.push(event.time + 1000.0, "arrival", event.client, event.payload)

    def reply_round():  # a reply pushed at the instant and popped (before the arrivals in flight)
        queue.push(queue.now, "reply", 0)
        queue.pop_due(math.inf)

    parts = {}
    for algorithm in algorithms_:
        logged = cpu_per_event(algorithm, clients, updates, concurrency, folder, True)
        unlogged = cpu_per_event(algorithm, clients, updates, concurrency, folder, False)
        parts[f"{algorithm} event, with the event log"] = round(logged["us"], 3)
        parts[f"{algorithm} event, without a log"] = round(unlogged["us"], 3)
        for count in ("rows", "dispatches", "aggregations"):
            parts[f"{algorithm}   {count} per event (count)"] = round(logged[count], 3)
    parts.update({
        "log row (tuple + csv.writer)": per_call(lambda: write(row), number=100_000),
        "speed draw (ClientSpeeds.round_duration)": per_call(lambda: speeds.round_duration(next(draw_clients), 20)),
        f"queue push + pop ({concurrency:,} pending)": per_call(queue_round),
        f"reply push + pop (due now, {concurrency:,} pending)": per_call(reply_round),
        "idle-pool exchange": per_call(lambda: busy.append(pool.exchange(busy.pop(0)))),
        "dispatch record": per_call(lambda: DispatchRecord(7, 3, 2, 20, 1, 1.5, 2.5, "in_flight", None, None, 1.0,
                                                           None, None, False, 0.1)),
    })
    if "fedasync" in algorithms_:
        parts["aggregation of one update (Simulation.aggregate, no log row)"] = round(aggregation_cost(clients), 3)
    if "fedcompass" in algorithms_:
        wave = first_wave_draws()
        parts["first-wave speed draw, one at a time (a fresh stream each)"] = round(wave["alone"], 3)
        parts["first-wave speed draws in bulk (ClientSpeeds.round_durations), per client"] = round(wave["bulk"], 3)
        own = compass_own_cost(clients, updates, folder)
        parts["fedcompass event with the log, best of 2"] = round(own["compass"], 3)
        parts["fedcompass event replayed: its simulation calls alone"] = round(own["replay"], 3)
        parts["fedcompass event: FedCompass's own work (the difference)"] = round(own["compass"] - own["replay"], 3)
        for groups in sorted({min(10, clients - 2), min(1000, clients - 2)}):
            costs = compass_group_costs(clients, groups)
            parts[f"FedCompass JOINGROUP, {groups} groups open"] = round(costs["join"], 3)
            parts[f"FedCompass JOINGROUP by the paper's scan, {groups} groups open"] = round(costs["join_scan"], 3)
            parts[f"FedCompass CREATEGROUP + timer, {groups} groups open"] = round(costs["create"], 3)
    log.close()
    return parts


def synthetic_rows(first: int, count: int, clients: int = 10**6) -> list[tuple]:
    """Rows ``first`` .. ``first + count - 1`` of a FedAsync-like log, as the simulation hands them
    to the log: at each instant an update's arrival, its aggregation and the next dispatch, 1,000
    in flight."""
    rng = np.random.default_rng(first)
    instants = range(first // 3, (first + count + 2) // 3)
    times = (np.cumsum(rng.exponential(0.0027, len(instants))) + first // 3 * 0.0027).tolist()
    picked = rng.integers(clients, size=(len(instants), 2)).tolist()
    rows = []
    for k, now, (arriving, leaving) in zip(instants, times, picked):
        rows += [(now, "arrival", arriving, k, max(k - 1000, 0), min(k, 1000), 20, None, None),
                 (now, "aggregate", -1, None, k + 1, None, None, "1 updates", None),
                 (now, "dispatch", leaving, k + 1000, k + 1, None, 20, None, None)]
    skip = first - instants[0] * 3 if len(instants) else 0
    return rows[skip:skip + count]


def log_rows(rows: int, format: str, folder: str, block: int = 1 << 17) -> dict:
    """CPU and wall seconds to write ``rows`` rows through ``EventLog.row_writer`` (``format``
    "run": "auto" told the rows to expect, as a timing-only run is) and to read them back with
    ``read_events``, and the log's size on disk. The rows are made in blocks outside the timing."""
    run_dir = tempfile.mkdtemp(dir=folder)
    log = EventLog(run_dir, **({"expected_rows": rows} if format == "run" else {"format": format}))
    write = log.row_writer(EVENT_LOG_FIELDS)
    cpu = wall = 0.0
    for first in range(0, rows, block):
        batch = synthetic_rows(first, min(block, rows - first))
        began, cpu_began = time.perf_counter(), time.process_time()
        for row in batch:
            write(row)
        wall, cpu = wall + time.perf_counter() - began, cpu + time.process_time() - cpu_began
    del batch
    began, cpu_began = time.perf_counter(), time.process_time()
    log.close()
    wall, cpu = wall + time.perf_counter() - began, cpu + time.process_time() - cpu_began
    size = sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(run_dir) for name in names)
    began, cpu_began = time.perf_counter(), time.process_time()
    columns = read_events(run_dir)
    read_wall, read_cpu = time.perf_counter() - began, time.process_time() - cpu_began
    assert len(columns["time"]) == rows and columns["event"][rows - 1] == synthetic_rows(rows - 1, 1)[0][1]
    return {"format": format, "written_as": log.format, "rows": rows, "write_s": round(wall, 2),
            "write_cpu_s": round(cpu, 2), "write_us_per_row": round(cpu * 1e6 / rows, 3),
            "read_s": round(read_wall, 2), "read_cpu_s": round(read_cpu, 2), "mb": round(size / 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=["fedasync", "fedbuff", "fedcompass"])
    parser.add_argument("--clients", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="10^3 and 10^4 clients, 2,000 updates (a smoke run)")
    parser.add_argument("--json", help="also write the table here")
    parser.add_argument("--breakdown", action="store_true",
                        help="CPU µs per event of each --algorithms at the first --clients, and per part of the paths")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="run",
                        help="the event log: as a timing-only run opens it (run), or forced to one format")
    parser.add_argument("--log-rows", type=int, metavar="N",
                        help="only write N event-log rows and read them back, in each of --log-formats")
    parser.add_argument("--log-formats", nargs="+", choices=LOG_FORMATS, default=["run", "csv"],
                        help="the formats --log-rows writes (default: run csv)")
    args = parser.parse_args()
    check_at_least(parser, args, {"clients": 1, "updates": 1, "concurrency": 1})
    for algorithm in args.algorithms:  # an unknown name fails here, before anything is timed
        validated(parser, RunConfig(algorithm=algorithm, timing_only=True, progress=False),
                  {"algorithm": "--algorithms"})
    global log_format
    log_format = args.log_format
    if args.log_rows is not None:
        if args.log_rows < 1:
            parser.error(f"--log-rows {args.log_rows} is not allowed: a number of rows >= 1")
        print(f"{'format':<8} {'written as':>10} {'rows':>10} {'write s':>8} {'write cpu s':>11} {'µs/row':>7} "
              f"{'read s':>7} {'read cpu s':>10} {'MB':>7}")
        with tempfile.TemporaryDirectory() as folder:
            log_rows(min(args.log_rows, 300_000), "parquet", folder)  # pyarrow warmed up outside the figures
            for format in args.log_formats:
                row = log_rows(args.log_rows, format, folder)
                print(f"{row['format']:<8} {row['written_as']:>10} {row['rows']:>10} {row['write_s']:>8} "
                      f"{row['write_cpu_s']:>11} {row['write_us_per_row']:>7} {row['read_s']:>7} "
                      f"{row['read_cpu_s']:>10} {row['mb']:>7}", flush=True)
        return
    if args.quick:
        args.clients, args.updates = [10**3, 10**4], 2_000
    if args.breakdown:
        with tempfile.TemporaryDirectory() as folder:
            parts = breakdown(args.clients[0], min(args.updates, 10_000), args.concurrency, folder, args.algorithms)
        for name, value in parts.items():
            print(f"{name:<62} {value:>8.3f}{'' if '(count)' in name else ' µs'}")
        return
    results = []
    _pyarrow()  # imported outside the figures (0.2-0.4 s, once a process): the first cell's log may load it
    print(f"{'algorithm':<11} {'clients':>9} {'updates':>8} {'events':>9} {'events/s':>9} {'cpu ev/s':>9} "
          f"{'cpu rnd/s':>9} {'rows/s':>9} {'s/1e5 upd':>9} {'start s':>8} {'ev/s after':>10} {'setup s':>8} {'+RSS MB':>8}")
    with tempfile.TemporaryDirectory() as folder:
        for algorithm in args.algorithms:
            for clients in args.clients:
                row = measure(algorithm, clients, args.updates, args.concurrency, folder)
                results.append(row)
                print(f"{row['algorithm']:<11} {row['clients']:>9} {row['updates']:>8} {row['events']:>9} "
                      f"{row['events_per_s']:>9} {row['events_per_cpu_s']:>9} {row['rounds_per_cpu_s']:>9} {row['rows_per_s']:>9} "
                      f"{row['s_per_1e5_updates']:>9} {row['start_s']:>8} {row['events_per_s_after_start']:>10} "
                      f"{row['setup_s']:>8} {row['peak_rss_growth_mb']:>8}", flush=True)
    if args.json:
        import jax

        payload = {"benchmark": "scheduler_throughput", "date": datetime.date.today().isoformat(),
                   "machine": platform.node(), "processor": platform.processor() or platform.machine(),
                   "cpus": os.cpu_count(), "python": platform.python_version(), "jax": jax.__version__,
                   "device": "CPU (the scheduler never uses a device)", "updates": args.updates,
                   "concurrency": args.concurrency, "results": results}
        with open(args.json, "w") as handle:
            json.dump(payload, handle, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
