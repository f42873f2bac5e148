"""The algorithms' server-side arithmetic runs as jitted programs compiled once per run (per bucket of
sizes), not as an eager op per parameter leaf per event (issue 17): FedAT's tier sums, PORT's stacked
updates, CC-FedAvg's bank rows and estimate errors, FedASMU's (γ, ν) table. Counted two ways over
short real runs: the programs' traces (the summary's ``compilations``) against the aggregations, and
every eager op that code in ``jaxfl/algorithms`` or ``jaxfl/kernels`` dispatches itself (what the
engine's own hook API does is the engine's; ``Engine.delta``, which PORT, CC-FedAvg and FedASMU
call per update, is a jitted row of its call's stack, counted as ``delta_row``)."""
import collections
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import core

import jaxfl
from jaxfl import run_experiment
from jaxfl.config import config_from_mapping
from jaxfl.engine import Engine
from jaxfl.kernels.fedat import tier_update
from jaxfl.kernels.tree import rounded, tree_add, tree_scale

PACKAGE = os.path.dirname(jaxfl.__file__) + os.sep
SERVER_CODE = tuple(os.path.join(PACKAGE, folder) + os.sep for folder in ("algorithms", "kernels"))
NOT_ARITHMETIC = {"jit", "pjit", "device_put", "stage"}  # a compiled program's call; host → device transfers


def server_code_site():
    """``file:line`` of the nearest jaxfl caller if it is in the algorithms or kernels, else None (an
    engine method they call, such as ``Engine.delta``, is the engine's)."""
    frame = sys._getframe(2)
    while frame is not None and not frame.f_code.co_filename.startswith(PACKAGE):
        frame = frame.f_back
    if frame is not None and frame.f_code.co_filename.startswith(SERVER_CODE):
        return f"{frame.f_code.co_filename[len(PACKAGE):]}:{frame.f_lineno}"
    return None


class EagerServerOps(collections.Counter):
    """(server code site, op) → times run eagerly: each ``jax.tree.map`` over concrete arrays (an
    eager op per leaf; ``jnp`` functions dispatch through jax's compiled fast path, which no Python
    hook sees, so the map that calls them is what is counted), each eager ``lax`` primitive and each
    ``Engine.stack`` (an eager stack per leaf), called from the algorithms or kernels. Counting
    starts when ``armed``: at a run's first aggregation, as what the hooks build once before it
    (their initial state) is not per event."""

    armed = False


@pytest.fixture
def eager_server_ops(monkeypatch):
    """An :class:`EagerServerOps`, armed now; a run re-arms it at its first aggregation."""
    counts = EagerServerOps()
    process_primitive, tree_map, on_aggregate = core.EvalTrace.process_primitive, jax.tree.map, Engine.on_aggregate
    stack = Engine.stack

    def counting_primitive(self, primitive, args, params, /):
        site = server_code_site() if counts.armed and primitive.name not in NOT_ARITHMETIC else None
        if site:
            counts[site, primitive.name] += 1
        return process_primitive(self, primitive, args, params)

    def counting_map(function, tree, *rest, **options):
        concrete = counts.armed and any(isinstance(leaf, jax.Array) and not isinstance(leaf, core.Tracer)
                                        for leaf in jax.tree.leaves(tree))
        site = server_code_site() if concrete else None
        if site:
            counts[site, "tree.map"] += 1
        return tree_map(function, tree, *rest, **options)

    def counting_stack(trees, padded):  # Engine.stack: an eager jnp.stack per leaf
        site = server_code_site() if counts.armed else None
        if site:
            counts[site, "Engine.stack"] += 1
        return stack(trees, padded)

    def arming_on_aggregate(self, aggregation, records):
        counts.armed = True
        return on_aggregate(self, aggregation, records)

    monkeypatch.setattr(core.EvalTrace, "process_primitive", counting_primitive)
    monkeypatch.setattr(jax.tree, "map", counting_map)
    monkeypatch.setattr(jax.tree_util, "tree_map", counting_map)
    monkeypatch.setattr(Engine, "on_aggregate", arming_on_aggregate)
    monkeypatch.setattr(Engine, "stack", staticmethod(counting_stack))
    counts.armed = True
    return counts


def aggregations(result) -> int:
    with open(os.path.join(result.run_dir, "events.csv")) as handle:
        return sum(line.split(",")[1] == "aggregate" for line in handle)


BUCKETS = 4  # padded sizes 1, 2, 4 and 8 serve any count of 6 clients' updates: a program per bucket at most
RUNS = {  # name → (config changes, the jitted programs of its server code → the most compilations allowed)
    "fedat": (dict(algorithm="fedat", clients=6, max_updates=6), {"fedat_tier_update": 1}),
    "port_current": (dict(algorithm="port", clients=6, port_min_clients=2, port_cosine="current", max_updates=5),
                     {"port_weights": 1, "delta_row": BUCKETS}),
    "ccfedavg_cc_c": (dict(algorithm="ccfedavg", clients=6, cc_strategy="cc_c", cc_switch_round=2, max_updates=4,
                           cc_diagnostic=True),
                      {"bank_rows": BUCKETS, "bank_delta_sum": BUCKETS, "bank_model_sum": BUCKETS,
                       "estimation_error": BUCKETS, "delta_row": BUCKETS}),
    "fedasmu_mix": (dict(algorithm="fedasmu", clients=6, local_steps=6, max_updates=8, client_optimizer="sgd",
                         algorithm_options={"epochs": 3, "max_concurrency": 4, "trigger_period": 0.3,
                                            "trigger_batch": 2}),
                    {"fedasmu_server": 1, "device_mix": 1, "delta_row": BUCKETS}),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_server_arithmetic_is_jitted_once_and_never_eager(tmp_path, eager_server_ops, name):
    changes, programs = RUNS[name]
    eager_server_ops.armed = False  # from the run's first aggregation on
    result = run_experiment(config_from_mapping({
        "dataset": "mnist10k", "model": "mlp", "local_steps": 3, "batch_size": 16, "stop_at_target": False,
        "progress": False, "checkpoint_every": None, "output_dir": str(tmp_path), "run_name": name, **changes}))
    compilations, used = result.summary["compilations"], aggregations(result)
    assert used >= 4
    for program, most in programs.items():  # compiled once (per bucket of sizes), then reused by every event
        assert 1 <= compilations.get(program, 0) <= min(most, used - 1), (program, compilations, used)
    assert not eager_server_ops, f"{name}: eager ops dispatched by the server code: {dict(eager_server_ops)}"


def test_the_counter_sees_eager_server_ops(eager_server_ops):
    """The eager per-leaf arithmetic that the runs above no longer do is what the counter counts."""
    tree = {"w": jnp.ones(3), "b": jnp.ones(2)}
    tree_add(tree, tree_scale(tree, 0.5))
    sites = {site.split(":")[0] for site, op in eager_server_ops if op == "tree.map"}
    assert sites == {os.path.join("kernels", "tree.py")}, eager_server_ops
    before = sum(eager_server_ops.values())
    jax.jit(lambda t: tree_add(t, tree_scale(t, 0.5)))(tree)
    assert sum(eager_server_ops.values()) == before  # traced inside a jitted program: not eager


def test_tier_update_rounds_like_the_eager_ops():
    """FedAT's jitted tier sums equal the eager ops bit for bit: XLA would otherwise contract each
    a + b·c into a fused multiply-add (one rounding instead of two)."""
    rng = np.random.default_rng(0)
    draw = lambda: {"w": jnp.asarray(rng.standard_normal((64, 33)), jnp.float32),
                    "b": jnp.asarray(rng.standard_normal(33), jnp.bfloat16)}
    delta_sum, starts, models = draw(), (draw(), draw()), (draw(), draw(), draw())
    which, coefficients, weights = [1, 0, 1], [0.3, 0.45, 0.25], [0.2, 0.5, 0.3]
    eager_tier = tree_scale(delta_sum, -1.0)
    for start, c in zip(which, coefficients):
        eager_tier = tree_add(eager_tier, tree_scale(starts[start], c))
    eager = jax.tree.map(jnp.zeros_like, delta_sum)
    for model, weight in zip((models[0], eager_tier, models[2]), weights):
        eager = tree_add(eager, tree_scale(model, weight))
    tier, combined = jax.jit(tier_update)(delta_sum, starts, jnp.array(which + [0], jnp.int32),
                                          jnp.array(coefficients + [0.0], jnp.float32), jnp.int32(3), None, models,
                                          jnp.int32(1), jnp.array(weights, jnp.float32), jnp.uint32(0))
    for got, want in ((tier, eager_tier), (combined, eager)):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    contracted = jax.jit(lambda a, b, c: tree_add(a, tree_scale(b, c)))(models[0], models[1], 0.3)
    kept = jax.jit(lambda a, b, c, zero: tree_add(a, rounded(tree_scale(b, c), zero)))(models[0], models[1], 0.3,
                                                                                      jnp.uint32(0))
    eager_sum = tree_add(models[0], tree_scale(models[1], 0.3))
    if jax.default_backend() == "cpu":  # what rounded() is there for: XLA:CPU contracts a + b·c
        assert not np.array_equal(contracted["w"], eager_sum["w"])
    np.testing.assert_array_equal(kept["w"], eager_sum["w"])
