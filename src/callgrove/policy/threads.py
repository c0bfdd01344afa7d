"""A policy client that lives on another event loop, called from this one (a server's thread
sampling with the training loop's policy, so concurrent calls batch with the loop's own)."""

from __future__ import annotations

import asyncio

import numpy as np

from callgrove.policy.client import Completion, PolicyClient, SamplingParams


class LoopPolicy:
    """A policy client that lives on another event loop, called from this one."""

    def __init__(self, policy: PolicyClient, loop: asyncio.AbstractEventLoop):
        self.policy = policy
        self.loop = loop

    @property
    def version(self) -> int:
        return self.policy.version

    async def sample(self, prompt_ids: np.ndarray, params: SamplingParams) -> Completion:
        future = asyncio.run_coroutine_threadsafe(self.policy.sample(prompt_ids, params), self.loop)
        return await asyncio.wrap_future(future)  # cancelling this cancels the sampling
