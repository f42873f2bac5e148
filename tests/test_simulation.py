"""The pure-Python simulation: event order, reply semantics and budgets, with a recording backend."""

import pytest

from jaxfl.algorithms import FedAsync, FedAvg, FedBuff
from jaxfl.scheduler.simulation import Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, ScriptedSpeeds, SpeedConfig
from jaxfl.scheduler.staleness import polynomial
from tests.conftest import RecordingBackend


def simulate(policy, model="exp", clients=5, seed=0, max_updates=20, jitter=0.05, log=None):
    speeds = ClientSpeeds(SpeedConfig(model=model, mean=0.15, jitter=jitter), clients, seed=seed)
    backend = RecordingBackend()
    sim = Simulation(policy, speeds, [1 / clients] * clients, backend, max_updates=max_updates, log=log)
    sim.run()
    return sim, backend


def test_event_order_is_deterministic_for_a_seed():
    logs = []
    for _ in range(2):
        rows = []
        simulate(FedAsync(10, polynomial), seed=3, log=rows.append)
        logs.append(rows)
    assert logs[0] == logs[1]
    other = []
    simulate(FedAsync(10, polynomial), seed=4, log=other.append)
    assert other != logs[0]


def test_times_never_go_backwards_and_staleness_is_version_gap():
    rows = []
    sim, _ = simulate(FedBuff(10, 2, polynomial), log=rows.append)
    times = [row["time"] for row in rows]
    assert times == sorted(times)
    for row in rows:
        if row["event"] == "arrival":
            assert row["staleness"] >= 0


def test_fedasync_coefficients_are_staleness_times_weight():
    sim, backend = simulate(FedAsync(10, polynomial, rule="fedcompass"), clients=4, max_updates=12)
    for aggregation in backend.aggregations:
        ((dispatch_id, coefficient),) = aggregation.contributions
        record = sim.records[dispatch_id]
        staleness = aggregation.version - 1 - record.version
        assert coefficient == pytest.approx(0.9 * (staleness + 1) ** -0.5 * 0.25)


def test_simultaneous_arrivals_are_processed_before_replies():
    # homogeneous speeds, no jitter: all four arrive together; FedBuff(K=4) aggregates, then every
    # reply leaves with the new model (version 1).
    sim, backend = simulate(FedBuff(10, 4, lambda s: 1.0), model="homo", clients=4, jitter=0.0, max_updates=2)
    second_round = [r for r in sim.records if r.id >= 4]
    assert {r.version for r in second_round} == {1}
    assert backend.aggregations[0].time == pytest.approx(1.5)


def test_time_budget_leaves_later_events_in_flight():
    speeds = ClientSpeeds(SpeedConfig(model="homo", mean=1.0, jitter=0.0), 2, seed=0)
    sim = Simulation(FedAvg(10), speeds, [0.5, 0.5], RecordingBackend(), max_time=25.0)
    assert sim.run() == "time budget"
    assert sim.version == 2  # rounds end at 10 and 20; the one ending at 30 is past the budget
    assert sim.accounting()["in_flight"] == 2


def test_bad_arguments_fail_clearly():
    speeds = ClientSpeeds(SpeedConfig(), 2, seed=0)
    with pytest.raises(ValueError, match="max_time must be > 0"):
        Simulation(FedAvg(10), speeds, [0.5, 0.5], RecordingBackend(), max_time=0)
    with pytest.raises(ValueError, match="unknown FedBuff rule 'x'"):
        FedBuff(10, 2, polynomial, rule="x")
    with pytest.raises(ValueError, match="buffer_size must be >= 1"):
        FedBuff(10, 0, polynomial)


def test_inconsistent_payloads_are_refused_before_the_update():
    """A payload's own check runs in Simulation.aggregate, before the version moves."""
    from jaxfl.algorithms.ccfedavg import BankedUpdates
    from jaxfl.algorithms.fedat import TierUpdate
    from jaxfl.algorithms.port import PortWeights
    from jaxfl.algorithms.wrappers import NormalizeSteps

    speeds = ClientSpeeds(SpeedConfig(model="homo", mean=1.0, jitter=0.0), 2, seed=0)
    sim = Simulation(FedAvg(10), speeds, [0.5, 0.5], RecordingBackend(), max_time=15.0)
    sim.run()  # round 1 aggregated at t = 10; round 2 in flight
    contributions = [(0, 0.5)]
    bad = [(PortWeights((0, 1), (0.5,), (0.1, 0.1), (False, False)), "PortWeights.staleness_part has 1 entries"),
           (NormalizeSteps((1,), (0.5,)), "NormalizeSteps has no entries for the contributed dispatches \\[0\\]"),
           (BankedUpdates(((5, 0.5),)), "bank contribution \\(5, 0.5\\) needs a client in range"),
           (BankedUpdates(((1, float("nan")),)), "needs a client in range and a finite c"),
           (BankedUpdates((), kind="models"), "bank kind 'models'"),
           (BankedUpdates((), store=("delta", "x")), "must name delta or model banks"),
           (TierUpdate(2, ((0, 0.5), (1, 0.5))), "its tier \\(2\\) among tier_weights")]
    for payload, message in bad:
        with pytest.raises(ValueError, match=message):
            sim.aggregate(contributions, payload=payload)
    assert sim.version == 1


def test_a_policy_that_keeps_scheduling_at_one_instant_stops_as_stalled_not_for_ever():
    # a round of nobody ended by a timer of no delay, over and over (CC-FedAvg's dropout once did): max_time
    # never comes, so the run stops after far more events at one instant than a round of every client makes
    from jaxfl.scheduler.simulation import Policy, same_instant_limit

    class Looping(Policy):
        def start(self, sim):
            sim.set_timer(sim.now + 1.0, "again")

        def on_arrival(self, sim, record):
            pass

        def on_timer(self, sim, payload):
            sim.set_timer(sim.now, "again")

    sim = Simulation(Looping(), ScriptedSpeeds(lambda c, r: 1.0, num_clients=2), [0.5, 0.5], RecordingBackend(),
                     max_time=100.0)
    reason = sim.run()
    assert reason.startswith(f"stalled: {same_instant_limit(2):,} events at virtual time 1 s without the clock moving")
    assert "policy Looping keeps scheduling at one instant" in reason and sim.events_processed == same_instant_limit(2)


def test_rounds_shorter_than_the_clocks_resolution_stop_as_stalled_naming_the_client(monkeypatch):
    # accepted times per step (1e5 s and 1e-12 s are both within the allowed range) that the float64 clock
    # cannot tell apart once it is at 10^5 s: client 1's rounds arrived at the instant they left, and the
    # stall was blamed on the policy ("a timer of no delay that sets itself again?")
    from jaxfl.scheduler import simulation

    monkeypatch.setattr(simulation, "same_instant_limit", lambda num_clients: 1000)  # 10^6 events: 27 s
    speeds = ScriptedSpeeds(lambda client, round_: 1e5 if round_ == 0 else 1e-12, num_clients=2)
    sim = Simulation(FedAsync(1, polynomial), speeds, [0.5, 0.5], RecordingBackend(), max_time=float("inf"))
    reason = sim.run()
    assert reason.startswith("stalled: 1,000 events at virtual time 100000 s")
    assert "round of 1 step(s) is shorter than the clock's resolution there (1.46e-11 s" in reason, reason
    assert "policy" not in reason
