"""Options that compose with many algorithms, as device hooks (the way optax transforms chain).

- :class:`StepNormalization` — FedNova (Wang et al. 2020): each update counts per local step. It
  applies to every ``delta`` aggregation when the run sets ``fednova=True`` (an option of any
  algorithm whose updates are pseudo-gradients), and to any aggregation whose payload asks for it
  (``payload.normalize_steps``: CC-FedAvg's FedNova baseline, FedCompass+N with ``step_weights``).
- FedProx's proximal term and the FedOpt server optimisers compose in the client kernel and the
  server optimiser (``prox_mu``, ``server_optimizer``), not here.

>>> hooks = with_step_normalization(())
>>> [hook.name for hook in hooks], hooks[0].always
(['fednova'], True)
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from jaxfl.algorithms.base import DeviceHook, check_per_dispatch


class NormalizeSteps(NamedTuple):
    """Payload asking for FedNova normalisation with τ_eff weighted by ``step_weights`` (per dispatch id)."""

    dispatch_ids: tuple[int, ...]
    step_weights: tuple[float, ...]
    normalize_steps: bool = True

    def check(self, sim, contributions) -> None:
        check_per_dispatch(self, contributions, "step_weights")


class StepNormalization(DeviceHook):
    """FedNova: c_i ← c_i · τ_eff / τ_i (:func:`jaxfl.kernels.fednova.fednova_coefficients`) on device."""

    name = "fednova"

    def __init__(self, always: bool = False):
        self.always = always

    def weigh(self, ctx, aggregation, records):
        payload = aggregation.payload
        requested = bool(getattr(payload, "normalize_steps", False))
        if not (requested or (self.always and aggregation.mode == "delta")):
            return None
        import jax
        import jax.numpy as jnp

        from jaxfl.execution import bucket_size
        from jaxfl.kernels.fednova import fednova_coefficients

        coefficients = dict(aggregation.contributions)
        count = len(records)
        padded = bucket_size(count)
        pad = lambda values: jnp.asarray(np.concatenate([np.asarray(values, np.float32),
                                                         np.zeros(padded - count, np.float32)]))
        c = pad([coefficients[r.id] for r in records])
        steps = pad([r.steps for r in records])
        if isinstance(payload, NormalizeSteps):
            position = dict(zip(payload.dispatch_ids, payload.step_weights))
            weights = pad([position[r.id] for r in records])
        else:
            weights = c
        normalized = ctx.jit("fednova", fednova_coefficients)(c, steps, weights)
        return jax.device_get(normalized)[:count].tolist()


def with_step_normalization(hooks: Sequence[DeviceHook]) -> tuple[DeviceHook, ...]:
    """``hooks`` with FedNova applied to every delta aggregation (one FedNova hook, placed last)."""
    others = tuple(hook for hook in hooks if not isinstance(hook, StepNormalization))
    return others + (StepNormalization(always=True),)
