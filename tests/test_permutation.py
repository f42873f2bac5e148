"""The keyed Feistel permutation: a bijection of [0, count) for traced counts, jit/vmap, statistics."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.kernels.permutation import domain_bits, permute

_jitted = jax.jit(permute)
_LENGTH = 65536  # one compilation evaluates every count below: positions past count pass through
_full = jax.jit(lambda key, count: permute(key, jnp.arange(_LENGTH, dtype=jnp.int32), count))


def _images(key, count):
    """All images of [0, count) under the permutation of ``key``."""
    return np.asarray(_full(key, jnp.int32(count)))[:count]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 64, 65, 1000, 4097, 60000])
def test_bijection_of_range(count):
    for seed in range(2):
        images = _images(jax.random.key(seed), count)
        assert images.dtype == np.int32
        np.testing.assert_array_equal(np.sort(images), np.arange(count))


def test_count_one_maps_to_zero():
    for seed in range(5):
        assert _jitted(jax.random.key(seed), jnp.zeros((3,), jnp.int32), jnp.int32(1)).tolist() == [0, 0, 0]


def test_out_of_range_positions_pass_through():
    positions = jnp.array([-1, 0, 4, 5, 9, 1 << 20], jnp.int32)
    images = np.asarray(_jitted(jax.random.key(0), positions, jnp.int32(5)))
    np.testing.assert_array_equal(images[[0, 3, 4, 5]], [-1, 5, 9, 1 << 20])
    assert 0 <= images[1] < 5 and 0 <= images[2] < 5


def test_domain_bits():
    counts = [1, 2, 3, 4, 5, 8, 9, 60000, 65536, 65537, 2**31 - 1]
    assert [int(domain_bits(jnp.int32(c))) for c in counts] == [0, 1, 2, 2, 3, 3, 4, 16, 16, 17, 31]


def test_large_count_near_int32_limit():
    count = 2**31 - 1
    positions = jnp.array([0, 1, 2, count - 2, count - 1], jnp.int32)
    images = np.asarray(_jitted(jax.random.key(3), positions, jnp.int32(count)))
    assert ((images >= 0) & (images < count)).all() and len(set(images.tolist())) == 5


def test_deterministic_and_keyed():
    key = jax.random.key(42)
    np.testing.assert_array_equal(_images(key, 1000), _images(key, 1000))
    eager = np.asarray(permute(key, jnp.arange(1000, dtype=jnp.int32), 1000))
    np.testing.assert_array_equal(eager, _images(key, 1000))
    perms = {tuple(_images(jax.random.key(seed), 1000)) for seed in range(10)}
    assert len(perms) == 10
    # neither the identity nor a shift: a permutation that moves almost everything
    assert (_images(key, 1000) != np.arange(1000)).mean() > 0.9


def test_subset_of_positions_matches_full_evaluation():
    key, count = jax.random.key(5), 4097
    full = _images(key, count)
    positions = np.array([4096, 0, 17, 17, 2048, 100], np.int32)
    np.testing.assert_array_equal(np.asarray(_jitted(key, jnp.asarray(positions), count)), full[positions])
    block = jnp.arange(64, dtype=jnp.int32).reshape(8, 8) + 640  # any shape of positions
    np.testing.assert_array_equal(np.asarray(_jitted(key, block, count)), full[np.asarray(block)])


def test_jit_traces_once_for_many_counts():
    traces = []

    def batch(key, count):
        traces.append(None)
        return permute(key, jnp.minimum(jnp.arange(64, dtype=jnp.int32), count - 1), count)

    jitted = jax.jit(batch)
    key = jax.random.key(1)
    for count in (1, 7, 64, 65, 1000, 60000):
        images = np.asarray(jitted(key, jnp.int32(count)))
        n = min(count, 64)
        assert len(set(images[:n].tolist())) == n and ((images >= 0) & (images < count)).all()
        np.testing.assert_array_equal(images[:n], _images(key, count)[:n])
    assert len(traces) == 1 and jitted._cache_size() == 1


def test_vmap_with_per_row_counts():
    counts = np.array([1, 5, 64, 65, 1000], np.int32)
    keys = jax.random.split(jax.random.key(2), len(counts))
    length = 1000
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (len(counts), length))
    rows = np.asarray(jax.jit(jax.vmap(permute))(keys, positions, jnp.asarray(counts)))
    assert rows.shape == (len(counts), length)
    for row, key, count in zip(rows, keys, counts):
        np.testing.assert_array_equal(row[:count], _images(key, count))
        np.testing.assert_array_equal(row[count:], np.arange(count, length))  # out of range: unchanged
    # vmap over the key alone (positions and count shared)
    shared = np.asarray(jax.vmap(permute, in_axes=(0, None, None))(keys, jnp.arange(65, dtype=jnp.int32), 65))
    for row, key in zip(shared, keys):
        np.testing.assert_array_equal(row, _images(key, 65))


@pytest.fixture(scope="module")
def permutations_of_ten():
    """Full permutations of [0, 10) for 2,000 fixed keys, (keys, 10)."""
    keys = jax.random.split(jax.random.key(2024), 2000)
    f = jax.jit(jax.vmap(permute, in_axes=(0, None, None)))
    return np.asarray(f(keys, jnp.arange(10, dtype=jnp.int32), jnp.int32(10)))


def test_image_of_position_zero_is_roughly_uniform(permutations_of_ten):
    counts = np.bincount(permutations_of_ten[:, 0], minlength=10)
    expected = len(permutations_of_ten) / 10
    chi_square = ((counts - expected) ** 2 / expected).sum()
    # 9 degrees of freedom: P(chi2 > 30) ~ 4e-4 for a uniform draw; fixed keys, so never flaky.
    assert chi_square < 30, counts
    table = np.stack([np.bincount(permutations_of_ten[:, i], minlength=10) for i in range(10)])
    assert table.min() > 0.6 * expected and table.max() < 1.4 * expected, table


def test_fixed_points_and_pairwise_order(permutations_of_ten):
    perms = permutations_of_ten
    # a uniform permutation has 1 fixed point on average (variance 1); mean of 2,000: sd ~0.022
    assert abs((perms == np.arange(10)).sum(axis=1).mean() - 1.0) < 0.1
    # each pair i < j keeps its order half the time: sd of a fraction of 2,000 ~0.011
    i, j = np.triu_indices(10, k=1)
    in_order = (perms[:, i] < perms[:, j]).mean(axis=0)
    assert np.abs(in_order - 0.5).max() < 0.06, in_order
    assert abs(in_order.mean() - 0.5) < 0.02
    assert len({tuple(p) for p in perms}) > 1990  # 10! = 3.6M: repeats should be rare


def test_tiny_domain_mixes_at_default_rounds():
    # count = 5 uses halves of 1 and 2 bits, the slowest to mix (8 rounds were visibly biased).
    keys = jax.random.split(jax.random.key(99), 4000)
    perms = np.asarray(jax.jit(jax.vmap(permute, in_axes=(0, None, None)))(
        keys, jnp.arange(5, dtype=jnp.int32), jnp.int32(5)))
    table = np.stack([np.bincount(perms[:, i], minlength=5) for i in range(5)])
    expected = len(perms) / 5
    chi_square = ((table - expected) ** 2 / expected).sum()
    assert chi_square < 50, table  # jax.random.permutation: ~24 on average
    assert len({tuple(p) for p in perms}) == 120  # every permutation of 5 occurs


def test_rounds_must_be_positive():
    with pytest.raises(ValueError):
        permute(jax.random.key(0), jnp.arange(3, dtype=jnp.int32), 3, rounds=0)
