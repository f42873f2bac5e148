"""The README's Python examples, run as a reader copies them (in a temporary folder, at their own
sizes): the first thing a researcher pastes into a notebook must not have drifted from the API.
"Adding an algorithm"'s example is run by tests/test_plugin_api_checks.py."""
import os
import re

import numpy as np
import pytest

import jaxfl
from jaxfl.config import validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_snippet(marker: str) -> str:
    """The README's one ```python block that contains ``marker``."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    blocks = [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if marker in block]
    assert len(blocks) == 1, f"{len(blocks)} README python blocks contain {marker!r}"
    return blocks[0]


def run_snippet(marker: str, namespace: dict | None = None) -> dict:
    namespace = {"__name__": "readme_snippet", **(namespace or {})}
    exec(compile(readme_snippet(marker), f"README.md ({marker})", "exec"), namespace)
    return namespace


@pytest.fixture
def in_tmp_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_from_python_quickstart_runs_to_its_target_and_its_port_config_is_valid(in_tmp_folder, capsys):
    names = run_snippet('result = jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedasync"')
    result = names["result"]
    time_to_target, run_dir = capsys.readouterr().out.split()[-2:]
    assert float(time_to_target) == result.summary["time_to_target"] > 0
    assert os.path.isfile(os.path.join(in_tmp_folder, run_dir, "summary.json"))
    port = validate(names["port"])
    assert port.algorithm_options.staleness_bound == 5 and port.algorithm_options.preset == "plato"


def test_own_model_optimiser_speeds_loss_and_metrics_snippet_runs_and_its_peer_starts_from_its_model(in_tmp_folder):
    names = run_snippet("class MyNet(nnx.Module)")
    result, peer = names["result"], names["peer"]
    first, second = jaxfl.load_run(result.run_dir), jaxfl.load_run(peer.run_dir)
    assert first.summary["global_updates"] == 30 and first.summary["stop_reason"] == "update budget"
    # "its version 0 is exactly these parameters": the peer's first evaluation is the run's last
    assert first.metrics["version"][-1] == 30 and second.metrics["version"][0] == 0
    for column in ("accuracy", "loss"):
        assert second.metrics[column][0] == first.metrics[column][-1]
    assert np.all(first.metrics["top3"] >= first.metrics["accuracy"]) and "top3" not in second.metrics


def test_early_stopping_logger_snippet_runs_with_tensorboard(in_tmp_folder):
    pytest.importorskip("tensorboardX")
    names = run_snippet("class StopWhenFlat", {"jaxfl": jaxfl})
    (run_dir,) = [os.path.join("runs", name) for name in os.listdir("runs")]
    summary = jaxfl.load_run(run_dir).summary
    # the default target (90%) comes before a plateau at this size; either ends the run early
    assert summary["stop_reason"] in ("target reached", "stopped by plateau"), summary["stop_reason"]
    assert summary["client_steps_aggregated"] < 3000 * 50
    assert os.listdir(os.path.join(run_dir, "tensorboard"))
    assert names["StopWhenFlat"]().log({"accuracy": 0.5}, step=1) is False


READMES = ("README.md", "benchmarks/reproduction/README.md")


def readme_commands(readme: str = "README.md") -> list[tuple[str, str]]:
    """Every ``jaxfl run`` and ``jaxfl sweep`` command of a README's code blocks, continuation lines
    joined, with the comment after it: (command, comment)."""
    text = open(os.path.join(ROOT, readme), encoding="utf-8").read()
    commands = []
    blocks = [body for language, body in re.findall(r"^\s*```(\w*)\n(.*?)^\s*```", text, re.S | re.M)
              if language in ("bash", "")]
    for block in blocks:
        loops = {}  # a shell loop's variable: its values (for slot in a b c; do)
        for line in block.replace("\\\n", " ").splitlines():
            loop = re.match(r"\s*for (\w+) in ([^;]+); do", line)
            if loop:
                loops[loop.group(1)] = loop.group(2).split()
            command, _, comment = line.strip().removeprefix("srun ").partition("#")
            if not command.startswith(("jaxfl run ", "jaxfl sweep ")):
                continue
            command = " ".join(command.split())
            variables = [name for name in loops if f"${name}" in command]
            assert len(variables) <= 1, command
            for value in loops[variables[0]] if variables else [None]:
                commands.append((command if value is None else command.replace(f"${variables[0]}", value),
                                 comment.strip()))
    return commands


# what a reader provides first, or what joins a cluster: parsed, not validated
NEEDS_THE_READER = ("--config experiment.toml", "--resume", "--cluster", "--coordinator-address")


@pytest.mark.parametrize("command, comment", [pair for readme in READMES for pair in readme_commands(readme)],
                         ids=lambda value: value[:60])
def test_readme_command_parses_and_validates_before_any_work(command, comment, in_tmp_folder):
    """Each command's flags exist and its configs (a sweep: every cell) validate, as the command
    checks them before its first run; a sweep's "N runs" comment counts its cells. The
    reproduction README's commands are how its tables were made: a reader runs them again."""
    import shlex

    from jaxfl.cli import _configs, _sweep_values, build_parser
    from jaxfl.sweep import expand

    argv = [os.path.join(ROOT, word) if word.startswith(("examples/", "benchmarks/")) else word
            for word in shlex.split(command)[1:]]
    args, extra = build_parser().parse_known_args(argv)
    assert extra == [], f"{command}: flags the command does not know: {extra}"
    if any(needs in command for needs in NEEDS_THE_READER):
        return
    if args.command == "run":
        assert _configs(args)
        return
    base, grid = _sweep_values(args)
    cells, _ = expand(base, grid, str(in_tmp_folder / "sweep"))
    counted = re.search(r"(\d+) runs", comment)
    if counted:
        assert len(cells) == int(counted.group(1)), comment


def test_the_readmes_have_the_commands_the_test_above_checks():
    commands = [command for command, _ in readme_commands()]
    assert len(commands) >= 10 and any(command.startswith("jaxfl sweep") for command in commands)
    assert len(readme_commands("benchmarks/reproduction/README.md")) >= 40
