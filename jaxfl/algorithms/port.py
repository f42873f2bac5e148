"""PORT (Su & Li, "How Asynchronous can Federated Learning Be?", IEEE IWQoS 2022): semi-asynchronous buffered FL.

Paper: the design space (Section III), Eq. 1–4 and the server and client pseudocode; the PLATO code
(TL-System/plato) where it differs. Three knobs span the space between FedAsync and FedAvg: the minimum number of clients per aggregation
K (1 = fully asynchronous, all = synchronous), the staleness bound Ω (∞ = none) and the weighting.
Server loop (paper semantics; each PLATO-code difference is a switch, see :class:`PortOptions`)::

    start: P clients (default: all) train Q steps from w_0
    on ARRIVAL of client k's model w_k:
        A ← A ∪ {k}
        if |A| < K: return                                # Step 2: the K fastest push first
        if some in-flight client j would become too stale: return   # Step 3: wait for (pull) it;
            # paper: S_j + 1 ≥ Ω (so every aggregated S < Ω); its arrival, and every arrival
            # before it, joins A
        for k ∈ A (Step 4, Eq. 1–3; S_k = τ − τ_k):
            d_k = n_k / Σ_A n_j ;  s_k = α Ω/(S_k + Ω) ;  θ_k = β (cos(u_k, w_τ − w_{τ−1}) + 1)/2
            p_k = d_k (s_k + θ_k) / Σ_A d_j (s_j + θ_j)
        w_{τ+1} ← Σ_A p_k w_k ;  τ ← τ + 1 ;  A ← ∅        # Eq. 4, a model average ("mix" mode)
        replace: uniformly sample clients that are not in flight until P are in flight (Step 5)
        urgent pull (Step 1, push-pull): every in-flight client now too stale (the Step-3 test) is
            asked to stop after the block of ``pull_steps`` local steps it is training and upload
            that partial update at once; Step 3 then waits for it only until that upload

The cosine θ_k needs the updates, so the device hook :class:`CosineWeights` computes it on device
(:mod:`jaxfl.kernels.port`); this policy hands it a_k = d_k s_k, b_k = d_k β and whether cos is forced
to 1 (a :class:`PortWeights` payload), and puts the cos = 1 weights in the contributions (what a
numbers-free backend sees).
With Ω = ∞ the staleness discount is α for every client. Stale clients are never dropped.

Faults: with ``round_timeout`` a dispatch still out that long after it started is presumed lost
(the server cannot tell a crash from a straggler): PORT stops waiting for it, dispatches an idle
client in its place (so that crashed clients do not use up the P slots for good), and drops it if
it arrives later ("arrived after round deadline"; the client is idle again); while fewer than K
clients can still arrive, the buffer is aggregated as it is. A straggler presumed lost still trains,
so up to P plus the presumed-lost clients are out at once. Without a deadline (default) the loop is
exactly the paper's.

Urgent pull (§IV-B push-pull, Fig. 7; ``urgent_pull``, on in the paper preset): right after the
aggregation that makes an in-flight client too stale, the server asks it for its model
(:meth:`~jaxfl.scheduler.simulation.Simulation.recall`). It finishes the block of ``pull_steps``
local steps it is in (the paper's unit, an epoch of ⌈n_k/B⌉ steps, when the run counts local work in
``local_epochs``; otherwise one step, the unit a dispatch is counted in) and uploads: its arrival moves to the end of that block plus the
upload, its update has the steps it trained (``steps`` in the event log; the arrival's detail says
``pulled: 3 of 10 steps``), and it is weighted like any other update (its staleness, its data
share). A pull is a ``pull`` row in the event log. Without the pull (PLATO preset) Step 3 waits for
the whole local training: the paper's reproducible-mode experiments (Figs. 5–6) run so, and PLATO's
stored pull keeps a pulled client's full finish time (only its model changes), so it saves no time.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from jaxfl._user_warnings import warn_user
from jaxfl.algorithms.base import Algorithm, DeviceHook, Options, check_per_dispatch, epoch_steps, register
from jaxfl.scheduler.clock import ARRIVALS_FIRST
from jaxfl.scheduler.pool import IdleClients
from jaxfl.scheduler.simulation import DispatchRecord, Policy, Simulation, local_steps_of

REPLACEMENT_STREAM = 21  # SeedSequence([seed, REPLACEMENT_STREAM]) picks the clients that start training
COSINE_DEFINITIONS = ("own", "current")
PORT_WEIGHT_RANGE = (1e-30, 2e37)  # α + β (see PortConfig.validate)
BOUND_RULES = ("strict", "exceeds")
REPLACE_RULES = ("all", "step2")
PRESETS = ("paper", "plato")


@dataclasses.dataclass(frozen=True)
class PortOptions:
    """The places where PLATO's code differs from the paper; defaults = the paper."""

    cosine: str = "own"  # u_k = w_k − w_start,k (paper's "weight update") | "current": w_k − w_τ (§8.1)
    cosine_skip_staleness: int = -1  # cos forced to 1 when S_k ≤ this: never (paper) | 1 (code, §8.2)
    cosine_skip_rounds: int = 1  # cos forced to 1 in the first aggregations: 1 (no w_{τ−1}) | 2 (code)
    bound_rule: str = "strict"  # wait while S+1 ≥ Ω, so aggregated S < Ω (paper) | "exceeds": S > Ω (§8.4)
    replace: str = "all"  # keep P in flight (paper's intent) | "step2": replace only the K Step-2 clients (§8.6)
    urgent_pull: bool = True  # pull a too-stale client's partial update (paper, §IV-B) | False: wait for all of it

    def validate(self) -> None:
        for name, allowed in (("cosine", COSINE_DEFINITIONS), ("bound_rule", BOUND_RULES),
                              ("replace", REPLACE_RULES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"port_{name}={getattr(self, name)!r} is not allowed: one of {', '.join(allowed)}")


PAPER = PortOptions()
PLATO = PortOptions(cosine="current", cosine_skip_staleness=1, cosine_skip_rounds=2, bound_rule="exceeds",
                    replace="step2", urgent_pull=False)


class PortWeights(NamedTuple):
    """Payload of a PORT aggregation: Eq. (1)–(3)'s parts that need no parameters, per dispatch id."""

    dispatch_ids: tuple[int, ...]
    staleness_part: tuple[float, ...]  # a_k = d_k s_k
    interference_scale: tuple[float, ...]  # b_k = d_k β
    force_cosine_one: tuple[bool, ...]

    def check(self, sim, contributions) -> None:
        check_per_dispatch(self, contributions, "staleness_part", "interference_scale", "force_cosine_one")


def staleness_discount(staleness: int, alpha: float, bound: float) -> float:
    """s_k = α Ω / (S_k + Ω), Eq. (1); α when Ω = ∞.

    >>> staleness_discount(2, alpha=3.0, bound=10.0)
    2.5
    """
    if math.isinf(bound):
        return float(alpha)
    return float(alpha * bound / (staleness + bound))


class PORT(Policy):
    """PORT's server; see the module docstring for the loop and :class:`PortOptions` for the switches."""

    name = "port"
    needs_start_models = True  # Eq. 4 averages models ("mix" mode); the PLATO cosine needs w_start
    priorities = ARRIVALS_FIRST  # an update arriving exactly at its dispatch's deadline is on time

    def __init__(self, local_steps: int, min_clients: int | None = None, staleness_bound: float = 10.0,
                 alpha: float = 3.0, beta: float = 1.0, clients_in_flight: int | None = None,
                 options: PortOptions = PAPER, seed: int = 0, round_timeout: float | None = None,
                 pull_steps: int | tuple[int, ...] = 1):
        if min_clients is not None and min_clients < 1:
            raise ValueError(f"port_min_clients={min_clients} is not allowed: an integer >= 1")
        if not staleness_bound > 0:
            raise ValueError(f"port_staleness_bound={staleness_bound} is not allowed: a number > 0 (inf for none)")
        if not (alpha >= 0 and beta >= 0 and alpha + beta > 0 and math.isfinite(alpha + beta)):
            raise ValueError(f"port_alpha={alpha}, port_beta={beta} are not allowed: finite, >= 0, not both 0")
        options.validate()
        blocks = (pull_steps,) if isinstance(pull_steps, int) else tuple(pull_steps)
        if not blocks or not all(isinstance(block, (int, np.integer)) and block >= 1 for block in blocks):
            raise ValueError(f"port_pull_steps={pull_steps!r} is not allowed: an integer >= 1, or one per client")
        self.pull_steps = pull_steps  # one block for every client, or one per client (an epoch each)
        if round_timeout is not None and not round_timeout > 0:
            raise ValueError(f"round_timeout={round_timeout!r} is not allowed: virtual seconds > 0, or None")
        self.round_timeout = round_timeout
        self.local_steps = local_steps
        self.min_clients = min_clients
        self.staleness_bound = float(staleness_bound)
        self.alpha, self.beta = float(alpha), float(beta)
        self.clients_in_flight = clients_in_flight
        self.options = options
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, REPLACEMENT_STREAM]))
        self.in_flight: dict[int, int] = {}  # dispatch id → client, in dispatch order
        self.buffer: list[int] = []  # A: arrived dispatch ids, in arrival order
        self.lost: dict[int, int] = {}  # dispatch id → client: out past the deadline, no longer waited for
        self.waits = 0  # times Step 3 held an aggregation back for a stale client
        self.pulled: set[int] = set()  # dispatch ids asked for an urgent upload, not yet arrived
        self.pulls = 0  # urgent pulls that shortened a dispatch
        self.aggregated_staleness: list[int] = []
        self.idle: IdleClients | None = None  # neither in flight nor lost (those arrived in the buffer too)

    def __setstate__(self, state: dict) -> None:
        state.setdefault("idle", None)  # checkpoints from before IdleClients: rebuilt by _idle_clients
        self.__dict__.update(state)

    def _idle_clients(self, sim: Simulation) -> IdleClients:
        if self.idle is None:
            self.idle = IdleClients(sim.num_clients, [*self.in_flight.values(), *self.lost.values()])
        return self.idle

    # ------------------------------------------------------------------ server loop
    def start(self, sim: Simulation) -> None:
        self.P = min(self.clients_in_flight or sim.num_clients, sim.num_clients)
        # K defaults to the paper's 5 of 20 clients in flight (MNIST), i.e. a quarter of P.
        self.K = self.min_clients or max(1, math.ceil(self.P * 5 / 20))
        if self.K > self.P:
            raise ValueError(f"port_min_clients={self.K} is not allowed: at most the clients in flight ({self.P})")
        self._select(sim, self.P)

    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        idle = self._idle_clients(sim)  # before the client leaves in_flight or lost, which it is built from
        if record.id in self.lost:  # presumed lost at its deadline: too late now
            idle.add(self.lost.pop(record.id))
            sim.drop(record, "arrived after round deadline")
            if not self.in_flight and not self.buffer:  # no idle client could replace it at its deadline
                self._select(sim, self.P)
            return
        idle.add(self.in_flight.pop(record.id))
        self.pulled.discard(record.id)
        self.buffer.append(record.id)
        self._try_aggregate(sim)

    def on_timer(self, sim: Simulation, payload) -> None:
        dispatch_id = payload["deadline"]
        # one later than its deadline by float rounding alone is on time (Simulation.due_by_rounding)
        if dispatch_id in self.in_flight and sim.due_by_rounding([sim.records[dispatch_id]]) is None:
            self.lost[dispatch_id] = self.in_flight.pop(dispatch_id)
            self.pulled.discard(dispatch_id)
            self._select(sim, 1)  # its slot to an idle client: a crashed one would hold it for good
            self._try_aggregate(sim)

    def _try_aggregate(self, sim: Simulation) -> None:
        # Step 2 needs the K fastest (fewer only when fewer can still arrive, i.e. after faults)
        if not self.buffer or len(self.buffer) < min(self.K, len(self.buffer) + len(self.in_flight)):
            return
        if any(self._too_stale(sim, sim.records[d]) for d in self.in_flight):
            self.waits += 1
            return  # Step 3: wait for the stale clients (and take everything that arrives first)
        kept = {r.id for r in sim.screen([sim.records[d] for d in self.buffer])}
        if len(kept) < len(self.buffer):  # NaN/Inf updates dropped: their slots go to new clients
            dropped = len(self.buffer) - len(kept)
            self.buffer = [d for d in self.buffer if d in kept]
            self._select(sim, dropped)
            self._try_aggregate(sim)
            return
        self._aggregate(sim)

    def _too_stale(self, sim: Simulation, record: DispatchRecord) -> bool:
        staleness = sim.staleness(record)
        if self.options.bound_rule == "strict":
            return staleness + 1 >= self.staleness_bound
        return staleness > self.staleness_bound

    def weighting_args(self, sim: Simulation, records: list[DispatchRecord]) -> list[tuple[float, float, float]]:
        """(a_k = d_k s_k, b_k = d_k β, force cos = 1) per aggregated update, Eq. (1)–(3)."""
        weights = np.array([sim.client_weights[r.client] for r in records], dtype=np.float64)
        shares = weights / weights.sum()
        rows = []
        for record, share in zip(records, shares):
            staleness = sim.staleness(record)
            force = (sim.version < self.options.cosine_skip_rounds
                     or staleness <= self.options.cosine_skip_staleness)
            rows.append((float(share * staleness_discount(staleness, self.alpha, self.staleness_bound)),
                         float(share * self.beta), 1.0 if force else 0.0))
        return rows

    def _aggregate(self, sim: Simulation) -> None:
        records = [sim.records[d] for d in self.buffer]
        rows = self.weighting_args(sim, records)
        raw = np.array([a + b for a, b, _ in rows])  # cos = 1; the engine puts in the real cosines
        self.aggregated_staleness.extend(sim.staleness(r) for r in records)
        step2 = [r.client for r in records[:self.K]]
        payload = PortWeights(tuple(r.id for r in records), tuple(a for a, _, _ in rows), tuple(b for _, b, _ in rows),
                              tuple(force > 0 for _, _, force in rows))
        sim.aggregate([(r.id, float(c)) for r, c in zip(records, raw / raw.sum())], mode="mix", payload=payload,
                      server_optimizer=False)
        self.buffer = []
        if self.options.replace == "all":
            count = self.P - len(self.in_flight)  # a presumed-lost dispatch was replaced at its deadline
        else:  # PLATO: only the K Step-2 clients are replaced; an empty pool is refilled to P
            count = len(step2) if self.in_flight else self.P
        self._select(sim, count)
        if self.options.urgent_pull:
            self._pull_stale(sim)

    def _pull_stale(self, sim: Simulation) -> None:
        """Step 1 (push-pull): ask every in-flight client that is now too stale for its partial update."""
        for dispatch_id in list(self.in_flight):
            record = sim.records[dispatch_id]
            # a client sent this very version (this aggregation's replacements) was made stale by no
            # aggregation and has trained nothing to pull: under Ω ≤ 1 every round was cut to one block
            if dispatch_id in self.pulled or record.version == sim.version or not self._too_stale(sim, record):
                continue
            self.pulled.add(dispatch_id)
            before = record.steps
            uploaded = sim.recall(record, local_steps_of(self.pull_steps, record.client))
            if uploaded is not None and uploaded < before:
                self.pulls += 1

    def _select(self, sim: Simulation, count: int) -> None:
        idle = self._idle_clients(sim)
        if count >= len(idle):
            chosen = idle.in_order()
        else:
            chosen = idle.sample(self._rng, count)
        for client in chosen:
            record = sim.dispatch(client, local_steps_of(self.local_steps, client))
            idle.remove(client)
            self.in_flight[record.id] = client
            if self.round_timeout is not None:
                sim.set_timer(sim.now + self.round_timeout, {"deadline": record.id})

    def summary(self) -> dict:
        """Run statistics for the run summary."""
        staleness = self.aggregated_staleness
        return {"min_clients": getattr(self, "K", self.min_clients), "clients_in_flight": getattr(self, "P", None),
                "staleness_waits": self.waits, "urgent_pulls": getattr(self, "pulls", 0), "max_aggregated_staleness": max(staleness) if staleness else None,
                "mean_aggregated_staleness": round(float(np.mean(staleness)), 4) if staleness else None}


class CosineWeights(DeviceHook):
    """Replaces a PORT aggregation's coefficients by Eq. (3) with the cosines computed on device.

    The cosine of each update with the last global step w_τ − w_{τ−1} is vmapped over the
    aggregation's updates (padded to a power of two, so one compilation serves each size bucket).
    """

    name = "port"

    def __init__(self, cosine_definition: str = "own"):
        self.cosine_definition = cosine_definition

    def weigh(self, ctx, aggregation, records):
        payload = aggregation.payload
        if not isinstance(payload, PortWeights):
            return None
        import jax
        import jax.numpy as jnp

        from jaxfl.execution import bucket_size
        from jaxfl.kernels import port as kernels

        def coefficients(deltas, starts, current, previous, staleness_part, interference_scale, force, valid,
                         definition):
            # the updates (and start models) arrive as lists and are stacked here, in the program, not
            # by an eager stack per parameter leaf
            stack = lambda trees: jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)
            deltas = stack(deltas)
            starts = stack(starts) if definition == "current" else deltas
            last_step = jax.tree.map(jnp.subtract, current, previous)
            return kernels.port_coefficients(deltas, starts, current, last_step, staleness_part,
                                             interference_scale, force, valid, definition)

        position = {dispatch_id: index for index, dispatch_id in enumerate(payload.dispatch_ids)}
        rows = [position[record.id] for record in records]
        count = len(records)
        padded = bucket_size(count)

        def column(values, dtype, fill):
            values = np.asarray(values, dtype)[rows]
            return jnp.asarray(np.concatenate([values, np.full(padded - count, fill, dtype)]))

        def padded_list(trees):  # padded with the first, as Engine.stack pads
            return tuple(trees) + (trees[0],) * (padded - count)

        deltas = padded_list([ctx.trainable(ctx.delta(r)) for r in records])
        starts = padded_list([ctx.trainable(ctx.start_model(r)) for r in records]) \
            if self.cosine_definition == "current" else ()
        weights, cosines = ctx.jit("port_weights", coefficients, static_argnames="definition")(
            deltas, starts, ctx.trainable(ctx.params), ctx.trainable(ctx.previous_params),
            column(payload.staleness_part, np.float32, 0.0), column(payload.interference_scale, np.float32, 0.0),
            column(np.asarray(payload.force_cosine_one, np.float32) > 0, bool, True),
            jnp.asarray(np.arange(padded) < count), definition=self.cosine_definition)
        weights, cosines = jax.device_get((weights, cosines))
        for record, value in zip(records, cosines[:count]):
            ctx.set_client_metrics(record.id, {"port_cosine": float(value)})
        return weights[:count].tolist()


@dataclasses.dataclass(frozen=True)
class PortConfig(Options):
    """PORT's options (Su & Li, IEEE IWQoS 2022, Eq. 1–4; PLATO's code as switches); the switches left None take the preset's value."""

    presets = {"paper": dataclasses.asdict(PAPER), "plato": dataclasses.asdict(PLATO)}
    namespace = "port"

    min_clients: int | None = None  # K, arrivals that trigger an aggregation; unset: ceil(P/4), the paper's K = 5 of 20 in flight (MNIST)
    staleness_bound: float = 10.0  # Ω, the paper's sweet spot; inf: no bound
    alpha: float = 3.0  # α, staleness weight (paper's tuned α:β = 3:1)
    beta: float = 1.0  # β, interference (cosine) weight; 0 switches the cosine term off
    clients_in_flight: int | None = None  # P, clients kept in flight; unset: every client [ours; PLATO: 20 of 100]
    preset: str = "paper"  # paper | plato: every PLATO-code behaviour below at once
    cosine: str | None = None  # own: u_k = w_k − w_start (paper) | current: w_k − w_τ (PLATO)
    cosine_skip_staleness: int | None = None  # cos forced to 1 when S ≤ this: -1, never (paper) | 1 (PLATO)
    cosine_skip_rounds: int | None = None  # cos forced to 1 in the first aggregations: 1 (paper) | 2 (PLATO)
    bound_rule: str | None = None  # strict: aggregated S < Ω (paper) | exceeds: wait while S > Ω (PLATO)
    replace: str | None = None  # all: keep P in flight (paper) | step2: replace only the K (PLATO)
    urgent_pull: bool | None = None  # ask a too-stale client for its partial update (paper) | wait for all of it (PLATO)
    pull_steps: int | None = None  # a pulled client uploads after the block of this many local steps it is in; unset: its epoch ceil(n/B) with local_epochs (the paper), else 1 step

    def switches(self) -> PortOptions:
        return self.pick(PortOptions)

    def validate(self, run) -> None:
        from jaxfl.config import fail

        for name, allowed in (("preset", PRESETS), ("cosine", COSINE_DEFINITIONS), ("bound_rule", BOUND_RULES),
                              ("replace", REPLACE_RULES)):
            if getattr(self, name) not in allowed:
                fail(f"port.{name}", getattr(self, name), f"one of {', '.join(allowed)}")
        for name in ("min_clients", "clients_in_flight"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= run.clients:
                fail(f"port.{name}", value, f"an integer in [1, {run.clients}] (the number of clients)")
        in_flight = self.clients_in_flight or run.clients
        if self.min_clients is not None and self.min_clients > in_flight:
            fail("port.min_clients", self.min_clients, f"at most the clients in flight ({in_flight}); K never arrive")
        if not self.staleness_bound > 0:
            fail("port.staleness_bound", self.staleness_bound, "a number of versions > 0 (inf for no bound)")
        for name in ("alpha", "beta"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                fail(f"port.{name}", getattr(self, name), "a finite weight >= 0")
        if self.alpha + self.beta == 0:
            fail("port.alpha", self.alpha, "a weight > 0 when port.beta is 0 (the weights would all vanish)")
        # Eq. (3) normalises in float32: the weights' sum, at most α + β, and its reciprocal must be normal numbers
        if not PORT_WEIGHT_RANGE[0] <= self.alpha + self.beta <= PORT_WEIGHT_RANGE[1]:
            fail("port.alpha" if self.alpha >= self.beta else "port.beta", max(self.alpha, self.beta),
                 f"a weight that makes α + β (here {self.alpha:g} + {self.beta:g}) from {PORT_WEIGHT_RANGE[0]:g} to "
                 f"{PORT_WEIGHT_RANGE[1]:g}: the weights are normalised in float32, where beyond that their sum or "
                 "its reciprocal leaves float32's normal numbers and every weight came out 0 (the model never "
                 "moved) or NaN; only α:β matters")
        if self.pull_steps is not None and self.pull_steps < 1:
            fail("port.pull_steps", self.pull_steps, "an integer >= 1 (local steps per block a pulled client finishes)")
        if self.pull_steps is not None and not self.urgent_pull:
            fail("port.pull_steps", self.pull_steps,
                 "only with port.urgent_pull=True (the block of local steps a pulled client finishes); this run's "
                 "urgent_pull is False (leave port.pull_steps unset, or set port.urgent_pull true)")
        if self.pull_steps is not None and getattr(run, "local_epochs", None) is None \
                and self.pull_steps >= run.local_steps and self.urgent_pull is not False \
                and not math.isinf(self.staleness_bound):
            # said, not refused: the run is valid, only the pull cannot act
            warn_user(f"port.pull_steps={self.pull_steps} is not below local_steps={run.local_steps}: a pulled client "
                      "is always in its round's last block, so it finishes the whole round and no pull cuts one "
                      "short (the run is as with port.urgent_pull false); a block of fewer steps lets a pull act")
        for name in ("cosine_skip_staleness", "cosine_skip_rounds"):
            if getattr(self, name) < -1:
                fail(f"port.{name}", getattr(self, name), "an integer >= -1")
        # settings that cannot act in this run: said, not refused (a preset's values stay valid)
        preset = self.presets[self.preset]
        if self.beta == 0:
            for name in ("cosine", "cosine_skip_staleness", "cosine_skip_rounds"):
                if getattr(self, name) != preset[name]:
                    warn_user(f"port.{name}={getattr(self, name)!r} is ignored: port.beta=0 switches the cosine "
                              "term off")
        if math.isinf(self.staleness_bound):
            # (bound_rule and urgent_pull changed nothing under inf, saying so as pull_steps does)
            ignored = [f"port.{name}={getattr(self, name)!r}" for name in ("pull_steps", "bound_rule", "urgent_pull")
                       if name == "pull_steps" and self.pull_steps is not None
                       or name != "pull_steps" and getattr(self, name) != preset[name]]
            if ignored:
                warn_user(f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored: with "
                          "port.staleness_bound=inf no client is ever too stale, so none is waited for or pulled")


@register
class Port(Algorithm):
    """PORT (Su & Li 2022): K arrivals per aggregation, a staleness bound, cosine-aware weights."""

    name = "port"
    kind = "semi-asynchronous"
    reads = frozenset({"round_timeout"})
    Options = PortConfig
    waits_for_clients = "clients (rounds, K arrivals, stale clients or concurrency slots)"
    per_client_steps = True
    delta_updates = False  # Eq. 4 averages models
    summary = "K arrivals, staleness bound Ω, staleness and cosine weights (Su & Li 2022)"

    @classmethod
    def unread_settings(cls, run, options=None) -> dict[str, tuple[str | None, str]]:
        """Eq. 4 is the new global model, Σ p_k w_k: no server optimiser (a server learning rate,
        momentum or Adam given to PORT was applied to the average, silently changing its rule).

        >>> sorted(Port.unread_settings(None))
        ['server_lr', 'server_momentum', 'server_optimizer']
        """
        server = (None, "algorithms that apply a server optimiser: port's Eq. 4 makes the weighted average of "
                        "the models the global model, without one")
        return {"server_optimizer": server, "server_lr": server, "server_momentum": server}

    def policy(self) -> PORT:
        o, run = self.options, self.run
        pull_steps = o.pull_steps
        if pull_steps is None:  # the paper's unit: the epoch the client is in, when local work is counted in epochs
            pull_steps = epoch_steps(1.0, self.client_samples, run.batch_size) \
                if getattr(run, "local_epochs", None) is not None else 1
        return PORT(self.local_steps, o.min_clients, o.staleness_bound, o.alpha, o.beta, o.clients_in_flight,
                    o.switches(), seed=run.seed, round_timeout=run.round_timeout, pull_steps=pull_steps)

    def hooks(self):
        return (CosineWeights(self.options.cosine),)
