"""Per-client hook state (jaxfl.client_state): placed on the device, in host RAM or in a memmap under
the run directory, with the same results in every placement, bit for bit (the hooks gather the same
rows and run the same arithmetic on them wherever the table lives), and resumable."""
import os

import jax
import numpy as np
import pytest

from jaxfl.client_state import ClientState, ClientStatePlacementWarning
from jaxfl.config import ConfigError, RunConfig
from jaxfl.experiment import resume_experiment, run_experiment
from jaxfl.testing import assert_same_run, events_without_wall_time

from conftest import Interrupted


def cc_run(tmp_path, name, **changes):
    values = dict(algorithm="ccfedavg", algorithm_options={"strategy": "cc_c", "switch_round": 2},
                  dataset="synthetic_iid", partition="natural", clients=8, model="logreg", local_steps=2,
                  batch_size=8, max_updates=4, target_accuracy=0.5, stop_at_target=False, client_optimizer="sgd", client_lr=0.05,
                  progress=False, checkpoint_every=None, output_dir=str(tmp_path), run_name=name)
    return run_experiment(RunConfig(**{**values, **changes}))


def test_host_placement_gives_the_device_placements_run_bit_for_bit(tmp_path):
    device = cc_run(tmp_path, "device", client_state="device")
    host = cc_run(tmp_path, "host", client_state="host")
    assert device.summary["policy"]["banked_updates"] > 0  # the banks were read, not only written
    for a, b in zip(jax.tree.leaves(device.params), jax.tree.leaves(host.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert events_without_wall_time(device.run_dir) == events_without_wall_time(host.run_dir)
    memory = {name: result.summary["device_memory"] for name, result in (("device", device), ("host", host))}
    model = memory["device"]["model_bytes"]
    assert memory["device"]["client_state_placement"] == "device" and memory["host"]["client_state_placement"] == "host"
    assert memory["device"]["client_state_bytes"] == memory["host"]["client_state_bytes"] == 2 * 8 * model  # 2 banks
    assert memory["device"]["hook_state_bytes"] == 2 * 8 * model and memory["host"]["hook_state_bytes"] == 0


def test_device_bytes_do_not_grow_with_the_federation_on_the_host(tmp_path):
    peaks = {}
    for clients in (50, 500):
        result = cc_run(tmp_path, f"c{clients}", algorithm_options={"strategy": "cc"}, clients=clients,
                        clients_per_round=5, max_updates=2, client_state="host")
        memory = result.summary["device_memory"]
        assert memory["client_state_bytes"] == clients * memory["model_bytes"]  # the bank: one model per client
        assert memory["hook_state_bytes"] == 0
        peaks[clients] = memory["peak_model_state_bytes"] + memory["peak_client_rows_bytes"]
        assert memory["peak_client_rows_bytes"] <= 8 * memory["model_bytes"]  # a round's rows, padded: not C
    assert abs(peaks[500] - peaks[50]) < 10 * memory["model_bytes"]  # far less than the 450 models of the bank


@pytest.mark.parametrize("placement", ["host", "memmap"])
def test_host_placements_checkpoint_the_tables_and_resume_bit_identically(tmp_path, crash_after_saves, placement):
    changes = dict(client_state=placement, max_updates=6, checkpoint_every=2)
    whole = cc_run(tmp_path, "whole", **changes)
    saved = os.path.join(whole.run_dir, "checkpoints", "ckpt-000006", "client_state")
    files = sorted(os.listdir(saved))  # the checkpoint holds its own copy of the tables
    assert {tuple(name.split(".")[:2]) for name in files} == {("ccfedavg_banks", "delta"), ("ccfedavg_banks", "model")}
    if placement == "memmap":  # the live tables are files under the run dir, equal to the final checkpoint's
        assert sorted(os.listdir(os.path.join(whole.run_dir, "client_state"))) == files
        for name in files:
            np.testing.assert_array_equal(np.load(os.path.join(saved, name)),
                                          np.load(os.path.join(whole.run_dir, "client_state", name)))
    else:
        assert not os.path.exists(os.path.join(whole.run_dir, "client_state"))

    disarm = crash_after_saves(2)
    with pytest.raises(Interrupted):
        cc_run(tmp_path, "killed", **changes)
    disarm()
    resumed = resume_experiment(os.path.join(tmp_path, "killed"), progress=False)
    assert_same_run(whole, resumed)
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_automatic_choice_falls_back_to_the_host_and_says_so(monkeypatch):
    import jaxfl.client_state as client_state

    rows = {"hook": {"table": {"w": np.zeros(3, np.float32), "c": np.ones(2, np.float32)}}}
    assert ClientState(rows, num_clients=10).placement == "device"  # 200 bytes fit any device
    monkeypatch.setattr(client_state, "free_device_memory", lambda: 400)  # a quarter: 100 bytes < 200
    with pytest.warns(ClientStatePlacementWarning, match="placed on host"):
        state = ClientState(rows, num_clients=10)
    assert state.placement == "host" and state.device_bytes == 0
    np.testing.assert_array_equal(np.asarray(state.rows("hook", "table", [9, 0])["c"]), np.ones((2, 2)))
    monkeypatch.setattr(client_state, "available_host_memory", lambda: 300)  # half: 150 bytes < 200
    with pytest.warns(ClientStatePlacementWarning, match="placed on memmap"):
        state = ClientState(rows, num_clients=10)
    assert state.placement == "memmap"
    state.set_rows("hook", "table", [4, 7], {"w": np.ones((2, 3)), "c": np.full((2, 2), 5.0)}, valid=[True, False])
    got = state.rows("hook", "table", [4, 7])
    np.testing.assert_array_equal(np.asarray(got["c"]), [[5.0, 5.0], [1.0, 1.0]])  # the invalid row kept its value
    assert os.path.isfile(os.path.join(state.directory, "hook.table.0.npy"))


@pytest.mark.parametrize("changes, message", [
    (dict(client_state="disk"), "one of auto, device, host, memmap"),
    (dict(algorithm="fedavg", client_state="host"), "keeps no per-client state"),
    (dict(algorithm="ccfedavg", algorithm_options={"strategy": "strategy1"}, client_state="memmap"),
     "keeps no per-client state"),
])
def test_a_placement_with_nothing_to_place_is_refused_before_any_work(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        run_experiment(RunConfig(**{"output_dir": str(tmp_path), "progress": False, **changes}))
    assert not os.listdir(tmp_path)


def test_the_cli_takes_the_placement(tmp_path):
    from jaxfl.cli import main

    assert main(["run", "--algorithm", "fedasmu", "--dataset", "synthetic_iid", "--partition", "natural",
                 "--clients", "4", "--model", "logreg", "--local-steps", "2", "--max-updates", "2",
                 "--target-accuracy", "0.5", "--no-eval-at-start",
                 "--client-state", "host", "--no-progress", "--checkpoint-every", "none",
                 "--output-dir", str(tmp_path), "--run-name", "asmu"]) == 0
    import json
    with open(os.path.join(tmp_path, "asmu", "summary.json")) as handle:
        memory = json.load(handle)["device_memory"]
    assert memory["client_state_placement"] == "host" and memory["hook_state_bytes"] == 4 * 2 * 4  # FedASMU's (C, 2) (γ, ν)


@pytest.mark.parametrize("placement", ["device", "host", "memmap"])
def test_every_placement_refuses_a_client_out_of_range_or_written_twice(tmp_path, placement):
    """On the device a gather clamped (row 7 of 4 read row 3) and a scatter dropped row 9, silently,
    where host RAM raised an IndexError: the placements gave different runs."""
    from jaxfl.scheduler.simulation import PluginError

    rows = {"hook": {"table": {"w": np.arange(1, dtype=np.float32)}}}
    state = ClientState(rows, num_clients=4, placement=placement, directory=str(tmp_path))
    for clients in ([7, 0], [-1]):
        with pytest.raises(PluginError, match=rf"client table hook/table: client ids \[{clients[0]}\] are out of "
                                              r"range: 0 to 3"):
            state.rows("hook", "table", clients)
    with pytest.raises(PluginError, match=r"client ids \[9\] are out of range"):
        state.set_rows("hook", "table", [9], {"w": np.ones((1, 1), np.float32)})
    with pytest.raises(PluginError, match=r"a write names clients \[2\] more than once"):
        state.set_rows("hook", "table", [2, 2], {"w": np.ones((2, 1), np.float32)})
    # a repeat in a padding row (valid False) is fine: the hooks pad with a client already there; so is
    # any id there, -1 included (it is not written)
    state.set_rows("hook", "table", [2, 2], {"w": np.full((2, 1), 5.0, np.float32)}, valid=[True, False])
    state.set_rows("hook", "table", [1, -1], {"w": np.full((2, 1), 7.0, np.float32)}, valid=[True, False])
    np.testing.assert_array_equal(np.asarray(state.rows("hook", "table", [2, 2, 0, 1])["w"]),
                                  [[5.0], [5.0], [0.0], [7.0]])
    np.testing.assert_array_equal(np.asarray(state.rows("hook", "table", np.array([1.0, 2.0]))["w"]), [[7.0], [5.0]])


@pytest.mark.parametrize("placement", ["device", "host", "memmap"])
def test_a_write_of_another_number_of_rows_than_clients_is_refused_naming_both(tmp_path, placement):
    """A hook that padded its values to 8 rows for 5 clients met, on the device, kernels/tree's "leaf [0] of
    values has shape (11, 10): 8 rows ... expected" (the 11: the engine's own padding), naming neither the
    hook's table nor its 5 clients; in host RAM numpy's broadcasting error."""
    from jaxfl.scheduler.simulation import PluginError

    rows = {"hook": {"table": {"w": np.zeros(10, np.float32)}}}
    state = ClientState(rows, num_clients=20, placement=placement, directory=str(tmp_path))
    with pytest.raises(PluginError, match=r"client table hook/table: a write of 5 clients got leaf 0 of shape "
                                          r"\(8, 10\); one row per client named .*: \(5, 10\)"):
        state.set_rows("hook", "table", [0, 1, 2, 3, 4], {"w": np.ones((8, 10), np.float32)})
    with pytest.raises(PluginError, match=r"of shape \(2, 3\); .* each of the table's shape \(10,\)"):
        state.set_rows("hook", "table", [0, 1], {"w": np.ones((2, 3), np.float32)})
    with pytest.raises(PluginError, match="a write of 2 leaves, the table has 1"):
        state.set_rows("hook", "table", [0, 1], {"w": np.ones((2, 10), np.float32), "v": np.ones((2, 10))})
