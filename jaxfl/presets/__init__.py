"""Named experiments shipped with jaxfl: TOML config files that ``jaxfl demo`` and
``jaxfl run --config`` read.

``quickstart`` is the README's first command (``jaxfl demo``): synchronous, asynchronous and
semi-asynchronous algorithms on the embedded MNIST data under a non-IID split and heterogeneous
client speeds, in well under a minute on a laptop CPU.

>>> names()
['quickstart']
>>> "fedasync" in preset_values("quickstart")["algorithm"].split(",")
True
"""
from __future__ import annotations

import os

from jaxfl.config import SECTIONS, RunConfig, config_from_mapping, load_config_file

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
        raise ValueError(f"preset={name!r} is not allowed: one of {', '.join(names())}")
    return os.path.join(PRESETS_DIR, name + ".toml")


def preset_values(name: str) -> dict:
    """The preset's fields as one flat mapping (its TOML tables such as ``[client]`` merged).

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
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    return argv


def preset_configs(name: str, **overrides) -> list[RunConfig]:
    """One validated :class:`~jaxfl.config.RunConfig` per algorithm of the preset, with
    ``overrides`` (any config field) applied; :func:`jaxfl.comparison.compare` runs them.

    >>> [config.algorithm for config in preset_configs("quickstart", output_dir="/tmp/q")][:2]
    ['fedavg', 'fedavgm']
    """
    from jaxfl import algorithms as registry
    from jaxfl.config import fields_not_read_by

    values = {**preset_values(name), **overrides}
    chosen = [algorithm.strip() for algorithm in str(values.pop("algorithm")).split(",")]
    # as `jaxfl run` does: an algorithm-specific field goes to the algorithms that read it
    return [config_from_mapping({**{key: value for key, value in values.items()
                                    if key not in fields_not_read_by(registry.get(algorithm), values)},
                                 "algorithm": algorithm}) for algorithm in chosen]
