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
themselves (~3.9 GB of float32 for 10^6 clients x 20 samples). The labels come from BLAS
products, rows whose two largest logits lie within rounding relabelled by the exact einsum, so
they are those of the exact computation. Time is then mostly the normal draws from the one
stream: 60 per sample (and 600 per client ``W_k`` unless IID), 1.2e9 for 10^6 IID clients x 20
samples, ~12 ns each on the development CPU, one core; the draws are fixed by the seed, so a
federation is the same whichever version of this code generated it.

The parallel variant (names ending in ``+parallel``: ``synthetic:iid+parallel``,
``synthetic:A,B+parallel``; ``parallel=True``) draws the same client sizes (and the IID variant's
shared model) from that stream, then each block of 4,096 clients from its own stream
(``SeedSequence`` children of the seed), the blocks on every usable core: another sample of the same
distribution, not the arrays of the name without ``+parallel``, and the same arrays for a seed
whatever the number of cores.
"""

from __future__ import annotations

import dataclasses
import math
import mmap

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
    """``"synthetic"`` -> alpha = beta = 1; ``"synthetic:A,B"``; ``"synthetic_iid"``; with ``+parallel``
    (``"synthetic:A,B+parallel"``, ``"synthetic:iid+parallel"``), the parallel variant (module docstring).

    Example:
        >>> parse_synthetic_name("synthetic:0.5,0")
        {'alpha': 0.5, 'beta': 0.0, 'iid': False}
        >>> parse_synthetic_name("synthetic:iid+parallel")
        {'alpha': 0.0, 'beta': 0.0, 'iid': True, 'parallel': True}
    """
    if name == "synthetic":
        return {"alpha": 1.0, "beta": 1.0, "iid": False}
    if name == "synthetic_iid":
        return {"alpha": 0.0, "beta": 0.0, "iid": True}
    body = name[len("synthetic:"):] if name.startswith("synthetic:") else None
    parallel = body is not None and body.endswith(_PARALLEL)
    if parallel:
        body = body[:-len(_PARALLEL)]
        if body == "iid":
            return {"alpha": 0.0, "beta": 0.0, "iid": True, "parallel": True}
    try:
        alpha, beta = (float(v) for v in body.split(","))
    except (AttributeError, ValueError):
        raise ValueError(f"dataset {name!r}: expected 'synthetic', 'synthetic_iid' or 'synthetic:ALPHA,BETA' "
                         "with two numbers >= 0, e.g. 'synthetic:0.5,0.5' (or 'synthetic:ALPHA,BETA+parallel', "
                         "'synthetic:iid+parallel')") from None
    if not (alpha >= 0 and beta >= 0 and math.isfinite(alpha) and math.isfinite(beta)):
        raise ValueError(f"dataset {name!r}: alpha={alpha} and beta={beta} must be finite numbers >= 0")
    return {"alpha": alpha, "beta": beta, "iid": False, **({"parallel": True} if parallel else {})}


_PARALLEL = "+parallel"


def _client_sizes(num_clients: int, mean: float, sigma: float, min_samples: int,
                  rng: np.random.Generator) -> np.ndarray:
    draws = rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, num_clients)
    return np.maximum(min_samples, np.round(draws)).astype(np.int64)


def generate_synthetic(num_clients: int, alpha: float = 1.0, beta: float = 1.0, iid: bool = False,
                       samples_per_client: float = 20.0, size_sigma: float = 1.0, min_samples: int = _MIN_SAMPLES,
                       seed: int = 0, keep_models: bool = False, parallel: bool = False) -> SyntheticFederation:
    """Generate the synthetic(alpha, beta) federation (module docstring) with ``num_clients`` clients
    (``parallel``: the parallel variant, another sample of the same distribution).

    Example:
        >>> fed = generate_synthetic(100_000, samples_per_client=3, seed=0)  # doctest: +SKIP
        >>> fed.x.nbytes / 2**20  # doctest: +SKIP
        70.5...
    """
    sizes, x, y, kept_w, kept_b = _generate(num_clients, alpha, beta, iid, samples_per_client, size_sigma,
                                            min_samples, seed, keep_models, split=False, parallel=parallel)
    client = np.repeat(np.arange(num_clients, dtype=np.int64), sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    position = np.arange(len(client)) - offsets[client]
    held_out = position >= sizes[client] - np.floor(_HELD_OUT * sizes[client]).astype(np.int64)
    return SyntheticFederation(x, y, client, held_out, kept_w, kept_b)


# Rows per logits block: the layout of the exact labelling (see _exact_labels), and a block size at
# which the BLAS product stays on one thread and in cache.
_ROWS = 512
# A label is taken from the fast product unless its top two logits are within this fraction of a
# bound on the terms' magnitudes: two float64 sums of 61 terms differ by at most ~2.7e-14 of it.
_TIE_TOLERANCE = 1e-12


def _generate(num_clients, alpha, beta, iid, samples_per_client, size_sigma, min_samples, seed, keep_models,
              split, parallel=False, workers=None):
    """``(sizes, x, y, W, b)``; with ``split``, ``x``/``y`` are ``((x_train, x_held), (y_train, y_held))``.

    The draws (one generator, chunk by chunk) and the float64 arithmetic are those of the original
    one-pass version, so every sample and label is unchanged; only where results are written
    differs. ``split`` writes each client's first ``n_k - floor(0.2 n_k)`` samples straight into
    the training arrays and the rest into the pooled held-out arrays, so no full-size array is
    made and then copied through a mask (at 10^6 clients that copy is gigabytes).

    ``parallel``: the sizes (and the IID variant's shared model) as above, then each block of
    ``_BLOCK`` clients from its own stream, the blocks on ``workers`` threads (default: every usable
    core); the same arrays whatever the number of threads.
    """
    _check_generation(num_clients, alpha, beta, samples_per_client, size_sigma, min_samples)
    rng = _stream(seed)
    sizes = _client_sizes(num_clients, samples_per_client, size_sigma, min_samples, rng)
    held = np.floor(_HELD_OUT * sizes).astype(np.int64) if split else np.zeros_like(sizes)
    out = _Outputs(sizes, held, split, num_clients if keep_models else 0)
    shared = None
    if iid:
        shared = (rng.normal(0.0, 1.0, (SYNTHETIC_DIM, SYNTHETIC_CLASSES)), rng.normal(0.0, 1.0, SYNTHETIC_CLASSES))

    def clients(stream, first, last):
        for start in range(first, last, _CHUNK):
            _generate_chunk(stream, start, min(start + _CHUNK, last), alpha, beta, shared, out)

    if not parallel:
        clients(rng, 0, num_clients)
        return out.result()
    from concurrent.futures import ThreadPoolExecutor

    from jaxfl._devices import usable_cores

    def block(index):  # numpy releases the GIL while it draws and computes: the blocks run side by side
        stream = np.random.default_rng(np.random.SeedSequence([seed, _STREAM_WORD], spawn_key=(index,)))
        clients(stream, index * _BLOCK, min((index + 1) * _BLOCK, num_clients))

    with ThreadPoolExecutor(max_workers=workers or usable_cores()) as pool:
        list(pool.map(block, range(-(-num_clients // _BLOCK))))
    return out.result()


_SCALE = np.arange(1, SYNTHETIC_DIM + 1, dtype=np.float64) ** (-1.2 / 2)  # sqrt(Sigma_jj)
_BLOCK = 4096  # clients per stream of the parallel variant (fixed: it defines the sample)


def _generate_chunk(rng: np.random.Generator, first: int, last: int, alpha: float, beta: float,
                    shared: tuple | None, out: _Outputs) -> None:
    """Clients ``first..last-1`` (at most ``_CHUNK``) drawn from ``rng`` and written into ``out``."""
    count = last - first
    sizes = out.sizes[first:last]
    if shared is not None:
        w, b = shared
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
    xs = rng.standard_normal((int(sizes.sum()), SYNTHETIC_DIM))
    xs *= _SCALE
    if shared is None:
        xs += np.repeat(v, sizes, axis=0)  # = v[owner] + z * scale (addition commutes exactly)
    labels = _labels(xs, sizes, w, b)
    # The IID inputs are z * scale + 0 (v = 0): adding the zero keeps a drawn -0.0 a +0.0, as before.
    out.write(first, last, xs, labels, 0.0 if shared is not None else None)
    if out.weights is not None:
        out.keep_models(first, last, w, b)


def _check_generation(num_clients, alpha, beta, samples_per_client, size_sigma, min_samples) -> None:
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


class _Outputs:
    """The float32 sample and int32 label arrays of a generation, written chunk by chunk: with
    ``split``, each client's first ``n_k - held_k`` samples into the training arrays and the rest
    into the pooled held-out ones; the clients' generating models when ``kept`` > 0."""

    def __init__(self, sizes: np.ndarray, held: np.ndarray, split: bool, kept: int):
        def buffers(total):
            return _mapped_empty((int(total), SYNTHETIC_DIM), np.float32), _mapped_empty(int(total), np.int32)

        self.sizes, self.held, self.split = sizes, held, split
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])
        self.train_offsets = np.concatenate([[0], np.cumsum(sizes - held)])
        self.held_offsets = np.concatenate([[0], np.cumsum(held)])
        self.train = buffers(self.train_offsets[-1])
        self.held_out = buffers(self.held_offsets[-1]) if split else None
        self.weights = np.empty((kept, SYNTHETIC_DIM, SYNTHETIC_CLASSES), np.float32) if kept else None
        self.biases = np.empty((kept, SYNTHETIC_CLASSES), np.float32) if kept else None

    def write(self, first: int, last: int, xs: np.ndarray, labels: np.ndarray, add: float | None) -> None:
        """Clients ``first..last-1``'s float64 samples ``xs`` (+ ``add``) and labels, as float32 / int32."""
        x, y = self.train
        if not self.split:
            _store(x[self.offsets[first]:self.offsets[last]], xs, add)
            y[self.offsets[first]:self.offsets[last]] = labels
            return
        sizes, held = self.sizes[first:last], self.held[first:last]
        local = np.arange(len(xs)) - np.repeat(self.offsets[first:last] - self.offsets[first], sizes)
        is_held = local >= np.repeat(sizes - held, sizes)
        rows = slice(self.train_offsets[first], self.train_offsets[last])
        _store(x[rows], xs[~is_held], add)
        y[rows] = labels[~is_held]
        held_x, held_y = self.held_out
        rows = slice(self.held_offsets[first], self.held_offsets[last])
        _store(held_x[rows], xs[is_held], add)
        held_y[rows] = labels[is_held]

    def keep_models(self, first: int, last: int, w: np.ndarray, b: np.ndarray) -> None:
        self.weights[first:last], self.biases[first:last] = w, b

    def result(self):
        if self.split:
            return (self.sizes, (self.train[0], self.held_out[0]), (self.train[1], self.held_out[1]),
                    self.weights, self.biases)
        return self.sizes, self.train[0], self.train[1], self.weights, self.biases


def _mapped_empty(shape, dtype) -> np.ndarray:
    """An uninitialised array whose pages the kernel maps in one call (``MAP_POPULATE``), page-aligned
    so that CPU devices use it without a copy (:func:`jaxfl._devices.place_read_only`).

    Every page of the samples is written once; faulting them in one by one as they are first written
    cost ~2 s of CPU per GB on the development VM, about 4x the populated mapping (10^6 clients:
    4.8 GB of samples). Small arrays, and systems without ``MAP_POPULATE``, use ``aligned_empty``.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    populate = getattr(mmap, "MAP_POPULATE", None)
    if populate is None or nbytes < _MAPPED_BYTES:
        return aligned_empty(shape, dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    return np.frombuffer(region, dtype).reshape(shape)


_MAPPED_BYTES = 1 << 24  # below 16 MB the allocator's own pages are cheaper than a mapping


def _store(target: np.ndarray, values: np.ndarray, add: float | None) -> None:
    if add is None:
        target[...] = values
    else:
        np.add(values, add, out=target, casting="same_kind")  # in float64, rounded once to float32


def _labels(xs: np.ndarray, sizes: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmax(W_k^T x + b_k)`` of a chunk's samples (float64), equal to :func:`_exact_labels`.

    The logits come from BLAS products (one per block of rows for a shared model, one batched product
    per client size otherwise), whose sums run in another order than the exact einsum's: a label can
    only differ where its two largest logits are within the rounding of those sums, so rows that
    close are labelled again by the exact computation (at 10^6 clients, usually none).
    """
    shared = w.ndim == 2
    logits = np.empty((len(xs), SYNTHETIC_CLASSES))
    if shared:
        for row in range(0, len(xs), _ROWS):
            np.matmul(xs[row:row + _ROWS], w, out=logits[row:row + _ROWS])
        logits += b
    else:
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        order = np.argsort(sizes, kind="stable")
        edges = np.flatnonzero(np.diff(sizes[order])) + 1
        for clients in np.split(order, edges):  # clients of one size: one (k, n, D) @ (k, D, K) product
            rows = starts[clients][:, None] + np.arange(sizes[clients[0]])
            logits[rows] = np.matmul(xs[rows], w[clients]) + b[clients][:, None, :]
    labels = logits.argmax(axis=1).astype(np.int32)
    top_two = np.partition(logits, SYNTHETIC_CLASSES - 2, axis=1)[:, -2:]
    # One bound for the chunk on every row's sum of |x_d w_dk| + |b_k| (two reductions, no |xs| copy)
    bound = SYNTHETIC_DIM * max(xs.max(), -xs.min()) * max(w.max(), -w.min()) + max(b.max(), -b.min())
    close = np.flatnonzero(top_two[:, 1] - top_two[:, 0] <= _TIE_TOLERANCE * bound)
    if close.size:
        owner = np.repeat(np.arange(len(sizes)), sizes)  # once for the chunk, not per block relabelled
        for block in np.unique(close // _ROWS):
            rows = slice(block * _ROWS, min((block + 1) * _ROWS, len(xs)))
            labels[rows] = _exact_labels(xs[rows], owner[rows], w, b)
    return labels


def _exact_labels(xs: np.ndarray, owner: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The labels of one block of rows as the generator has always computed them (the reference)."""
    if w.ndim == 2:  # a shared (iid) model, read through its broadcast view instead of copied per row
        logits = np.einsum("nd,ndk->nk", xs, np.broadcast_to(w, (len(xs),) + w.shape)) + b
    else:
        logits = np.einsum("nd,ndk->nk", xs, w[owner]) + b[owner]
    return logits.argmax(axis=1)


def synthetic_name(alpha: float, beta: float, iid: bool, parallel: bool = False) -> str:
    """The dataset name of a synthetic federation (the inverse of :func:`parse_synthetic_name`).

    >>> synthetic_name(0.5, 0.5, False), synthetic_name(1.0, 1.0, True), synthetic_name(0, 0, True, parallel=True)
    ('synthetic:0.5,0.5', 'synthetic_iid', 'synthetic:iid+parallel')
    """
    if parallel:
        return "synthetic:" + ("iid" if iid else f"{alpha:g},{beta:g}") + _PARALLEL
    return "synthetic_iid" if iid else f"synthetic:{alpha:g},{beta:g}"


_STREAM_WORD = 0x5E7


def _stream(seed: int) -> np.random.Generator:
    """The generator's one stream: client sizes first, then the clients' models and samples."""
    return np.random.default_rng(np.random.SeedSequence([seed, _STREAM_WORD]))


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
                   samples_per_client: float = 20.0, size_sigma: float = 1.0, seed: int = 0, parallel: bool = False):
    """The synthetic federation as a :class:`~jaxfl.data.datasets.Dataset` with ``train_groups``.

    Train: every client's first ``n_k - floor(0.2 n_k)`` samples; held out: the rest, pooled.
    Use ``partition="natural"`` with ``num_clients`` clients to keep the generated clients.
    ``parallel``: the parallel variant (module docstring; the dataset names ending in ``+parallel``).

    Example:
        >>> ds = load_synthetic(num_clients=5, seed=0)
        >>> ds.kind, ds.num_classes, len(set(ds.train_groups.tolist()))
        ('features', 10, 5)
    """
    from jaxfl.data.datasets import dataset_from_arrays

    if num_clients is None:
        raise ValueError("synthetic datasets need num_clients (the number of generated clients)")
    sizes, (x_train, x_held), (y_train, y_held), _, _ = _generate(
        num_clients, alpha, beta, iid, samples_per_client, size_sigma, _MIN_SAMPLES, seed, keep_models=False, split=True,
        parallel=parallel)
    groups = np.repeat(np.arange(num_clients, dtype=np.int64), _train_counts(sizes))
    name = synthetic_name(alpha, beta, iid, parallel)
    return dataset_from_arrays(name, x_train, y_train, x_held, y_held, num_classes=SYNTHETIC_CLASSES,
                               groups=groups, source=name)
