"""FedAsync's default rule is its paper's mixing (it was the FedCompass authors' p_i-weighted step,
under which a 10^4-client run's accuracy moved by 3e-5 in 400 updates). Runs recorded before the
change with the rule unset ran that step: they resume, replay and compare as they ran, and a new
run at the default is named as one with ``rule="paper"``, never as those."""
import json
import os
import shutil
import warnings

import pytest

from jaxfl.config import RunConfig, as_recorded, load_config_text, validate
from jaxfl.experiment import resume_experiment, run_experiment, run_name
from jaxfl.resume import digest
from jaxfl.testing import _interrupt_after, _Interrupted, assert_same_run

FLAGS = dict(algorithm="fedasync", dataset="mnist10k", model="logreg", clients=4, local_steps=2, batch_size=16,
             max_updates=6, checkpoint_every=2, checkpoint_min_interval_s=0, stop_at_target=False, progress=False)


def test_the_default_is_the_papers_mixing_and_named_as_it():
    default = validate(RunConfig(algorithm="fedasync", clients=1000))
    assert default.rule == "paper"
    assert run_name(default) == run_name(validate(RunConfig(algorithm="fedasync", clients=1000, rule="paper")))
    assert run_name(default) != run_name(validate(RunConfig(algorithm="fedasync", clients=1000, rule="fedcompass")))
    with warnings.catch_warnings():  # the note on the p_i step's stall went with that default
        warnings.simplefilter("error")
        validate(RunConfig(algorithm="fedasync", clients=10_000))
    # FedBuff's default did not change, but is written too: a run made in Python (rule unset) was named
    # apart from the same run of `jaxfl demo` (the quickstart gives rule paper), and neither reused the other
    assert validate(RunConfig(algorithm="fedbuff")).rule == "paper"
    assert run_name(validate(RunConfig(algorithm="fedbuff"))) == run_name(validate(RunConfig(algorithm="fedbuff",
                                                                                            rule="paper")))


def test_a_validated_fedbuff_config_reused_for_fedavg_says_how_to_leave_its_written_rule_out():
    # the notebook's way of comparing: one validated base, dataclasses.replace(base, algorithm=...). Its rule is
    # not unset by validate: a run recorded with it resumes only where the config compares as recorded
    import dataclasses

    base = validate(RunConfig(algorithm="fedbuff", clients=4))
    with pytest.warns(UserWarning, match=r"rule='paper' is ignored: fedavg does not read it \(read by fedasync, "
                                         r"fedbuff\); if it comes from a validated fedasync or fedbuff config, which "
                                         r"holds it as their default: dataclasses.replace\(config, algorithm='fedavg', "
                                         r"rule=None\) leaves it out$"):
        assert validate(dataclasses.replace(base, algorithm="fedavg")).rule == "paper"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(dataclasses.replace(base, algorithm="fedavg", rule=None))
    with pytest.warns(UserWarning, match=r"rule='fedcompass' is ignored: fedavg does not read it \(read by "
                                         r"fedasync, fedbuff\)$"):
        validate(RunConfig(algorithm="fedavg", rule="fedcompass"))  # a value no validation writes: said plainly



def test_a_fedavg_run_recorded_with_fedbuffs_written_rule_resumes_without_the_warning(tmp_path):
    # a day's validate() unset the rule, and such a run's config then compared unlike its checkpoints'
    import dataclasses

    base = validate(RunConfig(algorithm="fedbuff", model="logreg", clients=3, local_steps=2, batch_size=8,
                              max_updates=3, checkpoint_every=1, progress=False, output_dir=str(tmp_path)))
    config = dataclasses.replace(base, algorithm="fedavg", run_name="cut")
    with pytest.warns(UserWarning, match="rule='paper' is ignored"), pytest.raises(_Interrupted):
        with _interrupt_after(2):
            run_experiment(config)
    with warnings.catch_warnings(record=True) as caught:  # the run's own record: said without the advice
        warnings.simplefilter("always")
        resumed = resume_experiment(str(tmp_path / "cut"), progress=False)
    said = [str(warning.message) for warning in caught if "rule=" in str(warning.message)]
    assert said == ["rule='paper' is ignored: fedavg does not read it (read by fedasync, fedbuff)"], said
    assert resumed.summary["global_updates"] == 3 and resumed.summary["resumes"] == 1


def _as_before_the_change(run_dir: str) -> None:
    """Rewrite a rule-fedcompass run's records as the jaxfl before the change wrote them: rule unset."""
    path = os.path.join(run_dir, "config.json")
    with open(path) as handle:
        written = json.load(handle)
    written["config"]["server"]["rule"] = None
    with open(path, "w") as handle:
        json.dump(written, handle)
    root = os.path.join(run_dir, "checkpoints")
    for name in os.listdir(root):
        stored_path = os.path.join(root, name, "config.json")
        if os.path.isfile(stored_path):
            with open(stored_path) as handle:
                stored = json.load(handle)
            stored["config"]["rule"] = None
            stored["config_sha256"] = digest(stored["config"])
            with open(stored_path, "w") as handle:
                json.dump(stored, handle)


def test_a_run_recorded_with_the_rule_unset_before_the_change_resumes_as_it_ran(tmp_path):
    uninterrupted = run_experiment(RunConfig(**FLAGS, rule="fedcompass", output_dir=str(tmp_path / "a"),
                                             run_name="full"))
    with pytest.raises(_Interrupted), _interrupt_after(events=8):
        run_experiment(RunConfig(**FLAGS, rule="fedcompass", output_dir=str(tmp_path / "b"), run_name="cut"))
    cut = str(tmp_path / "b" / "cut")
    _as_before_the_change(cut)
    resumed = resume_experiment(cut, progress=False)
    assert resumed.summary["policy"]["rule"] == "fedcompass"
    assert_same_run(uninterrupted, resumed, "an old default run resumed vs its rule run uninterrupted")

    # its config.json run again (--config RUN_DIR/config.json) is its rule, not the new default's
    with open(os.path.join(cut, "config.json")) as handle:
        assert load_config_text(handle.read(), ".json")["server"]["rule"] == "fedcompass"
    assert as_recorded({"algorithm": "fedasync", "server": {"rule": None}})["server"]["rule"] == "fedcompass"


def test_a_comparison_with_rule_fedcompass_reuses_a_finished_run_recorded_with_the_rule_unset(tmp_path, capsys):
    # its folder has the old name (the hash of rule None), which no validated config hashes to now
    import dataclasses

    from jaxfl import cli

    out = tmp_path / "runs"
    old = run_experiment(RunConfig(**FLAGS, rule="fedcompass", output_dir=str(out)))
    _as_before_the_change(old.run_dir)
    old_name = run_name(dataclasses.replace(validate(RunConfig(**FLAGS, rule="fedcompass", output_dir=str(out))),
                                            rule=None))
    os.rename(old.run_dir, out / old_name)
    cli.main(["run", "--algorithm", "fedasync,fedavg", "--rule", "fedcompass", "--dataset", "mnist10k", "--model",
              "logreg", "--clients", "4", "--local-steps", "2", "--batch-size", "16", "--max-updates", "6",
              "--checkpoint-every", "2", "--checkpoint-min-interval-s", "0", "--no-stop-at-target", "--no-progress",
              "--out", str(out)])
    assert not [name for name in os.listdir(out) if name.startswith("fedasync") and name != old_name]
    assert old_name in capsys.readouterr().out


def test_a_comparison_at_the_new_default_does_not_reuse_a_run_recorded_at_the_old_one(tmp_path):
    # new default runs are named apart from the old ones; were a folder of the old default under the
    # new name all the same, its record (read as it ran: rule fedcompass) is not this config's
    from jaxfl import cli

    out = tmp_path / "runs"
    old = run_experiment(RunConfig(**FLAGS, rule="fedcompass", output_dir=str(out)))
    _as_before_the_change(old.run_dir)
    name = run_name(validate(RunConfig(**FLAGS)))
    os.rename(old.run_dir, out / name)
    cli.main(["run", "--algorithm", "fedasync,fedavg", "--dataset", "mnist10k", "--model", "logreg", "--clients", "4",
              "--local-steps", "2", "--batch-size", "16", "--max-updates", "6", "--checkpoint-every", "2",
              "--checkpoint-min-interval-s", "0", "--no-stop-at-target", "--no-progress", "--out", str(out)])
    with open(out / f"{name}-2" / "summary.json") as handle:  # a comparison reuses equal runs: trained anew
        assert json.load(handle)["policy"]["rule"] == "paper"


def test_a_default_run_s_config_json_runs_again_from_the_command_line(tmp_path):
    # it holds server_lr resolved to 1.0, which the paper's mixing does not read: the command line took
    # it for a setting and refused the file that README says runs any run's config again
    from jaxfl import cli

    flags = {**FLAGS, "checkpoint_every": None, "checkpoint_min_interval_s": None}
    first = run_experiment(RunConfig(**flags, timing_only=True, output_dir=str(tmp_path / "a")))
    assert cli.main(["run", "--config", os.path.join(first.run_dir, "config.json"), "--out", str(tmp_path / "b"),
                     "--no-progress"]) == 0
    (again,) = os.listdir(tmp_path / "b")
    with open(tmp_path / "b" / again / "summary.json") as handle:
        assert json.load(handle)["policy"]["rule"] == "paper"


def test_a_sweep_from_before_the_change_names_its_old_default_cells_and_reports_them_under_the_old_rule(tmp_path):
    # a FedAsync cell finished with the rule unset has the old name: the sweep continued at the new
    # default runs the new rule (and says which run is the old one), and rule=fedcompass reports it
    import dataclasses

    from jaxfl.sweep import run_sweep

    base = {key: value for key, value in FLAGS.items() if key not in ("algorithm", "progress")}
    first = run_sweep({**base, "rule": "fedcompass"}, {"algorithm": ["fedasync"]}, str(tmp_path), progress=False)
    (cell,) = first.cells
    _as_before_the_change(cell.run_dir)
    old_name = run_name(dataclasses.replace(cell.config, rule=None))
    os.rename(cell.run_dir, tmp_path / "runs" / old_name)
    with open(tmp_path / "sweep.json") as handle:  # and its sweep.json as the old jaxfl wrote it
        written = json.load(handle)
    written["base"].pop("rule")
    written["cells"][0]["run_dir"] = os.path.join("runs", old_name)
    with open(tmp_path / "sweep.json", "w") as handle:
        json.dump(written, handle)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no general note on runs the table leaves out: it could not say how
        again = run_sweep(base, {"algorithm": ["fedasync"]}, str(tmp_path), progress=False)
    notes = " ".join(again.notes)
    assert f"runs/{old_name} is the same run at its earlier default, 'fedcompass'" in notes
    assert "rule=fedcompass in the grid reports that run" in notes
    assert again.ran == [0] and os.path.basename(again.cells[0].run_dir) != old_name

    with pytest.warns(UserWarning) as caught:  # the new default's run is the one left out now
        reported = run_sweep({**base, "rule": "fedcompass"}, {"algorithm": ["fedasync"]}, str(tmp_path),
                             progress=False)
    (left_out,) = [str(warning.message) for warning in caught]
    assert "differ in rule: unset there, 'fedcompass' here" in left_out and "--rule None" not in left_out
    assert reported.skipped == [0] and os.path.basename(reported.cells[0].run_dir) == old_name
    assert reported.rows[0]["global_updates"] == 6


def test_a_comparison_reuses_a_fedbuff_run_recorded_with_the_rule_unset_under_its_old_name(tmp_path, capsys):
    # FedBuff's unset rule, written as paper since 2026-12-06, renamed the runs made in Python before: the
    # command line finds them under the old name (the hash of rule None) and reuses them
    import dataclasses

    from jaxfl import cli

    out = tmp_path / "runs"
    flags = {**FLAGS, "algorithm": "fedbuff", "buffer_size": 2}
    old = run_experiment(RunConfig(**flags, output_dir=str(out)))
    _as_before_the_change(old.run_dir)
    old_name = run_name(dataclasses.replace(validate(RunConfig(**flags, output_dir=str(out))), rule=None))
    assert old_name != os.path.basename(old.run_dir)
    os.rename(old.run_dir, out / old_name)
    cli.main(["run", "--algorithm", "fedbuff,fedavg", "--buffer-size", "2", "--dataset", "mnist10k", "--model",
              "logreg", "--clients", "4", "--local-steps", "2", "--batch-size", "16", "--max-updates", "6",
              "--checkpoint-every", "2", "--checkpoint-min-interval-s", "0", "--no-stop-at-target", "--no-progress",
              "--out", str(out)])
    assert [name for name in os.listdir(out) if name.startswith("fedbuff")] == [old_name]
    assert old_name in capsys.readouterr().out


@pytest.mark.parametrize("recorded", ["fedbuff", "fedasync"])
def test_a_runs_config_json_is_the_base_of_another_algorithm(tmp_path, capsys, recorded):
    # it holds the rule its algorithm wrote (paper), which fedavg never reads: the file was refused
    from jaxfl import cli

    flags = {**FLAGS, "algorithm": recorded, "checkpoint_every": None, "checkpoint_min_interval_s": None}
    first = run_experiment(RunConfig(**flags, timing_only=True, output_dir=str(tmp_path / "a")))
    assert cli.main(["run", "--config", os.path.join(first.run_dir, "config.json"), "--algorithm", "fedavg",
                     "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    assert f"rule 'paper' (algorithm '{recorded}' gave it)" in capsys.readouterr().err
    (again,) = os.listdir(tmp_path / "b")
    assert again.startswith("fedavg-")


def test_a_run_of_a_config_finished_under_its_old_name_is_said(tmp_path):
    # FedBuff's rule, unset, is written as paper since 2026-12-06: a run named before it was trained again
    # under the new name without the note a finished run of the same name gets
    import dataclasses

    flags = {**FLAGS, "algorithm": "fedbuff", "buffer_size": 2, "checkpoint_every": None,
             "checkpoint_min_interval_s": None}
    config = RunConfig(**flags, output_dir=str(tmp_path))
    old = run_experiment(config)
    _as_before_the_change(old.run_dir)
    old_name = run_name(dataclasses.replace(validate(config), rule=None))
    os.rename(old.run_dir, tmp_path / old_name)
    with pytest.warns(UserWarning, match=f"{old_name} holds a finished run of this config"):
        run_experiment(config)
    # FedAsync's unset rule ran fedcompass: not a run of rule paper, so not said
    fedasync = {**flags, "algorithm": "fedasync"}
    del fedasync["buffer_size"]
    old = run_experiment(RunConfig(**fedasync, rule="fedcompass", output_dir=str(tmp_path)))
    _as_before_the_change(old.run_dir)
    os.rename(old.run_dir, tmp_path / run_name(dataclasses.replace(validate(RunConfig(**fedasync)), rule=None)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_experiment(RunConfig(**fedasync, output_dir=str(tmp_path)))


@pytest.mark.parametrize("algorithm, rule, said", [
    ("fedcompass", None, True), ("fedcompass_m", None, True), ("fedbuff", "fedcompass", True),
    ("fedasync", "fedcompass", True), ("fedbuff", None, False), ("fedasync", None, False)])
def test_a_rule_scaling_updates_by_the_data_share_says_so_in_a_large_federation(algorithm, rule, said):
    # FedCompass at 10^5 clients: loss 2.315766 → 2.315761 in 100 updates, and nothing said why
    def notes(**changes):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            validate(RunConfig(**{**dict(algorithm=algorithm, rule=rule, clients=100_000), **changes}))
        return [str(w.message) for w in caught if "share of the data, p_i" in str(w.message)]

    assert len(notes()) == int(said)
    if said:
        assert "(about 1/100,000 here)" in notes()[0] and "about 100,000 client updates" in notes()[0]
    assert notes(clients=999) == [] and notes(timing_only=True) == []  # a small federation; no model


@pytest.mark.parametrize("changes, said", [
    ({}, True), ({"clients": 1000}, True), ({"client_optimizer": "adamw"}, True), ({"buffer_size": 30}, False),
    ({"concurrency": 10}, False), ({"client_optimizer": "sgd"}, False), ({"rule": "plato"}, False),
    ({"timing_only": True}, False), ({"clients": 100}, False), ({"max_updates": 20}, False),
    ({"max_client_updates": 60}, False), ({"server_optimizer": "adam"}, False), ({"max_updates": 600}, True),
    ({"clients": 150}, False), ({"server_lr": 0.1}, False), ({"server_lr": 2.0}, True),
    # a client budget stops at the aggregation reaching it: 35 updates of K = 3 are 12 aggregations (sum 12.6)
    ({"max_client_updates": 35, "staleness": "constant", "staleness_alpha": 1.0}, True),
    ({"max_client_updates": 33, "staleness": "constant", "staleness_alpha": 1.0}, False),
    ({"max_client_steps": 1500}, False),  # 10 aggregations of 3 x 50 steps
    ({"clients": 150, "server_momentum": 0.9}, True)])  # momentum carries each step on: 10 x 11
def test_fedbuff_says_when_its_first_wave_of_adam_updates_from_one_model_is_many_buffers_long(changes, said):
    # 10^5 clients, FedBuff's defaults (1,000 in flight, K = 3, adam 0.003 x 50 steps): held-out loss
    # 2.3 -> 387 at update 50, and nothing said why
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validate(RunConfig(**{"algorithm": "fedbuff", "clients": 100_000, **changes}))
    notes = [str(w.message) for w in caught if "clients in flight with buffer_size" in str(w.message)]
    assert len(notes) == int(said)
    if said and "max_client_updates" not in changes and "server_momentum" not in changes:
        in_flight = min(changes.get("clients", 100_000), 1000)
        assert notes[0].startswith(f"fedbuff: {in_flight:,} clients in flight with buffer_size 3")
        scale = changes.get("server_lr", 1.0)
        assert "the first 333 aggregations" in notes[0] and f"up to about {31.557 * scale:.0f} client updates' worth" in notes[0]
        assert ("times the server's step 2" in notes[0]) == (scale == 2.0)
        assert "(buffer_size 33 or more)" in notes[0]


def test_a_comparison_run_again_after_the_change_says_which_run_is_fedasync_s_at_its_old_default(tmp_path, capsys):
    """The same `jaxfl run --algorithm fedavg,fedasync` after the change trained FedAsync anew, and said
    only that comparison.csv, which held the same algorithms, was replaced (the sweep said which run was
    the old default's)."""
    import dataclasses

    from jaxfl import cli
    from jaxfl.comparison import compare

    out = tmp_path / "runs"
    old = run_experiment(RunConfig(**FLAGS, rule="fedcompass", output_dir=str(out)))
    _as_before_the_change(old.run_dir)
    old_name = run_name(dataclasses.replace(validate(RunConfig(**FLAGS, output_dir=str(out))), rule=None))
    os.rename(old.run_dir, out / old_name)
    assert cli.main(["run", "--algorithm", "fedavg,fedasync", "--dataset", "mnist10k", "--model", "logreg", "--clients", "4",
                     "--local-steps", "2", "--batch-size", "16", "--max-updates", "6", "--checkpoint-every", "2",
                     "--checkpoint-min-interval-s", "0", "--no-stop-at-target", "--no-progress", "--out",
                     str(out)]) == 0
    assert f"jaxfl: note: {out / old_name} is this fedasync run at its rule's earlier default, 'fedcompass': this " \
           "one trains it at the default now, 'paper' (rule='fedcompass' reuses that run)" in capsys.readouterr().err
    shutil.copytree(out / old_name, tmp_path / "python" / old_name)  # the same from Python, in a folder of its own
    with pytest.warns(UserWarning, match=rf"{old_name} is this fedasync run at its rule's earlier default"):
        compare([RunConfig(**FLAGS, output_dir=str(tmp_path / "python"))], reuse=True)
    with warnings.catch_warnings(record=True) as caught:  # run again: its own run is found, nothing to say
        warnings.simplefilter("always")
        compare([RunConfig(**FLAGS, output_dir=str(tmp_path / "python"))], reuse=True)
    assert not [warning for warning in caught if "earlier default" in str(warning.message)]
    reused = compare([RunConfig(**FLAGS, rule="fedcompass", output_dir=str(tmp_path / "python"))], reuse=True)
    assert os.path.basename(reused.run_dirs[0]) == old_name
    # the old run cut before its first checkpoint: nothing to reuse, so no "reuses that run"; and a config
    # at the old value itself is not told that it trains the new one
    third = tmp_path / "third"
    shutil.copytree(out / old_name, third / old_name)
    shutil.rmtree(third / old_name / "checkpoints")
    os.remove(third / old_name / "summary.json")
    with pytest.warns(UserWarning) as caught:
        compare([RunConfig(**FLAGS, output_dir=str(third))], reuse=True)
    (note,) = [str(warning.message) for warning in caught if "earlier default" in str(warning.message)]
    assert note.endswith("this one trains it at the default now, 'paper'")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compare([RunConfig(**FLAGS, rule="fedcompass", output_dir=str(third))], reuse=True)
    assert not [warning for warning in caught if "earlier default" in str(warning.message)]
