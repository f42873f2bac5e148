"""Warnings that point at the user's line: the first caller that is the user's code (a notebook cell,
a script's ``run_experiment(...)``, a plug-in's file), not jaxfl's own frame. A fixed ``stacklevel``
could not: the same warning is reached through ``run_experiment``, ``compare``, a sweep or a resume,
at other depths, and it named ``jaxfl/experiment.py`` and a line of jaxfl's code in a notebook's
output. Filters still name jaxfl: the warning's module is jaxfl's that issued it
(``warnings.filterwarnings("ignore", module="jaxfl")`` silences jaxfl's notes, as before)."""
from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import warnings

_JAXFL = os.path.dirname(os.path.abspath(__file__)) + os.sep
# not the user's line either: the standard library's frames between jaxfl's (contextlib's __exit__,
# functools, runpy for `python -m jaxfl`, a thread's bootstrap) and installed packages' (jax's
# tracing of a jaxfl function; site-packages may lie inside the standard library's folder)
_LIBRARIES = tuple({os.path.abspath(folder) + os.sep for name, folder in sysconfig.get_paths().items()
                    if name in ("stdlib", "platstdlib", "purelib", "platlib")})
_INSTALLED = ("site-packages", "dist-packages")


def _not_the_users(filename: str) -> bool:
    """Whether a frame of ``filename`` is jaxfl's, the standard library's or an installed package's
    (a notebook cell, a doctest, ``python -c`` and a script are the user's, whether or not their file
    exists on the disk: ipykernel names cells by files it never writes).

    >>> _not_the_users(__file__), _not_the_users("<doctest x>"), _not_the_users("/home/me/study.py")
    (True, False, False)
    """
    if filename.startswith("<"):
        return filename.startswith("<frozen ")
    filename = os.path.abspath(filename)
    return filename.startswith(_JAXFL) or filename.startswith(_LIBRARIES) or any(part in filename for part in _INSTALLED)


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` shown at the innermost frame of the user's code that led
    to it; where there is none (a thread of jaxfl's own, the ``jaxfl`` command), at the line of jaxfl
    that issued it. Filters (by jaxfl's module name too), ``catch_warnings``, ``pytest.warns`` and
    the once-per-line rule work as for any warning.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_user("a note")
    >>> caught[0].filename.startswith(_JAXFL), str(caught[0].message)
    (False, 'a note')
    """
    issuer = sys._getframe(1)
    frame = issuer
    while frame is not None and _not_the_users(frame.f_code.co_filename):
        frame = frame.f_back
    shown = issuer if frame is None else frame
    # no module_globals, as warnings.warn passes none: with them, the source line is asked of the module's
    # loader, and `python -c`'s __main__ (BuiltinImporter) raised ImportError instead of warning
    warnings.warn_explicit(message, category, shown.f_code.co_filename, shown.f_lineno,
                           module=issuer.f_globals.get("__name__", "jaxfl"),
                           registry=shown.f_globals.setdefault("__warningregistry__", {}))


def asked_for_every_warning(options: list[str] | None = None) -> bool:
    """Whether ``-W`` or ``PYTHONWARNINGS`` (``options``: ``sys.warnoptions``) has a filter whose
    action is ``always`` (``all``, ``a``): such a user wants every repeat; another filter
    (``ignore::DeprecationWarning``, ``python -X dev``'s ``default``) is about other warnings.

    >>> asked_for_every_warning(["ignore::DeprecationWarning"]), asked_for_every_warning(["always::UserWarning"])
    (False, True)
    """
    actions = [option.split(":")[0].strip().lower() for option in (sys.warnoptions if options is None else options)]
    return any(action and ("always".startswith(action) or action == "all") for action in actions)


def each_note_once(show):
    """``show`` (a ``warnings.showwarning``) that passes on each note once: a sweep's check before its
    cells and each of its cells (or a comparison's runs) said the same note again, a FedASMU grid of
    32 cells 33 times. (Python's own once-per-line rule forgets what it said whenever a
    ``catch_warnings`` block ends, as every run's ends.) Notes are told apart by their category and
    text, so a note that names its run or its values is said for each.

    >>> shown = []
    >>> show = each_note_once(lambda message, category, *where: shown.append(str(message)))
    >>> for text in ("a note", "another", "a note"):
    ...     show(UserWarning(text), UserWarning, "<cell>", 1)
    >>> shown
    ['a note', 'another']
    """
    said = set()

    def show_once(message, category, *where, **options):
        key = (category, str(message))
        if key not in said:
            said.add(key)
            show(message, category, *where, **options)

    return show_once


def _filtered_always() -> bool:
    """Whether the warning filters in force show every repeat of a jaxfl note: the first filter that a
    ``UserWarning`` of jaxfl's module matches says ``always`` (``warnings.simplefilter("always")`` in
    a notebook)."""
    for action, message, category, module, _ in warnings.filters:
        if (message is None or message.match("")) and issubclass(UserWarning, category) \
                and (module is None or module.match("jaxfl.experiment")):
            return action == "always"
    return False


@contextlib.contextmanager
def notes_said_once():
    """Within it each of jaxfl's notes is shown once (:func:`each_note_once`), as the ``jaxfl``
    command shows them: :func:`jaxfl.comparison.compare`'s runs on the same data each said its notes
    again (Python's once-per-line rule forgets what it said whenever a ``catch_warnings`` block ends).
    Not where the user asked for every repeat (``-W always``, ``PYTHONWARNINGS=always``,
    ``warnings.simplefilter("always")``)."""
    with warnings.catch_warnings():
        if not asked_for_every_warning() and not _filtered_always():
            warnings.showwarning = each_note_once(warnings.showwarning)
        yield
