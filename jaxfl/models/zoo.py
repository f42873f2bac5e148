"""The model registry: every model by name, what input it is built for, and user registration.

- ``cnn``: FedCompass MNIST CNN (582,026 params), for (28, 28, 1) images;
- ``mlp``: 2-hidden-layer MLP (200, 200), McMahan's "2NN", any input (flattened);
- ``logreg``: multinomial logistic regression (FedProx synthetic), any input;
- ``lenet5``: LeNet-5 as PLATO builds it (PORT, FedASMU), images >= 28x28;
- ``ccfedavg_cnn``: CC-FedAvg's CIFAR CNN (2 conv + 3 FC), (32, 32, C) images;
- ``ccfedavg_mlp``: CC-FedAvg's FMNIST MLP 784-50-10 with dropout, any input;
- ``fedasmu_cnn``: FedASMU's small CNN (its Table 3), images >= 3x3;
- ``resnet18``: CIFAR ResNet-18 with BatchNorm (11,173,962 params), images >= 8x8;
- ``resnet18_gn``: CIFAR ResNet-18 with GroupNorm (CC-FedAvg), images >= 8x8;
- ``resnet20``: CIFAR ResNet-20, option-A shortcuts, BatchNorm (269,722 params; FedASMU), images >= 8x8;
- ``vgg11``, ``vgg16``: CIFAR VGG with BatchNorm, one Dense 512 -> classes (FedASMU; PORT), images >= 32x32;
- ``alexnet``: CIFAR AlexNet (2,472,266 params; FedASMU), images >= 29x29;
- ``textcnn``: Kim-style TextCNN (FedASMU's IMDb model), token ids (L >= 5);
- ``lstm``: embedding + one LSTM layer, token ids.

Bring your own Flax model with one call, ``register_model("mynet", MyNet)``, then run it by name like
the built-in ones, or pass it straight to ``run_experiment(config, model=...)``, or name it as
``module:object`` (``jaxfl run --model my_models:MyNet``). :func:`build_model` accepts, in each of these
routes: a linen module class (built as ``MyNet(num_classes=...)`` when it has that field) or
instance; an nnx module class (``MyNet(num_classes=..., rngs=...)``, ``num_classes`` only if its
``__init__`` takes it) or instance; a factory ``rngs -> nnx.Module`` (``lambda rngs: MyNet(rngs=rngs)``);
a factory ``(num_classes=...) -> Module`` or ``() -> Module``; or a ``ModelAdapter``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import traceback
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxfl.config import USER_PREFIX, is_object_reference
from jaxfl.user_inputs import _short
from jaxfl.models.cifar import VGG11, VGG16, AlexNet, ResNet20
from jaxfl.models.cnn import MLP, CCFedAvgCNN, CCFedAvgMLP, ExampleCNN, FedASMUCNN, LeNet5, LogReg, MnistCNN
from jaxfl.models.resnet import ResNet18, ResNet18GN
from jaxfl.models.text import LSTMClassifier, TextCNN

__all__ = ["InputSpec", "MODELS", "MODEL_INPUTS", "TEXT_MODELS", "make_model", "register_model", "check_model_input",
           "models_for", "count_params", "build_model", "check_model_object", "is_model_reference", "load_model_reference",
           "user_label"]


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """What one sample must look like: ``kind`` ``"image"`` ``(H, W, C)``, ``"tokens"`` ``(L,)`` or ``"any"``.

    ``shape`` pins the exact sample shape (``None`` entries are free); ``min_size`` bounds H and W
    (images) or L (tokens) from below.

    Example:
        >>> InputSpec("image", shape=(28, 28, 1)).accepts((32, 32, 3), "image")
        False
    """

    kind: str = "any"
    shape: tuple | None = None
    min_size: int = 1

    def accepts(self, shape: tuple, kind: str) -> bool:
        """Whether samples of ``shape`` and ``kind`` fit.

        Example:
            >>> InputSpec("tokens").accepts((256,), "tokens")
            True
        """
        if self.kind == "any":
            return kind != "tokens"
        rank = 3 if self.kind == "image" else 1
        if kind != self.kind or len(shape) != rank:
            return False
        if self.shape is not None and any(w is not None and w != s for w, s in zip(self.shape, shape)):
            return False
        spatial = shape[:2] if self.kind == "image" else shape[:1]
        return min(spatial) >= self.min_size

    def describe(self) -> str:
        """Human-readable requirement.

        Example:
            >>> InputSpec("image", shape=(32, 32, None)).describe()
            'images of shape (32, 32, C)'
        """
        if self.kind == "any":
            return "images or feature vectors (flattened)"
        if self.shape is not None:
            dims = ", ".join("C" if s is None else str(s) for s in self.shape)
            return f"{'images' if self.kind == 'image' else 'token ids'} of shape ({dims})"
        what = "images (H, W, C)" if self.kind == "image" else "token ids (L,)"
        return what + (f" with {'H and W' if self.kind == 'image' else 'L'} >= {self.min_size}"
                       if self.min_size > 1 else "")


MODELS: dict[str, Callable] = {
    "cnn": MnistCNN,
    "cnn_example": ExampleCNN,
    "mlp": MLP,
    "logreg": LogReg,
    "lenet5": LeNet5,
    "ccfedavg_cnn": CCFedAvgCNN,
    "ccfedavg_mlp": CCFedAvgMLP,
    "fedasmu_cnn": FedASMUCNN,
    "resnet18": ResNet18,
    "resnet18_gn": ResNet18GN,
    "resnet20": ResNet20,
    "vgg11": VGG11,
    "vgg16": VGG16,
    "alexnet": AlexNet,
    "textcnn": TextCNN,
    "lstm": LSTMClassifier,
}
MODEL_INPUTS: dict[str, InputSpec] = {
    "cnn": InputSpec("image", shape=(28, 28, 1)),
    "cnn_example": InputSpec("image", shape=(28, 28, 1)),
    "mlp": InputSpec("any"),
    "logreg": InputSpec("any"),
    "lenet5": InputSpec("image", min_size=28),
    "ccfedavg_cnn": InputSpec("image", shape=(32, 32, None)),
    "ccfedavg_mlp": InputSpec("any"),
    "fedasmu_cnn": InputSpec("image", min_size=3),
    "resnet18": InputSpec("image", min_size=8),
    "resnet18_gn": InputSpec("image", min_size=8),
    "resnet20": InputSpec("image", min_size=8),
    "vgg11": InputSpec("image", min_size=32),  # five 2x2 max-pools
    "vgg16": InputSpec("image", min_size=32),
    "alexnet": InputSpec("image", min_size=29),  # stride 4, then three 2x2 max-pools
    "textcnn": InputSpec("tokens", min_size=5),
    "lstm": InputSpec("tokens"),
}
TEXT_MODELS = ("textcnn", "lstm")  # take vocab_size


def make_model(name: str, num_classes: int, vocab_size: int | None = None):
    """Build a model by name from ``MODELS``; ``vocab_size`` is used by the text models only.

    A registered linen module class comes back as the module; anything else registered (an nnx
    class, a factory) as a :class:`~jaxfl.models.adapter.ModelAdapter` (see :func:`build_model`).

    Example:
        >>> make_model("cnn", 10)
        MnistCNN(
            # attributes
            num_classes = 10
        )
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    factory = MODELS[name]
    if _is_linen_class(factory):
        options = {"num_classes": num_classes}
        if vocab_size is not None and (name in TEXT_MODELS or "vocab_size" in _linen_fields(factory)):
            options["vocab_size"] = int(vocab_size)
        return factory(**options)
    return build_model(factory, num_classes, vocab_size=vocab_size, label=f"model {name!r}")


_EXPECTED = ("a registered name, module:object, a flax.linen.Module (class or instance), an nnx.Module (class or "
             "instance), a factory rngs -> nnx.Module, a factory (num_classes=...) -> Module, or a ModelAdapter")
_SUPPLIED = ("rngs", "num_classes", "vocab_size")  # the arguments build_model can give a class or factory


def _is_linen_class(factory) -> bool:
    import flax.linen as nn

    return isinstance(factory, type) and issubclass(factory, nn.Module)


def _is_nnx_class(factory) -> bool:
    from flax import nnx

    return isinstance(factory, type) and issubclass(factory, nnx.Module)


def _linen_fields(cls) -> dict[str, bool]:
    """A linen module class's own attributes -> whether each needs a value (no default)."""
    return {f.name: f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            for f in dataclasses.fields(cls) if f.init and f.name not in ("parent", "name")}


def _arguments(function) -> tuple[set[str], list[str]] | None:
    """``(names it accepts, names it requires)`` of a callable's signature; None when it has none to read."""
    try:
        if isinstance(function, type):  # nnx's metaclass hides the constructor's own signature
            parameters = list(inspect.signature(function.__init__).parameters.values())[1:]
        else:
            parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    accepted, required = set(), []
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            accepted.add("num_classes")  # **kwargs: the number of classes is worth passing on
        elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
            accepted.add(parameter.name)
            if parameter.default is inspect.Parameter.empty:
                required.append(parameter.name)
    return accepted, required


def _name(obj) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def check_model_object(model: Any, label: str = "model") -> str:
    """How :func:`build_model` will build ``model``, or ``ValueError`` (one line) naming what is wrong.

    Cheap: nothing is built and no data is needed, so a run checks this before any work.
    Returns one of ``adapter``, ``linen_instance``, ``nnx_instance``, ``linen_class``, ``nnx_class``,
    ``nnx_factory``, ``factory``.

    Example:
        >>> check_model_object(lambda rngs: None)
        'nnx_factory'
        >>> check_model_object(lambda key: None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: model factory <lambda>(key) has the wrong signature: ...
    """
    import flax.linen as nn
    from flax import nnx

    from jaxfl.models.adapter import ModelAdapter

    if isinstance(model, ModelAdapter):
        return "adapter"
    if isinstance(model, nn.Module):
        return "linen_instance"
    if isinstance(model, nnx.Module):
        return "nnx_instance"
    if _is_linen_class(model):
        missing = [name for name, needed in _linen_fields(model).items() if needed and name not in _SUPPLIED]
        if missing:
            raise ValueError(f"{label} {model.__name__} needs attributes {', '.join(missing)} that jaxfl cannot "
                             f"supply (it gives num_classes and vocab_size): pass an instance, "
                             f"e.g. {model.__name__}({missing[0]}=...)")
        return "linen_class"
    if isinstance(model, type) and not _is_nnx_class(model):
        raise ValueError(f"{label}={_short(model)} is a class but not a Flax module; expected {_EXPECTED}")
    if not callable(model):
        raise ValueError(f"{label}={_short(model)} is not a model; expected {_EXPECTED}")
    signature = _arguments(model)
    if signature is None:
        return "nnx_class" if _is_nnx_class(model) else "factory"
    accepted, required = signature
    unsupplied = [name for name in required if name not in _SUPPLIED]
    if _is_nnx_class(model):
        if unsupplied:
            raise ValueError(f"{label} {model.__name__} needs arguments {', '.join(unsupplied)} that jaxfl cannot "
                             f"supply (it gives rngs, num_classes, vocab_size): pass a factory, "
                             f"e.g. lambda rngs: {model.__name__}(..., rngs=rngs)")
        return "nnx_class"
    if unsupplied:
        raise ValueError(f"{label} factory {_name(model)}({', '.join(required)}) has the wrong signature: an nnx "
                         f"factory takes rngs (lambda rngs: MyNet(rngs=rngs)), a linen or nnx one num_classes= "
                         f"or nothing; jaxfl cannot supply {', '.join(unsupplied)}")
    return "nnx_factory" if "rngs" in accepted else "factory"


def build_model(model: Any, num_classes: int, vocab_size: int | None = None, label: str = "model"):
    """A :class:`~jaxfl.models.adapter.ModelAdapter` for any model object a user may hand jaxfl.

    ``model`` is anything :func:`check_model_object` accepts; classes and factories get
    ``num_classes`` (and ``vocab_size``, when given) if they take them, and nnx ones ``rngs``.
    An nnx *instance* keeps its own weights (the run's seed does not re-initialise it).

    Example:
        >>> from flax import nnx
        >>> import jax, jax.numpy as jnp
        >>> class Net(nnx.Module):
        ...     def __init__(self, num_classes, rngs):
        ...         self.out = nnx.Linear(4, num_classes, rngs=rngs)
        ...     def __call__(self, x):
        ...         return self.out(x)
        >>> adapter = build_model(lambda rngs: Net(3, rngs=rngs), num_classes=3)
        >>> adapter.predict(adapter.init_variables(jax.random.key(0), jnp.zeros((1, 4))), jnp.ones((2, 4))).shape
        (2, 3)
    """
    import flax.linen as nn
    from flax import nnx

    from jaxfl.models.adapter import ModelAdapter

    kind = check_model_object(model, label)
    options = {"num_classes": num_classes}
    if vocab_size is not None:
        options["vocab_size"] = int(vocab_size)

    def given(accepted) -> dict:
        return {key: value for key, value in options.items() if key in accepted}

    if kind == "adapter":
        return model
    if kind == "linen_instance":
        return ModelAdapter.from_linen(model)
    if kind == "nnx_instance":
        return ModelAdapter.from_nnx(model)
    if kind == "linen_class":
        return ModelAdapter.from_linen(model(**given(_linen_fields(model))))
    accepted = (_arguments(model) or ({"rngs"} if kind == "nnx_class" else set(), []))[0]

    def built(result):
        if not isinstance(result, (nn.Module, nnx.Module, ModelAdapter)):
            raise ValueError(f"{label} factory {_name(model)} returned {_short(result)}, not a Flax module; "
                             f"expected {_EXPECTED}")
        return result

    if kind in ("nnx_class", "nnx_factory"):
        def factory(rngs):
            result = built(model(**given(accepted), **({"rngs": rngs} if "rngs" in accepted else {})))
            if not isinstance(result, nnx.Module):
                raise ValueError(f"{label} factory {_name(model)} takes rngs but returned {_short(result)}, "
                                 "not an nnx.Module")
            return result

        try:
            return ModelAdapter.from_nnx(factory)
        except TypeError as error:  # the user's constructor rejected what it was given
            raise ValueError(f"{label} {_name(model)} could not be built with {sorted(given(accepted))} and rngs: "
                             f"{error}") from error
    try:
        result = built(model(**given(accepted)))
    except TypeError as error:
        raise ValueError(f"{label} factory {_name(model)} could not be called with {sorted(given(accepted))}: "
                         f"{error}") from error
    return build_model(result, num_classes, vocab_size, label)


def user_label(obj: Any) -> str:
    """How config.json names a model (or other object) given as a Python object: ``<user: module.Name>``.

    Example:
        >>> import flax.linen as nn
        >>> user_label(nn.Dense(3))
        '<user: flax.linen.linear.Dense>'
    """
    from jaxfl.models.adapter import ModelAdapter

    if isinstance(obj, ModelAdapter) and obj.module is not None:
        obj = obj.module
    target = obj if isinstance(obj, type) or inspect.isroutine(obj) else type(obj)
    return f"{USER_PREFIX}{getattr(target, '__module__', None) or '?'}.{_name(target)}>"


def is_model_reference(name: str) -> bool:
    """Whether ``name`` is a ``module:object`` (or ``path/file.py:object``) reference to import.

    Example:
        >>> is_model_reference("my_models:MyNet"), is_model_reference("cnn")
        (True, False)
    """
    return is_object_reference(name) and not name.startswith(USER_PREFIX)


def load_model_reference(reference: str) -> Any:
    """The object a ``module:object`` model reference names (the working directory is searched, as
    ``python -m`` does; ``path/to/file.py:object`` loads a file).

    Example:
        >>> load_model_reference("jaxfl.models.cnn:LogReg").__name__
        'LogReg'
    """
    from jaxfl.algorithms.base import _import  # the importer --algorithm module:Class uses

    module_name, _, attribute = reference.rpartition(":")
    try:
        module = _import(module_name)
    except (ImportError, OSError) as error:
        raise ValueError(f"model={reference!r} could not be imported: {error}") from None
    except SyntaxError as error:  # the user's file does not parse: where, in one line
        raise ValueError(f"model={reference!r} could not be imported: {error.msg} at "
                         f"{error.filename}:{error.lineno}") from None
    except Exception as error:  # the user's module raised while it was imported (kept as the cause)
        where = next((f" at {frame.filename}:{frame.lineno}" for frame in
                      reversed(traceback.extract_tb(error.__traceback__))
                      if not frame.filename.startswith("<")), "")
        raise ValueError(f"model={reference!r} could not be imported: importing {module_name!r} raised "
                         f"{type(error).__name__}: {error}{where}") from error
    try:
        return getattr(module, attribute)
    except AttributeError as error:
        raise ValueError(f"model={reference!r} could not be imported: {error}") from None


def register_model(name: str, factory: Callable, inputs: InputSpec | None = None, overwrite: bool = False) -> None:
    """Register a model under ``name`` for ``RunConfig.model``: a linen module class (``factory(num_classes=...)``),
    an ``flax.nnx.Module`` class (``factory(num_classes=..., rngs=...)``), a factory ``rngs -> nnx.Module``,
    or anything else :func:`build_model` accepts.

    Also adds ``name`` to ``jaxfl.config.MODEL_NAMES`` so configs and ``jaxfl run --model`` accept
    it. ``inputs`` (default: anything) lets ``prepare`` reject data of the wrong shape early.

    Example:
        >>> import flax.linen as nn
        >>> class Tiny(nn.Module):
        ...     num_classes: int = 10
        ...     @nn.compact
        ...     def __call__(self, x):
        ...         return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))
        >>> register_model("tiny", Tiny, overwrite=True)
        >>> make_model("tiny", 3).num_classes
        3
    """
    import jaxfl.config as config

    if not isinstance(name, str) or not name or any(c.isspace() or c == "," for c in name):
        raise ValueError(f"model name {name!r} must be a non-empty string without spaces or commas")
    if name in MODELS and not overwrite:
        raise ValueError(f"model {name!r} is already registered; pass overwrite=True to replace it")
    check_model_object(factory, f"model {name!r}")  # a wrong signature fails here, not mid-run
    MODELS[name] = factory
    MODEL_INPUTS[name] = inputs or InputSpec("any")
    if name not in config.MODEL_NAMES:
        config.MODEL_NAMES = tuple(config.MODEL_NAMES) + (name,)


def models_for(input_shape: tuple, kind: str) -> list[str]:
    """Registered models whose input spec accepts samples of ``input_shape`` / ``kind``.

    Example:
        >>> "cnn" in models_for((28, 28, 1), "image"), "cnn" in models_for((32, 32, 3), "image")
        (True, False)
    """
    return [name for name, spec in MODEL_INPUTS.items() if spec.accepts(tuple(input_shape), kind)]


def check_model_input(name: str, input_shape: tuple, kind: str, dataset: str = "the dataset") -> None:
    """Raise ``ValueError`` naming both shapes when model ``name`` is not built for this input.

    Example:
        >>> check_model_input("cnn", (32, 32, 3), "image", "tfds:cifar10")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: model 'cnn' is built for images of shape (28, 28, 1) but dataset 'tfds:cifar10' has image ...
    """
    spec = MODEL_INPUTS.get(name, InputSpec("any"))
    if spec.accepts(tuple(input_shape), kind):
        return
    fits = models_for(input_shape, kind)
    what = {"image": "image", "tokens": "token-id", "features": "feature"}.get(kind, kind)
    # integer (N, L) arrays are read as token ids: feature vectors stored as integers land here
    # floats reach the model as they are: flattened uint8 pixels lose their scaling to 0..1 unless said
    cast = ("; integer arrays of shape (N, L) are read as token ids: for feature vectors pass floats "
            "(x.astype(np.float32)); pixels of uint8 images flattened: x.astype(np.float32) / 255 scales them as "
            "jaxfl scales images, or pass them as images of shape (N, H, W)" if kind == "tokens" and spec.kind != "tokens"
            else "")
    channels_last = (*tuple(input_shape)[1:], tuple(input_shape)[0]) if len(input_shape) == 3 else None
    if kind == "image" and channels_last is not None and spec.accepts(channels_last, kind):
        cast = (f"; your images look channels-first (PyTorch's C, H, W): x.transpose(0, 2, 3, 1) gives this model's "
                f"{channels_last}")
    raise ValueError(f"model {name!r} is built for {spec.describe()} but dataset {dataset!r} has {what} samples of "
                     f"shape {tuple(input_shape)}; models for this data: {', '.join(fits) or 'none registered'}{cast}")


def count_params(params) -> int:
    """Total number of scalars in a parameter pytree (arrays or ``jax.eval_shape`` structs).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> count_params({"w": jnp.zeros((3, 4)), "b": jnp.zeros(4)})
        16
    """
    # Read .shape rather than the data so abstract params from jax.eval_shape count without allocating.
    return int(sum(math.prod(jnp.shape(leaf)) for leaf in jax.tree_util.tree_leaves(params)))
