"""XLA_FLAGS a run was made under: recorded in config.json, and said where a resume or a reused run
meets other ones (they do not name a run: most flags change speed, not numbers; the review found
--xla_cpu_enable_fast_math=true moving a FedBuff MLP's parameters by 4e-5 under the same run name,
and a comparison reusing that run without a word)."""
import dataclasses
import json
import os
import warnings

import pytest

from jaxfl import cli
from jaxfl.experiment import resume_experiment, run_experiment, xla_flags
from jaxfl.sweep import run_sweep

FAST_MATH = "--xla_cpu_enable_fast_math=true"


def _written(run_dir):
    with open(os.path.join(run_dir, "config.json")) as handle:
        return json.load(handle)


def test_a_run_records_its_xla_flags_less_the_device_count_and_a_resume_under_others_says_so(small_config,
                                                                                            monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=3 {FAST_MATH}")
    run = run_experiment(dataclasses.replace(small_config, checkpoint_every=1, max_updates=2))
    assert _written(run.run_dir)["xla_flags"] == FAST_MATH  # the device count is the execution plan's
    monkeypatch.setenv("XLA_FLAGS", FAST_MATH)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same flags: nothing said
        resume_experiment(run.run_dir, overrides={"max_updates": 3})
    monkeypatch.delenv("XLA_FLAGS")
    with pytest.warns(UserWarning, match=f"was made with XLA_FLAGS='{FAST_MATH}' and this process, which resumes "
                                         "it, has no XLA_FLAGS: where a flag changes XLA's arithmetic"):
        resumed = resume_experiment(run.run_dir, overrides={"max_updates": 4})
    assert resumed.summary["global_updates"] == 4


def test_a_run_of_a_jaxfl_that_did_not_record_them_resumes_without_a_word(small_config, monkeypatch):
    run = run_experiment(dataclasses.replace(small_config, checkpoint_every=1, max_updates=2))
    path = os.path.join(run.run_dir, "config.json")
    written = _written(run.run_dir)
    assert written["xla_flags"] == xla_flags()  # the test process's own ("" for a user without any)
    del written["xla_flags"]
    with open(path, "w") as handle:
        json.dump(written, handle)
    monkeypatch.setenv("XLA_FLAGS", FAST_MATH)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resume_experiment(run.run_dir, overrides={"max_updates": 3})


def test_a_comparison_and_a_sweep_reusing_a_run_made_under_other_flags_say_so(tmp_path, monkeypatch, capsys):
    flags = ["run", "--algorithm", "fedavg,fedbuff", "--model", "logreg", "--clients", "3", "--local-steps", "2",
             "--batch-size", "8", "--max-updates", "2", "--buffer-size", "2", "--no-progress",
             "--output-dir", str(tmp_path / "compared")]
    monkeypatch.setenv("XLA_FLAGS", FAST_MATH)
    assert cli.main(flags) == 0
    monkeypatch.delenv("XLA_FLAGS")
    with pytest.warns(UserWarning, match="(fedavg|fedbuff)-.* was made with XLA_FLAGS='--xla_cpu_enable_fast_math=true' and "
                                         "this process, which reuses it, has no XLA_FLAGS") as said:
        assert cli.main(flags) == 0
    assert len([w for w in said if "reuses it" in str(w.message)]) == 2  # each reused run
    assert capsys.readouterr().out.count("(reused: it had finished)") == 2

    base = {"model": "logreg", "clients": 3, "local_steps": 2, "batch_size": 8, "max_updates": 2, "buffer_size": 2}
    grid = {"algorithm": ["fedavg", "fedbuff"]}
    monkeypatch.setenv("XLA_FLAGS", FAST_MATH)
    sweep = run_sweep(base, grid, str(tmp_path / "swept"), progress=False)
    monkeypatch.delenv("XLA_FLAGS")
    with pytest.warns(UserWarning, match=r"2 finished cells of this sweep, reused as they are, were made under other "
                                         r"XLA_FLAGS than this process's no XLA_FLAGS \(cell 0, .*: "
                                         r"XLA_FLAGS='--xla_cpu_enable_fast_math=true' and 1 more\)"):
        again = run_sweep(base, grid, sweep.sweep_dir, progress=False)
    assert [cell.run_dir for cell in again.cells] == [cell.run_dir for cell in sweep.cells]
    with warnings.catch_warnings():  # under the flags they were made with: nothing said
        warnings.simplefilter("error")
        monkeypatch.setenv("XLA_FLAGS", FAST_MATH)
        run_sweep(base, grid, sweep.sweep_dir, progress=False)
