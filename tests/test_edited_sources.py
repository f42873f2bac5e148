"""A plug-in algorithm's or a model's file edited between two commands: the runs the first one made
are another code's. A comparison reused them ("reused: it had finished") and a sweep counted them as
finished cells, so the researcher's edit changed nothing in the table, and nothing said why."""
import json
import os
import warnings

import pytest

from jaxfl.cli import main
from jaxfl.config import ConfigError
from jaxfl.sweep import run_sweep
from tests.test_plugin_api_checks import PLUGIN as CHECKS_PLUGIN

# its own name: a test of test_plugin_api_checks leaves the plug-in's registered in its worker
PLUGIN = CHECKS_PLUGIN.replace('"pairs_plugin_check"', '"pairs_edited_check"')

MODEL = '''
import flax.linen as nn


class Net(nn.Module):
    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(nn.relu(nn.Dense(8)(x.reshape((x.shape[0], -1)))))
'''


@pytest.fixture(autouse=True)
def _unregister_the_plugin():
    yield
    from jaxfl.algorithms import names
    from jaxfl.algorithms.base import unregister

    if "pairs_edited_check" in names():
        unregister("pairs_edited_check")


def _runs(folder, prefix):
    return sorted(name for name in os.listdir(folder) if name.startswith(prefix))


def test_a_comparison_runs_again_what_an_edited_plugin_or_model_file_made(tmp_path, capsys):
    plugin, model = tmp_path / "pairs.py", tmp_path / "net.py"
    plugin.write_text(PLUGIN)
    model.write_text(MODEL)
    command = ["run", "--algorithm", f"fedavg,{plugin}:Pairs", "--model", f"{model}:Net", "--clients", "3",
               "--local-steps", "2", "--max-updates", "2", "--no-progress", "--output-dir", str(tmp_path / "out")]
    with warnings.catch_warnings():  # (the later comparisons replace this one's table, and say so)
        warnings.simplefilter("ignore", UserWarning)
        assert main(command) == 0
    (first,) = _runs(tmp_path / "out", "pairs")
    recorded = json.loads((tmp_path / "out" / first / "config.json").read_text())
    assert recorded["algorithm_source"]["file"] == str(plugin) and recorded["model_source"]["file"] == str(model)
    capsys.readouterr()
    assert main(command) == 0  # nothing edited: both reused
    assert capsys.readouterr().out.count("(reused: it had finished)") == 2
    plugin.write_text(PLUGIN.replace("1 + sim.staleness(record)", "2 + sim.staleness(record)"))
    assert main(command) == 0
    captured = capsys.readouterr()
    assert f"jaxfl: note: {tmp_path / 'out' / first} was made with an earlier version of {plugin} (algorithm " \
           f"{plugin}:Pairs): not reused; this command runs it again with the code as it is now" in captured.err
    assert "holds a finished run of this config" not in captured.err  # it does not: another code's
    assert captured.out.count("(reused: it had finished)") == 1  # fedavg's, whose files did not change
    assert _runs(tmp_path / "out", "pairs") == [first, f"{first}-2"]
    model.write_text(MODEL.replace("nn.relu", "nn.tanh"))
    assert main(command) == 0
    assert "(reused" not in capsys.readouterr().out  # the model file is every run's
    assert len(_runs(tmp_path / "out", "fedavg")) == 2 and len(_runs(tmp_path / "out", "pairs")) == 3


def test_a_sweep_whose_cells_an_edited_plugin_file_ran_is_refused_before_any_work(tmp_path):
    plugin = tmp_path / "pairs.py"
    plugin.write_text(PLUGIN)
    base = {"model": "logreg", "clients": 3, "local_steps": 2, "max_updates": 2}
    grid = {"algorithm": ["fedavg", f"{plugin}:Pairs"], "seed": [0, 1]}
    folder = str(tmp_path / "sweep")
    run_sweep(base, grid, folder, progress=False)
    plugin.write_text(PLUGIN.replace("1 + sim.staleness(record)", "2 + sim.staleness(record)"))
    before = {name: os.path.getmtime(os.path.join(folder, "runs", name)) for name in os.listdir(os.path.join(folder,
                                                                                                              "runs"))}
    with pytest.raises(ConfigError, match=rf"2 cells of this sweep were run with an earlier version of {plugin} "
                                          rf"\(algorithm .*:Pairs\), changed since: cell 2 .* their results are not "
                                          r"this code's. Sweep into another folder \(--out\), or remove those run "
                                          r"folders to run them again"):
        run_sweep(base, grid, folder, progress=False)
    assert {name: os.path.getmtime(os.path.join(folder, "runs", name))
            for name in os.listdir(os.path.join(folder, "runs"))} == before
    plugin.write_text(PLUGIN)  # the file as the cells ran it: they are this code's again
    assert run_sweep(base, grid, folder, progress=False).skipped == [0, 1, 2, 3]


def test_a_model_s_imported_module_is_its_code_and_its_comments_are_not(tmp_path, capsys):
    """A model file that imports its layers from a module beside it: an edit there (the layer's
    width, 578 parameters to 4,554) was reused as the same run; a comment added refused a sweep."""
    (tmp_path / "blocks.py").write_text("import flax.linen as nn\nWIDTH = 8\n\n\nclass Block(nn.Module):\n"
                                        "    @nn.compact\n    def __call__(self, x):\n"
                                        "        return nn.relu(nn.Dense(WIDTH)(x))\n")
    model = tmp_path / "layered.py"
    model.write_text("import flax.linen as nn\nfrom blocks import Block\n\n\nclass Net(nn.Module):\n"
                     "    num_classes: int = 10\n\n    @nn.compact\n    def __call__(self, x):\n"
                     "        return nn.Dense(self.num_classes)(Block()(x.reshape((x.shape[0], -1))))\n")
    command = ["run", "--algorithm", "fedavg", "--dataset", "synthetic", "--model", f"{model}:Net", "--clients", "3",
               "--local-steps", "2", "--max-updates", "1", "--no-progress", "--output-dir", str(tmp_path / "out")]
    with warnings.catch_warnings():  # (a run of a config that finished before is run again: said)
        warnings.simplefilter("ignore", UserWarning)
        assert main(command) == 0
        (first,) = _runs(tmp_path / "out", "fedavg")
        recorded = json.loads((tmp_path / "out" / first / "config.json").read_text())["model_source"]
        assert sorted(recorded["files"]) == ["blocks.py", "layered.py"]
        model.write_text(model.read_text() + "# a comment, and layout:\n\n\n")
        assert main(command) == 0  # the same code: a single run is run again, as always, but not refused
        runs = _runs(tmp_path / "out", "fedavg")
        sweep_base = {"model": f"{model}:Net", "dataset": "synthetic", "clients": 3, "local_steps": 2,
                      "max_updates": 1}
        run_sweep(sweep_base, {"seed": [0]}, str(tmp_path / "sweep"), progress=False)
        model.write_text(model.read_text() + "# another comment\n")
        assert run_sweep(sweep_base, {"seed": [0]}, str(tmp_path / "sweep"), progress=False).skipped == [0]
        (tmp_path / "blocks.py").write_text((tmp_path / "blocks.py").read_text().replace("WIDTH = 8", "WIDTH = 64"))
        with pytest.raises(ConfigError, match=rf"earlier version of {tmp_path / 'blocks.py'} \(model .*:Net\)"):
            run_sweep(sweep_base, {"seed": [0]}, str(tmp_path / "sweep"), progress=False)
    assert len(runs) == 2


def test_the_fingerprint_follows_every_import_of_the_user_s_and_forgives_only_what_is_not_code(tmp_path, monkeypatch):
    """A constant or a jitted function imported from a helper left the helper out (only classes,
    functions and modules were followed), as did an import inside a function and a package's
    __init__.py; same-named files were keyed by name alone; and a new Python's parser made every
    unchanged file 'changed'."""
    from jaxfl.experiment import _changed_files, model_source

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("SCALE = 1\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "consts.py").write_text("WIDTH = 4\n")
    (tmp_path / "pkg" / "lazy.py").write_text("def act(x):\n    return x\n")
    (tmp_path / "pkg" / "net.py").write_text(
        "import flax.linen as nn\nfrom .sub.consts import WIDTH\n\n\nclass Net(nn.Module):\n    num_classes: int = 10\n\n"
        "    @nn.compact\n    def __call__(self, x):\n        from pkg.lazy import act\n"
        "        return nn.Dense(self.num_classes)(act(nn.Dense(WIDTH)(x.reshape((x.shape[0], -1)))))\n")
    record = model_source("pkg.net:Net")
    assert sorted(record["files"]) == ["__init__.py", "lazy.py", "net.py", os.path.join("sub", "__init__.py"),
                                       os.path.join("sub", "consts.py")]
    for name, edit in (("sub/consts.py", "WIDTH = 64\n"), ("lazy.py", "def act(x):\n    return -x\n"),
                       ("__init__.py", "SCALE = 2\n")):
        before = (tmp_path / "pkg" / name).read_text()
        (tmp_path / "pkg" / name).write_text(edit)
        assert _changed_files(record, model_source("pkg.net:Net")) == [os.path.normpath(name)]
        (tmp_path / "pkg" / name).write_text(before)
    (tmp_path / "pkg" / "sub" / "consts.py").write_text("WIDTH = 4  # the width\n\n")  # a comment, layout
    assert _changed_files(record, model_source("pkg.net:Net")) == []
    # a file's bytes unchanged is unchanged whatever parser made its code's fingerprint
    (tmp_path / "pkg" / "sub" / "consts.py").write_text("WIDTH = 4\n")
    other_python = {**record, "python": "3.99.0",
                    "files": {name: {**entry, "code": "another parser's"} for name, entry in record["files"].items()}}
    assert _changed_files(other_python, model_source("pkg.net:Net")) == []
    (tmp_path / "pkg" / "sub" / "consts.py").write_text("WIDTH = 4  # the width\n")
    assert _changed_files(other_python, model_source("pkg.net:Net")) == [os.path.join("sub", "consts.py")]
