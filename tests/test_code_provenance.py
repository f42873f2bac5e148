"""Which code ran a run: ``config.json``'s ``jaxfl_source`` and each ``device_history`` stretch name
the git commit of a jaxfl run from a checkout (``jaxfl.__version__`` stayed 0.2.0 over hundreds of
commits, so a resumed run's stretches could not be told apart), and nothing where jaxfl is a copy
that no repository of its own tracks."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import jaxfl

PACKAGE = os.path.dirname(os.path.abspath(jaxfl.__file__))
ASK = "import json, jaxfl.experiment as e; print(json.dumps(e.jaxfl_source()))"


def _git(folder, *arguments) -> str:
    return subprocess.run(["git", "-C", str(folder), *arguments], check=True, capture_output=True,
                          text=True).stdout.strip()


def _source_of_a_copy_in(folder) -> dict:
    env = {**os.environ, "PYTHONPATH": str(folder), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", ASK], env=env, cwd=str(folder), capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_commit_is_named_only_where_a_repository_tracks_jaxfl_itself(tmp_path):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "test@example.com")
    _git(tmp_path, "config", "user.name", "test")
    (tmp_path / ".gitignore").write_text("__pycache__/\n")
    shutil.copytree(PACKAGE, tmp_path / "jaxfl", ignore=shutil.ignore_patterns("__pycache__"))
    _git(tmp_path, "add", ".gitignore")
    _git(tmp_path, "commit", "-q", "-m", "a project that holds an untracked copy of jaxfl")
    assert _source_of_a_copy_in(tmp_path) == {}  # the project's commit is not jaxfl's
    _git(tmp_path, "add", "jaxfl")
    _git(tmp_path, "commit", "-q", "-m", "a project that vendors a tracked copy of jaxfl")
    assert _source_of_a_copy_in(tmp_path) == {}  # its commit is the project's, not jaxfl's
    shutil.copy(os.path.join(os.path.dirname(PACKAGE), "pyproject.toml"), tmp_path / "pyproject.toml")
    _git(tmp_path, "add", "pyproject.toml")
    _git(tmp_path, "commit", "-q", "-m", "jaxfl's own repository")
    commit = _git(tmp_path, "rev-parse", "HEAD")
    assert _source_of_a_copy_in(tmp_path) == {"commit": commit, "modified": False}
    os.utime(tmp_path / "jaxfl" / "cluster.py")  # a newer time, the same content: git would refresh its index
    index = (tmp_path / ".git" / "index").stat().st_mtime_ns
    assert _source_of_a_copy_in(tmp_path) == {"commit": commit, "modified": False}
    # nothing written into the user's repository (under .git/index.lock, where a git command of theirs failed)
    assert (tmp_path / ".git" / "index").stat().st_mtime_ns == index
    with open(tmp_path / "jaxfl" / "cluster.py", "a") as edited:
        edited.write("\n# an edit not committed\n")
    assert _source_of_a_copy_in(tmp_path) == {"commit": commit, "modified": True}


def test_a_run_records_its_code_at_the_start_and_for_each_stretch(tmp_path):
    from jaxfl import RunConfig, run_experiment
    from jaxfl.experiment import jaxfl_source, library_versions

    config = RunConfig(algorithm="fedavg", dataset="digits", model="logreg", clients=4, local_steps=1, batch_size=8,
                       max_updates=1, progress=False, output_dir=str(tmp_path))
    result = run_experiment(config)
    with open(os.path.join(result.run_dir, "config.json")) as handle:
        recorded = json.load(handle)
    assert recorded.get("jaxfl_source", {}) == jaxfl_source()
    (stretch,) = result.summary["device_history"]
    assert stretch["versions"] == library_versions() == recorded["versions"]
    assert stretch.get("jaxfl_commit") == jaxfl_source().get("commit")
    assert stretch.get("jaxfl_modified") == jaxfl_source().get("modified")
