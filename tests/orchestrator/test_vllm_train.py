"""`callgrove train` sampling with vLLM (`[model.vllm]`): the session's real server of SmolLM2
(`tests/conftest.py`) samples every call, the learner's new weights are pushed into it after
each step, and step 2 is sampled by version 1, the weights step 1 made. The server's original
weights are put back afterwards."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

# One worker runs every vLLM test, so `pytest -n 2` starts one session server, not two.
pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm")]


def test_callgrove_train_samples_with_vllm_and_pushes_each_step(
    tmp_path, vllm_weights_restored, smollm2_folder, train_cli
):
    vllm_url = vllm_weights_restored
    out = tmp_path / "out"
    config = tmp_path / "train.toml"
    config.write_text(
        f"""
[run]
steps = 2
out = "{out}"
[env]
name = "arithmetic"
[model]
name = "smollm2-135m"
[model.vllm]
urls = ["{vllm_url}"]
[sampling]
max_tokens = 8
temperature = 0.7
top_p = 0.9
[dispatch]
group_size = 4
groups_per_step = 1
max_off_policy_steps = 0
[algorithm]
name = "grpo"
[train]
learning_rate = 1e-4
[degeneracy]
drop = []
[monitor]
live = false
plot = false
"""
    )
    train_cli(config)
    trained = torch.load(out / "checkpoint.pt", weights_only=False)["learner"]["weights"]
    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder)
    greedy = {
        "model": "policy",
        "prompt": tokenizer.encode("What is 7 + 15?", add_special_tokens=False),
        "max_tokens": 8,
        "temperature": 0,
        "return_token_ids": True,
    }
    served = httpx.post(vllm_url + "/v1/completions", json=greedy, timeout=120).json()

    for step in (1, 2):
        lines = (out / f"step_{step}/train/traces.jsonl").read_text().splitlines()
        calls = [c for t in map(json.loads, lines) for a in t["agents"] for c in a["calls"]]
        assert len(calls) == 4
        # Step 2 is sampled by the weights step 1 made, and every call says which sampled it.
        assert {c["policy_version"] for c in calls} == {step - 1}
        assert all(c["sampling"]["temperature"] == 0.7 for c in calls)
    metrics = [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if '"final"' not in line
    ]
    assert [m["policy/version"] for m in metrics] == [1, 2]
    for m in metrics:
        # The learner scores each step's calls with the weights that sampled them: the server
        # held version 1 when it sampled step 2, else this would be far from zero.
        assert m["train/mismatch/on_policy/mean_abs"] < 1e-4
        assert 0 < m["time/weight_push_s"] < 60
    # After the run the server holds the last step's weights: its greedy answer is theirs.
    from callgrove.networks.hf import load_model

    model, _ = load_model("smollm2-135m")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(trained[name])
        ids = np.concatenate([greedy["prompt"], served["choices"][0]["token_ids"]])
        logits = model(input_ids=torch.as_tensor(ids)[None]).logits[0]
    picked = logits[len(greedy["prompt"]) - 1 : -1].argmax(-1).tolist()
    assert picked == served["choices"][0]["token_ids"]
