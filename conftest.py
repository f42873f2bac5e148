"""Settings for the whole test session (tests/ and the docstring examples in jaxfl/).

XLA's persistent compilation cache, in a folder new to this session: the suite builds hundreds of
engines whose jitted steps are the same programs, and without the cache each is compiled again. A
cached executable is the same program, so no result changes; the folder is removed at exit, so
nothing carries from one test session to the next. Subprocesses started by tests inherit it.

XLA:CPU's code generation at optimisation level 1 instead of its default 3 (``XLA_FLAGS``, inherited
by subprocesses too; a level the user set is kept). Compiling is most of the suite's time on the
2-core CPU, and level 1 compiles a small run's programs 20-30 % faster and the zoo models'
initialisers 2.3x faster, with the same bits: every golden event log and model the tests compare was
recorded at level 3, and the 16 zoo models initialise to the same values at both levels.
"""
import atexit
import os
import shutil
import tempfile

if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=1").strip()

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="jaxfl-tests-xla-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
