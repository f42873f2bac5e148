"""A new asynchronous algorithm in one file outside jaxfl: an age- and norm-aware FedBuff.

FedBuff (Nguyen et al. 2022) aggregates every K buffered updates, each weighted by its staleness
("age") discount st(s), and steps by their mean. This variant also looks at the updates themselves:
an update much longer than the others in its buffer (a client that drifted, or a bad one) is shrunk
to the buffer's median length, the robust-aggregation idea of norm clipping::

    on arrival of Δ_i trained from version τ_i:
        buffer ← buffer ∪ {(i, st(τ − τ_i) / K)} ; reply to client i with the current model
        once K updates are buffered:
            m ← clip_factor · median_j ‖Δ_j‖                       # on device: needs the updates
            c_i ← st(τ − τ_i) / K · min(1, m / ‖Δ_i‖)
            w ← w − η_g · Σ_i c_i Δ_i                              # η_g: the server learning rate

Without clipping (a clip factor no update exceeds) it is jaxfl's ``fedbuff`` at its default rule
``paper``, the baseline it runs against: what differs between the two is the clipping alone.
The ages need no parameters, so the policy (plain Python) computes them; the norms do, so a
device hook computes them with a pure-JAX kernel written for ONE update and vmapped over the buffer.
That is the whole contract: options, policy, hook, ``register``.

Run it (from the repository root):

    python examples/age_norm_fedbuff.py            # against FedBuff on the embedded MNIST; writes a plot
    python examples/age_norm_fedbuff.py --quick    # seconds: what CI runs
    jaxfl run --algorithm examples/age_norm_fedbuff.py:AgeNormFedBuff,fedbuff --agenorm.clip-factor 1.5

and check it like the built-in algorithms: ``jaxfl.testing.check_algorithm(AgeNormFedBuff)``.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
from typing import NamedTuple

import numpy as np

from jaxfl.algorithms import Algorithm, DeviceHook, Options, register, staleness_function
from jaxfl.scheduler.simulation import DispatchRecord, Policy, Simulation


class ClipToMedian(NamedTuple):
    """Payload: shrink the buffer's updates longer than ``clip_factor`` × their median norm."""

    clip_factor: float


class AgeNormPolicy(Policy):
    """FedBuff's buffer with age weights st(s)/K; the device hook adds the norm factor."""

    name = "age_norm_fedbuff"

    def __init__(self, local_steps: int, buffer_size: int, staleness, clip_factor: float):
        self.local_steps, self.buffer_size, self.staleness = local_steps, buffer_size, staleness
        self.clip_factor = clip_factor
        self.buffer: list[tuple[int, float]] = []

    def start(self, sim: Simulation) -> None:
        for client in range(sim.num_clients):
            sim.dispatch(client, self.local_steps)

    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        age_weight = float(self.staleness(sim.staleness(record))) / self.buffer_size
        self.buffer.append((record.id, age_weight))
        sim.reply(record.client)
        if len(self.buffer) >= self.buffer_size:
            finite = {r.id for r in sim.screen([sim.records[d] for d, _ in self.buffer])}
            if len(finite) < len(self.buffer):  # a NaN/Inf update dropped (--on-nonfinite skip): wait for more
                self.buffer = [(d, w) for d, w in self.buffer if d in finite]
                return
            sim.aggregate(self.buffer, payload=ClipToMedian(self.clip_factor))
            self.buffer = []


def update_norm(delta):
    """‖Δ‖ over the whole flattened model, for ONE update (pure JAX; the hook vmaps it)."""
    import jax
    import jax.numpy as jnp

    return jnp.sqrt(sum(jnp.sum(jnp.square(leaf.astype(jnp.float32))) for leaf in jax.tree.leaves(delta)))


def norm_factors(norms: np.ndarray, clip_factor: float) -> np.ndarray:
    """min(1, clip_factor · median(norms) / norm_i); a zero update keeps factor 1.

    >>> norm_factors(np.array([1.0, 2.0, 6.0]), 1.0).tolist()
    [1.0, 1.0, 0.3333333333333333]
    """
    limit = clip_factor * float(np.median(norms))
    return np.where(norms > limit, limit / np.maximum(norms, 1e-30), 1.0)


class NormAwareWeights(DeviceHook):
    """Multiplies each buffered update's coefficient by its norm factor (norms computed on device)."""

    name = "age_norm"

    def weigh(self, ctx, aggregation, records):
        if not isinstance(aggregation.payload, ClipToMedian):
            return None
        import jax

        from jaxfl.execution import bucket_size

        count = len(records)
        padded = bucket_size(count)  # power-of-two buckets: one compilation per bucket
        deltas = ctx.trainable(ctx.stack([ctx.delta(record) for record in records], padded))
        norms = np.asarray(ctx.jit("update_norms", jax.vmap(update_norm))(deltas))[:count].astype(np.float64)
        factors = norm_factors(norms, aggregation.payload.clip_factor)
        for record, norm, factor in zip(records, norms, factors):
            ctx.set_client_metrics(record.id, {"update_norm": float(norm), "norm_factor": float(factor)})
        coefficients = dict(aggregation.contributions)
        return [coefficients[record.id] * factor for record, factor in zip(records, factors)]


@dataclasses.dataclass(frozen=True)
class AgeNormOptions(Options):
    """The variant's own options (``--agenorm.clip-factor``, ``[agenorm]`` in TOML)."""

    namespace = "agenorm"

    clip_factor: float = 1.0  # updates longer than this × the buffer's median norm are shrunk to it

    def validate(self, run) -> None:
        from jaxfl.config import fail

        if not (self.clip_factor > 0 and math.isfinite(self.clip_factor)):
            fail("agenorm.clip_factor", self.clip_factor, "a finite number > 0")


@register
class AgeNormFedBuff(Algorithm):
    """FedBuff whose buffered updates are weighted by age and (on device) their norm."""

    name = "age_norm_fedbuff"
    kind = "asynchronous"
    Options = AgeNormOptions
    reads = frozenset({"buffer_size", "staleness", "staleness_alpha", "staleness_a"})  # what policy() takes of the run
    summary = "FedBuff with updates longer than the buffer's median norm shrunk to it (example)"

    def policy(self) -> AgeNormPolicy:
        return AgeNormPolicy(self.run.local_steps, self.run.buffer_size, staleness_function(self.run),
                             self.options.clip_factor)

    def hooks(self):
        return (NormAwareWeights(),)


def main(argv=None) -> list:
    """Run the variant and FedBuff with one seed (same speeds and split) and plot accuracy over virtual time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a seconds-long run (what CI runs)")
    parser.add_argument("--output-dir", default="runs/age_norm_example")
    args = parser.parse_args(argv)
    from jaxfl import RunConfig, run_experiment
    from jaxfl.plot import plot_accuracy

    size = dict(clients=6, local_steps=4, batch_size=16, model="mlp", max_updates=6) if args.quick else \
        dict(clients=20, partition="dirichlet", dirichlet_alpha=0.3, local_steps=20, max_updates=120)
    results = []
    for algorithm in ("age_norm_fedbuff", "fedbuff"):
        config = RunConfig(algorithm=algorithm, heterogeneity="exp", stop_at_target=False, progress=False,
                           output_dir=args.output_dir, run_name=algorithm, checkpoint_every=None, **size)
        result = run_experiment(config)
        results.append(result)
        print(f"{algorithm:18s} final accuracy {result.summary['final_accuracy']:.4f} after "
              f"{result.summary['global_updates']} updates, {result.summary['virtual_time']:.1f} virtual s")
    plot = plot_accuracy([r.run_dir for r in results], os.path.join(args.output_dir, "comparison.png"))
    print(f"accuracy over virtual time: {plot}")
    return results


if __name__ == "__main__":
    main()
