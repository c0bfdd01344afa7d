"""The gateway in front of the session's real vLLM server of SmolLM2 (`tests/conftest.py`):
`--upstream-model` names what it serves, `--upstream-processed-logprobs` says its logprobs are
of the distribution it sampled, and in both modes (the gateway renders the chat, or vLLM does
with `--passthrough`) the recorded calls carry the server's token ids and logprobs that a
teacher-forced Hugging Face forward of the same weights gives, and pass `callgrove check`."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import numpy as np
import pytest
import torch

from callgrove.episode import load
from callgrove.sampling.distribution import sampling_distribution

from .helpers import SRC, server_process

# One worker runs every vLLM test, so `pytest -n 2` starts one session server, not two.
pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm")]
QUESTION = "What is 2 + 3?"
REQUEST = {"model": "anything", "max_tokens": 24, "temperature": 0.7, "top_p": 0.9}


def teacher_forced(model, prompt, completion, sampling: dict) -> np.ndarray:
    ids = torch.as_tensor(np.concatenate([prompt, completion]), dtype=torch.long)[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()
    n = len(completion)
    targets = torch.as_tensor(np.asarray(completion), dtype=torch.long)
    keep = torch.zeros_like(logits, dtype=torch.bool)
    keep[torch.arange(n), targets] = True
    logp = sampling_distribution(
        logits,
        torch.full((n,), float(sampling["temperature"])),
        torch.full((n,), float(sampling["top_p"])),
        keep=keep,
    )
    return logp[torch.arange(n), targets].numpy()


def gateway_args(url: str, ledger, folder, *more: str) -> tuple[str, ...]:
    return (
        *("gateway", "--upstream", url, "--ledger", str(ledger), "--model", f"hf:{folder}"),
        *more,
    )


@pytest.mark.parametrize("passthrough", [False, True], ids=["rendered", "passthrough"])
def test_the_gateway_records_vllm_calls_token_exact(
    tmp_path, vllm_url, smollm2_folder, passthrough
):
    from callgrove.networks.hf import load_model

    ledger = tmp_path / "ledger"
    mode = ("--passthrough",) if passthrough else ()
    args = gateway_args(vllm_url, ledger, smollm2_folder, "--upstream-model", "policy", *mode)
    with (
        server_process(*args, "--upstream-processed-logprobs", timeout=300) as (_, gateway),
        httpx.Client(base_url=gateway, timeout=300) as client,
    ):
        turn = [{"role": "user", "content": QUESTION}]
        first = client.post("/e/vllm/v1/chat/completions", json={**REQUEST, "messages": turn})
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]["content"]
        turn += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And 4 + 4?"},
        ]
        second = client.post("/e/vllm/v1/chat/completions", json={**REQUEST, "messages": turn})
        assert second.status_code == 200, second.text
        closed = client.post("/e/vllm/close", json={"rewards": {"answer": 1.0}})
        assert closed.status_code == 200, closed.text

    torch.set_num_threads(2)
    model, tokenizer = load_model(f"hf:{smollm2_folder}")
    (episode,) = load(ledger / "episodes.jsonl")
    calls = episode.agents[0].calls
    assert len(calls) == 2
    for call, reply in zip(calls, (first, second), strict=True):
        assert call.sampling["temperature"] == 0.7 and call.sampling["top_p"] == 0.9
        completion = call.completion_ids
        assert len(call.logprobs) == len(completion) > 0
        text = tokenizer.decode(completion, skip_special_tokens=True)
        assert text.strip() == reply.json()["choices"][0]["message"]["content"].strip()
        want = teacher_forced(model, episode.prompt_ids(call), completion, call.sampling)
        np.testing.assert_allclose(call.logprobs, want, rtol=0, atol=1e-4)
    assert QUESTION in tokenizer.decode(episode.prompt_ids(calls[0]))
    episodes = str(ledger / "episodes.jsonl")
    checked = subprocess.run(
        [sys.executable, "-c", "from callgrove.cli import main; main()", "check", episodes],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_gateway_asks_for_the_upstream_model_it_is_told(tmp_path, vllm_url, smollm2_folder):
    args = gateway_args(vllm_url, tmp_path / "ledger", smollm2_folder, "--upstream-model", "nope")
    with (
        server_process(*args, timeout=300) as (_, gateway),
        httpx.Client(base_url=gateway, timeout=300) as client,
    ):
        request = {**REQUEST, "temperature": 1.0, "top_p": 1.0}
        turn = [{"role": "user", "content": QUESTION}]
        refused = client.post("/e/x/v1/chat/completions", json={**request, "messages": turn})
    assert refused.status_code == 404 and "nope" in refused.text


def test_the_gateway_records_the_version_the_server_holds(tmp_path, vllm_url, smollm2_folder):
    """A LoRA adapter callgrove's sampler pushed is version N by its name (`latest` asks for
    it); once none is loaded, `latest` is the base model, whose full weights the sampler
    pushed with their version set on the server."""
    import asyncio
    import copy

    from callgrove.networks.hf import load_model
    from callgrove.networks.sizes import LoraSettings
    from callgrove.policy.vllm import VllmSampler
    from callgrove.train.hf_trainer import HFLearner, HFOptions

    model, _ = load_model(f"hf:{smollm2_folder}")
    lora = LoraSettings(rank=8)
    adapters = HFLearner(copy.deepcopy(model), options=HFOptions(lora=lora)).weights()
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    request = {**REQUEST, "temperature": 1.0, "top_p": 1.0}
    turn = [{"role": "user", "content": QUESTION}]
    ledger = tmp_path / "ledger"
    args = gateway_args(vllm_url, ledger, smollm2_folder, "--upstream-model", "latest")
    # The session server may hold adapters earlier tests pushed: `latest` must not find them.
    for entry in httpx.get(vllm_url + "/v1/models", timeout=30).json()["data"]:
        if entry.get("parent"):
            unload = {"lora_name": entry["id"]}
            httpx.post(vllm_url + "/v1/unload_lora_adapter", json=unload, timeout=30)

    async def push(sampler, weights, version):
        try:
            await sampler.load_weights(weights, version)
        finally:
            await sampler.aclose()

    with (
        server_process(*args, timeout=300) as (_, gateway),
        httpx.Client(base_url=gateway, timeout=300) as client,
    ):
        try:
            asyncio.run(push(VllmSampler([vllm_url], lora=lora), adapters, 4))
            on_adapter = client.post("/e/a/v1/chat/completions", json={**request, "messages": turn})
            assert on_adapter.status_code == 200, on_adapter.text
            unloaded = client.post(
                vllm_url + "/v1/unload_lora_adapter", json={"lora_name": "policy-v4"}
            )
            assert unloaded.status_code == 200, unloaded.text
            asyncio.run(push(VllmSampler([vllm_url]), original, 6))
            on_base = client.post("/e/b/v1/chat/completions", json={**request, "messages": turn})
            assert on_base.status_code == 200, on_base.text
        finally:  # later tests find the server's own version again
            httpx.post(vllm_url + "/update_weight_version", json={"new_version": "default"})
            httpx.post(vllm_url + "/v1/unload_lora_adapter", json={"lora_name": "policy-v4"})
        for episode in ("a", "b"):
            assert client.post(f"/e/{episode}/close", json={}).status_code == 200

    recorded = {
        e.id: [c.policy_version for c in e.calls()] for e in load(ledger / "episodes.jsonl")
    }
    assert recorded == {"a": [4], "b": [6]}
    assert on_adapter.headers["x-callgrove-policy-version"] == "4"
    assert on_base.headers["x-callgrove-policy-version"] == "6"
