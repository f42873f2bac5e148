"""``--log-to wandb`` with the real wandb package in offline mode (no account, no network): one jaxfl
run is one W&B run across a resume, and the rows an interrupted process had sent are not sent again."""
import glob
import json
import os

import pytest

import jaxfl
from jaxfl.experiment import resume_experiment, run_experiment
from jaxfl import loggers
from jaxfl.loggers import WANDB_RUN, WandbLogger

wandb = pytest.importorskip("wandb")


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))


class InterruptAt:
    """Ctrl-C from inside an evaluation: the run stops with the checkpoint before it, so its resume
    evaluates the rows after that checkpoint again."""

    def __init__(self, row):
        self.row, self.seen = row, 0

    def log(self, row, step):
        self.seen += 1
        if self.seen == self.row:
            raise KeyboardInterrupt

    def close(self):
        pass


@pytest.fixture
def sent(monkeypatch):
    """The (step, accuracy) of every row WandbLogger hands to the W&B run, which still gets it."""
    calls = []
    real_init = wandb.init

    def init(**options):
        run = real_init(**options)
        real_log = run.log

        def log(data, step=None, **more):
            calls.append((step, data["accuracy"]))
            return real_log(data, step=step, **more)

        run.log = log
        return run

    monkeypatch.setattr(wandb, "init", init)
    return calls


def test_a_resumed_run_goes_on_in_its_w_and_b_run_without_sending_a_row_twice(tmp_path, sent):
    config = jaxfl.RunConfig(algorithm="fedbuff", model="logreg", clients=5, local_steps=3, buffer_size=2,
                             max_updates=8, checkpoint_every=2, stop_at_target=False, progress=False,
                             output_dir=str(tmp_path), run_name="cut")
    with pytest.raises(jaxfl.RunInterrupted) as interrupted:
        run_experiment(config, loggers=["wandb", InterruptAt(6)])  # versions 0..5 sent; checkpoint of 4
    run_dir = interrupted.value.run_dir
    assert interrupted.value.update == 4
    first = json.load(open(os.path.join(run_dir, WANDB_RUN)))
    assert first["last_step"] == 5 and [step for step, _ in sent] == [0, 1, 2, 3, 4, 5]
    resume_experiment(run_dir, progress=False)  # config.json's log_to: wandb again
    assert json.load(open(os.path.join(run_dir, WANDB_RUN))) == {"id": first["id"], "last_step": 8,
                                                                 "run_dir": os.path.realpath(run_dir)}
    # W&B's own folders: both processes wrote to the one run id
    runs = sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*")))
    assert len(runs) == 2 and all(run.endswith(f"-{first['id']}") for run in runs)
    with open(os.path.join(run_dir, "metrics.csv")) as handle:
        metrics = [line.split(",") for line in handle.read().splitlines()]
    columns = metrics[0]
    rows = [(int(row[columns.index("version")]), float(row[columns.index("accuracy")])) for row in metrics[1:]]
    assert sent == rows  # each metrics row once (version 5's evaluation was sent before the interrupt)


def test_a_new_run_directory_is_a_new_w_and_b_run_and_a_given_id_wins(tmp_path, sent):
    base = dict(algorithm="fedavg", model="logreg", clients=3, local_steps=2, max_updates=2, stop_at_target=False,
                progress=False, output_dir=str(tmp_path))
    one = run_experiment(jaxfl.RunConfig(**base, run_name="one"), loggers=["wandb"])
    two = run_experiment(jaxfl.RunConfig(**base, run_name="two"), loggers=[WandbLogger(id="mine")])
    ids = [json.load(open(os.path.join(run.run_dir, WANDB_RUN)))["id"] for run in (one, two)]
    assert ids[0] != "mine" and ids[1] == "mine"


def test_a_damaged_w_and_b_record_is_refused_with_what_to_do(tmp_path):
    config = jaxfl.RunConfig(algorithm="fedavg", model="logreg", clients=3, local_steps=2, max_updates=4,
                             checkpoint_every=1, stop_at_target=False, progress=False, output_dir=str(tmp_path),
                             run_name="cut")
    with pytest.raises(jaxfl.RunInterrupted) as interrupted:
        run_experiment(config, loggers=["wandb", InterruptAt(3)])
    record = os.path.join(interrupted.value.run_dir, WANDB_RUN)
    for damaged in ('{"id": ', '{"id": "abc", "last_step": "5"}', '["abc"]'):
        with open(record, "w") as handle:
            handle.write(damaged)
        with pytest.raises(ValueError, match=f"{record} is not allowed: the W&B run record"):
            resume_experiment(interrupted.value.run_dir, progress=False)


def test_one_logger_object_over_several_runs_copies_and_a_requeued_job_s_id(tmp_path, sent, monkeypatch):
    """A review's three ways to a wrong W&B run: one WandbLogger object kept the last step of the run it
    logged before and skipped a new run's first rows; a cp -r copy (the way to extend a sweep's cell)
    went on in the original's W&B run; WANDB_RUN_ID (a requeued SLURM job's) was overridden."""
    import shutil

    base = dict(algorithm="fedavg", model="logreg", clients=3, local_steps=2, stop_at_target=False, progress=False,
                output_dir=str(tmp_path))
    logger = WandbLogger()
    first = run_experiment(jaxfl.RunConfig(**base, max_updates=4, run_name="first"), loggers=[logger])
    del sent[:]
    second = run_experiment(jaxfl.RunConfig(**base, max_updates=2, run_name="second"), loggers=[logger])
    assert [step for step, _ in sent] == [0, 1, 2]  # all of the new run's rows
    copy = os.path.join(str(tmp_path), "copy")
    shutil.copytree(first.run_dir, copy)
    del sent[:]
    with pytest.warns(UserWarning, match=r"copy is a copy of run .*first, whose W&B run \(\w+\) it leaves to it"):
        resume_experiment(copy, overrides={"max_updates": 6}, loggers=[WandbLogger()], progress=False)  # extended apart
    ids = {json.load(open(os.path.join(run, WANDB_RUN)))["id"] for run in (first.run_dir, second.run_dir, copy)}
    assert len(ids) == 3 and [step for step, _ in sent] == [5, 6]
    # a moved folder (the second review's regression: it took a W&B run of its own) keeps its W&B run
    moved = os.path.join(str(tmp_path), "moved")
    shutil.move(second.run_dir, moved)
    resume_experiment(moved, overrides={"max_updates": 3}, loggers=[WandbLogger()], progress=False)
    assert json.load(open(os.path.join(moved, WANDB_RUN)))["id"] in ids
    # WANDB_RUN_ID: the first run of the process without a W&B run takes it, the next (a comparison's) its own
    monkeypatch.setattr(loggers, "_environment_id_taken_by", None)
    monkeypatch.setenv("WANDB_RUN_ID", "requeued")
    third = run_experiment(jaxfl.RunConfig(**base, max_updates=1, run_name="third"), loggers=["wandb"])
    fourth = run_experiment(jaxfl.RunConfig(**base, max_updates=1, run_name="fourth"), loggers=["wandb"])
    assert [json.load(open(os.path.join(run.run_dir, WANDB_RUN)))["id"] == "requeued" for run in (third, fourth)] == \
        [True, False]
