"""A scripted policy and small environments for the loop's tests."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from callgrove.chat import CharFormat
from callgrove.episode import Episode
from callgrove.orchestrator import run_episode
from callgrove.policy import Completion, SamplingParams

CHAT = CharFormat()
PARAMS = SamplingParams(max_tokens=4, stop_token_ids=CHAT.stop_token_ids)


class ScriptedPolicy:
    """Answers every prompt with `reply` and its end token; `fail_on` call numbers raise;
    `delay` seconds per call (awaited, so cancellation and timeouts reach it)."""

    def __init__(
        self,
        reply: str = "7",
        fail_on: tuple[int, ...] = (),
        delay: float = 0.0,
        fail_text: str | None = None,
    ):
        self.fail_text = fail_text
        self.reply = np.concatenate([CHAT.encode(reply), [CHAT.END]]).astype(np.int32)
        self.fail_on = fail_on
        self.delay = delay
        self.version = 0
        self.calls = 0
        self.prompts: list[np.ndarray] = []

    async def sample(self, prompt_ids: np.ndarray, params: SamplingParams) -> Completion:
        number = self.calls
        self.calls += 1
        self.prompts.append(np.asarray(prompt_ids))
        if self.delay:
            await asyncio.sleep(self.delay)
        else:
            await asyncio.sleep(0)
        if number in self.fail_on or (
            self.fail_text is not None and self.fail_text in CHAT.show(prompt_ids)
        ):
            raise ConnectionError(f"call {number} refused")
        return Completion(self.reply, np.full(len(self.reply), -0.5), self.version, "stop")


def run(env: Any, task: Any, policy: Any, timeout: float | None = None) -> Episode:
    async def go() -> Episode:
        return await run_episode(
            env, task, policy, CHAT, PARAMS, Episode(id="e0", group="g0"), timeout
        )

    return asyncio.run(go())
