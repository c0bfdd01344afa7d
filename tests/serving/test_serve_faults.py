"""serve-policy under what clients really send: limits, a slow decode, a bad prompt batched
with good ones, stop strings, and options it does not implement (refused, never ignored)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from callgrove.chat import BuiltinFormat, ChatFormat
from callgrove.models import TinyModel, open_model
from callgrove.policy import Completion, SamplingParams
from callgrove.policy.batching import LocalSampler
from callgrove.serving.policy_server import UNSERVED
from gateway.helpers import policy_client, scripted, write_script

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.fixture
def script(tmp_path):
    return write_script(tmp_path / "s.json", [{"when": "hello", "reply": "Hi there, friend!"}])


def post(policy, path, body, **options):
    async def go():
        async with policy_client(policy, **options) as client:
            return await client.post(path, json=body)

    return run(go())


def test_max_tokens_past_the_servers_limit_is_refused(script):
    policy = scripted(script)
    over = post(policy, "/v1/chat/completions", {**CHAT, "max_tokens": 10**9}, max_tokens=64)
    assert over.status_code == 400 and "limit of 64" in over.json()["error"]["message"]
    within = post(policy, "/v1/chat/completions", {**CHAT, "max_tokens": 64}, max_tokens=64)
    assert within.status_code == 200


class Slow:
    """A policy whose sampling holds its thread for `seconds` (as a decoding round does)."""

    def __init__(self, inner, seconds: float):
        self.inner, self.seconds = inner, seconds
        self.decoding = threading.Event()

    @property
    def version(self) -> int:
        return 0

    async def sample(self, prompt_ids, params):
        self.decoding.set()
        time.sleep(self.seconds)  # blocking on purpose: a round of decoding is not awaitable
        return await self.inner.sample(prompt_ids, params)


def test_a_long_decode_does_not_freeze_health_or_other_requests(script):
    policy = Slow(scripted(script), 1.5)

    async def go():
        async with policy_client(policy) as client:
            done = {}

            async def slow():
                await client.post("/v1/chat/completions", json=CHAT)
                done["slow"] = time.monotonic()

            decoding = asyncio.ensure_future(slow())
            assert await asyncio.to_thread(policy.decoding.wait, 30), "the decode never started"
            health = await client.get("/health")
            done["health"] = time.monotonic()
            await decoding
            return health.status_code, done

    health, done = run(go())
    assert health == 200
    assert done["health"] < done["slow"] - 0.5, "/health waited for a decode"


def tiny_sampler(chat: ChatFormat, seed: int = 0) -> LocalSampler:
    """The reference decoder over `chat`'s vocabulary, as `serve-policy --model tiny` serves it."""
    return open_model(TinyModel(), seed=seed, chat=chat).sampler


def test_one_bad_prompt_fails_alone_not_its_whole_round():
    chat = BuiltinFormat()
    sampler = tiny_sampler(chat)
    good = chat.encode("hello")
    poison = np.asarray([1, chat.vocab_size + 5], dtype=np.int32)  # the embedding refuses it

    async def go():
        params = SamplingParams(max_tokens=4)
        return await asyncio.gather(
            sampler.sample(good, params),
            sampler.sample(poison, params),
            sampler.sample(good, params),
            return_exceptions=True,
        )

    first, bad, last = run(go())
    assert isinstance(first, Completion) and isinstance(last, Completion), (first, last)
    assert isinstance(bad, Exception) and not isinstance(bad, Completion)
    assert len(first.completion_ids) == 4 and len(last.completion_ids) == 4


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"prompt": [1, 10**6]}, "not a token id"),
        ({"prompt": [-1]}, "not a token id"),
        ({"prompt": [2**40]}, "not a token id"),
        ({"prompt": [1, True]}, "not a token id"),
        ({"prompt": ""}, "empty"),
        ({"prompt": "hi", "stop_token_ids": [10**6]}, "stop_token_ids"),
        ({"prompt": "hi", "seed": "seven"}, "seed"),
        ({"prompt": "hi", "seed": 1.5}, "seed"),
    ],
)
def test_client_mistakes_are_400s_naming_them(script, body, said):
    answer = post(scripted(script), "/v1/completions", body)
    assert answer.status_code == 400 and said in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "n", 2),
        ("/v1/chat/completions", "top_logprobs", 3),
        ("/v1/chat/completions", "presence_penalty", 0.5),
        ("/v1/chat/completions", "frequency_penalty", -1),
        ("/v1/chat/completions", "logit_bias", {"5": 10}),
        ("/v1/chat/completions", "response_format", {"type": "json_object"}),
        ("/v1/chat/completions", "tool_choice", "required"),
        ("/v1/chat/completions", "top_k", -2),
        ("/v1/completions", "n", True),
        ("/v1/completions", "best_of", 3),
        ("/v1/completions", "logprobs", 5),
        ("/v1/completions", "echo", True),
        ("/v1/completions", "min_p", 0.1),
        ("/v1/completions", "skip_special_tokens", True),
    ],
)
def test_options_the_server_does_not_implement_are_refused(script, path, field, value):
    base = CHAT if path.endswith("chat/completions") else {"prompt": "hello"}
    answer = post(scripted(script), path, {**base, field: value})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith(field)


def test_the_neutral_values_of_those_options_are_served(script):
    neutral = {key: values[0] for key, values in UNSERVED.items() if values}
    chat = post(scripted(script), "/v1/chat/completions", {**CHAT, **neutral})
    assert chat.status_code == 200, chat.text
    completion = post(scripted(script), "/v1/completions", {"prompt": "hi", **neutral})
    assert completion.status_code == 200, completion.text


def test_a_top_k_cut_is_sampled_and_recorded():
    policy = tiny_sampler(BuiltinFormat(), seed=1)
    body = {"prompt": "hello", "max_tokens": 8, "logprobs": 0, "temperature": 0.9}
    greedy = post(policy, "/v1/completions", {**body, "temperature": 0}).json()["choices"][0]
    top_one = post(policy, "/v1/completions", {**body, "top_k": 1}).json()
    assert top_one["sampling"] == {"temperature": 0.9, "top_p": 1.0, "top_k": 1}
    assert top_one["choices"][0]["token_ids"] == greedy["token_ids"]  # one token left: greedy
    assert (
        post(policy, "/v1/completions", {**body, "top_k": -1}).json()["sampling"]["top_k"] is None
    )


def test_stop_strings_end_the_tiny_models_completions():
    chat = BuiltinFormat()
    policy = tiny_sampler(chat, seed=1)
    body = {"prompt": "hello there", "max_tokens": 24, "temperature": 0, "logprobs": 0}
    free = post(policy, "/v1/completions", body).json()["choices"][0]
    ids = free["token_ids"]
    text = chat.text_of(np.asarray(ids[:6]))
    stop = text[-2:]  # the greedy completion reaches it by its sixth token
    stopped = post(policy, "/v1/completions", {**body, "stop": [stop]})
    assert stopped.status_code == 200, stopped.text
    choice = stopped.json()["choices"][0]
    cut = choice["token_ids"]
    assert cut == ids[: len(cut)] and len(cut) <= 6 and choice["finish_reason"] == "stop"
    assert stop in chat.text_of(np.asarray(cut)) and stop not in chat.text_of(np.asarray(cut[:-1]))


def test_stop_strings_end_a_scripted_reply(script):
    answer = post(scripted(script), "/v1/chat/completions", {**CHAT, "stop": ["friend"]})
    message = answer.json()["choices"][0]["message"]
    assert answer.status_code == 200 and message["content"] == "Hi there, friend"
