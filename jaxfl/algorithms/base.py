"""The algorithm contract: what one file must hold to add an algorithm to jaxfl.

An algorithm is three things, the way an optax transformation is ``(init, update)`` and a fedjax
algorithm is ``(init, apply)``:

1. its **options**: a frozen dataclass (:class:`Options`) with the paper's defaults, named
   ``presets`` (e.g. ``paper`` / ``reference_code``) that fill the fields left ``None``, and
   ``validate(run)`` that raises :class:`~jaxfl.config.ConfigError` naming the bad value;
2. its **policy**: plain Python (:class:`~jaxfl.scheduler.simulation.Policy`) that decides on the
   virtual clock who is dispatched with which model version and how many steps, and when an
   aggregation happens with which coefficients — and, when the device must compute something, a
   typed ``payload`` (a NamedTuple) for it;
3. optional **device hooks** (:class:`DeviceHook`): host glue around pure-JAX kernels from
   :mod:`jaxfl.kernels` that the engine calls at fixed points of an aggregation or of a paused
   training call. Their state is one pytree per hook, created by ``init`` (so checkpoint shapes
   come from ``jax.eval_shape`` of it) and kept by the engine.

Registration makes the name known to the config, the CLI and the conformance suite
(:func:`jaxfl.testing.check_algorithm`)::

    from jaxfl.algorithms import Algorithm, register

    @register
    class MyAsync(Algorithm):
        name = "my_async"
        kind = "asynchronous"
        def policy(self):
            return MyAsyncPolicy(self.run.local_steps)

A class defined outside the package can also be named as ``module:Class`` on the command line
(``jaxfl run --algorithm my_module:MyAsync``); it is registered on first use. This module never
imports jax: hooks import it when the engine builds them.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import sys
from typing import Any, Callable, ClassVar, Mapping, Sequence

from jaxfl._user_warnings import warn_user
from jaxfl.scheduler.simulation import Aggregation, DispatchRecord, Policy, local_steps_of  # noqa: F401
from jaxfl.scheduler.simulation import PluginError, _misspelt_hook, _signature_mismatch
from jaxfl.scheduler.staleness import make_staleness

KINDS = ("synchronous", "asynchronous", "semi-asynchronous")


@dataclasses.dataclass(frozen=True)
class Options:
    """Base of an algorithm's own options. Subclasses are frozen dataclasses.

    ``presets`` maps a preset name to values for the fields left ``None``; the ``preset`` field,
    when a subclass declares one, picks it (else the first preset applies). ``namespace`` is the
    prefix of the options on the command line and in TOML (``--port.staleness-bound``, and the
    old flat flag ``--port-staleness-bound``).

    >>> Options().resolved() == Options()
    True
    """

    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    namespace: ClassVar[str | None] = None
    aliases: ClassVar[Mapping[str, str]] = {}  # other spellings of a field name (e.g. "lambda")

    @classmethod
    def field_name(cls, key: str) -> str:
        """The field a key names: dashes read as underscores, aliases resolved.

        >>> Options.field_name("q-min")
        'q_min'
        """
        name = key.replace("-", "_")
        return cls.aliases.get(name, name)

    def resolved(self) -> "Options":
        """The options with the preset's value in every field left ``None``."""
        if not self.presets:
            return self
        name = getattr(self, "preset", None) or next(iter(self.presets))
        if name not in self.presets:
            from jaxfl.config import fail

            fail(f"{self.namespace or 'options'}.preset", name, f"one of {', '.join(self.presets)}")
        values = {key: value for key, value in self.presets[name].items() if getattr(self, key) is None}
        return dataclasses.replace(self, **values)

    def validate(self, run) -> None:
        """Raise :class:`~jaxfl.config.ConfigError` for a bad value (types are checked before)."""

    def pick(self, cls: type):
        """A ``cls`` dataclass built from these options' fields of the same names (e.g. the switches
        a policy takes)."""
        return cls(**{field.name: getattr(self, field.name) for field in dataclasses.fields(cls)})


class DeviceHook:
    """Device-side part of an algorithm; every method is optional.

    ``ctx`` is the engine (its hook API: ``params``, ``previous_params``, ``num_clients``,
    ``trainable``, ``delta``, ``start_model``, ``stack``, ``combine``, ``results_sum``,
    ``mean_buffers``, ``jit``, ``state``, ``client_metrics``/``set_client_metrics``, ``trainer``,
    ``data``, ``views``, ``train_detached``, ``record_row``, ``client_rows``/``set_client_rows``;
    :mod:`jaxfl.engine`). ``ctx.params`` is the global model (``{"params": ..., "state": ...}`` for a
    model with non-trainable state, whose ``"state"`` no Δ carries: see :meth:`apply`),
    ``ctx.previous_params`` the one before the last update. A hook keeps its device state in ``ctx.state[self.name]``, created by
    :meth:`init`, and state with one row per client in tables declared by :meth:`init_per_client`,
    which the engine places on the device, in host RAM or in a memmap (:mod:`jaxfl.client_state`)
    and of which a hook reads and writes only the rows of the clients at hand. Methods run in this order for an aggregation: :meth:`weigh` (replace
    the coefficients), then either :meth:`apply` (the whole update, returning the new global
    model) or the engine's generic update Σ c_i Δ_i plus :meth:`extra_pseudo_gradient` through the
    server optimiser, followed by :meth:`after_update`. :meth:`on_pause` runs inside a training
    call for dispatches made with ``fetch_step``, once the simulation answered their fetch (e.g. to
    mix in a fresher global model; FedASMU).
    """

    name = "hook"
    # the methods the engine calls, whose overrides must take the same positional parameters
    METHODS = ("init", "init_per_client", "keeps_per_client_state", "tables_from_state", "weigh", "apply",
               "extra_pseudo_gradient", "after_update", "on_pause")

    def __init_subclass__(cls, **kwargs) -> None:
        """A method overridden with another signature than the base's is refused when the class is
        defined (TypeError naming it), not when the engine first calls it, after the first training."""
        super().__init_subclass__(**kwargs)
        problem = _signature_mismatch(cls, DeviceHook, DeviceHook.METHODS) or \
            _misspelt_hook(cls, DeviceHook, DeviceHook.METHODS)
        if problem is not None:
            raise TypeError(problem)

    # True when the state's shapes are those of ``init`` for the whole run (checkpoints restore to
    # ``jax.eval_shape`` of it); False for state that grows (e.g. a dict of tier models).
    fixed_state_shape = True

    def init(self, params, num_clients: int):
        """The hook's initial device state (a pytree; None for no state)."""
        return None

    def init_per_client(self, params) -> dict | None:
        """State the hook keeps for every client: table name → the initial row of every client (a
        pytree of arrays), or None. The engine holds a table of ``num_clients`` such rows wherever it
        fits (:mod:`jaxfl.client_state`); the hook reads rows with ``ctx.client_rows(self.name,
        table, clients)`` and writes them with ``ctx.set_client_rows(...)``, so state that grows with
        the federation never has to fit on the device.

        >>> DeviceHook().init_per_client({"w": None}) is None
        True
        """
        return None

    def keeps_per_client_state(self) -> bool:
        """Whether :meth:`init_per_client` declares tables (known without building them, so that a
        ``client_state`` placement given to a run without any is refused before any work)."""
        return type(self).init_per_client is not DeviceHook.init_per_client

    def tables_from_state(self, state) -> dict | None:
        """This hook's per-client tables (:meth:`init_per_client`'s names → each table, stacked over
        the clients) from its device state as a checkpoint of an older jaxfl holds it, one that kept
        them there; None if the hook never kept them so (resuming such a checkpoint is then refused).

        >>> DeviceHook().tables_from_state({"bank": None}) is None
        True
        """
        return None

    def weigh(self, ctx, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> Sequence[float] | None:
        """New coefficients, one per record (None: leave them)."""
        return None

    def apply(self, ctx, aggregation: Aggregation, records: Sequence[DispatchRecord]):
        """The new global model if this hook makes the whole update (None: the generic update).

        The hook then sets a stateful model's non-trainable ``"state"`` too (BatchNorm statistics),
        whose deltas in ``ctx.combine`` are zero: the generic update takes ``ctx.mean_buffers(records)``,
        the plain mean of the aggregated clients' (``{**new, "state": ctx.mean_buffers(records)}``;
        None for a model without state). Returned as it is, the global statistics keep the hook's
        arithmetic, or stay where they were."""
        return None

    def extra_pseudo_gradient(self, ctx, aggregation: Aggregation, records: Sequence[DispatchRecord]):
        """A pytree added to Σ c_i Δ_i before the server optimiser (None: nothing)."""
        return None

    def after_update(self, ctx, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> None:
        """Called after the generic update's pseudo-gradient is formed (before the server step)."""

    def on_pause(self, ctx, paused) -> Any:
        """Training states after a pause (``paused``: :class:`jaxfl.engine.PausedCall`)."""
        return paused.states


class Algorithm:
    """One algorithm: its options, its policy and its device hooks (see the module docstring).

    Built by the engine's runner as ``Algorithm(run, options)`` with the validated
    :class:`~jaxfl.config.RunConfig` and this algorithm's resolved :class:`Options`.

    Class attributes that the config reads:

    - ``name``: the registry key (``--algorithm NAME``); ``kind``: one of :data:`KINDS`;
    - ``Options``: the options dataclass (:class:`Options` for none);
    - ``server_optimizer``: forces the server optimiser (FedOpt: ``"adam"``), None to leave it;
    - ``server_momentum``: the default server momentum (FedAvgM: 0.9);
    - ``waits_for_clients``: what it waits for (e.g. ``"every client of a round"``) when a crashed
      client could stall it forever without a ``round_timeout``; None if it never waits;
    - ``delta_updates``: True if its aggregations are pseudo-gradients Σ c_i Δ_i, so the FedNova
      option can normalise them (see :meth:`supports_fednova`);
    - ``uses_concurrency``: True if it keeps the run's ``concurrency`` clients in flight (a
      ``concurrency`` given to any other algorithm is reported as unread, as ``reads`` below; its
      ``clients_per_round`` is then unread when ``concurrency`` is given, which replaces it);
    - ``per_client_steps``: True if its policy dispatches each client :meth:`local_steps` steps
      (``local_steps_of(self.local_steps, client)``), so that a run's ``local_epochs`` gives every
      client its own count; False (the default) refuses ``local_epochs`` — an algorithm that
      decides the steps itself (FedCompass) or reads ``run.local_steps`` would ignore it;
    - ``reads``: the algorithm-specific run fields it reads, out of
      :data:`jaxfl.config.ALGORITHM_FIELDS` (``buffer_size``, ``rule``, ``staleness``...); one of
      them set for an algorithm that does not read it is reported, never silently ignored. None
      (the default): undeclared; those set are passed to it unchecked, with a note naming them.
    - ``changed_defaults``: run fields whose unset (None) value this algorithm reads as a default,
      ``{field: (default before, default now)}``: the one an unset record ran under, and the one
      written now (the same where it never changed: FedBuff's ``rule``). :func:`jaxfl.config.validate`
      writes the default now into the config, so the run's name and record hold it, and an unset
      field and the default given name one run; a config recorded unset (a run's ``config.json``, a
      checkpoint's) ran as the default before and is read back as such (:func:`jaxfl.config.as_recorded`),
      so old runs resume and compare as they ran.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "asynchronous"
    Options: ClassVar[type] = Options
    server_optimizer: ClassVar[str | None] = None
    server_momentum: ClassVar[float] = 0.0
    waits_for_clients: ClassVar[str | None] = None
    delta_updates: ClassVar[bool] = True
    uses_concurrency: ClassVar[bool] = False  # it reads the run's ``concurrency`` (clients in flight)
    per_client_steps: ClassVar[bool] = False  # its policy takes :meth:`local_steps` (local_epochs allowed)
    reads: ClassVar[frozenset[str] | None] = None  # algorithm-specific run fields it reads
    changed_defaults: ClassVar[Mapping[str, tuple[Any, Any]]] = {}  # field -> (default before, default now)
    summary: ClassVar[str] = ""
    # what jaxfl calls on an algorithm that a subclass may define (a near miss of one is refused)
    METHODS: ClassVar[tuple[str, ...]] = ("policy", "hooks", "validate", "unread_settings", "schedule_depends_on_model",
                                          "supports_fednova", "most_local_steps")

    def __init_subclass__(cls, **kwargs) -> None:
        """A ``policy()`` defined by a subclass is wrapped so that what it returns is checked at
        once: anything but a :class:`~jaxfl.scheduler.simulation.Policy` is refused by name, before
        the engine is built (it failed as an AttributeError deep in the run)."""
        super().__init_subclass__(**kwargs)
        problem = _misspelt_hook(cls, Algorithm, Algorithm.METHODS)
        if problem is not None:
            raise TypeError(problem)
        policy = cls.__dict__.get("policy")
        if inspect.isfunction(policy) and not getattr(policy, "_checks_its_policy", False):
            cls.policy = _checked_policy(cls, policy)

    def __init__(self, run, options: Options | None = None):
        self.run = run
        self.options = (options if options is not None else self.Options()).resolved()
        self.client_samples = None  # n_i per client, set by jaxfl.algorithms.build for local_epochs

    @property
    def local_steps(self):
        """Local steps per dispatch: the run's ``local_steps``, or with ``local_epochs`` E one count per
        client, E passes over its n_i samples in batches of B (:func:`epoch_steps`), as a tuple indexed
        by client.

        >>> from types import SimpleNamespace
        >>> algorithm = Algorithm(SimpleNamespace(local_steps=50, local_epochs=2.0, batch_size=32))
        >>> algorithm.client_samples = [100, 16]
        >>> algorithm.local_steps
        (8, 2)
        """
        epochs = getattr(self.run, "local_epochs", None)
        if epochs is None:
            return self.run.local_steps
        if self.client_samples is None:
            raise ValueError("a local_epochs run needs the clients' sample counts: "
                             "jaxfl.algorithms.build(config, client_samples=federation.counts)")
        return epoch_steps(epochs, self.client_samples, self.run.batch_size)

    @property
    def most_local_steps(self) -> int:
        """The most local steps one dispatch of this algorithm can take: what the engine sizes its
        step chunks and programs for. The largest of :meth:`local_steps`; an algorithm that
        decides the steps itself and can go past them (FedCompass's Q_max) says so here.

        >>> from types import SimpleNamespace
        >>> algorithm = Algorithm(SimpleNamespace(local_steps=50, local_epochs=2.0, batch_size=32))
        >>> algorithm.client_samples = [100, 16]
        >>> algorithm.most_local_steps
        8
        """
        steps = self.local_steps  # an int, or one count per client
        return int(max(steps)) if hasattr(steps, "__len__") else int(steps)

    def policy(self) -> Policy:
        raise NotImplementedError(f"{type(self).__name__} must implement policy()")

    def hooks(self) -> Sequence[DeviceHook]:
        """The device hooks of this algorithm (none by default)."""
        return ()

    @classmethod
    def option_namespace(cls) -> str:
        """The prefix of this algorithm's options on the command line and in TOML (its name if unset)."""
        return cls.Options.namespace or cls.name

    @classmethod
    def supports_fednova(cls, run) -> bool:
        return cls.delta_updates

    @classmethod
    def validate(cls, run, options: Options) -> None:
        """Checks that need the run and the options together (options alone: ``Options.validate``)."""

    @classmethod
    def unread_settings(cls, run, options: Options | None = None) -> dict[str, tuple[str | None, str]]:
        """The shared run fields (:data:`jaxfl.config.VARIANT_FIELDS`: ``client_weights``, the server
        optimiser's ``server_optimizer``, ``server_lr``, ``server_momentum``, the staleness function's
        ``staleness``, ``staleness_alpha``, ``staleness_a``) that this algorithm never
        reads under ``run``'s settings (e.g. its ``rule``) and ``options`` (None: not resolved yet, take
        the defaults): name → (the setting of this algorithm under which it is read, None if under
        none; the end of the refusal "read only with ..."). A value given to a run that does not read
        it is refused, and left out of the sweep cells and comparison runs that do not read it.

        >>> from types import SimpleNamespace
        >>> Algorithm.unread_settings(SimpleNamespace(rule=None))
        {}
        """
        return {}

    @classmethod
    def schedule_depends_on_model(cls, run, options: Options) -> str | None:
        """What in this algorithm's schedule depends on model values (None: nothing), e.g. a slot
        choice learned from losses. A timing-only run (``timing_only=True``) refuses it, naming this."""
        return None


def _checked_policy(cls: type, policy: Callable) -> Callable:
    """``cls.policy`` that refuses a result that is not a :class:`Policy` (see ``__init_subclass__``)."""

    @functools.wraps(policy)
    def checked(self, *args, **kwargs):
        made = policy(self, *args, **kwargs)
        if not isinstance(made, Policy):
            raise PluginError(f"{type(self).__name__}.policy() returned {made!r} ({type(made).__name__}), not a "
                              "jaxfl Policy: return an instance of a subclass of "
                              "jaxfl.scheduler.simulation.Policy (jaxfl.algorithms.base.Policy)")
        problem = _signature_mismatch(type(made), Policy, Policy.HOOKS)  # hooks assigned after the class
        if problem is not None:
            raise PluginError(problem)
        for hook, does in (("on_arrival(self, sim, record)", "the hook the simulation calls when an update arrives"),
                           ("start(self, sim)", "the hook that sets the run going at virtual time 0 (its first "
                                                "dispatches and timers)")):
            name = hook.partition("(")[0]
            if getattr(type(made), name) is getattr(Policy, name) and name not in getattr(made, "__dict__", {}):
                raise PluginError(f"{type(self).__name__}.policy() returned a {type(made).__name__}, which does not "
                                  f"define {hook}, {does} (every policy needs one)")
        return made

    checked._checks_its_policy = True
    return checked


# from this many clients on, a rule that scales each update by its client's data share p_i is said to
# take about as many client updates as there are clients for one FedAvg round's progress
DATA_SHARE_NOTE_CLIENTS = 1000


def note_data_share_steps(run, rule: str) -> None:
    """Say, for a large federation, that ``rule`` scales each update by its client's data share p_i
    (≈ 1/clients), so that its model moves by a client's share per update: at 10^5 clients a run of a
    hundred updates left the loss as it was (2.315766 → 2.315761), with nothing said. Not in timing-only
    runs, which train no model.

    >>> import warnings
    >>> from types import SimpleNamespace
    >>> with warnings.catch_warnings(record=True) as said:
    ...     warnings.simplefilter("always")
    ...     note_data_share_steps(SimpleNamespace(clients=100_000, timing_only=False), "fedcompass")
    >>> "about 1/100,000 here" in str(said[0].message)
    True
    """
    if run.timing_only or run.clients < DATA_SHARE_NOTE_CLIENTS:
        return
    warn_user(f"{rule} scales each update by its client's share of the data, p_i (about 1/{run.clients:,} here): "
              f"an aggregation moves the model by its clients' shares of their update, so one FedAvg round's "
              f"progress takes about {run.clients:,} client updates, and a run of a few hundred updates at this size "
              "hardly moves the model (FedAsync's and FedBuff's default rule paper do not scale by p_i)")


def check_picklable(algorithm: Algorithm, policy: Policy) -> None:
    """Refuse, before a run that checkpoints does any work, a plug-in's policy that a checkpoint
    cannot pickle (a lambda or a local function in an attribute, an open file): it trained the whole
    run and failed at the final checkpoint, with no summary written. The built-in policies are
    pickled by the tests instead of here (a million clients' fresh state is not free)."""
    run = algorithm.run  # a training run's config (a timing-only run writes no checkpoints and never asks)
    if type(policy).__module__.startswith("jaxfl.") or (run.checkpoint_every is None and not run.final_checkpoint):
        return
    import pickle

    try:
        pickle.dumps(policy)
    except Exception as error:  # PicklingError, or AttributeError/TypeError for local objects and handles
        raise PluginError(f"{type(algorithm).__name__}.policy() returned a {type(policy).__name__} that a checkpoint "
                          f"cannot pickle ({type(error).__name__}: {error}): keep functions in its attributes at "
                          "module level (a def, functools.partial of one) rather than lambdas or local functions, "
                          "or run without checkpoints (checkpoint_every=None, final_checkpoint=False)") from None


def epoch_steps(epochs: float, client_samples, batch_size: int) -> tuple[int, ...]:
    """Local steps that make ``epochs`` passes over each client's data: ⌊E⌋ · ⌈n_i / B⌉ for the whole
    epochs, each ending on its short batch as a PyTorch ``DataLoader`` (``drop_last=False``) ends it,
    plus ⌈(E − ⌊E⌋) · n_i / B⌉ for a part epoch; at least 1 (FedNova, Wang et al., NeurIPS 2020, §6:
    "E local epochs", so clients with more data take more steps; McMahan et al. 2017, Algorithm 1:
    E passes over batches of size B). The client kernel draws its batches the same way: a fresh
    permutation per epoch, whose last batch is short (:func:`jaxfl.kernels.client.minibatch_indices`).

    >>> epoch_steps(1.5, [640, 100, 1], batch_size=64)   # a part epoch takes at least one batch
    (15, 3, 2)
    >>> epoch_steps(3, [80], batch_size=32)   # 3 passes of 32 + 32 + 16 images, not ⌈3 · 80 / 32⌉ = 8
    (9,)
    """
    import fractions

    whole = math.floor(epochs)
    # the part epoch as the decimal given, in integers: 0.1 · 640 / 64 is 1.0000000000000002 in floating
    # point (one batch, not two), and a fixed allowance for that was too small at n / B ≈ 10^7
    part = fractions.Fraction(repr(float(epochs))) - whole
    above, below = part.numerator, part.denominator * batch_size
    steps = tuple(max(1, whole * -(-int(n) // batch_size) - (-above * int(n) // below)) for n in client_samples)
    if steps and max(steps) >= 2**31:  # as local_steps: the engine counts steps in int32 (it overflowed mid-run)
        most = max(steps)
        raise ValueError(f"local_epochs={epochs:g} is not allowed: it gives a client "
                         f"{f'{most:,}' if most < 10**15 else f'about 10^{len(str(most)) - 1}'} local steps "
                         f"({epochs:g} passes over its {max(client_samples, key=int)} samples in batches of "
                         f"{batch_size}); the steps of a round must stay below 2^31")
    return steps


def staleness_function(run) -> Callable[[int], float]:
    """The run's st(s) (``staleness``, ``staleness_alpha``, ``staleness_a``); constant uses α only.

    >>> from types import SimpleNamespace
    >>> staleness_function(SimpleNamespace(staleness="polynomial", staleness_alpha=0.9, staleness_a=0.5))(3)
    0.45
    """
    params = {"alpha": run.staleness_alpha}
    if run.staleness != "constant":
        params["a"] = run.staleness_a
    return make_staleness(run.staleness, **params)


def check_per_dispatch(payload, contributions, *columns: str) -> None:
    """For a payload of per-dispatch columns keyed by ``payload.dispatch_ids``: every column as long
    as the ids, and every contributed dispatch among them (else ``ValueError``).

    >>> from typing import NamedTuple
    >>> class Weights(NamedTuple):
    ...     dispatch_ids: tuple
    ...     weight: tuple
    >>> check_per_dispatch(Weights((3, 4), (0.5,)), ((3, 1.0),), "weight")
    Traceback (most recent call last):
    ValueError: Weights.weight has 1 entries for 2 dispatch ids
    """
    name = type(payload).__name__
    for column in columns:
        if len(getattr(payload, column)) != len(payload.dispatch_ids):
            raise ValueError(f"{name}.{column} has {len(getattr(payload, column))} entries for "
                             f"{len(payload.dispatch_ids)} dispatch ids")
    missing = [d for d, _ in contributions if d not in set(payload.dispatch_ids)]
    if missing:
        raise ValueError(f"{name} has no entries for the contributed dispatches {missing}")


_REGISTRY: dict[str, type[Algorithm]] = {}


def register(algorithm: type[Algorithm]) -> type[Algorithm]:
    """Add an algorithm class to the registry (usable as a class decorator); returns it.

    >>> class Demo(Algorithm):
    ...     name = "demo_doc"
    ...     def policy(self): ...
    >>> register(Demo) is Demo and "demo_doc" in names()
    True
    >>> unregister("demo_doc")
    """
    if not (isinstance(algorithm, type) and issubclass(algorithm, Algorithm)):
        raise TypeError(f"register() takes an Algorithm subclass, got {algorithm!r}")
    if not algorithm.name or not isinstance(algorithm.name, str):
        raise ValueError(f"{algorithm.__name__} needs a non-empty string name")
    if algorithm.kind not in KINDS:
        raise ValueError(f"{algorithm.__name__}.kind={algorithm.kind!r} is not one of {', '.join(KINDS)}")
    if not (dataclasses.is_dataclass(algorithm.Options) and issubclass(algorithm.Options, Options)):
        raise TypeError(f"{algorithm.__name__}.Options must be a dataclass subclass of jaxfl.algorithms.Options")
    _check_options_class(algorithm)
    _check_reads(algorithm)
    if getattr(algorithm.policy, "__wrapped__", algorithm.policy) is Algorithm.policy:  # failed in a traceback at the run
        raise TypeError(f"{algorithm.__name__} defines no policy(self): the method that returns its scheduling "
                        "Policy (jaxfl.scheduler.simulation.Policy), which every algorithm needs")
    _check_shared_namespace(algorithm)
    existing = _REGISTRY.get(algorithm.name)
    if existing is not None and existing is not algorithm and \
            (existing.__module__, existing.__qualname__) != (algorithm.__module__, algorithm.__qualname__):
        raise ValueError(f"algorithm name {algorithm.name!r} is taken by {existing.__module__}.{existing.__qualname__}")
    _REGISTRY[algorithm.name] = algorithm
    return algorithm


def _check_shared_namespace(algorithm: type[Algorithm]) -> None:
    """Refuse an option typed otherwise than the same option of another algorithm in its namespace
    (``--port.staleness-bound 5`` was parsed by PORT's float for a plug-in's int, and refused)."""
    config = sys.modules.get("jaxfl.config")  # None or partial while it is imported (the built-ins register then)
    if not hasattr(config, "OPTION_TYPES") or not dataclasses.fields(algorithm.Options):
        return
    space = algorithm.option_namespace()
    mine = {field.name: config.annotation_text(field.type) for field in dataclasses.fields(algorithm.Options)}
    for other in _REGISTRY.values():
        if other.name == algorithm.name or other.option_namespace() != space:
            continue
        for field in dataclasses.fields(other.Options):
            if field.name in mine and config.annotation_text(field.type) != mine[field.name]:
                raise TypeError(f"{algorithm.__name__}.Options: option {space}.{field.name} is {mine[field.name]}, "
                                f"but {other.name}'s in the same namespace is {config.annotation_text(field.type)}: "
                                f"one flag --{space}.{field.name.replace('_', '-')} parses both; give it the same "
                                f"type, or your Options another namespace")


def _check_options_class(algorithm: type[Algorithm]) -> None:
    """Refuse, by name, an Options class whose annotated fields are not dataclass fields (a subclass
    without ``@dataclasses.dataclass``: its options read as unknown) or have no default (validate
    failed with a bare TypeError)."""
    for cls in algorithm.Options.__mro__:
        if cls is Options or not issubclass(cls, Options):
            continue
        known = getattr(cls, "__dataclass_fields__", {})
        missing = [name for name, annotation in inspect.get_annotations(cls).items()
                   if name not in known and "ClassVar" not in str(annotation)]
        if missing:
            raise TypeError(f"{algorithm.__name__}.Options: {cls.__name__} declares the option(s) "
                            f"{', '.join(missing)} but is not a dataclass: decorate {cls.__name__} with "
                            "@dataclasses.dataclass(frozen=True)")
    config = sys.modules.get("jaxfl.config")  # None while it is imported (the built-ins, which register then)
    for field in dataclasses.fields(algorithm.Options) if getattr(config, "OPTION_TYPES", None) else ():
        text = config.annotation_text(field.type)
        if text.removesuffix(" | None") not in config.OPTION_TYPES:  # every value was refused as "not a string"
            raise TypeError(f"{algorithm.__name__}.Options: option {field.name}: {text} is not a type jaxfl can "
                            f"check and parse from the command line; use one of {', '.join(config.OPTION_TYPES)}, "
                            f"each optionally '| None', and check "
                            f"narrower values (a choice of strings, a range) in the Options' validate()")
    no_default = [field.name for field in dataclasses.fields(algorithm.Options)
                  if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING]
    if no_default:
        raise TypeError(f"{algorithm.__name__}.Options ({algorithm.Options.__name__}): the option(s) "
                        f"{', '.join(no_default)} have no default; every option needs one (None to take "
                        "the preset's value), so that a run that does not set it can be built")


def _check_reads(algorithm: type[Algorithm]) -> None:
    """Refuse a ``reads`` that is not a set of :data:`jaxfl.config.ALGORITHM_FIELDS` names (a misspelt
    one was accepted, and the field it meant reported as unread). Skipped while jaxfl.config is
    being imported (the built-in algorithms, which register then)."""
    reads = algorithm.reads
    if reads is None:
        return
    if isinstance(reads, str) or not all(isinstance(name, str) for name in reads):
        raise TypeError(f"{algorithm.__name__}.reads={reads!r} is not allowed: a frozenset of run field names")
    fields = getattr(sys.modules.get("jaxfl.config"), "ALGORITHM_FIELDS", None)
    if fields is None:
        return
    if "concurrency" in reads:  # read through uses_concurrency, which the engine's policies follow
        raise ValueError(f"{algorithm.__name__}.reads names 'concurrency': set {algorithm.__name__}.uses_concurrency "
                         "= True instead (an algorithm that keeps the run's concurrency clients in flight)")
    unknown = sorted(set(reads) - set(fields))
    if unknown:
        raise ValueError(f"{algorithm.__name__}.reads names {', '.join(map(repr, unknown))}, not among the "
                         f"algorithm-specific run fields: one of {', '.join(fields)}")


def unregister(name: str) -> None:
    """Remove a registered name (tests and notebooks that redefine an algorithm)."""
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """Registered algorithm names, in registration order."""
    return tuple(_REGISTRY)


def get(name: str) -> type[Algorithm]:
    """The algorithm class registered as ``name``, or imported from a ``module:Class`` reference.

    Raises ``KeyError`` naming the registered algorithms for an unknown name.
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        module_name, _, attribute = name.rpartition(":")
        try:
            algorithm = getattr(_import(module_name), attribute)
        except (ImportError, AttributeError, OSError) as error:
            raise KeyError(f"algorithm reference {name!r} could not be imported: {error}") from None
        except SyntaxError as error:  # the user's file does not parse: where, in one line
            raise KeyError(f"algorithm reference {name!r} could not be imported: {error.msg} at "
                           f"{error.filename}:{error.lineno}") from None
        except Exception as error:  # the user's module raised while it was imported (kept as the cause)
            raise KeyError(f"algorithm reference {name!r} could not be imported: importing {module_name!r} raised "
                           f"{type(error).__name__}: {error}") from error
        if not (isinstance(algorithm, type) and issubclass(algorithm, Algorithm)):
            raise KeyError(f"algorithm reference {name!r} is {algorithm!r}, not an Algorithm subclass")
        try:
            register(algorithm)
        except (ValueError, TypeError) as error:  # no name, a kind not known, an Options not a dataclass...
            raise KeyError(f"algorithm reference {name!r} cannot be registered: {error}") from None
        return algorithm
    option = OPTIONS_NOT_ALGORITHMS.get(str(name).lower())
    hint = f"; in jaxfl {name} is an option of the algorithms, not one of them: {option}" if option else ""
    raise KeyError(f"unknown algorithm {name!r}{hint}; registered: {', '.join(_REGISTRY)} (or module:Class, "
                   f"path/to/file.py:Class)")


# Names a user tries as algorithms (the papers call them so) that jaxfl offers as options.
OPTIONS_NOT_ALGORITHMS = {
    "fedprox": "--prox-mu MU (prox_mu), e.g. --algorithm fedavg --prox-mu 0.01",
    "fednova": "--fednova (fednova=True), e.g. --algorithm fedavg --fednova --client-optimizer sgd",
    "fedopt": "--server-optimizer adam|yogi|adagrad, or the algorithms fedadam, fedyogi, fedadagrad",
}


def plugin_module_name(path: str) -> str:
    """The module name a plug-in ``.py`` file is loaded under: its file stem where that names no
    other module (none loaded under it, none importable from ``sys.path`` but this file), so that
    the conformance suite can import it by name in a fresh interpreter; else
    ``jaxfl_user_<hash of its absolute path>_<stem>``, a name no other module has, so that a plug-in
    file called ``json.py`` or ``random.py`` shadows nothing. Either is the same for the same file
    in every process, which a checkpoint that pickled one of its classes needs to unpickle.

    >>> plugin_module_name("/tmp/plugins/json.py")
    'jaxfl_user_e0ed6aed_json'
    >>> plugin_module_name("/tmp/plugins/my_pairs_algorithm.py")
    'my_pairs_algorithm'
    """
    path = os.path.abspath(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem.isidentifier() and _names_only(stem, path):
        return stem
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in stem)
    return f"jaxfl_user_{hashlib.sha256(path.encode()).hexdigest()[:8]}_{safe}"


def _names_only(name: str, path: str) -> bool:
    """Whether the top-level module ``name`` is ``path`` or nothing: none loaded under it but that
    file, and none that an import would find elsewhere (a standard, installed or built-in module)."""
    def same(file) -> bool:
        return bool(file) and os.path.abspath(file) == path

    loaded = sys.modules.get(name)
    if loaded is not None:
        return same(getattr(loaded, "__file__", None))
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is None or same(spec.origin)


def _import(module_name: str):
    """A module by dotted name (the working directory is searched too, as ``python -m`` does) or by
    the path of a ``.py`` file, loaded once under :func:`plugin_module_name` of its path: a name of
    its own, so that a plug-in file called ``json.py`` or ``random.py`` shadows no module of the
    process, and the same for the same file in every process, so that a checkpoint that pickled one
    of its classes unpickles after the resume imported the file again."""
    if module_name.endswith(".py"):
        path = os.path.abspath(os.path.expanduser(module_name))
        if not os.path.isfile(path):
            # a relative path is the working directory's, also in a config or sweep file elsewhere
            where = "" if os.path.isabs(os.path.expanduser(module_name)) else f" in the working directory {os.getcwd()}"
            raise ImportError(f"no file {module_name!r}{where}")
        name = plugin_module_name(path)
        folder = os.path.dirname(path)
        if folder not in sys.path:  # its sibling modules import, as under `python file.py` (after the others)
            sys.path.append(folder)
        loaded = sys.modules.get(name)
        if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") == path:
            return loaded
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    return importlib.import_module(module_name)
