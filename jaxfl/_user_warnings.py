"""Warnings that point at the user's line: the first caller outside jaxfl (a notebook cell, a script's
``run_experiment(...)``, a plug-in's hook), not jaxfl's own frame. A fixed ``stacklevel`` could not:
the same warning is reached through ``run_experiment``, ``compare``, a sweep or a resume, at other
depths, and it named ``jaxfl/experiment.py`` and a line of jaxfl's code in a notebook's output."""
from __future__ import annotations

import os
import sys
import sysconfig
import warnings

_JAXFL = os.path.dirname(os.path.abspath(__file__)) + os.sep
# the standard library's frames between jaxfl's (contextlib's __exit__, functools, runpy for
# `python -m jaxfl`) are not the user's line either
_STDLIB = tuple({os.path.abspath(sysconfig.get_paths()[name]) + os.sep for name in ("stdlib", "platstdlib")})


def _not_the_users(filename: str) -> bool:
    if filename.startswith("<"):  # a notebook cell, a doctest, `python -c`: the user's; Python's frozen modules not
        return filename.startswith("<frozen ")
    filename = os.path.abspath(filename)
    return filename.startswith(_JAXFL) or filename.startswith(_STDLIB)


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the innermost frame outside jaxfl and the
    standard library (the outermost frame where every one is: the ``jaxfl`` command's). Filters,
    ``catch_warnings``, ``pytest.warns`` and the once-per-line rule work as for any warning.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_user("a note")
    >>> caught[0].filename.startswith(_JAXFL), str(caught[0].message)
    (False, 'a note')
    """
    frame = sys._getframe(1)
    while frame.f_back is not None and _not_the_users(frame.f_code.co_filename):
        frame = frame.f_back
    module_globals = frame.f_globals
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=module_globals.get("__name__", "<string>"),
                           registry=module_globals.setdefault("__warningregistry__", {}),
                           module_globals=module_globals)
