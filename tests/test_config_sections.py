"""RunConfig nests: data, speeds, faults, client, server, budget, engine (and the algorithm's options).
Flat keywords and attributes reach the same fields; JSON/TOML take section tables or flat names."""
import dataclasses
import json

import pytest

from jaxfl.config import (FIELDS, SECTION_OF, SECTIONS, ClientConfig, ConfigError, DataConfig, RunConfig,
                          config_from_mapping, load_config_text, to_toml, validate)


def test_sections_and_flat_names_are_one_config():
    nested = RunConfig(algorithm="fedavg", data=DataConfig(clients=5, model="mlp"), client=ClientConfig(local_steps=7))
    flat = RunConfig(algorithm="fedavg", clients=5, model="mlp", local_steps=7)
    assert nested == flat
    assert (flat.data.clients, flat.clients, flat.client.local_steps, flat.local_steps) == (5, 5, 7, 7)
    assert dataclasses.replace(flat, batch_size=8).client == ClientConfig(local_steps=7, batch_size=8)
    assert RunConfig(data={"clients": 3}).data == DataConfig(clients=3)
    # every leaf field lives in exactly one place
    assert len(FIELDS) == sum(len(dataclasses.fields(cls)) for cls in SECTIONS.values()) + \
        len([f for f in dataclasses.fields(RunConfig) if f.name not in SECTIONS])
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['clinets'\\]"):
        RunConfig(clinets=3)
    with pytest.raises(TypeError, match="data= takes a DataConfig"):
        RunConfig(data=ClientConfig())
    with pytest.raises(AttributeError, match="no field 'nothing'"):
        RunConfig().nothing


def test_json_and_toml_sections_round_trip_and_flat_files_still_load():
    config = validate(RunConfig(algorithm="port", clients=6, local_steps=4, max_time=float("inf"), max_updates=9,
                                algorithm_options={"min_clients": 2}))
    saved = config.to_dict()
    assert saved["data"]["clients"] == 6 and saved["client"]["local_steps"] == 4
    assert config_from_mapping(json.loads(json.dumps(saved))) == config
    text = to_toml(config)
    assert "[client]" in text and "[algorithm_options]" in text and "max_time = inf" in text
    assert config_from_mapping(load_config_text(text, ".toml")) == config
    flat = {name: getattr(config, name) for name in FIELDS if name != "algorithm_options"}
    assert config_from_mapping({**flat, "algorithm_options": {"min_clients": 2}}) == config
    with pytest.raises(ConfigError, match="unknown field 'local_steps' in section \\[data\\]; allowed: dataset"):
        config_from_mapping({"data": {"local_steps": 3}})
    assert SECTION_OF["local_steps"] == "client" and SECTION_OF["round_timeout"] == "faults"
