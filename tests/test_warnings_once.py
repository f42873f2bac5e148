"""A run validates its config once, so each warning about it is given once: from Python, from
``jaxfl run`` and on resume (each used to repeat it up to seven times)."""
import os
import warnings

from jaxfl.cli import main
from jaxfl.config import RunConfig
from jaxfl.experiment import resume_experiment, run_experiment

IGNORED = "buffer_size=2 is ignored: fedavg does not read it"
NO_TARGET = "dataset 'synthetic' has no default target accuracy"


def tiny(tmp_path, **changes) -> RunConfig:
    # buffer_size is FedBuff's: FedAvg warns that it ignores it (one base config reused for several algorithms)
    return RunConfig(**{**dict(algorithm="fedavg", dataset="synthetic", model="logreg", clients=3, local_steps=1,
                               batch_size=8, buffer_size=2, max_updates=2, checkpoint_every=1, progress=False,
                               output_dir=str(tmp_path)), **changes})


def messages(caught, text: str) -> list[str]:
    return [str(w.message) for w in caught if text in str(w.message)]


def test_run_and_resume_each_warn_once(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_experiment(tiny(tmp_path))
    assert len(messages(caught, IGNORED)) == 1 and len(messages(caught, NO_TARGET)) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resume_experiment(result.run_dir, progress=False)
    assert len(messages(caught, IGNORED)) == 1 and len(messages(caught, NO_TARGET)) == 1


def test_the_command_line_says_a_note_once(tmp_path, capsys):
    # a comparison checks every run's data and model before the first starts, then runs each
    flags = ["run", "--algorithm", "fedavg,fedbuff", "--dataset", "synthetic", "--model", "logreg", "--clients", "3",
             "--local-steps", "1", "--batch-size", "8", "--max-updates", "1", "--checkpoint-every", "1",
             "--no-progress", "--output-dir", str(tmp_path)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(flags) == 0
    # the same note for both runs, said once per command (not again by the check before the runs, nor per run)
    assert len(messages(caught, NO_TARGET)) == 1
    run = tmp_path / sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("fedavg"))[0]
    os.remove(run / "summary.json")  # unfinished: the command line leaves a finished run as it is
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["run", "--resume", str(run), "--no-progress"]) == 0
    assert len(messages(caught, NO_TARGET)) == 1
