"""The timeline's figures: utilisation counts training (and transfer) time only, not a fault's
offline or late seconds, the same live (Simulation.timeline) and from the event log
(runlog.timeline_stats); and a window of the log counts only what happened in it."""
import os
import pickle

import numpy as np
import pytest

from jaxfl import runlog
from jaxfl.algorithms import build_policy
from jaxfl.config import RunConfig, config_from_mapping
from jaxfl.experiment import run_experiment
from jaxfl.scheduler.faults import ClientFaults, FaultConfig
from jaxfl.scheduler.simulation import Policy, Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, ScriptedSpeeds, SpeedConfig
from tests.conftest import RecordingBackend

TIMING = {"dataset": "synthetic_iid", "partition": "natural", "model": "logreg", "timing_only": True,
          "progress": False, "checkpoint_every": None}


class EveryArrival(Policy):
    """Each client trains ``steps`` steps, again and again; every arrival is a global update."""

    def __init__(self, steps):
        self.local_steps = steps

    def start(self, sim):
        for client in range(sim.num_clients):
            sim.dispatch(client, self.local_steps)

    def on_arrival(self, sim, record):
        sim.aggregate([(record.id, 0.1)])
        sim.reply(record.client)


def columns(rows):
    """The event-log columns runlog.read_events gives, from the simulation's row dicts."""
    def ints(name):
        return np.array([-1 if row[name] is None else row[name] for row in rows], np.int64)

    return {"time": np.array([row["time"] for row in rows]), "event": np.array([row["event"] for row in rows], object),
            "client": ints("client"), "dispatch": ints("dispatch"), "staleness": ints("staleness"),
            "detail": np.array([row["detail"] for row in rows], object)}


def seconds_per_step(client, round):
    return 0.5 + client


def scripted(faults, clients=3, steps=4, max_updates=30, log=None):
    speeds = ScriptedSpeeds(seconds_per_step, clients, latency=0.25)
    fault_model = None if faults is None else ClientFaults(FaultConfig(**faults), clients, seed=7)
    return Simulation(EveryArrival(steps), speeds, np.full(clients, 1 / clients), RecordingBackend(),
                      max_updates=max_updates, faults=fault_model, log=log)


@pytest.mark.parametrize("fault", ["dropout_prob", "delay_prob"])
def test_a_faults_seconds_are_not_busy_time(fault):
    rows = []
    sim = scripted({fault: 1.0, "dropout_mean": 20.0, "delay_factor": 4.0}, log=rows.append)
    sim.run()
    # every round trains 4 steps at 0.5 + client seconds each, plus 0.5 s of transfer
    rounds = [sum(1 for row in rows if row["event"] == "arrival" and row["client"] == c) for c in range(3)]
    assert min(rounds) >= 1
    for client in range(3):
        assert sim.busy_time[client] == pytest.approx(rounds[client] * (4 * (0.5 + client) + 0.5))
    dispatches = [row for row in rows if row["event"] == "dispatch"]
    kind = fault.split("_")[0]
    assert all(row["detail"].startswith(f"{kind} ") and row["detail"].endswith(" s") for row in dispatches)
    if kind == "delay":  # 3x the round late
        assert all(float(row["detail"].split()[1]) == pytest.approx(3 * (4 * (0.5 + row["client"]) + 0.5))
                   for row in dispatches)


@pytest.mark.parametrize("max_time", [2.0, 7.5, 13.0, 30.0])
def test_the_logs_utilisation_equals_the_live_one_with_faults_and_rounds_in_flight(max_time):
    # stopped while rounds are offline or late: live and the log place a fault's seconds first alike
    rows = []
    sim = scripted({"dropout_prob": 0.4, "delay_prob": 0.3, "crash_prob": 0.1, "dropout_mean": 4.0},
                   clients=5, max_updates=40, log=rows.append)
    sim.max_time = max_time
    reason = sim.run()
    end = max_time if reason == "time budget" else sim.now
    live = sim.timeline(end)
    stats = runlog.timeline_stats(columns(rows), num_clients=5, horizon=end)
    assert stats["utilisation_mean"] == pytest.approx(live["utilisation"]["mean"], abs=1e-6)
    assert stats["idle_client_s_total"] == pytest.approx(live["idle_client_seconds"], abs=1e-3)
    assert runlog.dispatch_intervals(columns(rows), end)["offline"].any()
    assert sim.accounting()["in_flight"] > 0  # rounds in flight at the end count too


def test_without_faults_busy_time_is_every_round_from_dispatch_to_arrival():
    rows = []
    sim = scripted(None, log=rows.append)
    sim.run()
    starts = {row["dispatch"]: row["time"] for row in rows if row["event"] == "dispatch"}
    busy = np.zeros(3)
    for row in rows:
        if row["event"] == "arrival":
            busy[row["client"]] += row["time"] - starts[row["dispatch"]]
    assert list(sim.busy_time) == busy.tolist()  # bit for bit: nothing changed without faults
    assert all(row["detail"] is None for row in rows if row["event"] == "dispatch")
    assert not runlog.dispatch_intervals(columns(rows))["offline"].any()


def test_a_log_from_before_the_seconds_were_written_reads_its_faults_as_training():
    events = {"time": np.array([0.0, 0.0, 2.0, 9.0]), "event": np.array(["dispatch", "dispatch", "arrival", "arrival"], object),
              "client": np.array([0, 1, 0, 1]), "dispatch": np.array([0, 1, 0, 1]), "staleness": np.array([-1, -1, 0, 0]),
              "detail": np.array(["group 1; dropout", "delay", None, None], object)}
    spans = runlog.dispatch_intervals(events)
    assert spans["offline"].tolist() == [0.0, 0.0] and spans["label"].tolist() == ["group 1; dropout", "delay"]
    assert runlog.timeline_stats(events)["utilisation_mean"] == pytest.approx((2 + 9) / 18)
    events["detail"] = np.array(["group 1; dropout 1.5 s", "delay 6.0 s", None, None], object)
    spans = runlog.dispatch_intervals(events)
    assert spans["offline"].tolist() == [1.5, 6.0] and spans["label"].tolist() == ["group 1; dropout", "delay"]
    assert runlog.timeline_stats(events)["utilisation_mean"] == pytest.approx((0.5 + 3) / 18)


def test_a_checkpoint_from_before_the_fault_seconds_resumes_counting_none():
    sim = scripted({"dropout_prob": 1.0, "dropout_mean": 3.0}, max_updates=10)
    sim.run()
    assert sim.fault_seconds  # the dropouts in flight
    state = pickle.loads(pickle.dumps(sim)).__dict__
    del state["fault_seconds"]  # as a simulation pickled before they were kept
    restored = Simulation.__new__(Simulation)
    restored.__setstate__(state)
    assert restored.fault_seconds == {}
    restored.attach(RecordingBackend())
    restored.max_updates = 20
    assert restored.run() == "update budget" and 0 < restored.timeline()["utilisation"]["mean"] <= 1


def test_a_dropout_runs_summary_and_log_give_one_utilisation(tmp_path):
    # the reviewer's FedAvg with a third of the rounds offline for a minute: 5.8 % counted busy,
    # where the clients trained 0.44 % of the time
    result = run_experiment(config_from_mapping({**TIMING, "algorithm": "fedavg", "clients": 200, "local_steps": 10,
                                                 "max_updates": 20, "dropout_prob": 0.3, "dropout_mean": 60.0,
                                                 "output_dir": str(tmp_path)}))
    summary = result.summary
    stats = runlog.timeline_stats(runlog.read_events(result.run_dir), num_clients=200,
                                  horizon=summary["virtual_time"])
    assert stats["utilisation_mean"] == pytest.approx(summary["timeline"]["utilisation"]["mean"], abs=1e-6)
    spans = runlog.dispatch_intervals(runlog.read_events(result.run_dir), horizon=summary["virtual_time"])
    trained = np.clip(spans["end"] - (spans["start"] + spans["offline"]), 0.0, None)
    in_flight = spans["end"] - spans["start"]
    assert summary["faults"]["dropout"] > 0 and spans["offline"].sum() > 10 * trained.sum()
    assert summary["timeline"]["utilisation"]["mean"] == pytest.approx(
        trained.sum() / (200 * summary["virtual_time"]), rel=1e-4)
    assert summary["timeline"]["utilisation"]["mean"] < in_flight.sum() / (200 * summary["virtual_time"]) / 5


def fedbuff_log(clients=60, max_updates=80, **faults):
    rows = []
    config = RunConfig(algorithm="fedbuff", clients=clients, concurrency=20, buffer_size=4, local_steps=5, seed=1,
                       heterogeneity="exp")
    fault_model = ClientFaults(FaultConfig(**faults), clients, seed=1) if faults else None
    sim = Simulation(build_policy(config), ClientSpeeds(SpeedConfig(model="exp", mean=0.15), clients, seed=1),
                     np.full(clients, 1 / clients), RecordingBackend(), max_updates=max_updates, log=rows.append,
                     faults=fault_model)
    sim.run()
    return sim, columns(rows)


@pytest.mark.parametrize("faults", [{}, {"dropout_prob": 0.2, "delay_prob": 0.1, "crash_prob": 0.05}])
def test_a_window_counts_only_its_own_aggregations_arrivals_and_dispatches(faults):
    sim, events = fedbuff_log(**faults)
    end = float(events["time"].max())
    for horizon in (end / 7, end / 2, 0.9 * end):
        stats = runlog.timeline_stats(events, num_clients=60, horizon=horizon)
        inside = events["time"] <= horizon
        aggregations = int(np.count_nonzero(inside & (events["event"] == "aggregate")))
        assert 0 < aggregations < sim.version
        assert stats["aggregations"] == aggregations
        assert stats["aggregations_per_hour"] == pytest.approx(aggregations * 3600 / horizon)
        assert stats["arrivals"] == int(np.count_nonzero(inside & (events["event"] == "arrival")))
        assert stats["dispatches"] == int(np.count_nonzero(inside & (events["event"] == "dispatch")))
        # the same as the log as it stood at the horizon
        cut = {name: values[inside] for name, values in events.items()}
        assert stats == runlog.timeline_stats(cut, num_clients=60, horizon=horizon)
    whole = runlog.timeline_stats(events, num_clients=60)
    assert whole == runlog.timeline_stats(events, num_clients=60, horizon=end)
    assert whole["aggregations"] == sim.version  # the whole log: every aggregation, as before


def test_jaxfl_timeline_max_time_titles_the_windows_aggregations(tmp_path):
    pytest.importorskip("matplotlib")
    from jaxfl import plot

    result = run_experiment(config_from_mapping({**TIMING, "algorithm": "fedbuff", "clients": 300, "concurrency": 50,
                                                 "buffer_size": 5, "max_updates": 200, "output_dir": str(tmp_path)}))
    events = runlog.read_events(result.run_dir)
    horizon = result.summary["virtual_time"] / 4
    inside = int(np.count_nonzero((events["time"] <= horizon) & (events["event"] == "aggregate")))
    assert 0 < inside < 200
    title = plot.timeline_figure(result.run_dir, max_time=horizon, bins=20).axes[0].get_title()
    assert f"{inside} aggregations ({inside * 3600 / horizon:.3g}/virtual h)" in title


def test_the_gantt_chart_shows_a_fault_s_offline_seconds_apart_and_labels_without_them(tmp_path):
    """The coloured bars are training; a dropout's offline seconds are hatched grey, and a row-dict
    reader labels the interval "dropout", not "dropout 61.5 s"."""
    import csv

    from jaxfl.config import RunConfig
    from jaxfl.experiment import run_experiment
    from jaxfl.plot import busy_intervals, timeline_figure

    result = run_experiment(RunConfig(algorithm="fedbuff", clients=8, model="logreg", local_steps=3, buffer_size=2,
                                      max_updates=10, timing_only=True, dropout_prob=0.3, dropout_mean=20.0,
                                      progress=False, output_dir=str(tmp_path)))
    with open(os.path.join(result.run_dir, "events.csv")) as handle:
        rows = list(csv.DictReader(handle))
    dropouts = sum(1 for row in rows if row["event"] == "dispatch" and "dropout" in (row["detail"] or ""))
    arrived = {row["dispatch"] for row in rows if row["event"] == "arrival"}
    arrived_dropouts = sum(1 for row in rows if row["event"] == "dispatch" and row["dispatch"] in arrived
                           and "dropout" in (row["detail"] or ""))
    assert dropouts and arrived_dropouts
    axes = timeline_figure(result.run_dir).axes[0]
    # every dropout, also one still offline when the run ended (drawn up to the end)
    assert len([bars for bars in axes.collections if bars.get_hatch()]) == dropouts > arrived_dropouts
    assert "dropout / delay: offline or late s" in [text.get_text() for text in axes.get_legend().get_texts()]
    assert {label for spans in busy_intervals(rows).values() for _, _, label in spans} <= {"", "dropout"}
