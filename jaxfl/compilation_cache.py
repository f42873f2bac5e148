"""XLA's compiled programs kept on disk between ``jaxfl`` commands, so that a second run of the same
shapes does not compile again.

A run's training program is most of its first seconds: a CNN FedBuff run on a 2-core CPU compiles
for 18.5 s of its 36 s, and its second run, reading the programs back, for 2.3 s (2026-12-03). The
``jaxfl`` command turns jax's persistent compilation cache on in a folder of the user's cache
(``$XDG_CACHE_HOME/jaxfl/xla``, by default ``~/.cache/jaxfl/xla``), bounded in size, the programs
used least recently evicted first. A cached program is the same executable, so results do not
change; XLA:CPU refuses a program compiled for another machine's CPU, and compiles it again.

``JAXFL_COMPILATION_CACHE`` names another folder, or ``off``; a cache the user configured for jax
(``JAX_COMPILATION_CACHE_DIR``, ``jax.config.update("jax_compilation_cache_dir", ...)``) is used as
it is. Python code that imports jaxfl keeps jax's settings unless it calls
:func:`use_compilation_cache`.
"""
from __future__ import annotations

import os

ENVIRONMENT_VARIABLE = "JAXFL_COMPILATION_CACHE"
OFF = ("off", "0", "false", "no", "none")
DEFAULT_MAX_BYTES = 1 << 30
# a small model's step programs compile in well under jax's default threshold of 1 s
MIN_COMPILE_SECONDS = 0.2


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
    off). Programs that compile in 0.2 s or more are kept (jax's own threshold is 1 s), and the
    folder is held under ``max_bytes`` by evicting the programs used least recently (where the
    ``filelock`` package that jax needs for it is installed; otherwise the folder is not bounded).
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
        setting = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
        if setting.lower() in OFF:
            return None
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
    if jax.config.jax_compilation_cache_max_size == -1 and _can_evict():
        jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
    jax.config.update("jax_compilation_cache_dir", folder)
    compilation_cache.reset_cache()  # jax decides once whether to use a cache: ask again
    return folder


def _can_evict() -> bool:
    """jax bounds a cache's size only with the ``filelock`` package (it raises without it)."""
    try:
        import filelock  # noqa: F401
    except ImportError:
        return False
    return True
