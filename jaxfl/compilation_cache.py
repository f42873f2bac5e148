"""XLA's compiled programs kept on disk between ``jaxfl`` commands, so that a second run of the same
shapes does not compile again.

A run's training program is most of its first seconds: a CNN FedBuff run on a 2-core CPU compiles
for 18.5 s of its 36 s, and its second run, reading the programs back, for 2.3 s (2026-12-03). The
``jaxfl`` command turns jax's persistent compilation cache on in a folder of the user's cache
(``$XDG_CACHE_HOME/jaxfl/xla``, by default ``~/.cache/jaxfl/xla``), brought under 1 GiB as each
command starts, the programs used least recently removed first (:func:`trim`). A cached program is
the same executable, so results do not change; XLA:CPU refuses a program compiled for another
machine's CPU, and compiles it again.

``JAXFL_COMPILATION_CACHE`` names another folder, or ``off``; a cache the user configured for jax
(``JAX_COMPILATION_CACHE_DIR``, ``jax.config.update("jax_compilation_cache_dir", ...)``) is used as
it is. Python code that imports jaxfl keeps jax's settings unless it calls
:func:`use_compilation_cache`; a run started from Python (``run_experiment``, ``resume_experiment``)
keeps the programs it compiles in a temporary folder of the process for the runs after it
(:func:`process_compilations`), and leaves jax's settings as they were when it ends.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile

ENVIRONMENT_VARIABLE = "JAXFL_COMPILATION_CACHE"
OFF = ("off", "0", "false", "no", "none")
DEFAULT_MAX_BYTES = 1 << 30
# A program compiled in 20 ms or more is kept: reading one back takes ~7 ms, and a run's small programs
# (client init, finish, server step, evaluation: 30-60 ms each on a 2-core CPU) are compiled again by
# every run otherwise. At 0.2 s a repeated small PORT run took 2.3-2.9 s instead of 1.9 (2026-12-05).
MIN_COMPILE_SECONDS = 0.02


def turned_off() -> bool:
    """Whether ``JAXFL_COMPILATION_CACHE`` turns jaxfl's caches off (``off``, ``0``, ``false``, ``no``,
    ``none``, in any case).

    Example:
        >>> before = os.environ.pop(ENVIRONMENT_VARIABLE, None)
        >>> os.environ[ENVIRONMENT_VARIABLE] = " Off "; turned_off()
        True
        >>> del os.environ[ENVIRONMENT_VARIABLE]; turned_off()
        False
        >>> if before is not None: os.environ[ENVIRONMENT_VARIABLE] = before
    """
    return os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() in OFF


def default_folder() -> str:
    """``$XDG_CACHE_HOME/jaxfl/xla``, or ``~/.cache/jaxfl/xla``.

    Example:
        >>> default_folder().endswith(os.path.join("jaxfl", "xla"))
        True
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxfl", "xla")


def use_compilation_cache(folder: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> str | None:
    """Keep XLA's compiled programs in ``folder`` from now on in this process; returns the folder in
    use, or None where the cache stays off.

    A cache the user configured for jax wins over everything. Otherwise ``folder`` (by default
    ``JAXFL_COMPILATION_CACHE``, else :func:`default_folder`; ``off`` in the variable keeps the cache
    off). Programs that compile in 20 ms or more are kept (jax's own threshold is 1 s), and the
    folder is brought under ``max_bytes`` here, once (:func:`trim`), the programs used least
    recently removed first.
    A folder that was asked for (the argument or the variable) and cannot be written is a
    ValueError naming it; the default folder is skipped then.

    Example:
        >>> import jax
        >>> from jaxfl.comparison import shared_compilations
        >>> with shared_compilations() as folder:   # a cache the user configured is kept
        ...     use_compilation_cache() == folder == jax.config.jax_compilation_cache_dir
        True
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    asked = folder is not None
    if folder is None:
        if turned_off():
            return None
        setting = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
        asked = bool(setting)
        folder = setting or default_folder()
    folder = os.path.abspath(os.path.expanduser(folder))
    try:
        os.makedirs(folder, exist_ok=True)
        writable = os.access(folder, os.W_OK | os.X_OK)
    except OSError:
        writable = False
    if not writable:
        if asked:
            raise ValueError(f"the compilation cache folder {folder!r} cannot be created or written; name a "
                             f"writable folder in {ENVIRONMENT_VARIABLE}, or set it to 'off'")
        return None
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    if jax.config.jax_compilation_cache_max_size == -1:  # else jax bounds it, as the user asked
        trim(folder, max_bytes)
    jax.config.update("jax_compilation_cache_dir", folder)
    compilation_cache.reset_cache()  # jax decides once whether to use a cache: ask again
    return folder


def trim(folder: str, max_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """Bring the compiled programs in ``folder`` (jax's ``*-cache`` files) under ``max_bytes``, if they
    are over it, by removing those used least recently (the later of a file's access and modification
    times) until the rest take at most 90 % of it; returns the bytes removed. jaxfl bounds its caches
    this way, one pass over the folder when a command or a run starts, rather than through jax's
    ``jax_compilation_cache_max_size``, which lists the whole folder and reads a time file per program
    at every program it writes (44 µs an entry: 45 ms a write at 1,000 programs, 0.9 s at 20,000;
    2-core CPU, 2026-12-05). A program another process is reading when it is removed is compiled
    again there.

    >>> import tempfile, time
    >>> folder = tempfile.mkdtemp()
    >>> for age, name in enumerate(["new", "old"]):
    ...     path = os.path.join(folder, f"{name}-cache")
    ...     with open(path, "wb") as handle: _ = handle.write(bytes(600))
    ...     os.utime(path, (time.time() - 100 * age,) * 2)
    >>> trim(folder, max_bytes=1000), sorted(os.listdir(folder))
    (600, ['new-cache'])
    """
    programs, total = [], 0
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.endswith("-cache") and entry.is_file(follow_symlinks=False):
                stat = entry.stat(follow_symlinks=False)
                programs.append((max(stat.st_atime, stat.st_mtime), entry.path, stat.st_size))
                total += stat.st_size
    if total <= max_bytes:
        return 0
    removed = 0
    for _, path, size in sorted(programs):
        if total - removed <= 0.9 * max_bytes:
            break
        with contextlib.suppress(OSError):  # another process's trim was first
            os.remove(path)
            removed += size
        with contextlib.suppress(OSError):  # the time file jax's own bound writes beside a program
            os.remove(path[:-len("-cache")] + "-atime")
    return removed


@contextlib.contextmanager
def compilations_in(folder: str):
    """Within the block, jax's persistent compilation cache in ``folder`` (the programs that compile in
    ``MIN_COMPILE_SECONDS`` or more, or jax's own ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` where
    it is set, whatever their size; brought under ``DEFAULT_MAX_BYTES`` as the block starts by
    :func:`trim`), jax's settings restored after it; a cache
    the user configured for jax (``jax_compilation_cache_dir``) is used as it is. Yields the folder
    in use. A cached program is the same executable, so results do not change.

    >>> import jax, tempfile
    >>> with compilations_in(tempfile.mkdtemp()) as folder:   # the suite's cache, where it runs in the tests
    ...     in_use = jax.config.jax_compilation_cache_dir
    >>> in_use == folder
    True
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if jax.config.jax_compilation_cache_dir:
        yield jax.config.jax_compilation_cache_dir
        return
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {name: getattr(jax.config, name) for name in names}
    try:
        if jax.config.jax_compilation_cache_max_size == -1:  # a long session stays bounded
            trim(folder)
        if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # else jax's setting, as the user set it
            jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        jax.config.update("jax_compilation_cache_dir", folder)
        compilation_cache.reset_cache()  # jax decides once whether to use a cache: ask again
        yield folder
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


_process_folder: str | None = None


@contextlib.contextmanager
def process_compilations():
    """:func:`compilations_in` one temporary folder for the whole process, removed when it exits:
    each run from Python (``run_experiment``, ``resume_experiment``) runs in this block, so a run in a
    notebook or a script reads back the programs an earlier run of the process compiled for the
    same model and shapes instead of compiling them again (a loop over seeds of a small CNN FedBuff
    run on the 2-core CPU: 5.9-7.5 s a run after the first without it, 1.8-2.0 s with it;
    2026-12-04), and jax's settings are the user's again between runs. ``JAXFL_COMPILATION_CACHE=off``
    keeps it off (yields None); a cache the user configured for jax is used as it is (and no folder
    is made).

    >>> with process_compilations() as folder:   # a run's programs go to this folder
    ...     pass
    """
    import jax

    global _process_folder
    if jax.config.jax_compilation_cache_dir:
        yield jax.config.jax_compilation_cache_dir
        return
    if turned_off():
        yield None
        return
    if _process_folder is None or not os.path.isdir(_process_folder):
        _process_folder = tempfile.mkdtemp(prefix="jaxfl-xla-cache-")
        atexit.register(shutil.rmtree, _process_folder, ignore_errors=True)
    with compilations_in(_process_folder) as folder:
        yield folder
