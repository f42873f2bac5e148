"""FedBuff and FedAsync keep their concurrency through crashes: a crashed client's slot is refilled
from the idle clients (Policy.on_crash), the crashed client is never drawn again, and the run goes
on where it used to stall with every slot lost."""
import pickle

import numpy as np
import pytest

from jaxfl.algorithms import build_policy
from jaxfl.config import RunConfig, config_from_mapping
from jaxfl.experiment import run_experiment
from jaxfl.scheduler.faults import ClientFaults, FaultConfig
from jaxfl.scheduler.simulation import Policy, Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from jaxfl.testing import events_without_wall_time
from tests.conftest import RecordingBackend

ASYNCHRONOUS = ("fedbuff", "fedasync")
TIMING = {"dataset": "synthetic_iid", "partition": "natural", "model": "logreg", "timing_only": True,
          "progress": False, "checkpoint_every": None}


def simulation(algorithm, clients=200, concurrency=10, crash=0.2, max_updates=150, log=None, after_event=None,
               seed=3, **faults):
    config = RunConfig(algorithm=algorithm, clients=clients, concurrency=concurrency, local_steps=5,
                       buffer_size=3, seed=seed, heterogeneity="exp")
    speeds = ClientSpeeds(SpeedConfig(model="exp", mean=0.15), clients, seed=seed)
    fault_model = ClientFaults(FaultConfig(crash_prob=crash, **faults), clients, seed)
    return Simulation(build_policy(config), speeds, np.full(clients, 1 / clients), RecordingBackend(),
                      max_updates=max_updates, faults=fault_model, log=log, after_event=after_event)


@pytest.mark.parametrize("algorithm", ASYNCHRONOUS)
def test_a_crashed_slot_is_refilled_and_the_crashed_client_never_returns(algorithm):
    rows, in_flight = [], {}

    def watch(sim):  # the count left by the last event of each instant (replies come after arrivals)
        in_flight[sim.now] = (sim.accounting()["in_flight"], sim.policy.pool.idle)

    sim = simulation(algorithm, log=rows.append, after_event=watch)
    assert sim.run() == "update budget"
    crashed = {}
    for row in rows:
        if row["event"] == "crash":
            crashed[row["client"]] = row["time"]
        elif row["event"] == "dispatch":
            assert row["client"] not in crashed, f"client {row['client']} dispatched after its crash"
    assert len(crashed) >= 20  # enough crashes that, unrefilled, the 10 slots would be gone
    in_flight.pop(sim.now)  # the run stopped at the budget's aggregation, before that instant's reply
    assert all(count == 10 for count, idle in in_flight.values() if idle > 0)
    assert sim.accounting()["dropped_by_reason"]["client crashed"] == len(crashed)


@pytest.mark.parametrize("algorithm", ASYNCHRONOUS)
def test_crashes_drain_the_in_flight_clients_only_when_no_client_is_idle(algorithm):
    # 12 clients, 6 in flight, half the dispatches crash: the pool runs dry and the run ends with
    # every client crashed, never with an idle client left unused
    sim = simulation(algorithm, clients=12, concurrency=6, crash=0.5, max_updates=None)
    assert sim.run() == "no events left: all 12 clients crashed"
    counts = sim.accounting()
    assert counts["in_flight"] == 0 and sim.policy.pool.idle == 0
    assert counts["dropped_by_reason"]["client crashed"] == 12


def test_the_default_hook_leaves_a_policy_without_it_unchanged():
    assert Policy.on_crash(Policy(), None, None) is None  # other policies keep waiting on their deadlines


@pytest.mark.parametrize("algorithm", ASYNCHRONOUS)
def test_a_crash_run_pickled_mid_way_goes_on_exactly_as_the_uninterrupted_one(algorithm):
    whole = []
    simulation(algorithm, log=whole.append, dropout_prob=0.1, delay_prob=0.1).run()
    first = []
    sim = simulation(algorithm, log=first.append, max_updates=60, dropout_prob=0.1, delay_prob=0.1)
    sim.run()
    restored = pickle.loads(pickle.dumps(sim))
    second = []
    restored.attach(RecordingBackend(), second.append)
    restored.max_updates = 150
    restored.run()
    assert first + second == whole


@pytest.mark.parametrize("algorithm", ASYNCHRONOUS)
def test_the_reviewers_runs_keep_their_concurrency(algorithm, tmp_path):
    # `--clients 100000 --concurrency 1000 --crash-prob 0.01 --max-time 3000` ended with 17 in flight,
    # and `--concurrency 100 --crash-prob 0.05 --max-time inf` died after 212 updates: at a small size
    base = {**TIMING, "algorithm": algorithm, "clients": 2000, "concurrency": 50, "output_dir": str(tmp_path)}
    if algorithm == "fedbuff":
        base["buffer_size"] = 10
    timed = run_experiment(config_from_mapping({**base, "crash_prob": 0.01, "max_time": 3000.0,
                                                "run_name": "timed"}))
    assert timed.summary["stop_reason"] == "time budget"
    assert timed.summary["faults"]["crash"] >= 50  # every slot would have crashed once
    assert timed.summary["accounting"]["in_flight"] == 50 == timed.summary["policy"]["concurrency"]
    updates = run_experiment(config_from_mapping({**base, "crash_prob": 0.05, "max_updates": 3000,
                                                  "max_time": float("inf"), "run_name": "updates"}))
    assert updates.summary["stop_reason"] == "update budget" and updates.summary["global_updates"] == 3000
    # the arrival that made the last update stops the run before its client's reply goes out
    assert updates.summary["accounting"]["in_flight"] == 49


def test_a_crash_runs_timing_only_event_log_equals_the_training_runs(tmp_path):
    config = {"algorithm": "fedbuff", "dataset": "mnist10k", "model": "mlp", "clients": 12, "concurrency": 4,
              "buffer_size": 2, "local_steps": 3, "batch_size": 16, "max_updates": 12, "crash_prob": 0.2,
              "dropout_prob": 0.1, "delay_prob": 0.1, "stop_at_target": False, "progress": False,
              "checkpoint_every": None, "output_dir": str(tmp_path)}
    trained = run_experiment(config_from_mapping({**config, "run_name": "trained"}))
    timed = run_experiment(config_from_mapping({**config, "run_name": "timed", "timing_only": True}))
    assert trained.summary["faults"]["crash"] > 0
    log = events_without_wall_time(trained.run_dir)
    assert log == events_without_wall_time(timed.run_dir)
    assert any(",crash," in line for line in log.splitlines())
    assert trained.summary["timeline"] == timed.summary["timeline"]


class _OneRoundNoAggregation(Policy):
    """Sends every client once and aggregates nothing: the queue runs dry after one round."""

    def start(self, sim):
        for client in range(sim.num_clients):
            sim.dispatch(client, 5)

    def on_arrival(self, sim, record):
        pass


def test_a_run_that_runs_dry_counts_the_clients_that_crashed():
    """Before, the stop reason was "no events left" whether some, all or none of the clients crashed."""
    reasons = {}
    for crash in (0.0, 0.5, 1.0):
        speeds = ClientSpeeds(SpeedConfig(model="exp", mean=0.15), 6, seed=1)
        sim = Simulation(_OneRoundNoAggregation(), speeds, np.full(6, 1 / 6), RecordingBackend(),
                         faults=ClientFaults(FaultConfig(crash_prob=crash), 6, seed=1) if crash else None)
        crashed = len({r.client for r in sim.records if r.drop_reason == "client crashed"} if sim.run() else ())
        reasons[crash] = (sim.stop_reason, crashed)
    assert reasons[0.0] == ("no events left", 0)
    assert reasons[1.0] == ("no events left: all 6 clients crashed", 6)
    reason, crashed = reasons[0.5]
    assert 0 < crashed < 6 and reason == f"no events left: {crashed} of 6 clients crashed"


class _PullAt(Policy):
    """Client 0 trains 10 one-second steps; a timer at ``pull_at`` recalls it (PORT's urgent pull)."""

    def __init__(self, pull_at):
        self.pull_at, self.answers = pull_at, []

    def start(self, sim):
        self.record = sim.dispatch(0, 10)
        if self.pull_at is not None:
            sim.set_timer(self.pull_at, "pull")

    def on_timer(self, sim, payload):
        self.answers.append(sim.recall(self.record))

    def on_arrival(self, sim, record):
        pass


def test_a_client_pulled_before_its_drawn_crash_uploads_and_does_not_crash():
    """A client whose crash was drawn for later in its round is alive when PORT pulls it: it uploads
    its partial update if that lands before the crash. Before, every pull of a crash-fated dispatch
    got "no answer" and the server waited for its deadline."""
    from jaxfl.scheduler.speeds import ScriptedSpeeds

    def run(seed, pull_at):
        rows, policy = [], _PullAt(pull_at)
        sim = Simulation(policy, ScriptedSpeeds(lambda client, round: 1.0, 1), [1.0], RecordingBackend(),
                         log=rows.append, faults=ClientFaults(FaultConfig(crash_prob=1.0), 1, seed))
        sim.run()
        return policy.answers, {row["event"]: row for row in rows if row["event"] in ("arrival", "crash", "pull")}

    outcomes = set()
    for seed in range(30):
        _, unpulled = run(seed, None)
        crash_time = unpulled["crash"]["time"]  # 10 s · the drawn fraction
        answers, rows = run(seed, 1.5)  # after 1.5 s: it finishes its second step, uploads at 2.0
        if crash_time < 2.0:  # crashed before that upload (or before the pull): no answer, as before
            assert answers == [None] and "arrival" not in rows
            assert rows["crash"]["time"] == crash_time and rows["pull"]["detail"] == "urgent pull: no answer"
            outcomes.add("no answer")
        else:
            assert answers == [2] and "crash" not in rows
            assert rows["arrival"]["time"] == 2.0 and rows["arrival"]["steps"] == 2
            assert rows["pull"]["detail"] == "urgent pull: 2 of 10 steps, uploads at 2"
            outcomes.add("uploaded")
    assert outcomes == {"no answer", "uploaded"}
