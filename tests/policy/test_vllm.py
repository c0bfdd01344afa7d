"""vLLM as the sampler, against the real server of SmolLM2-135M-Instruct (`tests/conftest.py`
starts it once per session): what it samples is the teacher-forced distribution of the same
weights, new weights (full, or a LoRA adapter) reach it between calls and never under one, and
a server that dies fails its calls with an error naming it."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import numpy as np
import pytest
import torch

from callgrove.episode import sampling_record
from callgrove.policy import SamplingParams
from callgrove.policy.http import UpstreamError
from callgrove.policy.vllm import (
    VllmError,
    VllmSampler,
    free_port,
    start_servers,
    vllm_sampler,
)
from callgrove.sampling.distribution import sampling_distribution

# One worker runs every vLLM test, so `pytest -n 2` starts one session server, not two.
pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm")]
END = 2  # SmolLM2's <|im_end|>
LORA_RANK = 8  # at most the session server's --max-lora-rank
QUESTIONS = ("What is 2 + 3?", "Name a colour.", "Say hello in French.")


@pytest.fixture(scope="module")
def smollm2():
    from callgrove.networks.hf import load_model

    torch.set_num_threads(2)
    model, tokenizer = load_model("smollm2-135m")
    return model.eval(), tokenizer


def prompt_ids(tokenizer, question: str) -> np.ndarray:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return np.asarray(tokenizer.encode(text, add_special_tokens=False), dtype=np.int32)


def teacher_forced(model, prompt, completion, temperature: float, top_p: float) -> np.ndarray:
    """Each completion token's log-probability under (temperature, top_p) of `model`."""
    ids = torch.as_tensor(np.concatenate([prompt, completion]), dtype=torch.long)[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()
    targets = torch.as_tensor(np.asarray(completion), dtype=torch.long)
    n = len(targets)
    keep = torch.zeros_like(logits, dtype=torch.bool)
    keep[torch.arange(n), targets] = True
    logp = sampling_distribution(
        logits, torch.full((n,), temperature), torch.full((n,), top_p), keep=keep
    )
    return logp[torch.arange(n), targets].numpy()


def greedy_of(model, prompt, completion) -> np.ndarray:
    """What `model` picks greedily at each completion position, teacher-forced."""
    ids = torch.as_tensor(np.concatenate([prompt, completion]), dtype=torch.long)[None]
    with torch.no_grad():
        return model(input_ids=ids).logits[0, len(prompt) - 1 : -1].argmax(-1).numpy()


def test_samples_carry_the_logprobs_of_the_distribution_they_were_drawn_from(vllm_url, smollm2):
    model, tokenizer = smollm2
    sampler = VllmSampler([vllm_url], seed=3)
    params = SamplingParams(max_tokens=24, temperature=0.7, top_p=0.9, stop_token_ids=(END,))
    prompts = [prompt_ids(tokenizer, q) for q in QUESTIONS for _ in range(2)]

    async def sample_all():
        try:
            return await asyncio.gather(*(sampler.sample(p, params) for p in prompts))
        finally:
            await sampler.aclose()

    samples = asyncio.run(sample_all())
    tokens = 0
    largest_untempered_gap = 0.0
    for prompt, sample in zip(prompts, samples, strict=True):
        assert sample.policy_version == 0
        assert sample.sampling == sampling_record(0.7, 0.9)
        assert len(sample.logprobs) == len(sample.completion_ids) > 0
        want = teacher_forced(model, prompt, sample.completion_ids, 0.7, 0.9)
        np.testing.assert_allclose(sample.logprobs, want, rtol=0, atol=1e-4)
        untempered = teacher_forced(model, prompt, sample.completion_ids, 1.0, 1.0)
        largest_untempered_gap = max(largest_untempered_gap, np.abs(untempered - want).max())
        tokens += len(sample.completion_ids)
    assert tokens > 40
    # The check above can tell: the untempered logprobs (vLLM's default) are far from these.
    assert largest_untempered_gap > 0.05
    # Two draws of one prompt are two draws (each call gets its own seed from the run's).
    assert any(
        not np.array_equal(a.completion_ids, b.completion_ids)
        for a, b in zip(samples[::2], samples[1::2], strict=True)
    )


def finishing_times(finished: dict[str, float]):
    """`timed(name, work)`: await `work`, noting when it finished under `name`."""

    async def timed(name, work):
        result = await work
        finished[name] = time.monotonic()
        return result

    return timed


def perturbed(model, scale: float, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: p.detach() + scale * p.detach().std() * torch.randn(p.shape, generator=generator)
        for name, p in model.named_parameters()
    }


def test_new_weights_reach_the_server_between_calls_never_under_one(vllm_url, smollm2):
    model, tokenizer = smollm2
    prompt = prompt_ids(tokenizer, QUESTIONS[0])
    greedy = SamplingParams(max_tokens=12, temperature=0)
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    changed = perturbed(model, 0.3, seed=0)
    finished: dict[str, float] = {}
    timed = finishing_times(finished)

    async def scenario():
        sampler = VllmSampler([vllm_url])
        try:
            before = await sampler.sample(prompt, greedy)
            long = SamplingParams(max_tokens=40, temperature=0)
            running = [
                asyncio.create_task(timed(f"old{i}", sampler.sample(prompt, long)))
                for i in range(2)
            ]
            while sampler.upstreams[0].in_flight < 2:
                await asyncio.sleep(0.01)
            push = asyncio.create_task(timed("push", sampler.load_weights(changed, 1)))
            await asyncio.sleep(0.05)
            later = asyncio.create_task(timed("new", sampler.sample(prompt, greedy)))
            old = await asyncio.gather(*running)
            await push
            after = await later
            await sampler.load_weights(original, 2)
            restored = await sampler.sample(prompt, greedy)
            return sampler, before, old, after, restored
        finally:
            await sampler.aclose()

    sampler, before, old, after, restored = asyncio.run(scenario())
    # The calls in flight finished on the old weights, before the push completed.
    for sample in old:
        assert sample.policy_version == 0
        assert np.array_equal(
            sample.completion_ids[: len(before.completion_ids)], before.completion_ids
        )
    assert max(finished["old0"], finished["old1"]) <= finished["push"] <= finished["new"]
    # The call made during the push waited for it, and was sampled by the new weights.
    assert after.policy_version == 1
    assert not np.array_equal(after.completion_ids, before.completion_ids)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(changed[name])
        try:
            picked = greedy_of(model, prompt, after.completion_ids)
        finally:
            for name, p in model.named_parameters():
                p.copy_(original[name])
    assert np.array_equal(picked, after.completion_ids)
    # The original weights pushed back give the original outputs exactly.
    assert restored.policy_version == 2
    assert np.array_equal(restored.completion_ids, before.completion_ids)
    assert len(sampler.update_seconds) == 2 and all(0 < s < 60 for s in sampler.update_seconds)


def lora_learner(model):
    """A LoRA learner of `model` whose adapter changes the outputs (B is zero at the start)."""
    import copy

    from callgrove.networks.sizes import LoraSettings
    from callgrove.train.hf_trainer import HFLearner, HFOptions

    lora = LoraSettings(rank=LORA_RANK)
    learner = HFLearner(copy.deepcopy(model), options=HFOptions(lora=lora))
    weights = learner.weights()
    assert weights and all(".lora_" in name for name in weights)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in learner.hf_model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=generator))
    return learner, lora


async def served_models(url: str) -> list[str]:
    async with httpx.AsyncClient() as client:
        listing = await client.get(url + "/v1/models")
    return [entry["id"] for entry in listing.json()["data"]]


def test_a_lora_adapter_loads_under_a_new_name_and_the_old_one_goes(
    vllm_url, smollm2, smollm2_folder
):
    model, tokenizer = smollm2
    learner, lora = lora_learner(model)
    prompt = prompt_ids(tokenizer, QUESTIONS[1])
    greedy = SamplingParams(max_tokens=12, temperature=0)
    free = SamplingParams(max_tokens=16, temperature=1.0, stop_token_ids=(END,))

    async def served() -> list[str]:
        return await served_models(vllm_url)

    async def scenario():
        sampler = VllmSampler([vllm_url], lora=lora, base_folder=smollm2_folder, seed=5)
        try:
            base = await sampler.sample(prompt, greedy)
            await sampler.load_weights(learner.weights(), 1)
            names_1 = await served()
            adapted = await sampler.sample(prompt, greedy)
            drawn = await sampler.sample(prompt, free)
            await sampler.load_weights(learner.weights(), 2)
            names_2 = await served()
            again = await sampler.sample(prompt, greedy)
            return sampler, base, adapted, drawn, again, names_1, names_2
        finally:
            await sampler.aclose()

    sampler, base, adapted, drawn, again, names_1, names_2 = asyncio.run(scenario())
    assert "policy-v1" in names_1
    assert "policy-v2" in names_2 and "policy-v1" not in names_2
    assert sampler.upstreams[0].client.model == "policy-v2"
    assert adapted.policy_version == 1 and again.policy_version == 2
    assert not np.array_equal(adapted.completion_ids, base.completion_ids)
    assert np.array_equal(again.completion_ids, adapted.completion_ids)  # the same adapter
    peft_model = learner.hf_model.eval()
    assert np.array_equal(
        greedy_of(peft_model, prompt, adapted.completion_ids), adapted.completion_ids
    )
    want = teacher_forced(peft_model, prompt, drawn.completion_ids, 1.0, 1.0)
    np.testing.assert_allclose(drawn.logprobs, want, rtol=0, atol=1e-4)


def test_a_lora_push_waits_for_no_call_in_flight(vllm_url, smollm2, smollm2_folder):
    """The new adapter loads beside the one in use: calls in flight finish under the adapter
    they named (and say so) after the push is done, and that adapter goes once they are back."""
    model, tokenizer = smollm2
    learner, lora = lora_learner(model)
    prompt = prompt_ids(tokenizer, QUESTIONS[0])
    long = SamplingParams(max_tokens=48, temperature=0, stop_token_ids=())
    finished: dict[str, float] = {}
    timed = finishing_times(finished)

    async def scenario():
        sampler = VllmSampler([vllm_url], lora=lora, base_folder=smollm2_folder, seed=3)
        try:
            await sampler.load_weights(learner.weights(), 1)
            alone = await sampler.sample(prompt, long)
            # The calls in flight are held open after vLLM answers them, until the push is
            # back: were they let go on their own, a push slower than two 48-token decodes (a
            # loaded machine) would finish last without having waited for them.
            client, released = sampler.upstreams[0].client, asyncio.Event()
            answer = client.sample

            async def held_open(*args):
                sample = await answer(*args)
                await released.wait()
                return sample

            client.sample = held_open
            running = [
                asyncio.create_task(timed(f"old{i}", sampler.sample(prompt, long)))
                for i in range(2)
            ]
            while sampler.upstreams[0].in_flight < 2:
                await asyncio.sleep(0.01)
            client.sample = answer
            # A push that waited for the calls in flight would wait here for ever.
            await timed("push", asyncio.wait_for(sampler.load_weights(learner.weights(), 2), 120))
            during = await served_models(vllm_url)
            released.set()
            old = await asyncio.gather(*running)
            for _ in range(100):  # the old adapter is unloaded in the background
                if "policy-v1" not in await served_models(vllm_url):
                    break
                await asyncio.sleep(0.1)
            after = await served_models(vllm_url)
            new = await sampler.sample(prompt, long)
            return alone, old, new, during, after
        finally:
            await sampler.aclose()

    alone, old, new, during, after = asyncio.run(scenario())
    assert finished["push"] < min(finished["old0"], finished["old1"])
    assert {"policy-v1", "policy-v2"} <= set(during)
    assert "policy-v1" not in after and "policy-v2" in after
    for sample in old:  # the old adapter's output, under its version
        assert sample.policy_version == 1
        assert np.array_equal(sample.completion_ids, alone.completion_ids)
    assert new.policy_version == 2 and np.array_equal(new.completion_ids, alone.completion_ids)


def test_a_server_that_dies_with_no_restart_left_fails_its_calls_and_is_dropped(
    vllm_url, smollm2, smollm2_folder, vllm_settings
):
    _, tokenizer = smollm2
    prompt = prompt_ids(tokenizer, QUESTIONS[2])
    (second,) = start_servers(smollm2_folder, vllm_settings())
    long = SamplingParams(max_tokens=400, temperature=1.0)
    short = SamplingParams(max_tokens=8, temperature=0)

    async def scenario():
        sampler = VllmSampler([vllm_url, second.url], processes=[second], restarts=0)
        try:
            calls = [asyncio.create_task(sampler.sample(prompt, long)) for _ in range(2)]
            while sum(u.in_flight for u in sampler.upstreams) < 2:
                await asyncio.sleep(0.01)
            # Routed to the least loaded: one call on each server.
            spread = [u.in_flight for u in sampler.upstreams]
            os.killpg(second.process.pid, signal.SIGKILL)
            with pytest.warns(UserWarning, match="dropped"):
                outcomes = await asyncio.gather(*calls, return_exceptions=True)
            afterwards = await asyncio.gather(*(sampler.sample(prompt, short) for _ in range(3)))
            return sampler, spread, outcomes, afterwards
        finally:
            await sampler.aclose()

    sampler, spread, outcomes, afterwards = asyncio.run(scenario())
    assert spread == [1, 1]
    failed = [o for o in outcomes if isinstance(o, Exception)]
    assert len(failed) == 1 and isinstance(failed[0], UpstreamError)
    message = str(failed[0])
    assert second.url in message and "dropped" in message and "1 of 2 left" in message
    assert [u.gone is None for u in sampler.upstreams] == [True, False]
    assert "exited with code -9" in sampler.upstreams[1].gone
    assert "no restart left (0 of 0 used)" in sampler.upstreams[1].gone
    assert all(s.policy_version == 0 and len(s.completion_ids) for s in afterwards)
    assert second.exit_code is not None


def test_with_no_server_left_every_call_and_push_fails_saying_why():
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there

    async def scenario():
        sampler = VllmSampler([dead])
        errors = []
        try:
            for work in (
                sampler.sample(np.asarray([1, 2, 3], np.int32), SamplingParams(max_tokens=4)),
                sampler.sample(np.asarray([1, 2, 3], np.int32), SamplingParams(max_tokens=4)),
                sampler.load_weights({}, 1),
            ):
                try:
                    await work
                except Exception as error:
                    errors.append(error)
            return sampler, errors
        finally:
            await sampler.aclose()

    with pytest.warns(UserWarning, match="dropped"):
        sampler, errors = asyncio.run(scenario())
    first, second, push = errors
    assert isinstance(first, UpstreamError) and dead in str(first) and "0 of 1 left" in str(first)
    assert "a server given by URL is not restarted" in str(first)
    assert isinstance(second, VllmError) and "no vLLM server left" in str(second)
    assert isinstance(push, VllmError) and "no vLLM server left" in str(push)
    assert sampler.version == 0


def test_a_started_server_that_dies_is_restarted_on_the_current_weights(
    smollm2, smollm2_folder, vllm_settings
):
    """Its calls in flight fail (never sent again), calls made meanwhile wait for the restart,
    the restarted server answers as the weights last pushed, and once its restarts are used up
    it is dropped."""
    model, tokenizer = smollm2
    prompt = prompt_ids(tokenizer, QUESTIONS[0])
    greedy = SamplingParams(max_tokens=12, temperature=0)
    long = SamplingParams(max_tokens=400, temperature=1.0)
    changed = perturbed(model, 0.3, seed=2)

    async def kill_under_calls(sampler, calls: int):
        (upstream,) = sampler.upstreams
        running = [asyncio.create_task(sampler.sample(prompt, long)) for _ in range(calls)]
        while upstream.in_flight < calls:
            await asyncio.sleep(0.01)
        os.killpg(upstream.process.process.pid, signal.SIGKILL)
        return await asyncio.gather(*running, return_exceptions=True)

    async def scenario():
        sampler = vllm_sampler(vllm_settings(restarts=1), smollm2_folder, None, seed=0)
        try:
            (upstream,) = sampler.upstreams
            base = await sampler.sample(prompt, greedy)
            await sampler.load_weights(changed, 1)
            pushed = await sampler.sample(prompt, greedy)
            first_url = upstream.client.base_url
            with pytest.warns(UserWarning) as said:
                killed = await kill_under_calls(sampler, 2)
                # Made while the server restarts: it waits, and is sampled by the restarted one.
                after = await sampler.sample(prompt, greedy)
            second_url = upstream.client.base_url
            with pytest.warns(UserWarning, match="dropped") as dropped:
                killed_again = await kill_under_calls(sampler, 1)
            try:
                await sampler.sample(prompt, greedy)
            except VllmError as error:
                last = error
            return locals()
        finally:
            await sampler.aclose()

    run = asyncio.run(scenario())
    assert not np.array_equal(run["pushed"].completion_ids, run["base"].completion_ids)
    # Both calls in flight failed with an error naming the server and the restart.
    for outcome in run["killed"]:
        assert isinstance(outcome, UpstreamError)
        assert run["first_url"] in str(outcome) and "exited with code -9" in str(outcome)
    assert any("restart 1 of 1" in str(o) for o in run["killed"])
    messages = [str(w.message) for w in run["said"]]
    assert any(
        run["first_url"] in m
        and "exited with code -9" in m
        and "restarting it (restart 1 of 1)" in m
        for m in messages
    ), messages
    assert any(f"restarted as {run['second_url']}" in m and "on version 1" in m for m in messages)
    assert run["second_url"] != run["first_url"]
    # The restarted server holds the weights of version 1, not the checkpoint it started from.
    assert run["after"].policy_version == 1
    assert np.array_equal(run["after"].completion_ids, run["pushed"].completion_ids)
    # Its one restart used, the second death drops it and no server is left.
    (failed,) = run["killed_again"]
    assert isinstance(failed, UpstreamError) and "dropped" in str(failed)
    assert any("no restart left (1 of 1 used)" in str(w.message) for w in run["dropped"])
    assert "no vLLM server left" in str(run["last"])
    assert run["upstream"].process.exit_code is not None
