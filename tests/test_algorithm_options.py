"""Algorithm options: one dataclass per algorithm, reached as algorithm_options in Python, as
--NAMESPACE.option flags (jaxfl 0.1's flat --port-option spelling as an alias), as [NAMESPACE] or
[algorithm] tables in TOML; presets fill what is unset; options of an algorithm that is not run are
refused unless they are that algorithm's defaults (an old flat config dump); the registry feeds the
config, the CLI and `jaxfl algorithms`."""
import json

import pytest

from jaxfl import algorithms
from jaxfl.algorithms import FedCompassConfig, PortConfig
from jaxfl.cli import _configs, build_parser, main
from jaxfl.config import ConfigError, RunConfig, config_from_mapping, validate


def configs(*argv):
    return _configs(build_parser().parse_args(["run", *argv]))


def test_python_mapping_instance_and_preset():
    by_mapping = validate(RunConfig(algorithm="port", algorithm_options={"staleness_bound": 4, "preset": "plato"}))
    by_instance = validate(RunConfig(algorithm="port", algorithm_options=PortConfig(staleness_bound=4, preset="plato")))
    assert by_mapping == by_instance
    options = by_mapping.algorithm_options
    assert options.staleness_bound == 4.0 and options.cosine == "current" and options.replace == "step2"
    assert validate(RunConfig(algorithm="fedcompass")).algorithm_options.latest_time_factor == 1.2
    reference = validate(RunConfig(algorithm="fedcompass_m", algorithm_options={"preset": "reference_code"}))
    assert reference.algorithm_options.latest_time_factor == 1.5 and reference.algorithm_options.lr_decay is True
    with pytest.raises(ConfigError, match="a PortConfig or a mapping"):
        validate(RunConfig(algorithm="port", algorithm_options=FedCompassConfig()))
    with pytest.raises(ConfigError, match="unknown option 'bound' of algorithm 'port'; allowed: .*staleness_bound"):
        validate(RunConfig(algorithm="port", algorithm_options={"bound": 3}))
    with pytest.raises(ConfigError, match="port.staleness_bound='x'.*a number"):
        validate(RunConfig(algorithm="port", algorithm_options={"staleness_bound": "x"}))


def test_cli_namespaced_flags_legacy_aliases_and_per_algorithm_options():
    new, = configs("--algorithm", "port", "--port.staleness-bound", "5", "--port.preset", "plato")
    old, = configs("--algorithm", "port", "--port-staleness-bound", "5", "--port-preset", "plato")
    assert new == old and new.algorithm_options.staleness_bound == 5.0
    compass, = configs("--algorithm", "fedcompass", "--compass.lambda", "1.4", "--compass-q-min", "3")
    assert (compass.algorithm_options.latest_time_factor, compass.algorithm_options.q_min) == (1.4, 3)
    fedavg, port = configs("--algorithm", "fedavg,port", "--port.alpha", "2")  # each run gets its own options
    assert fedavg.algorithm_options == algorithms.get("fedavg").Options() and port.algorithm_options.alpha == 2.0
    with pytest.raises(ConfigError, match="options --port.\\* are given but no chosen algorithm \\(fedavg\\) reads "
                                          "them \\(read only by port\\)"):
        configs("--algorithm", "fedavg", "--port.alpha", "2")


def test_toml_tables_and_old_flat_dumps(tmp_path):
    table = tmp_path / "port.toml"
    table.write_text('algorithm = "port"\nclients = 6\n[port]\nmin_clients = 2\nstaleness_bound = "inf"\n')
    nested = tmp_path / "nested.toml"
    nested.write_text('[algorithm]\nname = "port"\nmin_clients = 2\nstaleness_bound = "inf"\n')
    a, = configs("--config", str(table))
    b, = configs("--config", str(nested), "--clients", "6")
    assert a == b and a.algorithm_options.min_clients == 2 and a.algorithm_options.staleness_bound == float("inf")
    # a flat dump in jaxfl 0.1's names: options of other algorithms at their defaults are ignored
    old = {"algorithm": "fedbuff", "port_alpha": 3.0, "compass_q_min": None, "cc_strategy": "cc", "clients": 4}
    assert config_from_mapping(old).algorithm == "fedbuff"
    with pytest.raises(ConfigError, match="option port.alpha=2.0 belongs to port, not to algorithm 'fedbuff'"):
        config_from_mapping({**old, "port_alpha": 2.0})
    saved = json.loads(json.dumps(validate(RunConfig(algorithm="port")).to_dict()))  # config.json's form
    assert config_from_mapping(saved) == validate(RunConfig(algorithm="port"))


def test_registry_drives_validation_and_the_algorithms_command(capsys):
    with pytest.raises(ConfigError, match="algorithm='fedsgd' is not allowed: unknown algorithm 'fedsgd'; registered: fedavg, fedavgm"):
        validate(RunConfig(algorithm="fedsgd"))
    with pytest.raises(ConfigError, match="could not be imported"):
        validate(RunConfig(algorithm="no_such_module:Algo"))
    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    for name in algorithms.names():
        assert name in out
    assert "--port.staleness-bound" in out and "semi-asynchronous" in out


def test_an_unknown_algorithm_lists_the_registered_ones_once():
    # validate added its own list before the registry's (a sweep cell's misspelt algorithm showed both)
    with pytest.raises(ConfigError) as raised:
        validate(RunConfig(algorithm="fedbuf"))
    message = str(raised.value)
    assert message.startswith("algorithm='fedbuf' is not allowed: unknown algorithm 'fedbuf'; registered: fedavg, ")
    assert message.count("fedbuff") == 1 and message.endswith("(or module:Class, path/to/file.py:Class)")
