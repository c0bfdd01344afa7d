"""`[model.vllm]` is checked where the config is read (no server needed): settings that cannot
apply are errors naming the key, and a missing vLLM interpreter says how to get one."""

from __future__ import annotations

import pytest

from callgrove.orchestrator.config import ConfigError, config_from_dict, to_toml
from callgrove.orchestrator.learning import policy_backend


def config(model: dict, **sections):
    return config_from_dict({"model": model, **sections})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "tiny", "vllm": {}}, "vLLM serves Hugging Face checkpoints"),
        ({"name": "smollm2-135m", "vllm": {"servers": 0}}, "servers"),
        ({"name": "smollm2-135m", "vllm": {"kv_cache_gb": 0}}, "kv_cache_gb"),
        ({"name": "smollm2-135m", "vllm": {"served_model": ""}}, "served_model"),
        ({"name": "smollm2-135m", "vllm": {"dtype": "fp8"}}, "dtype"),
        ({"name": "smollm2-135m", "vllm": {"urls": ["localhost:8000"]}}, "not an http"),
        ({"name": "smollm2-135m", "vllm": {"gpu": True}}, "model.vllm.gpu: unknown key"),
        (
            {"name": "smollm2-135m", "vllm": {"urls": ["http://h:1"], "servers": 2}},
            "servers: settings of servers callgrove starts",
        ),
        (
            {"name": "smollm2-135m", "vllm": {"urls": ["http://h:1"], "extra_args": ["-x"]}},
            "extra_args: settings of servers callgrove starts",
        ),
    ],
)
def test_settings_that_cannot_apply_are_config_errors(raw, message):
    with pytest.raises(ConfigError, match=message):
        config(raw)


def test_vllm_sampling_with_a_run_that_samples_nothing_is_refused():
    with pytest.raises(ConfigError, match="sft run samples nothing"):
        config({"name": "smollm2-135m", "vllm": {}}, train={"objective": "sft"})


def test_vllm_sampling_runs_on_ray():
    ray = config({"name": "smollm2-135m", "vllm": {}}, run={"executor": "ray"})
    assert ray.run.executor == "ray" and ray.model.kind == "vllm"


@pytest.mark.parametrize("restarts", [-1, 11, 2.5])
def test_restarts_are_bounded(restarts):
    with pytest.raises(ConfigError, match="restarts"):
        config({"name": "smollm2-135m", "vllm": {"restarts": restarts}})


def test_restarts_apply_to_started_servers_only():
    with pytest.raises(ConfigError, match="restarts: settings of servers callgrove starts"):
        config({"name": "smollm2-135m", "vllm": {"urls": ["http://h:1"], "restarts": 0}})
    assert config({"name": "smollm2-135m", "vllm": {"restarts": 0}}).model.vllm.restarts == 0


def test_the_settings_round_trip_through_the_written_config():
    import tomllib

    given = config({"name": "smollm2-135m", "vllm": {"urls": ["http://127.0.0.1:8000"]}})
    again = config_from_dict(tomllib.loads(to_toml(given)))
    assert again.model.vllm == given.model.vllm
    assert again.model.vllm.urls == ["http://127.0.0.1:8000"]
    assert config({"name": "smollm2-135m"}).model.kind == "hf"  # no [model.vllm]: sampled here


@pytest.mark.hf
def test_a_missing_vllm_interpreter_says_how_to_get_one(tmp_path):
    missing = tmp_path / "no-venv" / "bin" / "python"
    raw = {"name": "smollm2-135m", "vllm": {"python": str(missing)}}
    with pytest.raises(ConfigError, match="make vllm"):
        policy_backend(config(raw))


@pytest.mark.hf
def test_with_vllm_sampling_the_hf_backend_keeps_no_sampler_of_its_own():
    """vLLM servers sample: no in-process sampler (a copy of the model) is built beside them."""
    import gc

    from callgrove.models import open_model
    from callgrove.policy.hf import HFSampler
    from callgrove.policy.vllm import VllmSampler

    run = config({"name": "smollm2-135m", "vllm": {"urls": ["http://127.0.0.1:9"]}})
    backend = open_model(run.model, learner=run.train)
    assert isinstance(backend.sampler, VllmSampler)
    gc.collect()
    assert not any(isinstance(o, HFSampler) for o in gc.get_objects())
