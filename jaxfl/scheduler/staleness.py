"""Staleness functions st(s), s = τ_g − τ_i ≥ 0: pure math on floats, NumPy or JAX arrays.

They live on the scheduler side (no jax import) because the policies weigh updates in plain
Python; :mod:`jaxfl.kernels.aggregation` re-exports them for use inside jitted JAX code, where
they trace like any other arithmetic.

FedCompass App. E.2 uses ``polynomial`` with α = 0.9, a = 0.5 for every asynchronous method
(including α, so a fresh update is scaled by 0.9). Some released code used ``(s+1)**a``, which
grows with staleness; the paper's negative exponent is used here.
"""
from __future__ import annotations

import functools
import math
import numbers

STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge", "exponential")


def _namespace(*values):
    """NumPy for Python numbers and NumPy arrays, jax.numpy where any value is a JAX array or tracer
    (imported lazily): a parameter traced under jit or vmap beside NumPy staleness values is
    arithmetic NumPy cannot do."""
    if any(type(value).__module__.startswith("jax") for value in values):
        import jax.numpy as jnp

        return jnp
    import numpy as np

    return np


def _checked(s):
    """``s``, refused where it is negative or NaN (a staleness is τ_g − τ_i ≥ 0: (s+1)^(−a) of −2 was a
    complex number, of an array's −2 NaN, and exp(−a·s) of −10 a weight far above α): a number, or
    every value of a NumPy or concrete JAX array; a value traced under ``jit`` or ``vmap`` is taken as
    it is (it has no value until the program runs)."""
    if isinstance(s, numbers.Real) and not isinstance(s, bool):
        if not s >= 0:
            raise ValueError(f"staleness s={s!r} is not allowed: s = τ_g − τ_i >= 0, the global updates since "
                             f"the client's start")
        return s
    if hasattr(s, "shape"):
        import numpy as np

        try:
            values = np.asarray(s)
        except Exception:  # a tracer: jax refuses to make it a NumPy array
            return s
        if values.dtype.kind == "V" and "float" in values.dtype.name:  # bfloat16, float8 (ml_dtypes): kind "V"
            values = values.astype(np.float64)
        if values.dtype.kind in "iuf" and values.size and not np.all(values >= 0):
            bad = values[~(values >= 0)].ravel()[0].item()
            raise ValueError(f"staleness s={bad!r} (in an array of shape {values.shape}) is not allowed: "
                             f"s = τ_g − τ_i >= 0, the global updates since the client's start")
    return s


def _check_parameters(name: str, params: dict) -> None:
    """The ranges of the staleness function ``name``'s parameters: α > 0, a ≥ 0 and the hinge's b ≥ 0,
    all finite (a negative exponent made a weight that grows with staleness, a negative b discounted a
    fresh update). Checked where a parameter is a number; arrays and traced values are taken as they
    are."""
    for key, value in params.items():
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isfinite(value):
            raise ValueError(f"staleness parameter {key} must be a finite real number, got {value!r}")
    known = {key: value for key, value in params.items()
             if isinstance(value, numbers.Real) and not isinstance(value, bool)}
    if known.get("alpha", 1.0) <= 0:
        raise ValueError(f"staleness alpha must be > 0, got {known['alpha']}")
    if name != "constant" and known.get("a", 1.0) < 0:
        what = {"polynomial": "exponent", "hinge": "slope", "exponential": "rate"}[name]
        raise ValueError(f"staleness {name} {what} a must be >= 0, got {known['a']}")
    if name == "hinge" and known.get("b", 0.0) < 0:  # st(0) < α: a fresh update discounted
        raise ValueError(f"staleness hinge threshold b must be >= 0 (the staleness up to which st(s) = alpha), "
                         f"got {known['b']}")


def constant(s, alpha: float = 1.0):
    """st(s) = α for every s (stale updates weigh as much as fresh ones).

    >>> constant(3), constant(0, alpha=0.6), constant(float("inf"))
    (1.0, 0.6, 1.0)
    """
    _checked(s)
    _check_parameters("constant", {"alpha": alpha})
    if isinstance(s, numbers.Number):
        return alpha + 0.0  # a float, as the others give; 0·s would make st(∞) NaN
    return alpha + 0.0 * _namespace(s, alpha).zeros_like(s)  # s's shape, backend and dtype, as the others


def polynomial(s, alpha: float = 0.9, a: float = 0.5):
    """st(s) = α·(s+1)^(−a) (FedAsync; FedCompass App. E.2).

    >>> polynomial(0), polynomial(3), polynomial(3, alpha=1.0, a=1.0)
    (0.9, 0.45, 0.25)
    """
    s = _checked(s)
    _check_parameters("polynomial", {"alpha": alpha, "a": a})
    return alpha * (s + 1.0) ** (-a)


def hinge(s, alpha: float = 1.0, a: float = 10.0, b: float = 4.0):
    """st(s) = α if s ≤ b else α / (a·(s − b) + 1) (FedAsync's hinge).

    >>> float(hinge(4, a=1, b=4)), float(hinge(5, a=1, b=4)), float(hinge(7, alpha=0.5, a=1, b=4))
    (1.0, 0.5, 0.125)
    """
    s = _checked(s)
    _check_parameters("hinge", {"alpha": alpha, "a": a, "b": b})
    xp = _namespace(s, alpha, a, b)
    return alpha / (a * xp.maximum(s - b, 0.0) + 1.0)


def exponential(s, alpha: float = 1.0, a: float = 0.5):
    """st(s) = α·exp(−a·s).

    >>> float(exponential(0)), round(float(exponential(2)), 4), round(float(exponential(1, alpha=0.9, a=1.0)), 4)
    (1.0, 0.3679, 0.3311)
    """
    s = _checked(s)
    _check_parameters("exponential", {"alpha": alpha, "a": a})
    xp = _namespace(s, alpha, a)
    return alpha * xp.exp(-a * (s + 0.0))


_FUNCTIONS = {"constant": constant, "polynomial": polynomial, "hinge": hinge, "exponential": exponential}
_PARAMETERS = {"constant": ("alpha",), "polynomial": ("alpha", "a"), "hinge": ("alpha", "a", "b"),
               "exponential": ("alpha", "a")}


def make_staleness(name: str, **params):
    """The staleness function ``name`` with its parameters bound.

    Parameters are real numbers (Python's or NumPy's, ``np.float32(0.5)`` and 0-d arrays included;
    not bools, nor values traced under ``jit``), finite, with α > 0, a ≥ 0 and the hinge's b ≥ 0.

    >>> st = make_staleness("polynomial", alpha=0.9, a=0.5)
    >>> round(st(3), 4)
    0.45
    >>> import numpy as np
    >>> make_staleness("polynomial", a=np.float32(0.5))(3)
    0.45
    >>> make_staleness("polynomial", alpha=np.array(0.9))(0)
    0.9
    """
    if name not in _FUNCTIONS:
        raise ValueError(f"unknown staleness function {name!r}; allowed: {', '.join(STALENESS_FUNCTIONS)}")
    unknown = set(params) - set(_PARAMETERS[name])
    if unknown:
        raise ValueError(f"staleness {name!r} takes parameters {_PARAMETERS[name]}, got unknown {sorted(unknown)}")
    for key, value in params.items():
        if getattr(value, "shape", None) == () and not isinstance(value, numbers.Number):
            value = _scalar_of(value)  # np.array(0.5), jnp.float32(0.5): as make_server_optimizer takes them
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"staleness parameter {key} must be a finite real number, got {value!r}")
        # NumPy's as Python's (int stays int, so an exponent traces as before under jit)
        params[key] = int(value) if isinstance(value, numbers.Integral) else float(value)
    _check_parameters(name, params)
    return functools.partial(_FUNCTIONS[name], **params)  # picklable, for checkpoints


def _scalar_of(value):
    """The Python number a 0-d array holds (NumPy's or a concrete JAX array's); ``value`` itself where it
    has none to give (a tracer), which the caller then refuses."""
    try:
        return value.item()
    except Exception:  # jax's concretisation error under jit, or an object without item()
        return value


class StalenessWeights(dict):
    """st(s) by staleness s, each computed once (as a float) and looked up after: ``weights[s]``.

    The asynchronous policies (FedAsync, FedBuff, FedCompass) weigh every arrival by st(τ_g − τ_i),
    and the staleness takes few distinct values: a lookup costs a fifth of calling st. A pickle
    keeps only the function (the values are recomputed as they are needed).

    >>> weights = StalenessWeights(make_staleness("polynomial", alpha=0.9, a=0.5))
    >>> weights[3], weights[0], sorted(weights)
    (0.45, 0.9, [0, 3])
    """

    __slots__ = ("staleness",)

    def __init__(self, staleness):
        super().__init__()
        self.staleness = staleness

    def __missing__(self, s: int) -> float:
        weight = self[s] = float(self.staleness(s))
        return weight

    def __reduce__(self):
        return type(self), (self.staleness,)

    def __repr__(self) -> str:
        return f"StalenessWeights({self.staleness!r}, {dict(self)!r})"
