"""Settings for the whole test session (tests/ and the docstring examples in jaxfl/).

XLA's persistent compilation cache, in a folder new to this session: the suite builds hundreds of
engines whose jitted steps are the same programs, and without the cache each is compiled again. A
cached executable is the same program, so no result changes; the folder is removed at exit, so
nothing carries from one test session to the next. Subprocesses started by tests inherit it.
"""
import atexit
import os
import shutil
import tempfile

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="jaxfl-tests-xla-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
