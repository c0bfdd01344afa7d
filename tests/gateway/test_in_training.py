"""The gateway a training process serves for its harness environments, and its sampling."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest

from callgrove.chat import BuiltinFormat, CharFormat, ChatFormat
from callgrove.gateway.harness import Stopped, _run_cli
from callgrove.gateway.in_training import LocalGateway
from callgrove.orchestrator.envs.harness import harness_chat
from callgrove.policy import Completion, SamplingParams


class LoopRecorder:
    """A policy that remembers the event loop and the parameters of each call."""

    version = 3

    def __init__(self, chat: ChatFormat):
        self.answer = np.concatenate([chat.encode("ok"), np.asarray(chat.stop_token_ids)])
        self.calls: list[tuple[asyncio.AbstractEventLoop, SamplingParams]] = []

    async def sample(self, prompt_ids, params):
        self.calls.append((asyncio.get_running_loop(), params))
        await asyncio.sleep(0)
        return Completion(self.answer.astype(np.int32), np.full(len(self.answer), -0.5), 3, "stop")


def test_a_local_gateway_samples_on_the_loops_event_loop_with_the_loops_sampling(tmp_path):
    chat = BuiltinFormat()
    policy = LoopRecorder(chat)
    loops_own = SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, seed=11, stop=("END",))

    async def go():
        loop = asyncio.get_running_loop()
        with LocalGateway(policy, loop, chat, tmp_path / "ledger", sampling=loops_own) as local:
            async with httpx.AsyncClient(base_url=local.url) as client:
                body = {
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 100,
                    "temperature": 1.5,
                    "stop": ["STOP"],
                }
                answer = await client.post("/e/ep1/v1/chat/completions", json=body)
                capped = await client.post(
                    "/e/ep1/v1/chat/completions", json={**body, "max_tokens": 3}
                )
                record = (await client.post("/e/ep1/close", json={})).json()
        return loop, answer, capped, record

    loop, answer, capped, record = asyncio.run(go())
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "ok"
    assert capped.status_code == 200
    # Sampled on the caller's loop (not the gateway's thread), with the loop's settings; the
    # loop's max_tokens caps the harness's request, a smaller request stays smaller.
    (first_loop, first), (_, second) = policy.calls
    assert first_loop is loop
    assert (first.temperature, first.top_p, first.seed) == (0.7, 0.9, 11)
    assert (first.max_tokens, second.max_tokens) == (5, 3)
    assert first.stop == ("END", "STOP") and first.stop_token_ids == chat.stop_token_ids
    calls = record["agents"][0]["calls"]
    assert [c["policy_version"] for c in calls] == [3, 3]
    assert (tmp_path / "ledger" / "ep1.calls.jsonl").exists()


def test_training_a_model_without_a_chat_template_is_refused_with_a_way_out():
    with pytest.raises(ValueError, match=r"model\.name = 'hf:PATH'.*`gateway` URL"):
        harness_chat(CharFormat())


def test_a_stopped_harness_cli_is_killed_at_once(tmp_path):
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Stopped):
        _run_cli(["bash", "-c", "sleep 60 & wait"], tmp_path, {"PATH": "/usr/bin:/bin"}, 60, stop)
    assert time.monotonic() - started < 10
