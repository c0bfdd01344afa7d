"""serve-policy and the gateway over the reference decoder: real sampling, real log-probabilities."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np

from callgrove.chat import BuiltinFormat
from callgrove.episode import read_episodes
from callgrove.models import HfModel, TinyModel, open_model
from callgrove.rows import build_rows, check_rows

from .helpers import gateway_client, policy_client


def reference_policy(seed: int):
    """The reference decoder over bytes, as `serve-policy --model tiny` serves it."""
    return open_model(TinyModel(), seed=seed, chat=BuiltinFormat()).sampler


def test_reference_decoder_serves_completions_with_token_extras():
    async def go():
        async with policy_client(reference_policy(seed=3)) as client:
            prompt = BuiltinFormat().render([]).tolist()
            body = {"prompt": prompt, "max_tokens": 12, "logprobs": 0, "temperature": 1.0}
            return (await client.post("/v1/completions", json=body)).json()

    payload = asyncio.run(go())
    choice = payload["choices"][0]
    logprobs = choice["logprobs"]["token_logprobs"]
    assert 1 <= len(choice["token_ids"]) <= 12 and len(logprobs) == len(choice["token_ids"])
    assert all(np.isfinite(v) and v <= 0 for v in logprobs)
    assert all(0 <= t < 258 for t in choice["token_ids"])
    assert choice["finish_reason"] in ("stop", "length") and payload["policy_version"] == 0


def test_gateway_records_what_the_reference_decoder_sampled(tmp_path):
    async def go():
        policy = reference_policy(seed=5)
        _, client = gateway_client(policy, tmp_path / "ledger", max_tokens=16)
        async with client:
            body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
            answers = await asyncio.gather(
                *(
                    client.post(
                        "/e/ref/v1/messages", json=body, headers={"x-callgrove-agent": f"a{i}"}
                    )
                    for i in range(4)
                )
            )
            closed = await client.post("/e/ref/close", json={"rewards": {"r": 0.0}})
            return answers, closed.json()

    answers, record = asyncio.run(go())
    assert all(a.status_code == 200 for a in answers)
    calls = [c for agent in record["agents"] for c in agent["calls"]]
    assert len(calls) == 4
    for call in calls:
        assert len(call["logprobs"]) == len(call["completion_ids"]) <= 16
        assert all(v <= 0 for v in call["logprobs"])
    episode = next(read_episodes(tmp_path / "ledger" / "episodes.jsonl"))
    assert check_rows(build_rows(episode)).ok
    assert sum(a.json()["usage"]["output_tokens"] for a in answers) == sum(
        len(c["completion_ids"]) for c in calls
    )


def test_a_hugging_face_model_serves_with_its_own_chat_template():
    from callgrove.chat import Message
    from callgrove.serving.policy_server import PolicyServer

    opened = open_model(HfModel(name="smollm2-135m"))
    chat = opened.chat
    server = PolicyServer(opened.sampler, chat, context=opened.context)

    async def go():
        transport = httpx.ASGITransport(app=server.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://policy") as client:
            body = {
                "messages": [{"role": "user", "content": "Say hi"}],
                "max_tokens": 3,
                "logprobs": True,
            }
            return (await client.post("/v1/chat/completions", json=body)).json()

    payload = asyncio.run(go())
    choice = payload["choices"][0]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) <= 3
    assert all(entry["logprob"] <= 0 for entry in choice["logprobs"]["content"])
    # The prompt is the model's own template: the user turn is wrapped in its special tokens.
    text = chat.decode(np.asarray(payload["prompt_token_ids"]))
    assert "Say hi" in text and "<|im_start|>" in text
    # The gateway renders with the same format from the tokenizer alone (no weights loaded).
    alone = open_model(HfModel(name="smollm2-135m"), sample=False).chat
    messages = [Message("user", "Say hi")]
    assert alone.render(messages).tolist() == chat.render(messages).tolist()
