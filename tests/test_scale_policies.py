"""FedASMU's, PORT's, FedAvg's and CC-FedAvg's idle-client draws and FedAT's round membership cost
O(log n) or O(1) per event (a synchronous round: per client of the round),
not O(clients), and choose exactly what the O(clients) code before them chose: the same random
draws in the same order, the same clients, the same event log. Each reference below is that old
code, kept here. Costs are counted (entries touched, comparisons made), not timed."""

import pickle

import numpy as np
import pytest

from jaxfl.algorithms import fedasmu, port
from jaxfl.algorithms.fedasmu import FedASMU
from jaxfl.scheduler.pool import IdleClients
from jaxfl.algorithms.fedat import FedAT
from jaxfl.algorithms.port import PAPER, PLATO, PORT
from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.scheduler.faults import ClientFaults, FaultConfig
from jaxfl.scheduler.simulation import DispatchRecord, Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from tests.conftest import RecordingBackend


class ListIdle:
    """FedASMU's idle clients before IdleClients: a list, sorted and scanned at every draw."""

    def __init__(self, num_clients, busy=()):
        busy = set(busy)
        self.clients = [c for c in range(num_clients) if c not in busy]
        self.touched = 0  # list entries a draw or a removal reads

    def __len__(self):
        return len(self.clients)

    def add(self, client):
        self.clients.append(client)

    def remove(self, client):
        self.touched += len(self.clients)
        self.clients.remove(client)

    def sample(self, rng, count):
        self.touched += len(self.clients)
        chosen = rng.choice(sorted(self.clients), size=count, replace=False)
        return sorted(int(c) for c in chosen)


class CountingTree(list):
    """A Fenwick tree that counts the entries read and written."""

    touched = 0

    def __getitem__(self, index):
        self.touched += 1
        return super().__getitem__(index)

    def __setitem__(self, index, value):
        self.touched += 1
        super().__setitem__(index, value)


class CountingIdleClients(IdleClients):
    def __init__(self, num_clients, busy=()):
        super().__init__(num_clients, busy)
        self._tree = CountingTree(self._tree)


def simulate(policy, num_clients, max_updates, crash_prob=0.0, seed=3):
    rows, backend = [], RecordingBackend()
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.1), num_clients, seed=seed)
    faults = ClientFaults(FaultConfig(crash_prob=crash_prob, delay_prob=0.1, delay_factor=4.0), num_clients,
                          seed=seed) if crash_prob else None
    sim = Simulation(policy, speeds, [1.0 / num_clients] * num_clients, backend, max_updates=max_updates,
                     log=rows.append, faults=faults)
    sim.run()
    return sim, rows, [(a.version, a.contributions) for a in backend.aggregations]


def resumed_from_old_layout(policy, num_clients, stop_at, max_updates, to_old_layout):
    """The log of a run pickled at ``stop_at`` updates with its policy put back in the layout of
    checkpoints written before this change (``to_old_layout``), then unpickled and run on."""
    rows, backend = [], RecordingBackend()
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.1), num_clients, seed=3)
    sim = Simulation(policy, speeds, [1.0 / num_clients] * num_clients, backend, max_updates=stop_at,
                     log=rows.append)
    sim.run()
    to_old_layout(sim.policy)
    sim = pickle.loads(pickle.dumps(sim))
    sim.max_updates = max_updates
    sim.attach(backend, rows.append)
    sim.run()
    return rows


# ---------------------------------------------------------------------------------------- IdleClients

@pytest.mark.parametrize("num_clients, count", [(7, 3), (300, 5), (20_000, 1), (20_000, 1_000)])
def test_idle_clients_draw_what_a_sorted_list_draws(num_clients, count):
    # 20,000 and 1,000: numpy's choice shuffles a whole range (not Floyd's sampling) when it draws
    # over 1/50 of more than 10,000: both paths must see the same population size
    rng, reference_rng, order = (np.random.default_rng(s) for s in (5, 5, 6))
    idle, reference = IdleClients(num_clients), ListIdle(num_clients)
    busy: list[int] = []
    for _ in range(40):
        take = min(count, len(reference))
        if take:
            chosen = idle.sample(rng, take)
            assert chosen == reference.sample(reference_rng, take)
            for client in chosen:
                idle.remove(client)
                reference.remove(client)
            busy += chosen
        for client in order.permutation(busy)[:max(1, len(busy) // 3)].tolist():
            idle.add(client)
            reference.add(client)
            busy.remove(client)
        assert len(idle) == len(reference) and idle.in_order() == sorted(reference.clients)
    assert rng.random() == reference_rng.random()  # the same number of draws


def test_idle_clients_refuse_a_double_add_or_remove_and_an_out_of_range_rank():
    idle = IdleClients(4, busy=[2])
    with pytest.raises(ValueError, match="client 1 is already idle"):
        idle.add(1)
    with pytest.raises(ValueError, match="client 2 is not idle"):
        idle.remove(2)
    with pytest.raises(IndexError):
        idle.nth(3)
    assert [idle.nth(k) for k in range(3)] == [0, 1, 3] and 2 not in idle


def test_a_draw_among_a_million_clients_touches_a_few_dozen_entries():
    num_clients = 10**6
    idle = CountingIdleClients(num_clients, busy=range(0, num_clients, 3))
    chosen = idle.sample(np.random.default_rng(0), 10)
    for client in chosen:
        idle.remove(client)
    idle.add(chosen[0])
    depth = num_clients.bit_length()  # 20
    assert idle._tree.touched <= 10 * depth + 11 * 2 * depth  # 10 ranks read, 11 counts read and written
    assert len(idle) == num_clients - len(range(0, num_clients, 3)) - 9


def test_idle_clients_pickle_their_columns_one_entry_per_client():
    idle = IdleClients(10**5, busy=[0, 99_999])
    restored = pickle.loads(pickle.dumps(idle))
    assert len(restored) == 10**5 - 2 and restored.nth(0) == 1 and restored.nth(len(restored) - 1) == 99_998
    # one entry per client: checkpoints store such columns outside state.pkl, only changed entries
    assert len(restored._tree) == len(restored._idle) == 10**5


# ---------------------------------------------------------------------------------------- FedASMU

def fedasmu_policy(**options):
    settings = dict(local_steps=10, client_lr=0.1, slot="middle", trigger_period=0.5, trigger_batch=3,
                    max_concurrency=25, staleness_bound=6)
    settings.update(options)
    return FedASMU(**settings)


@pytest.mark.parametrize("options, faults", [({}, {}), ({"trigger_batch": 40, "max_concurrency": 150}, {}),
                                             ({"round_timeout": 8.0}, {"crash_prob": 0.1})])
def test_fedasmu_runs_as_with_the_sorted_list(monkeypatch, options, faults):
    new_sim, new_rows, new_aggregations = simulate(fedasmu_policy(**options), 200, 120, **faults)
    with monkeypatch.context() as patch:
        patch.setattr(fedasmu, "IdleClients", ListIdle)
        old_sim, old_rows, old_aggregations = simulate(fedasmu_policy(**options), 200, 120, **faults)
    assert new_rows == old_rows and new_aggregations == old_aggregations
    assert new_sim.policy.stats == old_sim.policy.stats and new_sim.policy.stats["triggered"] > 100
    if faults:
        assert any(row["detail"] == "arrived after round deadline" for row in new_rows)
    assert new_sim.policy.idle.in_order() == sorted(old_sim.policy.idle.clients)


def test_fedasmu_touches_a_logarithmic_share_of_the_clients_per_trigger(monkeypatch):
    num_clients = 50_000
    monkeypatch.setattr(fedasmu, "IdleClients", CountingIdleClients)
    sim, _, _ = simulate(fedasmu_policy(max_concurrency=None), num_clients, 60)
    policy = sim.policy
    # per dispatch a rank (log n reads), its removal and at most one return (2 log n each)
    assert policy.idle._tree.touched <= 5 * policy.stats["triggered"] * num_clients.bit_length()
    monkeypatch.setattr(fedasmu, "IdleClients", ListIdle)
    old, _, _ = simulate(fedasmu_policy(max_concurrency=None), num_clients, 60)
    assert old.policy.idle.touched > 100 * policy.idle._tree.touched  # the list scanned ~n per trigger


def test_fedasmu_resumes_a_checkpoint_that_kept_its_idle_clients_in_a_list():
    def old_layout(policy):
        policy.idle = policy.idle.in_order()[::-1]  # in no particular order, as the list was

    _, uninterrupted, _ = simulate(fedasmu_policy(), 200, 80)
    assert resumed_from_old_layout(fedasmu_policy(), 200, 30, 80, old_layout) == uninterrupted


def test_fedasmu_refuses_concurrency_together_with_its_own_cap():
    run = RunConfig(algorithm="fedasmu", clients=1000, concurrency=1000,
                    algorithm_options={"slot": "first", "max_concurrency": 50})
    with pytest.raises(ConfigError) as refused:
        validate(run)
    message = str(refused.value)
    assert "\n" not in message and "fedasmu.max_concurrency=50" in message and "concurrency=1000" in message
    assert "give only one of them" in message
    # either alone is read
    assert validate(RunConfig(algorithm="fedasmu", clients=1000, concurrency=40,
                              algorithm_options={"slot": "first"})).concurrency == 40
    alone = validate(RunConfig(algorithm="fedasmu", clients=1000, algorithm_options={"slot": "first",
                                                                                    "max_concurrency": 50}))
    assert alone.algorithm_options.max_concurrency == 50


# ---------------------------------------------------------------------------------------- PORT

class NoIdleBooks:
    def add(self, client):
        pass


class ReferencePORT(PORT):
    """PORT's selection before IdleClients: the idle clients listed from every client at each draw."""

    touched = 0

    def _idle_clients(self, sim):
        return NoIdleBooks()

    def _select(self, sim, count):
        busy = set(self.in_flight.values()) | set(self.lost.values())
        idle = [c for c in range(sim.num_clients) if c not in busy]
        self.touched += sim.num_clients
        if count >= len(idle):
            chosen = idle
        else:
            chosen = sorted(int(c) for c in self._rng.choice(idle, size=count, replace=False))
        for client in chosen:
            record = sim.dispatch(client, port.local_steps_of(self.local_steps, client))
            self.in_flight[record.id] = client
            if self.round_timeout is not None:
                sim.set_timer(sim.now + self.round_timeout, {"deadline": record.id})


@pytest.mark.parametrize("options, settings, faults", [
    (PAPER, {"clients_in_flight": 30, "min_clients": 5, "staleness_bound": 4.0}, {}),
    (PLATO, {"clients_in_flight": 30, "min_clients": 5, "staleness_bound": 3.0}, {}),
    (PAPER, {"clients_in_flight": 60, "min_clients": 8, "round_timeout": 8.0}, {"crash_prob": 0.1}),
    (PAPER, {}, {}),  # every client in flight: each selection takes all the idle ones, without a draw
])
def test_port_selects_as_with_the_idle_list(options, settings, faults):
    def policy(cls):
        return cls(local_steps=10, options=options, seed=1, pull_steps=3, **settings)

    new_sim, new_rows, new_aggregations = simulate(policy(PORT), 120, 60, **faults)
    old_sim, old_rows, old_aggregations = simulate(policy(ReferencePORT), 120, 60, **faults)
    assert new_rows == old_rows and new_aggregations == old_aggregations
    assert new_sim.version == 60 and new_sim.policy.waits == old_sim.policy.waits
    if faults:
        assert any(row["detail"] == "arrived after round deadline" for row in new_rows)
    busy = set(new_sim.policy.in_flight.values()) | set(new_sim.policy.lost.values())
    assert new_sim.policy.idle.in_order() == [c for c in range(120) if c not in busy]


def test_port_touches_a_logarithmic_share_of_the_clients_per_aggregation(monkeypatch):
    num_clients = 50_000
    monkeypatch.setattr(port, "IdleClients", CountingIdleClients)

    def policy(cls):
        return cls(local_steps=10, clients_in_flight=100, min_clients=10, seed=1)

    sim, _, _ = simulate(policy(PORT), num_clients, 40)
    dispatches = len(sim.records)
    assert sim.policy.idle._tree.touched <= 5 * dispatches * num_clients.bit_length()
    old, _, _ = simulate(policy(ReferencePORT), num_clients, 40)
    # K = 10 replacements per aggregation: ~10 · 5 log n entries against the n clients listed before
    assert old.policy.touched > 20 * sim.policy.idle._tree.touched


def test_port_resumes_a_checkpoint_from_before_its_idle_clients():
    def policy():
        return PORT(local_steps=10, clients_in_flight=30, min_clients=5, seed=1)

    _, uninterrupted, _ = simulate(policy(), 120, 50)
    assert resumed_from_old_layout(policy(), 120, 20, 50, lambda p: p.__dict__.pop("idle")) == uninterrupted


# ---------------------------------------------------------------------------------------- FedAT

class ReferenceFedAT(FedAT):
    """FedAT's arrival before the dispatch-id sets: membership by scanning the tier's records."""

    def on_arrival(self, sim, record):
        self._speed[record.client] = (sim.now - record.start_time) / max(record.steps, 1)
        self._busy.discard(record.client)
        tier = -1 if self.tiers is None else self._tier_of.get(record.client)
        if tier is None or record not in self._round.get(tier, ()):  # its round closed at the deadline
            sim.drop(record, "arrived after round deadline")
            if self.tiers is None:  # profiling still open or closed empty: profile whoever is idle
                if not self._round.get(-1):
                    self._start_round(sim, -1, range(sim.num_clients))
                return
            if record.client not in self._tier_of:
                self._place_late_client(record.client)
            tier = self._tier_of[record.client]
            if not self._round.get(tier):
                self._start_round(sim, tier, self.tiers[tier])
            return
        self._arrived[tier] += 1
        if self._arrived[tier] < len(self._round[tier]):
            return  # synchronous inside the tier: wait for its slowest member
        if tier in self._timers:
            sim.cancel(self._timers.pop(tier))
        self._finish_round(sim, tier, self._round[tier])


@pytest.mark.parametrize("settings, faults", [({}, {}), ({"profiling": "oracle"}, {}),
                                              ({"round_timeout": 4.0}, {"crash_prob": 0.05})])
def test_fedat_runs_as_with_the_record_lists(settings, faults):
    new_sim, new_rows, new_aggregations = simulate(FedAT(10, **settings), 150, 40, **faults)
    old_sim, old_rows, old_aggregations = simulate(ReferenceFedAT(10, **settings), 150, 40, **faults)
    assert new_rows == old_rows and new_aggregations == old_aggregations and new_sim.version == 40
    assert new_sim.policy.tiers == old_sim.policy.tiers and len(new_sim.policy.tiers) > 1
    if faults:
        assert any(row["detail"] == "arrived after round deadline" for row in new_rows)


def test_fedat_arrivals_compare_no_records(monkeypatch):
    comparisons = 0
    equal = DispatchRecord.__eq__

    def counted(self, other):
        nonlocal comparisons
        comparisons += 1
        return equal(self, other)

    monkeypatch.setattr(DispatchRecord, "__eq__", counted)
    simulate(FedAT(10), 300, 10)
    assert comparisons == 0
    simulate(ReferenceFedAT(10), 300, 10)
    assert comparisons > 300 * 300 // 4  # the list scan: ~tier size comparisons per arrival


def test_fedat_resumes_a_checkpoint_from_before_the_dispatch_id_sets():
    _, uninterrupted, _ = simulate(FedAT(10, round_timeout=30.0), 150, 30)
    rows = resumed_from_old_layout(FedAT(10, round_timeout=30.0), 150, 10, 30,
                                   lambda p: p.__dict__.pop("_round_dispatch_ids"))
    assert rows == uninterrupted


# ---------------------------------------------------------------------------------------- FedAvg, CC-FedAvg
from jaxfl.algorithms import ccfedavg as ccfedavg_module  # noqa: E402
from jaxfl.algorithms import fedavg as fedavg_module  # noqa: E402
from jaxfl.algorithms.ccfedavg import CCFedAvg  # noqa: E402
from jaxfl.algorithms.fedavg import FedAvg  # noqa: E402


class _NoIdleClients:
    def add(self, client):
        pass


class ReferenceFedAvg(FedAvg):
    """FedAvg's round start before IdleClients: every client scanned, the idle ones drawn from a list."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._busy = set()

    def _idle_clients(self, sim):  # the reference keeps no IdleClients
        return _NoIdleClients()

    def _start_round(self, sim):
        from jaxfl.scheduler.simulation import local_steps_of

        idle = [c for c in range(sim.num_clients) if c not in self._busy]
        if not idle:
            return
        cohort = self.clients_per_round or sim.num_clients
        selected = idle if cohort >= len(idle) else np.sort(self._rng.choice(idle, size=cohort, replace=False))
        records = [sim.dispatch(int(client), local_steps_of(self.local_steps, int(client))) for client in selected]
        self._round = {r.id: r for r in records}
        self._busy.update(r.client for r in records)
        self._arrived = []
        self._rounds += 1
        if self.round_timeout is not None:
            self._timer = sim.set_timer(sim.now + self.round_timeout, self._rounds)

    def on_arrival(self, sim, record):
        self._busy.discard(record.client)
        super().on_arrival(sim, record)


def _fedavg(reference=False, **settings):
    return (ReferenceFedAvg if reference else FedAvg)(10, seed=1, **settings)


def _ccfedavg(clients, **settings):
    return CCFedAvg(10, ccfedavg_module.level_budgets(clients, 4), seed=1, **settings)


@pytest.mark.parametrize("settings", [dict(clients_per_round=7), dict(clients_per_round=7, round_timeout=3.0),
                                      dict(round_timeout=3.0)])
@pytest.mark.parametrize("faults", [{}, dict(crash_prob=0.05)])
def test_fedavg_selects_as_with_the_idle_list(settings, faults):
    """Stragglers of a closed round (round_timeout) and crashed clients stay busy: the draws among
    the rest are those of rng.choice over the sorted idle list."""
    new_sim, new_rows, new_aggregations = simulate(_fedavg(**settings), 60, 25, **faults)
    old_sim, old_rows, old_aggregations = simulate(_fedavg(reference=True, **settings), 60, 25, **faults)
    assert new_rows == old_rows and new_aggregations == old_aggregations
    # a crashed client stalls a round without a deadline (FedAvg waits for it), in both alike
    assert new_sim.version == 25 or (faults and "round_timeout" not in settings)
    if "round_timeout" in settings:
        assert any(row["detail"] == "arrived after round deadline" for row in new_rows)


@pytest.mark.parametrize("policy, module", [(lambda: _fedavg(clients_per_round=5), fedavg_module),
                                            (lambda: _ccfedavg(100_000, clients_per_round=5), ccfedavg_module)])
def test_a_round_of_a_few_clients_touches_a_logarithmic_share_of_a_large_federation(monkeypatch, policy, module):
    """A round of 5 of 10^5 clients scanned all 10^5 to list the idle ones (110 ms a round at 10^6)."""
    monkeypatch.setattr(module, "IdleClients", CountingIdleClients)
    sim, _, _ = simulate(policy(), 100_000, 20)
    assert sim.version == 20
    assert sim.policy._idle._tree.touched < 20 * 5 * 4 * 17  # per round: 5 draws and 5 removals and adds, log2 10^5 each


def test_ccfedavg_selects_as_with_the_idle_list():
    def old_start_round(self, sim):  # CC-FedAvg's idle list before IdleClients
        busy = set() if self._idle is None else {c for c in range(sim.num_clients) if c not in self._idle}
        idle = [c for c in range(sim.num_clients) if c not in busy]
        chosen = np.sort(self._selection.choice(idle, size=min(7, len(idle)), replace=False)) if len(idle) > 7 else idle
        draws.append([int(c) for c in chosen])

    draws, new_draws = [], []
    policy = _ccfedavg(60, clients_per_round=7, round_timeout=3.0)
    original = CCFedAvg._start_round

    def recorded(self, sim):
        state = np.random.default_rng()
        state.bit_generator.state = self._selection.bit_generator.state
        reference = CCFedAvg.__new__(CCFedAvg)
        reference.__dict__.update(self.__dict__, _selection=state)
        old_start_round(reference, sim)
        original(self, sim)
        new_draws.append(list(self.selected))

    import unittest.mock

    with unittest.mock.patch.object(CCFedAvg, "_start_round", recorded):
        sim, rows, _ = simulate(policy, 60, 25)
    assert sim.version == 25 and draws == new_draws and len(draws) >= 25
    assert any(row["detail"] == "arrived after round deadline" for row in rows)


@pytest.mark.parametrize("make", [lambda: _fedavg(clients_per_round=7, round_timeout=3.0),
                                  lambda: _ccfedavg(60, clients_per_round=7, round_timeout=3.0)])
def test_fedavg_and_ccfedavg_resume_a_checkpoint_from_before_their_idle_clients(make):
    _, uninterrupted, _ = simulate(make(), 60, 30)

    def old_layout(policy):  # the busy clients as a set, no IdleClients nor budgets array
        idle = policy.__dict__.pop("_idle")
        policy._busy = {client for client in range(idle.num_clients) if client not in idle}
        policy.__dict__.pop("_budget_array", None)

    assert resumed_from_old_layout(make(), 60, 10, 30, old_layout) == uninterrupted
