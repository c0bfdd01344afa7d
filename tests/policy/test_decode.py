"""KV-cache decoding: what a batch samples is what the full forward says, sequence by sequence."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from callgrove.chat import CharFormat
from callgrove.episode import sampling_record
from callgrove.networks.sizes import TinyConfig
from callgrove.networks.tiny import TinyDecoder, VarlenLayout
from callgrove.policy import SamplingParams
from callgrove.policy.batching import LocalSampler
from callgrove.policy.decode import DecodeRequest, decode
from callgrove.sampling.distribution import sampling_distribution

CONFIG = TinyConfig(vocab_size=24, d_model=16, n_heads=2, n_layers=2, d_ff=32)


def model(seed: int = 0) -> TinyDecoder:
    torch.manual_seed(seed)
    return TinyDecoder(CONFIG).double()


def full_logprobs(
    net: TinyDecoder, tokens: np.ndarray, temperature: float, top_p: float, top_k: int = 0
):
    """Each token's log-probability under the whole-sequence forward, after temperature, top-k
    (0: none) and top-p."""
    ids = torch.as_tensor(tokens, dtype=torch.long)
    logits = net(ids, torch.arange(len(ids)), VarlenLayout([0, len(ids)]))
    n = len(ids) - 1
    logp = sampling_distribution(
        logits[:-1],
        torch.full((n,), temperature),
        torch.full((n,), top_p),
        torch.full((n,), top_k),
    )
    return logp.gather(1, ids[1:, None])[:, 0].detach().numpy()


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(1.0, 1.0, None), (0.7, 0.9, None), (0.0, 1.0, None), (1.2, 0.95, 3)],
)
def test_batched_cached_decoding_matches_the_full_forward(temperature, top_p, top_k):
    net = model()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 24, n).astype(np.int32) for n in (3, 9, 1, 6)]
    params = SamplingParams(max_tokens=7, temperature=temperature, top_p=top_p, top_k=top_k)
    requests = [DecodeRequest(p, params) for p in prompts]
    out = decode(net, requests, torch.Generator().manual_seed(1))
    for prompt, result in zip(prompts, out, strict=True):
        assert len(result.completion_ids) == 7 and not result.stopped
        whole = np.concatenate([prompt, result.completion_ids])
        expected = full_logprobs(net, whole, temperature, top_p, top_k or 0)[len(prompt) - 1 :]
        np.testing.assert_allclose(result.logprobs, expected, atol=1e-9)
        assert np.all(np.isfinite(result.logprobs))


def test_stop_tokens_and_max_tokens_end_each_sequence_on_its_own():
    net = model()
    greedy = decode(
        net,
        [DecodeRequest(np.array([1, 2, 3]), SamplingParams(max_tokens=6, temperature=0.0))],
        torch.Generator(),
    )
    stop = int(greedy[0].completion_ids[2])
    requests = [
        DecodeRequest(
            np.array([1, 2, 3]),
            SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=(stop,)),
        ),
        DecodeRequest(np.array([1, 2, 3]), SamplingParams(max_tokens=2, temperature=0.0)),
    ]
    stopped, short = decode(net, requests, torch.Generator())
    first_stop = list(greedy[0].completion_ids).index(stop)
    assert stopped.stopped and list(stopped.completion_ids) == list(
        greedy[0].completion_ids[: first_stop + 1]
    )
    assert not short.stopped and list(short.completion_ids) == list(greedy[0].completion_ids[:2])
    np.testing.assert_allclose(stopped.logprobs, 0.0)  # greedy: all mass on the argmax


def letters(ids) -> str:
    """A text for every token: one letter each."""
    return "".join(chr(ord("a") + int(i)) for i in ids)


def test_stop_strings_end_a_sequence_on_the_token_that_completes_them():
    net = model()
    prompt = np.array([1, 2, 3])
    greedy = decode(
        net,
        [DecodeRequest(prompt, SamplingParams(max_tokens=8, temperature=0.0))],
        torch.Generator(),
    )[0]
    text = letters(greedy.completion_ids)
    stop = text[2:4]  # two tokens: it is complete only once the second is sampled
    end = text.index(stop) + len(stop)
    requests = [
        DecodeRequest(prompt, SamplingParams(max_tokens=8, temperature=0.0, stop=("zzzz", stop))),
        DecodeRequest(
            prompt, SamplingParams(max_tokens=8, temperature=0.0, stop=("zzzz",))
        ),  # never met
        DecodeRequest(prompt, SamplingParams(max_tokens=8, temperature=0.0)),
    ]
    stopped, unmet, plain = decode(net, requests, torch.Generator(), text_of=letters)
    assert stopped.stopped and letters(stopped.completion_ids) == text[:end]
    np.testing.assert_allclose(stopped.logprobs, greedy.logprobs[:end])
    assert not unmet.stopped and letters(unmet.completion_ids) == text
    assert not plain.stopped and letters(plain.completion_ids) == text
    with pytest.raises(ValueError, match="text_of"):
        decode(net, requests[:1], torch.Generator())


def test_local_sampler_with_a_chat_formats_text_takes_stop_strings():
    chat = CharFormat("abcdefghijklmnopqrst")
    net = model()
    sampler = LocalSampler(net, seed=0, text_of=chat.text_of)
    prompt = np.array([1, 5, 6])
    greedy = decode(
        net,
        [DecodeRequest(prompt, SamplingParams(max_tokens=6, temperature=0.0))],
        torch.Generator(),
    )[0]
    text = chat.text_of(greedy.completion_ids)
    stop = text[1:3]
    params = SamplingParams(max_tokens=6, temperature=0.0, stop=(stop,))
    sample = asyncio.run(sampler.sample(prompt, params))
    assert sample.finish_reason == "stop"
    assert chat.text_of(sample.completion_ids) == text[: text.index(stop) + len(stop)]


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    logp = sampling_distribution(
        logits, torch.tensor([1.0]), torch.tensor([0.8], dtype=torch.float64)
    )
    np.testing.assert_allclose(logp.exp().numpy()[0], [0.625, 0.375, 0, 0], atol=1e-12)


def test_seeded_requests_repeat_and_draws_follow_the_distribution():
    net = model()
    seeded = DecodeRequest(np.array([5, 6]), SamplingParams(max_tokens=5, seed=42))
    a = decode(
        net,
        [seeded, DecodeRequest(np.array([1]), SamplingParams(max_tokens=5))],
        torch.Generator().manual_seed(0),
    )
    b = decode(
        net,
        [DecodeRequest(np.array([2, 2, 2]), SamplingParams(max_tokens=3)), seeded],
        torch.Generator().manual_seed(9),
    )
    assert list(a[0].completion_ids) == list(b[1].completion_ids)
    # Frequencies of the first token over many draws match its probabilities.
    many = decode(
        net,
        [DecodeRequest(np.array([4]), SamplingParams(max_tokens=1))] * 4000,
        torch.Generator().manual_seed(3),
    )
    counts = np.bincount([int(r.completion_ids[0]) for r in many], minlength=24) / 4000
    ids = torch.tensor([4])
    with torch.no_grad():
        row = torch.softmax(net(ids, torch.arange(1), VarlenLayout([0, 1]))[0], -1).numpy()
    assert np.abs(counts - row).max() < 0.03


def test_a_sample_records_the_distribution_it_was_drawn_from_top_k_included():
    sampler = LocalSampler(model().float(), seed=0)
    params = SamplingParams(max_tokens=4, temperature=0.8, top_p=0.9, top_k=2)
    sample = asyncio.run(sampler.sample(np.array([3, 4]), params))
    assert sample.sampling == sampling_record(0.8, 0.9, 2) == params.record()
    logp = model()(torch.tensor([3, 4]), torch.arange(2), VarlenLayout([0, 2]))[-1:]
    first = int(sample.completion_ids[0])  # among the two most likely after the prompt
    assert first in logp.topk(2, dim=-1).indices[0].tolist()


def test_local_sampler_batches_concurrent_calls_and_versions_them():
    sampler = LocalSampler(model().float(), seed=0)
    params = SamplingParams(max_tokens=3)

    async def go():
        first = await asyncio.gather(*[sampler.sample(np.array([1, 2]), params) for _ in range(5)])
        await sampler.load_weights(model(1).float().state_dict(), 1)
        second = await sampler.sample(np.array([1, 2]), params)
        return first, second

    first, second = asyncio.run(go())
    assert sampler.rounds == 2 and sampler.calls == 6
    assert {s.policy_version for s in first} == {0} and second.policy_version == 1
    assert all(s.finish_reason == "length" and len(s.completion_ids) == 3 for s in first)
    with pytest.raises(ValueError, match="stop_token_ids"):
        asyncio.run(sampler.sample(np.array([1]), SamplingParams(stop=("x",))))


def test_a_round_decodes_off_the_event_loop_and_new_weights_wait_for_the_next_round():
    """While a round decodes, the event loop runs on (a step's learner is not kept waiting by
    it), and weights loaded meanwhile stage: the round in flight ends on the weights it began
    with and its version; the next round starts on the new ones."""
    import threading
    import time

    class SlowSampler(LocalSampler):
        def __init__(self, model):
            super().__init__(model, seed=0)
            self.started = threading.Event()
            self.seen: list[float] = []

        def decode(self, requests):
            self.seen.append(float(self.model.embed.weight.detach().sum()))
            self.started.set()
            time.sleep(0.5)
            return super().decode(requests)

    old, new = model().float(), model(1).float()
    sums = [float(m.embed.weight.detach().sum()) for m in (old, new)]
    sampler = SlowSampler(old)  # loading writes the new weights into `old`
    params = SamplingParams(max_tokens=2)

    async def go():
        first = asyncio.create_task(sampler.sample(np.array([1, 2]), params))
        while not sampler.started.is_set():
            await asyncio.sleep(0.01)
        ticks = 0
        loaded = time.perf_counter()
        await sampler.load_weights(new.state_dict(), 1)
        load_seconds = time.perf_counter() - loaded
        while not first.done():  # the loop is free while the round decodes
            ticks += 1
            await asyncio.sleep(0.01)
        second = await sampler.sample(np.array([1, 2]), params)
        return await first, second, ticks, load_seconds

    first, second, ticks, load_seconds = asyncio.run(go())
    assert load_seconds < 0.25 and ticks >= 10
    assert (first.policy_version, second.policy_version, sampler.version) == (0, 1, 1)
    assert sampler.seen == sums and sums[0] != sums[1]
    with pytest.raises(ValueError, match="lack"):
        asyncio.run(sampler.load_weights({"embed.weight": new.embed.weight}, 2))
