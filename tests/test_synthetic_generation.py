"""FedProx's synthetic federation is generated fast and stays the same arrays for the same seed.

The digests below were taken from the generator before its fast path (commit dd5f55a: one einsum
per block of rows for the labels, fresh pages written one by one): 3 clients (one chunk) and 1,300
(three chunks of 512 clients, so chunking is crossed), training and held-out splits, and the kept
generating models. Any change in the draws, the float64 arithmetic, the labels or the layout
changes a digest.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from jaxfl.data.synthetic import (
    SYNTHETIC_CLASSES,
    SYNTHETIC_DIM,
    _exact_labels,
    _generate,
    _labels,
    generate_synthetic,
    load_synthetic,
)


def digest(*arrays: np.ndarray) -> str:
    hasher = hashlib.sha256()
    for array in arrays:
        hasher.update(str(array.dtype).encode())
        hasher.update(str(array.shape).encode())
        hasher.update(np.ascontiguousarray(array).tobytes())
    return hasher.hexdigest()[:16]


VARIANTS = {"iid": {"iid": True}, "1,1": {"alpha": 1.0, "beta": 1.0}, "0.5,0": {"alpha": 0.5, "beta": 0.0}}
BEFORE = {  # (variant, clients) -> (load_synthetic digest, generate_synthetic(seed=3, keep_models) digest)
    ("iid", 3): ("44ab25886844596f", "ac058dc7cfbb2eb6"),
    ("1,1", 3): ("af4f7157b4e99b4c", "e43c4ff6fd1814ed"),
    ("0.5,0", 3): ("a42332d2faf2c8be", "d187558ac703f2df"),
    ("iid", 1300): ("9273ef3c287a87bc", "d502ae889e7855da"),
    ("1,1", 1300): ("f292f6b2ff208d06", "df75f50713fd1d89"),
    ("0.5,0", 1300): ("d98187512f3d2d03", "94f33d7a5508dd4e"),
}


@pytest.mark.parametrize("variant, clients", sorted(BEFORE))
def test_same_arrays_as_the_generator_before(variant, clients):
    loaded = load_synthetic(num_clients=clients, **VARIANTS[variant])
    generated = generate_synthetic(clients, seed=3, keep_models=True, **VARIANTS[variant])
    assert (digest(loaded.train_x, loaded.train_y, loaded.test_x, loaded.test_y, loaded.train_groups),
            digest(generated.x, generated.y, generated.client, generated.held_out, generated.weights,
                   generated.biases)) == BEFORE[variant, clients]


@pytest.mark.parametrize("shared", [True, False])
def test_near_ties_are_labelled_by_the_exact_computation(shared):
    # Column 7 of every model is column 2 changed in its last bits: the two logits differ by less than
    # the rounding of a 60-term sum, so the BLAS product and the exact einsum rank them differently on
    # many rows (160-180 of 3,644 here); those rows must get the exact einsum's label.
    rng = np.random.default_rng(0)
    sizes = np.array([3, 600, 1, 40, 1000, 2000])
    xs = rng.standard_normal((sizes.sum(), SYNTHETIC_DIM))
    w = rng.standard_normal((SYNTHETIC_DIM, SYNTHETIC_CLASSES) if shared else (len(sizes), SYNTHETIC_DIM,
                                                                                SYNTHETIC_CLASSES))
    b = rng.standard_normal(w.shape[:-2] + (SYNTHETIC_CLASSES,))
    w[..., 2] *= 4.0  # dominant, so that the near-tied pair often holds the maximum
    b[..., 2] = b[..., 7] = 0.0
    w[..., 7] = w[..., 2] * (1 + 1e-16) + 1e-16 * rng.standard_normal(w[..., 2].shape)
    owner = np.repeat(np.arange(len(sizes)), sizes)
    expected = np.concatenate([_exact_labels(xs[row:row + 512], owner[row:row + 512], w, b)
                               for row in range(0, len(xs), 512)])
    fast = np.concatenate([(xs[owner == c] @ (w if shared else w[c]) + (b if shared else b[c])).argmax(axis=1)
                           for c in range(len(sizes))])
    assert (fast != expected).sum() > 50  # the case this test is about does occur
    np.testing.assert_array_equal(_labels(xs, sizes, w, b), expected)


# --------------------------------------------------------------------------- the parallel variant


def test_the_parallel_variant_is_one_sample_whatever_the_number_of_threads():
    # 9,000 clients: three blocks of 4,096 clients, each from its own stream
    arrays = [_generate(9000, 0.5, 0.5, False, 4.0, 1.0, 2, 7, True, True, parallel=True, workers=workers)
              for workers in (1, 3)]
    (sizes, (x, held_x), (y, held_y), w, b), again = arrays
    assert digest(x, held_x, y, held_y, w, b) == digest(*again[1], *again[2], again[3], again[4])
    reference = _generate(9000, 0.5, 0.5, False, 4.0, 1.0, 2, 7, True, True)
    np.testing.assert_array_equal(sizes, reference[0])  # the same clients' sizes (drawn first, from one stream)
    assert x.shape == reference[1][0].shape and not np.array_equal(x, reference[1][0])  # another sample


def test_the_parallel_variant_labels_by_each_clients_model_and_keeps_the_shared_one():
    fed = generate_synthetic(5000, alpha=1.0, beta=1.0, samples_per_client=3, seed=1, keep_models=True,
                             parallel=True)
    np.testing.assert_array_equal(fed.true_logits().argmax(axis=1), fed.y)
    iid = generate_synthetic(5000, iid=True, samples_per_client=3, seed=1, keep_models=True, parallel=True)
    reference = generate_synthetic(5000, iid=True, samples_per_client=3, seed=1, keep_models=True)
    np.testing.assert_array_equal(iid.weights[0], reference.weights[0])  # the same global optimum
    np.testing.assert_array_equal(iid.true_logits().argmax(axis=1), iid.y)
    assert np.bincount(iid.y, minlength=SYNTHETIC_CLASSES).tolist() != np.bincount(
        reference.y, minlength=SYNTHETIC_CLASSES).tolist()


def test_the_parallel_variant_by_name_in_a_run_config():
    from jaxfl.config import RunConfig
    from jaxfl.experiment import build_data

    dataset, federation = build_data(RunConfig(dataset="synthetic:iid+parallel", partition="natural", clients=50,
                                               model="logreg"))
    assert dataset.name == "synthetic:iid+parallel" and federation.num_clients == 50
    # the clients' sizes of synthetic_iid (what a timing-only run of this name reads without generating)
    np.testing.assert_array_equal(federation.counts, np.bincount(load_synthetic(num_clients=50, iid=True).train_groups))
    with pytest.raises(ValueError, match=r"'synthetic:1\+parallel': expected"):
        build_data(RunConfig(dataset="synthetic:1+parallel", partition="natural", clients=5, model="logreg"))
