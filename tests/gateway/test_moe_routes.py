"""A mixture of experts behind serve-policy and the gateway: serve-policy returns each call's
routes in vLLM's field (`routed_experts`, from `routed_experts_prompt_start` on), the HTTP
client reads them back, and the gateway records them on the call, held as its prompt base's
where they agree, so the episode it closes gives every call's whole routes."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
import pytest

from callgrove.chat import BuiltinFormat
from callgrove.episode import Agent, Episode
from callgrove.episode.codec import episode_from_wire
from callgrove.formats.routes import decode_routed_experts
from callgrove.formats.wire import WireEpisode
from callgrove.models import HfModel, open_model
from callgrove.policy.http import sample_from_completion

from .helpers import gateway_client, policy_client

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def moe_sampler(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CALLGROVE_CACHE", str(tmp_path_factory.mktemp("cache")))
        return open_model(HfModel(name="tiny-moe"), seed=1).sampler


def test_serve_policy_returns_routes_in_vllms_field(moe_sampler):
    async def go(start):
        async with policy_client(moe_sampler) as client:
            prompt = BuiltinFormat().render([]).tolist()
            body = {"prompt": prompt, "max_tokens": 6, "logprobs": 0}
            if start:
                body["routed_experts_prompt_start"] = start
            return prompt, (await client.post("/v1/completions", json=body)).json()

    prompt, payload = asyncio.run(go(0))
    choice = payload["choices"][0]
    routes = decode_routed_experts(choice["routed_experts"])
    assert routes.shape == (len(prompt) + len(choice["token_ids"]) - 1, 2, 2)
    assert routes.dtype == np.uint8 and routes.max() < 8
    sample = sample_from_completion(payload, 0)  # what the loop's HTTP client reads
    assert np.array_equal(sample.routes, routes)
    _, later = asyncio.run(go(3))
    assert len(decode_routed_experts(later["choices"][0]["routed_experts"])) == len(routes) - 3


def test_a_bad_prompt_start_is_refused(moe_sampler):
    async def go():
        async with policy_client(moe_sampler) as client:
            body = {"prompt": [1, 2], "max_tokens": 2, "routed_experts_prompt_start": -1}
            return await client.post("/v1/completions", json=body)

    answer = asyncio.run(go())
    assert answer.status_code == 400 and "routed_experts_prompt_start" in answer.text


def test_the_gateway_records_every_calls_routes(moe_sampler, tmp_path):
    async def go():
        _, client = gateway_client(moe_sampler, tmp_path / "ledger", max_tokens=8)
        async with client:
            history = [{"role": "user", "content": "hi"}]
            for turn in range(3):
                body = {"model": "m", "max_tokens": 8, "messages": history}
                answer = (await client.post("/e/moe/v1/chat/completions", json=body)).json()
                reply = answer["choices"][0]["message"]
                history += [
                    {"role": "assistant", "content": reply["content"] or ""},
                    {"role": "user", "content": f"and {turn}?"},
                ]
            return (await client.post("/e/moe/close", json={"rewards": {"r": 1.0}})).json()

    record = asyncio.run(go())
    episode: Episode = episode_from_wire(msgspec.convert(record, WireEpisode))
    [agent] = episode.agents
    assert isinstance(agent, Agent) and len(agent.calls) == 3
    for call in agent.calls:
        assert episode.routes(call).shape == (call.full_len - 1, 2, 2)
    assert any(call.routes_from for call in agent.calls[1:])  # the history's routes held once
