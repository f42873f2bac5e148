"""FedCompass: the worked examples of spec §2.7 and properties over random speeds.

Times are in seconds; the paper's 10, 5, 4 and 2.5 steps/min are 6, 12, 15 and 24 s per step.
Clients 0–4 here are the paper's clients 1–5 (client 5's speed is not given; 2.5 steps/min fits
every statement of the examples).
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxfl.algorithms import FedAsync, FedCompass
from jaxfl.algorithms.fedcompass import CompassOptions
from jaxfl.scheduler.simulation import Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, ScriptedSpeeds, SpeedConfig
from jaxfl.scheduler.staleness import polynomial
from tests.conftest import RecordingBackend

PAPER_SPEEDS = [6.0, 12.0, 15.0, 24.0, 24.0]
SEED_WITHOUT_JOIN = 0  # 4 clients, exp speeds, Q = 20: no JOINGROUP succeeds in 40 updates


def run_compass(time_per_step, max_time, options=CompassOptions(), q_min=20, q_max=100, latest=1.2):
    policy = FedCompass(q_min, q_max, polynomial, latest_time_factor=latest, options=options)
    speeds = ScriptedSpeeds(time_per_step, num_clients=5)
    backend = RecordingBackend()
    rows = []
    sim = Simulation(policy, speeds, [0.2] * 5, backend, max_time=max_time, log=rows.append)
    sim.run()
    return sim, policy, backend, rows


def dispatches(sim, time):
    """{client: steps} of the dispatches made at ``time``."""
    return {r.client: r.steps for r in sim.records if math.isclose(r.start_time, time)}


def test_figure_1_groups_q_values_and_times():
    sim, policy, backend, _ = run_compass(lambda c, r: PAPER_SPEEDS[c], max_time=1400)
    assert dispatches(sim, 0.0) == {c: 20 for c in range(5)}  # warm-up with Q_min
    assert dispatches(sim, 120.0) == {0: 100}  # 02:00: no group → CREATEGROUP, Q = Q_max
    assert dispatches(sim, 240.0) == {1: 40}  # joins group 1 (T_a = 12:00)
    assert dispatches(sim, 300.0) == {2: 28}
    # 08:00: client 4 cannot join (q = 10 < 20); CREATEGROUP lines up with group 1's T_a:
    # T_exp = 12:00 + 0.1 min/step · 100 = 22:00, q = floor(14 min · 2.5) = 35; client 5 joins it.
    assert dispatches(sim, 480.0) == {3: 35, 4: 35}
    # the first four responses are single updates, then group 1 aggregates at 12:00
    assert [a.time for a in backend.aggregations[:6]] == [120.0, 240.0, 300.0, 480.0, 480.0, 720.0]
    assert [len(a.contributions) for a in backend.aggregations[:6]] == [1, 1, 1, 1, 1, 3]
    assert not any(a.server_optimizer for a in backend.aggregations[:5])  # single updates skip +M
    # fastest first, clients 1–3 join group 2 (T_a = 22:00)
    assert dispatches(sim, 720.0) == {0: 100, 1: 50, 2: 40}
    # 22:00: all five arrive together and from then on stay in one group
    assert backend.aggregations[6].time == 1320.0 and len(backend.aggregations[6].contributions) == 5
    assert dispatches(sim, 1320.0) == {0: 100, 1: 50, 2: 40, 3: 25, 4: 25}
    assert len({policy.clients[c].group for c in range(5)}) == 1


@pytest.mark.parametrize("step_time", [0.17, 0.235, 0.3, 0.7, 1.1])
def test_identical_clients_joining_at_a_groups_creation_get_q_max_steps(step_time):
    # S_i is measured as (arrival − start) / steps and T_a − now is a difference of rounded sums: at
    # 0.17 s a step floor((T_a − now) / S_i) was 49.99999999999999 → 49, so every joiner trained Q_max − 1
    # steps and then idled until the group's creator arrived
    sim, policy, backend, _ = run_compass(lambda c, r: step_time, max_time=40 * 100 * step_time, q_max=50)
    group_rounds = [r.steps for r in sim.records if r.start_time > 0]
    assert len(group_rounds) >= 20 and set(group_rounds) == {50}
    # every aggregation after the warm-up's first arrivals takes the whole federation at once
    assert [len(a.contributions) for a in backend.aggregations[5:]] == [5] * len(backend.aggregations[5:])


def test_a_joiner_k_whole_steps_after_its_groups_creator_gets_the_rest_of_the_round_at_any_clock():
    # the rounding of (T_a − now) / S_i is of the clock's size: a slack relative to the quotient still gave
    # one step fewer to 4 % of such joiners once the clock reached 10^4 s (49.99999999991621 for 50)
    import random
    import types

    rng = random.Random(1)
    for _ in range(3000):
        step = 10 ** rng.uniform(-2, 0.5)
        q, q_creator, q_joiner = rng.randint(20, 100), rng.randint(20, 100), rng.randint(20, 100)
        start = rng.uniform(0, 10 ** rng.uniform(2, 5))
        arrival = start + q_creator * step
        t_a = arrival + q * ((arrival - start) / q_creator)  # the creator's group, from its measured speed
        k = rng.randint(0, q - 20)
        joins_at = arrival + k * step
        policy = FedCompass(20, 100, polynomial)
        policy.clients = [types.SimpleNamespace(speed=(joins_at - (joins_at - q_joiner * step)) / q_joiner)]
        policy._by_expected = [(t_a, 0)]
        assert policy._join_choice(0, joins_at) == (0, q - k), (step, start, k)


def test_reference_code_create_rule_uses_t_max():
    # The code lines up with group 1's T_max = 02:00 + 1.2·10 min = 14:00: T_exp = 24:00, q = 40.
    sim, policy, _, _ = run_compass(lambda c, r: PAPER_SPEEDS[c], max_time=500,
                                    options=CompassOptions(create_rule="t_max"))
    assert dispatches(sim, 480.0)[3] == 40
    group = policy.groups[policy.clients[3].group]
    assert group.expected == pytest.approx(480 + 40 * 24.0)  # 24:00
    assert policy.groups[policy.clients[0].group].latest == pytest.approx(840.0)  # T_max = 14:00


def with_client_3_round_2(step_time):
    """The paper's client 3 (ours: 2) changes speed for its second round (05:00 → ...)."""
    return lambda c, r: step_time if (c == 2 and r == 1) else PAPER_SPEEDS[c]


def test_figure_20_speed_up_waits_for_the_group():
    sim, _, backend, rows = run_compass(with_client_3_round_2(12.0), max_time=800)
    arrival = [r for r in rows if r["event"] == "arrival" and r["client"] == 2][1]
    assert arrival["time"] == pytest.approx(636.0)  # 10:36, then idles until the group arrives
    assert backend.aggregations[5].time == 720.0 and len(backend.aggregations[5].contributions) == 3


def test_figure_21_mild_slow_down_is_waited_for():
    sim, _, backend, _ = run_compass(with_client_3_round_2(18.0), max_time=900)  # 3.33 steps/min
    group_aggregation = backend.aggregations[5]
    assert group_aggregation.time == pytest.approx(804.0)  # 13:24 < T_max = 14:00
    assert len(group_aggregation.contributions) == 3


def test_figure_22_strong_slow_down_misses_t_max_and_starts_a_new_group():
    # The paper's client 3 arrives at 15:12 (its 28 steps at 2.5 steps/min would end at 16:12;
    # the spec notes the inconsistency): use the speed that lands at 15:12.
    slow = (912.0 - 300.0) / 28
    sim, policy, backend, _ = run_compass(with_client_3_round_2(slow), max_time=1330)
    timer_aggregation = backend.aggregations[5]
    assert timer_aggregation.time == pytest.approx(840.0)  # T_max = 14:00 fires
    assert {sim.records[d].client for d, _ in timer_aggregation.contributions} == {0, 1}
    assert dispatches(sim, 840.0) == {0: 80, 1: 40}  # moved to group 2 (T_a = 22:00)
    late = dispatches(sim, 912.0)
    assert list(late) == [2]  # late: general buffer, then floor((22:00 − 15:12)/S) = 18 < 20 → new group 3
    new_group = policy.clients[2].group
    q = math.floor((1920.0 - 912.0) / slow)  # lines up with T_exp = 22:00 + 0.1 min/step · 100
    assert late[2] == q and policy.groups[new_group].expected == pytest.approx(912 + q * slow)
    at_22 = backend.aggregations[6]
    assert at_22.time == pytest.approx(1320.0)
    # group 2's five... four members plus client 3's late update from the general buffer
    assert {sim.records[d].client for d, _ in at_22.contributions} == {0, 1, 2, 3, 4}
    assert {policy.clients[c].group for c in (0, 1, 3, 4)} == {new_group}  # all join group 3


# --------------------------------------------------------------------------- properties
speed_draws = st.tuples(st.integers(2, 10), st.sampled_from(["exp", "normal", "homo"]), st.integers(0, 10_000),
                        st.sampled_from([(5, 25), (10, 50), (20, 100), (4, 40)]),
                        st.sampled_from([1.2, 1.5, 2.0]), st.sampled_from([0.0, 0.05]))


def run_random(m, model, seed, q_range, latest, jitter, max_updates=60, options=CompassOptions()):
    policy = FedCompass(*q_range, polynomial, latest_time_factor=latest, options=options)
    speeds = ClientSpeeds(SpeedConfig(model=model, mean=0.15, jitter=jitter), m, seed=seed)
    backend = RecordingBackend()
    sim = Simulation(policy, speeds, np.full(m, 1 / m), backend, max_updates=max_updates)
    for handler in ("on_arrival", "on_timer"):
        original = getattr(policy, handler)

        def checked(*args, _original=original):
            _original(*args)
            policy.check_invariants()

        setattr(policy, handler, checked)
    sim.run()
    return sim, policy, backend


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(speed_draws, st.booleans())
def test_every_update_is_aggregated_once_or_still_pending(draw, reference_code):
    from jaxfl.algorithms.fedcompass import REFERENCE_CODE

    options = REFERENCE_CODE if reference_code else CompassOptions()
    sim, policy, backend = run_random(*draw, options=options)  # invariants checked after every event
    counted = [d for a in backend.aggregations for d, _ in a.contributions]
    assert len(counted) == len(set(counted))
    buffered = {r.id for g in policy.groups.values() for r in g.buffer} | {r.id for r in policy.general_buffer}
    for record in sim.records:
        if record.id in counted:
            assert record.status == "aggregated"
        else:
            assert record.status == "in_flight" or record.id in buffered
    counts = sim.accounting()
    assert counts["arrived_unaggregated"] == len(buffered)


def steady_group_count(m, model, seed, q_range):
    """(median number of active groups after each group aggregation in the run's second half,
    ⌈log_Q μ⌉) for fixed speeds (no jitter)."""
    policy = FedCompass(*q_range, polynomial, latest_time_factor=1.2)
    speeds = ClientSpeeds(SpeedConfig(model=model, mean=0.15, jitter=0.0), m, seed=seed)
    counts = []
    aggregate = policy._group_aggregate

    def counted(sim, group_id):
        aggregate(sim, group_id)
        counts.append(len(policy.active_groups()))

    policy._group_aggregate = counted
    Simulation(policy, speeds, np.full(m, 1 / m), RecordingBackend(), max_updates=40 * m).run()
    times = speeds.base_time_per_step
    ratio = math.log(times.max() / times.min()) / math.log(q_range[1] / q_range[0])
    tail = sorted(counts[len(counts) // 2:])
    return tail[len(tail) // 2], max(1, math.ceil(ratio - 1e-12))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 12), st.sampled_from(["exp", "normal"]), st.integers(0, 100_000),
       st.sampled_from([(5, 25), (10, 50), (20, 100), (10, 40)]))
def test_groups_at_equilibrium_never_exceed_the_bound_by_more_than_one(m, model, seed, q_range):
    """Spec §2.4 / App. B: at equilibrium the clients sit in at most ⌈log_Q μ⌉ groups.

    The paper's Alg. 2, implemented exactly (the worked examples above), can hold ONE group more:
    JOINGROUP caps q at Q_max, so a client too fast for the next group creates its own group a
    little before it (seen: T_a 289.6 s beside 290.2 s) — one arrival wave, two group objects.
    """
    groups, bound = steady_group_count(m, model, seed, q_range)
    assert groups <= bound + 1


def test_groups_at_equilibrium_are_within_the_bound_in_almost_every_draw():
    rng = np.random.default_rng(2024)
    draws = [(int(rng.integers(2, 13)), ["exp", "normal"][int(rng.integers(2))], int(rng.integers(100_000)),
              [(5, 25), (10, 50), (20, 100), (10, 40)][int(rng.integers(4))]) for _ in range(200)]
    within = sum(groups <= bound for groups, bound in (steady_group_count(*draw) for draw in draws))
    assert within >= 0.97 * len(draws)  # measured: 992 of 1000 draws (seed 1) are within


def compare_with_fedasync(m, model, seed, q, updates):
    """(FedCompass's aggregations, FedAsync's, time of FedCompass's first successful JOINGROUP)."""
    def aggregations(policy):
        speeds = ClientSpeeds(SpeedConfig(model=model, mean=0.15, jitter=0.05), m, seed=seed)
        backend = RecordingBackend()
        sim = Simulation(policy, speeds, np.full(m, 1 / m), backend, max_updates=updates)
        sim.run()
        return [(a.time, [(sim.records[d].client, sim.records[d].version, c) for d, c in a.contributions])
                for a in backend.aggregations], sim

    compass_policy = FedCompass(q, q, polynomial, latest_time_factor=10.0)
    joins = []
    join_choice = compass_policy._join_choice

    def recorded_join(client, now):
        choice = join_choice(client, now)
        if choice is not None:
            joins.append(now)
        return choice

    compass_policy._join_choice = recorded_join
    compass, _ = aggregations(compass_policy)
    fedasync, _ = aggregations(FedAsync(q, polynomial, rule="fedcompass"))
    return compass, fedasync, (joins[0] if joins else math.inf)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.sampled_from(["exp", "normal"]), st.integers(0, 10_000), st.integers(5, 50))
def test_equal_q_min_and_q_max_gives_fedasync(m, model, seed, q):
    """Q_min = Q_max: clients end up alone in their groups and FedCompass becomes FedAsync (§3).

    The paper's claim is exact until a client JOINs another client's group, which JOINGROUP still
    allows when floor((T_a − now)/S_i) is exactly Q (a finite-probability event); from then on the
    two are applied together. So: identical until the first join, and throughout if there is none.
    λ is large so the 5% jitter never makes anyone late.
    """
    compass, fedasync, first_join = compare_with_fedasync(m, model, seed, q, updates=5 * m)
    before = lambda trace: [a for a in trace if a[0] <= first_join]
    assert before(compass) == before(fedasync)
    if math.isinf(first_join):
        assert compass == fedasync


def test_equal_q_min_and_q_max_gives_fedasync_for_a_whole_run():
    """A seeded case without any join: the whole run is FedAsync's, update for update."""
    compass, fedasync, first_join = compare_with_fedasync(4, "exp", SEED_WITHOUT_JOIN, 20, updates=40)
    assert math.isinf(first_join) and len(compass) == 40
    assert all(len(contributions) == 1 for _, contributions in compass)
    assert compass == fedasync


def test_reference_code_warm_up_trains_q_max_and_divides_the_first_time_by_it():
    from jaxfl.algorithms.fedcompass import PAPER, REFERENCE_CODE
    from jaxfl.config import ConfigError, RunConfig, validate

    assert PAPER.warmup == "q_min" and REFERENCE_CODE.warmup == "q_max"
    sim, policy, _, _ = run_compass(lambda c, r: PAPER_SPEEDS[c], max_time=1.0,
                                    options=CompassOptions(warmup="q_max"))
    assert dispatches(sim, 0.0) == {c: 100 for c in range(5)}  # every first dispatch plans Q_max
    sim, policy, _, _ = run_compass(lambda c, r: PAPER_SPEEDS[c], max_time=600.0,
                                    options=CompassOptions(warmup="q_max"))
    # client 0 (6 s per step) arrives at 600 s after 100 steps: its first estimate is 600 / Q_max = 6
    assert sim.records[0].steps == 100 and sim.records[0].arrival_time == 600.0
    assert policy.clients[0].speed == 6.0
    paper_sim, _, _, _ = run_compass(lambda c, r: PAPER_SPEEDS[c], max_time=1.0)
    assert dispatches(paper_sim, 0.0) == {c: 20 for c in range(5)}  # the paper: Q_min

    def warmup(**options):
        return validate(RunConfig(algorithm="fedcompass", algorithm_options=options)).algorithm_options.warmup

    assert warmup() == "q_min" and warmup(preset="reference_code") == "q_max"
    assert warmup(preset="reference_code", warmup="q_min") == "q_min"
    with pytest.raises(ConfigError, match="compass.warmup='q_mid' is not allowed"):
        warmup(warmup="q_mid")


def test_reference_code_lr_decay_counts_steps_as_the_legacy_scheduler_does():
    """APPFL's SchedulerCompass (2023-12-28, src/appfl/algorithm/scheduler_compass.py): a client's
    counter starts at Q_min at its first arrival (the warm-up's Q_max steps are not counted) and
    _send_model adds the Q_i it is assigning before lr · 0.995^floor(counter / Q_max); the warm-up is
    sent at the base lr. Replayed here from each client's dispatches, with assignments below and
    above Q_max − Q_min (where counting finished rounds instead gives another exponent)."""
    import random
    from collections import defaultdict

    from jaxfl.algorithms.fedcompass import REFERENCE_CODE

    draw = random.Random(0)
    jitter = {}
    base = [6.0, 9.0, 15.0]

    def seconds_per_step(client, round_):
        return jitter.setdefault((client, round_), base[client] * draw.uniform(0.9, 1.1))

    policy = FedCompass(20, 100, polynomial, latest_time_factor=1.5, options=REFERENCE_CODE)
    sim = Simulation(policy, ScriptedSpeeds(seconds_per_step, num_clients=3), [1 / 3] * 3, RecordingBackend(),
                     max_time=20000.0, log=lambda record: None)
    sim.run()
    rounds = defaultdict(list)
    for record in sorted(sim.records, key=lambda record: (record.start_time, record.id)):
        rounds[record.client].append(record)
    steps_seen, exponents_seen = set(), set()
    for records in rounds.values():
        assert records[0].steps == 100 and records[0].lr_scale == 1.0  # the warm-up: Q_max at the base lr
        counter = 20
        for record in records[1:]:
            counter += record.steps
            assert record.lr_scale == 0.995 ** (counter // 100), (record.client, record.steps, counter)
            steps_seen.add(record.steps)
            exponents_seen.add(counter // 100)
    assert min(steps_seen) < 80 < max(steps_seen) and len(exponents_seen) >= 4


@pytest.mark.parametrize("preset, most", [("paper", 6), ("reference_code", 7)])
def test_the_engine_is_sized_for_the_most_steps_fedcompass_assigns(small_config, preset, most):
    """Q_max set apart from ``local_steps`` (and the legacy JOINGROUP's ⌊1.2·Q_max⌋): the engine's
    step chunks are sized for the most steps a dispatch can take, not for ``local_steps`` (calls of
    Q_max steps in chunks of ``local_steps`` took twice the dispatches), and no dispatch of the run
    goes past it. (``local_steps`` itself is unread beside ``compass.q_max``: left at its default.)"""
    from jaxfl.algorithms import build
    from jaxfl.config import FIELDS, validate
    from jaxfl.execution import default_steps_per_call
    from jaxfl.experiment import run_experiment
    from jaxfl.runlog import read_events
    from tests.conftest import replace

    config = replace(small_config, algorithm="fedcompass", clients=6, local_steps=FIELDS["local_steps"].default,
                     max_updates=8, heterogeneity="exp",
                     algorithm_options={"q_min": 1, "q_max": 6, "preset": preset}, run_name=preset)
    result = run_experiment(config)
    assert build(validate(config)).most_local_steps == most
    assert result.engine.plan.steps_per_call == default_steps_per_call(most) != \
        default_steps_per_call(config.local_steps)
    events = read_events(result.run_dir)
    steps = events["steps"][events["event"] == "dispatch"]
    assert 2 < steps.max() <= most
