"""Command line: ``jaxfl run``.

Every :class:`~jaxfl.config.RunConfig` field is a flag (``local_steps`` → ``--local-steps``), and
every registered algorithm's option is one in its namespace (``--port.staleness-bound``; jaxfl 0.1's
``--port-staleness-bound`` still works); ``--config FILE`` (JSON or TOML with the same names,
options under ``[port]`` or ``[algorithm]``) sets a base that flags override. A comma-separated
``--algorithm`` runs each algorithm with the same seed (same speeds and partition) and prints a
comparison table; ``--algorithm my_module:MyAlgorithm`` runs an algorithm defined outside jaxfl.

Examples::

    jaxfl run --algorithm fedbuff --dataset fashion_mnist --clients 10 --heterogeneity exp
    jaxfl run --algorithm fedavg,fedavgm,fedasync,fedbuff
    jaxfl run --config experiment.toml --seed 3
    jaxfl timeline runs/RUN_DIR     # who trained when, and the aggregations
    jaxfl sweep --algorithm fedavg,fedbuff --clients 5,10 --seed 0,1,2 --out sweeps/x   # a grid of runs
    jaxfl report sweeps/x           # its tables (time to target relative to FedAvg...) and figures
    jaxfl partition --dataset fashion_mnist --partition class --clients 10 --out plots  # the split
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import math
import re
import os
import shlex
import sys
import typing

from jaxfl._user_warnings import warn_user
from jaxfl import algorithms
from jaxfl.config import (DEFAULT_SERVER_LR, FIELDS, PLUGIN_IMPORT_FAILURES, SECTION_OF, SECTIONS, SERVER_FIELDS_READ_BY, ConfigError,
                          RunConfig, _server_readers_text, check_output_folder, algorithms_reading, annotation_text, config_from_mapping,
                          fields_not_read_by, flat_once, import_named_plugins, load_config_file, option_namespaces,
                          split_algorithm_options, unknown_name, user_path, variant_unread,
                          without_settings_refused_since)
from jaxfl.checkpoint import DiskWriteError
from jaxfl.cluster import PeerLost
from jaxfl.engine import NumericalError, ResourceError

_HELP = {
    "algorithm": "a registered algorithm ({names}) or module:Class; a comma-separated list runs each and compares",
    "dataset": "mnist10k (embedded), fashion_mnist (Debian), mnist / npz / array_record (--data-dir), digits "
               "(scikit-learn), tfds:NAME (e.g. tfds:cifar10; --data-dir), synthetic, synthetic_iid, synthetic:A,B",
    "clients": "number of clients m",
    "partition": "iid, dirichlet_client (--client-sizes), dirichlet (--dirichlet-alpha), class, dual_dirichlet "
                 "(FedCompass), label_shards (--shards-per-client), gamma_mix (--gamma, CC-FedAvg), natural",
    "heterogeneity": "client speed model: homo, normal, exp, pareto, zipf or uniform (--speed-ratio)",
    "speed_mean": "time per local step μ in virtual seconds: the mean for homo, normal, exp and uniform; for pareto "
                  "and zipf the time of an idle time of 0, which their idle times add to",
    "local_steps": "local steps Q per dispatch",
    "client_lr": "client learning rate",
    "max_time": "budget in virtual seconds (inf for none)",
    "stop_at_target": "stop a run once it reaches the target accuracy",
    "batching": "defer dispatches and train the in-flight work together (--no-batching: one at a time)",
    "output_dir": "folder that receives one run directory per run",
}
# a checkpoint or a log that could not be written (a full disk): sysexits' EX_IOERR, not 2 (bad input) or 1 (a numerical error)
CHECKPOINT_WRITE_STATUS = 74
_ALIASES = {"client_lr": ["--lr"], "output_dir": ["--out"], "local_steps": ["--steps"]}


def _your_code_frame(error: BaseException):
    """The deepest frame of ``error``'s own traceback that lies in the user's code: a file outside
    jaxfl, the standard library and the installed packages (a ``file.py:Class`` plug-in, a
    ``module:object`` model), or None. An error raised there is a bug to find, not bad input.

    >>> try:
    ...     config_from_mapping({"clients": 0})
    ... except ValueError as error:  # raised by jaxfl about its input
    ...     print(_your_code_frame(error))
    None
    """
    import traceback

    from jaxfl.experiment import is_user_file

    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if is_user_file(frame.filename)]
    return frames[-1] if frames else None


def _exit_on_error(parser: argparse.ArgumentParser, error: BaseException, status: int = 2) -> typing.NoReturn:
    """End the command on ``error``: one line and ``status`` (2: bad input) when jaxfl raised it about
    what it was given (naming the line of the user's code that its cause came from, if any: a model
    that does not fit the data); the traceback, a line naming the file and line, and status 1 when it
    came from the user's own code (:func:`_your_code_frame`), which a one-line "bad input" would hide."""
    frame = _your_code_frame(error)
    # e.g. the sweep cell it ended; not jax's note that it filtered its frames from the traceback
    notes = "".join(f"; {note}" for note in getattr(error, "__notes__", ()) if "JAX_TRACEBACK_FILTERING" not in note)
    # jaxfl's ConfigError from the user's code is a refusal of bad input (a plug-in's validate, with fail())
    if frame is None or isinstance(error, ConfigError):
        cause = error.__cause__
        if frame is None:
            frame = None if cause is None else _your_code_frame(cause)  # e.g. a model that does not fit the data
        where = "" if frame is None else f" (in your code: {frame.filename}, line {frame.lineno}, in {frame.name})"
        parser.exit(status, f"jaxfl: error: {error}{where}{notes}\n")
    import traceback

    traceback.print_exception(error)
    parser.exit(1, f"jaxfl: error in your code ({frame.filename}, line {frame.lineno}, in {frame.name}; "
                   f"traceback above): {type(error).__name__}: {error}{notes}\n")


def _raise_unless_yours(error: BaseException) -> None:
    """Re-raise ``error`` unless it came from the user's code (:func:`_your_code_frame`): jaxfl's own
    failures keep Python's traceback; the user's get :func:`_exit_on_error`'s line naming their file."""
    if _your_code_frame(error) is None:
        raise error


# What ``jaxfl run --help`` prints above and below the flags (plain text: argparse shows it verbatim).
_RUN_DESCRIPTION = """\
Run one experiment, or several algorithms side by side with the same seed (a comma-separated
--algorithm, which ends with a comparison table), and write one run directory per run under
--output-dir.

Every config field is a flag, grouped below by the config's sections. A JSON or TOML file given with
--config sets a base that flags override (the same names; sections as tables such as [client]). An
algorithm's own options are flags in its namespace (--port.staleness-bound 5); the groups at the end
list them, one group per algorithm. A setting that the chosen algorithm, dataset, partition or speed
model never reads is refused with its name, not silently ignored (the settings of a part of an
algorithm switched off, such as FedASMU's with --no-fedasmu.fetch, come with a note instead)."""
_RUN_EXAMPLES = """\
examples:
  jaxfl run --algorithm fedbuff --dataset fashion_mnist --clients 10 --heterogeneity exp
  jaxfl run --algorithm fedavg,fedavgm,fedasync,fedbuff
  jaxfl run --config experiment.toml --seed 3 --max-updates 50
  jaxfl run --preset port-mnist                       (PORT's MNIST experiment; --algorithm fedbuff: a baseline)
  jaxfl run --algorithm port --port.staleness-bound 5 --port.preset plato
  jaxfl run --resume runs/RUN_DIR
  jaxfl algorithms                                    (every algorithm and its options)
  jaxfl timeline runs/RUN_DIR                         (who trained when, and the aggregations)
  jaxfl partition --dataset fashion_mnist --partition class --clients 10"""


def _parse_value(annotation: str, text: str):
    if text.lower() in ("none", "null") and "None" in annotation:
        return None
    if annotation.startswith("bool"):  # an algorithm option swept from the command line: --port.urgent-pull true,false
        flag = {"true": True, "false": False}.get(text.lower())
        if flag is None:
            raise ValueError(text)
        return flag
    if annotation.startswith("int"):
        return int(text)
    if annotation.startswith("tuple[float"):  # one number per channel: 0.49,0.48,0.45
        return tuple(float(part) for part in text.split(","))
    if annotation.startswith("float"):
        return math.inf if text.lower() in ("inf", "infinity") else float(text)
    return text


def _value_parser(name: str, annotation: str | None = None):
    annotation = annotation or FIELDS[name].type

    def parse(text: str):
        try:
            return _parse_value(annotation, text)
        except ValueError:
            kind = "true or false" if annotation.startswith("bool") else \
                "an integer" if annotation.startswith("int") else \
                "a comma-separated list of numbers" if annotation.startswith("tuple") else "a number"
            raise argparse.ArgumentTypeError(f"--{name.replace('_', '-')}={text!r} is not {kind}") from None

    return parse


def _add_flag(group, flags: list[str], dest: str, annotation: str, help_text: str, parse=None,
              hidden: list[str] = ()) -> None:
    """One flag: ``--x/--no-x`` for a bool field, else a value parsed by the field's annotation.
    ``hidden`` spellings (jaxfl 0.1's) are accepted but not listed in ``--help``."""
    annotation = annotation_text(annotation)
    for names, text in ((flags, help_text), (hidden, argparse.SUPPRESS)):
        if not names:
            continue
        if annotation.startswith("bool"):
            group.add_argument(*names, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            group.add_argument(*names, dest=dest, type=_typed_none(parse or _value_parser(dest, annotation)),
                               default=None, metavar=_metavar(dest, annotation), help=text)


class _ExplicitNone:
    """What a flag typed as ``none`` parses to until :func:`_take_explicit_nones` (argparse's
    default None means "not given", and ``--max-updates none`` must replace a preset's 80)."""

    def __repr__(self) -> str:
        return "None"


_EXPLICIT_NONE = _ExplicitNone()


def _typed_none(parse):
    def parse_flag(text: str):
        value = parse(text)
        return _EXPLICIT_NONE if value is None else value

    return parse_flag


def _take_explicit_nones(args: argparse.Namespace) -> None:
    """Back to None, the flags typed as ``none``, named in ``args.explicit_none``: a setting given."""
    typed = {name for name, value in vars(args).items() if value is _EXPLICIT_NONE}
    args.explicit_none = set(getattr(args, "explicit_none", ())) | typed
    for name in typed:
        setattr(args, name, None)


def _given(args: argparse.Namespace, name: str, value) -> bool:
    """Whether the flag ``name`` was given (``none`` included)."""
    return value is not None or name in getattr(args, "explicit_none", ())


def _metavar(dest: str, annotation: str) -> str:
    """A short placeholder by type: N (integer), X (number), PATH (a folder or file), NAME."""
    if annotation.startswith("int"):
        return "N"
    if annotation.startswith("float"):
        return "X"
    if annotation.startswith("tuple[float"):
        return "X[,X...]"
    return "PATH" if dest.endswith("_dir") else "NAME"


def _with_default(text: str, default, unset: str = "unset") -> str:
    """A help line ending in its default; a text that already says what "unset" means keeps it."""
    if default is None:
        return text if "unset" in text else f"{text} (default: {unset})"
    return f"{text} (default: {default})"


def _summary_of(cls) -> str:
    """An algorithm's one line: its ``summary``, else its docstring's first line (a plug-in's)."""
    doc = (cls.__dict__.get("__doc__") or "").strip()
    return cls.summary or (doc.splitlines()[0].strip().rstrip(".") if doc else "")


def _option_flags(run: argparse.ArgumentParser) -> None:
    """One flag per option of every registered algorithm, in the options' namespace (dest ``space.field``)."""
    for space, owners in option_namespaces().items():
        summary = _summary_of(algorithms.get(owners[0]))
        group = run.add_argument_group(f"{space} options ({', '.join(owners)})",
                                       f"{summary[0].upper()}{summary[1:]}." if summary else None)
        added = set()
        for owner in owners:  # every owner's options: a plug-in that extends a built-in's namespace adds its own
            cls = algorithms.get(owner).Options
            aliases = {field: alias for alias, field in cls.aliases.items()}
            preset_fields = next(iter(cls.presets.values()), {})
            for field in dataclasses.fields(cls):
                if field.name in added:
                    continue
                added.add(field.name)
                spellings = [field.name.replace("_", "-")] + ([aliases[field.name]] if field.name in aliases else [])
                unset = "the preset's" if field.name in preset_fields else "unset"
                # jaxfl 0.1's flat spellings, where no run flag has them (a namespace "server" with an
                # option "momentum" would be --server-momentum: argparse refused the whole parser)
                hidden = [flag for flag in (f"--{space}-{name}" for name in spellings)
                          if flag not in group._option_string_actions]
                _add_flag(group, [f"--{space}.{name}" for name in spellings], f"{space}.{field.name}", field.type,
                          _with_default(field_help(cls, field.name), field.default, unset), hidden=hidden)


@functools.lru_cache(maxsize=None)
def _field_comments(cls) -> dict[str, str]:
    """The ``# comment`` after each field of a dataclass's source (empty if none); read once per class
    (inspect parses the whole module each time: 0.03 s a call, for every flag of two subcommands)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # defined interactively
        return {}
    found = re.findall(r"^\s+(\w+):[^#\n]*#\s*(.+)$", source, flags=re.MULTILINE)
    return {name: text.strip() for name, text in found}


def field_help(cls, name: str) -> str:
    """The one-line help of a dataclass field (a config field or an algorithm option):
    ``dataclasses.field(metadata={"help": ...})`` if given, else the ``# comment`` after the field
    in its class's source; empty if neither (``tests/test_cli_help.py`` fails on such a field).

    >>> from jaxfl.config import ClientConfig
    >>> field_help(ClientConfig, "local_steps")
    'Q local steps per dispatch'
    """
    for base in cls.__mro__:  # a field inherited from a base dataclass is described there
        if name in getattr(base, "__dataclass_fields__", {}):
            text = base.__dataclass_fields__[name].metadata.get("help") or _field_comments(base).get(name, "")
            if text:
                return text.replace("%", "%%")  # argparse formats help with %
    return ""


def _log_to(text: str) -> list[str]:
    from jaxfl.loggers import parse_log_to

    try:
        return parse_log_to(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class _Version(argparse.Action):
    """``jaxfl --version``: jaxfl's version and, run from a git checkout, its commit (what a run's
    ``config.json`` records), then the libraries' versions; looked up only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from jaxfl.experiment import jaxfl_source, library_versions
        from jaxfl.runlog import code_of

        versions = library_versions()
        code = code_of(versions, jaxfl_source())
        others = ", ".join(f"{name} {version}" for name, version in versions.items() if name != "jaxfl")
        print(f"jaxfl {code} ({others})")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxfl", description="JAX-native federated-learning simulator")
    parser.add_argument("--version", action=_Version,
                        help="print jaxfl's version (and git commit, from a checkout) and its libraries', and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one experiment (or several algorithms side by side)",
                              usage="jaxfl run [--config FILE] [--preset NAME] [--algorithm NAME[,NAME...]] [FLAG VALUE ...]",
                              description=_RUN_DESCRIPTION, epilog=_RUN_EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = {"algorithm": run.add_argument_group(
        "algorithm", "Which algorithm runs; its own options are in its group at the end.")}
    for section, cls in SECTIONS.items():
        summary = cls.__doc__.splitlines()[0]
        groups[section] = run.add_argument_group(f"{section}: {summary[0].lower()}{summary[1:].rstrip('.')}")
    groups[None] = run.add_argument_group("run and output: config file, seed, run directory, checkpoints, resume")
    groups[None].add_argument("--config", metavar="FILE", type=user_path,
                              help="JSON or TOML file of config fields and algorithm options (flags override it)")
    groups[None].add_argument("--preset", metavar="NAME",
                              help="a shipped experiment (jaxfl/presets): a seed paper's setting, "
                                   "<paper>-<dataset> (port-mnist, fedcompass-cifar10, ...), or quickstart; "
                                   "--config and flags override it, and --algorithm runs the paper's baselines "
                                   "in its setting")
    from jaxfl.resume import BUDGETS, MAY_DIFFER  # the fields a resume may set afresh: its help names their flags

    free = [f"--{flag}/--no-{flag}" if FIELDS[name].type.startswith("bool") else f"--{flag}"
            for name in MAY_DIFFER for flag in [name.replace("_", "-")]]
    free = f"{', '.join(free[:-1])} and {free[-1]}" if len(free) > 1 else free[0]
    budgets = ", ".join(f"--{name.replace('_', '-')}" for name in BUDGETS)
    groups[None].add_argument("--resume", metavar="RUN_DIR", type=user_path,
                              help="continue the run in RUN_DIR from its newest readable checkpoint; the run "
                                   "keeps its config: other flags (and --config) must equal the run's values, "
                                   f"except {free}; its budgets ({budgets}) may be raised, and --no-stop-at-target "
                                   "given: a finished run is then taken on from where it stopped")
    groups[None].add_argument("--log-to", metavar="NAMES", type=_log_to,
                              help="also hand every metrics row to these loggers, comma-separated: tensorboard "
                                   "(RUN_DIR/tensorboard/), csv (RUN_DIR/log.csv), wandb (jaxfl.loggers)")
    cluster = run.add_argument_group("cluster (a run over several processes or hosts: jaxfl.cluster)")
    cluster.add_argument("--cluster", action="store_true",
                         help="join a run of several processes described by the environment (SLURM's srun, "
                              "Open MPI, JAX_COORDINATOR_ADDRESS...)")
    cluster.add_argument("--coordinator-address", metavar="HOST:PORT",
                         help="address of process 0's coordinator service, the same for every process")
    cluster.add_argument("--num-processes", type=int, metavar="N", help="processes in the run")
    cluster.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0 to N-1")
    for name, field in FIELDS.items():
        if name == "algorithm_options":  # one flag per option instead (_option_flags)
            continue
        flags = [f"--{name.replace('_', '-')}"] + _ALIASES.get(name, [])
        owner = SECTIONS.get(SECTION_OF.get(name), RunConfig)
        described = _HELP.get(name, field_help(owner, name)).replace("{names}", ", ".join(algorithms.names()))
        group = groups[SECTION_OF.get(name, "algorithm" if name == "algorithm" else None)]
        _add_flag(group, flags, name, field.type, _with_default(described, field.default),
                  parse=str if name == "algorithm" else None)
    groups["speeds"].add_argument(
        "--time-per-step", metavar="FILE", default=None,
        help="each client's seconds per local step from a .npy, .csv or .txt file (one number per client: measured "
             "devices, another simulator's profile; or a trace table with a time_per_step or seconds_per_step "
             "column, ordered by its client_id column if any) instead of drawing them from --heterogeneity; --jitter still "
             "applies (0 replays the times exactly); a trace's latency_s or latency_ms and bandwidth_bytes_per_s, "
             "bandwidth_kbps or bandwidth_mbps columns give each client its own transfer time in place of --latency "
             "and --bandwidth; saved in the run directory as client_time_per_step.npy")
    _option_flags(run)
    commands.add_parser("demo", usage="jaxfl demo [jaxfl run flags]", help="the quickstart: sync, async and semi-async algorithms on MNIST, non-IID, "
                                     "heterogeneous speeds (about 15 s on a 2-core CPU)",
                        description=_DEMO_DESCRIPTION + "\n\n" + _demo_command(_demo_flags([])),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    listing = commands.add_parser("algorithms", help="the registered algorithms: name, kind, options")
    listing.add_argument("--algorithm", action="append", default=[], metavar="MODULE:CLASS",
                         help="also list an algorithm defined outside jaxfl")
    timeline = commands.add_parser("timeline", help="Gantt chart of a finished run: busy/idle clients, aggregations")
    timeline.add_argument("run_dir", type=user_path, help="a run directory written by `jaxfl run`")
    timeline.add_argument("--out", type=user_path, help="PNG to write (default: RUN_DIR/timeline.png); a missing folder is made")
    timeline.add_argument("--max-time", type=float, help="show virtual time up to this many seconds")
    _sweep_parser(commands)
    split = commands.add_parser("partition", help="how a dataset splits over clients: table and class heatmap")
    for name in _PARTITION_FLAGS:
        owner = SECTIONS.get(SECTION_OF.get(name), RunConfig)
        text = _with_default(_HELP.get(name, field_help(owner, name)), FIELDS[name].default)
        if FIELDS[name].type in (bool, "bool"):
            split.add_argument(f"--{name.replace('_', '-')}", dest=name, action=argparse.BooleanOptionalAction,
                               default=None, help=text)
            continue
        split.add_argument(f"--{name.replace('_', '-')}", dest=name, type=_value_parser(name), default=None,
                           metavar=_metavar(name, FIELDS[name].type), help=text)
    split.add_argument("--out", metavar="PATH", type=user_path, help="the heatmap's file (ending in .png, or .pdf, .svg, "
                                                                       "...), or a folder for its PNG (default: the run "
                                                                       "output folder, runs); a missing folder is made")
    split.add_argument("--max-rows", type=_max_rows, default=40, metavar="N",
                       help="client rows printed, >= 1 (default: 40)")
    parser.commands = commands.choices  # each command's own parser: its usage for an unknown flag
    # a flag by its whole name only, as a config file's field: argparse took --local-step for
    # --local-steps, and a prefix that a later flag makes ambiguous would break a script
    for holder in (parser, *commands.choices.values()):
        holder.allow_abbrev = False
    parser.flags_read = []  # (setting, flag, value) of every flag as read: _note_repeated_flags
    for holder in (parser, *commands.choices.values()):
        for action in holder._actions:
            if action.option_strings and not isinstance(action, (argparse._AppendAction, argparse._HelpAction)):
                action.__class__ = _noting(type(action))
                action.flags_read = parser.flags_read
    return parser


class _Noted:
    """Mixed into each flag's action by :func:`build_parser`: what it read, for :func:`_note_repeated_flags`."""

    flags_read: list

    def __call__(self, parser, namespace, values, option_string=None):
        self.flags_read.append((self.dest, option_string, values))
        super().__call__(parser, namespace, values, option_string)


_NOTED_ACTIONS: dict[type, type] = {}


def _noting(action: type) -> type:
    if action not in _NOTED_ACTIONS:
        _NOTED_ACTIONS[action] = type(f"Noted{action.__name__}", (_Noted, action), {})
    return _NOTED_ACTIONS[action]


def _note_repeated_flags(flags_read: list) -> None:
    """A setting given more than once with other values (``--clients 10 ... --clients 20``, a wrapper
    script's flags and the user's own): argparse takes the last one silently; here with a note.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as said:
    ...     warnings.simplefilter("always")
    ...     _note_repeated_flags([("clients", "--clients", "10"), ("clients", "--clients", "20")])
    >>> print(said[0].message)
    --clients 10, then --clients 20: a setting given more than once takes its last value (--clients 20)
    """

    given: dict[str, list[tuple[str, object]]] = {}
    for setting, flag, value in flags_read:
        if value is None or isinstance(value, bool) or value == []:  # --progress, --no-progress
            given.setdefault(setting, []).append((flag, not flag.startswith("--no-")))
        else:  # (the same value through two spellings of one setting, --compass.lambda 1.2 and its alias, is one)
            given.setdefault(setting, []).append((f"{flag} {value}", repr(value)))
    for read in given.values():
        if len({value for _, value in read}) > 1:
            spelled = [shown for shown, _ in read]
            warn_user(f"{', then '.join(spelled)}: a setting given more than once takes its last value "
                      f"({spelled[-1]})")


_CLUSTER_FLAGS = ("--cluster", "--coordinator-address", "--num-processes", "--process-id")


def _refuse_unrecognized(parser: argparse.ArgumentParser, command: str | None, extra: list[str]) -> None:
    """An unknown flag, with the command's usage rather than the top level's, and the nearest flag
    the command has (``--max-updatez``: did you mean ``--max-updates``?)."""
    import difflib

    own = parser.commands.get(command, parser)
    flags = [flag for action in own._actions for flag in action.option_strings]
    given = [token.partition("=")[0] for token in extra if token.startswith("-")]
    cluster = [flag for flag in given if flag in _CLUSTER_FLAGS]
    if command == "sweep" and cluster:  # not a misspelling: a flag of another command
        own.error(f"{', '.join(cluster)}: jaxfl sweep runs its cells in one process (side by side with --jobs N); "
                  "the cluster flags are jaxfl run's, for one run over several processes")
    hints = [f"{near[0]} for {flag}" for flag in given
             for near in [difflib.get_close_matches(flag, flags, n=1, cutoff=0.75)] if near]
    own.error(f"unrecognized arguments: {' '.join(extra)}" + (f" (did you mean {', '.join(hints)}?)" if hints else ""))


def _max_rows(text: str) -> int:
    """``jaxfl partition --max-rows``: an integer >= 1 (0 or less printed no client at all)."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: an integer >= 1 (client rows printed)")
    return value


_SWEEP_DESCRIPTION = """\
Run a grid of experiments: every combination of the values given, one run each, into --out (run
directories under OUT/runs/, the tidy table OUT/results.csv and .parquet, rewritten as each cell finishes,
the definition OUT/sweep.json).
Settings come from a TOML sweep file, in place of jaxfl run's --config (config fields as in a --config
file, a [grid] table of lists, and [sizes.NAME] tables of overrides chosen by --size), and from flags:
every jaxfl run flag of a config field or algorithm option takes a comma-separated list here, whose
values become an axis of the grid (one value: a base setting; flags override the file). An on/off
field flag (--batching/--no-batching) takes no list: sweep it in the file's [grid]. In --dataset, a
synthetic:A,B value keeps its comma (--dataset synthetic:0.5,0.5,synthetic:1,1 is two values). Not
here: --config (the sweep file), --preset, --resume (the same command again continues), --log-to,
--output-dir and --run-name (--out is the sweep folder) and the cluster flags. --time-per-step FILE
gives every cell the same measured speeds (continuing the sweep needs the same speeds). Every cell
is checked before the first run. Running the same command again skips finished cells, continues an
interrupted one from its last checkpoint, and restarts one that had none."""
_SWEEP_EXAMPLES = """\
examples:
  jaxfl sweep --algorithm fedavg,fedbuff --clients 5,10 --seed 0,1,2 --out sweeps/x
  jaxfl sweep study.toml --size quick --out sweeps/quick
  jaxfl sweep study.toml --heterogeneity exp --jobs 2 --out sweeps/exp   # two cells at once, a core each
  jaxfl report sweeps/x --reference fedavg"""


def _sweep_parser(commands) -> None:
    """``jaxfl sweep`` and ``jaxfl report``: config flags as raw text, split into grid axes later."""
    from jaxfl.sweep import SWEEP_OWNED

    sweep = commands.add_parser("sweep", help="a grid of runs (algorithms × settings × seeds), resumable, "
                                              "into one results table", usage="jaxfl sweep [SWEEP_FILE] --out DIR "
                                              "[--size NAME] [--FIELD V[,V...] ...]",
                                description=_SWEEP_DESCRIPTION, epilog=_SWEEP_EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_argument("sweep_file", nargs="?", metavar="SWEEP_FILE", type=user_path,
                       help="TOML (or JSON) file: config fields, a [grid] table of lists, [sizes.NAME] overrides")
    sweep.add_argument("--out", dest="sweep_dir", required=True, metavar="DIR", type=user_path,
                       help="the sweep folder (runs/, results.csv, results.parquet, sweep.json)")
    sweep.add_argument("--size", metavar="NAME", help="apply the sweep file's [sizes.NAME] table (quick, full...)")
    sweep.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                       help="one progress bar for the grid (default: on)")
    sweep.add_argument("--jobs", type=int, default=1, metavar="N",
                       help="cells run at once, each in its own process on an equal share of the cores "
                            "(default: 1); on a GPU the cells share it, each with an equal share of its memory. "
                            "On a CPU it pays where a run trains one client per call (FedCompass or FedAsync "
                            "with one very fast client) and so leaves cores idle; results equal --jobs 1's to "
                            "float32 reassociation, not bit for bit")
    sweep.add_argument("--time-per-step", metavar="FILE", default=None,
                       help="each client's seconds per local step from a .npy, .csv or .txt file (one number "
                            "per client, or a trace table with a time_per_step column), every cell's speeds instead of drawing them (as jaxfl run's flag); the "
                            "cells must have that many clients. A sweep folder holds the runs of one set of "
                            "speeds: continuing it needs the same numbers (float64; in any of these files)")
    fields = sweep.add_argument_group("config fields: a comma-separated list sweeps the field over its values")
    for name, field in FIELDS.items():
        if name in ("algorithm_options", *SWEEP_OWNED):
            continue
        owner = SECTIONS.get(SECTION_OF.get(name), RunConfig)
        text = _HELP.get(name, field_help(owner, name)).replace("{names}", ", ".join(algorithms.names()))
        if name == "dataset":
            text += "; in a list a synthetic:A,B keeps its comma (synthetic:0.5,0.5,synthetic:1,1: two values)"
        flags = [f"--{name.replace('_', '-')}", *_ALIASES.get(name, [])]  # --lr, --steps as in jaxfl run
        if field.type.startswith("bool"):
            fields.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, default=None,
                                help=f"{text} (on or off: a list of both in the sweep file's [grid])")
        else:
            fields.add_argument(*flags, dest=name, default=None, metavar="V[,V...]", help=text)
    options = sweep.add_argument_group("algorithm options: --SPACE.OPTION V[,V...] (jaxfl algorithms lists them)")
    for space, owners in option_namespaces().items():
        cls = algorithms.get(owners[0]).Options
        aliases = {field: alias for alias, field in cls.aliases.items()}
        for field in dataclasses.fields(cls):  # with its alias, as jaxfl run takes it (--compass.lambda)
            spellings = [field.name] + ([aliases[field.name]] if field.name in aliases else [])
            options.add_argument(*(f"--{space}.{name.replace('_', '-')}" for name in spellings),
                                 dest=f"{space}.{field.name}", default=None, metavar="V[,V...]", help=argparse.SUPPRESS)
    report = commands.add_parser("report", help="the papers' tables and figures from a sweep folder",
                                 description="Tables (time to target relative to a reference algorithm, best "
                                             "accuracy mean ± std over seeds; printed, and saved as markdown and CSV) "
                                             "and figures (accuracy bands over virtual time, time-to-target bars, "
                                             "staleness histograms, client timelines) of a jaxfl sweep folder, "
                                             "also of one still running: over its cells finished so far, as the "
                                             "report's first line says.")
    report.add_argument("sweep_dir", metavar="SWEEP_DIR", nargs="+", type=user_path,
                        help="a folder written by jaxfl sweep, or a results CSV file (its results.csv kept apart: "
                             "tables only, with --no-figures or --table-figures, where its runs are gone); several: "
                             "their results as one table (the parts of a grid run apart, e.g. seeds on another "
                             "machine), the report in the first")
    report.add_argument("--reference", default=None,
                        help="the method times to target are relative to (default: fedavg; timing-only runs have "
                             "no such times: their report is a table of virtual time, updates, utilisation and "
                             "staleness)")
    report.add_argument("--out", metavar="DIR", type=user_path, help="where to write (default: the first SWEEP_DIR/report; "
                                                      "for a file x/NAME.csv, x/NAME-report)")
    figures = report.add_mutually_exclusive_group()
    figures.add_argument("--no-figures", dest="figures", action="store_false", help="the tables only")
    figures.add_argument("--table-figures", dest="figures", action="store_const", const="table",
                         help="the tables and the figures the results table alone makes (time-to-target bars; "
                              "with --grid, the heat maps): for results CSVs whose runs are gone")
    report.add_argument("--panels", metavar="SETTING",
                        help="a swept setting of a method (e.g. port.min_clients): one figure panel per value of it, "
                             "the methods that do not read it in every panel")
    report.add_argument("--grid", metavar="ROWS,COLUMNS", type=lambda text: text.split(","),
                        help="two swept settings of a method (e.g. port.min_clients,port.staleness_bound): the "
                             "times to target relative to the reference also as a ROWS × COLUMNS table per group, "
                             "and a heat map of it (a design-space sweep, as PORT's K × Ω)")


def _sweep_values(args: argparse.Namespace) -> tuple[dict, dict]:
    """The sweep file's base and grid with the flags over them: a flag's comma list is an axis."""
    from jaxfl.sweep import load_sweep_file

    if args.size is not None and args.sweep_file is None:
        raise ConfigError(f"--size {args.size} is not allowed without a sweep file: sizes are [sizes.NAME] tables in it")
    if args.sweep_file is not None and not _may_be_a_sweep_file(args.sweep_file):
        raise ConfigError(f"sweep file {args.sweep_file!r} does not exist (a sweep file is a .toml or .json file)")
    base, grid = load_sweep_file(args.sweep_file, args.size) if args.sweep_file else ({}, {})
    file_base, file_grid = dict(base), dict(grid)
    flagged = set()
    spaces = option_namespaces()
    for name, text in vars(args).items():
        if text is None or not (name in FIELDS or "." in name) or name == "progress":  # progress: the grid's bar
            continue
        if "." in name:
            space, _, option = name.partition(".")
            annotation = annotation_text(algorithms.get(spaces[space][0]).Options.__dataclass_fields__[option].type)
        else:
            annotation = FIELDS[name].type
        if isinstance(text, bool):
            values = [text]
        else:  # a tuple field's own commas (0.49,0.48,0.45) are its value: sweep those in a file
            parts = [text] if annotation.startswith("tuple") else _comma_list(name, text)
            values = [_value_parser(name, annotation)(part.strip()) for part in parts]
        base.pop(name, None)
        flagged.add(name)
        if len(values) > 1:
            grid[name] = values  # a file's axis keeps its place in the grid's order
        else:
            grid.pop(name, None)
            base[name] = values[0]
    # both of two alternatives typed: one would be dropped (the sweep file's own cells are checked by validation)
    _check_alternatives({name: vars(args)[name] for name in flagged}, {}, None)
    if (base, grid) != (file_base, file_grid):
        _leave_out_file_settings_the_flags_made_unread(base, grid, file_base, file_grid, flagged)
    # new axes: the seed outermost, the algorithm innermost (a setting's comparison is complete early)
    return base, dict(sorted(grid.items(), key=lambda item: 0 if item[0] in file_grid
                             else {"seed": 1, "algorithm": 3}.get(item[0], 2)))


def _comma_list(name: str, text: str) -> list[str]:
    """A sweep flag's comma-separated values; in ``--dataset`` the comma of a ``synthetic:A,B`` value
    is its own (a ``synthetic:`` value with one number takes the next part as its second).

    >>> _comma_list("dataset", "synthetic:0.5,0.5,mnist10k,synthetic:1,1+parallel,synthetic:iid+parallel")
    ['synthetic:0.5,0.5', 'mnist10k', 'synthetic:1,1+parallel', 'synthetic:iid+parallel']
    >>> _comma_list("clients", "5,10")
    ['5', '10']
    """
    parts = text.split(",")
    if name != "dataset":
        return parts
    values: list[str] = []
    for part in parts:
        body = values[-1].strip().partition("synthetic:")[2] if values and values[-1].strip().startswith("synthetic:") else None
        if body is not None and "," not in body and not body.startswith("iid"):
            values[-1] += "," + part  # synthetic:A then B
        else:
            values.append(part)
    return values


def _leave_out_file_settings_the_flags_made_unread(base: dict, grid: dict, file_base: dict, file_grid: dict,
                                                   flagged: set) -> None:
    """Cutting a sweep file's grid from the command line (``--algorithm fedcompass`` on FedCompass's
    eight-method comparison) leaves some of the file's settings and axes to no cell (FedBuff's buffer
    size, FedASMU's ``fedasmu.fetch`` axis): they are left out of ``base`` and ``grid`` with a note.
    A setting the file's own grid does not read either, or one a flag gave (``flagged``), stays and
    fails in the sweep as a mistake."""
    from jaxfl.sweep import read_by_no_cell

    # what no flag gave came from the file
    made_unread = sorted(set(read_by_no_cell(base, grid)) - set(read_by_no_cell(file_base, file_grid)) - flagged)
    for name in made_unread:
        base.pop(name, None)
        grid.pop(name, None)
    if made_unread:
        print(f"jaxfl: note: {', '.join(made_unread)} from the sweep file: no cell of the grid the flags left reads "
              f"{'it' if len(made_unread) == 1 else 'them'}; left out", file=sys.stderr)


def _sweep(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``jaxfl sweep``: validate every cell, run (or continue) the grid, print where the table is."""
    from jaxfl import stopping
    from jaxfl.sweep import CellFailed, run_sweep

    def finished_cells() -> str:
        from jaxfl.report import read_results

        table = os.path.join(args.sweep_dir, "results.csv")
        finished = len(read_results(args.sweep_dir)) if os.path.isfile(table) else 0
        return f"{finished} finished cell{'' if finished == 1 else 's'} in {table}"

    def sweep_words() -> str | None:  # SIGTERM as a cell starts or resumes, before its first event
        if not os.path.isdir(args.sweep_dir):
            return None
        return (f"the sweep: {finished_cells()}; the same jaxfl sweep command goes on (finished cells are skipped, "
                "the interrupted one resumes from its newest checkpoint or starts again)")

    sweep_values: dict = {}  # the base and grid, once read: an interrupt's line says how a timing-only cell goes on

    try:
        check_output_folder("--out", args.sweep_dir)
        base, grid = _sweep_values(args)
        sweep_values.update(base=base, grid=grid)
        times = None
        if args.time_per_step is not None:
            from jaxfl.user_inputs import load_time_per_step

            times = load_time_per_step(args.time_per_step)
        with stopping.said_on_sigterm(sweep_words):
            result = run_sweep(base, grid, args.sweep_dir, size=args.size, progress=args.progress,
                               echo=None if args.progress else print, jobs=args.jobs, time_per_step=times)
    except DiskWriteError as error:  # a full disk: the same command goes on once there is space
        parser.exit(CHECKPOINT_WRITE_STATUS, f"jaxfl: error: {error}\njaxfl: the sweep goes on once there is "
                                             "space: run the same jaxfl sweep command again (finished cells are "
                                             "skipped, the cut one resumes or starts again)\n")
    except (ConfigError, ValueError, FileNotFoundError, ImportError, ResourceError, argparse.ArgumentTypeError) as error:
        _exit_on_error(parser, error)
    except CellFailed as error:  # a cell of a parallel sweep (--jobs): its error and output, no traceback of ours
        print(f"jaxfl: error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # a bug in a plug-in's policy or hook: named with its cell, status 1
        _raise_unless_yours(error)
        _exit_on_error(parser, error)
    except KeyboardInterrupt as interrupt:  # Ctrl-C, a time limit's SIGINT or SIGTERM: what is kept and how to go on
        from jaxfl.experiment import RunInterrupted

        if isinstance(interrupt, RunInterrupted):  # the cut cell's own run says how it goes on
            cut = f"the interrupted one, {interrupt.run_dir}, " + (
                "starts again: a timing-only run keeps no checkpoints" if interrupt.timing_only else
                "starts again: it had no checkpoint yet" if interrupt.checkpoint is None else
                f"resumes from its checkpoint of update {interrupt.update}")
        else:  # a parallel sweep's workers were stopped: which cells are timing-only, the grid says
            # (values parsed already: a file's booleans, a flag's through _value_parser)
            axis = [value is True for value in sweep_values.get("grid", {}).get("timing_only", [])]
            every = all(axis) if axis else sweep_values.get("base", {}).get("timing_only") is True
            one = args.jobs == 1
            if every:
                cut = ("the interrupted one starts again" if one else "the interrupted ones start again") + \
                    ": a timing-only run keeps no checkpoints"
            else:
                cut = ("the interrupted one resumes from its newest checkpoint" if one else
                       "the interrupted ones resume from their newest checkpoints") + \
                    (" (timing-only ones start again: they keep none)" if any(axis) else "")
        if not os.path.isdir(args.sweep_dir):  # in the checks before the first cell: nothing written
            print(f"jaxfl: {_interrupted_how(interrupt)} before the sweep's first cell: nothing written; the same "
                  "command starts the sweep", file=sys.stderr)
            return _interrupted_status(interrupt)
        print(f"jaxfl: {_interrupted_how(interrupt)}: {finished_cells()}; the same command goes on (finished cells "
              f"are skipped, {cut})", file=sys.stderr)
        return _interrupted_status(interrupt)
    for note in result.notes:
        print(f"jaxfl: note: {note}", file=sys.stderr)
    print(f"{len(result.cells)} cells: {len(result.ran)} run, {len(result.resumed)} resumed, "
          f"{len(result.restarted)} restarted, {len(result.skipped)} already finished")
    print(f"results: {result.table}"
          f"{'' if result.parquet is None else f' (and {os.path.basename(result.parquet)})'}; "
          f"tables and figures: jaxfl report {shlex.quote(args.sweep_dir)}")
    return 0


def _report(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``jaxfl report``: print the tables, save them and the figures."""
    from jaxfl.report import make_report

    try:
        if args.out is not None:
            check_output_folder("--out", args.out)
        if args.panels is not None and args.figures is False:
            raise ValueError(f"--panels {args.panels} is not allowed with --no-figures: it splits the figures' "
                             "panels; leave out one of the two")
        report = make_report(args.sweep_dir, args.reference, args.out, figures=args.figures, panels=args.panels,
                             grid=args.grid)
    except (ConfigError, ValueError, FileNotFoundError) as error:
        _exit_on_error(parser, error)
    print(report.markdown)
    print(f"\ntables: {report.markdown_path}, {report.table}")
    if report.figures:
        print("figures:\n" + "\n".join(f"  {path}" for path in report.figures))
    return 0


_DEMO_DESCRIPTION = ("Runs the quickstart experiment (jaxfl/presets/quickstart.toml) as the `jaxfl run` command\n"
                     "below, which it prints first. Flags after `jaxfl demo` are `jaxfl run` flags: they are added\n"
                     "to the command and override its settings (jaxfl demo --seed 1).")


def _demo_flags(extra: list[str]) -> list[str]:
    """The `jaxfl run` flags of `jaxfl demo EXTRA`: the quickstart preset's, less those of the settings
    that the user's own flags give or replace (``--local-epochs`` the preset's ``--local-steps``; each
    setting once, in the printed command too), then the user's."""
    from jaxfl.presets import preset_argv

    preset = preset_argv("quickstart")
    if not extra:
        return preset
    actions = build_parser().commands["run"]._option_string_actions
    theirs = {actions[token.partition("=")[0]].dest for token in extra
              if token.startswith("-") and token.partition("=")[0] in actions}
    theirs |= {other for pair in _ALTERNATIVES for name, other in (pair, pair[::-1]) if name in theirs}
    unread = _demo_settings_unread(extra, actions) if "algorithm" in theirs else set()
    kept, index, left_out = [], 0, []
    while index < len(preset):
        action = actions[preset[index]]
        width = 1 if action.nargs == 0 else 2  # a switch (--no-stop-at-target), or a flag and its value
        if action.dest in unread:
            left_out.append(action.dest)
        elif action.dest not in theirs:
            kept += preset[index:index + width]
        index += width
    if left_out:  # the quickstart's FedBuff and FedAsync rule when only others run: as --preset leaves it out
        print(f"jaxfl: note: jaxfl demo: {', '.join(left_out)} of the quickstart not read by the algorithms "
              "given, left out", file=sys.stderr)
    return [*kept, *extra]


def _demo_settings_unread(extra: list[str], actions) -> set[str]:
    """The quickstart's settings that none of the algorithms ``--algorithm`` names in ``extra`` reads
    (an unknown name: none, its own error comes from the run's parser)."""
    from jaxfl.config import fields_not_read_by
    from jaxfl.presets import preset_values

    names = None
    for position, token in enumerate(extra):
        flag, equals, value = token.partition("=")
        if flag in actions and actions[flag].dest == "algorithm":
            names = value if equals else (extra[position + 1] if position + 1 < len(extra) else None)
    if not names:
        return set()
    fields = {key: value for key, value in preset_values("quickstart").items()
              if key != "algorithm" and not isinstance(value, dict)}
    try:
        classes = [algorithms.get(name.strip()) for name in names.split(",")]
    except KeyError:
        return set()
    return set.intersection(*(set(fields_not_read_by(cls, fields)) for cls in classes))


def _demo_command(flags: list[str]) -> str:
    """The `jaxfl run` command of ``flags`` (:func:`_demo_flags`), wrapped as a shell would take it."""
    words, index = [], 0
    while index < len(flags):  # a flag and its value stay on one line
        takes_value = flags[index].startswith("--") and index + 1 < len(flags) and not flags[index + 1].startswith("--")
        words.append(shlex.join(flags[index:index + 1 + takes_value]))
        index += 1 + takes_value
    lines, line = [], "jaxfl run"
    for word in words:
        if len(line) + 1 + len(word) > 96:
            lines.append(line + " \\")
            line = "   "
        line += " " + word
    return "\n".join(lines + [line])


def _demo(extra: list[str]) -> int:
    """``jaxfl demo``: print the quickstart's full `jaxfl run` command, then run it."""
    flags = _demo_flags(extra)
    print(f"jaxfl demo runs:\n{_demo_command(flags)}\n", flush=True)
    return main(["run", *flags])


_PARTITION_FLAGS = ("dataset", "data_dir", "partition", "clients", "seed", "dirichlet_alpha", "dirichlet_min_samples",
                    "dirichlet_balance", "client_sizes", "size_skew", "shards_per_client", "gamma")


def _partition_settings(config: RunConfig) -> list[tuple[str, str, str]]:
    """(name, short name, value) of each setting that shapes ``config``'s split and that its partition
    reads: the Dirichlet α, unequal client sizes and their skew, shards per client, γ."""
    from jaxfl.config import _only_read_when

    read = _only_read_when(config)
    shorts = {"dirichlet_alpha": "a", "dirichlet_min_samples": "min", "dirichlet_balance": "balanced",
              "client_sizes": "", "size_skew": "skew", "shards_per_client": "shards", "gamma": "gamma"}
    unnamed = {"client_sizes": "equal", "dirichlet_min_samples": 1, "dirichlet_balance": False}  # the plain split's
    return [(name, short, "" if isinstance(getattr(config, name), bool) else
             f"{getattr(config, name):g}" if isinstance(getattr(config, name), float) else str(getattr(config, name)))
            for name, short in shorts.items()
            if read[name][0] and not (name in unnamed and getattr(config, name) == unnamed[name])]


def _partition(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``jaxfl partition``: print the per-client table of a split and save its class heatmap."""
    values = {name: getattr(args, name) for name in _PARTITION_FLAGS if getattr(args, name) is not None}
    try:
        # The split does not depend on the algorithm; fedavg has no buffer to check against the clients.
        config = config_from_mapping({**values, "algorithm": "fedavg"})
        from jaxfl.data.report import figure_formats

        # --out split.png (or .pdf, .svg) is the figure's file, as jaxfl timeline's --out is (it made a
        # folder split.png)
        file_given = args.out is not None and \
            os.path.splitext(args.out)[1].lower().lstrip(".") in figure_formats()
        if file_given and os.path.isdir(args.out):
            raise ConfigError(f"--out={args.out!r} is not allowed: it is a folder named like a figure's file; give "
                              "the file's path, or another folder")
        check_output_folder("--out" if args.out else "output_dir",
                     (os.path.dirname(args.out) or ".") if file_given else args.out or config.output_dir,
                     given=args.out if file_given else None)
        from jaxfl.data.report import partition_report, plot_class_heatmap
        from jaxfl.experiment import build_data, note_pooled_synthetic_clients

        dataset, federation = build_data(config)
        note_pooled_synthetic_clients(config, dataset)
    except (ConfigError, ValueError, FileNotFoundError, ImportError) as error:
        _exit_on_error(parser, error)
    settings = _partition_settings(config)
    # another --data-dir is other data: its own title and figure, not an overwrite of the first's
    source = config.dataset
    if config.data_dir is not None:
        where = os.path.abspath(os.path.expanduser(config.data_dir))
        # a name that is no UTF-8 (its bytes kept as surrogates) shown escaped: a title cannot draw them
        name = (os.path.basename(where.rstrip(os.sep)) or where).encode("utf-8", "backslashreplace").decode()
        source += f" {name} {hashlib.sha256(os.fsencode(where)).hexdigest()[:6]}"
    title = ", ".join([source, config.partition, *(f"{name} {value}".strip() for name, _, value in settings),
                       f"{config.clients} clients", f"seed {config.seed}"])
    report = partition_report(federation, title)
    print(report.table(args.max_rows))
    out = args.out or config.output_dir
    # a split's own settings in the name: another alpha is another figure, not an overwrite
    stem = "-".join(["partition", source.replace(" ", "-"), config.partition, *(f"{short}{value}" for _, short, value in settings),
                     f"c{config.clients}", f"s{config.seed}"])
    stem = "".join(c if c.isalnum() or c in "-_.," else "_" for c in stem)
    target = out if file_given else os.path.join(out, stem + ".png")
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    print(f"class heatmap: {plot_class_heatmap(report, target)}")
    return 0


def _algorithms(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``jaxfl algorithms``: one line per registered algorithm, then its options' flags."""
    for reference in args.algorithm:
        try:
            algorithms.get(reference)
        except KeyError as error:
            parser.exit(2, f"jaxfl: error: {error.args[0]}\n")
    width = max(len(name) for name in algorithms.names())
    for name in algorithms.names():
        cls = algorithms.get(name)
        space = cls.option_namespace()
        options = " ".join(f"--{space}.{f.name.replace('_', '-')}" for f in dataclasses.fields(cls.Options))
        print(f"{name:<{width}}  {cls.kind:<17}  {_summary_of(cls)}")
        if options:
            print(f"{'':<{width}}  {'':<17}  options: {options}")
    return 0


def _timeline(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from jaxfl.runlog import event_log_format

    if event_log_format(args.run_dir) is None:
        parser.exit(2, f"jaxfl: error: run_dir={args.run_dir!r} is not allowed: {_not_a_run(args.run_dir)}\n")
    if args.max_time is not None and not 0 < args.max_time < math.inf:  # inf (or 1e400): no axis to draw
        parser.exit(2, f"jaxfl: error: --max-time={args.max_time} is not allowed: a finite number of virtual "
                       "seconds > 0 (leave it out for the run's end)\n")
    out = args.out or os.path.join(args.run_dir, "timeline.png")
    if args.out is not None:
        problem = None
        if not args.out.lower().endswith(".png"):
            problem = "a PNG file's path, ending in .png"
        elif os.path.isdir(args.out):
            problem = "it is a folder: give the PNG file's path in it (e.g. DIR/timeline.png)"
        if problem:
            parser.exit(2, f"jaxfl: error: --out={args.out!r} is not allowed: {problem}\n")
        try:
            check_output_folder("--out", os.path.dirname(args.out) or ".", given=args.out)
        except ConfigError as error:
            _exit_on_error(parser, error)
    from jaxfl.plot import save_figure, timeline_figure

    try:  # the figure first: a damaged log is refused before any folder is made
        figure = timeline_figure(args.run_dir, args.max_time)
    except (ValueError, FileNotFoundError, ImportError) as error:
        _exit_on_error(parser, error)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)  # as run and sweep make their folders
    print(save_figure(figure, out))
    return 0


def _not_a_run(path: str) -> str:
    """Why ``path``, which holds no event log, is not a run directory, and what to give instead.

    >>> _not_a_run("/no/such/folder")
    'it does not exist: give a run directory written by jaxfl run (RUN_DIR, with its events.csv)'
    """
    wanted = "give a run directory written by jaxfl run (RUN_DIR, with its events.csv)"
    if not os.path.exists(path):
        return f"it does not exist: {wanted}"
    if not os.path.isdir(path):
        return f"it is a file, not a folder: {wanted}"
    if os.path.isdir(os.path.join(path, "runs")) and os.path.isfile(os.path.join(path, "sweep.json")):
        return (f"it is a sweep folder: give one of its runs ({os.path.join(path, 'runs', 'NAME')}), or "
                f"jaxfl report {shlex.quote(path)} draws the timeline of one run per method")
    if os.path.isdir(os.path.join(path, "runs")):
        return f"it holds no event log (events.csv or events/): its runs are in {os.path.join(path, 'runs')}"
    return f"it holds no event log (events.csv or events/): {wanted}"


def _resume(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``jaxfl run --resume RUN_DIR``: flags that would change the run are refused, not ignored."""
    import warnings

    from jaxfl.experiment import resume_experiment
    from jaxfl.resume import ResumeWarning, RunFinished

    show = warnings.showwarning

    def one_line(message, category, *where, **options):  # a skipped checkpoint: one line, no source
        if issubclass(category, ResumeWarning):
            print(f"jaxfl: warning: {message}", file=sys.stderr, flush=True)
        else:
            show(message, category, *where, **options)

    flags = {key: value for key, value in vars(args).items()
             if _given(args, key, value) and (key in FIELDS or "." in key) and key != "progress"}

    def spelling(name: str, value) -> str:  # as the user wrote it (a bool as --X or --no-X, as typed)
        if name in flags:
            flag = name.replace('_', '-')
            if isinstance(value, bool):
                return f"--{flag}" if value else f"--no-{flag}"
            return f"--{flag} {'none' if value is None else value}"
        return f"{name}={value!r} (in {args.config})"

    try:
        from jaxfl.user_inputs import load_time_per_step

        given = {**(_file_settings(args.config) if args.config else {}), **flags}
        in_file = given.pop("progress", None)
        times = None if args.time_per_step is None else load_time_per_step(args.time_per_step)
        extended_before = _extensions(args.resume)
        with warnings.catch_warnings():
            warnings.showwarning = one_line
            # --time-per-step is checked against the array the run saved
            result = resume_experiment(args.resume, progress=in_file if args.progress is None else args.progress,
                                       overrides=given, spelling=spelling, time_per_step=times,
                                       loggers=args.log_to, again_if_finished=False)
    except RunFinished as finished:  # said, and the run left as it is (not re-finished)
        print(f"jaxfl: {finished}")
        return 0
    except DiskWriteError as error:
        parser.exit(CHECKPOINT_WRITE_STATUS, f"jaxfl: error: {error}\n")
    except (ConfigError, ValueError, FileNotFoundError, ImportError) as error:
        _exit_on_error(parser, error)
    except NumericalError as error:
        parser.exit(1, f"jaxfl: run stopped: {error}\n")
    extensions = result.summary.get("extensions") or []
    if len(extensions) > extended_before:  # its budgets raised by this command
        print(_run_line(result.summary, result.run_dir, said=f"extended from update {extensions[-1]['update']}, "))
    else:
        print(_run_line(result.summary, result.run_dir, said="resumed, "))
    return 0


def _extensions(run_dir: str) -> int:
    """How many times the run's budgets were raised so far (its ``config.json``'s ``extensions``); 0
    where that does not read (the resume says why)."""
    try:
        with open(os.path.join(run_dir, "config.json")) as handle:
            return len(json.load(handle).get("extensions") or [])
    except (OSError, ValueError, AttributeError, TypeError):
        return 0


def _run_line(summary: dict, run_dir: str, timing_only: bool = False, said: str = "") -> str:
    """The line a finished run prints: its best accuracy, time to target, updates and stop (``said``
    before them: a resume's "resumed, "), or a timing-only run's schedule (:func:`_timing_line`)."""
    from jaxfl.plot import percent
    from jaxfl.report import _significant

    if timing_only:
        return _timing_line(summary, run_dir)
    reached = "not reached" if summary["time_to_target"] is None else \
        f"{_significant(summary['time_to_target'])} virtual s"
    target_accuracy = summary.get("target_accuracy")
    target = "no target" if target_accuracy is None else f"target {percent(target_accuracy)} {reached}"
    best = f"{summary['best_accuracy']:.4f}" if summary["best_accuracy"] is not None else \
        "none (no evaluation)" if summary.get("final_accuracy") is None else \
        "none (only a diverged model's evaluations)"
    # a numerical error's whole message is said once (above, or by the run that was reused)
    stop = summary["stop_reason"]
    if stop.startswith("numerical error"):
        stop = stop.partition(":")[0]
    return f"{summary['algorithm']}: {said}best accuracy {best}, {target}, {summary['global_updates']} updates, " \
           f"stop: {stop} → {run_dir}"


def _is_run_record(path: str) -> bool:
    """Whether a ``--config`` file is a run's (or a checkpoint's) record: JSON with a ``config``
    table, whose values validation filled in, not a file a user wrote."""
    if not str(path).endswith(".json"):
        return False
    try:
        with open(user_path(path)) as file:
            return isinstance(json.load(file).get("config"), dict)
    except (OSError, ValueError, AttributeError):
        return False


def _speeds_of_run_record(path: str, drawing: typing.Sequence[str] = ()):
    """The seconds per step a run was given (``--time-per-step``), read back from the
    ``client_time_per_step.npy`` beside its ``config.json`` for ``jaxfl run --config RUN/config.json``:
    without them the run drew its speeds from the speed model instead, under the same name. None for
    a run that drew its own, or where ``drawing`` names flags given to draw them (``--heterogeneity
    normal``: said); ConfigError where the file is gone or no longer the one recorded."""
    from jaxfl.user_inputs import saved_time_per_step

    with open(user_path(path)) as file:
        given = (json.load(file).get("user_inputs") or {}).get("time_per_step")
    if not isinstance(given, dict) or "file" not in given:
        return None
    if drawing:
        print(f"jaxfl: note: the clients' seconds per step that the run was given are not used: "
              f"{', '.join('--' + name.replace('_', '-') for name in drawing)} draws them", file=sys.stderr)
        return None
    folder = os.path.dirname(os.path.abspath(user_path(path)))  # a run's folder, or a checkpoint's in it
    run_dir = next((where for where in (folder, os.path.dirname(folder))
                    if os.path.isfile(os.path.join(where, str(given["file"])))), folder)
    try:
        times = saved_time_per_step(run_dir, given)
    except ValueError as error:
        raise ConfigError(f"config file {path!r} is a run's record whose clients were given their seconds per "
                          f"step: {error}; give the same speeds with --time-per-step FILE") from None
    network = " (and network)" if times.dtype.names and len(times.dtype.names) > 1 else ""
    print(f"jaxfl: note: the clients' seconds per step{network} that the run was given are used again "
          f"({os.path.join(run_dir, given['file'])}); --time-per-step FILE gives others", file=sys.stderr)
    return times


def _decide_again(file_values: dict, flags: dict, path: str) -> None:
    """A run's ``config.json`` holds what validation filled in: ``server_lr`` from the server
    optimiser, ``target_accuracy`` from the dataset, an algorithm preset's options, the algorithm's
    default ``rule``. A flag that changes what decided one of them (``--server-optimizer adam``,
    ``--dataset``, ``--compass.preset``, ``--algorithm fedavg``)
    drops the file's value where it is the one the file's own setting gave, so that it is decided
    again, with a note; else adam would run at sgd's server_lr 1.0, 100 times its default."""
    from jaxfl.config import DEFAULT_TARGETS

    dropped = []

    def decided_by(name: str, decider: str, default, keeps: bool = True) -> None:
        was = file_values.get(decider, FIELDS[decider].default)
        if decider in flags and str(flags[decider]) != str(was) and name in file_values and name not in flags \
                and file_values[name] == default:
            keep = f"; --{name.replace('_', '-')} {default} keeps it" if keeps else ""
            dropped.append(f"{name} {file_values.pop(name)!r} ({decider} {was!r} gave it{keep})")

    decided_by("server_lr", "server_optimizer",
               DEFAULT_SERVER_LR.get(file_values.get("server_optimizer", FIELDS["server_optimizer"].default), 1.0))
    decided_by("target_accuracy", "dataset", DEFAULT_TARGETS.get(file_values.get("dataset", FIELDS["dataset"].default)))
    try:  # the default the run's algorithm wrote (FedAsync's and FedBuff's rule): another algorithm's is its own
        written = algorithms.get(file_values.get("algorithm", FIELDS["algorithm"].default)).changed_defaults
    except KeyError:
        written = {}
    for name, (_, now) in written.items():  # (kept by its flag only for an algorithm that reads it)
        decided_by(name, "algorithm", now, keeps=False)
    table = file_values.get("algorithm_options")
    for space in {key.split(".")[0] for key in flags if key.endswith(".preset")}:
        try:
            cls = algorithms.get(option_namespaces()[space][0]).Options
        except (KeyError, IndexError):
            continue
        recorded = {**(table if isinstance(table, dict) else {}),
                    **{key.split(".", 1)[1]: value for key, value in file_values.items() if key.startswith(f"{space}.")}}
        preset = recorded.get("preset") or next(iter(cls.presets), None)
        if str(flags[f"{space}.preset"]) == str(preset):
            continue  # the file's own preset: nothing to decide again
        decided = []
        for option, value in cls.presets.get(preset, {}).items():
            if f"{space}.{option}" in flags or recorded.get(option, value) != value:
                continue  # given again, or the file's own choice
            if isinstance(table, dict) and option in table:
                del table[option]
            file_values.pop(f"{space}.{option}", None)
            decided.append(option)
        if decided:
            dropped.append(f"{space}.{', '.join(decided)} ({space}.preset {preset!r} gave them; a --{space}.OPTION "
                           "flag keeps one)")
    if dropped:
        print(f"jaxfl: note: the config file {path} holds values its settings gave, which a flag changes; decided "
              f"again: {'; '.join(dropped)}", file=sys.stderr)


def _leave_out_what_timing_only_does_not_read(file_values: dict, flags: dict, path: str) -> None:
    """A training run's config replayed timing-only (``jaxfl run --config RUN/config.json
    --timing-only``): the file's engine, evaluation and checkpoint settings, which a timing-only run
    does not read, are left out with a note (a flag that gives one is still refused: it was asked for)."""
    from jaxfl.config import TIMING_ONLY_UNREAD

    unread = [name for name in ("eval_every", "checkpoint_every", *TIMING_ONLY_UNREAD)
              if name in file_values and name not in flags and file_values[name] != FIELDS[name].default
              # no checkpoints is what a timing-only run does: kept (the run's name holds it)
              and not (name == "checkpoint_every" and str(file_values[name]).lower() in ("none", "null"))]
    for name in unread:
        del file_values[name]
    if unread:
        print(f"jaxfl: note: {', '.join(unread)} from the config file {path}: a timing-only run trains, evaluates and "
              f"checkpoints nothing; left out", file=sys.stderr)


def _file_settings(path: str) -> dict:
    """A ``--config`` file's settings, each under one flat name (:func:`flat_settings`)."""
    return flat_settings(load_config_file(path), f"config file {path!r}")


def flat_settings(values: dict, where: str) -> dict:
    """A config file's mapping with each setting under one flat name however the file spelled it
    (``clients`` or a ``[data]`` table's ``clients``; ``port.staleness_bound``, a ``[port]`` table's
    entry, an alias or jaxfl 0.1's ``port_staleness_bound``), so that a flag given over the file
    replaces the setting wherever the file put it. A setting the file gives twice with different
    values is refused naming both spellings; an ``[algorithm]`` table stays ``algorithm`` and
    ``algorithm_options``.

    >>> flat_settings({"seed": 1, "data": {"clients": 5}, "port": {"staleness-bound": 3}}, "x.toml")
    {'seed': 1, 'clients': 5, 'port.staleness_bound': 3}
    >>> flat_settings({"clients": 4, "data": {"clients": 5}}, "config file 'x.toml'")
    Traceback (most recent call last):
    ...
    jaxfl.config.ConfigError: config file 'x.toml' gives clients twice: clients = 4 and [data] clients = 5; give it once
    """
    spaces = option_namespaces()

    def flatten(entry: dict) -> dict:
        fields, options = split_algorithm_options(entry)
        for space, given in options.items():
            cls = algorithms.get(spaces[space][0]).Options
            fields.update({f"{space}.{cls.field_name(option)}": item for option, item in given.items()})
        return fields

    for key, value in values.items():  # a misspelt table: named as a section, not flattened into its fields
        name = key.replace("-", "_")
        if isinstance(value, dict) and name not in SECTIONS and name not in spaces and name != "algorithm" \
                and name != "algorithm_options":
            raise unknown_name(key, value, where)
    # an [algorithm] table stays whole (its name and options go together)
    return flat_once(values, where, flatten, lambda key, value: isinstance(value, dict) and
                     (key.replace("-", "_") in SECTIONS or key.replace("-", "_") in spaces))


def _configs(args: argparse.Namespace) -> list[RunConfig]:
    """One validated config per algorithm of ``--algorithm``; each gets only its own options. The
    flags replace the ``--config`` file's settings however the file spelled them (a ``[data]``
    table's ``clients`` as well as a flat one)."""
    _take_explicit_nones(args)  # (done by main; again for a namespace parsed elsewhere)
    values = {key: value for key, value in vars(args).items()
              if _given(args, key, value) and (key in FIELDS or "." in key)}
    file_values = _file_settings(args.config) if args.config else {}
    if file_values and _is_run_record(args.config):
        _decide_again(file_values, values, args.config)
        # a setting the run held unread, refused since (it changed nothing): left out, with a note
        unread = [name for name in without_settings_refused_since({**file_values, **values})[1] if name not in values]
        for name in unread:
            del file_values[name]
        if unread:
            print(f"jaxfl: note: {', '.join(unread)} from the config file {args.config}: unread by this run's other "
                  "settings (refused since the run was recorded); left out", file=sys.stderr)
    _check_alternatives(values, file_values, args.config)
    if values.get("timing_only", file_values.get("timing_only")):
        _leave_out_what_timing_only_does_not_read(file_values, values, args.config)
    fields, options = split_algorithm_options({**file_values, **values})
    preset = getattr(args, "preset", None)
    if preset is not None:
        from jaxfl.presets import preset_values

        in_preset = preset_values(preset)  # names the presets if unknown
        default_algorithm = in_preset["algorithm"]
    names = str(fields.pop("algorithm", default_algorithm if preset is not None else RunConfig.algorithm))
    chosen = [a.strip() for a in names.split(",")]
    if len(set(chosen)) != len(chosen) or "" in chosen:
        raise ConfigError(f"algorithm={names!r} is not allowed: a comma-separated list of distinct algorithm names")
    spaces = {}
    for name in chosen:
        try:
            cls = algorithms.get(name)
        except KeyError as error:
            raise ConfigError(f"algorithm={name!r} is not allowed: {error.args[0]}") from None
        spaces[name] = cls.option_namespace()
    for space in options:
        if space not in spaces.values():
            readers = [name for name in algorithms.names() if algorithms.get(name).option_namespace() == space]
            flagged = any(key.startswith(f"{space}.") for key in values)
            given = f"options --{space}.* are given" if flagged else \
                f"the [{space}] options of config file {args.config!r} are given"
            raise ConfigError(f"{given} but no chosen algorithm ({names}) reads them"
                              + (f" (read only by {', '.join(readers)})" if readers else ""))
    table = fields.pop("algorithm_options", None)
    per_algorithm = _fields_read(fields, chosen, {name: {**(table or {}), **options.get(spaces[name], {})}
                                                  for name in chosen})
    base = {name: ({}, {}) for name in chosen}  # the preset's fields and options table, per algorithm
    if preset is not None:
        from jaxfl.presets import preset_for_algorithm

        for name in chosen:
            preset_fields, preset_options, left_out = preset_for_algorithm(preset, name, in_preset)
            base[name] = preset_fields, preset_options
            if left_out:  # the paper's baselines' settings when its method runs, and the reverse
                print(f"jaxfl: note: preset {preset}: {', '.join(left_out)} not read by {name}, left out",
                      file=sys.stderr)
    # Validate every config before the first run starts: a typo in the third fails at once.
    import warnings

    configs = []
    for name in chosen:
        preset_fields, preset_options = base[name]
        given = {**preset_options, **(table or {}), **options.get(spaces[name], {})}
        unread = []
        while True:
            with warnings.catch_warnings():  # a config's warnings come once, from its run's own validation
                warnings.simplefilter("ignore")
                try:
                    configs.append(config_from_mapping({**preset_fields, **per_algorithm[name], "algorithm": name,
                                                        "algorithm_options": given or None}))
                    break
                except ConfigError as error:  # a value the user never typed: say where it came from
                    field = str(error).partition("=")[0]
                    if field not in preset_fields or field in per_algorithm[name]:
                        raise
                    if "this run never reads it" in str(error):  # a flag made the preset's value unread
                        unread.append(f"{field} {preset_fields[field]!r}")
                        preset_fields = {key: value for key, value in preset_fields.items() if key != field}
                        continue
                    unset = f"--{field.replace('_', '-')} none unsets it, or " if FIELDS[field].default is None else ""
                    raise ConfigError(f"{error} (set by --preset {preset}: {unset}give it another value)") from None
        if unread:  # (--preset port-mnist --partition iid: its dirichlet_alpha refused, "none" suggested and refused)
            print(f"jaxfl: note: preset {preset}: {', '.join(unread)} not read by this run ({name}, with the flags "
                  "given), left out", file=sys.stderr)
    return configs


# Settings of which a run reads one: the first, where set, replaces the second.
_ALTERNATIVES = (("local_epochs", "local_steps"), ("eval_interval", "eval_every"))


def _check_alternatives(flags: dict, file_values: dict, path: str | None) -> None:
    """Refuse two alternative settings both given (``--local-epochs`` and ``--local-steps``,
    ``--eval-interval`` and ``--eval-every``), on the command line or in the ``--config`` file,
    whatever their values: the second was dropped silently when typed at its default. A file that
    holds nearly every field is a saved config (a run's config.json, with both at their resolved
    values): its alternative stays unread unless a flag names it."""
    saved = len(set(file_values) & set(FIELDS)) >= len(FIELDS) // 2
    for first, second in _ALTERNATIVES:
        where = {}
        for name in (first, second):
            if flags.get(name) is not None:
                where[name] = f"--{name.replace('_', '-')} {flags[name]!r}"
            elif file_values.get(name) is not None and not saved:
                where[name] = f"{name} = {file_values[name]!r} in config file {path!r}"
        if len(where) == 2:
            raise ConfigError(f"{where[first]} and {where[second]} are both given: a run reads one of them "
                              f"({first} replaces {second}); give only one")


def _fields_read(fields: dict, chosen: list[str], options_of: dict[str, dict] | None = None) -> dict[str, dict]:
    """Each chosen algorithm's run fields: an algorithm-specific field (``--buffer-size``...) that an
    algorithm never reads is refused for a single algorithm and, in a comparison, given only to the
    algorithms that read it (an error if none does), so that no setting is silently ignored."""
    own = algorithms.get(chosen[0]).server_optimizer
    if len(chosen) == 1 and own is not None and fields.get("server_optimizer") not in (None, own):
        # given at the field's default (sgd) it was taken for unset, and the algorithm's own ran instead
        raise ConfigError(f"server_optimizer={fields['server_optimizer']!r} is not allowed: {own} for {chosen[0]} "
                          f"(or leave it unset)")
    unread = {name: fields_not_read_by(algorithms.get(name), fields, (options_of or {}).get(name)) for name in chosen}
    for field in sorted({field for names in unread.values() for field in names}):
        readers = [name for name in chosen if field not in unread[name]]
        if not readers and field == "clients_per_round" and fields.get("concurrency") is not None:
            raise ConfigError(f"clients_per_round={fields[field]!r} is not allowed with algorithm "
                              f"{', '.join(chosen)}: concurrency={fields['concurrency']!r} replaces it (the clients "
                              f"kept in flight); give only one")
        variants = {name: variant_unread(algorithms.get(name), fields, (options_of or {}).get(name)).get(field)
                    for name in chosen}
        if not readers and len(chosen) == 1 and variants[chosen[0]] is not None and variants[chosen[0]][0]:
            raise ConfigError(f"{field}={fields[field]!r} is not allowed with algorithm {chosen[0]} as set here: it "
                              f"reads it only with {variants[chosen[0]][1]}; leave it unset")
        if not readers:
            anywhere = ", ".join(algorithms_reading(field)) + (
                f", or any algorithm run with {_server_readers_text(field)}" if field in SERVER_FIELDS_READ_BY else "")
            waiting = [name for name in chosen if algorithms.get(name).waits_for_clients]
            crashes = field == "round_timeout" and waiting and (fields.get("crash_prob") or 0) > 0
            raise ConfigError(f"{field}={fields[field]!r} is not allowed with algorithm {', '.join(chosen)}: "
                              f"{'it never reads' if len(chosen) == 1 else 'none of them reads'} it (read only by {anywhere}); "
                              + ("leave it unset" if not crashes else
                                 f"and {', '.join(waiting)} waits for {algorithms.get(waiting[0]).waits_for_clients} "
                                 "(its waits_for_clients), so with crash_prob > 0 a crashed client would stall it: "
                                 "run it without crashes, read round_timeout in it (a timer that closes the wait), "
                                 "or set waits_for_clients = None if its on_crash stops the wait"))
        skipped = [name for name in chosen if name not in readers]
        print(f"jaxfl: note: {field}={fields[field]!r} applies to {', '.join(readers)} only "
              f"({', '.join(skipped)} {'does' if len(skipped) == 1 else 'do'} not read it)", file=sys.stderr)
    for field in ("server_lr", "server_momentum"):
        # one value for servers whose own defaults differ (FedAvg's sgd rate 1, FedAdam's 0.01; FedAvgM's
        # momentum 0.9, FedAvg's none): the baseline changes meaning, so say so
        readers = [name for name in chosen if field not in unread[name]]
        if fields.get(field) is None or len(readers) < 2:
            continue
        optimizers = {name: algorithms.get(name).server_optimizer or fields.get("server_optimizer") or "sgd"
                      for name in readers}
        defaults = {name: f"{DEFAULT_SERVER_LR.get(optimizers[name], 1.0):g} ({optimizers[name]})"
                    if field == "server_lr" else f"{algorithms.get(name).server_momentum or 0:g}" for name in readers}
        if len(set(defaults.values())) > 1:
            print(f"jaxfl: note: {field}={fields[field]!r} applies to every one of {', '.join(readers)}, in place "
                  f"of their own defaults ({', '.join(f'{name} {defaults[name]}' for name in readers)}); "
                  "to set it for one of them, run that one alone", file=sys.stderr)
    return {name: {key: value for key, value in fields.items() if key not in unread[name]} for name in chosen}


class _FinishedRun(typing.NamedTuple):
    """What ``jaxfl run --algorithm a,b`` keeps of each finished run for the comparison
    (:func:`jaxfl.comparison.write_comparison` reads these two): not the whole
    :class:`~jaxfl.experiment.RunResult`, whose model and engine would stay in memory through the
    runs after it.

    >>> _FinishedRun("runs/fedavg-s0", {"algorithm": "fedavg"}).summary["algorithm"]
    'fedavg'
    """

    run_dir: str
    summary: dict


def _earlier_run(config: RunConfig, times=None) -> tuple[str, str] | None:
    """``(run_dir, state)`` of a run of this very config (the record a resume compares, less the
    ``output_dir`` it was made in: a folder copied or moved holds the same runs) and
    the same given speeds (``times``, from ``--time-per-step``; None: drawn ones) that an earlier,
    interrupted ``jaxfl run --algorithm a,b,...`` left under its output_dir: ``finished`` or
    ``resumable`` (a checkpoint to go on from); None if there is none (a run without a checkpoint
    starts again, in a new folder). A run another process is writing now is none either: a note names
    it (:func:`_note_running`)."""
    for run_dir, state in _earlier_runs(config, times, say_edited=True, running=True):
        if state != "running":
            return run_dir, state
        # the same comparison started twice: each trained every run without a word, or, past the
        # run's first checkpoint, was sent to resume it by hand once the lock refused the resume
        _note_running(run_dir, f"this comparison trains {config.algorithm} again beside it")
    from jaxfl.comparison import an_earlier_default_note

    note = an_earlier_default_note(config, times)
    if note is not None:
        print(f"jaxfl: note: {note}", file=sys.stderr)
    return None


def _earlier_runs(config: RunConfig, times=None, say_edited: bool = False, running: bool = False):
    """Every ``(run_dir, state)`` of :func:`_earlier_run` (:func:`jaxfl.comparison.earlier_runs`); a
    run made with an earlier version of a plug-in's or a model's file is not one (``say_edited``:
    where none is found, a note names those)."""
    from jaxfl.comparison import earlier_runs

    edited, found = [], False
    for run_dir, state in earlier_runs(config, times, edited, running=running):
        found = True
        yield run_dir, state
    if say_edited and edited and not found:
        run_dir, changed = edited[-1]
        print(f"jaxfl: note: {run_dir} was made with an earlier version of {' and '.join(changed)}: not reused; "
              "this command runs it again with the code as it is now", file=sys.stderr)


def _note_interrupted_runs(config: RunConfig, times=None) -> None:
    """Name the interrupted runs of this very config under its output_dir: one ``jaxfl run`` starts
    a new run each time (a comparison goes on with the earlier one instead), so the same command
    after a Ctrl-C would otherwise train afresh beside the run it cut, saying nothing."""
    from jaxfl import checkpoint
    from jaxfl.comparison import earlier_runs

    for run_dir, state in earlier_runs(config, times, running=True):
        if state == "resumable":
            update = int(os.path.basename(checkpoint.latest(run_dir))[len("ckpt-"):])
            print(f"jaxfl: note: {run_dir} is an interrupted run of this config (checkpoints up to update "
                  f"{update}): jaxfl run --resume {shlex.quote(run_dir)} finishes it; this command starts a "
                  "new run", file=sys.stderr)
        elif state == "running":
            _note_running(run_dir, "this command starts a new run beside it")


def _note_running(run_dir: str, then: str) -> None:
    """Say that another process is writing ``run_dir``, a run of the config this command trains again
    (a second terminal's same command: it was called interrupted, or nothing was said)."""
    from jaxfl.resume import in_use_by

    holder = in_use_by(run_dir)
    print(f"jaxfl: note: {run_dir} is a run of this config that process {holder or '(unknown)'} is writing now: "
          f"{then}, to the same results", file=sys.stderr)


def _comparison_run(config: RunConfig, times, log_to):
    """One run of a comparison: reused if a run of this config has finished under output_dir,
    resumed if one was cut short after a checkpoint, else run (what ``jaxfl sweep`` does with a cell)."""
    from jaxfl.experiment import resume_experiment, run_experiment, say_other_xla_flags
    from jaxfl.resume import read_record
    from jaxfl.runlog import finished_summary

    earlier = _earlier_run(config, times)
    if earlier is not None and earlier[1] == "finished":
        say_other_xla_flags(earlier[0], read_record(earlier[0]).get("xla_flags"), "reuses it")
        return _FinishedRun(earlier[0], finished_summary(earlier[0]))  # its line says "reused"
    if earlier is not None:
        print(f"{config.algorithm}: resuming {earlier[0]}")
        return resume_experiment(earlier[0], progress=config.progress, time_per_step=times, loggers=log_to)
    return run_experiment(config, time_per_step=times, loggers=log_to)


class _ComparisonInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during ``jaxfl run --algorithm a,b,...``: the runs finished, the one cut
    (and what its folder keeps), those not run, and the command that finishes the comparison."""

    def __init__(self, interrupt: KeyboardInterrupt, configs: list, position: int, results: list, argv: list):
        super().__init__(str(interrupt))
        self.reason = getattr(interrupt, "reason", None)
        names = [config.algorithm for config in configs]
        finished = ", ".join(f"{name} ({result.run_dir})" for name, result in zip(names, results)) or "none"
        command = shlex.join(['jaxfl', *argv])
        timing_only = configs[min(position, len(configs) - 1)].timing_only
        if len(results) > position:  # cut between two runs (the one at position had returned): none interrupted
            left = ", ".join(names[position + 1:]) or "none"
            where = "between two runs" if position + 1 < len(configs) else "after its last run"
            if timing_only:
                self.message = (f"comparison {','.join(names)} of timing-only runs cut short {where}; finished: "
                                f"{finished}; not run: {left}; {command} goes on (finished runs reused)")
            else:
                self.message = (f"comparison {','.join(names)} cut short {where}, comparison.csv not written; "
                                f"finished: {finished}; not run: {left}; {command} goes on (finished runs reused) "
                                "and writes the comparison")
            return
        cut = names[position]
        if getattr(interrupt, "run_dir", None) is not None:
            cut = f"{cut}: {interrupt}"
        else:
            cut = f"{cut}, before its run folder was made"
        left = ", ".join(names[position + 1:]) or "none"
        again = "resumed from its checkpoint" if getattr(interrupt, "checkpoint", None) else "started again"
        if timing_only:  # no comparison.csv either way: their schedules side by side are a sweep's
            self.message = (f"comparison {','.join(names)} of timing-only runs cut short; finished: {finished}; "
                            f"interrupted: {cut}; not run: {left}; {command} goes on (finished "
                            "runs reused, the interrupted one started again)")
            return
        self.message = (f"comparison {','.join(names)} cut short, comparison.csv not written; finished: {finished}; "
                        f"interrupted: {cut}; not run: {left}; {command} goes on (finished "
                        f"runs reused, the interrupted one {again}) and writes the comparison")

    def __str__(self) -> str:
        return self.message


class _ComparisonWriteInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while a finished comparison writes its plot and table."""

    def __init__(self, interrupt: KeyboardInterrupt, output_dir: str, argv: list):
        super().__init__(str(interrupt))
        self.reason = getattr(interrupt, "reason", None)
        self.message = (f"every run of the comparison finished, but it was cut short while writing comparison.png and "
                        f"comparison.csv into {output_dir}: {shlex.join(['jaxfl', *argv])} reuses the runs and "
                        "writes them")

    def __str__(self) -> str:
        return self.message


def _print_comparison(results, output_dir: str, argv: list) -> None:
    """The comparison table, then where the table, the plot and the run directories are."""
    from jaxfl.cluster import process_index
    from jaxfl.comparison import format_table, write_comparison

    if process_index() != 0:  # a cluster run: process 0 writes the table and the plot, and says where
        print(f"the comparison table and plot: in {output_dir}, written by process 0")
        return
    try:
        comparison = write_comparison(results, output_dir)
    except KeyboardInterrupt as interrupt:
        raise _ComparisonWriteInterrupted(interrupt, output_dir, argv) from None
    print("\n" + format_table(comparison.rows, results[0].summary["target_accuracy"]))
    print(f"table (CSV): {comparison.table}")
    # best_accuracy is None where a run made no (scored) evaluation: the plot is an empty frame then
    none = "" if any(result.summary.get("best_accuracy") is not None for result in results) else \
        " (empty: no run made an evaluation)"
    print(f"plot of accuracy over virtual time: {comparison.plot}{none}")
    print("run directories:\n" + "\n".join(f"  {run_dir}" for run_dir in comparison.run_dirs))


def _import_named_algorithms(argv: list[str]) -> dict[str, str]:
    """Register ``module:Class`` algorithms named on the command line first, so their options get
    flags; returns ``{name: why}`` for those that could not be imported (else validation reports them
    with the registered names)."""
    names = [name.strip() for index, token in enumerate(argv)
             for name in (argv[index + 1] if token == "--algorithm" and index + 1 < len(argv) else
                          token.partition("=")[2] if token.startswith("--algorithm=") else "").split(",")]
    import_named_plugins({"algorithm": names})
    return {name: PLUGIN_IMPORT_FAILURES[name] for name in names if name in PLUGIN_IMPORT_FAILURES}


def main(argv: list[str] | None = None) -> int:
    """The ``jaxfl`` command; returns its exit status. Ctrl-C ends with one line saying what was kept
    and how to go on, and status 130 (a shell's status for a command stopped by SIGINT). SIGTERM (a
    cluster's time limit, ``kill``) stops a run at its next event boundary with a checkpoint there
    (:mod:`jaxfl.stopping`), with such a line too, and status 143."""
    import warnings

    from jaxfl import _startup, stopping
    from jaxfl._user_warnings import asked_for_every_warning, each_note_once

    _startup.started()  # Ctrl-C from here on: this function's line (what was kept, how to go on)
    try:
        with stopping.stop_on_sigterm(), warnings.catch_warnings():
            warnings.formatwarning = _warning_line
            if not asked_for_every_warning():  # -W always, PYTHONWARNINGS=always: the user's filter decides
                warnings.showwarning = each_note_once(warnings.showwarning)
            status = _main(argv)
        if argv is None and status in (130, stopping.SIGTERM_STATUS):  # a sweep says its interrupt and returns
            _end_interrupted(status)
        if argv is None:
            _end_past_abandoned_reads(status)
        return status
    except SystemExit as done:  # parser.exit: a refusal's one line said
        if argv is None:
            _end_past_abandoned_reads(done.code if isinstance(done.code, int) else 1)
        raise
    except OSError as error:  # the disk or a file's permissions, where no step names it: one line, not a traceback
        if _your_code_frame(error) is not None:  # the user's own code's error (a model factory's open): its traceback
            raise
        report = (sys.argv[1:] if argv is None else list(argv))[:1] == ["report"]
        print(f"jaxfl: error: {_os_error_line(error, report)}", file=sys.stderr)
        return CHECKPOINT_WRITE_STATUS
    except KeyboardInterrupt as interrupt:
        from jaxfl.experiment import RunInterrupted

        said = f": {interrupt}" if isinstance(interrupt, (RunInterrupted, _ComparisonInterrupted,
                                                          _ComparisonWriteInterrupted)) else ""
        print(f"jaxfl: {_interrupted_how(interrupt)}{said}", file=sys.stderr)
        status = _interrupted_status(interrupt)
        if argv is None:  # the command itself (not a caller's main([...])): end here, see _end_interrupted
            _end_interrupted(status)
        return status


def _os_error_line(error: OSError, report: bool = False) -> str:
    """An OSError as the command's one line: what failed, on which file, and that the files written
    before it stay (a run's checkpoints, a sweep's finished cells); the same command goes on once it
    is fixed. A report (``report``) is written anew by the same command.

    >>> _os_error_line(PermissionError(1, "Operation not permitted", "runs/a/metrics.csv"))
    "Operation not permitted: 'runs/a/metrics.csv' (the files written before it are kept: fix that and run the same command again)"
    """
    said = f"{error.strerror}: {error.filename!r}" if error.strerror and error.filename else str(error)
    if report:
        return f"{said} (fix that and run the same command again: it writes the report anew)"
    return f"{said} (the files written before it are kept: fix that and run the same command again)"


def _end_past_abandoned_reads(status: int) -> None:
    """End the command now where a checkpoint's restore failed in it (a resume past damaged data): the
    reads orbax abandoned print their tracebacks in the interpreter's teardown, past any hook, around
    the one line the command said. Everything the command keeps was written and closed before."""
    checkpoint = sys.modules.get("jaxfl.checkpoint")
    if checkpoint is not None and checkpoint.ABANDONED_READS:
        _end_interrupted(status)


def _end_interrupted(status: int) -> None:
    """End the interrupted command now, its output flushed, without the interpreter's shutdown: a
    Ctrl-C that lands while XLA compiles (the checks before a sweep's or run's first run) left XLA
    in a state that the shutdown's teardown crashed on, 6 times in 8 (a segmentation fault, status
    -11, after the "interrupted" line; 2026-12-01). Everything the command keeps (logs, checkpoints)
    was closed and written before the interrupt reached here."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _warning_line(message, category, filename, lineno, line=None) -> str:
    """A warning as the command's one-line note (``jaxfl: note: ...``), not Python's ``file:line:
    Category: message`` and source line; another package's warning names its category. Set as
    ``warnings.formatwarning``, so a caller that records warnings (pytest) still gets them as they are."""
    if category is UserWarning or category.__module__.startswith("jaxfl"):
        return f"jaxfl: note: {message}\n"
    return f"jaxfl: note: {category.__name__}: {message}\n"


def _interrupted_how(interrupt: KeyboardInterrupt) -> str:
    """``interrupted`` (Ctrl-C, SIGINT) or ``stopped by REASON`` (a requested stop: SIGTERM...)."""
    reason = getattr(interrupt, "reason", None)
    return "interrupted" if reason is None else f"stopped by {reason}"


def _interrupted_status(interrupt: KeyboardInterrupt) -> int:
    """A shell's status for a command ended by the signal behind ``interrupt``: 143 for SIGTERM, else 130."""
    from jaxfl.stopping import SIGTERM_STATUS

    return SIGTERM_STATUS if getattr(interrupt, "reason", None) == "SIGTERM" else 130


def _joined_negative_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--flag -inf`` as ``--flag=-inf``: argparse takes a value starting with ``-`` for a flag
    unless it reads as a plain negative number (``-1e3``, ``-inf``, a sweep's ``-1,2`` do not), and
    said only "expected one argument"; joined, the value reaches the checks, which name what is allowed.

    >>> _joined_negative_values(build_parser(), ["run", "--max-time", "-inf", "--no-progress"])
    ['run', '--max-time=-inf', '--no-progress']
    """
    own = parser.commands.get(argv[0], parser) if argv else parser
    takes_value = {flag for holder in (parser, own) for action in holder._actions
                   if action.option_strings and action.nargs is None and isinstance(action, argparse._StoreAction)
                   for flag in action.option_strings}
    joined, index = [], 0
    while index < len(argv):
        token = argv[index]
        following = argv[index + 1] if index + 1 < len(argv) else None
        if token in takes_value and following is not None and following.startswith("-") \
                and not following.startswith("--") and following != "-h":
            joined.append(f"{token}={following}")
            index += 2
            continue
        joined.append(token)
        index += 1
    return joined


def _may_be_a_sweep_file(token: str) -> bool:
    """A file that exists, or a name ending as a sweep file does (.toml, .json): a missing one is named
    as the file it is meant to be.

    >>> _may_be_a_sweep_file("grid.toml"), _may_be_a_sweep_file("true,false")
    (True, False)
    """
    return os.path.exists(token) or token.lower().endswith((".toml", ".json"))


def _refuse_values_of_switches(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """A value typed after an on/off switch (``--batching true,false``), named as such before any work:
    argparse took it for the sweep file ("config file 'true,false' does not exist") or called it an
    unrecognized argument. A sweep file after a switch (``--no-progress grid.toml``) is no value."""
    command = argv[0] if argv and argv[0] in parser.commands else None
    if command is None:
        return
    own = parser.commands[command]
    if command != "sweep" and any(not action.option_strings for action in own._actions):
        return  # a word after a switch may be the command's own argument (jaxfl report --no-figures DIR)
    switches = {flag: action for action in own._actions if action.nargs == 0 and action.option_strings
                and not isinstance(action, (argparse._HelpAction, argparse._VersionAction)) for flag in action.option_strings}
    for before, token in zip(argv[1:], argv[2:]):
        if before not in switches or token.startswith("-"):
            continue
        # a sweep's word after a switch is its sweep file unless it reads as values (a missing file is
        # named as such: `--no-progress nosuch`)
        if command == "sweep" and (_may_be_a_sweep_file(token) or not _reads_as_values(token)):
            continue
        if isinstance(switches[before], argparse.BooleanOptionalAction):
            positive, negative = (f"--{before[5:]}", before) if before.startswith("--no-") else \
                (before, f"--no-{before[2:]}")
            given = f"an on/off switch is given as {positive} or {negative}"
        else:
            given = f"it is given alone ({before})"
        name = switches[before].dest
        grid = (f"; to sweep it, list it in a sweep file's [grid] ({name} = [true, false])"
                if command == "sweep" and (name in FIELDS or "." in name) and name != "progress" else "")
        own.error(f"{before} takes no value, and {token!r} followed it: {given}{grid}")


def _reads_as_values(token: str) -> bool:
    """A comma list or a truth value (``true,false``, ``False``, ``0``): values, not a file's name.

    >>> _reads_as_values("true,false"), _reads_as_values("no"), _reads_as_values("grid")
    (True, True, False)
    """
    return "," in token or token.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0")


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    not_imported = _import_named_algorithms(argv)
    if argv[:1] == ["demo"] and not {"-h", "--help"} & set(argv[1:]):
        return _demo(argv[1:])
    parser = build_parser()
    _refuse_values_of_switches(parser, argv)
    args, extra = parser.parse_known_args(_joined_negative_values(parser, argv))
    _note_repeated_flags(parser.flags_read)
    _take_explicit_nones(args)
    flags = [token.partition("=")[0] for token in extra if token.startswith("-")]
    if flags and not_imported:  # its options are unknown because the plug-in did not import: say why
        name, why = next(iter(not_imported.items()))
        parser.exit(2, f"jaxfl: error: {why} (so {' '.join(flags)} {'is' if len(flags) == 1 else 'are'} not known: "
                       f"its options come with it)\n")
    if extra:
        _refuse_unrecognized(parser, args.command, extra)
    if args.command in ("run", "sweep"):  # a second run of the same shapes reads its programs back
        from jaxfl.compilation_cache import use_compilation_cache

        try:
            use_compilation_cache()
        except ValueError as error:
            parser.exit(2, f"jaxfl: error: {error}\n")
    if args.command == "timeline":
        return _timeline(parser, args)
    if args.command == "algorithms":
        return _algorithms(parser, args)
    if args.command == "partition":
        return _partition(parser, args)
    if args.command == "sweep":
        return _sweep(parser, args)
    if args.command == "report":
        return _report(parser, args)
    configs = None
    if args.cluster or args.coordinator_address or args.num_processes is not None or args.process_id is not None:
        from jaxfl.cluster import init_cluster

        if not args.resume:  # a bad setting is named before the join, which may wait minutes for the others
            try:  # (validating starts no jax backend: jax.distributed.initialize must come first)
                configs = _configs(args)
            except (ConfigError, ValueError, FileNotFoundError, ImportError) as error:
                _exit_on_error(parser, error)
        try:
            init_cluster(args.coordinator_address, args.num_processes, args.process_id)
        except ValueError as error:  # a malformed flag or no cluster to join: one line, as every refusal
            parser.exit(2, f"jaxfl: error: {error}\n")
        except RuntimeError as error:  # well-formed, but the cluster did not come together (a join timeout)
            parser.exit(2, f"jaxfl: error: {error}\n")
    if args.resume:
        if args.preset is not None:
            parser.exit(2, f"jaxfl: error: --preset {args.preset} is not allowed with --resume: the run keeps "
                           "the config it was started with\n")
        return _resume(parser, args)
    comparison_data = contextlib.ExitStack()
    try:
        configs = configs if configs is not None else _configs(args)
        for folder in dict.fromkeys(config.output_dir for config in configs):
            check_output_folder("--output-dir" if args.output_dir is not None else "output_dir", folder)
        from jaxfl.experiment import check_buildable, run_experiment, shared_data
        from jaxfl.user_inputs import UserInputs, load_time_per_step

        times = None
        if args.time_per_step is not None:
            times = load_time_per_step(args.time_per_step)
        elif args.config and _is_run_record(args.config):
            drawing = [name for name in ("heterogeneity", "speed_mean", "speed_ratio", "speed_change_prob")
                       if _given(args, name, getattr(args, name, None))]
            times = _speeds_of_run_record(args.config, drawing)
        if times is not None:
            for config in configs:
                UserInputs(time_per_step=times).check(config)
        if len(configs) > 1:  # data, partition and model checks before any run writes a file
            if not configs[0].timing_only:
                from jaxfl.comparison import check_plotting, share_compilations_until_exit

                check_plotting()
                share_compilations_until_exit()  # the runs train the same programs: compile them once
            comparison_data.enter_context(shared_data())  # the data checked here is the runs' data
            for config in configs:  # (one run checks them itself before writing, without building twice)
                check_buildable(config)
        from jaxfl import stopping

        results = []
        names = [config.algorithm for config in configs]
        stopped = []  # the comparison's runs that a numerical error stopped: it goes on, then exits 1

        def comparison_words(position: int) -> str:  # SIGTERM ending the process at once (a cluster run's)
            import jax

            everywhere = " (on every process, with the cluster flags)" if jax.process_count() > 1 else ""
            return (f"the comparison {','.join(names)}: finished: {', '.join(names[:position]) or 'none'}; not run: "
                    f"{', '.join(names[position + 1:]) or 'none'}; comparison.csv not written: "
                    f"{shlex.join(['jaxfl', *argv])}{everywhere} goes on (finished runs reused, the cut one resumed) "
                    "and writes it")

        for position, config in enumerate(configs):
            try:
                if len(configs) > 1:  # the same comparison again goes on: finished runs reused, a cut one resumed
                    from jaxfl.comparison import run_or_stopped

                    with stopping.said_on_sigterm(functools.partial(comparison_words, position)):
                        # one algorithm diverged (a numerical error, said as a note): the others run, the table lists it
                        result = run_or_stopped(functools.partial(_comparison_run, times=times, log_to=args.log_to),
                                                config)
                else:
                    _note_interrupted_runs(config, times)
                    result = run_experiment(config, time_per_step=times, loggers=args.log_to)
                # what the comparison reads of a run, kept alone and counted finished at once (a Ctrl-C
                # while the rest is freed, which takes a moment, named it cut): the result's model,
                # engine and simulation go now, not once every run is over, so that the next run's
                # memory (and its peak_host_memory_mb) is its own
                reused = " (reused: it had finished)" if isinstance(result, _FinishedRun) else ""
                results.append(_FinishedRun(result.run_dir, result.summary))
                result = results[-1]
                summary = result.summary
                # stopped as by a numerical error (RunStopped's negative time, evaluation grid too), now or when reused
                from jaxfl.comparison import STOPPED_REASONS

                if summary["stop_reason"].startswith(STOPPED_REASONS):
                    stopped.append(config.algorithm)
                print(_run_line(summary, result.run_dir, config.timing_only) + reused)
            except KeyboardInterrupt as interrupt:
                if len(configs) > 1:  # what is finished, what was cut, what never ran, and how to go on
                    raise _ComparisonInterrupted(interrupt, configs, position, results, argv) from None
                raise
    except DiskWriteError as error:  # a full disk: not bad input; the run keeps its earlier checkpoints
        parser.exit(CHECKPOINT_WRITE_STATUS, f"jaxfl: error: {error}\n")
    except PeerLost as error:  # at once: jax's shutdown would wait minutes for the lost process's heartbeat
        sys.stdout.flush()
        sys.stderr.write(f"jaxfl: error: {error}\n")
        sys.stderr.flush()
        os._exit(1)
    except (ConfigError, ValueError, FileNotFoundError, ImportError, ResourceError) as error:
        _exit_on_error(parser, error)
    except NumericalError as error:  # the run directory keeps everything logged until then
        parser.exit(1, f"jaxfl: run stopped: {error}\n")
    except Exception as error:  # a bug in a plug-in's policy or hook, a model's code: named, status 1
        _raise_unless_yours(error)
        _exit_on_error(parser, error)
    finally:
        comparison_data.close()
    if len(results) > 1 and not configs[0].timing_only:
        _print_comparison(results, configs[0].output_dir, argv)
    elif len(results) > 1:  # said, not silently skipped: the README's comparison writes a table
        print("timing-only runs evaluate no model: no comparison.csv or accuracy plot; their schedules side by "
              "side, mean ± std over seeds: jaxfl sweep --timing-only ... then jaxfl report SWEEP_DIR")
    if stopped:  # as one run that a numerical error stopped: status 1
        listed = "" if configs[0].timing_only else f"; the comparison lists {'them' if len(stopped) > 1 else 'it'}"
        why = "the stop_reason of their summary.json files says why" if len(stopped) > 1 else \
            "the stop_reason of its summary.json says why"
        print(f"jaxfl: {', '.join(stopped)} stopped early ({why}){listed}",
              file=sys.stderr)
        return 1
    return 0


def _timing_line(summary: dict, run_dir: str) -> str:
    """One line on a timing-only run: its schedule's shape and how fast it was simulated. The mean
    staleness is the aggregated updates' at aggregation (the summary's ``timeline.staleness_histogram``),
    "–" where nothing was aggregated; the events are those the simulation took from its queue
    (arrivals, replies, crashes, timers; a dispatch is none), as ``timeline.events`` counts them.

    >>> print(_timing_line({"algorithm": "fedbuff", "global_updates": 0, "virtual_time": 0.01, "stop_reason": "time budget",
    ...                     "events_per_second": 0.0, "timeline": {"staleness_histogram": {}, "events": 0,
    ...                     "aggregations_per_virtual_hour": 0.0, "utilisation": {"mean": 0.1}}}, "runs/x"))
    fedbuff (timing only): 0 updates in 0.01 virtual s (0/virtual h), mean staleness –, utilisation 10.0%, 0 queue events (arrivals, replies, crashes, timers) at 0 events/s, stop: time budget → runs/x
    """
    timeline = summary["timeline"]
    histogram = {int(s): n for s, n in timeline["staleness_histogram"].items()}
    total = sum(histogram.values())
    staleness = f"{sum(s * n for s, n in histogram.items()) / total:.2f}" if total else "–"
    rate = timeline["aggregations_per_virtual_hour"]  # None for a run of 0 virtual seconds, as utilisation
    busy = timeline["utilisation"]["mean"]
    return (f"{summary['algorithm']} (timing only): {summary['global_updates']} updates in "
            f"{summary['virtual_time']:.3g} virtual s ({'–' if rate is None else f'{rate:.0f}'}/virtual h), "
            f"mean staleness {staleness}, utilisation {'–' if busy is None else f'{busy:.1%}'}, "
            f"{timeline['events']:,} queue events (arrivals, replies, crashes, timers) at "
            f"{summary['events_per_second']:,.0f} events/s, stop: {summary['stop_reason']} → {run_dir}")


if __name__ == "__main__":
    sys.exit(main())
