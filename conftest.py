"""Settings for the whole test session (tests/ and the docstring examples in jaxfl/).

XLA's persistent compilation cache, in a folder new to this session: the suite builds hundreds of
engines whose jitted steps are the same programs, and without the cache each is compiled again. A
cached executable is the same program, so no result changes; the folder is removed at exit, so
nothing carries from one test session to the next (``JAXFL_TEST_XLA_CACHE``, or a cache the user set
for jax in ``JAX_COMPILATION_CACHE_DIR``, is used instead and kept: tests/conftest.py). The tests'
own runs and every process they start use it.

XLA:CPU compiles faster for the tests (``XLA_FLAGS``, inherited by subprocesses; flags the user set
are kept): LLVM at optimisation level 1 instead of 3, and fusions by XLA's classic emitter instead of
its newer fusion emitters. Compiling is most of the suite's time on the 2-core CPU; a small run's
programs compile in half the time (an MLP FedBuff run 6.1-6.4 s against 2.9-3.0, a CNN's 8.4-10.8 s
against 5.9-6.2, 2026-12-03) and compute the same bits: every golden event log and model the tests
compare was recorded with XLA's defaults, and the 16 zoo models initialise to the same values.
Users' runs keep XLA's defaults: with these flags a step runs 10-30 % slower (benchmarks/README.md,
2026-12-03), which a run that trains for minutes pays more than the seconds of compile it saves.
"""
import atexit
import os
import re
import shutil
import tempfile
from importlib import metadata

# jaxlib 0.11.1 dropped the classic emitter's flag, and XLA aborts the process on a flag it does not know
# (jaxfl.models.adapter.CLASSIC_FUSION_EMITTER, read here without importing jax before the flags are set)
_jaxlib = tuple(int(part) for part in re.findall(r"\d+", metadata.version("jaxlib"))[:3])
for _flag in ("--xla_backend_optimization_level=1",) + (("--xla_cpu_use_fusion_emitters=false",)
                                                        if _jaxlib < (0, 11, 1) else ()):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="jaxfl-tests-xla-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402  (after the environment above: it imports nothing of jax)


@pytest.fixture(autouse=True)
def _doctests_run_in_a_folder_of_their_own(request, monkeypatch):
    """A docstring example that runs an experiment writes into the default ``runs/`` of the folder it
    runs in, or into a ``tempfile.mkdtemp()``: both inside a fresh folder per example, which pytest
    removes (a fixed /tmp/jaxfl-doc, and the mkdtemp() folders, grew by a run per example per suite:
    823 MB after some weeks)."""
    if type(request.node).__name__ == "DoctestItem":  # (the tests' own tmp_path is not made for every test)
        import tempfile

        folder = request.getfixturevalue("tmp_path")
        monkeypatch.chdir(folder)
        monkeypatch.setattr(tempfile, "tempdir", str(folder))
