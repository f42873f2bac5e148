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
    jaxfl timeline runs/fedcompass-mnist10k-exp-c10-s0     # who trained when, and the aggregations
    jaxfl partition --dataset fashion_mnist --partition class --clients 10 --out plots  # the split
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import re
import os
import shlex
import sys

from jaxfl import algorithms
from jaxfl.config import (FIELDS, SECTION_OF, SECTIONS, ConfigError, RunConfig, config_from_mapping,
                          load_config_file, option_namespaces, split_algorithm_options)
from jaxfl.engine import NumericalError

_HELP = {
    "algorithm": "a registered algorithm ({names}) or module:Class; a comma-separated list runs each and compares",
    "dataset": "mnist10k (embedded), fashion_mnist (Debian), mnist / npz / array_record (--data-dir), digits "
               "(scikit-learn), tfds:NAME (e.g. tfds:cifar10; --data-dir), synthetic, synthetic_iid, synthetic:A,B",
    "model": "cnn, mlp, logreg, lenet5, ccfedavg_cnn, ccfedavg_mlp, fedasmu_cnn, resnet18, resnet18_gn, textcnn, "
             "lstm, or a name added with jaxfl.models.register_model",
    "clients": "number of clients m",
    "partition": "iid, dirichlet_client (--client-sizes), dirichlet (--dirichlet-alpha), class, dual_dirichlet "
                 "(FedCompass), label_shards (--shards-per-client), gamma_mix (--gamma, CC-FedAvg), natural",
    "heterogeneity": "client speed model: homo, normal, exp, pareto or zipf",
    "speed_mean": "mean time per local step μ in virtual seconds",
    "local_steps": "local steps Q per dispatch",
    "client_lr": "client learning rate",
    "max_time": "budget in virtual seconds (inf for none)",
    "max_updates": "budget in global updates",
    "target_accuracy": "held-out accuracy whose first crossing is reported as time to target",
    "stop_at_target": "stop a run once it reaches the target accuracy",
    "rule": "paper (the original papers; FedBuff's default) or fedcompass (the FedCompass authors' framework, "
            "p_i-weighted; FedAsync's default)",
    "concurrency": "clients in flight for FedAsync/FedBuff (default: --clients-per-round, else min(clients, 1000))",
    "batching": "defer dispatches and train the in-flight work together (--no-batching: one at a time)",
    "output_dir": "folder that receives one run directory per run",
}
_ALIASES = {"client_lr": ["--lr"], "output_dir": ["--out"], "local_steps": ["--steps"]}


def _parse_value(annotation: str, text: str):
    if text.lower() in ("none", "null") and "None" in annotation:
        return None
    if annotation.startswith("int"):
        return int(text)
    if annotation.startswith("float"):
        return math.inf if text.lower() in ("inf", "infinity") else float(text)
    return text


def _value_parser(name: str, annotation: str | None = None):
    annotation = annotation or FIELDS[name].type

    def parse(text: str):
        try:
            return _parse_value(annotation, text)
        except ValueError:
            kind = "an integer" if annotation.startswith("int") else "a number"
            raise argparse.ArgumentTypeError(f"--{name.replace('_', '-')}={text!r} is not {kind}") from None

    return parse


def _add_flag(group, flags: list[str], dest: str, annotation: str, help_text: str, parse=None) -> None:
    """One flag: ``--x/--no-x`` for a bool field, else a value parsed by the field's annotation."""
    if annotation.startswith("bool"):
        group.add_argument(*flags, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
    else:
        group.add_argument(*flags, dest=dest, type=parse or _value_parser(dest, annotation), default=None,
                           metavar=dest.rpartition(".")[2].upper(), help=help_text)


def _option_flags(run: argparse.ArgumentParser) -> None:
    """One flag per option of every registered algorithm, in the options' namespace (dest ``space.field``)."""
    for space, owners in option_namespaces().items():
        cls = algorithms.get(owners[0]).Options
        group = run.add_argument_group(f"{', '.join(owners)} options")
        aliases = {field: alias for alias, field in cls.aliases.items()}
        comments = _field_comments(cls)
        for field in dataclasses.fields(cls):
            flag = field.name.replace("_", "-")
            flags = [f"--{space}.{flag}", f"--{space}-{flag}"]
            if field.name in aliases:
                flags += [f"--{space}.{aliases[field.name]}", f"--{space}-{aliases[field.name]}"]
            dest = f"{space}.{field.name}"
            preset_fields = next(iter(cls.presets.values()), {})
            default = "the preset's" if field.default is None and field.name in preset_fields else field.default
            _add_flag(group, flags, dest, field.type, f"{comments.get(field.name, '')} (default: {default})")


def _field_comments(cls) -> dict[str, str]:
    """The ``# comment`` after each field of a dataclass's source: its one-line help (empty if none)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # defined interactively
        return {}
    found = re.findall(r"^\s+(\w+):[^#\n]*#\s*(.+)$", source, flags=re.MULTILINE)
    return {name: text.strip().replace("%", "%%") for name, text in found}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxfl", description="JAX-native federated-learning simulator")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one experiment (or several algorithms side by side)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--config", help="JSON or TOML file of config fields (flags override it)")
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="continue the run in RUN_DIR from its newest checkpoint (other flags are ignored "
                          "except --progress/--no-progress)")
    groups = {section: run.add_argument_group(f"{section} ({cls.__doc__.splitlines()[0].rstrip('.')})")
              for section, cls in SECTIONS.items()}
    groups[None] = run.add_argument_group("run and output")
    cluster = run.add_argument_group("cluster (a run over several processes or hosts: jaxfl.cluster)")
    cluster.add_argument("--cluster", action="store_true",
                         help="join a run of several processes described by the environment (SLURM's srun, "
                              "Open MPI, JAX_COORDINATOR_ADDRESS...)")
    cluster.add_argument("--coordinator-address", metavar="HOST:PORT",
                         help="address of process 0's coordinator service, the same for every process")
    cluster.add_argument("--num-processes", type=int, metavar="N", help="processes in the run")
    cluster.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0 to N-1")
    comments = {name: text for cls in (*SECTIONS.values(), RunConfig) for name, text in _field_comments(cls).items()}
    for name, field in FIELDS.items():
        if name == "algorithm_options":  # one flag per option instead (_option_flags)
            continue
        flags = [f"--{name.replace('_', '-')}"] + _ALIASES.get(name, [])
        described = _HELP.get(name, comments.get(name, name.replace("_", " "))).replace(
            "{names}", ", ".join(algorithms.names()))
        help_text = f"{described} (default: {field.default})"
        _add_flag(groups[SECTION_OF.get(name)], flags, name, field.type, help_text,
                  parse=str if name == "algorithm" else None)
    _option_flags(run)
    commands.add_parser("demo", usage="jaxfl demo [jaxfl run flags]", help="the quickstart: sync, async and semi-async algorithms on MNIST, non-IID, "
                                     "heterogeneous speeds (under a minute on a CPU)",
                        description=_DEMO_DESCRIPTION + "\n\n" + _demo_command([]),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    listing = commands.add_parser("algorithms", help="the registered algorithms: name, kind, options")
    listing.add_argument("--algorithm", action="append", default=[], metavar="MODULE:CLASS",
                         help="also list an algorithm defined outside jaxfl")
    timeline = commands.add_parser("timeline", help="Gantt chart of a finished run: busy/idle clients, aggregations")
    timeline.add_argument("run_dir", help="a run directory written by `jaxfl run`")
    timeline.add_argument("--out", help="PNG to write (default: RUN_DIR/timeline.png)")
    timeline.add_argument("--max-time", type=float, help="show virtual time up to this many seconds")
    split = commands.add_parser("partition", help="how a dataset splits over clients: table and class heatmap")
    for name in _PARTITION_FLAGS:
        split.add_argument(f"--{name.replace('_', '-')}", dest=name, type=_value_parser(name), default=None,
                           metavar=name.upper(), help=f"{_HELP.get(name, name.replace('_', ' '))} "
                                                      f"(default: {FIELDS[name].default})")
    split.add_argument("--out", help="folder for the heatmap PNG (default: the run output folder, runs)")
    split.add_argument("--max-rows", type=int, default=40, help="client rows printed (default: 40)")
    return parser


_DEMO_DESCRIPTION = ("Runs the quickstart experiment (jaxfl/presets/quickstart.toml) as the `jaxfl run` command\n"
                     "below, which it prints first. Flags after `jaxfl demo` are `jaxfl run` flags: they are added\n"
                     "to the command and override its settings (jaxfl demo --seed 1).")


def _demo_command(extra: list[str]) -> str:
    """The `jaxfl run` command that `jaxfl demo` runs, wrapped as a shell would take it."""
    from jaxfl.presets import preset_argv

    flags = [*preset_argv("quickstart"), *extra]
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
    from jaxfl.presets import preset_argv

    print(f"jaxfl demo runs:\n{_demo_command(extra)}\n", flush=True)
    return main(["run", *preset_argv("quickstart"), *extra])


_PARTITION_FLAGS = ("dataset", "data_dir", "partition", "clients", "seed", "dirichlet_alpha", "client_sizes",
                    "size_skew", "shards_per_client", "gamma")


def _partition(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``jaxfl partition``: print the per-client table of a split and save its class heatmap."""
    values = {name: getattr(args, name) for name in _PARTITION_FLAGS if getattr(args, name) is not None}
    try:
        # The split does not depend on the algorithm; fedavg has no buffer to check against the clients.
        config = config_from_mapping({**values, "algorithm": "fedavg"})
        from jaxfl.data.report import partition_report, plot_class_heatmap
        from jaxfl.experiment import build_data

        _, federation = build_data(config)
    except (ConfigError, ValueError, FileNotFoundError, ImportError) as error:
        parser.exit(2, f"jaxfl: error: {error}\n")
    title = f"{config.dataset}, {config.partition}, {config.clients} clients, seed {config.seed}"
    report = partition_report(federation, title)
    print(report.table(args.max_rows))
    out = args.out or config.output_dir
    stem = f"partition-{config.dataset}-{config.partition}-c{config.clients}-s{config.seed}"
    stem = "".join(c if c.isalnum() or c in "-_.," else "_" for c in stem)
    os.makedirs(out, exist_ok=True)
    print(f"class heatmap: {plot_class_heatmap(report, os.path.join(out, stem + '.png'))}")
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
        print(f"{name:<{width}}  {cls.kind:<17}  {cls.summary}")
        if options:
            print(f"{'':<{width}}  {'':<17}  options: {options}")
    return 0


def _timeline(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from jaxfl.runlog import event_log_format

    if event_log_format(args.run_dir) is None:
        parser.exit(2, f"jaxfl: error: run_dir={args.run_dir!r} holds no event log (not a run directory)\n")
    if args.max_time is not None and not args.max_time > 0:
        parser.exit(2, f"jaxfl: error: --max-time={args.max_time} is not allowed: virtual seconds > 0\n")
    from jaxfl.plot import plot_timeline

    print(plot_timeline(args.run_dir, args.out or os.path.join(args.run_dir, "timeline.png"), args.max_time))
    return 0


def _resume(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from jaxfl.experiment import resume_experiment

    try:
        result = resume_experiment(args.resume, progress=args.progress)
    except (ConfigError, ValueError, FileNotFoundError) as error:
        parser.exit(2, f"jaxfl: error: {error}\n")
    except NumericalError as error:
        parser.exit(1, f"jaxfl: run stopped: {error}\n")
    print(f"{result.summary['algorithm']}: resumed, {result.summary['global_updates']} updates, "
          f"stop: {result.summary['stop_reason']} → {result.run_dir}")
    return 0


def _configs(args: argparse.Namespace) -> list[RunConfig]:
    """One validated config per algorithm of ``--algorithm``; each gets only its own options."""
    values = {key: value for key, value in vars(args).items()
              if value is not None and (key in FIELDS or "." in key)}
    file_values = load_config_file(args.config) if args.config else {}
    fields, options = split_algorithm_options({**file_values, **values})
    names = str(fields.pop("algorithm", RunConfig.algorithm))
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
            raise ConfigError(f"options --{space}.* are given but no chosen algorithm ({names}) reads them")
    table = fields.pop("algorithm_options", None)
    # Validate every config before the first run starts: a typo in the third fails at once.
    return [config_from_mapping({**fields, "algorithm": name,
                                 "algorithm_options": {**(table or {}), **options.get(spaces[name], {})}
                                 if (table or spaces[name] in options) else None})
            for name in chosen]


def _print_comparison(results, output_dir: str) -> None:
    """The comparison table, then where the table, the plot and the run directories are."""
    from jaxfl.comparison import format_table, write_comparison

    comparison = write_comparison(results, output_dir)
    print("\n" + format_table(comparison.rows, results[0].summary["target_accuracy"]))
    print(f"table (CSV): {comparison.table}")
    print(f"plot of accuracy over virtual time: {comparison.plot}")
    print("run directories:\n" + "\n".join(f"  {run_dir}" for run_dir in comparison.run_dirs))


def _import_named_algorithms(argv: list[str]) -> None:
    """Register ``module:Class`` algorithms named on the command line first, so their options get flags."""
    for index, token in enumerate(argv):
        value = argv[index + 1] if token == "--algorithm" and index + 1 < len(argv) else \
            token.partition("=")[2] if token.startswith("--algorithm=") else ""
        for name in value.split(","):
            if ":" in name:
                try:
                    algorithms.get(name.strip())
                except KeyError:
                    pass  # reported by validation with the registered names


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _import_named_algorithms(argv)
    if argv[:1] == ["demo"] and not {"-h", "--help"} & set(argv[1:]):
        return _demo(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "timeline":
        return _timeline(parser, args)
    if args.command == "algorithms":
        return _algorithms(parser, args)
    if args.command == "partition":
        return _partition(parser, args)
    if args.cluster or args.coordinator_address or args.num_processes is not None or args.process_id is not None:
        from jaxfl.cluster import init_cluster

        try:
            init_cluster(args.coordinator_address, args.num_processes, args.process_id)
        except (ValueError, RuntimeError) as error:
            parser.error(str(error))
    if args.resume:
        return _resume(parser, args)
    try:
        configs = _configs(args)
        from jaxfl.experiment import prepare, run_experiment

        if len(configs) > 1:  # data, partition and model checks before any run writes a file
            if not configs[0].timing_only:
                from jaxfl.comparison import check_plotting, share_compilations_until_exit

                check_plotting()
                share_compilations_until_exit()  # the runs train the same programs: compile them once
            for config in configs:  # (one run checks them itself before writing, without building twice)
                prepare(config)
        results = []
        for config in configs:
            result = run_experiment(config)
            summary = result.summary
            if config.timing_only:
                print(_timing_line(summary, result.run_dir))
                results.append(result)
                continue
            reached = "not reached" if summary["time_to_target"] is None else \
                f"{summary['time_to_target']:.1f} virtual s"
            print(f"{summary['algorithm']}: best accuracy {summary['best_accuracy']:.4f}, target "
                  f"{config.target_accuracy:.0%} {reached}, {summary['global_updates']} updates, "
                  f"stop: {summary['stop_reason']} → {result.run_dir}")
            results.append(result)
    except (ConfigError, ValueError, FileNotFoundError, ImportError) as error:
        parser.exit(2, f"jaxfl: error: {error}\n")
    except NumericalError as error:  # the run directory keeps everything logged until then
        parser.exit(1, f"jaxfl: run stopped: {error}\n")
    if len(results) > 1 and not configs[0].timing_only:
        _print_comparison(results, configs[0].output_dir)
    return 0


def _timing_line(summary: dict, run_dir: str) -> str:
    """One line on a timing-only run: its schedule's shape and how fast it was simulated."""
    timeline = summary["timeline"]
    histogram = {int(s): n for s, n in timeline["staleness_histogram"].items()}
    total = sum(histogram.values())
    mean_staleness = sum(s * n for s, n in histogram.items()) / total if total else 0.0
    return (f"{summary['algorithm']} (timing only): {summary['global_updates']} updates in "
            f"{summary['virtual_time']:.1f} virtual s ({timeline['aggregations_per_virtual_hour']:.0f}/virtual h), "
            f"mean staleness {mean_staleness:.2f}, utilisation {timeline['utilisation']['mean']:.1%}, "
            f"{timeline['events']} events at {summary['events_per_second']:,.0f} events/s, "
            f"stop: {summary['stop_reason']} → {run_dir}")


if __name__ == "__main__":
    sys.exit(main())
