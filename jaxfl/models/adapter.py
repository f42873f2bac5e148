"""One functional interface for user models, from Flax linen or Flax nnx.

A :class:`ModelAdapter` is two pure functions:

- ``init(key, sample) -> (params, state)``: ``params`` the trainable pytree, ``state`` the
  non-trainable collections as a plain dict (BatchNorm running statistics; ``{}`` for a
  stateless model);
- ``apply(params, state, x, train, key) -> (logits, new_state)``: ``train`` (static Python bool)
  switches dropout and batch statistics on; only then is ``state`` updated. ``key`` feeds
  dropout (and any other RNG stream) and may be ``None`` when ``train`` is False.

Both are jit/vmap/grad-friendly: the kernel can stack ``params`` and ``state`` on a client axis.
Aggregating ``state`` is the caller's business (FedCompass: plain mean of running statistics,
as the FedCompass authors' code does); ``has_state`` tells whether there is any.

>>> import flax.linen as nn, jax, jax.numpy as jnp
>>> adapter = ModelAdapter.from_linen(nn.Dense(3))
>>> params, state = adapter.init(jax.random.key(0), jnp.zeros((1, 4)))
>>> logits, state = adapter.apply(params, state, jnp.ones((2, 4)), train=True, key=jax.random.key(1))
>>> logits.shape, state
((2, 3), {})
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
from typing import Any, Callable

import jax

from jaxfl._user_warnings import warn_user

__all__ = ["ModelAdapter", "as_adapter"]

PyTree = Any


MODE_KEYWORDS = (("train", False), ("training", False), ("is_training", False), ("deterministic", True))


def _train_keyword(module) -> tuple[str | None, bool]:
    """The keyword a linen or nnx ``__call__`` takes for the mode, and whether it is inverted
    (deterministic). A module whose ``__call__`` takes another boolean with a default whose name
    reads as a mode (``is_train``, ``eval_mode``) gets a warning: jaxfl cannot set it."""
    try:
        parameters = inspect.signature(type(module).__call__).parameters
    except (TypeError, ValueError):
        return None, False
    for name, inverted in MODE_KEYWORDS:
        if name in parameters:
            return name, inverted
    # a boolean whose name says mode (is_train, eval_mode, inference...): not return_features or verbose
    flags = [name for name, parameter in parameters.items() if isinstance(parameter.default, bool)
             and re.search(r"train|determin|eval|infer|test|mode", name)]
    if flags:
        given = ", ".join(f"{name}={parameters[name].default}" for name in flags)
        warn_user(f"model {type(module).__name__}.__call__ takes {given}, which jaxfl does not set: jaxfl "
                  "passes the mode as train, training, is_training or deterministic; if "
                  f"{' or '.join(flags)} is the mode, rename it to one of those, or the layers that read it "
                  "keep its default in training and evaluation alike")
    return None, False


def _first_line(error: Exception) -> str:
    """Flax's message without its documentation link and trailing lines."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text.split(" (https://flax.readthedocs.io")[0]


def _is_zoo_linen(adapter) -> bool:
    """A linen model of jaxfl's zoo, hashable by value: its initialisers capture no arrays (a user's
    module may close over a pretrained table, which one compiled program would embed)."""
    if adapter.kind != "linen" or not type(adapter.module).__module__.startswith("jaxfl.models."):
        return False
    try:
        hash(adapter.module)
    except TypeError:  # a field holding a list or an array
        return False
    return True


def jaxlib_version() -> tuple[int, ...]:
    """The installed jaxlib's version as integers (``()`` where it is not installed as a package).

    >>> len(jaxlib_version()) == 3
    True
    """
    from importlib import metadata

    try:
        return tuple(int(part) for part in re.findall(r"\d+", metadata.version("jaxlib"))[:3])
    except metadata.PackageNotFoundError:
        return ()


# XLA's option of its classic fusion emitter went with jaxlib 0.11.1, and a compile naming it fails
# ("No such compile option"): every CPU run failed with it at its model's initialisation
CLASSIC_FUSION_EMITTER = jaxlib_version() < (0, 11, 1)
_CPU_INIT_OPTIONS = {"xla_backend_optimization_level": 1,
                     **({"xla_cpu_use_fusion_emitters": False} if CLASSIC_FUSION_EMITTER else {})}


def _at_top_level() -> bool:
    """True outside every jax transformation: jax takes ``compiler_options`` only for a jit called
    there (under ``jax.eval_shape``, as the model-input check calls the initialiser, it refuses
    them). Where jax no longer has this private query, False: the initialiser then compiles with
    XLA's defaults, as it does inside a trace."""
    from jax._src import core
    clean = getattr(core, "trace_state_clean", None)
    return bool(clean is not None and clean())


@functools.lru_cache(maxsize=16)
def _compiled_zoo_init(module, cheap_cpu_compile: bool = False) -> Callable:
    """One compiled program for a zoo model's initialisers, kept for equal modules (every run builds
    its own): op by op each initialiser compiles a small program of its own (34 for the CNN; 5.3 s
    against 2.8 for one program on a 2-core CPU, ResNet-18 13.6 s against 8.2). The values are the
    op-by-op ones bit for bit for 15 of the 16 zoo models; textcnn's embedding table differs in the
    last bit of some entries (≤ 3e-8: XLA fuses the truncated normal's scaling).

    With ``cheap_cpu_compile`` (a CPU, called outside every trace) the program is compiled with
    LLVM at level 1 and XLA's classic fusion emitter: it runs once per run, so its compile is its
    cost (the CNN's 5.8 s against 1.3, ResNet-18's 16.8 against 6.5; all 16 zoo models' 84 s
    against 37 on a 2-core CPU, 2026-12-03), and its values are those of XLA's defaults bit for
    bit for every zoo model."""
    return jax.jit(ModelAdapter.from_linen(module).init,
                   compiler_options=_CPU_INIT_OPTIONS if cheap_cpu_compile else None)


class ModelModeError(ValueError):
    """A model that fails in one of the modes jaxfl runs it in (training, evaluation), or draws
    random numbers where jaxfl gives none: said as it is, not as a shape the model cannot take."""


@dataclasses.dataclass(frozen=True)
class ModelAdapter:
    """``init(key, sample) -> (params, state)``; ``apply(params, state, x, train, key) -> (logits, state)``.

    Build one with :meth:`from_linen` or :meth:`from_nnx` (or :func:`as_adapter`, which picks).

    Example:
        >>> import flax.linen as nn, jax, jax.numpy as jnp
        >>> class Net(nn.Module):
        ...     @nn.compact
        ...     def __call__(self, x, train: bool = False):
        ...         return nn.Dense(2)(nn.BatchNorm(use_running_average=not train)(x))
        >>> adapter = ModelAdapter.from_linen(Net())
        >>> params, state = adapter.init(jax.random.key(0), jnp.zeros((1, 3)))
        >>> sorted(state), adapter.has_state(state)
        (['batch_stats'], True)
    """

    init: Callable[[jax.Array, jax.Array], tuple[PyTree, PyTree]]
    apply: Callable[..., tuple[jax.Array, PyTree]]
    module: Any = None
    kind: str = "linen"

    @staticmethod
    def has_state(state: PyTree) -> bool:
        """True when ``state`` holds any array (e.g. BatchNorm statistics).

        Example:
            >>> ModelAdapter.has_state({})
            False
        """
        return len(jax.tree_util.tree_leaves(state)) > 0

    def init_variables(self, key: jax.Array, sample: jax.Array) -> dict:
        """The model as jaxfl's kernels and engine carry it: ``{"params": params}``, plus
        ``{"state": state}`` when the model keeps non-trainable state (BatchNorm statistics).

        Example:
            >>> import flax.linen as nn, jax, jax.numpy as jnp
            >>> sorted(ModelAdapter.from_linen(nn.Dense(2)).init_variables(jax.random.key(0), jnp.zeros((1, 3))))
            ['params']
        """
        if _is_zoo_linen(self):
            cheap = jax.default_backend() == "cpu" and _at_top_level()
            params, state = _compiled_zoo_init(self.module, cheap)(key, sample)
        else:
            params, state = self.init(key, sample)
        return {"params": params, "state": state} if self.has_state(state) else {"params": params}

    def predict(self, variables: dict, x: jax.Array) -> jax.Array:
        """Evaluation-mode logits of :meth:`init_variables`-layout ``variables`` (running statistics,
        no dropout).

        Example:
            >>> import flax.linen as nn, jax, jax.numpy as jnp
            >>> a = ModelAdapter.from_linen(nn.Dense(2))
            >>> a.predict(a.init_variables(jax.random.key(0), jnp.zeros((1, 3))), jnp.ones((5, 3))).shape
            (5, 2)
        """
        return self.apply(variables["params"], variables.get("state", {}), x, train=False, key=None)[0]

    @classmethod
    def from_linen(cls, module, rng_streams: tuple[str, ...] = ("dropout",)) -> "ModelAdapter":
        """Wrap a ``flax.linen.Module``.

        Its ``__call__(x, train=...)`` (or ``training``, ``is_training``, or the inverse
        ``deterministic``) receives the mode; a module without such an argument is called with
        ``x`` alone. In training, every collection other than ``params`` is mutable and returned as
        the new state; ``key`` is split over ``rng_streams``.

        Example:
            >>> import flax.linen as nn, jax, jax.numpy as jnp
            >>> a = ModelAdapter.from_linen(nn.Dense(2))
            >>> p, s = a.init(jax.random.key(0), jnp.zeros((1, 3)))
            >>> a.apply(p, s, jnp.zeros((4, 3)), train=False, key=None)[0].shape
            (4, 2)
        """
        keyword, inverted = _train_keyword(module)

        def mode(train: bool) -> dict:
            return {} if keyword is None else {keyword: (not train) if inverted else train}

        @contextlib.contextmanager
        def explained(train: bool, key):
            # traced once per program, before any run writes a file: a module that only breaks in one
            # mode (a layer or an RNG stream of its own in training) is named in one line, not in
            # Flax's traceback from inside the client kernel
            from flax import errors

            name, where = type(module).__name__, "train" if train else "eval"
            try:
                yield
            except errors.InvalidRngError as error:
                if key is None:  # evaluation and init give no stream at all
                    how = f"its {keyword!r} argument, which jaxfl sets" if keyword is not None else \
                        "a `train` or `deterministic` argument of __call__, which jaxfl sets"
                    raise ModelModeError(f"model {name} draws random numbers in eval mode ({_first_line(error)}): "
                                         "jaxfl initialises and evaluates a model without RNG streams, so a layer "
                                         f"that draws (a Dropout built with deterministic=False) must follow {how}") \
                        from error
                raise ModelModeError(f"model {name} in {where} mode asks for an RNG stream jaxfl does not give "
                                     f"({_first_line(error)}); it gives {list(rng_streams)}: use those, or pass "
                                     "ModelAdapter.from_linen(module, rng_streams=(...)) naming every stream") \
                    from error
            except errors.FlaxError as error:
                raise ModelModeError(f"model {name} fails in {where} mode (init ran in eval mode): "
                                     f"{_first_line(error)}") from error
            except ValueError as error:
                # flax's 'Parameter "use_running_average" (or "deterministic") must be passed to the
                # constructor or at call time': a BatchNorm or Dropout whose mode nothing sets
                if "must be passed to the constructor or at call time" not in str(error):
                    raise
                raise ModelModeError(f"model {name}: {_first_line(error)} jaxfl runs a model in train and eval "
                                     "mode through a `train` (or `deterministic`, `use_running_average`) argument "
                                     "of its __call__: take one and pass it on (nn.BatchNorm(use_running_average="
                                     "not train))") from error

        def init(key, sample):
            with explained(False, None):
                variables = dict(module.init({"params": key}, sample, **mode(False)))
            params = variables.pop("params", {})
            return params, variables

        def run(params, state, x, train: bool = False, key=None):
            rngs = None
            if key is not None:
                rngs = {stream: jax.random.fold_in(key, i) for i, stream in enumerate(rng_streams)}
            variables = {"params": params, **state}
            if train and state:
                logits, updates = module.apply(variables, x, rngs=rngs, mutable=list(state), **mode(True))
                return logits, {**state, **updates}
            return module.apply(variables, x, rngs=rngs, **mode(train)), state

        def apply(params, state, x, train: bool = False, key=None):
            with explained(train, key):
                return run(params, state, x, train, key)

        return cls(init, apply, module, "linen")

    @classmethod
    def from_nnx(cls, module_or_factory) -> "ModelAdapter":
        """Wrap a ``flax.nnx.Module``, or a factory ``rngs -> Module`` (then ``init`` uses its key).

        The module is split into graphdef / ``nnx.Param`` / RNG state / the rest (e.g.
        ``nnx.BatchStat``); params and state are returned as plain dicts (``nnx.to_pure_dict``).
        ``apply`` merges them back with every RNG stream restarted from ``fold_in(key, i)`` (a
        fixed key when ``key`` is None: pass one when training with dropout), and runs the module
        in ``train`` or eval mode (``nnx.view(deterministic=..., use_running_average=...)``, and a
        ``train``, ``training``, ``is_training`` or ``deterministic`` argument of its ``__call__``
        as :meth:`from_linen` passes it). A module instance keeps its own weights: ``init`` ignores the key.

        Example:
            >>> from flax import nnx
            >>> import jax, jax.numpy as jnp
            >>> a = ModelAdapter.from_nnx(lambda rngs: nnx.Linear(3, 2, rngs=rngs))
            >>> p, s = a.init(jax.random.key(0), jnp.zeros((1, 3)))
            >>> a.apply(p, s, jnp.ones((4, 3)), train=False, key=None)[0].shape
            (4, 2)
        """
        from flax import nnx

        if isinstance(module_or_factory, nnx.Module):
            instance = module_or_factory
            build = lambda key: instance  # noqa: E731
            abstract = nnx.eval_shape(lambda: instance)
        elif callable(module_or_factory):
            build = lambda key: module_or_factory(nnx.Rngs(key))  # noqa: E731
            abstract = nnx.eval_shape(lambda: module_or_factory(nnx.Rngs(0)))
        else:
            raise ValueError(f"from_nnx expects an nnx.Module or a factory rngs -> Module, got {module_or_factory!r}")
        graphdef, param_template, rng_template, state_template = nnx.split(abstract, nnx.Param, nnx.RngState, ...)
        # a module ported from linen may take the mode as an argument (its layers then read it, not
        # the view's defaults): passed as from_linen passes it
        keyword, inverted = _train_keyword(abstract)

        def mode(train: bool) -> dict:
            return {} if keyword is None else {keyword: (not train) if inverted else train}
        is_variable = lambda v: isinstance(v, nnx.Variable)  # noqa: E731
        streams = sorted({v.tag for v in jax.tree_util.tree_leaves(rng_template, is_leaf=is_variable)
                          if getattr(v, "tag", None) is not None})

        def fill(template, pure):
            filled = jax.tree_util.tree_map(lambda leaf: leaf, template)
            nnx.replace_by_pure_dict(filled, pure)
            return filled

        def fresh_rngs(key):
            # Every stream restarts from fold_in(key, stream index): the RNG state is a function of
            # the key alone, so it never has to be carried, stacked or averaged.
            if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
                key = jax.random.wrap_key_data(key)

            def reset(v):
                if isinstance(v, nnx.RngKey):
                    return v.replace(jax.random.fold_in(key, streams.index(v.tag)))
                if isinstance(v, nnx.RngCount):
                    return v.replace(jax.numpy.zeros((), jax.numpy.uint32))
                return v

            return jax.tree_util.tree_map(reset, rng_template, is_leaf=is_variable)

        def init(key, sample):
            _, params, _, state = nnx.split(build(key), nnx.Param, nnx.RngState, ...)
            return nnx.to_pure_dict(params), nnx.to_pure_dict(state)

        def apply(params, state, x, train: bool = False, key=None):
            rngs = fresh_rngs(jax.random.key(0) if key is None else key)
            model = nnx.merge(graphdef, fill(param_template, params), rngs, fill(state_template, state))
            model = nnx.view(model, deterministic=not train, use_running_average=not train,
                             raise_if_not_found=False)
            try:
                logits = model(x, **mode(train))
            except (ValueError, TypeError) as error:
                if not train:  # eval mode is what init and the input-shape check run: their messages stand
                    raise
                # train mode is first traced inside the client kernel: name the model and mode in one line
                raise ValueError(f"model {type(model).__name__} fails in train mode (init ran in eval mode): "
                                 f"{' '.join(str(error).split()).split(' (https://flax')[0]}") from error
            if not train:
                return logits, state
            _, _, _, new_state = nnx.split(model, nnx.Param, nnx.RngState, ...)
            return logits, nnx.to_pure_dict(new_state)

        return cls(init, apply, module_or_factory, "nnx")


def as_adapter(model) -> ModelAdapter:
    """A :class:`ModelAdapter` for a linen module, an nnx module or factory, or an adapter (as is).

    Example:
        >>> import flax.linen as nn
        >>> as_adapter(nn.Dense(2)).kind
        'linen'
    """
    import flax.linen as nn

    if isinstance(model, ModelAdapter):
        return model
    if isinstance(model, nn.Module):
        return ModelAdapter.from_linen(model)
    return ModelAdapter.from_nnx(model)
