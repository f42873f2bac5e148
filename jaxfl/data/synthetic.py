"""FedProx's synthetic federation: per-client softmax-linear models with known generators.

Li et al. (FedProx, 2020), after Shamir et al.: client ``k`` draws ``u_k ~ N(0, alpha^2)``,
``W_k ~ N(u_k, 1)^{D x K}``, ``b_k ~ N(u_k, 1)^K`` (its model), ``B_k ~ N(0, beta^2)``,
``v_k ~ N(B_k, 1)^D`` (its input mean), and samples ``x ~ N(v_k, Sigma)``, ``Sigma_jj = j^-1.2``,
labelled ``y = argmax(W_k^T x + b_k)``. ``alpha`` controls how much the clients' models differ,
``beta`` how much their inputs differ (as in FedProx's code, both are standard deviations).
``synthetic_iid`` shares one ``(W, b)`` and ``v = 0`` across clients.

Known optimum: every label is produced by its client's ``(W_k, b_k)``, so that model classifies
its own client's data perfectly; in the IID variant the one shared ``(W, b)`` is a global model
with accuracy 1 on every client, the optimum a multinomial logistic regression ("logreg") can
approach. ``generate_synthetic(..., keep_models=True)`` returns the generators for such checks.

Our simplification for scale: client sizes are ``max(min_samples, round(LogNormal))`` with mean
``samples_per_client`` (FedProx: ``LogNormal(4, 2) + 50``, which would be ~45M samples for 10^5
clients); each client's last ``floor(0.2 n_k)`` samples are held out (FedProx: 80/20 per device).
Clients are generated in chunks, so 10^5 clients take a second or two and memory stays at the
size of the samples themselves.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["SyntheticFederation", "generate_synthetic", "load_synthetic", "parse_synthetic_name",
           "SYNTHETIC_DIM", "SYNTHETIC_CLASSES"]

SYNTHETIC_DIM = 60  # D, FedProx
SYNTHETIC_CLASSES = 10  # K, FedProx
_CHUNK = 512  # clients per generation chunk: bounds the (samples, D, K) gather to ~25 MB
_HELD_OUT = 0.2


@dataclasses.dataclass(frozen=True)
class SyntheticFederation:
    """All samples of a synthetic federation, grouped by client (client 0's samples first).

    Example:
        >>> fed = generate_synthetic(4, samples_per_client=10, seed=0)
        >>> fed.x.shape[1], int(fed.client.max())
        (60, 3)
    """

    x: np.ndarray  # (N, D) float32
    y: np.ndarray  # (N,) int32
    client: np.ndarray  # (N,) int64 owner of each sample, non-decreasing
    held_out: np.ndarray  # (N,) bool, the client's last floor(0.2 n_k) samples
    weights: np.ndarray | None  # (C, D, K) float32 generating W_k, if kept
    biases: np.ndarray | None  # (C, K) float32 generating b_k, if kept

    def true_logits(self) -> np.ndarray:
        """``(N, K)`` logits of each sample under its own client's generating model.

        Example:
            >>> fed = generate_synthetic(3, samples_per_client=8, seed=1, keep_models=True)
            >>> bool((fed.true_logits().argmax(1) == fed.y).all())
            True
        """
        if self.weights is None:
            raise ValueError("generated without keep_models=True; the generating models were not kept")
        return np.einsum("nd,ndk->nk", self.x, self.weights[self.client]) + self.biases[self.client]


def parse_synthetic_name(name: str) -> dict:
    """``"synthetic"`` -> alpha = beta = 1; ``"synthetic:A,B"``; ``"synthetic_iid"``.

    Example:
        >>> parse_synthetic_name("synthetic:0.5,0")
        {'alpha': 0.5, 'beta': 0.0, 'iid': False}
    """
    if name == "synthetic":
        return {"alpha": 1.0, "beta": 1.0, "iid": False}
    if name == "synthetic_iid":
        return {"alpha": 0.0, "beta": 0.0, "iid": True}
    body = name[len("synthetic:"):] if name.startswith("synthetic:") else None
    try:
        alpha, beta = (float(v) for v in body.split(","))
    except (AttributeError, ValueError):
        raise ValueError(f"dataset {name!r}: expected 'synthetic', 'synthetic_iid' or 'synthetic:ALPHA,BETA' "
                         "with two numbers >= 0, e.g. 'synthetic:0.5,0.5'") from None
    if not (alpha >= 0 and beta >= 0 and math.isfinite(alpha) and math.isfinite(beta)):
        raise ValueError(f"dataset {name!r}: alpha={alpha} and beta={beta} must be finite numbers >= 0")
    return {"alpha": alpha, "beta": beta, "iid": False}


def _client_sizes(num_clients: int, mean: float, sigma: float, min_samples: int,
                  rng: np.random.Generator) -> np.ndarray:
    draws = rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, num_clients)
    return np.maximum(min_samples, np.round(draws)).astype(np.int64)


def generate_synthetic(num_clients: int, alpha: float = 1.0, beta: float = 1.0, iid: bool = False,
                       samples_per_client: float = 20.0, size_sigma: float = 1.0, min_samples: int = 2,
                       seed: int = 0, keep_models: bool = False) -> SyntheticFederation:
    """Generate the synthetic(alpha, beta) federation (module docstring) with ``num_clients`` clients.

    Example:
        >>> fed = generate_synthetic(100_000, samples_per_client=3, seed=0)  # doctest: +SKIP
        >>> fed.x.nbytes / 2**20  # doctest: +SKIP
        70.5...
    """
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients={num_clients!r} must be an int >= 1")
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}={value} must be a finite number >= 0")
    if not (math.isfinite(samples_per_client) and samples_per_client >= 1):
        raise ValueError(f"samples_per_client={samples_per_client} must be a number >= 1")
    if not (math.isfinite(size_sigma) and size_sigma >= 0):
        raise ValueError(f"size_sigma={size_sigma} must be a finite number >= 0")
    if isinstance(min_samples, bool) or not isinstance(min_samples, (int, np.integer)) or min_samples < 1:
        raise ValueError(f"min_samples={min_samples!r} must be an int >= 1")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E7]))
    sizes = _client_sizes(num_clients, samples_per_client, size_sigma, min_samples, rng)
    scale = np.arange(1, SYNTHETIC_DIM + 1, dtype=np.float64) ** (-1.2 / 2)  # sqrt(Sigma_jj)
    total = int(sizes.sum())
    x = np.empty((total, SYNTHETIC_DIM), np.float32)
    y = np.empty(total, np.int32)
    client = np.repeat(np.arange(num_clients, dtype=np.int64), sizes)
    kept_w = np.empty((num_clients, SYNTHETIC_DIM, SYNTHETIC_CLASSES), np.float32) if keep_models else None
    kept_b = np.empty((num_clients, SYNTHETIC_CLASSES), np.float32) if keep_models else None
    if iid:
        shared_w = rng.normal(0.0, 1.0, (SYNTHETIC_DIM, SYNTHETIC_CLASSES))
        shared_b = rng.normal(0.0, 1.0, SYNTHETIC_CLASSES)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    for first in range(0, num_clients, _CHUNK):
        last = min(first + _CHUNK, num_clients)
        count = last - first
        if iid:
            w = np.broadcast_to(shared_w, (count, SYNTHETIC_DIM, SYNTHETIC_CLASSES))
            b = np.broadcast_to(shared_b, (count, SYNTHETIC_CLASSES))
            v = np.zeros((count, SYNTHETIC_DIM))
        else:
            u = rng.normal(0.0, alpha, count)
            big_b = rng.normal(0.0, beta, count)
            w = rng.normal(u[:, None, None], 1.0, (count, SYNTHETIC_DIM, SYNTHETIC_CLASSES))
            b = rng.normal(u[:, None], 1.0, (count, SYNTHETIC_CLASSES))
            v = rng.normal(big_b[:, None], 1.0, (count, SYNTHETIC_DIM))
        start, stop = offsets[first], offsets[last]
        owner = client[start:stop] - first
        xs = v[owner] + rng.standard_normal((stop - start, SYNTHETIC_DIM)) * scale
        logits = np.einsum("nd,ndk->nk", xs, w[owner]) + b[owner]
        x[start:stop] = xs
        y[start:stop] = logits.argmax(axis=1)
        if keep_models:
            kept_w[first:last], kept_b[first:last] = w, b
    position = np.arange(total) - offsets[client]
    held_out = position >= sizes[client] - np.floor(_HELD_OUT * sizes[client]).astype(np.int64)
    return SyntheticFederation(x, y, client, held_out, kept_w, kept_b)


def load_synthetic(num_clients: int | None = None, alpha: float = 1.0, beta: float = 1.0, iid: bool = False,
                   samples_per_client: float = 20.0, size_sigma: float = 1.0, seed: int = 0):
    """The synthetic federation as a :class:`~jaxfl.data.datasets.Dataset` with ``train_groups``.

    Train: every client's first ``n_k - floor(0.2 n_k)`` samples; held out: the rest, pooled.
    Use ``partition="natural"`` with ``num_clients`` clients to keep the generated clients.

    Example:
        >>> ds = load_synthetic(num_clients=5, seed=0)
        >>> ds.kind, ds.num_classes, len(set(ds.train_groups.tolist()))
        ('features', 10, 5)
    """
    from jaxfl.data.datasets import dataset_from_arrays

    if num_clients is None:
        raise ValueError("synthetic datasets need num_clients (the number of generated clients)")
    fed = generate_synthetic(num_clients, alpha, beta, iid, samples_per_client, size_sigma, seed=seed)
    train = ~fed.held_out
    name = "synthetic_iid" if iid else f"synthetic:{alpha:g},{beta:g}"
    return dataset_from_arrays(name, fed.x[train], fed.y[train], fed.x[fed.held_out], fed.y[fed.held_out],
                               num_classes=SYNTHETIC_CLASSES, groups=fed.client[train], source=name)
