"""The config is validated at load, errors name the key, and everything can be overridden."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from callgrove.credit import EMABaseline, HierarchicalGRPO
from callgrove.formats.ranges import check_range
from callgrove.orchestrator.config import (
    ConfigError,
    config_from_dict,
    load_config,
    parse_override,
    resolve,
    to_toml,
)
from callgrove.train.settings import LearnerSettings


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
    path.write_text('[run]\nsteps = 3\n[algorithm]\nname = "hierarchical_grpo"\n')
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
    assert isinstance(config.algorithm, HierarchicalGRPO)
    assert config.algorithm.local_seats == frozenset()
    again = tmp_path / "again.toml"
    again.write_text(to_toml(config))
    assert load_config(again) == config
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_override("steps")


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("sampling.temperature", NAN),
        ("sampling.temperature", -0.5),
        ("sampling.top_p", 0.0),
        ("sampling.max_tokens", 0),
        ("train.learning_rate", INF),
        ("train.learning_rate", NAN),
        ("train.weight_decay", -1.0),
        ("train.max_grad_norm", 0.0),
        ("train.entropy_coef", NAN),
        ("train.clip_low", 1.5),
        ("train.seq_len", 0),
        ("model.d_model", 0),
        ("model.n_layers", -1),
        ("model.n_heads", 0),
        ("model.d_ff", 0),
        ("model.max_batch", 0),
        ("dispatch.episode_timeout", 0.0),
        ("dispatch.episode_timeout", NAN),
        ("dispatch.max_off_policy_steps", -1),
        ("run.seed", -1),
        ("run.seed", 2**63),  # torch seeds with 64 signed bits
        ("run.steps", -1),
        ("run.eval_every", -2),
        ("run.eval_repeats", 0),
        ("algorithm.decay", 1.0),  # with algorithm.name = "ema" (below)
        ("algorithm.decay", NAN),
        ("algorithm.std_epsilon", 0.0),
        ("degeneracy.repetition_run", 0),
        ("degeneracy.gibberish_logprob", NAN),
        ("monitor.samples_per_step", -1),
        ("ray.env_workers", 0),
        ("data.rows_per_step", 0),
    ],
)
def test_every_numeric_setting_is_checked_for_its_range_at_load(key, value):
    section, name = key.split(".")
    chosen = {"algorithm.name": "ema"} if name == "decay" else {}
    with pytest.raises(ConfigError, match=rf"{section}: {name} must be .*, not {value!r}"):
        load_config(None, {**chosen, key: value})


@pytest.mark.parametrize(
    ("key", "value", "known"),
    [
        ("algorithm.scope", "galaxy", "seat"),
        ("algorithm.name", "ppo", "grpo"),
        ("run.executor", "slurm", "ray"),
        ("train.tree_scope", "forest", "group"),
        ("train.normalisation", "row", "sequence"),
        ("degeneracy.drop", ["boredom"], "gibberish"),
    ],
)
def test_unknown_choices_are_refused_with_what_is_known(key, value, known):
    with pytest.raises(ConfigError, match=rf"{key.split('.')[0]}: .*{known}.*not"):
        load_config(None, {key: value})


@pytest.mark.parametrize(
    ("algorithm", "key", "value"),
    [
        ("hierarchical_grpo", "scope", "seat"),
        ("grpo", "local_seats", ["helper"]),
        ("grpo", "decay", 0.5),
        ("ema", "scale_by_std", True),
    ],
)
def test_a_setting_the_chosen_algorithm_does_not_read_is_an_error(algorithm, key, value):
    with pytest.raises(ConfigError, match=rf"algorithm\.{key}: not a setting of algorithm"):
        load_config(None, {"algorithm.name": algorithm, f"algorithm.{key}": value})


def test_the_saved_config_holds_the_chosen_algorithm_and_its_settings_only():
    config = load_config(None, {"algorithm.name": "ema", "algorithm.decay": 0.5})
    assert config.algorithm == EMABaseline(decay=0.5)
    saved = to_toml(config)
    section = saved.split("[algorithm]\n")[1].split("\n\n")[0]
    assert section.splitlines() == ['name = "ema"', "decay = 0.5"]  # no other algorithm's keys
    assert load_config(None, {"algorithm.name": "ema"}).algorithm.decay == 0.9  # one default


def test_a_run_refuses_one_seed_for_every_call():
    with pytest.raises(ConfigError, match=r"sampling\.seed: a run seeds its sampler"):
        load_config(None, {"sampling.seed": 3})


def test_model_errors_say_what_is_accepted():
    with pytest.raises(ConfigError, match=r"heads of even width"):
        load_config(None, {"model.d_model": 30, "model.n_heads": 4})
    with pytest.raises(ConfigError, match=r"hub ids .* are not fetched"):
        load_config(None, {"model.name": "HuggingFaceTB/SmolLM2-135M"})


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_checked_float_is_finite_and_inside_its_bounds(value):
    try:
        check_range("x", value, above=0.0, at_most=1.0)
    except ValueError as error:
        assert "x must be a finite number > 0.0 and <= 1.0" in str(error)
        assert not (math.isfinite(value) and 0.0 < value <= 1.0)
    else:
        assert math.isfinite(value) and 0.0 < value <= 1.0


# A config read where importing torch fails as it does when torch is not installed.
WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None
from callgrove.orchestrator.config import ConfigError, load_config
print(load_config(None).train.learning_rate)
try:
    load_config(None, {"sampling.temperature": float("nan")})
except ConfigError as error:
    print(error)
"""


def test_configs_load_without_torch():
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    default, refused = done.stdout.strip().splitlines()
    assert float(default) == LearnerSettings().learning_rate
    assert "sampling: temperature must be a finite number >= 0, not nan" in refused


def test_a_config_that_is_not_utf8_is_named_not_a_traceback(tmp_path):
    path = tmp_path / "c.toml"
    path.write_bytes(b"[run]\nsteps = 1\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"c.toml: not valid TOML: not UTF-8 text"):
        load_config(path)


@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_run_out_is_refused_not_the_current_folder(out):
    with pytest.raises(ConfigError, match="run: out must name a folder"):
        load_config(None, {"run.out": out})
