"""Each client's own network from a trace: ``latency`` and ``bandwidth`` columns beside the seconds
per step (``jaxfl run --time-per-step trace.csv``, or ``time_per_step={...}`` in Python). Every
client's transfers took the config's one latency and bandwidth, and a trace's network columns were
not read (a note said so): a fleet of phones on 4G and on fibre trained as if on one network."""
import dataclasses
import json
import os
import re
import warnings

import numpy as np
import pytest

import jaxfl
from jaxfl.cli import main
from jaxfl.testing import assert_same_run
from jaxfl.user_inputs import load_time_per_step

LOGREG_BYTES = (784 * 10 + 10) * 4  # one transfer of the logistic regression's float32 parameters


def _events(run_dir):
    import csv

    with open(os.path.join(run_dir, "events.csv"), newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_trace_s_network_columns_are_read_in_the_units_their_names_give(tmp_path):
    (tmp_path / "trace.csv").write_text("client_id,time_per_step,latency_ms,bandwidth_mbps,os\n"
                                        "1,0.2,50,8,android\n0,0.1,20,80,ios\n")
    with pytest.warns(UserWarning, match="read columns 'time_per_step', 'latency_ms', 'bandwidth_mbps' in the order "
                                         "of 'client_id'; not read: 'os'"):
        trace = load_time_per_step(str(tmp_path / "trace.csv"))
    assert trace.dtype.names == ("time_per_step", "latency", "bandwidth")
    np.testing.assert_allclose(trace["time_per_step"], [0.1, 0.2])
    np.testing.assert_allclose(trace["latency"], [0.02, 0.05])  # seconds
    np.testing.assert_allclose(trace["bandwidth"], [1e7, 1e6])  # bytes per second: Mbit/s ÷ 8
    (tmp_path / "other.csv").write_text("client,seconds_per_step,latency_s,bandwidth_kbps\n0,0.1,0.5,800\n")
    other = load_time_per_step(str(tmp_path / "other.csv"))
    assert (float(other["latency"][0]), float(other["bandwidth"][0])) == (0.5, 1e5)


@pytest.mark.parametrize("column, unit", [("latency", "latency_s or latency_ms"),
                                          ("bandwidth", "bandwidth_bytes_per_s, bandwidth_kbps or bandwidth_mbps")])
def test_a_network_column_whose_name_gives_no_unit_is_not_read_and_the_note_names_the_units(tmp_path, column, unit):
    # milliseconds or seconds, bits or bytes: a factor of 1,000 or 8 is not guessed
    (tmp_path / "trace.csv").write_text(f"client_id,time_per_step,{column}\n0,0.1,20\n1,0.2,50\n")
    with pytest.warns(UserWarning, match=f"not read: '{column}' \\(to read '{column}' as each client's {column}, name "
                                         f"its unit: {unit}"):
        times = load_time_per_step(str(tmp_path / "trace.csv"))
    assert times.dtype.names is None and times.tolist() == [0.1, 0.2]


@pytest.mark.parametrize("text, said", [
    ("client_id,time_per_step,latency_ms,latency_s\n0,0.1,20,0.02\n", "has 2 columns of latency ('latency_ms', "
                                                                       "'latency_s'): keep one"),
    ("client_id,time_per_step,bandwidth_mbps\n0,0.1,fast\n", "line 2, column 'bandwidth_mbps': 'fast' is not a number"),
])
def test_a_trace_s_network_columns_that_cannot_be_read_are_refused_in_one_line(tmp_path, text, said):
    (tmp_path / "trace.csv").write_text(text)
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        load_time_per_step(str(tmp_path / "trace.csv"))


def test_each_client_s_round_takes_its_own_transfers(tmp_path):
    """The arrival of each client's first round: steps · t_i + 2 · (latency_i + model_bytes / bandwidth_i)."""
    (tmp_path / "trace.csv").write_text("client_id,time_per_step,latency_ms,bandwidth_mbps\n"
                                        "0,0.1,20,80\n1,0.2,50,8\n2,0.1,0,8000\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert main(["run", "--timing-only", "--algorithm", "fedavg", "--model", "logreg", "--clients", "3",
                     "--local-steps", "5", "--max-updates", "2", "--jitter", "0", "--time-per-step",
                     str(tmp_path / "trace.csv"), "--no-progress", "--output-dir", str(tmp_path), "--run-name",
                     "net"]) == 0
    first = {int(row["client"]): float(row["time"]) for row in _events(tmp_path / "net")
             if row["event"] == "arrival" and row["version"] == "0"}
    expected = {client: 5 * step + 2 * (latency + LOGREG_BYTES / bandwidth)
                for client, (step, latency, bandwidth) in enumerate([(0.1, 0.02, 1e7), (0.2, 0.05, 1e6),
                                                                     (0.1, 0.0, 1e9)])}
    assert first == pytest.approx(expected, rel=1e-12)
    saved = np.load(tmp_path / "net" / "client_time_per_step.npy")
    assert saved.dtype.names == ("time_per_step", "latency", "bandwidth")


def test_the_config_s_latency_beside_a_latency_column_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "trace.csv").write_text("client_id,time_per_step,latency_s\n0,0.1,0.5\n1,0.2,0.1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(SystemExit) as refused:
            main(["run", "--algorithm", "fedavg", "--model", "logreg", "--clients", "2", "--latency", "0.3",
                  "--time-per-step", str(tmp_path / "trace.csv"), "--no-progress", "--output-dir",
                  str(tmp_path / "runs")])
    assert refused.value.code == 2
    assert "latency=0.3 is not allowed with a time_per_step trace that has a latency column" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    # a column the trace lacks is the config's for every client
    (tmp_path / "bandwidth.csv").write_text("client_id,time_per_step,bandwidth_bytes_per_s\n0,0.1,1e6\n1,0.2,5e5\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert main(["run", "--timing-only", "--algorithm", "fedavg", "--model", "logreg", "--clients", "2",
                     "--local-steps", "5", "--max-updates", "1", "--jitter", "0", "--latency", "0.25",
                     "--time-per-step", str(tmp_path / "bandwidth.csv"), "--no-progress", "--output-dir",
                     str(tmp_path / "mixed"), "--run-name", "mixed"]) == 0
    first = {int(row["client"]): float(row["time"]) for row in _events(tmp_path / "mixed" / "mixed")
             if row["event"] == "arrival"}
    assert first == pytest.approx({0: 0.5 + 2 * (0.25 + LOGREG_BYTES / 1e6), 1: 1.0 + 2 * (0.25 + LOGREG_BYTES / 5e5)})


@pytest.mark.parametrize("algorithm", ["fedbuff", "fedasmu"])
def test_a_run_on_a_trace_given_in_python_resumes_bit_for_bit(tmp_path, algorithm):
    """The columns as a mapping; FedASMU's fetch of the newest model costs the client's own request
    latency and download. The interrupted run resumes from its checkpoint reading the trace back."""
    from jaxfl.testing import _Interrupted, _interrupt_after

    trace = {"time_per_step": [0.1, 0.15, 0.3, 0.2], "latency": [0.05, 0.5, 0.01, 0.2],
             "bandwidth": [1e6, 2e5, np.inf, 5e5]}
    config = jaxfl.RunConfig(algorithm=algorithm, model="logreg", clients=4, local_steps=4, batch_size=8,
                             max_updates=6, buffer_size=2, checkpoint_every=1, progress=False,
                             output_dir=str(tmp_path), run_name="full")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (fedasmu: buffer_size is not read)
        full = jaxfl.run_experiment(config, time_per_step=trace)
        with _interrupt_after(6):
            with pytest.raises(_Interrupted):
                jaxfl.run_experiment(dataclasses.replace(config, run_name="cut"), time_per_step=trace)
        resumed = jaxfl.resume_experiment(str(tmp_path / "cut"), progress=False)
    assert_same_run(full, resumed, "interrupted + resumed vs uninterrupted")
    recorded = json.loads((tmp_path / "full" / "config.json").read_text())["user_inputs"]["time_per_step"]
    assert recorded["file"] == "client_time_per_step.npy"
    arrivals = [row for row in _events(tmp_path / "full") if row["event"] == "arrival"]
    slowest_link = [float(row["time"]) for row in arrivals if row["client"] == "1"][0]
    assert slowest_link >= 2 * (0.5 + LOGREG_BYTES / 2e5)  # its two transfers at least


def test_a_trace_s_network_values_are_checked_before_any_work():
    with pytest.raises(ValueError, match=r"time_per_step's latency\[1\]=-0.1 is not allowed: seconds of latency per "
                                         r"model transfer, finite, from 0 to 1e30"):
        jaxfl.run_experiment(jaxfl.RunConfig(model="logreg", clients=2, progress=False, output_dir="/nonexistent"),
                             time_per_step={"time_per_step": [0.1, 0.2], "latency": [0.0, -0.1]})
    with pytest.raises(ValueError, match="time_per_step's column 'bandwith' is not allowed"):
        jaxfl.run_experiment(jaxfl.RunConfig(model="logreg", clients=2, progress=False, output_dir="/nonexistent"),
                             time_per_step={"time_per_step": [0.1, 0.2], "bandwith": [1e6, 1e6]})


@pytest.mark.parametrize("column, bytes_per_second", [("bandwidth_MBps", 1e6), ("Bandwidth (KBps)", 1e3),
                                                      ("bandwidth_Mbps", 1e6 / 8), ("bandwidth_mbps", 1e6 / 8)])
def test_a_capital_b_is_bytes_and_a_small_one_bits(tmp_path, column, bytes_per_second):
    # bandwidth_MBps was read as megabits (the name is compared lowercased): transfers 8x too slow, no note
    (tmp_path / "trace.csv").write_text(f"client_id,time_per_step,{column}\n0,0.1,1\n1,0.1,2\n")
    trace = load_time_per_step(str(tmp_path / "trace.csv"))
    np.testing.assert_allclose(trace["bandwidth"], [bytes_per_second, 2 * bytes_per_second])


@pytest.mark.parametrize("column, value, said", [
    ("latency_ms", "-7", "line 3, column 'latency_ms': '-7' is not allowed: seconds of latency per model transfer"),
    ("latency_s", "1e308", "line 3, column 'latency_s': '1e308' is not allowed: seconds of latency per model "
                           "transfer, finite, from 0 to 1e30"),
    ("bandwidth_bytes_per_s", "1e-320", "line 3, column 'bandwidth_bytes_per_s': '1e-320' is not allowed: bytes per "
                                        "second, from 1e-30"),
])
def test_a_network_value_out_of_range_is_refused_naming_its_line_as_written(tmp_path, column, value, said):
    # -7 ms was said as "latency[0]=-0.007" (the client's index, in seconds); 1e308 s passed, and the
    # run died at its first arrival (time=inf) with its folder half written
    (tmp_path / "trace.csv").write_text(f"client_id,time_per_step,{column}\n1,0.1,3\n0,0.2,{value}\n")
    with pytest.raises(ValueError, match=re.escape(said)):
        load_time_per_step(str(tmp_path / "trace.csv"))


def test_a_dataframe_is_a_trace_and_its_to_dict_or_a_none_is_refused_by_name():
    pandas = pytest.importorskip("pandas")
    from jaxfl.scheduler.speeds import check_time_per_step

    frame = pandas.DataFrame({"time_per_step": [0.1, 0.2], "latency": [0.05, 0.5]})
    assert check_time_per_step(frame, 2)["latency"].tolist() == [0.05, 0.5]
    with pytest.raises(ValueError, match=r"latency column is a mapping \(dict\); give its values in client order"):
        check_time_per_step(frame.to_dict(), 2)
    with pytest.raises(ValueError, match=r"time_per_step's latency\[0\]=None is not allowed"):
        check_time_per_step({"time_per_step": [0.1, 0.2], "latency": [None, 0.1]}, 2)


def test_fedat_s_oracle_tiers_rank_clients_by_their_rounds_with_their_network():
    """The oracle ranked clients by t_i alone: a client computing in 0.6 s whose transfers took 1.6 s
    joined the fastest tier, where the measured profiling round placed it last."""
    from jaxfl.algorithms.fedat import FedAT
    from tests.conftest import RecordingBackend
    from jaxfl.scheduler.simulation import Simulation
    from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig

    trace = {"time_per_step": [0.1, 0.12, 0.3], "latency": [0.0, 0.8, 0.0]}
    speeds = ClientSpeeds(SpeedConfig(jitter=0.0), 3, seed=0, model_bytes=LOGREG_BYTES, time_per_step=trace)
    policy = FedAT(5, tier_ratio=2.0, profiling="oracle")
    Simulation(policy, speeds, [1 / 3] * 3, RecordingBackend(), max_updates=1).run()
    assert policy.tiers == [[0], [2, 1]]  # client 1: (5 · 0.12 + 1.6) / 5 = 0.44 s a step, after client 2's 0.3
    plain = FedAT(5, tier_ratio=2.0, profiling="oracle")
    Simulation(plain, ClientSpeeds(SpeedConfig(jitter=0.0), 3, seed=0, time_per_step=[0.1, 0.12, 0.3]),
               [1 / 3] * 3, RecordingBackend(), max_updates=1).run()
    assert plain.tiers == [[0, 1], [2]]  # no communication: t_i, as before
