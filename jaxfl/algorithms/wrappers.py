"""Options that compose with many algorithms, as device hooks (the way optax transforms chain).

- :class:`StepNormalization` — FedNova (Wang et al. 2020): each update counts per local step (per
  unit of ‖a_i‖₁ for momentum/proximal SGD clients). It
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


class ClientSGD(NamedTuple):
    """The clients' SGD as FedNova's normaliser needs it: momentum ρ, base learning rate η (times each
    dispatch's ``lr_scale``) and the pull α = prox_mu + weight decay."""

    momentum: float = 0.0
    learning_rate: float = 0.0
    pull: float = 0.0

    @classmethod
    def of_run(cls, run) -> "ClientSGD | None":
        """The run's client SGD, or None for clients that train with another optimiser (Adam, AdamW, an
        optax object), whose updates are normalised by their step counts τ_i."""
        if getattr(run, "client_optimizer", "sgd") != "sgd":
            return None
        return cls(float(getattr(run, "client_momentum", 0.0)), float(getattr(run, "client_lr", 0.0)),
                   float(getattr(run, "prox_mu", 0.0)) + float(getattr(run, "client_weight_decay", 0.0)))


class StepNormalization(DeviceHook):
    """FedNova: c_i ← c_i · τ_eff / ‖a_i‖₁ (:func:`jaxfl.kernels.fednova.fednova_coefficients`) on
    device, ‖a_i‖₁ from :func:`jaxfl.kernels.fednova.fednova_normalizer` for ``sgd`` clients (τ_i for
    plain SGD) and τ_i for any other optimiser (FedCompass+N and CC-FedAvg's baseline, as their
    authors ran them with Adam)."""

    name = "fednova"

    def __init__(self, always: bool = False, sgd: ClientSGD | None = None, by_steps: bool = False):
        """``by_steps``: divide by τ_i whatever the clients' optimiser (FedCompass+N: Δ_i / Q_i), which
        :func:`with_client_sgd` leaves as it is."""
        self.always = always
        self.sgd = None if by_steps else sgd
        self.by_steps = by_steps

    def effective_steps(self, records) -> np.ndarray:
        """‖a_i‖₁ of each record's local update (τ_i unless the clients' SGD sets otherwise)."""
        from jaxfl.kernels.fednova import fednova_normalizer

        steps = np.array([r.steps for r in records], np.int64)
        if self.sgd is None:
            return steps.astype(np.float64)
        rates = self.sgd.learning_rate * np.array([r.lr_scale for r in records], np.float64)
        return fednova_normalizer(steps, self.sgd.momentum, rates, self.sgd.pull)

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
        steps = pad(self.effective_steps(records))
        if isinstance(payload, NormalizeSteps):
            position = dict(zip(payload.dispatch_ids, payload.step_weights))
            weights = pad([position[r.id] for r in records])
        else:
            weights = c
        normalized = ctx.jit("fednova", fednova_coefficients)(c, steps, weights)
        return jax.device_get(normalized)[:count].tolist()


def with_step_normalization(hooks: Sequence[DeviceHook], sgd: ClientSGD | None = None) -> tuple[DeviceHook, ...]:
    """``hooks`` with FedNova applied to every delta aggregation (one FedNova hook, placed last)."""
    others = tuple(hook for hook in hooks if not isinstance(hook, StepNormalization))
    return others + (StepNormalization(always=True, sgd=sgd),)


def with_client_sgd(hooks: Sequence[DeviceHook], sgd: ClientSGD | None) -> tuple[DeviceHook, ...]:
    """``hooks`` with every FedNova hook normalising by the clients' SGD (momentum, decayed rates, pull),
    except those that divide by the step counts alone (``by_steps``).

    >>> [hook.sgd.momentum for hook in with_client_sgd((StepNormalization(),), ClientSGD(0.9, 0.1))]
    [0.9]
    >>> [hook.sgd for hook in with_client_sgd((StepNormalization(by_steps=True),), ClientSGD(0.9, 0.1))]
    [None]
    """
    return tuple(StepNormalization(hook.always, sgd) if isinstance(hook, StepNormalization) and not hook.by_steps
                 else hook for hook in hooks)
