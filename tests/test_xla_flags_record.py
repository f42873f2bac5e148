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
                                         r"XLA_FLAGS than this process has \(no XLA_FLAGS; cell 0, .*: "
                                         r"XLA_FLAGS='--xla_cpu_enable_fast_math=true' and 1 more\)"):
        again = run_sweep(base, grid, sweep.sweep_dir, progress=False)
    assert [cell.run_dir for cell in again.cells] == [cell.run_dir for cell in sweep.cells]
    with warnings.catch_warnings():  # under the flags they were made with: nothing said
        warnings.simplefilter("error")
        monkeypatch.setenv("XLA_FLAGS", FAST_MATH)
        run_sweep(base, grid, sweep.sweep_dir, progress=False)


def test_the_same_flags_in_another_order_are_the_same_and_a_finished_run_left_as_it_is_says_nothing(small_config,
                                                                                                   monkeypatch):
    from jaxfl.resume import RunFinished

    from jaxfl.experiment import same_xla_flags

    given = f"{FAST_MATH} --xla_backend_optimization_level=1 --xla_cpu_enable_fast_math=false"
    monkeypatch.setenv("XLA_FLAGS", given)
    run = run_experiment(dataclasses.replace(small_config, checkpoint_every=1, max_updates=2))
    assert _written(run.run_dir)["xla_flags"] == given  # as given, to be set again as it was
    # the last value of a flag counts, as XLA reads them; a quoted value with a space is one value
    assert same_xla_flags(given, "--xla_cpu_enable_fast_math=false --xla_backend_optimization_level=1")
    assert not same_xla_flags("--xla_dump_hlo_pass_re='a b'", "--xla_dump_hlo_pass_re='a c'")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false  --xla_backend_optimization_level=1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resume_experiment(run.run_dir, overrides={"max_updates": 3})  # it warned, naming both orders
    monkeypatch.setenv("XLA_FLAGS", FAST_MATH)
    with warnings.catch_warnings():  # it warned "this process, which resumes it" and then said it had finished
        warnings.simplefilter("error")
        with pytest.raises(RunFinished):
            resume_experiment(run.run_dir, again_if_finished=False)


def test_a_resume_on_other_devices_names_the_stretch_before_it():
    from jaxfl.experiment import _say_other_devices
    from jaxfl.resume import ResumeWarning

    first, second = ({"from_update": 0, "backend": "cpu", "devices": 2},
                     {"from_update": 2, "backend": "cpu", "devices": 1})
    with pytest.warns(ResumeWarning, match="r resumes on 1 cpu device; its updates up to 2 were trained on 2 cpu devices"):
        _say_other_devices("r", first, second)
    with warnings.catch_warnings():  # a stretch cut before its first update trained none of the run's updates
        warnings.simplefilter("error")
        _say_other_devices("r", second, {**first, "from_update": 2})
    with pytest.warns(ResumeWarning, match=r"r resumes on 2 cpu devices; its updates 3 to 4 \(the stretch before this "
                                           r"one\) were trained on 1 cpu device:"):
        _say_other_devices("r", second, {"from_update": 4, "backend": "cpu", "devices": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _say_other_devices("r", second, {**second, "from_update": 4})  # the same devices: nothing said
        _say_other_devices("r", {"from_update": 0, "backend": None, "devices": None}, second)  # not known: neither


def test_a_resume_on_other_cores_is_said_though_the_devices_are_the_same():
    """On one CPU device a CNN's steps on 2 cores and on 1 differ in float32's last digits (XLA:CPU
    splits a convolution's sums over its threads): a run resumed under `taskset -c 0` ended 6e-3 from
    the uninterrupted one, with no word and two stretches in device_history that read alike (a review)."""
    from jaxfl.experiment import _say_other_devices
    from jaxfl.resume import ResumeWarning

    two, one = ({"from_update": 0, "backend": "cpu", "devices": 1, "cpu_cores": 2},
                {"from_update": 2, "backend": "cpu", "devices": 1, "cpu_cores": 1})
    with pytest.warns(ResumeWarning, match=r"r resumes on 1 cpu device on 1 core; its updates up to 2 were trained on "
                                           r"1 cpu device on 2 cores: XLA:CPU splits a convolution's sums over other "
                                           r"threads, so from here a convolutional model's run agrees with an "
                                           r"uninterrupted one to float32 rounding"):
        _say_other_devices("r", two, one)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _say_other_devices("r", {**two, "cpu_cores": None}, one)  # a stretch that did not record its cores
        del two["cpu_cores"]
        _say_other_devices("r", two, one)
    # another backend on as many devices: not the CPU's threads
    with pytest.warns(ResumeWarning, match=r"r resumes on 1 gpu device; .* trained on 1 cpu device: the sums of each "
                                           r"call's updates go in another order"):
        _say_other_devices("r", {**one, "from_update": 0}, {"from_update": 2, "backend": "gpu", "devices": 1})


def test_a_runs_device_history_records_its_cores_on_a_cpu(tmp_path):
    from jaxfl._devices import usable_cores

    from jaxfl import RunConfig

    run = run_experiment(RunConfig(algorithm="fedavg", model="logreg", clients=3, local_steps=1, max_updates=1,
                                   target_accuracy=0.5, progress=False, output_dir=str(tmp_path)))
    with open(os.path.join(run.run_dir, "summary.json")) as handle:
        (stretch,) = json.load(handle)["device_history"]
    assert stretch["backend"] == "cpu" and stretch["cpu_cores"] == usable_cores()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two cells at once need two cores")
def test_a_parallel_sweeps_worker_relays_a_resumes_warning(tmp_path, monkeypatch):
    # under --jobs 2 a cell's warnings went to its log, deleted once it finished: the resume under other
    # XLA_FLAGS (or on other devices, or past a damaged checkpoint) was said nowhere
    import shutil

    base = {"model": "logreg", "clients": 3, "local_steps": 2, "batch_size": 8, "max_updates": 3, "buffer_size": 2,
            "checkpoint_every": 1}
    grid = {"algorithm": ["fedavg", "fedbuff"]}
    monkeypatch.setenv("XLA_FLAGS", FAST_MATH)
    sweep = run_sweep(base, grid, str(tmp_path / "swept"), progress=False, jobs=2)  # (a cell goes on with its jobs)
    cut = sweep.cells[1].run_dir  # back to its checkpoint after update 2
    os.remove(os.path.join(cut, "summary.json"))
    shutil.rmtree(os.path.join(cut, "checkpoints", "ckpt-000003"))
    with open(os.path.join(cut, "checkpoints", "latest"), "w") as handle:
        handle.write("ckpt-000002\n")
    monkeypatch.delenv("XLA_FLAGS")
    said = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the finished cell's reuse is said by the sweep itself
        again = run_sweep(base, grid, sweep.sweep_dir, progress=False, jobs=2, echo=said.append)
    assert again.resumed == [1] and again.ran == []
    relayed = [line for line in said if line.startswith("cell 1: ")]
    assert len(relayed) == 1 and relayed[0] == (
        f"cell 1: {cut} was made with XLA_FLAGS='{FAST_MATH}' and this process, which resumes it, has no XLA_FLAGS: "
        "where a flag changes XLA's arithmetic (e.g. --xla_cpu_enable_fast_math) the numbers differ from the run's "
        "own; set XLA_FLAGS as it was to keep them"), said


def test_a_workers_relayed_warning_is_one_line_and_no_line_of_a_warning_reads_as_a_note(tmp_path):
    # the worker's stdout and stderr are one log, read line by line by the sweep: a warning whose text held
    # "\njaxfl-sweep-note: ..." made the sweep repeat it as a note and count the cell restarted
    import subprocess
    import sys

    from jaxfl import _sweep_worker

    script = (
        "import sys, warnings\n"
        "import jaxfl.sweep\n"
        "from jaxfl import _sweep_worker\n"
        "from jaxfl.resume import ResumeWarning\n"
        "def cell(config, run_dir, state, say, speeds):\n"
        "    warnings.warn('resumed past ckpt-2\\n' + _sweep_worker.NOTE + 'not a note', ResumeWarning)\n"
        "    warnings.warn('other\\n' + _sweep_worker.RELAYED_WARNING + 'not relayed', UserWarning)\n"
        "jaxfl.sweep.run_cell = cell\n"
        "sys.exit(_sweep_worker.main(['', 'new', 'unused', '{\"clients\": 3}']))\n")
    done = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120, cwd=tmp_path)  # one stream, as the sweep's log of a worker
    assert done.returncode == 0, done.stdout[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.endswith("ResumeWarning: resumed past ckpt-2") for line in lines), lines  # the log keeps it
    assert [line for line in lines if line.startswith(_sweep_worker.NOTE)] == [], lines
    assert [line for line in lines if line.startswith(_sweep_worker.RELAYED_WARNING)] == [
        f"{_sweep_worker.RELAYED_WARNING}resumed past ckpt-2 {_sweep_worker.NOTE}not a note",
        f"{_sweep_worker.RELAYED_WARNING}other {_sweep_worker.RELAYED_WARNING}not relayed"], lines  # each one line
