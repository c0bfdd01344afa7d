"""The HF sampler: batched KV-cache decoding whose logprobs are the model's own (teacher-forced),
the same completion alone or batched, temperature 0 and top-p as stated, stop tokens and stop
strings, and new weights after each optimizer step."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
import pytest
import torch

from callgrove.policy import SamplingParams, TrainableSampler
from callgrove.policy.decode import DecodeRequest
from callgrove.policy.hf import HFSampler
from callgrove.policy.hf_decode import hf_decode
from callgrove.train import packed_model_batch, row_logprobs
from callgrove.train.hf_trainer import HFLearner
from callgrove.train.settings import LearnerSettings
from train.helpers import VOCAB, tiny_llama

pytestmark = pytest.mark.hf

ALPHABET = "".join(chr(ord("0") + i) for i in range(VOCAB))


class CharTokenizer:
    """One character per token id: enough of a tokenizer to tell stop strings."""

    pad_token_id = 0

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(ALPHABET[i] for i in ids)


PROMPTS = [np.array(p, dtype=np.int32) for p in ([5, 6, 7, 8, 9], [3], [10, 11, 12])]


def sampler(seed: int = 0) -> HFSampler:
    return HFSampler(tiny_llama(torch.float32, "sdpa").model, CharTokenizer(), seed)


async def sample_all(policy, prompts, params):
    return await asyncio.gather(*(policy.sample(p, params) for p in prompts))


def teacher_forced(model, prompt, completion) -> np.ndarray:
    """Logprobs of the completion tokens from one forward over prompt + completion."""
    tokens = np.concatenate([prompt, completion])
    mask = np.zeros(len(tokens), dtype=np.uint8)
    mask[len(prompt) :] = 1
    batch = packed_model_batch(tokens, np.array([0, len(tokens)]), mask)
    with torch.no_grad():
        (logprobs,) = row_logprobs(model, batch)
    return logprobs[len(prompt) :].numpy()


def test_sampled_logprobs_are_the_models_own_in_a_batch_of_ragged_prompts():
    policy = sampler()
    assert isinstance(policy, TrainableSampler)
    samples = asyncio.run(sample_all(policy, PROMPTS, SamplingParams(max_tokens=12)))
    assert policy.rounds == 1  # the three calls decoded together
    model = tiny_llama(torch.float32, "sdpa")  # the same weights, seen through the trainer
    for prompt, sample in zip(PROMPTS, samples, strict=True):
        assert len(sample.completion_ids) == 12 and sample.finish_reason == "length"
        want = teacher_forced(model, prompt, sample.completion_ids)
        np.testing.assert_allclose(sample.logprobs, want, atol=2e-5)


def test_a_seeded_call_samples_the_same_alone_or_batched():
    params = SamplingParams(max_tokens=10, seed=7, temperature=0.8, top_p=0.9)
    alone = asyncio.run(sample_all(sampler(), PROMPTS[:1], params))[0]
    batched = asyncio.run(sample_all(sampler(seed=3), PROMPTS, params))[0]
    assert alone.completion_ids.tolist() == batched.completion_ids.tolist()
    np.testing.assert_allclose(alone.logprobs, batched.logprobs, atol=1e-6)


def next_token_logprobs(model, prompt, completion) -> torch.Tensor:
    """(completion length, vocab): the model's full next-token distribution before each
    completion token."""
    tokens = np.concatenate([prompt, completion])
    batch = packed_model_batch(tokens, np.array([0, len(tokens)]), np.zeros(len(tokens), np.uint8))
    with torch.no_grad():
        logits = model(batch.token_ids, batch.position_ids, batch.layout)
    return torch.log_softmax(logits[len(prompt) - 1 : -1].double(), dim=-1)


PREFIX = [20, 21, 22, 23, 24, 25]
# A group's calls repeat a prompt; the prompts share a prefix (a chat template's system turn) and
# differ after it in length, so the prefill pads between the prefix and a prompt's own tokens.
SHARING = [np.array(PREFIX + own, dtype=np.int32) for own in ([30], [31, 32, 33], [30], [30])]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_prompts_sharing_a_prefix_or_repeated_sample_the_models_own_logprobs(attention):
    model = tiny_llama(torch.float32, attention)
    params = SamplingParams(max_tokens=8)  # untempered: what `teacher_forced` scores
    seeded = [msgspec.structs.replace(params, seed=i) for i in range(len(SHARING))]
    requests = [DecodeRequest(p, s) for p, s in zip(SHARING, seeded, strict=True)]
    together = hf_decode(model.model, CharTokenizer(), requests, torch.Generator())
    for request, sample in zip(requests, together, strict=True):
        want = teacher_forced(model, request.prompt_ids, sample.completion_ids)
        np.testing.assert_allclose(sample.logprobs, want, atol=2e-5)
        (alone,) = hf_decode(model.model, CharTokenizer(), [request], torch.Generator())
        assert alone.completion_ids.tolist() == sample.completion_ids.tolist()
        np.testing.assert_allclose(alone.logprobs, sample.logprobs, atol=1e-6)


def test_the_prefill_forwards_a_repeated_prompt_and_the_common_prefix_once():
    model = tiny_llama(torch.float32, "sdpa").model
    forwarded = []
    model.get_input_embeddings().register_forward_hook(
        lambda _module, inputs, _output: forwarded.append(inputs[0].numel())
    )
    prompts = [np.array(PREFIX + own, dtype=np.int32) for own in ([30, 31], [32, 33], [30, 31])]
    one_token = SamplingParams(max_tokens=1)  # the prefill is the whole round
    hf_decode(
        model, CharTokenizer(), [DecodeRequest(p, one_token) for p in prompts], torch.Generator()
    )
    distinct_own_tokens = 2 * 2
    assert sum(forwarded) == len(PREFIX) + distinct_own_tokens


def test_temperature_zero_is_greedy_and_top_p_cuts_the_tail():
    policy, model = sampler(), tiny_llama(torch.float32, "sdpa")
    (greedy,) = asyncio.run(sample_all(policy, PROMPTS[:1], SamplingParams(8, temperature=0)))
    assert np.all(greedy.logprobs == 0.0)
    full = next_token_logprobs(model, PROMPTS[0], greedy.completion_ids)
    assert full.argmax(dim=-1).tolist() == greedy.completion_ids.tolist()

    top_p = 0.05
    samples = asyncio.run(sample_all(policy, PROMPTS, SamplingParams(8, top_p=top_p)))
    for prompt, sample in zip(PROMPTS, samples, strict=True):
        full = next_token_logprobs(model, prompt, sample.completion_ids)
        probs, _ = full.exp().sort(dim=-1, descending=True)
        kept = ((probs.cumsum(-1) - probs) < top_p).sum(-1)  # the nucleus, largest first
        kept_mass = torch.stack([probs[i, :k].sum() for i, k in enumerate(kept.tolist())])
        picked = full.gather(1, torch.as_tensor(sample.completion_ids, dtype=torch.long)[:, None])
        rank = (full > picked).sum(-1)
        assert bool((rank < kept).all())  # nothing outside the nucleus
        want = picked[:, 0] - kept_mass.log()  # renormalised over the nucleus
        np.testing.assert_allclose(sample.logprobs, want.numpy(), atol=2e-5)


def test_stop_tokens_and_stop_strings_end_sampling_and_are_kept():
    model = tiny_llama(torch.float32, "sdpa").model
    generator = torch.Generator().manual_seed(0)
    (free,) = hf_decode(
        model,
        CharTokenizer(),
        [DecodeRequest(PROMPTS[0], SamplingParams(max_tokens=12, seed=1))],
        generator,
    )
    stop_token = int(free.completion_ids[3])
    first = free.completion_ids.tolist().index(stop_token)
    text = CharTokenizer().decode(free.completion_ids.tolist())
    stop_string = text[4:6]
    requests = [
        DecodeRequest(
            PROMPTS[0], SamplingParams(max_tokens=12, seed=1, stop_token_ids=(stop_token,))
        ),
        DecodeRequest(PROMPTS[0], SamplingParams(max_tokens=12, seed=1, stop=(stop_string,))),
    ]
    by_token, by_string = hf_decode(model, CharTokenizer(), requests, generator)
    assert (
        by_token.stopped
        and by_token.completion_ids.tolist() == free.completion_ids[: first + 1].tolist()
    )
    end = text.index(stop_string) + len(stop_string)
    assert (
        by_string.stopped
        and by_string.completion_ids.tolist() == free.completion_ids[:end].tolist()
    )
    np.testing.assert_allclose(by_string.logprobs, free.logprobs[:end], atol=1e-6)


def test_the_sampler_uses_the_learners_weights_after_each_step():
    learner = HFLearner(tiny_llama(torch.float32, "sdpa").model, LearnerSettings(learning_rate=0.1))
    policy = sampler()
    with torch.no_grad():
        for p in learner.hf_model.parameters():
            p.add_(0.05)  # as an optimizer step would
    params = SamplingParams(max_tokens=6, seed=5)
    (before,) = asyncio.run(sample_all(policy, PROMPTS[:1], params))
    asyncio.run(policy.load_weights(learner.weights(), 1))
    (after,) = asyncio.run(sample_all(policy, PROMPTS[:1], params))
    assert before.policy_version == 0 and after.policy_version == policy.version == 1
    want = teacher_forced(learner.model, PROMPTS[0], after.completion_ids)
    np.testing.assert_allclose(after.logprobs, want, atol=2e-5)
    with pytest.raises(ValueError, match="lacks"):
        asyncio.run(policy.load_weights({"no.such.weight": torch.zeros(1)}, 2))


def test_a_lora_learners_adapters_fold_into_the_samplers_plain_copy():
    from peft.tuners.lora import LoraLayer

    from callgrove.networks.sizes import LoraSettings
    from callgrove.policy.hf import FoldedLora
    from callgrove.train.hf_trainer import HFOptions

    learner = HFLearner(
        tiny_llama(torch.float32, "sdpa").model,
        LearnerSettings(),
        HFOptions(LoraSettings(rank=4)),
    )
    policy = HFSampler(learner.hf_model, CharTokenizer(), 0, lora=FoldedLora(learner.hf_model))
    assert not any(isinstance(m, LoraLayer) for m in policy.model.modules())
    params = SamplingParams(max_tokens=6, seed=5)
    for version in (1, 2):  # each step's adapters folded from the base weights afresh
        with torch.no_grad():
            for p in learner.hf_model.parameters():
                if p.requires_grad:
                    p.normal_(0, 0.3, generator=torch.Generator().manual_seed(version))
        asyncio.run(policy.load_weights(learner.weights(), version))
        (sample,) = asyncio.run(sample_all(policy, PROMPTS[:1], params))
        want = teacher_forced(learner.model, PROMPTS[0], sample.completion_ids)
        np.testing.assert_allclose(sample.logprobs, want, atol=2e-5)
    with pytest.raises(ValueError, match="lacks"):
        asyncio.run(policy.load_weights({"model.embed_tokens.weight": torch.zeros(1)}, 3))
