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
- ``textcnn``: Kim-style TextCNN (FedASMU's IMDb model), token ids (L >= 5);
- ``lstm``: embedding + one LSTM layer, token ids.

Bring your own Flax model with one call, ``register_model("mynet", MyNet)``, then run it by name like
the built-in ones: a linen module class (``MyNet(num_classes=...)`` builds it) or an nnx module class
(``MyNet(num_classes=..., rngs=...)``; it reaches the kernel through ``ModelAdapter.from_nnx``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp

from jaxfl.models.cnn import MLP, CCFedAvgCNN, CCFedAvgMLP, ExampleCNN, FedASMUCNN, LeNet5, LogReg, MnistCNN
from jaxfl.models.resnet import ResNet18, ResNet18GN
from jaxfl.models.text import LSTMClassifier, TextCNN

__all__ = ["InputSpec", "MODELS", "MODEL_INPUTS", "TEXT_MODELS", "make_model", "register_model", "check_model_input",
           "models_for", "count_params"]


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
    "textcnn": InputSpec("tokens", min_size=5),
    "lstm": InputSpec("tokens"),
}
TEXT_MODELS = ("textcnn", "lstm")  # take vocab_size


def make_model(name: str, num_classes: int, vocab_size: int | None = None):
    """Build a model by name from ``MODELS``; ``vocab_size`` is used by the text models only.

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
    options = {"num_classes": num_classes}
    if vocab_size is not None and name in TEXT_MODELS:
        options["vocab_size"] = int(vocab_size)
    if _is_nnx_class(factory):  # nnx modules are built with their RNGs: adapt the constructor
        from jaxfl.models.adapter import ModelAdapter

        return ModelAdapter.from_nnx(lambda rngs: factory(**options, rngs=rngs))
    return factory(**options)


def _is_nnx_class(factory) -> bool:
    from flax import nnx

    return isinstance(factory, type) and issubclass(factory, nnx.Module)


def register_model(name: str, factory: Callable, inputs: InputSpec | None = None, overwrite: bool = False) -> None:
    """Register a model under ``name`` for ``RunConfig.model``: ``factory(num_classes=...) -> flax.linen.Module``
    (e.g. a linen module class), or an ``flax.nnx.Module`` class built as ``factory(num_classes=..., rngs=...)``.

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
    if not callable(factory):
        raise ValueError(f"factory for {name!r} must be callable as factory(num_classes=...), got {factory!r}")
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
    raise ValueError(f"model {name!r} is built for {spec.describe()} but dataset {dataset!r} has {what} samples of "
                     f"shape {tuple(input_shape)}; models for this data: {', '.join(fits) or 'none registered'}")


def count_params(params) -> int:
    """Total number of scalars in a parameter pytree (arrays or ``jax.eval_shape`` structs).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> count_params({"w": jnp.zeros((3, 4)), "b": jnp.zeros(4)})
        16
    """
    # Read .shape rather than the data so abstract params from jax.eval_shape count without allocating.
    return int(sum(math.prod(jnp.shape(leaf)) for leaf in jax.tree_util.tree_leaves(params)))
