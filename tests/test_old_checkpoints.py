"""Checkpoints written before the per-client state store (jaxfl.client_state) resume: CC-FedAvg's
banks and FedASMU's server tables, then device arrays in the hooks' state, are moved into the store
on loading, and the resumed run ends as the old code's uninterrupted run did: its event log exactly,
its model bit for bit on a host like the one that wrote them and to float32 reassociation on others.

``tests/data/checkpoints_before_client_state/NAME`` was made by jaxfl at commit 95f2631, the last
before the store: the run of :data:`CONFIG` ran to its end (4 updates, checkpoints every 2), its
final parameters were saved as ``final_params.npz``, then its last checkpoint and ``summary.json``
were deleted and ``checkpoints/latest`` pointed at ``ckpt-000002``, as if it had been killed there.
"""
import csv
import os
import shutil

import jax
import numpy as np
import pytest

from jaxfl.algorithms.base import DeviceHook
from jaxfl.algorithms.ccfedavg import UpdateBanks
from jaxfl.experiment import resume_experiment
from jaxfl.resume import ResumeError, read_record
from jaxfl.testing import events_without_wall_time

OLD_RUNS = os.path.join(os.path.dirname(__file__), "data", "checkpoints_before_client_state")
CONFIG = dict(dataset="digits", model="logreg", clients=4, local_steps=2, batch_size=16, max_updates=4,
              checkpoint_every=2, client_optimizer="sgd", client_lr=0.05, stop_at_target=False)


def _timer_details_blank(log: str) -> str:
    """An event log's text with each timer row's detail (its last column) left empty."""
    return "".join(",".join(line.split(",", 7)[:7]) + ",\n" if ",timer," in line else line
                   for line in log.splitlines(keepends=True))


@pytest.mark.parametrize("name", ["ccfedavg_cc_c", "fedasmu"])  # cc_c: both banks, delta and model
def test_a_checkpoint_from_before_the_client_state_store_resumes_to_the_old_runs_end(tmp_path, name):
    run_dir = str(shutil.copytree(os.path.join(OLD_RUNS, name), tmp_path / name))
    assert "client_state" not in read_record(run_dir)["config"]["engine"]
    uninterrupted_events = events_without_wall_time(run_dir)  # the old run's whole log, past the checkpoint
    resumed = resume_experiment(run_dir, progress=False)
    assert resumed.summary["global_updates"] == 4 and resumed.summary["resumes"] == 1
    history = resumed.summary["device_history"]  # the old checkpoint did not say what trained its updates
    assert history[0] == {"from_update": 0, "backend": None, "devices": None, "processes": None}
    assert len(history) == 2 and history[1]["devices"] == resumed.summary["devices"]
    # and which code trained the updates after the resume: other than the checkpoint's (commit 95f2631)
    from jaxfl.experiment import jaxfl_source, library_versions
    assert history[1]["versions"] == library_versions()
    assert history[1].get("jaxfl_commit") == jaxfl_source().get("commit")
    # timer rows name their timer since 2026-12-02: the old log's have no detail, the resumed rows do
    assert _timer_details_blank(events_without_wall_time(run_dir)) == uninterrupted_events
    # the old code's uninterrupted run: bit for bit on a host of the vector width that wrote the file,
    # to float32 reassociation on another (XLA:CPU's dot products sum in lanes of the host's width:
    # an AMD host without AVX-512 differs in the last bits, in the two updates trained after the resume)
    with np.load(os.path.join(run_dir, "final_params.npz")) as saved:
        old_final = [saved[key] for key in saved.files]
    for leaf, old in zip(jax.tree.leaves(resumed.params), old_final, strict=True):
        np.testing.assert_allclose(np.asarray(leaf), old, rtol=1e-5, atol=1e-7)


def test_a_hook_that_cannot_move_its_old_state_is_refused_in_one_line_before_any_work(tmp_path, monkeypatch):
    run_dir = str(shutil.copytree(os.path.join(OLD_RUNS, "ccfedavg_cc_c"), tmp_path / "cc"))
    logs = {name: open(os.path.join(run_dir, name), "rb").read() for name in ("events.csv", "metrics.csv")}
    monkeypatch.setattr(UpdateBanks, "tables_from_state", DeviceHook.tables_from_state)
    with pytest.raises(ResumeError) as refused:
        resume_experiment(run_dir, progress=False)
    message = str(refused.value)
    assert "\n" not in message and "ckpt-000002" in message and "before jaxfl.client_state" in message
    assert "start the run again, or resume it with the jaxfl version that wrote it" in message
    assert {name: open(os.path.join(run_dir, name), "rb").read() for name in logs} == logs
    assert not os.path.exists(os.path.join(run_dir, "summary.json"))


# ``tests/data/checkpoints_before_names/NAME`` was made by jaxfl at commit 91bc49b (2026-11-23), before the
# fields of 2026-11-24 (client_momentum... server_tau...) and the run names of f8afff3: ``jaxfl run --algorithm
# A --dataset digits --model logreg --clients 4 --local-steps 2 --batch-size 16 --max-updates 4
# --checkpoint-every 2 --no-stop-at-target --run-name NAME`` (fedavg_adam: fedavg with --server-optimizer adam),
# then cut back to its checkpoint at update 2 as above.
RUNS_BEFORE_NAMES = os.path.join(os.path.dirname(__file__), "data", "checkpoints_before_names")


def test_a_checkpoint_from_before_the_fields_of_2026_11_24_resumes_to_the_old_runs_end(tmp_path):
    """Refused as "config.json differs from the config ckpt-000002 was written with: client_lr_decay: 1.0
    (ckpt-000002 has no such field); ...": fields the run's config.json does not hold, which nobody edited."""
    from jaxfl.testing import metrics_without_wall_time

    run_dir = str(shutil.copytree(os.path.join(RUNS_BEFORE_NAMES, "fedbuff"), tmp_path / "fedbuff"))
    assert "client_momentum" not in read_record(run_dir)["config"].get("client", {})
    uninterrupted_events = events_without_wall_time(run_dir)
    with open(os.path.join(run_dir, "metrics.csv")) as handle:
        uninterrupted = list(csv.DictReader(handle))
    resumed = resume_experiment(run_dir, progress=False)
    assert resumed.summary["global_updates"] == 4 and resumed.summary["resumes"] == 1
    assert _timer_details_blank(events_without_wall_time(run_dir)) == uninterrupted_events
    # the checkpoint did not say which jaxfl trained its updates: config.json's versions do ("?" in reports)
    from jaxfl.runlog import run_jaxfl_code

    code = run_jaxfl_code(run_dir, resumed.summary)
    assert code.split(" → ")[0] == "0.2.0" and "?" not in code
    rows = metrics_without_wall_time(run_dir)
    assert [row["accuracy"] for row in rows] == [row["accuracy"] for row in uninterrupted]
    # the updates after the resume: the old code's to float32 reassociation (another host, other devices)
    np.testing.assert_allclose([float(row["loss"]) for row in rows], [float(row["loss"]) for row in uninterrupted],
                               rtol=1e-5)


def test_a_checkpoint_whose_server_adam_was_optax_s_is_refused_in_one_line(tmp_path):
    """Before 2026-11-24 server_optimizer "adam" was optax's adam; "adam" is FedOpt's (Reddi et al.) now, so
    such a run cannot go on as it ran (the default fields would have let it go on with the other optimiser)."""
    run_dir = str(shutil.copytree(os.path.join(RUNS_BEFORE_NAMES, "fedavg_adam"), tmp_path / "fedavg_adam"))
    with pytest.raises(ResumeError, match=r"ckpt-000002 was written by a jaxfl before 2026-11-24, whose server_optimizer "
                                          r"'adam' was optax's adam, not the FedOpt adam of Reddi et al\. .* start it again$"):
        resume_experiment(run_dir, progress=False)
