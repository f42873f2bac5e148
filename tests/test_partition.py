"""Partitioners: invariants, the FedCompass algorithms replayed call by call, CC-FedAvg and McMahan
constructions worked by hand, IID limits, and errors that name the value."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxfl.data import (
    CLASS_PARTITION_TABLE,
    PARTITIONS,
    FlatPartition,
    client_sizes,
    make_partition,
    partition_class,
    partition_dirichlet,
    partition_dirichlet_client,
    partition_dual_dirichlet,
    partition_gamma_mix,
    partition_iid,
    partition_label_shards,
    partition_natural,
)

LABELS = np.repeat(np.arange(10), [50, 80, 120, 60, 90, 100, 70, 110, 40, 280])  # N = 1000, unbalanced
SHUFFLED = np.random.default_rng(5).permutation(LABELS)  # classes interleaved, as in real files


def check_disjoint_cover(parts, n, num_clients, allow_empty=False):
    """Every index in range(n) exactly once, clients sorted, no client empty (unless the method allows it)."""
    assert len(parts) == num_clients
    for p in parts:
        assert p.dtype == np.int64 and (allow_empty or len(p) > 0)
        assert np.all(np.diff(p) > 0), "sorted, no duplicates within a client"
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def histogram(parts, labels):
    return np.stack([np.bincount(labels[p], minlength=labels.max() + 1) for p in parts])


# --------------------------------------------------------------------------- every partitioner

KWARGS = {"iid": {}, "dirichlet": {"alpha": 0.5}, "dirichlet_client": {"alpha": 0.5}, "class": {},
          "dual_dirichlet": {}, "label_shards": {}, "gamma_mix": {"gamma": 0.2}}


@pytest.mark.parametrize("name", sorted(KWARGS))
@pytest.mark.parametrize("num_clients", [5, 10, 20])
def test_every_partitioner_covers_the_dataset_once(name, num_clients):
    parts = make_partition(name, SHUFFLED, num_clients, np.random.default_rng(0), **KWARGS[name])
    # The FedCompass algorithms can leave a client empty (Dir(1) client weights; a tiny normal share);
    # build_federation rejects such a split with a clear message.
    check_disjoint_cover(parts, len(SHUFFLED), num_clients, allow_empty=name in ("class", "dual_dirichlet"))


@pytest.mark.parametrize("name", sorted(KWARGS))
def test_every_partitioner_is_a_pure_function_of_labels_and_seed(name):
    a = make_partition(name, SHUFFLED, 8, np.random.default_rng(42), **KWARGS[name])
    b = make_partition(name, SHUFFLED, 8, np.random.default_rng(42), **KWARGS[name])
    c = make_partition(name, SHUFFLED, 8, np.random.default_rng(43), **KWARGS[name])
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_registry_names():
    assert set(PARTITIONS) == set(KWARGS) | {"natural"}


@settings(max_examples=25, deadline=None)
@given(num_classes=st.integers(2, 12), per_class=st.integers(3, 30), num_clients=st.integers(1, 12),
       seed=st.integers(0, 2**31 - 1), name=st.sampled_from(["iid", "dirichlet_client", "label_shards", "gamma_mix"]))
def test_always_feasible_partitioners_property(num_classes, per_class, num_clients, seed, name):
    labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))
    # label_shards: 2 shards per client; gamma_mix (gamma 0.5): the label-sorted pool holds >= N / 2.
    num_clients = min(num_clients, len(labels) // (2 if name in ("label_shards", "gamma_mix") else 1))
    kwargs = {"dirichlet_client": {"alpha": 0.3}, "gamma_mix": {"gamma": 0.5}}.get(name, {})
    parts = make_partition(name, labels, num_clients, np.random.default_rng(seed), **kwargs)
    check_disjoint_cover(parts, len(labels), num_clients)


# --------------------------------------------------------------------------- IID sizes


@pytest.mark.parametrize("sizes, skew", [("equal", 1.0), ("lognormal", 1.0), ("lognormal", 2.0), ("powerlaw", 1.5)])
def test_iid_sizes(sizes, skew):
    parts = partition_iid(SHUFFLED, 40, np.random.default_rng(0), sizes=sizes, skew=skew)
    check_disjoint_cover(parts, len(SHUFFLED), 40)
    lengths = np.array([len(p) for p in parts])
    if sizes == "equal":
        assert lengths.max() - lengths.min() <= 1
    else:
        assert lengths.max() > 2 * np.median(lengths), "unequal sizes are skewed"


def test_iid_equal_is_the_original_split():
    # The default must stay the previous behaviour exactly: array_split of one permutation.
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    expected = [np.sort(p) for p in np.array_split(rng_b.permutation(len(LABELS)), 7)]
    for got, want in zip(partition_iid(LABELS, 7, rng_a), expected):
        np.testing.assert_array_equal(got, want)


def test_client_sizes_largest_remainder_exact():
    for kind in ("lognormal", "powerlaw"):
        sizes = client_sizes(1003, 17, kind, np.random.default_rng(1), skew=1.0, min_samples=3)
        assert sizes.sum() == 1003 and sizes.min() >= 3


# --------------------------------------------------------------------------- Dirichlet


def test_dirichlet_large_alpha_approaches_iid():
    # Multinomial noise of the per-client fill accumulates on the last client: use 40k samples.
    labels = np.repeat(np.arange(10), 4000)
    for name in ("dirichlet", "dirichlet_client"):
        parts = make_partition(name, labels, 5, np.random.default_rng(0), alpha=1000.0)
        props = histogram(parts, labels) / np.array([len(p) for p in parts])[:, None]
        np.testing.assert_allclose(props, 0.1, atol=0.02, err_msg=name)
        np.testing.assert_allclose([len(p) for p in parts], 8000, rtol=0.05, err_msg=name)


def test_dirichlet_client_small_alpha_skewed_and_scales():
    labels = np.repeat(np.arange(10), 300)
    parts = partition_dirichlet_client(labels, 1500, 0.05, np.random.default_rng(0))  # 2 samples per client
    check_disjoint_cover(parts, len(labels), 1500)
    parts = partition_dirichlet_client(labels, 30, 0.05, np.random.default_rng(0))
    props = histogram(parts, labels) / 100
    assert np.median(props.max(axis=1)) > 0.5


def test_dirichlet_client_replay():
    # Sizes, then one Dir(alpha K p) row per client, then multinomial fills in client order.
    labels = np.repeat(np.arange(3), [4, 2, 6])
    rng = np.random.default_rng(7)
    mixes = rng.dirichlet(0.5 * 3 * np.array([4, 2, 6]) / 12, size=3)
    remaining, counts = np.array([4, 2, 6]), np.zeros((3, 3), np.int64)
    for i in range(3):
        need = 4
        while need:
            w = mixes[i] * (remaining > 0)
            w = w if w.sum() > 0 else remaining.astype(float)
            take = np.minimum(rng.multinomial(need, w / w.sum()), remaining)
            counts[i] += take
            remaining -= take
            need -= take.sum()
    parts = partition_dirichlet_client(labels, 3, 0.5, np.random.default_rng(7))
    np.testing.assert_array_equal(histogram(parts, labels), counts)


def reference_dirichlet_client(labels, num_clients, alpha, rng, sizes="equal", skew=1.0):
    """The per-client loop partition_dirichlet_client replaced by bulk draws: same calls, one client at a time."""
    classes = np.unique(labels)
    members = [np.flatnonzero(labels == c) for c in classes]
    class_sizes = np.array([len(m) for m in members])
    wanted = client_sizes(len(labels), num_clients, sizes, rng, skew)
    mixes = rng.dirichlet(alpha * len(classes) * class_sizes / class_sizes.sum(), size=num_clients)
    remaining, counts = class_sizes.copy(), np.zeros((num_clients, len(classes)), np.int64)
    for i in range(num_clients):
        need = int(wanted[i])
        while need > 0:
            w = mixes[i] * (remaining > 0)
            w = w if w.sum() > 0 else remaining.astype(np.float64)
            take = np.minimum(rng.multinomial(need, w / w.sum()), remaining)
            counts[i] += take
            remaining -= take
            need -= int(take.sum())
    parts = [[] for _ in range(num_clients)]
    for k, pool in enumerate(members):
        for i, chunk in enumerate(np.split(rng.permutation(pool), np.cumsum(counts[:, k])[:-1])):
            parts[i].append(chunk)
    return [np.sort(np.concatenate(chunks)) for chunks in parts], rng.random()


@pytest.mark.parametrize("num_classes, per_class, num_clients, alpha, sizes", [
    (10, 300, 1500, 0.05, "equal"),  # 2 samples per client: classes run out all the way through
    (10, 300, 700, 0.5, "lognormal"),
    (3, 500, 1200, 0.1, "powerlaw"),
    (37, 40, 1480, 0.3, "equal"),  # one sample per client
    (5, 2000, 3000, 5.0, "lognormal"),  # long blocks before the first class runs out
])
@pytest.mark.parametrize("seed", [0, 11])
def test_dirichlet_client_bulk_draws_replay_the_client_loop(num_classes, per_class, num_clients, alpha, sizes, seed):
    labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))
    rng = np.random.default_rng(seed)
    got = partition_dirichlet_client(labels, num_clients, alpha, rng, sizes=sizes)
    want, next_draw = reference_dirichlet_client(labels, num_clients, alpha, np.random.default_rng(seed), sizes)
    assert [p.tolist() for p in got] == [p.tolist() for p in want]
    assert rng.random() == next_draw, "the generator is left where the loop leaves it"


# --------------------------------------------------------------------------- FedCompass class partition (Alg. 4)


def group_by_label(labels):
    """The sorted label list and each label's sample indices, as both transcribed reference functions build them."""
    label_list, label_indices = [], {}
    for idx, label in enumerate(labels):
        label = int(label)
        if label not in label_indices:
            label_indices[label] = []
            label_list.append(label)
        label_indices[label].append(idx)
    label_list.sort()
    return label_list, label_indices


def reference_class_partition(labels, num_clients, rng):
    """The authors' class_noniid_partition, transcribed with np.random.* -> rng.* (spec §5.2)."""
    Cmin = {1: 10, 2: 7, 3: 6, 4: 5, 5: 5, 6: 4, 7: 4, "none": 3}
    Cmax = {1: 10, 2: 8, 3: 8, 4: 7, 5: 6, 6: 6, 7: 5, "none": 5}
    label_list, label_indices = group_by_label(labels)
    while True:
        class_partition, client_classes = {}, {}
        for i in range(num_clients):
            cmin = Cmin[num_clients] if num_clients in Cmin else Cmin["none"]
            cmax = Cmax[num_clients] if num_clients in Cmax else Cmax["none"]
            cnum = rng.integers(cmin, cmax + 1)
            classes = rng.permutation(10)[:cnum]
            client_classes[i] = classes
            for cls in classes:
                class_partition[cls] = class_partition.get(cls, 0) + 1
        if len(class_partition) == 10:
            break
    partition_endpoints = {}
    for label in label_list:
        total_size = len(label_indices[label])
        lengths = np.abs(rng.normal(10, 3, size=class_partition[label]))
        lengths = lengths / np.sum(lengths) * total_size
        endpoints = np.array(np.cumsum(lengths), dtype=np.int32)
        endpoints[-1] = total_size
        partition_endpoints[label] = endpoints
    pointer = {label: 0 for label in label_list}
    out = []
    for i in range(num_clients):
        indices = []
        for cls in client_classes[i]:
            start = 0 if pointer[cls] == 0 else partition_endpoints[cls][pointer[cls] - 1]
            end = partition_endpoints[cls][pointer[cls]]
            indices.extend(label_indices[cls][start:end])
            pointer[cls] += 1
        out.append(sorted(indices))
    return out


@pytest.mark.parametrize("num_clients", [1, 2, 5, 10, 20, 8])
@pytest.mark.parametrize("seed", [0, 42])
def test_class_partition_replays_the_authors_algorithm(num_clients, seed):
    got = partition_class(SHUFFLED, num_clients, np.random.default_rng(seed))
    want = reference_class_partition(SHUFFLED, num_clients, np.random.default_rng(seed))
    assert [p.tolist() for p in got] == want
    check_disjoint_cover(got, len(SHUFFLED), num_clients, allow_empty=True)
    low, high = CLASS_PARTITION_TABLE.get(num_clients, (3, 5))
    held = (histogram(got, SHUFFLED) > 0).sum(axis=1)
    assert np.all((held >= min(low, 10)) & (held <= high)) or num_clients >= 5  # a holder may get 0 of a class


def test_class_partition_small_case_by_hand():
    # m = 2: the table gives 7..8 classes each. Replay the draws by hand and derive the split.
    labels = np.repeat(np.arange(10), 10)  # class k = indices 10k .. 10k+9, in dataset order
    rng = np.random.default_rng(2)
    n0 = rng.integers(7, 9)
    classes0 = rng.permutation(10)[:n0]
    n1 = rng.integers(7, 9)
    classes1 = rng.permutation(10)[:n1]
    assert set(classes0) | set(classes1) == set(range(10))  # seed 2 covers all classes at the first try
    expected = [[], []]
    for k in range(10):  # classes in label order draw their normal lengths
        holders = [c for c, chosen in enumerate((classes0, classes1)) if k in chosen]
        lengths = np.abs(rng.normal(10, 3, size=len(holders)))
        if len(holders) == 1:
            expected[holders[0]].extend(range(10 * k, 10 * k + 10))
        else:
            cut = int(lengths[0] / lengths.sum() * 10)  # int32 truncation of the first endpoint
            expected[0].extend(range(10 * k, 10 * k + cut))  # client 0 comes first among the holders
            expected[1].extend(range(10 * k + cut, 10 * k + 10))
    got = partition_class(labels, 2, np.random.default_rng(2))
    assert [p.tolist() for p in got] == [sorted(e) for e in expected]


def test_class_partition_impossible_for_m():
    with pytest.raises(ValueError, match=r"impossible for m=3.*use m >= 4"):
        partition_class(LABELS, 3, np.random.default_rng(0), classes_per_client=(2, 3))
    with pytest.raises(ValueError, match=r"classes_per_client=\(4, 11\).*<= 10"):
        partition_class(LABELS, 3, np.random.default_rng(0), classes_per_client=(4, 11))


def test_class_partition_other_class_counts_scale_the_table():
    labels = np.repeat(np.arange(20), 30)
    parts = partition_class(labels, 5, np.random.default_rng(0))  # table (5, 6) scaled to (10, 12)
    check_disjoint_cover(parts, len(labels), 5)
    held = (histogram(parts, labels) > 0).sum(axis=1)
    assert held.max() <= 12


# --------------------------------------------------------------------------- FedCompass dual-Dirichlet (Alg. 5)


def reference_dual_dirichlet(labels, num_clients, rng, alpha1, alpha2=0.5):
    """The authors' dirichlet_noniid_partition, transcribed with np.random.* -> rng.* (spec §5.2)."""
    label_list, label_indices = group_by_label(labels)
    for label in label_list:
        shuffled = np.array(label_indices[label])
        rng.shuffle(shuffled)
        label_indices[label] = shuffled.tolist()
    p1 = [1 / num_clients for _ in range(num_clients)]
    p2 = [len(label_indices[label]) for label in label_list]
    p2 = [p / sum(p2) for p in p2]
    weights = rng.dirichlet([alpha1 * i for i in p1])
    individuals = rng.dirichlet([alpha2 * i for i in p2], num_clients)
    classes_samples = [len(label_indices[label]) for label in label_list]
    portions = np.zeros(individuals.shape)
    for i in range(num_clients):
        for j in range(len(classes_samples)):
            portions[i][j] = weights[i] * individuals[i][j] / np.dot(weights, individuals.transpose()[j])
    sample_matrix = np.multiply(np.array([classes_samples] * num_clients), portions).transpose()
    for i in range(len(classes_samples)):
        total = 0
        for j in range(num_clients - 1):
            sample_matrix[i][j] = int(sample_matrix[i][j])
            total += sample_matrix[i][j]
        sample_matrix[i][num_clients - 1] = classes_samples[i] - total
    sum_elements = np.cumsum(np.array(sample_matrix.transpose(), dtype=np.int32), axis=0)
    out = []
    for i in range(num_clients):
        indices = []
        for j, label in enumerate(label_list):
            start = 0 if i == 0 else sum_elements[i - 1][j]
            indices.extend(label_indices[label][start:sum_elements[i][j]])
        out.append(sorted(indices))
    return out


@pytest.mark.parametrize("num_clients", [5, 10, 20])
@pytest.mark.parametrize("seed", [0, 1])
def test_dual_dirichlet_replays_the_authors_algorithm_with_alpha1_m(num_clients, seed):
    got = partition_dual_dirichlet(SHUFFLED, num_clients, np.random.default_rng(seed))
    want = reference_dual_dirichlet(SHUFFLED, num_clients, np.random.default_rng(seed), alpha1=num_clients)
    assert [p.tolist() for p in got] == want
    np.testing.assert_array_equal(np.sort(np.concatenate(got)), np.arange(len(SHUFFLED)))


def test_dual_dirichlet_code_default_alpha1_is_a_switch():
    got = partition_dual_dirichlet(SHUFFLED, 5, np.random.default_rng(0), alpha1=8)
    want = reference_dual_dirichlet(SHUFFLED, 5, np.random.default_rng(0), alpha1=8)
    assert [p.tolist() for p in got] == want


def test_dual_dirichlet_large_alphas_approach_iid():
    labels = np.repeat(np.arange(10), 1000)
    parts = partition_dual_dirichlet(labels, 5, np.random.default_rng(0), alpha1=1e5, alpha2=1e5)
    props = histogram(parts, labels) / np.array([len(p) for p in parts])[:, None]
    np.testing.assert_allclose(props, 0.1, atol=0.02)
    np.testing.assert_allclose([len(p) for p in parts], 2000, rtol=0.05)


# --------------------------------------------------------------------------- label-sorted (McMahan, CC-FedAvg)


def test_label_shards_by_hand():
    labels = np.repeat(np.arange(4), 6)  # 24 samples, 4 clients x 2 shards of 3
    parts = partition_label_shards(labels, 4, np.random.default_rng(0))
    assignment = np.random.default_rng(0).permutation(8).reshape(4, 2)
    for part, shards in zip(parts, assignment):
        expected = np.concatenate([np.arange(3 * s, 3 * s + 3) for s in shards])
        np.testing.assert_array_equal(part, np.sort(expected))
    # Shards are label-pure: each client holds at most 2 classes.
    assert (histogram(parts, labels) > 0).sum(axis=1).max() <= 2


def test_label_shards_mcmahan_setting_and_remainder():
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 600))  # 6000 = 100 x 2 x 30
    parts = partition_label_shards(labels, 100, np.random.default_rng(1))
    check_disjoint_cover(parts, 6000, 100)
    assert {len(p) for p in parts} == {60}
    assert (histogram(parts, labels) > 0).sum(axis=1).max() <= 2
    odd = partition_label_shards(LABELS, 7, np.random.default_rng(1), shards_per_client=3)  # 1000 / 21 shards
    check_disjoint_cover(odd, 1000, 7)


def test_gamma_mix_by_hand():
    # Two classes of 10, gamma = 0.2, two clients: each class gives its first 2 samples to the IID
    # pool; the sorted rest is [2..9, 12..19], cut in halves; the shuffled pool [0, 1, 10, 11] in halves.
    labels = np.repeat(np.arange(2), 10)
    pool = np.array([0, 1, 10, 11])
    np.random.default_rng(0).shuffle(pool)
    parts = partition_gamma_mix(labels, 2, np.random.default_rng(0), gamma=0.2)
    np.testing.assert_array_equal(parts[0], np.sort(np.r_[2:10, pool[:2]]))
    np.testing.assert_array_equal(parts[1], np.sort(np.r_[12:20, pool[2:]]))


def test_gamma_mix_limits_and_ccfedavg_setting():
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 600))
    sorted_only = partition_gamma_mix(labels, 8, np.random.default_rng(0), gamma=0.0)
    check_disjoint_cover(sorted_only, 6000, 8)
    assert (histogram(sorted_only, labels) > 0).sum(axis=1).max() <= 3  # 750 label-contiguous samples
    iid = partition_gamma_mix(labels, 8, np.random.default_rng(0), gamma=1.0)
    props = histogram(iid, labels) / 750
    np.testing.assert_allclose(props, 0.1, atol=0.04)
    mixed = partition_gamma_mix(labels, 8, np.random.default_rng(0), gamma=0.1)  # "90% non-IID"
    check_disjoint_cover(mixed, 6000, 8)
    # The IID part (600 samples, 75 per client) touches every class on most clients.
    assert np.median((histogram(mixed, labels) > 0).sum(axis=1)) >= 8


# --------------------------------------------------------------------------- natural


def test_natural_split_by_writer_and_subset():
    groups = np.array([5, 9, 5, 2, 9, 9, 2])
    labels = np.zeros(7, np.int64)
    parts = partition_natural(labels, 3, np.random.default_rng(0), groups=groups)
    assert [p.tolist() for p in parts] == [[3, 6], [0, 2], [1, 4, 5]]  # ids in sorted order: 2, 5, 9
    with pytest.warns(UserWarning, match=r"partition natural: 2 of the 3 writers drawn at random, so \d of the 7 "
                                         r"training samples are used \(clients=3 takes every writer\)"):
        subset = partition_natural(labels, 2, np.random.default_rng(0), groups=groups)
    chosen = np.sort(np.random.default_rng(0).choice(3, 2, replace=False))
    assert [p.tolist() for p in subset] == [[[3, 6], [0, 2], [1, 4, 5]][g] for g in chosen]
    with pytest.raises(ValueError, match="num_clients=4 but the natural split has only 3 clients"):
        partition_natural(labels, 4, np.random.default_rng(0), groups=groups)
    with pytest.raises(ValueError, match="needs a per-sample client id column"):
        partition_natural(labels, 2, np.random.default_rng(0))


def test_natural_split_of_grouped_ids_equals_the_general_path():
    # Sorted ids (the synthetic federation) take a sort-free path; it must agree with the general one.
    groups = np.sort(np.random.default_rng(0).integers(10, 500, 3000))
    labels = np.zeros(len(groups), np.int64)
    shuffled = np.random.default_rng(1).permutation(len(groups))
    for num_clients in (len(np.unique(groups)), 17):
        fast = partition_natural(labels, num_clients, np.random.default_rng(2), groups=groups)
        # Relabelling the samples by a permutation and mapping back gives the general path's answer.
        general = partition_natural(labels, num_clients, np.random.default_rng(2), groups=groups[shuffled])
        assert [p.tolist() for p in fast] == [np.sort(shuffled[p]).tolist() for p in general]
        assert all(len(p) and np.all(groups[p] == groups[p[0]]) for p in fast)


def test_flat_partition_is_a_read_only_sequence_of_client_views():
    part = partition_iid(SHUFFLED, 7, np.random.default_rng(0))
    assert isinstance(part, FlatPartition) and len(part) == part.num_clients == 7
    listed = list(part)
    assert [p.tolist() for p in listed] == [part[i].tolist() for i in range(7)] == [p.tolist() for p in part[:]]
    assert part[-1].tolist() == listed[6].tolist() and part[2:4][1].tolist() == listed[3].tolist()
    assert all(np.shares_memory(p, part.indices) for p in listed), "views, not copies"
    np.testing.assert_array_equal(part.offsets, np.concatenate([[0], np.cumsum(part.counts)[:-1]]))
    with pytest.raises(IndexError, match="client 7 out of range for 7 clients"):
        part[7]
    with pytest.raises(ValueError, match="read-only"):
        part.indices[0] = 1
    with pytest.raises(AttributeError, match="immutable"):
        part.counts = np.ones(7)
    with pytest.raises(ValueError, match="counts sum to 3 but there are 2 indices"):
        FlatPartition(np.array([0, 1]), np.array([1, 2]))
    rebuilt = FlatPartition.from_parts(listed)
    np.testing.assert_array_equal(rebuilt.indices, part.indices)
    assert FlatPartition.from_parts(part) is part


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda r: partition_dirichlet(LABELS, 4, 0.0, r), "alpha=0.0 must be a positive"),
        (lambda r: partition_dirichlet_client(LABELS, 4, -1.0, r), "alpha=-1.0 must be a positive"),
        (lambda r: partition_dual_dirichlet(LABELS, 4, r, alpha2=0.0), "alpha2=0.0"),
        (lambda r: partition_iid(LABELS, 1001, r), r"num_clients=1001.*1000"),
        (lambda r: partition_class(LABELS, 1001, r), r"num_clients=1001.*1000"),
        (lambda r: partition_label_shards(LABELS, 600, r), r"600 clients x shards_per_client=2 = 1200 shards"),
        (lambda r: partition_label_shards(LABELS, 4, r, shards_per_client=0), "shards_per_client=0"),
        (lambda r: partition_gamma_mix(LABELS, 4, r, gamma=1.5), r"gamma=1.5 must be a fraction in \[0, 1\]"),
        (lambda r: partition_gamma_mix(np.repeat(np.arange(2), 3), 5, r, gamma=0.5),
         r"gamma=0.5 splits the 6 samples into 4 label-sorted and 2 IID; num_clients=5 .* use at most 4 clients"),
        (lambda r: partition_iid(LABELS, 4, r, sizes="zipf"), "sizes='zipf' is not allowed"),
        (lambda r: make_partition("shards", LABELS, 4, r), r"'shards'.*label_shards"),
    ],
)
def test_bad_inputs_name_the_value(call, match):
    with pytest.raises(ValueError, match=match):
        call(np.random.default_rng(0))


def test_a_hopeless_dirichlet_split_gives_up_early_with_its_reason():
    """At 10^5 clients a split that cannot give every client a sample spent 1000 tries (minutes,
    silent) before its error; tries that each leave many clients short stop after a few."""
    from jaxfl.data import partition

    class CountingDraws:  # numpy's Generator, counting its Dirichlet draws
        def __init__(self, seed):
            self.rng, self.draws = np.random.default_rng(seed), 0

        def dirichlet(self, *args, **kwargs):
            self.draws += 1
            return self.rng.dirichlet(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.rng, name)

    labels = np.repeat(np.arange(10), 300)  # 3,000 samples over 400 clients at alpha 0.1: a few dozen empty
    rng = CountingDraws(0)
    with pytest.raises(ValueError, match=r"no draw gave every one of 400 clients >= 1 samples in 10 tries .*every "
                                         r"draw left >= 2\d clients short, so the other 990 tries"):
        partition.partition_dirichlet(labels, 400, alpha=0.1, rng=rng)
    assert rng.draws == 10 * 10  # ten draws of ten classes
    # hundreds empty (2,000 clients): two draws say it (a draw takes seconds at 10^6 clients)
    rng = CountingDraws(0)
    with pytest.raises(ValueError, match=r"no draw gave every one of 2000 clients >= 1 samples in 2 tries .*every "
                                         r"draw left >= \d{3} clients short, so the other 998 tries"):
        partition.partition_dirichlet(labels, 2000, alpha=0.1, rng=rng)
    assert rng.draws == 2 * 10
    # a split that some draw can make is made as before
    parts = partition.partition_dirichlet(labels, 20, alpha=0.5, rng=np.random.default_rng(0))
    assert sum(len(part) for part in parts) == 3000 and min(len(part) for part in parts) >= 1
