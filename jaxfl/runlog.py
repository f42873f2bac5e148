"""A run's event log at any scale, and readers for a whole run directory.

Small runs keep today's ``events.csv`` byte for byte; a run with millions of clients writes
10^7 rows, which CSV holds badly (slow to write and parse, ~5x the size), so the log switches
itself to Parquet parts under ``events/`` once it passes ``switch_rows`` rows, or starts in them
when told to expect more (``expected_rows``: a timing-only run knows its update budget):

    RUN_DIR/events.csv                  format "csv" (and "auto" while small)
    RUN_DIR/events/part-00000.parquet   format "parquet" (and "auto" once large), one part per
    RUN_DIR/events/part-00001.parquet   ``part_rows`` rows (the last may be shorter)

Parquet columns: ``time`` float64, ``event`` string (dictionary), ``client`` int64, ``dispatch``,
``version``, ``staleness``, ``steps`` nullable int64, ``detail`` nullable string (dictionary),
``wall_time`` nullable float64 (wall-clock seconds since the run started, on aggregation rows).
Each part records in its metadata the global rows it holds (``jaxfl.first_row``, ``jaxfl.rows``),
so a reader can tell a complete log from one left half-rewritten by a crash.

What each kind of row (``dispatch``, ``arrival``, ``aggregate``, ``drop``, ``crash``, ``pull``,
``fetch``, ``timer``) holds in each column: README, "The event log".

Readers return columns as numpy arrays. **Missing values:** integer columns hold ``-1`` where the
log has no value (the server's rows already use client ``-1``; dispatch, version, staleness and
steps are never negative otherwise); string columns are object arrays with ``None``. CSV cannot
tell an empty ``detail`` from a missing one: both read back as ``None``.

Parquet needs ``pyarrow`` (``pip install pyarrow``); without it "auto" stays CSV and readers
parse CSV with the standard library (slower, same columns).

**Damaged files.** Every row the writers write ends with a line end, so a CSV file (``events.csv``,
``metrics.csv``, ``class_accuracy.csv``) whose last line has none was cut mid-write: by a run still
writing, or one killed. For a run without ``summary.json`` (running or killed) the readers leave that
partial last row out and read every row before it: a killed run can be inspected as far as it got
(resuming it cuts its logs back to its checkpoint in any case). In a finished run the same is
damage. Damage — a cut last line in a finished run, a row of the wrong width or a cell that is not
a number anywhere in the file, a Parquet part that does not read — is a ``ValueError`` in one line
naming the file and what is wrong, and what to do: resume an interrupted run (which cuts its logs
back to its last checkpoint), or restore a finished run's file.

>>> import tempfile
>>> run_dir = tempfile.mkdtemp()
>>> with EventLog(run_dir) as log:
...     log.write({"time": 0.0, "event": "dispatch", "client": 3, "dispatch": 0, "version": 0,
...                "staleness": None, "steps": 5, "detail": None})
>>> open(f"{run_dir}/events.csv").read().splitlines()
['time,event,client,dispatch,version,staleness,steps,detail,wall_time', '0.0,dispatch,3,0,0,,5,,']
>>> read_events(run_dir)["staleness"]
array([-1])
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import json
import operator
import os
import re
import shlex
import shutil
from time import monotonic
from typing import Any, Callable

import numpy as np

from jaxfl.scheduler.faults import split_fault_seconds
from jaxfl.scheduler.simulation import EVENT_LOG_FIELDS

FORMATS = ("auto", "csv", "parquet")
CSV_NAME = "events.csv"
PARQUET_DIR = "events"
METRICS_NAME = "metrics.csv"
CLASS_ACCURACY_NAME = "class_accuracy.csv"
MISSING = -1  # integer columns: no value in the log
INT_FIELDS = ("client", "dispatch", "version", "staleness", "steps")
FLOAT_FIELDS = ("time", "wall_time")  # wall_time: on aggregation rows only (NaN elsewhere)
STRING_FIELDS = ("event", "detail")
_PART = re.compile(r"^part-(\d{5,})\.parquet$")
_CONVERTING = ".events.converting"  # the csv→parquet switch builds its parts here, then renames
_FIRST_ROW, _ROWS = b"jaxfl.first_row", b"jaxfl.rows"
_INSTALL = "pip install pyarrow"


def _pyarrow():
    """``(pyarrow, pyarrow.parquet)`` or None: Parquet is optional."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        return None
    return pyarrow, pyarrow.parquet


def _require_pyarrow(why: str):
    modules = _pyarrow()
    if modules is None:
        raise ImportError(f"{why} needs pyarrow, which is not installed: {_INSTALL}")
    return modules


def _arrow_type(pa, field: str):
    if field in FLOAT_FIELDS:
        return pa.float64()
    if field in INT_FIELDS:
        return pa.int64()
    return pa.dictionary(pa.int32(), pa.string())  # event, detail and any extra field: few distinct values


def arrow_schema(fields=EVENT_LOG_FIELDS):
    """The Parquet parts' schema (pyarrow).

    >>> str(arrow_schema().field("staleness").type)
    'int64'
    """
    pa, _ = _require_pyarrow("arrow_schema")
    return pa.schema([pa.field(name, _arrow_type(pa, name)) for name in fields])


DIVERGED_REASONS = ("numerical error", "diverged")  # stop reasons of a run whose model became NaN or Inf


def diverged(summary: dict) -> bool:
    """Whether a run (its summary, or a results row) stopped on a non-finite model or its updates (a
    numerical error, or every update non-finite under ``on_nonfinite="skip"``).

    >>> diverged({"stop_reason": "numerical error: the global model ..."}), diverged({"stop_reason": "time budget"})
    (True, False)
    """
    return str(summary.get("stop_reason") or "").startswith(DIVERGED_REASONS)


def jaxfl_code(summary: dict) -> str | None:
    """The jaxfl that trained a run, from its summary's ``device_history``: ``VERSION+gCOMMIT``
    (nine hex digits of the git commit, ``.modified`` where the checkout had changes), or the version
    alone where jaxfl was installed from a release or ran before it recorded commits; stretches of a
    run resumed under other code are joined by `` → ``. None for a summary without a history (a
    timing-only run's, or one from before it was kept).

    >>> stretch = {"versions": {"jaxfl": "0.2.0"}, "jaxfl_commit": "f2caafcdc6ec5465671668fa5", "jaxfl_modified": False}
    >>> jaxfl_code({"device_history": [stretch, {**stretch, "jaxfl_modified": True}]})
    '0.2.0+gf2caafcdc → 0.2.0+gf2caafcdc.modified'
    >>> jaxfl_code({"device_history": [{"versions": {"jaxfl": "0.2.0"}}]}), jaxfl_code({})
    ('0.2.0', None)
    """
    codes = []
    for stretch in summary.get("device_history") or ():
        version = (stretch.get("versions") or {}).get("jaxfl") or "?"
        commit = stretch.get("jaxfl_commit")
        code = version if not commit else \
            f"{version}+g{commit[:9]}" + (".modified" if stretch.get("jaxfl_modified") else "")
        if not codes or codes[-1] != code:
            codes.append(code)
    return " → ".join(codes) or None


def run_jaxfl_code(run_dir: str, summary: dict) -> str | None:
    """The jaxfl that made a run (:func:`jaxfl_code`): its summary's stretches, or for a timing-only
    run (no device history) its ``config.json``'s versions and source; None where neither tells.

    >>> import json, tempfile
    >>> run_jaxfl_code(tempfile.mkdtemp(), {"device_history": [{"versions": {"jaxfl": "0.2.0"}}]})
    '0.2.0'
    >>> run_dir = tempfile.mkdtemp()   # resumed from a checkpoint that did not say which jaxfl wrote it
    >>> _ = open(f"{run_dir}/config.json", "w").write(json.dumps({"versions": {"jaxfl": "0.1.0"}}))
    >>> run_jaxfl_code(run_dir, {"device_history": [{"from_update": 0}, {"versions": {"jaxfl": "0.2.0"}}]})
    '0.1.0 → 0.2.0'
    """
    code = jaxfl_code(summary)
    if code is not None and not code.startswith("?"):
        return code
    # a timing-only run, or one resumed from a checkpoint of a jaxfl that did not record its versions
    # ("?" first): config.json holds those of the jaxfl that started the run
    try:
        record = read_json(os.path.join(run_dir, "config.json"))
    except (OSError, ValueError):
        return code
    if not isinstance(record.get("versions"), dict):
        return code
    started = _stretch_of(record["versions"], record.get("jaxfl_source") or {})
    return jaxfl_code({"device_history": [started, *(summary.get("device_history") or ())[1:]]})


def code_of(versions: dict, source: dict) -> str:
    """:func:`jaxfl_code` of one stretch from a ``config.json``'s ``versions`` and ``jaxfl_source``
    (``experiment.library_versions()`` and ``experiment.jaxfl_source()``: this process's own).

    >>> code_of({"jaxfl": "0.2.0"}, {"commit": "f2caafcdc6ec54", "modified": True})
    '0.2.0+gf2caafcdc.modified'
    """
    return jaxfl_code({"device_history": [_stretch_of(versions, source)]})


def _stretch_of(versions: dict, source: dict) -> dict:
    """A ``device_history`` stretch's code fields from a ``config.json``'s ``versions`` and ``jaxfl_source``."""
    return {"versions": versions, "jaxfl_commit": source.get("commit"), "jaxfl_modified": source.get("modified")}


def runs_inside(folder: str) -> str:
    """What a folder that is no run directory holds instead, as advice to end a message with: a sweep
    folder's runs, a comparison's table and runs, or the run directories in it; empty where none.

    >>> import tempfile
    >>> runs_inside(tempfile.mkdtemp())
    ''
    """
    if not os.path.isdir(folder):
        return ""
    if os.path.isfile(os.path.join(folder, "sweep.json")) and os.path.isdir(os.path.join(folder, "runs")):
        return (f"; it is a sweep folder, whose runs are in {os.path.join(folder, 'runs')} (jaxfl report "
                f"{folder} reads its results)")
    try:
        runs = sorted(name for name in os.listdir(folder)
                      if os.path.isfile(os.path.join(folder, name, "config.json")))
    except OSError:
        return ""
    if not runs:
        return ""
    shown = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
    table = (f"; its comparison's table is {os.path.join(folder, 'comparison.csv')}"
             if os.path.isfile(os.path.join(folder, "comparison.csv")) else "")
    return f"; it holds run directories ({shown}): give one of them{table}"


def event_log_format(run_dir: str) -> str | None:
    """Which event log ``run_dir`` holds: ``"parquet"``, ``"csv"`` or None (none yet).

    A Parquet directory wins over a CSV file: both exist only for an instant after the switch,
    when the parts already hold every row of the CSV.

    >>> import tempfile
    >>> event_log_format(tempfile.mkdtemp()) is None
    True
    """
    if os.path.isdir(os.path.join(run_dir, PARQUET_DIR)):
        return "parquet"
    if os.path.isfile(os.path.join(run_dir, CSV_NAME)):
        return "csv"
    return None



def csv_header(path: str) -> tuple[str, ...] | None:
    """The column names on a CSV file's first line (None for a missing or empty file): a run
    resumed by a newer jaxfl goes on writing the columns its tables started with.

    >>> csv_header("/no/such/file.csv") is None
    True
    """
    if not os.path.isfile(path):
        return None
    with open(path, newline="", encoding="utf-8") as handle:
        return tuple(next(csv.reader(handle), ())) or None


@contextlib.contextmanager
def written_atomically(path: str, suffix: str = ".tmp"):
    """Yield a temporary path beside ``path`` to write, then move it to ``path`` in one rename: a
    reader never sees half a file. A write that fails (a full disk) leaves neither half a file nor
    the temporary one, and its error names ``path`` where it named no file (Pillow's, numpy's).

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.txt")
    >>> with written_atomically(path) as temporary:
    ...     _ = open(temporary, "w").write("whole")
    >>> open(path).read(), os.listdir(os.path.dirname(path))
    ('whole', ['t.txt'])
    """
    temporary = path + suffix
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        if isinstance(error, OSError) and error.filename is None and error.strerror:
            raise OSError(error.errno, error.strerror, path) from error
        raise


def write_csv(path: str, rows: list[dict], columns) -> str:
    """Write ``rows`` (dicts) under the header ``columns`` to ``path`` atomically (a reader never
    sees half a table; :func:`written_atomically`) and return the path.

    >>> import tempfile
    >>> path = write_csv(os.path.join(tempfile.mkdtemp(), "t.csv"), [{"a": 1, "b": 2}], ["a", "b"])
    >>> open(path).read().split()
    ['a,b', '1,2']
    """
    with written_atomically(path) as temporary, open(temporary, "w", newline="") as handle:
        writer = csv.DictWriter(handle, list(columns))
        writer.writeheader()
        writer.writerows(rows)
    return path

def existing_fields(run_dir: str) -> tuple[str, ...] | None:
    """The columns of the event log already in ``run_dir`` (None: none yet): a run resumed by a
    newer jaxfl goes on writing the columns its log started with.

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> EventLog(run_dir, fields=("time", "event")).close()
    >>> existing_fields(run_dir)
    ('time', 'event')
    """
    kind = event_log_format(run_dir)
    if kind == "csv":
        return csv_header(os.path.join(run_dir, CSV_NAME))
    if kind == "parquet":
        _, pq = _require_pyarrow("reading the Parquet event log")
        folder = os.path.join(run_dir, PARQUET_DIR)
        parts = sorted(name for name in os.listdir(folder) if _PART.match(name))
        return tuple(pq.read_schema(os.path.join(folder, parts[0])).names) if parts else None
    return None


@dataclasses.dataclass
class _Part:
    number: int
    first_row: int
    rows: int

    @property
    def end(self) -> int:
        return self.first_row + self.rows


def _part_name(number: int) -> str:
    return f"part-{number:05d}.parquet"


def _scan_parts(folder: str, damaged: list[str] | None = None) -> tuple[list[_Part], list[_Part]]:
    """``(parts that make up the log in row order, redundant parts)``.

    A part wholly inside an earlier-starting one is the leftover of a merge interrupted between
    writing the merged part and deleting what it replaced: redundant, never counted twice. A part
    that cannot be read is an error, or, given a ``damaged`` list, named there and left out: the
    parts then make up the log's readable beginning (up to the first gap).
    """
    _, pq = _require_pyarrow(f"reading the Parquet event log in {folder!r}")
    parts = []
    for name in os.listdir(folder):
        match = _PART.match(name)
        if match is None:
            continue
        try:
            metadata = pq.read_schema(os.path.join(folder, name)).metadata or {}
        except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid (a ValueError) names no file
            if damaged is not None:
                damaged.append(name)
                continue
            raise ValueError(f"{os.path.join(folder, name)!r} cannot be read as Parquet ({error}): the part is "
                             "damaged (cut short or overwritten)") from None
        if _FIRST_ROW not in metadata or _ROWS not in metadata:
            raise ValueError(f"{os.path.join(folder, name)!r} is not a jaxfl event-log part "
                             "(no row range in its metadata)")
        parts.append(_Part(int(match.group(1)), int(metadata[_FIRST_ROW]), int(metadata[_ROWS])))
    parts.sort(key=lambda part: (part.first_row, -part.rows, part.number))
    kept, redundant, covered = [], [], 0
    for part in parts:
        if part.rows == 0 or part.end <= covered:
            redundant.append(part)
        elif part.first_row == covered:
            kept.append(part)
            covered = part.end
        elif damaged is not None:  # after a gap (a damaged or lost part): not part of the readable beginning
            break
        else:
            raise ValueError(f"the event log in {folder!r} is inconsistent: {_part_name(part.number)} holds rows "
                             f"{part.first_row}..{part.end - 1} but the parts before it end at row {covered - 1}")
    return kept, redundant


def parquet_rows(run_dir: str) -> int:
    """The rows of ``run_dir``'s Parquet event log that its readable parts hold in order from the
    first (a damaged or missing part ends them); 0 without such a log. What a checkpoint's row count
    is checked against before a resume takes it.

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> with EventLog(run_dir, fields=("time",), format="parquet") as log:
    ...     log.write({"time": 1.0}); log.write({"time": 2.0})
    >>> parquet_rows(run_dir)
    2
    """
    folder = os.path.join(run_dir, PARQUET_DIR)
    if not os.path.isdir(folder) or _pyarrow() is None:
        return 0
    parts, _ = _scan_parts(folder, damaged=[])
    return parts[-1].end if parts else 0


class EventLog:
    """Writer of a run's event log (``Simulation(log=event_log)``).

    ``format``: ``"csv"`` writes ``events.csv`` exactly as ``csv.DictWriter(handle, fields)`` with
    its header would; ``"parquet"`` writes parts under ``events/``; ``"auto"`` writes CSV until the
    log passes ``switch_rows`` rows, then converts it to Parquet parts, deletes ``events.csv`` and
    goes on in Parquet (it stays CSV if pyarrow is missing).

    ``expected_rows``: how many rows the run expects to write, if it knows (a timing-only run with
    an update budget does); ``"auto"`` then starts in Parquet at once when that is more than
    ``switch_rows``, rather than writing CSV first only to convert it.

    ``resume``: a :meth:`position` saved in a checkpoint (or, from older checkpoints, the byte
    length of ``events.csv``); the log is cut back to it, so rows written after the checkpoint —
    which the resumed run writes again — are neither lost nor doubled, even if the log switched
    to Parquet after that checkpoint.

    Rows are buffered as tuples and written ``buffer_rows`` at a time; :meth:`flush` (also
    done by :meth:`position` and :meth:`close`) puts every row written so far on disk (Parquet:
    at most every ``flush_seconds`` unless forced). A Parquet
    part is written under a temporary name and renamed into place, so no reader ever sees half
    a part. Frequent flushes write small parts that are merged as they come (each row is rewritten
    O(log) times at most) and into one part per ``part_rows`` rows.

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> log = EventLog(run_dir, format="parquet")
    >>> log.write({"time": 1.5, "event": "arrival", "client": 2, "dispatch": 7, "version": 0,
    ...            "staleness": 1, "steps": 5, "detail": None})
    >>> log.position()
    {'format': 'parquet', 'rows': 1}
    >>> log.close()
    >>> sorted(os.listdir(f"{run_dir}/events"))
    ['part-00000.parquet']
    """

    def __init__(self, run_dir: str, fields=EVENT_LOG_FIELDS, format: str = "auto", switch_rows: int = 200_000,
                 resume: dict | int | None = None, *, part_rows: int = 1 << 20, buffer_rows: int = 1 << 16,
                 flush_seconds: float = 5.0, ignore: tuple = (), expected_rows: int | None = None):
        if format not in FORMATS:
            raise ValueError(f"format={format!r} is not allowed: one of {', '.join(FORMATS)}")
        if not os.path.isdir(run_dir):
            raise FileNotFoundError(f"run directory {run_dir!r} does not exist")
        for name, value in (("switch_rows", switch_rows), ("part_rows", part_rows), ("buffer_rows", buffer_rows)):
            if not (isinstance(value, (int, np.integer)) and value >= 1):
                raise ValueError(f"{name}={value!r} is not allowed: an integer >= 1")
        if not flush_seconds >= 0:
            raise ValueError(f"flush_seconds={flush_seconds!r} is not allowed: seconds >= 0")
        if expected_rows is not None and not (isinstance(expected_rows, (int, np.integer)) and expected_rows >= 0):
            raise ValueError(f"expected_rows={expected_rows!r} is not allowed: an integer >= 0, or None")
        self.run_dir = run_dir
        self.fields = tuple(fields)
        self.ignore = frozenset(ignore) - set(self.fields)  # keys rows may carry that this log does not keep
        self.requested = format
        self.switch_rows = int(switch_rows)
        self.part_rows = int(part_rows)
        self.buffer_rows = int(buffer_rows)
        self.flush_seconds = float(flush_seconds)
        self._last_write = monotonic()
        self._csv_path = os.path.join(run_dir, CSV_NAME)
        self._folder = os.path.join(run_dir, PARQUET_DIR)
        # Rows wait as tuples in field order: one allocation per row, and the csv writer takes
        # them as they are (a Parquet spill transposes them into columns in one step).
        self._buffer: list[tuple] = []
        self._pick = operator.itemgetter(*self.fields) if len(self.fields) > 1 else None
        self._width = len(self.fields)
        # buffered tuples -> columns: one C-level map per field, a third of the cost of zip(*rows)
        self._columns_of = [operator.itemgetter(index) for index in range(self._width)]
        self._limit = self.buffer_rows
        self._rows = 0  # rows handed to the file (csv) or converted to arrow (parquet)
        self._handle = None
        self._writer = None
        self._closed = False
        # parquet: the current chunk of part_rows rows is kept in memory until complete, so small
        # parts from flushes can be merged without reading anything back
        self._chunk_start = 0
        self._tail: list = []  # arrow tables holding rows [chunk_start, tail_end)
        self._tail_end = 0
        self._written_end = 0  # rows [0, written_end) are in parts on disk
        self._stack: list[_Part] = []  # this chunk's parts on disk, in row order
        self._next_part = 0
        self._unsynced: set[str] = set()  # parts written since the last position(sync=True)
        if self.requested == "parquet":
            _require_pyarrow("EventLog(format='parquet')")
        large = expected_rows is not None and expected_rows > self.switch_rows and _pyarrow() is not None
        self._format = "parquet" if self.requested == "parquet" or (self.requested == "auto" and large) else "csv"
        if resume is None:
            self._start_fresh()
        else:
            self._resume(resume)

    # ----------------------------------------------------------------- writing
    def write(self, row: dict) -> None:
        """Append one row (a dict keyed by ``fields``; missing keys are empty, unknown keys an error).

        >>> import tempfile
        >>> with EventLog(tempfile.mkdtemp(), fields=("time", "event")) as log:
        ...     log.write({"time": 0.5, "event": "timer"})
        """
        if len(row) != self._width:
            row = self._complete(row)
        try:
            values = self._pick(row) if self._pick is not None else (row[self.fields[0]],)
        except KeyError:  # same size, other keys
            self._complete(row)
            raise
        self._buffer.append(values)
        if len(self._buffer) >= self._limit:
            self._spill()

    def row_writer(self, fields) -> Callable[[tuple], None]:
        """A function that appends one row given as a tuple of values in the order of ``fields``
        (which must include every field of this log): what :class:`~jaxfl.scheduler.simulation.Simulation`
        writes through, without building a dict per row. Same rows, same bytes as :meth:`write`.

        >>> import tempfile
        >>> run_dir = tempfile.mkdtemp()
        >>> with EventLog(run_dir, fields=("time", "event")) as log:
        ...     log.row_writer(("event", "time", "client"))(("timer", 0.5, -1))
        >>> open(f"{run_dir}/events.csv").read().splitlines()
        ['time,event', '0.5,timer']
        """
        fields = tuple(fields)
        missing = [field for field in self.fields if field not in fields]
        if missing:
            raise ValueError(f"row_writer fields {fields} lack this log's field(s) {', '.join(missing)}")
        buffer = self._buffer
        pick = None
        if fields != self.fields:
            positions = [fields.index(field) for field in self.fields]
            pick = operator.itemgetter(*positions) if len(positions) > 1 else \
                (lambda values, at=positions[0]: (values[at],))

        def write_values(values: tuple) -> None:
            buffer.append(values if pick is None else pick(values))
            if len(buffer) >= self._limit:
                self._spill()

        return write_values

    def flush(self, force: bool = False) -> None:
        """Put every row written so far on disk, where :func:`read_events` sees it.

        A Parquet log writes a file per flush, so unless ``force`` it writes at most once every
        ``flush_seconds`` (or when ``buffer_rows`` rows wait): a run that flushes after every
        evaluation would otherwise spend its time on tiny parts. :meth:`position` and
        :meth:`close` always write everything.

        >>> import tempfile
        >>> run_dir = tempfile.mkdtemp()
        >>> with EventLog(run_dir, fields=("time", "event")) as log:
        ...     log.write({"time": 0.5, "event": "timer"}); log.flush()
        ...     len(read_events(run_dir)["time"])
        1
        """
        self._check_open()
        if self._format == "parquet" and not force and len(self._buffer) < self.buffer_rows \
                and monotonic() - self._last_write < self.flush_seconds:
            return
        self._spill()
        if self._format == "csv":
            self._handle.flush()
        else:
            self._write_tail(merge_all=False)

    def position(self, sync: bool = False) -> dict:
        """Flush and return a JSON-able marker of the log's end, for ``EventLog(..., resume=marker)``;
        with ``sync``, a CSV log is also put on the disk itself (``os.fsync``), as a checkpoint that
        records the marker needs: a machine's crash then cannot leave the log shorter than it.

        ``{"format": "csv", "rows": n, "bytes": b}`` or ``{"format": "parquet", "rows": n}``.

        >>> import tempfile
        >>> with EventLog(tempfile.mkdtemp(), fields=("time",)) as log:
        ...     log.position()
        {'format': 'csv', 'rows': 0, 'bytes': 6}
        """
        self.flush(force=True)
        if self._format == "csv":
            if sync:
                os.fsync(self._handle.fileno())
            return {"format": "csv", "rows": self._rows, "bytes": self._handle.tell()}
        if sync:  # the parts written since, and the folder's names of them
            for path in sorted(self._unsynced):
                with contextlib.suppress(FileNotFoundError), open(path, "rb") as handle:  # merged away since
                    os.fsync(handle.fileno())
            folder = os.open(self._folder, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
            self._unsynced.clear()
        return {"format": "parquet", "rows": self._rows}

    @property
    def format(self) -> str:
        """The format being written now (``"auto"`` resolves to ``"csv"`` or ``"parquet"``).

        >>> import tempfile
        >>> with EventLog(tempfile.mkdtemp(), format="auto") as log:
        ...     log.format
        'csv'
        """
        return self._format

    @property
    def rows(self) -> int:
        """Rows written so far (buffered ones included).

        >>> import tempfile
        >>> with EventLog(tempfile.mkdtemp(), fields=("time",)) as log:
        ...     log.write({"time": 1.0}); log.rows
        1
        """
        return self._rows + len(self._buffer)

    def close(self) -> None:
        """Flush and close (again: nothing). A Parquet log merges its last chunk into one part.

        >>> import tempfile
        >>> log = EventLog(tempfile.mkdtemp()); log.close(); log.close()
        """
        if self._closed:
            return
        try:
            self._spill()
            if self._format == "parquet":
                self._write_tail(merge_all=True)
        finally:
            self._closed = True
            self._limit = 0  # any later write reaches _spill, which refuses it
            if self._handle is not None:
                self._handle.close()

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()  # also after an error: the rows up to it are what explains it

    def __repr__(self) -> str:
        return f"EventLog({self.run_dir!r}, format={self._format!r}, rows={self.rows})"

    # ----------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the event log of {self.run_dir!r} is closed")

    def _complete(self, row: dict) -> dict:
        """csv.DictWriter's rules: unknown keys are an error, missing ones are empty (None)."""
        unknown = [key for key in row if key not in self.fields and key not in self.ignore]
        if unknown:
            raise ValueError(f"dict contains fields not in fieldnames: {', '.join(map(repr, unknown))}")
        return {field: row.get(field) for field in self.fields}

    def _spill(self) -> None:
        self._check_open()
        count = len(self._buffer)
        if not count:
            return
        if self._format == "csv":
            # the same objects through the same csv writer as DictWriter.writerow: the same bytes
            self._writer.writerows(self._buffer)
            self._buffer.clear()  # in place: row writers hold this list
            self._rows += count
            if self.requested == "auto" and self._rows > self.switch_rows and _pyarrow() is not None:
                self._switch_to_parquet()
        else:
            table = _rows_to_arrow(self._buffer, self.fields)
            if table is None:  # values of other types than the schema's: coerced column by column
                table = _to_arrow(self._columns(self._buffer), self.fields)
            self._buffer.clear()
            self._rows += count
            self._add_to_tail(table)

    def _columns(self, rows: list[tuple]) -> list[list]:
        return [list(map(getter, rows)) for getter in self._columns_of]

    def _open_csv(self, truncate_to: int | None) -> None:
        if truncate_to is None:
            self._handle = open(self._csv_path, "w", newline="", encoding="utf-8")
            self._writer = csv.writer(self._handle)
            self._writer.writerow(self.fields)  # DictWriter.writeheader
        else:
            self._handle = open(self._csv_path, "r+", newline="", encoding="utf-8")
            self._handle.truncate(truncate_to)
            self._handle.seek(truncate_to)
            self._writer = csv.writer(self._handle)

    def _start_fresh(self) -> None:
        _remove_tree(os.path.join(self.run_dir, _CONVERTING))
        _remove_tree(self._folder)
        if self._format == "csv":
            self._open_csv(None)
        else:
            if os.path.exists(self._csv_path):
                os.remove(self._csv_path)
            os.makedirs(self._folder)

    # .................................................................... parquet parts
    def _write_part(self, folder: str, number: int, table, first_row: int) -> None:
        _, pq = _require_pyarrow("writing Parquet parts")
        table = table.replace_schema_metadata({_FIRST_ROW: str(first_row).encode(),
                                               _ROWS: str(table.num_rows).encode()})
        temporary = os.path.join(folder, f".{_part_name(number)}.tmp")
        pq.write_table(table, temporary, compression="zstd")
        os.replace(temporary, os.path.join(folder, _part_name(number)))
        self._unsynced.add(os.path.join(folder, _part_name(number)))

    def _add_to_tail(self, table) -> None:
        while table.num_rows:
            room = self._chunk_start + self.part_rows - self._tail_end
            head, table = table.slice(0, room), table.slice(room)
            self._tail.append(head)
            self._tail_end += head.num_rows
            if self._tail_end == self._chunk_start + self.part_rows:
                self._write_tail(merge_all=True)
                self._chunk_start, self._tail, self._stack = self._tail_end, [], []

    def _write_tail(self, merge_all: bool) -> None:
        """Write the chunk's rows not yet on disk as a part, merged with the chunk's earlier parts
        while those are no larger than it (all of them with ``merge_all``): a binary-counter rule,
        so k flushes leave O(log k) parts and rewrite each row O(log k) times."""
        end = self._tail_end
        start = self._written_end
        if end == start and not (merge_all and len(self._stack) > 1):
            return
        popped = []
        while self._stack and (merge_all or self._stack[-1].rows <= end - start):
            popped.append(self._stack.pop())
            start = popped[-1].first_row
        number = popped[-1].number if popped else self._next_part
        pa, _ = _pyarrow()
        data = pa.concat_tables(self._tail).slice(start - self._chunk_start, end - start)
        self._write_part(self._folder, number, data, start)
        self._last_write = monotonic()
        # only after the merged part is in place: a crash in between leaves redundant parts, not holes
        for part in popped:
            if part.number != number:
                os.remove(os.path.join(self._folder, _part_name(part.number)))
        self._stack.append(_Part(number, start, end - start))
        self._next_part = number + 1
        self._written_end = end
        if len(self._tail) > 1:
            self._tail = [pa.concat_tables(self._tail)]

    def _switch_to_parquet(self) -> None:
        """CSV → Parquet: parts built in a hidden folder, renamed to ``events/`` in one step, then
        ``events.csv`` deleted; a crash at any point leaves one complete log for readers. (Built
        instead from the rows' tuples kept in memory, it took as much CPU as pyarrow's
        multi-threaded CSV reader and more wall time, and held ~45 MB more at 200,000 rows.)"""
        self._handle.close()
        self._handle = self._writer = None
        table = _read_csv_arrow(self._csv_path, self.fields)
        if table.num_rows != self._rows:
            raise RuntimeError(f"{self._csv_path!r} reads back as {table.num_rows} rows but {self._rows} were written")
        staging = os.path.join(self.run_dir, _CONVERTING)
        _remove_tree(staging)
        os.makedirs(staging)
        self._format = "parquet"
        self._load_parts_from_table(staging, table)
        _remove_tree(self._folder)
        os.replace(staging, self._folder)
        self._unsynced = {os.path.join(self._folder, os.path.basename(path)) for path in self._unsynced}
        os.remove(self._csv_path)

    def _load_parts_from_table(self, folder: str, table) -> None:
        """Write ``table`` (the whole log) as parts in ``folder``; keep its unfinished chunk in memory."""
        total = table.num_rows
        self._rows = self._written_end = self._tail_end = total
        self._chunk_start = total - total % self.part_rows
        number = 0
        for first in range(0, total, self.part_rows):
            self._write_part(folder, number, table.slice(first, self.part_rows), first)
            number += 1
        self._next_part = number
        if self._chunk_start < total:
            self._tail = [table.slice(self._chunk_start)]
            self._stack = [_Part(number - 1, self._chunk_start, total - self._chunk_start)]
        else:
            self._tail, self._stack = [], []

    # .................................................................... resume
    def _resume(self, position: dict | int) -> None:
        if isinstance(position, (int, np.integer)):  # checkpoints from before this module: a byte length
            position = {"format": "csv", "rows": None, "bytes": int(position)}
        if not isinstance(position, dict) or "rows" not in position or position.get("format") not in ("csv", "parquet"):
            raise ValueError(f"resume={position!r} is not an EventLog.position() marker")
        _remove_tree(os.path.join(self.run_dir, _CONVERTING))
        on_disk = event_log_format(self.run_dir)
        if on_disk is None:
            raise FileNotFoundError(f"cannot resume the event log of {self.run_dir!r}: it has neither "
                                    f"{CSV_NAME} nor {PARQUET_DIR}/")
        if on_disk == "parquet":
            if position["rows"] is None:
                raise ValueError(f"the event log of {self.run_dir!r} is Parquet; a CSV byte offset cannot cut it")
            if self.requested == "csv":
                raise ValueError(f"format='csv' cannot continue the Parquet event log in {self._folder!r}")
            if os.path.exists(self._csv_path):  # the switch finished all but deleting the CSV
                os.remove(self._csv_path)
            self._format = "parquet"
            self._cut_parquet(int(position["rows"]))
            return
        if position["format"] == "parquet":
            raise FileNotFoundError(f"cannot resume the Parquet event log of {self.run_dir!r}: {self._folder!r} "
                                    "does not exist")
        size = os.path.getsize(self._csv_path)
        offset = int(position["bytes"])
        if offset > size:
            raise ValueError(f"{self._csv_path!r} holds {size} bytes, fewer than the checkpoint's {offset}")
        self._format = "csv"
        self._open_csv(offset)
        self._rows = position["rows"] if position["rows"] is not None else _count_csv_rows(self._csv_path)
        if self.requested == "parquet":
            _require_pyarrow("EventLog(format='parquet')")
            self._switch_to_parquet()

    def _cut_parquet(self, rows: int) -> None:
        _, pq = _require_pyarrow(f"resuming the Parquet event log in {self._folder!r}")
        for name in os.listdir(self._folder):
            if name.startswith(".") and name.endswith(".tmp"):
                os.remove(os.path.join(self._folder, name))
        damaged: list[str] = []
        parts, _ = _scan_parts(self._folder, damaged)  # the redundant parts go with the rest below
        total = parts[-1].end if parts else 0
        if total < rows:
            more = f" (unreadable: {', '.join(sorted(damaged))})" if damaged else ""
            raise ValueError(f"the event log in {self._folder!r} holds {total} rows in order from the first{more}, "
                             f"fewer than the checkpoint's {rows}")
        # the readable parts hold every row the checkpoint has: what else is there (a damaged part, one
        # after a gap) holds rows past them, which the resumed run writes again
        kept = {part.number for part in parts}
        for name in os.listdir(self._folder):
            match = _PART.match(name)
            if match is not None and int(match.group(1)) not in kept:
                os.remove(os.path.join(self._folder, name))
        for part in sorted(parts, key=lambda p: -p.first_row):  # from the end: what remains is always a prefix
            if part.first_row >= rows:
                os.remove(os.path.join(self._folder, _part_name(part.number)))
            elif part.end > rows:
                path = os.path.join(self._folder, _part_name(part.number))
                self._write_part(self._folder, part.number, pq.read_table(path).slice(0, rows - part.first_row),
                                 part.first_row)
        parts = [p for p in parts if p.first_row < rows]
        for part in parts:
            part.rows = min(part.end, rows) - part.first_row
        self._rows = self._written_end = self._tail_end = rows
        self._next_part = max((p.number for p in parts), default=-1) + 1
        # the unfinished chunk: the trailing parts that together hold fewer than part_rows rows
        # (whatever part_rows the log was written with), back in memory to be merged further
        self._stack = []
        for part in reversed(parts):
            if sum(p.rows for p in self._stack) + part.rows >= self.part_rows:
                break
            self._stack.insert(0, part)
        self._chunk_start = self._stack[0].first_row if self._stack else rows
        self._tail = [pq.read_table(os.path.join(self._folder, _part_name(p.number))).replace_schema_metadata()
                      for p in self._stack]


# --------------------------------------------------------------------------- conversions
def _to_arrow(columns: list[list], fields):
    """Buffered Python values → an arrow table of the fixed schema (values of other types coerced)."""
    pa, _ = _pyarrow()
    arrays = []
    for values, field in zip(columns, fields):
        kind = _arrow_type(pa, field)
        try:
            arrays.append(pa.array(values, kind))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            arrays.append(pa.array(_coerce(values, field), kind))
    return pa.Table.from_arrays(arrays, schema=arrow_schema(fields))


def _rows_to_arrow(rows: list[tuple], fields):
    """Buffered row tuples → the same arrow table as :func:`_to_arrow` of their columns, converted by
    pyarrow as one struct array and split into its fields: half the cost, as no Python list per
    column is built (0.24 against 0.51 µs a row of FedCompass's rows). None if a value is not of
    its field's type (a NumPy integer, a number in a string field): :func:`_to_arrow` coerces those."""
    pa, _ = _pyarrow()
    schema = arrow_schema(fields)
    try:
        rows_array = pa.array(rows, type=pa.struct(list(schema)))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        return None
    return pa.Table.from_arrays(rows_array.flatten(), schema=schema)


def _coerce(values: list, field: str) -> list:
    if field in FLOAT_FIELDS:
        return [None if v is None or v == "" else float(v) for v in values]
    if field in INT_FIELDS:
        return [None if v is None or v == "" else int(v) for v in values]
    return [None if v is None else str(v) for v in values]


def _read_csv_arrow(path: str, fields, end: int | None = None, run_dir: str | None = None):
    """``events.csv`` → an arrow table of the Parquet schema (empty cells → null); ``end``: read
    only its first ``end`` bytes (:func:`_complete_length`). A file that does not parse is a
    ``ValueError`` naming it (:func:`_damaged`; ``run_dir`` decides the advice)."""
    pa, _ = _pyarrow()
    import pyarrow.csv as pacsv

    schema = arrow_schema(fields)
    if os.path.getsize(path) == 0 or end == 0:
        return schema.empty_table()
    if end is not None:
        with open(path, "rb") as handle:
            source = pa.BufferReader(handle.read(end))
    else:
        source = path
    try:
        table = pacsv.read_csv(
            source,
            parse_options=pacsv.ParseOptions(newlines_in_values=True),  # a quoted detail may hold a newline
            convert_options=pacsv.ConvertOptions(column_types={f.name: f.type for f in schema}, null_values=[""],
                                                 strings_can_be_null=True, include_columns=list(fields)))
    except (pa.ArrowInvalid, pa.ArrowKeyError) as error:  # a row of the wrong width, a cell that is no number
        raise _damaged(path, run_dir, str(error).strip()) from None
    return table.select(list(fields)).cast(schema)


def read_json(path: str, advice: str | None = None) -> dict:
    """A run's ``config.json`` or ``summary.json``, or a sweep's ``sweep.json`` (written whole,
    atomically); one that is not a JSON object is a ``ValueError`` naming it, with ``advice`` (by
    default: a summary.json is written anew by resuming the run, another file restored from a copy).

    >>> import tempfile
    >>> path = tempfile.mktemp(suffix=".json")
    >>> _ = open(path, "w").write('{"virtual_ti')
    >>> read_json(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ....json is damaged: it is not a JSON object (Unterminated string ...); restore it from a copy, or run the experiment again
    """
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        problem = f"it is not a JSON object ({error})"
    else:
        if isinstance(value, dict):
            return value
        problem = f"it holds a {type(value).__name__}, not a JSON object"
    if advice is None and os.path.basename(path) == "summary.json":  # finished_summary: the run counts as unfinished
        advice = (f"resume the run (jaxfl run --resume {shlex.quote(os.path.dirname(path) or '.')}), which writes it "
                  "anew from its newest checkpoint, or restore it from a copy")
    raise ValueError(f"{path} is damaged: {problem}; {advice or 'restore it from a copy, or run the experiment again'}")


def finished_summary(run_dir: str | None) -> dict | None:
    """The ``summary.json`` of a run that has finished, or None: the run has none (it has not finished)
    or one that does not read as a JSON object. A run writes it last, atomically, so a damaged one
    was cut or changed afterwards; the run counts as not finished, so that resuming it (``jaxfl run
    --resume``, a sweep run again) writes it anew from the newest checkpoint, as for a missing one.

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> finished_summary(run_dir) is None
    True
    >>> _ = open(os.path.join(run_dir, "summary.json"), "w").write('{"global_updates": 3, "stop_re')
    >>> finished_summary(run_dir) is None
    True
    >>> _ = open(os.path.join(run_dir, "summary.json"), "w").write('{}')  # valid JSON, no run's summary
    >>> finished_summary(run_dir) is None
    True
    """
    path = os.path.join(run_dir, "summary.json") if run_dir is not None else None
    if path is None or not os.path.isfile(path):
        return None
    try:
        summary = read_json(path)
    except (OSError, ValueError):
        return None
    # every run's summary says why it stopped: "{}" or another file's JSON is no summary of a run
    return summary if isinstance(summary, dict) and "stop_reason" in summary else None


def _finished(run_dir: str | None) -> bool:
    return finished_summary(run_dir) is not None


def _damaged(path: str, run_dir: str | None, problem: str) -> ValueError:
    """The one-line error for a run's log file that does not read back: the file, what is wrong, and
    what to do (a finished run's files were changed after it; an unfinished one's resume cuts its
    logs back to its last checkpoint)."""
    sweep_dir = os.path.dirname(os.path.dirname(os.path.abspath(run_dir))) if run_dir is not None else None
    finished = _finished(run_dir)  # (summary.json read once)
    if finished and sweep_dir is not None and os.path.isfile(os.path.join(sweep_dir, "sweep.json")):
        # a sweep skips a finished cell, and a finished run is not resumed: no command of theirs mends it
        advice = ("the run finished (summary.json), so the file was cut or changed after it ended: restore it "
                  f"from a copy, or remove the cell's folder ({run_dir}) and run the same jaxfl sweep command "
                  "again, which runs that cell anew")
    elif finished:
        advice = ("the run finished (summary.json), so the file was cut or changed after it ended: restore it "
                  "from a copy, or run the experiment again")
    else:
        advice = (f"if the run was interrupted while writing it, resume it (jaxfl run --resume "
                  f"{run_dir or os.path.dirname(path) or '.'}), which cuts its logs back to its last checkpoint")
    return ValueError(f"{path} is damaged: {problem}; {advice}")


def _complete_length(path: str, run_dir: str | None) -> int | None:
    """How many bytes of the CSV log ``path`` to read: None for all of it (it ends with a line end,
    as every row its writer writes does), else up to its last line end. A last line cut short is
    what a run still writing, or killed mid-write, leaves: it is left out, and the rows before it
    are read, so a killed run can be inspected (its resume cuts the file back to its checkpoint
    anyway). In a finished run (``summary.json`` in ``run_dir``) the same is damage: a
    ``ValueError`` (:func:`_damaged`)."""
    size = os.path.getsize(path)
    summary = finished_summary(run_dir)
    with open(path, "rb") as handle:
        handle.seek(max(size - 1, 0))
        if size and handle.read(1) != b"\n":
            if summary is not None:
                raise _damaged(path, run_dir, "its last line is cut short (no line end)")
            position, block = size, 1 << 16
            while position > 0:  # the last line end, read back from the end in blocks
                start = max(position - block, 0)
                handle.seek(start)
                found = handle.read(position - start).rfind(b"\n")
                if found >= 0:
                    return start + found + 1
                position = start
            return 0
    recorded = (summary or {}).get("log_bytes")
    ended_with = recorded.get(os.path.basename(path)) if isinstance(recorded, dict) else None
    if isinstance(ended_with, int) and not isinstance(ended_with, bool) and size != ended_with:  # cut at a line end, or added to: no cut-short line shows it
        raise _damaged(path, run_dir, f"it holds {size:,} bytes, and the run ended with {ended_with:,} "
                                      f"(summary.json's log_bytes)")
    return None


def log_sizes(run_dir: str) -> dict[str, int]:
    """The bytes of each CSV log a run has written (metrics, class accuracy, a CSV event log), for its
    ``summary.json`` (``log_bytes``): a finished run's file cut at a line end afterwards reads as
    whole rows, and only its size tells (:func:`_complete_length`).

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> _ = open(f"{run_dir}/metrics.csv", "w").write("time,version\\n0.0,0\\n")
    >>> log_sizes(run_dir)
    {'metrics.csv': 19}
    """
    sizes = {}
    for name in (METRICS_NAME, CLASS_ACCURACY_NAME, CSV_NAME):
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            sizes[name] = os.path.getsize(path)
    return sizes


def _count_csv_rows(path: str) -> int:
    with open(path, newline="", encoding="utf-8") as handle:
        return max(sum(1 for _ in csv.reader(handle)) - 1, 0)


def _remove_tree(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)


def _columns_from_arrow(table) -> dict[str, np.ndarray]:
    pa, _ = _pyarrow()
    columns = {}
    for name in table.column_names:
        chunked = table.column(name)
        if pa.types.is_dictionary(chunked.type):
            # a few distinct strings: index one object array of them (None last, for nulls), never
            # build 10^7 str objects
            chunks = chunked.unify_dictionaries().chunks
            words = np.array((chunks[0].dictionary.to_pylist() if chunks else []) + [None], dtype=object)
            codes = [chunk.indices.fill_null(len(words) - 1).to_numpy() for chunk in chunks]
            columns[name] = words[np.concatenate(codes)] if codes else np.empty(0, dtype=object)
        elif pa.types.is_integer(chunked.type):
            columns[name] = chunked.fill_null(MISSING).to_numpy().astype(np.int64, copy=False)
        elif pa.types.is_floating(chunked.type):
            columns[name] = chunked.fill_null(np.nan).to_numpy()
        else:
            columns[name] = np.asarray(chunked.to_pylist(), dtype=object)
    return columns


def _csv_rows(path: str, run_dir: str | None) -> tuple[list[str] | None, list[list[str]]]:
    """A run's CSV file as ``(header, rows)`` (None: no complete header yet), its cut-short last line
    left out as :func:`_complete_length` says; a row of another width than the header is a
    ``ValueError`` naming the file and the line (:func:`_damaged`)."""
    import io

    end = _complete_length(path, run_dir)
    with open(path, "rb") as handle:
        data = handle.read() if end is None else handle.read(end)
    try:
        reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
        header = next(reader, None)
        rows = list(reader)
    except (UnicodeDecodeError, csv.Error) as error:
        raise _damaged(path, run_dir, f"it is not readable CSV text ({error})") from None
    if header is not None:
        for number, row in enumerate(rows, start=2):
            if len(row) != len(header):
                raise _damaged(path, run_dir, f"row {number} has {len(row)} values, the header {len(header)} "
                                              f"columns")
    return header, rows


def _numbers(values, path: str, run_dir: str | None, name: str, kind=float, missing=np.nan) -> list:
    """``values`` of column ``name`` parsed as ``kind`` (empty: ``missing``); one that does not parse
    is a ``ValueError`` naming the file, the column and the value."""
    try:
        return [kind(value) if value != "" else missing for value in values]
    except ValueError:
        bad = next(value for value in values if value != "" and not _parses(kind, value))
        raise _damaged(path, run_dir, f"column {name} holds {bad!r}, not a number") from None


def _parses(kind, value: str) -> bool:
    try:
        kind(value)
    except ValueError:
        return False
    return True


def _read_csv_python(path: str, run_dir: str | None = None) -> dict[str, np.ndarray]:
    """The standard-library reader (no pyarrow): same columns, slower."""
    header, rows = _csv_rows(path, run_dir)
    if header is None:
        return {field: _empty_column(field) for field in EVENT_LOG_FIELDS}
    raw = list(zip(*rows)) if rows else [()] * len(header)
    columns = {}
    for name, values in zip(header, raw):
        if name in FLOAT_FIELDS:
            columns[name] = np.array(_numbers(values, path, run_dir, name), dtype=np.float64)
        elif name in INT_FIELDS:
            columns[name] = np.array(_numbers(values, path, run_dir, name, int, MISSING), dtype=np.int64)
        else:
            columns[name] = np.array([v or None for v in values], dtype=object)
    return columns


def _empty_column(field: str) -> np.ndarray:
    if field in FLOAT_FIELDS:
        return np.empty(0, np.float64)
    return np.empty(0, np.int64) if field in INT_FIELDS else np.empty(0, object)


# --------------------------------------------------------------------------- readers
def read_events(run_dir: str) -> dict[str, np.ndarray]:
    """A run's event log as columns, from ``events/`` (Parquet) or ``events.csv``.

    ``time`` float64; ``client``, ``dispatch``, ``version``, ``staleness``, ``steps`` int64 with
    ``-1`` for a missing value; ``event``, ``detail`` object arrays with ``None`` for missing.
    A cut-short last row of a run that has not finished is left out; damage is a ``ValueError``
    naming the file (see "Damaged files" in the module docstring).

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> with EventLog(run_dir, format="parquet") as log:
    ...     log.write({"time": 2.0, "event": "aggregate", "client": -1, "dispatch": None,
    ...                "version": 1, "staleness": None, "steps": None, "detail": "1 updates"})
    >>> columns = read_events(run_dir)
    >>> columns["event"], columns["dispatch"], columns["detail"]
    (array(['aggregate'], dtype=object), array([-1]), array(['1 updates'], dtype=object))
    """
    run_dir = os.path.expanduser(os.fspath(run_dir))
    kind = event_log_format(run_dir)
    if kind is None:
        if not os.path.isdir(run_dir):
            raise FileNotFoundError(f"{run_dir!r} is not a run directory: it does not exist")
        raise FileNotFoundError(f"{run_dir!r} is not a run directory: it has neither {CSV_NAME} nor {PARQUET_DIR}/")
    if kind == "parquet":
        folder = os.path.join(run_dir, PARQUET_DIR)
        pa, pq = _require_pyarrow(f"reading the Parquet event log in {folder!r}")
        try:
            parts, _ = _scan_parts(folder)
        except ValueError as error:  # a part that does not read, or parts that do not fit together
            raise _damaged(folder, run_dir, str(error)) from None
        if not parts:
            return {field: _empty_column(field) for field in EVENT_LOG_FIELDS}
        # one dataset read decodes the parts in parallel (3-4x faster than one read_table per part)
        try:
            table = pq.ParquetDataset([os.path.join(folder, _part_name(p.number)) for p in parts]).read()
        except (OSError, ValueError) as error:
            raise _damaged(folder, run_dir, f"a part cannot be read as Parquet ({error})") from None
        return _columns_from_arrow(table)
    path = os.path.join(run_dir, CSV_NAME)
    if _pyarrow() is None:
        return _read_csv_python(path, run_dir)
    end = _complete_length(path, run_dir)
    with open(path, "rb") as handle:
        first = handle.readline() if end is None else handle.read(end).split(b"\n", 1)[0] + b"\n"
    try:
        header = next(csv.reader([first.decode("utf-8")]), None) if first.strip() else None
    except UnicodeDecodeError:
        raise _damaged(path, run_dir, "its header is not text") from None
    if header is None:
        return {field: _empty_column(field) for field in EVENT_LOG_FIELDS}
    return _columns_from_arrow(_read_csv_arrow(path, header, end, run_dir))


# metrics.csv's columns (a run's own metrics follow them: RunConfig(metrics=...))
METRIC_FIELDS = ("time", "version", "accuracy", "balanced_accuracy", "loss", "client_steps", "wall_time")


def read_metrics(run_dir: str) -> dict[str, np.ndarray]:
    """A run's ``metrics.csv`` as columns (``version`` and ``client_steps`` int64, the rest float64).
    A cut-short last row of a run that has not finished is left out; damage is a ``ValueError``
    naming the file (see "Damaged files" in the module docstring).

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> _ = open(f"{run_dir}/metrics.csv", "w").write("time,version,accuracy\\n0.0,0,0.1\\n")
    >>> read_metrics(run_dir)["version"]
    array([0])
    """
    run_dir = os.path.expanduser(os.fspath(run_dir))
    path = os.path.join(run_dir, METRICS_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{run_dir!r} is not a run directory: it has no {METRICS_NAME}")
    header, rows = _csv_rows(path, run_dir)
    columns = {}
    for index, name in enumerate(header or METRIC_FIELDS):  # no header yet (a run just started): no rows
        values = np.array(_numbers([row[index] for row in rows], path, run_dir, name), dtype=np.float64)
        columns[name] = values.astype(np.int64) if name in ("version", "client_steps") else values
    return columns


def last_tenth_mean(accuracies) -> float | None:
    """The mean of the last tenth of a run's evaluations (at least the last one; None if there are
    none): its accuracy at the end of the budget, less the swing of one evaluation. 401 evaluations
    (version 0 and 400 rounds) average the last 40.

    >>> last_tenth_mean([0.5] * 18 + [0.7, 0.9])  # 20 evaluations: the last 2
    0.8
    >>> last_tenth_mean([0.3, 0.6]), last_tenth_mean([])
    (0.6, None)
    """
    values = [float(value) for value in accuracies]
    if not values:
        return None
    tail = values[-max(1, len(values) // 10):]
    return round(sum(tail) / len(tail), 6)


def run_last_tenth_accuracy(run_dir: str) -> float | None:
    """:func:`last_tenth_mean` of a run folder's ``metrics.csv`` accuracies (None: no metrics.csv, or no
    accuracy): for runs whose summary predates ``last_tenth_accuracy``.

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> _ = open(f"{run_dir}/metrics.csv", "w").write("time,version,accuracy\\n0.0,0,0.1\\n1.0,1,0.4\\n")
    >>> run_last_tenth_accuracy(run_dir), run_last_tenth_accuracy(tempfile.mkdtemp())
    (0.4, None)
    """
    if not os.path.isfile(os.path.join(run_dir, METRICS_NAME)):
        return None
    accuracy = read_metrics(run_dir).get("accuracy")
    return None if accuracy is None else last_tenth_mean(accuracy)


def read_class_accuracy(run_dir: str) -> dict[str, np.ndarray] | None:
    """A run's ``class_accuracy.csv``: ``time`` and ``version`` of each evaluation (the rows of
    ``metrics.csv``), and ``accuracy``, an (evaluations, classes) float64 array of each class's
    held-out recall (NaN for a class without held-out samples). None for a run that has no such
    file (timing-only runs, runs of older jaxfl versions).

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> _ = open(f"{run_dir}/class_accuracy.csv", "w").write("time,version,class_0,class_1\\n0.0,0,0.5,\\n")
    >>> read_class_accuracy(run_dir)["accuracy"]
    array([[0.5, nan]])
    """
    path = os.path.join(run_dir, CLASS_ACCURACY_NAME)
    if not os.path.isfile(path):
        return None
    header, rows = _csv_rows(path, run_dir)
    header = header or ["time", "version"]
    rows = [_numbers(row, path, run_dir, "of a class") for row in rows]
    table = np.array(rows, dtype=np.float64).reshape(len(rows), len(header))
    return {"time": table[:, 0], "version": table[:, 1].astype(np.int64), "accuracy": table[:, 2:]}


CLIENT_SAMPLES_FILE = "client_samples.npy"


def write_client_samples(run_dir: str, counts) -> dict:
    """Write every client's training-sample count as ``client_samples.npy`` in ``run_dir``;
    returns what ``config.json`` records of them instead of the list: the file's name, the number
    of clients, the total and a SHA-256 of the counts (a million-client list was 3.5 MB of JSON).

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> record = write_client_samples(folder, [20, 5, 11])
    >>> record["clients"], record["total"], read_client_samples(folder, {"client_samples": record}).tolist()
    (3, 36, [20, 5, 11])
    """
    counts = np.ascontiguousarray(counts, dtype="<i8")
    with written_atomically(os.path.join(run_dir, CLIENT_SAMPLES_FILE)) as temporary, open(temporary, "wb") as handle:
        # in the narrowest type that holds them (1 MB at 10^6 clients of < 256)
        np.save(handle, counts.astype(np.min_scalar_type(int(counts.max(initial=0))), copy=False)
                if counts.min(initial=0) >= 0 else counts)
    return {"file": CLIENT_SAMPLES_FILE, "clients": len(counts), "total": int(counts.sum()),
            "sha256": _counts_sha256(counts)}


def _counts_sha256(counts: np.ndarray) -> str:
    """The SHA-256 of sample counts as little-endian int64, as ``config.json`` records it."""
    return hashlib.sha256(np.ascontiguousarray(counts, "<i8").tobytes()).hexdigest()


def read_client_samples(run_dir: str, config: dict | None = None) -> np.ndarray | None:
    """Every client's training-sample count of a run directory (int64), from ``client_samples.npy``
    as :func:`write_client_samples` recorded it, or from the list ``config.json`` held before that
    (older runs); None if the run records none. ``config`` is the run's ``config.json`` if already
    read. A file that does not match its record is a ``ValueError``.

    >>> import tempfile
    >>> read_client_samples(tempfile.mkdtemp(), {"client_samples": [3, 4]}).tolist()
    [3, 4]
    """
    if config is None:
        config = read_json(os.path.join(run_dir, "config.json"))
    record = config.get("client_samples")
    if record is None or isinstance(record, list):
        return None if record is None else np.asarray(record, dtype=np.int64)
    path = os.path.join(run_dir, record["file"])
    try:
        counts = np.load(path, allow_pickle=False).astype(np.int64)
    except FileNotFoundError:
        raise ValueError(f"{path} is missing: config.json records the clients' sample counts there; restore it "
                         "from a copy (a resume does not write it again)") from None
    except (ValueError, EOFError) as error:  # numpy's "pickled data", "cannot reshape", a cut header
        raise _damaged(path, run_dir, f"it is not the array of sample counts config.json records ({error})") from None
    if len(counts) != record["clients"] or _counts_sha256(counts) != record["sha256"]:
        raise ValueError(f"{path} does not match config.json's client_samples record (clients {record['clients']}, "
                         f"sha256 {record['sha256'][:12]}...): it was changed after the run wrote it")
    return counts


@dataclasses.dataclass
class Run:
    """A finished (or running) run directory, loaded: see :func:`load_run`.

    ``summary`` is empty while the run has not finished. ``metrics`` and ``events`` are columns
    (see :func:`read_metrics`, :func:`read_events`). ``class_accuracy`` is the per-class held-out
    accuracy (recall), an (evaluations, classes) array whose rows are ``metrics``' rows (None where
    the run wrote none: timing-only runs and runs of older versions); of a run still writing, the
    evaluations both files hold (an evaluation's metrics row is written before its class row).

    >>> run = Run("r", {}, {}, {"time": np.zeros(2)}, {"time": np.zeros(3)})
    >>> run.num_events
    3
    """

    run_dir: str
    config: dict
    summary: dict
    metrics: dict[str, np.ndarray]
    events: dict[str, np.ndarray]
    class_accuracy: np.ndarray | None = None

    @property
    def num_events(self) -> int:
        return len(next(iter(self.events.values()), ()))

    @property
    def run_config(self):
        """The run's :class:`~jaxfl.RunConfig`, validated, to run it again or vary it from Python (what
        ``jaxfl run --config RUN_DIR/config.json`` does on the command line); its ``output_dir`` is
        the run's, so a rerun lands beside it in a new folder. A run that names files by relative paths
        (``data_dir``, ``file.py:Class``) is read from the folder it was started in (config.json
        records it); elsewhere that is a ValueError, since the same path may name another file here.
        A run that took your own objects (a model or optimiser given to ``run_experiment``, recorded as
        ``<user: ...>``) needs them given again with the config.

        >>> import dataclasses, jaxfl, tempfile
        >>> run = load_run(jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedbuff", model="logreg", clients=4,
        ...     local_steps=2, max_updates=1, progress=False, output_dir=tempfile.mkdtemp())).run_dir)
        >>> again = dataclasses.replace(run.run_config, seed=1)   # the same run, another seed
        >>> again.algorithm, again.clients, again.seed
        ('fedbuff', 4, 1)
        """
        from jaxfl.config import ConfigError, config_from_mapping, recorded_values, without_settings_refused_since
        from jaxfl.resume import _relative_paths, _started_elsewhere

        record = self.config.get("config")
        if not isinstance(record, dict):
            raise ValueError(f"run {self.run_dir!r}: its config.json holds no run config (no 'config' mapping)")
        elsewhere = _started_elsewhere(self.config)
        relative = _relative_paths(record)
        if elsewhere and relative:
            raise ValueError(f"run {self.run_dir!r} was started in {elsewhere!r} and its config names "
                             f"{', '.join(relative)} relative to that folder: read its run_config from there")
        # a setting the run held unread, refused since: it changed nothing (as a resume leaves it out)
        values, _ = without_settings_refused_since(recorded_values(record))
        try:
            return config_from_mapping(values)
        except ConfigError as error:  # which run; where a setting is refused, what to do
            text = str(error).strip()
            older = ("; an earlier jaxfl may have taken this setting: its values are in .config['config'], to start "
                     "a new run with it changed") if " is not allowed" in text and not text.startswith("algorithm=") \
                else ""  # (an algorithm that is not importable or registered here is no refused setting)
            raise ConfigError(f"run {self.run_dir!r}: its recorded config is refused by this jaxfl: {text}{older}") \
                from None

    @property
    def client_samples(self) -> np.ndarray | None:
        """Every client's training-sample count (:func:`read_client_samples`), read when asked for."""
        return read_client_samples(self.run_dir, self.config)

    def to_pandas(self, table: str = "events"):
        """``table`` (``"events"``, ``"metrics"`` or ``"class_accuracy"``: ``time``, ``version`` and a
        column ``class_K`` per class) as a pandas DataFrame; missing integers of the event log become
        ``<NA>`` (nullable ``Int64``). pandas is imported only here.

        >>> run = Run("r", {}, {}, {"time": np.zeros(2)}, {"time": np.zeros(3)})
        >>> try:
        ...     frame = run.to_pandas("metrics")
        ... except ImportError as error:
        ...     assert "pip install pandas" in str(error)
        """
        if table not in ("events", "metrics", "class_accuracy"):
            raise ValueError(f"table={table!r} is not allowed: 'events', 'metrics' or 'class_accuracy'")
        if table == "class_accuracy" and self.class_accuracy is None:
            raise ValueError(f"run {self.run_dir!r} has no per-class accuracy ({CLASS_ACCURACY_NAME}): a timing-only "
                             "run or one written by an older jaxfl")
        try:
            import pandas
        except ImportError as error:
            raise ImportError("Run.to_pandas() needs pandas, which is not installed: pip install pandas") from error
        if table == "metrics":
            return pandas.DataFrame(self.metrics)
        if table == "class_accuracy":  # its rows are metrics.csv's (a live run's may be one behind)
            rows = len(self.class_accuracy)
            return pandas.DataFrame({"time": self.metrics["time"][:rows], "version": self.metrics["version"][:rows],
                                     **{f"class_{k}": column for k, column in enumerate(self.class_accuracy.T)}})
        columns: dict[str, Any] = {}
        for name, values in self.events.items():
            if name in INT_FIELDS and name != "client":  # client -1 is the server, a real value
                columns[name] = pandas.arrays.IntegerArray(values.astype(np.int64), values == MISSING)
            else:
                columns[name] = values
        return pandas.DataFrame(columns)


def load_run(run_dir: str) -> Run:
    """Load ``config.json``, ``summary.json`` (if the run finished), ``metrics.csv``,
    ``class_accuracy.csv`` (``Run.class_accuracy``) and the event log. A run killed mid-write loads
    without its cut-short last rows; a damaged file is a ``ValueError`` naming it (see "Damaged
    files" in the module docstring).

    >>> import jaxfl, tempfile
    >>> result = jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedavg", model="logreg", clients=4,
    ...     local_steps=2, max_updates=1, progress=False, output_dir=tempfile.mkdtemp()))
    >>> run = load_run(result.run_dir)
    >>> run.summary["global_updates"], int(np.sum(run.events["event"] == "aggregate"))
    (1, 1)
    """
    run_dir = os.path.expanduser(os.fspath(run_dir))
    if os.path.isfile(run_dir):
        raise NotADirectoryError(f"{run_dir!r} is a file, not a run directory: give the folder that holds it "
                                 f"({os.path.dirname(run_dir) or '.'!r})")
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"{run_dir!r} is not a run directory: it does not exist")
    config_path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{run_dir!r} is not a run directory: it has no config.json{runs_inside(run_dir)}")
    config = read_json(config_path)
    summary_path = os.path.join(run_dir, "summary.json")
    summary = {}
    if os.path.isfile(summary_path):
        summary = read_json(summary_path)
    metrics, events = read_metrics(run_dir), read_events(run_dir)
    classes = read_class_accuracy(run_dir)
    classes = None if classes is None else classes["accuracy"]
    if not summary and classes is not None:  # a run still writing: an evaluation's two rows, one written yet
        rows = min(len(classes), len(next(iter(metrics.values()), ())))
        metrics, classes = {name: column[:rows] for name, column in metrics.items()}, classes[:rows]
    return Run(run_dir, config, summary, metrics, events, classes)


# --------------------------------------------------------------------------- derived views
class _Kinds:
    """What several views of one log share, computed once: each event kind's row mask (``==`` on
    10^7 strings takes ~0.2 s) and the dispatch intervals for a horizon."""

    def __init__(self, events: dict[str, np.ndarray]):
        self.event, self.masks, self.spans = events["event"], {}, {}
        self.faults: tuple[np.ndarray, np.ndarray] | None = None  # _fault_seconds' answer

    def __call__(self, kind: str) -> np.ndarray:
        if kind not in self.masks:
            self.masks[kind] = self.event == kind
        return self.masks[kind]


def dispatch_intervals(events: dict[str, np.ndarray], horizon: float | None = None, labels: bool = True,
                       _kinds: _Kinds | None = None) -> dict[str, np.ndarray]:
    """Every dispatch, in log order, as columns: ``client``, ``start``, ``end``, ``arrived`` and
    ``crashed`` (bool: how it ended; neither: still in flight, ending at ``horizon``, by default
    the log's last time) and, with ``labels``, ``label`` (its detail without a fault's seconds, None
    if none) and ``offline`` (those seconds: offline for a dropout, late for a delay; 0 without).

    ``[start, end]`` is the time the dispatch was in flight — sent and not yet back, offline time
    included, what a "clients in flight" count shows; the client trained (or transferred) over
    ``[start + offline, end]`` only, what the utilisation counts (:func:`timeline_stats`).

    >>> spans = dispatch_intervals({"time": np.array([0.0, 0.0, 2.0, 9.0]), "client": np.array([4, 5, 4, 5]),
    ...                             "event": np.array(["dispatch", "dispatch", "arrival", "arrival"], object),
    ...                             "dispatch": np.array([0, 1, 0, 1]),
    ...                             "detail": np.array([None, "dropout 6.5 s", None, None], object)})
    >>> spans["end"], spans["arrived"], spans["offline"], spans["label"]
    (array([2., 9.]), array([ True,  True]), array([0. , 6.5]), array([None, 'dropout'], dtype=object))
    """
    kinds = _kinds or _Kinds(events)
    time, dispatch = events["time"], events["dispatch"]
    if horizon is None:
        horizon = float(time.max()) if len(time) else 0.0
    is_dispatch = kinds("dispatch") & (dispatch >= 0)
    spans = kinds.spans.get(float(horizon))
    if spans is None:
        ids = dispatch[is_dispatch]
        size = int(ids.max()) + 1 if len(ids) else 0
        end = np.full(size, float(horizon))
        how = np.zeros(size, np.int8)
        for code, kind in ((2, "crash"), (1, "arrival")):
            rows = kinds(kind) & (dispatch >= 0) & (dispatch < size)
            end[dispatch[rows]] = time[rows]
            how[dispatch[rows]] = code
        how = how[ids]
        spans = kinds.spans[float(horizon)] = {"client": events["client"][is_dispatch], "start": time[is_dispatch],
                                               "end": end[ids], "arrived": how == 1, "crashed": how == 2}
    if labels:
        label, offline = _fault_seconds(events, is_dispatch, kinds)
        return {**spans, "label": label, "offline": offline}
    return dict(spans)


def _fault_seconds(events: dict[str, np.ndarray], is_dispatch: np.ndarray,
                   kinds: _Kinds) -> tuple[np.ndarray, np.ndarray]:
    """``(label, offline)`` of the dispatches (``is_dispatch`` rows): each one's detail without a
    fault's seconds, and those seconds (:func:`~jaxfl.scheduler.faults.split_fault_seconds`; 0 in
    logs from before they were written). Computed once per log: the distinct details are parsed
    (a few, or one per faulty dispatch), and only a log with faults is walked row by row."""
    if kinds.faults is None:
        detail = events.get("detail")
        count = int(np.count_nonzero(is_dispatch))
        offline = np.zeros(count)
        if detail is None:
            kinds.faults = np.full(count, None), offline
            return kinds.faults
        label = detail[is_dispatch]
        texts = label.tolist()
        parts = {}
        for text in set(texts):
            if type(text) is str and text.endswith(" s"):
                stripped, seconds = split_fault_seconds(text)
                if stripped != text:
                    parts[text] = (stripped, seconds)
        if parts:
            label = label.copy()
            for row, text in enumerate(texts):
                found = parts.get(text)
                if found is not None:
                    label[row], offline[row] = found
        kinds.faults = label, offline
    return kinds.faults


def _client_order(client: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Indices sorting dispatches by client, then start. A log is in time order, so sorting one
    integer key (client, position in the log) does it: 2x faster than a stable sort by client and
    4x faster than a two-key lexsort of 10^7 rows."""
    count = len(client)
    if count and np.all(start[1:] >= start[:-1]) and client.min() >= 0 and (int(client.max()) + 1) * count < 2**62:
        return np.argsort(client * count + np.arange(count))
    return np.lexsort((start, client))


def _union_per_client(client: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(clients, busy seconds of each)`` from intervals sorted by client then start: the union of
    each client's intervals, so overlapping dispatches of one client are not counted twice."""
    if not len(client):
        return np.zeros(0, np.int64), np.zeros(0)
    first = np.flatnonzero(np.concatenate([[True], client[1:] != client[:-1]]))
    group = np.cumsum(np.concatenate([[False], client[1:] != client[:-1]]))
    # one running maximum of ends for all clients at once: each client's intervals are lifted
    # past every earlier client's, so no client's reach spills into the next one's
    lift = group * (float(end.max() - start.min()) + 1.0)
    reach = np.maximum.accumulate(end + lift) - lift
    previous = np.concatenate([[-np.inf], reach[:-1]])
    previous[first] = -np.inf
    busy = np.clip(end - np.maximum(start, previous), 0.0, None)
    return client[first], np.add.reduceat(busy, first)


def _staleness_histogram(staleness: np.ndarray, max_bins: int = 64) -> dict[str, int]:
    """Counts per staleness value; with more than ``max_bins`` distinct values, per power-of-two
    range (``"4-7"``), so a 10^6-client run keeps a small summary."""
    if not len(staleness):
        return {}
    counts = np.bincount(staleness)  # staleness <= global updates: a short array
    values = np.flatnonzero(counts)
    if len(values) <= max_bins:
        return {str(int(v)): int(counts[v]) for v in values}
    level = np.zeros(len(counts), np.int64)  # 0 for staleness 0, k for [2^(k-1), 2^k - 1]
    level[1:] = np.floor(np.log2(np.arange(1, len(counts)))).astype(np.int64) + 1
    histogram = {}
    for lvl, count in enumerate(np.bincount(level, weights=counts).astype(np.int64)):
        if count:
            low, high = (0, 0) if lvl == 0 else (2 ** (lvl - 1), 2 ** lvl - 1)
            histogram[str(low) if low == high else f"{low}-{high}"] = int(count)
    return histogram


def timeline_stats(events: dict[str, np.ndarray], num_clients: int | None = None,
                   horizon: float | None = None, _kinds: _Kinds | None = None) -> dict:
    """Summary numbers of a run's schedule, from its event-log columns (JSON-able).

    - ``arrival_staleness_histogram``: every arrival, counted by its staleness at arrival (the
      global version then less the version it trained from; string keys; power-of-two ranges
      such as ``"8-15"`` once there are more than 64 distinct values), with
      ``arrival_staleness_mean`` and ``arrival_staleness_max``. Not the run summary's
      ``timeline.staleness_histogram``, which counts the *aggregated* updates by their staleness
      *at aggregation* (:meth:`jaxfl.scheduler.simulation.Simulation.timeline`): an update that
      waits in a buffer (FedBuff, FedAT's tiers) grows staler before it is aggregated, and one
      that is dropped or still buffered at the end counts here only, so the two differ;
    - ``utilisation_mean``: the clients' mean fraction of ``[0, horizon]`` spent training (a
      dispatch counts from its start to its arrival or crash, or to the horizon if in flight,
      less a delay's or dropout's seconds, counted as its first: :func:`dispatch_intervals`'s
      ``offline``), as the run's summary counts it (``timeline.utilisation``);
    - ``idle_s_per_client_mean`` and ``idle_client_s_total``: client-seconds not training;
    - ``idle_gap_mean_s``: mean wait between a client's arrival and its next dispatch;
    - ``aggregations`` and ``aggregations_per_hour`` (virtual hours).

    ``num_clients`` (default: the clients the log dispatched) counts never-dispatched clients as
    idle throughout; ``horizon`` defaults to the log's last time (the run's summary counts up to its
    ``virtual_time``, later where a time budget stopped it: give that for the summary's figures). An earlier ``horizon`` is a
    window: every figure counts only what happened by then (aggregations, arrivals, dispatches),
    a dispatch not back by then as in flight.

    >>> events = {"time": np.array([0.0, 0.0, 1.0, 1.0, 2.0]),
    ...           "event": np.array(["dispatch", "dispatch", "arrival", "aggregate", "arrival"], object),
    ...           "client": np.array([0, 1, 0, -1, 1]), "dispatch": np.array([0, 1, 0, -1, 1]),
    ...           "staleness": np.array([-1, -1, 0, -1, 1]), "detail": np.full(5, None, object)}
    >>> stats = timeline_stats(events)
    >>> stats["arrival_staleness_histogram"], stats["utilisation_mean"], stats["idle_client_s_total"]
    ({'0': 1, '1': 1}, 0.75, 1.0)
    >>> stats["aggregations_per_hour"]
    1800.0
    >>> window = timeline_stats(events, horizon=1.5)  # the one aggregation by 1.5 s, the one arrival
    >>> window["aggregations"], window["aggregations_per_hour"], window["arrivals"]
    (1, 2400.0, 1)
    """
    time = events["time"]
    kinds = _kinds or _Kinds(events)
    last = float(time.max()) if len(time) else 0.0
    if horizon is None:
        horizon = last
    # A horizon before the log's end (`jaxfl timeline --max-time`) is a window: the log as it stood
    # then. Counting the later aggregations too over the shorter time inflated the rate.
    window = time <= horizon if horizon < last else None
    arrivals = kinds("arrival") if window is None else kinds("arrival") & window
    staleness = events["staleness"][arrivals]
    staleness = staleness[staleness >= 0]
    spans = dispatch_intervals(events, horizon, labels=False, _kinds=kinds)
    _, offline = _fault_seconds(events, kinds("dispatch") & (events["dispatch"] >= 0), kinds)
    every_client, every_start, every_end, every_arrived = (spans[key] for key in ("client", "start", "end", "arrived"))
    if window is not None:  # dispatches made by the horizon; back by then only if they arrived by then
        inside = every_start <= horizon
        every_arrived = every_arrived & (every_end <= horizon)
        every_client, every_start, every_end, every_arrived, offline = (
            column[inside] for column in (every_client, every_start, every_end, every_arrived, offline))
    order = _client_order(every_client, every_start)
    client, start = every_client[order], every_start[order]
    end, arrived = np.minimum(every_end[order], horizon), every_arrived[order]
    if offline.any():  # training starts after a fault's seconds: the union over those later starts
        trains_from = every_start + offline
        by_start = np.lexsort((trains_from, every_client))
        clients, busy = _union_per_client(every_client[by_start], trains_from[by_start],
                                           np.minimum(every_end[by_start], horizon))
    else:
        clients, busy = _union_per_client(client, start, end)
    count = max(int(num_clients) if num_clients is not None else 0, len(clients))
    total_busy = float(busy.sum())
    idle_total = max(count * horizon - total_busy, 0.0)  # a fully busy run's float noise is not idle time
    # waits between one dispatch's arrival and the same client's next dispatch
    follows = (client[1:] == client[:-1]) & arrived[:-1]
    gaps = np.clip(start[1:][follows] - end[:-1][follows], 0.0, None)
    aggregations = int(np.count_nonzero(kinds("aggregate") if window is None else kinds("aggregate") & window))
    return {
        "horizon_s": float(horizon),
        "clients": count,
        "dispatches": int(len(start)),
        "arrivals": int(np.sum(arrivals)),
        "arrival_staleness_histogram": _staleness_histogram(staleness),
        "arrival_staleness_mean": float(staleness.mean()) if len(staleness) else None,
        "arrival_staleness_max": int(staleness.max()) if len(staleness) else None,
        "utilisation_mean": total_busy / (count * horizon) if count and horizon > 0 else None,
        "idle_s_per_client_mean": idle_total / count if count else None,
        "idle_client_s_total": float(idle_total),
        "idle_gap_mean_s": float(gaps.mean()) if len(gaps) else None,
        "aggregations": aggregations,
        "aggregations_per_hour": aggregations * 3600.0 / horizon if horizon > 0 else None,
    }


__all__ = ["EVENT_LOG_FIELDS", "FORMATS", "MISSING", "EventLog", "Run", "arrow_schema", "dispatch_intervals",
           "event_log_format", "existing_fields", "load_run", "read_class_accuracy", "read_events", "read_json", "read_metrics",
           "timeline_stats"]
