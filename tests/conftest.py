import dataclasses
import gc
import os
import signal
import tempfile

import jax
import pytest

from jaxfl.config import RunConfig

# Many tests build engines whose step chunks are the same XLA program (the same small model, batch
# and step count); compiling each once per session instead of once per engine is most of the
# suite's time. The persistent cache keys on the program, so results and trace counts are unchanged.
# One cache for every worker and every process a test starts (the session's folder, which the root
# conftest.py makes and removes; JAXFL_TEST_XLA_CACHE names another, kept across sessions): jax writes
# an entry in place, so a worker may read one another is still writing; that entry is then a truncated
# zlib stream, which jax reports as a warning and compiles again (it is not what crashed a worker: see
# _free_the_module_s_engines). (jax's size limit would lock each read and write, but each write then
# lists the whole cache.) The environment names it too: a `jaxfl` command a test starts read another
# folder than the test's own runs, and compiled again what they had compiled a moment before.
_cache = os.environ.get("JAXFL_TEST_XLA_CACHE") or os.environ.get("JAX_COMPILATION_CACHE_DIR")
if not _cache:  # (the root conftest.py not read: a pytest started with another rootdir)
    import atexit
    import shutil

    _cache = tempfile.mkdtemp(prefix="jaxfl-tests-xla-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
jax.config.update("jax_compilation_cache_dir", _cache)
# Every program, the small ones too: the engine's per-run programs (client init, finish, server step,
# evaluation) compile in under 0.2 s each but again for every run; cached, the conformance tests of 5
# algorithms took 70.4 against 79.1 CPU s at a 0.2 s threshold, test_engine, _algorithms, _fedcompass,
# _port and _ccfedavg 142 against 151 (fresh caches, run side by side, one core each).
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

# The Ctrl-C tests send SIGINT to a `jaxfl` child. A suite started as a background job of a
# non-interactive shell (`cmd &` in a script) inherits SIGINT ignored, and so would every child: the
# run under test would ignore the Ctrl-C and the test wait out its timeout (300 s), leaving the
# child running. A handler set here is reset to the default in each child at exec, where Python
# installs its own, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def sharing_compilations(**changes) -> dict:
    """The environment for a subprocess of a test (a `jaxfl` command, a script of several processes):
    this one's, which names the tests' compilation cache (above), so that it loads the programs this
    or another process compiled for the same model and shapes instead of compiling them again (what
    such a test checks is the process's own behaviour: signals, resumes, collectives), plus ``changes``."""
    return dict(os.environ, **changes)


@pytest.fixture(autouse=True, scope="module")
def _free_the_module_s_engines():
    """Engines hold compiled programs, whose code pages count against the kernel's limit of 65,530
    memory maps a process; a worker that reached it crashed in XLA's next compilation (and xdist then
    hung). A finished run's engine is freed with its result, and a run frees the engines of earlier
    runs that raised; this collects whatever a test module still left in reference cycles (a run
    that raised in its last test, objects a test wired together), before the next module starts."""
    yield
    gc.collect()


@pytest.fixture
def small_config(tmp_path):
    """A seconds-long run on the embedded MNIST-10k: MLP, 4 clients, 4 local steps."""
    return RunConfig(algorithm="fedbuff", dataset="mnist10k", model="mlp", clients=4, local_steps=4,
                     batch_size=16, max_updates=4, buffer_size=2, progress=False,
                     output_dir=str(tmp_path / "runs"))


def replace(config, **changes):
    return dataclasses.replace(config, **changes)


class RecordingBackend:
    """The scheduler's contract needs no numbers: record what the engine would be asked."""

    def __init__(self):
        self.dispatched, self.aggregations = [], []

    def on_dispatch(self, record):
        self.dispatched.append(record.id)

    def on_aggregate(self, aggregation, records):
        self.aggregations.append(aggregation)
        return False

    def on_drop(self, record):
        pass

    def nonfinite(self, records):
        return []


class Interrupted(Exception):
    """Raised inside a run to interrupt it (tests of resume)."""


@pytest.fixture
def crash_after_saves(monkeypatch):
    """``crash_after_saves(n, before=None)``: the next runs raise :class:`Interrupted` right after
    writing their n-th checkpoint (``before(checkpointer, simulation)`` runs first, e.g. to write
    something a resume must cut back); returns a function that stops the crashing. In a test::

        disarm = crash_after_saves(2)
        with pytest.raises(Interrupted):
            run_experiment(config)
        disarm()
        resumed = resume_experiment(run_dir)
    """
    import jaxfl.experiment as experiment

    original = experiment._Checkpointer.save

    def arm(saves: int, before=None):
        written = {"saves": 0}

        def crashing(self, simulation):
            original(self, simulation)
            written["saves"] += 1
            if written["saves"] == saves:
                if before is not None:
                    before(self, simulation)
                raise Interrupted

        monkeypatch.setattr(experiment._Checkpointer, "save", crashing)
        return lambda: monkeypatch.setattr(experiment._Checkpointer, "save", original)

    return arm
