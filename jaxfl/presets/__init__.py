"""Named experiments shipped with jaxfl: TOML config files that ``jaxfl run --preset NAME``,
``jaxfl demo`` and ``jaxfl run --config`` read.

``quickstart`` is the README's first command (``jaxfl demo``): synchronous, asynchronous and
semi-asynchronous algorithms on the embedded MNIST data under a non-IID split and heterogeneous
client speeds, in about 15 s on a 2-core CPU.

The paper presets, ``<paper>-<dataset>``, are each seed paper's main experiment: FedCompass (Li et
al., ICLR 2024), PORT (Su & Li, IEEE IWQoS 2022), CC-FedAvg (Zhang et al., 2024) and FedASMU (Liu et
al., AAAI 2024). A paper preset fixes the setting (data, model, clients, local training,
heterogeneity, budget, target) and runs the paper's method; another ``algorithm`` runs the paper's
baselines in the same setting. Settings that only some algorithms read (FedBuff's ``buffer_size``,
a ``[port]`` options table...) apply to the algorithms that read them and are left out for the
others, so one preset serves the method and its baselines. Overrides (keywords here, flags on the
command line) win over the preset.

>>> names()
['ccfedavg-cifar10', 'ccfedavg-fmnist', 'fedasmu-cifar10', 'fedasmu-fmnist', 'fedcompass-cifar10', 'fedcompass-mnist', 'port-cifar10', 'port-mnist', 'quickstart']
>>> "fedasync" in preset_values("quickstart")["algorithm"].split(",")
True
"""
from __future__ import annotations

import os

import dataclasses

from jaxfl.config import (SECTIONS, ConfigError, RunConfig, config_from_mapping, fields_not_read_by,
                          load_config_file, split_algorithm_options)

PRESETS_DIR = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
    """The shipped presets (the TOML files in this package).

    >>> "quickstart" in names()
    True
    """
    return sorted(name[:-5] for name in os.listdir(PRESETS_DIR) if name.endswith(".toml"))


def preset_path(name: str) -> str:
    """The TOML file of preset ``name`` (a ``--config`` file for ``jaxfl run``).

    >>> os.path.basename(preset_path("quickstart"))
    'quickstart.toml'
    """
    if name not in names():
        raise ConfigError(f"preset={name!r} is not allowed: one of {', '.join(names())}")
    return os.path.join(PRESETS_DIR, name + ".toml")


def preset_values(name: str) -> dict:
    """The preset's fields as one flat mapping (its TOML tables such as ``[client]`` merged; an
    algorithm's options table such as ``[port]`` stays a table).

    >>> preset_values("quickstart")["dataset"]
    'mnist10k'
    """
    values = {}
    for key, value in load_config_file(preset_path(name)).items():
        if key in SECTIONS and isinstance(value, dict):
            values.update(value)
        else:
            values[key] = value
    return values


def preset_argv(name: str) -> list[str]:
    """The ``jaxfl run`` flags that run the preset, every setting spelled out (``jaxfl demo``
    prints them, so the researcher sees the experiment and can change any part of it).

    >>> preset_argv("quickstart")[:2]
    ['--algorithm', 'fedavg,fedavgm,fedasync,fedbuff,fedcompass']
    """
    argv = []
    for key, value in preset_values(name).items():
        items = [(f"{key}.{option}", item) for option, item in value.items()] if isinstance(value, dict) \
            else [(key, value)]
        for flag_name, item in items:
            flag = "--" + flag_name.replace("_", "-")
            if isinstance(item, bool):
                argv.append(flag if item else "--no-" + flag[2:])
            elif isinstance(item, list):  # per-channel statistics: 0.49,0.48,0.45
                argv += [flag, ",".join(str(element) for element in item)]
            else:
                argv += [flag, str(item)]
    return argv


def preset_for_algorithm(name: str, algorithm: str, values: dict | None = None) -> tuple[dict, dict, list[str]]:
    """``(fields, options, left_out)``: preset ``name``'s run fields and ``algorithm``'s options table
    as they apply to ``algorithm``, and the preset settings left out because ``algorithm`` never
    reads them (the paper's baselines' settings when the method runs, and the reverse).
    ``values``: the preset's :func:`preset_values`, if already read (one read for several algorithms).

    >>> fields, options, left_out = preset_for_algorithm("port-mnist", "fedbuff")  # FedAsync's staleness exponent
    >>> fields["buffer_size"], options, left_out
    (5, {}, ['staleness_a', '[port] options'])
    >>> preset_for_algorithm("port-mnist", "port")[1]["min_clients"]
    5
    """
    from jaxfl import algorithms as registry

    fields, options = split_algorithm_options(preset_values(name) if values is None else values)
    fields.pop("algorithm", None)
    try:
        cls = registry.get(algorithm)
    except KeyError as error:
        raise ConfigError(f"algorithm={algorithm!r} is not allowed: {error.args[0]}") from None
    left_out = fields_not_read_by(cls, fields)
    own = options.pop(cls.option_namespace(), {})
    left_out += [f"[{space}] options" for space in options]
    return {key: value for key, value in fields.items() if key not in left_out}, own, left_out


def preset_config(name: str, **overrides) -> RunConfig:
    """The validated :class:`~jaxfl.config.RunConfig` of a one-algorithm preset, with ``overrides``
    (any config field; ``algorithm_options`` as a mapping is merged over the preset's options
    table) applied: as ``jaxfl run --preset NAME --flag value``. ``algorithm=`` runs another
    algorithm in the paper's setting (its baselines).

    >>> config = preset_config("fedcompass-mnist", clients=5, max_updates=2)
    >>> config.algorithm, config.model, config.clients, config.local_steps, config.algorithm_options.latest_time_factor
    ('fedcompass', 'cnn', 5, 200, 1.2)
    >>> preset_config("fedcompass-mnist", algorithm="fedbuff").rule  # FedCompass's baselines: its authors' rules
    'fedcompass'
    """
    algorithm = str(overrides.get("algorithm") or preset_values(name)["algorithm"])
    if "," in algorithm:
        raise ConfigError(f"algorithm={algorithm!r} is not allowed in preset_config: one algorithm "
                          f"(preset_configs({name!r}) gives one config per algorithm)")
    fields, options, _ = preset_for_algorithm(name, algorithm)
    given = overrides.get("algorithm_options")
    if given is None or isinstance(given, dict):
        options = {**options, **(given or {})}
    elif dataclasses.is_dataclass(given):  # an Options instance replaces the preset's table
        options = given
    return config_from_mapping({**fields, **overrides, "algorithm": algorithm, "algorithm_options": options or None})


def preset_configs(name: str, **overrides) -> list[RunConfig]:
    """One validated :class:`~jaxfl.config.RunConfig` per algorithm of the preset, with
    ``overrides`` (any config field) applied; :func:`jaxfl.comparison.compare` runs them.

    >>> [config.algorithm for config in preset_configs("quickstart", output_dir="/tmp/q")][:2]
    ['fedavg', 'fedavgm']
    """
    from jaxfl import algorithms as registry

    chosen = [algorithm.strip() for algorithm in
              str(overrides.pop("algorithm", None) or preset_values(name)["algorithm"]).split(",")]
    if len(chosen) == 1:
        return [preset_config(name, algorithm=chosen[0], **overrides)]
    # as `jaxfl run` does: an algorithm-specific field goes to the algorithms that read it
    return [preset_config(name, algorithm=algorithm,
                          **{key: value for key, value in overrides.items()
                             if key not in fields_not_read_by(registry.get(algorithm), overrides)})
            for algorithm in chosen]
