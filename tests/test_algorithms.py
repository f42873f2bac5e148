"""Algorithm policies on the virtual clock: equivalences and the rules' arithmetic."""
import csv
import os

import jax
import numpy as np

from jaxfl.experiment import run_experiment
from tests.conftest import replace


def events(run_dir):
    """The event log's rows without the wall-clock column (which differs between any two runs)."""
    with open(os.path.join(run_dir, "events.csv")) as handle:
        return [{k: v for k, v in row.items() if k != "wall_time"} for row in csv.DictReader(handle)]


def test_fedbuff_with_full_buffer_equals_fedavg(small_config):
    """Buffer of all clients, equal speeds, no jitter, staleness weight 1 → FedAvg's parameters."""
    common = dict(clients=4, heterogeneity="homo", jitter=0.0, max_updates=3, client_optimizer="sgd",
                  client_lr=0.05)
    fedavg = run_experiment(replace(small_config, algorithm="fedavg", run_name="avg", **common))
    fedbuff = run_experiment(replace(small_config, algorithm="fedbuff", buffer_size=4, staleness="constant",
                                     staleness_alpha=1.0, run_name="buff", **common))
    for a, b in zip(jax.tree.leaves(fedavg.params), jax.tree.leaves(fedbuff.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-7)
    aggregations = lambda run: [(e["time"], e["version"]) for e in events(run.run_dir) if e["event"] == "aggregate"]
    assert aggregations(fedavg) == aggregations(fedbuff)


def test_fedavg_round_lasts_as_long_as_its_slowest_client(small_config):
    result = run_experiment(replace(small_config, algorithm="fedavg", heterogeneity="exp", max_updates=3))
    records = result.simulation.records
    for version in (1, 2, 3):
        round_records = [r for r in records if r.aggregated_in == version]
        assert len(round_records) == 4
        aggregate_time = max(r.arrival_time for r in round_records)
        assert all(r.start_time == round_records[0].start_time for r in round_records)
        next_round = [r for r in records if r.version == version]
        assert all(r.start_time == aggregate_time for r in next_round)


def test_fedasync_updates_on_every_arrival_with_staleness_weights(small_config):
    result = run_experiment(replace(small_config, algorithm="fedasync", heterogeneity="exp", max_updates=8))
    rows = events(result.run_dir)
    arrivals = [e for e in rows if e["event"] == "arrival"]
    aggregates = [e for e in rows if e["event"] == "aggregate"]
    assert len(arrivals) == len(aggregates) == 8
    assert all(e["detail"] == "1 updates" for e in aggregates)
    # a fast client is re-dispatched while slow ones still train: staleness appears
    assert max(int(e["staleness"]) for e in arrivals) > 0


def test_fedbuff_aggregates_every_k_arrivals(small_config):
    result = run_experiment(replace(small_config, algorithm="fedbuff", buffer_size=3, clients=4, max_updates=4))
    rows = events(result.run_dir)
    arrivals_between = []
    count = 0
    for e in rows:
        if e["event"] == "arrival":
            count += 1
        elif e["event"] == "aggregate":
            arrivals_between.append(count)
            count = 0
    assert arrivals_between == [3, 3, 3, 3]


def test_fedasync_rule_plato_is_its_paper_rule(small_config):
    """PLATO's FedAsync server (rule plato, PORT's baselines) mixes as the FedAsync paper does: the same run."""
    paper = run_experiment(replace(small_config, algorithm="fedasync", rule="paper", run_name="paper"))
    plato = run_experiment(replace(small_config, algorithm="fedasync", rule="plato", run_name="plato"))
    assert events(paper.run_dir) == events(plato.run_dir)
    for a, b in zip(jax.tree.leaves(paper.params), jax.tree.leaves(plato.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_rules_give_different_updates(small_config):
    authors = run_experiment(replace(small_config, algorithm="fedbuff", rule="fedcompass", run_name="a"))
    paper = run_experiment(replace(small_config, algorithm="fedbuff", rule="paper", run_name="p"))
    assert events(authors.run_dir) == events(paper.run_dir)  # same schedule ...
    diffs = [float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
             for a, b in zip(jax.tree.leaves(authors.params), jax.tree.leaves(paper.params))]
    assert max(diffs) > 1e-4  # ... different arithmetic
