"""The reference decoder as an in-process sampler: calls made at the same moment decode together.

`sample` queues its request and awaits it. One worker task drains the queue: it yields to the
event loop once so that every episode ready to call gets its request in, then decodes up to
`max_batch` requests as one batch with a KV cache (`callgrove.policy.decode`), and repeats while
requests wait. A round runs on the event loop's thread from start to end, and new weights are
loaded between rounds, so every call samples from one version. A round that fails is decoded
again request by request, so a bad request fails alone, never the callers it batched with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from callgrove.episode import sampling_record
from callgrove.policy.client import Completion, SamplingParams
from callgrove.policy.decode import Decoded, DecodeRequest, decode, new_generator
from callgrove.train.model import TinyDecoder


class LocalSampler:
    """A `TrainableSampler` over a `TinyDecoder` held in this process."""

    def __init__(
        self,
        model: TinyDecoder,
        seed: int = 0,
        max_batch: int = 512,
        text_of: Callable[[Sequence[int]], str] | None = None,
    ):
        """`text_of`: a completion's text (a chat format's `text_of`), for stop strings."""
        self.model = model.eval()
        self.text_of = text_of
        self.generator = new_generator(seed)
        self.max_batch = max_batch
        self._version = 0
        self._queue: list[tuple[DecodeRequest, asyncio.Future[Completion]]] = []
        self._worker: asyncio.Task[None] | None = None
        self.rounds = 0
        self.calls = 0

    @property
    def version(self) -> int:
        return self._version

    @property
    def decodes_text(self) -> bool:
        """Whether `decode` can tell stop strings (it needs the completions' text)."""
        return self.text_of is not None

    def decode(self, requests: list[DecodeRequest]) -> list[Decoded]:
        """One round: every request decoded together (other models' samplers override it)."""
        return decode(self.model, requests, self.generator, self.text_of)

    async def sample(self, prompt_ids: np.ndarray, params: SamplingParams) -> Completion:
        if params.stop and not self.decodes_text:
            raise ValueError("this sampler cannot read its completions' text: use stop_token_ids")
        request = DecodeRequest(np.asarray(prompt_ids, dtype=np.int32), params)
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            await asyncio.sleep(0)  # let every caller that is ready queue its request
            batch = [(r, f) for r, f in self._queue[: self.max_batch] if not f.done()]
            del self._queue[: self.max_batch]
            if not batch:
                continue
            version = self._version
            try:
                decoded: list[Decoded | Exception] = list(self.decode([r for r, _ in batch]))
            except Exception as error:  # one bad request fails alone: decoded again one by one
                decoded = [error] if len(batch) == 1 else [self._decode_alone(r) for r, _ in batch]
            self.rounds += 1
            self.calls += len(batch)
            for (request, future), result in zip(batch, decoded, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                    continue
                future.set_result(
                    Completion(
                        completion_ids=result.completion_ids,
                        logprobs=result.logprobs,
                        policy_version=version,
                        finish_reason="stop" if result.stopped else "length",
                        sampling=sampling_record(request.params.temperature, request.params.top_p),
                    )
                )

    def _decode_alone(self, request: DecodeRequest) -> Decoded | Exception:
        try:
            return self.decode([request])[0]
        except Exception as error:  # this request's own failure, for its caller alone
            return error

    async def load_weights(self, weights: Any, version: int) -> None:
        self.model.load_state_dict(weights)
        self._version = version

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "version": self._version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self._version = int(state["version"])
