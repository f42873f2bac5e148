"""Large federations: a fixed number of clients in flight, memory that follows it, and an engine
that trains only what the run aggregates (issue: million-client federations). Counts, not seconds."""
import json

import numpy as np
import pytest

from jaxfl.algorithms.fedasync import FedAsync
from jaxfl.algorithms.fedbuff import FedBuff
from jaxfl.config import RunConfig
from jaxfl.experiment import run_experiment
from jaxfl.scheduler.pool import IdlePool, default_concurrency
from jaxfl.scheduler.simulation import IN_FLIGHT, Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from tests.conftest import RecordingBackend


@pytest.mark.parametrize("policy", [lambda: FedBuff(5, 10, lambda s: 1.0, concurrency=50, seed=3),
                                    lambda: FedAsync(5, lambda s: 1.0, concurrency=50, seed=3)])
def test_a_fixed_number_of_clients_is_in_flight_and_replacements_are_drawn(policy):
    clients = 10_000
    in_flight = []
    simulation = Simulation(policy(), ClientSpeeds(SpeedConfig(model="exp"), clients, seed=0),
                            np.full(clients, 1 / clients), RecordingBackend(), max_updates=400,
                            after_event=lambda sim: in_flight.append(sim.accounting()["in_flight"]))
    simulation.run()
    assert max(in_flight) == 50 and min(in_flight) >= 49  # one may be between its arrival and its reply
    live = [r for r in simulation.records.live.values() if r.status == IN_FLIGHT]
    assert len(live) >= 49 and len({r.client for r in live}) == len(live)  # never two dispatches of one client
    dispatched = list(simulation.records)
    expected_distinct = clients * (1 - np.exp(-len(dispatched) / clients))  # uniform draws with replacement
    assert len(dispatched) > 400 and len({r.client for r in dispatched}) > 0.95 * expected_distinct


def test_the_idle_pool_draws_each_idle_client_alike():
    pool = IdlePool(4, seed=0)
    counts = np.zeros(4)
    for _ in range(4000):
        client = pool.take()
        counts[client] += 1
        pool.give_back(client)
    assert counts.min() > 900
    with pytest.raises(ValueError, match="already idle"):
        pool.give_back(0)
    with pytest.raises(ValueError, match="concurrency=0 is not allowed"):
        default_concurrency(10, 0)


def test_finished_records_are_let_go_but_every_dispatch_is_accounted():
    clients = 200
    simulation = Simulation(FedBuff(5, 10, lambda s: 1.0, seed=0), ClientSpeeds(SpeedConfig(model="exp"), clients, 0),
                            np.full(clients, 1 / clients), RecordingBackend(), max_updates=300,
                            keep_finished_records=100)
    simulation.run()
    counts = simulation.accounting()
    assert counts["dispatched"] == len(simulation.records) == 3000 + counts["in_flight"]
    assert len(simulation.records.finished) == 100 and len(simulation.records.live) == counts["in_flight"]
    with pytest.raises(KeyError, match="event log has every dispatch"):
        simulation.records[0]


def small_run(tmp_path, clients, **changes):
    values = dict(algorithm="fedbuff", dataset="synthetic_iid", partition="natural", clients=clients,
                  model="logreg", local_steps=5, batch_size=10, buffer_size=10, max_updates=10,
                  client_optimizer="sgd", client_lr=0.05, progress=False, output_dir=str(tmp_path),
                  checkpoint_every=None, eval_every=5)
    return run_experiment(RunConfig(**{**values, **changes}))


@pytest.mark.parametrize("clients_per_call", [1, 8])
def test_the_engine_trains_what_the_run_aggregates_not_the_backlog(tmp_path, clients_per_call):
    result = small_run(tmp_path, 2_000, clients_per_call=clients_per_call)  # 1,000 in flight by default
    summary = result.summary
    assert summary["policy"]["concurrency"] == 1000
    assert summary["client_steps_aggregated"] == 10 * 10 * 5
    assert summary["executed_per_aggregated"] == 1.0  # (≤ 1.1 before the engine looked ahead at the end)
    # what a checkpoint would hold: trained updates at most one call beyond the buffer, not 1,000
    _, meta = result.engine.checkpoint_state()
    assert sum(meta["batch_sizes"].values()) <= clients_per_call
    assert summary["final_accuracy"] > summary["best_accuracy"] - 0.05 and summary["best_accuracy"] > 0.15  # it learns


@pytest.mark.parametrize("budget", [dict(max_updates=100), dict(max_updates=None, max_time=0.17)])  # ≈ 100 updates
def test_calls_larger_than_the_next_arrivals_train_little_ahead_and_not_past_the_budget(tmp_path, budget):
    """Calls of 64 (an accelerator's size) with 400 of 2,000 clients in flight: new dispatches of fast
    clients keep arriving before the updates trained ahead. Filling every call trained 384 updates
    for 100 aggregated (executed ÷ aggregated 3.84) and held 320 rows (now 1.01 and 256)."""
    result = small_run(tmp_path, 2_000, algorithm="fedasync", concurrency=400, clients_per_call=64,
                       eval_every=50, heterogeneity="exp", **budget)
    summary = result.summary
    assert 90 * 5 <= summary["client_steps_aggregated"] <= 110 * 5
    assert summary["executed_per_aggregated"] == 1.0  # the end from a copy of the schedule (1.01 by the rate)
    # trained ahead: about a call's worth; the calls partly used (each held at its size, padding
    # included) a few calls' worth
    assert summary["device_memory"]["peak_updates_held"] <= 4 * 64


def test_the_first_aggregation_trains_ahead_only_what_the_run_s_rate_lets_arrive_in_time(tmp_path):
    """Calls of 512 with 300 of 600 clients in flight, K = 10, 20 updates: the first aggregation (no rate
    yet) trained the 200 earliest of those in flight, of which the ones that clients dispatched again
    overtook were never used: 1.31 executed ÷ aggregated in 17 calls. Its own updates give the rate:
    1.11 in 13 calls. With 200 updates left of 300 in flight, the engine looks ahead at once (a copy of
    the schedule run to the end): 1.0 in 9."""
    result = small_run(tmp_path, 600, concurrency=300, clients_per_call=512, local_steps=2, max_updates=20,
                       eval_every=20)
    summary = result.summary
    assert summary["client_steps_aggregated"] == 20 * 10 * 2
    assert summary["executed_per_aggregated"] == 1.0 and summary["train_calls"] <= 9


def test_a_client_step_budget_caps_the_first_call_too(tmp_path):
    """A client-step budget alone counted no update left before the first aggregation (it counts them by
    the steps aggregated so far): the first call trained the earliest of every client in flight, 1.86
    executed ÷ aggregated in 17 calls; the steps of the updates in flight now give it, 1.11 in 13, and the
    look ahead at the end 1.0 in 9."""
    result = small_run(tmp_path, 600, concurrency=300, clients_per_call=512, local_steps=2, max_updates=None,
                       max_client_steps=400, eval_every=20)
    summary = result.summary
    assert summary["client_steps_aggregated"] == 400
    assert summary["executed_per_aggregated"] == 1.0 and summary["train_calls"] <= 9


def test_the_last_aggregation_trains_nothing_ahead(tmp_path):
    """The budget's cap counts the whole aggregation in progress, its updates trained earlier too, and
    before the first version FedBuff's K updates a version: the last of 3 aggregations of K = 10
    trained 4 updates ahead that no aggregation could use (1.13; the engine before, filling calls, 1.07)."""
    result = small_run(tmp_path, 60, concurrency=20, clients_per_call=8, local_steps=2, max_updates=3,
                       heterogeneity="exp", eval_every=3)
    assert result.summary["client_steps_aggregated"] == 3 * 10 * 2
    assert result.summary["executed_per_aggregated"] == 1.0


def test_engine_memory_follows_the_clients_in_flight_not_the_federation(tmp_path):
    peaks = {}
    for clients in (500, 5_000):
        result = small_run(tmp_path, clients, concurrency=40, max_updates=20)
        memory = result.summary["device_memory"]
        bound = 40 + 1 + 10  # in-flight start models + the current one; a buffer of trained updates
        assert memory["peak_versions_kept"] + memory["peak_updates_held"] <= bound
        assert memory["hook_state_bytes"] == 0
        peaks[clients] = memory["peak_model_state_bytes"] - memory["hook_state_bytes"]
    model = result.summary["device_memory"]["model_bytes"]
    assert abs(peaks[5_000] - peaks[500]) <= 10 * model  # same in-flight work, 10× the clients


def test_a_hundred_thousand_client_federation_trains_in_ci_time(tmp_path):
    result = small_run(tmp_path, 100_000, max_updates=3, eval_every=3)
    assert result.summary["global_updates"] == 3
    assert result.summary["executed_per_aggregated"] == 1.0
    assert 999 <= result.summary["accounting"]["in_flight"] <= 1000


def test_concurrency_is_reported_where_it_would_be_ignored(tmp_path, capsys):
    """concurrency is an algorithm-specific field like buffer_size: Python warns, ``jaxfl run``
    refuses it for one algorithm that does not read it and gives it to those that do in a
    comparison or a sweep (it stopped a FedBuff-against-PORT comparison). With concurrency given,
    FedBuff's clients_per_round (its fallback) is unread too: a sweep over it ran equal cells."""
    from jaxfl.cli import main
    from jaxfl.config import ConfigError, validate
    from jaxfl.sweep import expand

    with pytest.warns(UserWarning, match=r"concurrency=5 is ignored: fedcompass does not read it \(read by "
                                         r"fedasync, fedbuff, fedasmu\)"):
        validate(RunConfig(algorithm="fedcompass", concurrency=5))
    with pytest.warns(UserWarning, match="clients_per_round=4 is ignored: fedbuff does not read it"):
        validate(RunConfig(algorithm="fedbuff", clients=10, concurrency=5, clients_per_round=4))
    with pytest.raises(ConfigError, match="concurrency=50 is not allowed: at most the number of clients"):
        validate(RunConfig(algorithm="fedbuff", clients=10, concurrency=50))
    assert validate(RunConfig(algorithm="fedasmu", clients=10, concurrency=3)).concurrency == 3

    common = ["--timing-only", "--dataset", "synthetic_iid", "--partition", "natural", "--model", "logreg",
              "--clients", "20", "--max-updates", "4", "--no-progress"]
    with pytest.raises(SystemExit) as ended:
        main(["run", "--algorithm", "port", "--concurrency", "5", *common, "--out", str(tmp_path / "one")])
    assert ended.value.code == 2 and not (tmp_path / "one").exists()
    assert "concurrency=5 is not allowed with algorithm port: it never reads it" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ended:
        main(["run", "--algorithm", "fedbuff", "--concurrency", "5", "--clients-per-round", "4", *common,
              "--out", str(tmp_path / "both")])
    assert ended.value.code == 2 and "clients_per_round=4 is not allowed with algorithm fedbuff" in \
        capsys.readouterr().err
    assert main(["run", "--algorithm", "fedbuff,port", "--concurrency", "5", *common, "--out", str(tmp_path / "two")]) == 0
    assert "concurrency=5 applies to fedbuff only (port does not read it)" in capsys.readouterr().err
    runs = {json.loads((run / "config.json").read_text())["config"]["algorithm"]: run for run in (tmp_path / "two").iterdir()}
    assert json.loads((runs["fedbuff"] / "summary.json").read_text())["policy"]["concurrency"] == 5
    assert json.loads((runs["port"] / "config.json").read_text())["config"]["server"].get("concurrency") is None

    with pytest.raises(ConfigError, match=r"clients_per_round=\[2, 4\] is not allowed: no cell of this sweep reads it"):
        expand({"algorithm": "fedbuff", "clients": 20, "concurrency": 5}, {"clients_per_round": [2, 4]}, "sweeps/x")
    cells, notes = expand({"clients": 20, "concurrency": 5}, {"algorithm": ["fedbuff", "port"]}, "sweeps/x")
    assert [cell.config.concurrency for cell in cells] == [5, None]
    assert notes == ["concurrency applies only to the cells that read it (algorithm=fedbuff)"]
