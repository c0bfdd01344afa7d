"""The config is validated at load, errors name the key, and everything can be overridden."""

from __future__ import annotations

import pytest

from callgrove.orchestrator.config import (
    ConfigError,
    config_from_dict,
    load_config,
    parse_override,
    resolve,
    to_toml,
)


def test_unknown_keys_and_wrong_types_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"dispatch\.group_sise: unknown key"):
        config_from_dict({"dispatch": {"group_sise": 4}})
    with pytest.raises(ConfigError, match=r"unknown key"):
        config_from_dict({"dispach": {}})
    with pytest.raises(ConfigError, match=r"run\.steps: Expected `int`, got `str`"):
        config_from_dict({"run": {"steps": "many"}})
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nsteps=1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"train: objective must be one of \('rl', 'sft'\)"):
        load_config(None, {"train.objective": "rlhf"})
    with pytest.raises(ConfigError, match=r"train: batching must be one of \('tree', 'packed'\)"):
        config_from_dict({"train": {"batching": "rowwise"}})
    with pytest.raises(ConfigError, match="max_in_flight"):
        resolve(config_from_dict({"dispatch": {"max_in_flight": 2, "group_size": 4}}), (3,))


def test_overrides_and_round_trip(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[run]\nsteps = 3\n[algorithm]\nname = "grpo"\n')
    config = load_config(
        path,
        dict(
            parse_override(text)
            for text in [
                "run.steps=7",
                "dispatch.group_size=2",
                "env.name=copy",
                "algorithm.local_seats=[]",
            ]
        ),
    )
    assert (config.run.steps, config.dispatch.group_size, config.env.name) == (7, 2, "copy")
    assert config.algorithm.name == "grpo" and config.algorithm.local_seats == []
    again = tmp_path / "again.toml"
    again.write_text(to_toml(config))
    assert load_config(again) == config
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_override("steps")
