"""jaxfl's warnings name the user's line, not jaxfl's: a notebook showed `jaxfl/experiment.py:1857:
UserWarning: ...` and jaxfl's own source line under every warning of a cell run again."""
import dataclasses
import os
import warnings

from jaxfl.comparison import compare
from jaxfl.experiment import run_experiment


def caught(call):
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        call()
    return records


def test_a_warning_of_a_run_or_comparison_names_the_callers_line(small_config):
    run_experiment(small_config)
    again = caught(lambda: run_experiment(small_config))  # the finished run is trained again: said
    assert [record.filename for record in again if "holds a finished run" in str(record.message)] == [__file__]
    configs = [dataclasses.replace(small_config, buffer_size=size) for size in (1, 2)]
    compare(configs)
    records = caught(lambda: compare(configs))  # deeper in jaxfl: the same line of the caller
    said = [record for record in records if "holds a finished run" in str(record.message)]
    assert len(said) == 2 and {record.filename for record in said} == {__file__}
    # the same comparison again: its own table, not "replaced by" another's
    assert not [record for record in records if "replaced by" in str(record.message)]


def test_a_warning_inside_a_plugin_names_the_plugins_line(small_config, tmp_path):
    # called back from a user's own code (a module of theirs), jaxfl's warning names that code's line
    path = tmp_path / "mine.py"
    path.write_text("import jaxfl\n\ndef go(config):\n    return jaxfl.run_experiment(config)\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("mine_user_warnings", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = dataclasses.replace(small_config, target_accuracy=None, dataset="synthetic:0.5,0.5", model="mlp")
    records = [record for record in caught(lambda: module.go(config)) if "no default target" in str(record.message)]
    assert records and os.path.samefile(records[0].filename, path) and records[0].lineno == 4


def test_jaxfls_warnings_are_still_filtered_by_jaxfls_module_name(small_config):
    # the filename is the user's, the module jaxfl's: filterwarnings(module="jaxfl") silenced them before
    config = dataclasses.replace(small_config, target_accuracy=None, dataset="synthetic:0.5,0.5", model="mlp")
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module=r"jaxfl(\.|$)")
        run_experiment(config)
    assert not [record for record in records if "no default target" in str(record.message)]


def test_without_a_frame_of_the_users_the_warning_names_jaxfls_line(small_config):
    # a thread of its own (a worker pool): the stack is the thread's bootstrap, the pool's and jaxfl's;
    # threading.py's line was named
    from concurrent.futures import ThreadPoolExecutor

    from jaxfl.experiment import prepare

    config = dataclasses.replace(small_config, target_accuracy=None, dataset="synthetic:0.5,0.5", model="mlp")
    with warnings.catch_warnings(record=True) as records, ThreadPoolExecutor(1) as pool:
        warnings.simplefilter("always")
        pool.submit(prepare, config).result()
    said = [record for record in records if "no default target" in str(record.message)]
    assert said and all(record.filename == os.path.abspath(prepare.__code__.co_filename) for record in said)


def test_an_installed_packages_frames_are_not_the_users():
    from jaxfl._user_warnings import _not_the_users

    assert _not_the_users(os.path.join(os.sep, "opt", "venv", "lib", "python3.11", "site-packages", "jax", "x.py"))
    assert not _not_the_users(os.path.join(os.sep, "home", "me", "plugins", "mine.py"))
    assert not _not_the_users(os.path.join(os.sep, "tmp", "ipykernel_1234", "2719.py"))  # a notebook cell


def test_a_warning_from_python_dash_c_is_shown_not_an_import_error():
    # the source line was asked of __main__'s loader (BuiltinImporter under -c), which raised ImportError
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "from jaxfl.config import RunConfig, validate\n"
                           "validate(RunConfig(algorithm='fedavg', buffer_size=4))"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "<string>:2: UserWarning: buffer_size=4 is ignored: fedavg does not read it" in done.stderr


def test_a_comparison_says_each_note_once_not_once_a_run(small_config):
    """Three runs on data with a label only in the held-out set: the data's note came with the
    check before the runs and again with each run (Python's once-per-line rule forgets what it said
    when a catch_warnings block ends); the runs' notes that name their own run still come per run."""
    import numpy as np

    rng = np.random.default_rng(0)
    data = {"x_train": rng.normal(size=(120, 8)).astype("float32"), "y_train": rng.integers(0, 3, 120),
            "x_test": rng.normal(size=(30, 8)).astype("float32"), "y_test": np.arange(30) % 4}
    configs = [dataclasses.replace(small_config, algorithm=name, model="logreg", target_accuracy=0.9)
               for name in ("fedavg", "fedbuff", "fedasync")]
    compare(configs, data=data)
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("default")  # Python's own rule, as a notebook has it: once per line
        compare(configs, data=data)
    records = [str(record.message) for record in recorded]
    assert sum("counted as 4 classes" in message for message in records) == 1, records
    assert sum("holds a finished run" in message for message in records) == 3  # one a run: each names its run
    # asked for every repeat: every one
    records = [str(record.message) for record in caught(lambda: compare(configs, data=data))]
    assert sum("counted as 4 classes" in message for message in records) > 1, records
