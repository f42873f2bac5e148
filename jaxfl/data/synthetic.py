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
Clients are generated in chunks of 512, and :func:`load_synthetic` writes the training and
held-out samples straight into their own arrays, so memory stays at the size of the samples
themselves (~3.9 GB of float32 for 10^6 clients x 20 samples). Time is the normal draws: 600
per client (``W_k``) and 60 per sample, ~1.8e9 for 10^6 clients x 20 samples, tens of seconds
on one core however the rest is arranged; the draws are fixed by the seed, so a federation is
the same whichever version of this code generated it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxfl._devices import aligned_empty

__all__ = ["SyntheticFederation", "generate_synthetic", "load_synthetic", "parse_synthetic_name",
           "SYNTHETIC_DIM", "SYNTHETIC_CLASSES"]

SYNTHETIC_DIM = 60  # D, FedProx
SYNTHETIC_CLASSES = 10  # K, FedProx
_CHUNK = 512  # clients per generation chunk: bounds the (samples, D, K) gather to ~25 MB
_HELD_OUT = 0.2
_MIN_SAMPLES = 2  # generate_synthetic's default, which load_synthetic (and so every run) uses


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
                       samples_per_client: float = 20.0, size_sigma: float = 1.0, min_samples: int = _MIN_SAMPLES,
                       seed: int = 0, keep_models: bool = False) -> SyntheticFederation:
    """Generate the synthetic(alpha, beta) federation (module docstring) with ``num_clients`` clients.

    Example:
        >>> fed = generate_synthetic(100_000, samples_per_client=3, seed=0)  # doctest: +SKIP
        >>> fed.x.nbytes / 2**20  # doctest: +SKIP
        70.5...
    """
    sizes, x, y, kept_w, kept_b = _generate(num_clients, alpha, beta, iid, samples_per_client, size_sigma,
                                            min_samples, seed, keep_models, split=False)
    client = np.repeat(np.arange(num_clients, dtype=np.int64), sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    position = np.arange(len(client)) - offsets[client]
    held_out = position >= sizes[client] - np.floor(_HELD_OUT * sizes[client]).astype(np.int64)
    return SyntheticFederation(x, y, client, held_out, kept_w, kept_b)


# Rows per logits block: the per-row (D, K) float64 models gathered for a block stay ~2.5 MB, in
# cache, instead of ~50 MB per generation chunk.
_ROWS = 512


def _generate(num_clients, alpha, beta, iid, samples_per_client, size_sigma, min_samples, seed, keep_models,
              split):
    """``(sizes, x, y, W, b)``; with ``split``, ``x``/``y`` are ``((x_train, x_held), (y_train, y_held))``.

    The draws (one generator, chunk by chunk) and the float64 arithmetic are those of the original
    one-pass version, so every sample and label is unchanged; only where results are written
    differs. ``split`` writes each client's first ``n_k - floor(0.2 n_k)`` samples straight into
    the training arrays and the rest into the pooled held-out arrays, so no full-size array is
    made and then copied through a mask (at 10^6 clients that copy is gigabytes).
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
    rng = _stream(seed)
    sizes = _client_sizes(num_clients, samples_per_client, size_sigma, min_samples, rng)
    scale = np.arange(1, SYNTHETIC_DIM + 1, dtype=np.float64) ** (-1.2 / 2)  # sqrt(Sigma_jj)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    def buffers(total):  # aligned so that CPU devices use them without a copy (jaxfl._devices)
        return aligned_empty((int(total), SYNTHETIC_DIM), np.float32), aligned_empty(int(total), np.int32)

    if split:
        held = np.floor(_HELD_OUT * sizes).astype(np.int64)
        train_offsets = np.concatenate([[0], np.cumsum(sizes - held)])
        held_offsets = np.concatenate([[0], np.cumsum(held)])
        (train_x, train_y), (held_x, held_y) = buffers(train_offsets[-1]), buffers(held_offsets[-1])
    else:
        x, y = buffers(offsets[-1])
    kept_w = np.empty((num_clients, SYNTHETIC_DIM, SYNTHETIC_CLASSES), np.float32) if keep_models else None
    kept_b = np.empty((num_clients, SYNTHETIC_CLASSES), np.float32) if keep_models else None
    if iid:
        shared_w = rng.normal(0.0, 1.0, (SYNTHETIC_DIM, SYNTHETIC_CLASSES))
        shared_b = rng.normal(0.0, 1.0, SYNTHETIC_CLASSES)
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
            # normal(loc, 1.0) is loc + 1.0 * z with z standard normal, drawn in C order: the same
            # values as standard_normal + loc, without numpy's per-element broadcasting (3x slower).
            w = rng.standard_normal((count, SYNTHETIC_DIM, SYNTHETIC_CLASSES))
            w += u[:, None, None]
            b = rng.standard_normal((count, SYNTHETIC_CLASSES))
            b += u[:, None]
            v = rng.standard_normal((count, SYNTHETIC_DIM))
            v += big_b[:, None]
        start, stop = offsets[first], offsets[last]
        owner = np.repeat(np.arange(count), sizes[first:last])
        xs = rng.standard_normal((stop - start, SYNTHETIC_DIM))
        xs *= scale
        xs += v[owner]  # = v[owner] + z * scale, as before (addition commutes exactly)
        labels = np.empty(stop - start, np.int32)
        for row in range(0, stop - start, _ROWS):
            rows = slice(row, min(row + _ROWS, stop - start))
            # Row by row the same einsum (a sum over d in order) as on the whole chunk; a shared
            # (iid) model is read through its broadcast view instead of being copied per row.
            models = np.broadcast_to(shared_w, (rows.stop - row,) + shared_w.shape) if iid else w[owner[rows]]
            logits = np.einsum("nd,ndk->nk", xs[rows], models) + b[owner[rows]]
            labels[rows] = logits.argmax(axis=1)
        if split:
            local = np.arange(stop - start) - (offsets[first:last] - start)[owner]
            is_held = local >= (sizes[first:last] - held[first:last])[owner]
            rows = slice(train_offsets[first], train_offsets[last])
            train_x[rows], train_y[rows] = xs[~is_held], labels[~is_held]
            rows = slice(held_offsets[first], held_offsets[last])
            held_x[rows], held_y[rows] = xs[is_held], labels[is_held]
        else:
            x[start:stop], y[start:stop] = xs, labels
        if keep_models:
            kept_w[first:last], kept_b[first:last] = w, b
    if split:
        return sizes, (train_x, held_x), (train_y, held_y), kept_w, kept_b
    return sizes, x, y, kept_w, kept_b


def synthetic_name(alpha: float, beta: float, iid: bool) -> str:
    """The dataset name of a synthetic federation (the inverse of :func:`parse_synthetic_name`).

    >>> synthetic_name(0.5, 0.5, False), synthetic_name(1.0, 1.0, True)
    ('synthetic:0.5,0.5', 'synthetic_iid')
    """
    return "synthetic_iid" if iid else f"synthetic:{alpha:g},{beta:g}"


def _stream(seed: int) -> np.random.Generator:
    """The generator's one stream: client sizes first, then the clients' models and samples."""
    return np.random.default_rng(np.random.SeedSequence([seed, 0x5E7]))


def _train_counts(sizes: np.ndarray) -> np.ndarray:
    return sizes - np.floor(_HELD_OUT * sizes).astype(np.int64)


def synthetic_train_counts(num_clients: int, samples_per_client: float = 20.0, size_sigma: float = 1.0,
                           seed: int = 0) -> np.ndarray:
    """Per-client training-sample counts of :func:`load_synthetic`'s federation (same defaults),
    without generating it: the stream draws the sizes before anything else, so they are exact.
    A timing-only run needs these only (for p_i); at 10^6 clients they take a tenth of a second
    where the samples take a minute and 4 GB.

    Example:
        >>> counts = synthetic_train_counts(5)
        >>> bool((counts == np.bincount(load_synthetic(num_clients=5).train_groups)).all())
        True
    """
    return _train_counts(_client_sizes(num_clients, samples_per_client, size_sigma, _MIN_SAMPLES, _stream(seed)))


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
    sizes, (x_train, x_held), (y_train, y_held), _, _ = _generate(
        num_clients, alpha, beta, iid, samples_per_client, size_sigma, _MIN_SAMPLES, seed, keep_models=False, split=True)
    groups = np.repeat(np.arange(num_clients, dtype=np.int64), _train_counts(sizes))
    name = synthetic_name(alpha, beta, iid)
    return dataset_from_arrays(name, x_train, y_train, x_held, y_held, num_classes=SYNTHETIC_CLASSES,
                               groups=groups, source=name)
