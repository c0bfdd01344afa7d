"""The reference decoder as an in-process sampler: calls made at the same moment decode together.

`sample` queues its request and awaits it. One worker task drains the queue: it yields to the
event loop once so that every episode ready to call gets its request in, then decodes up to
`max_batch` requests as one batch with a KV cache (`callgrove.policy.decode`), and repeats while
requests wait. A round decodes in a worker thread, so the event loop goes on meanwhile (the
loop's step ends when its learner does, not when the round in flight does). `load_weights`
stages the weights and returns at once; the next round starts on them, so every call samples
from one version and a step never waits for a round. A round that fails is decoded again
request by request, so a bad request fails alone, never the callers it batched with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from callgrove.errors import InvalidValue
from callgrove.networks.tiny import TinyDecoder
from callgrove.policy.client import Completion, SamplingParams
from callgrove.policy.decode import Decoded, DecodeRequest, decode, new_generator


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
        self._staged: Any = None
        """Weights loaded since the last round began; the next round starts on them."""
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
            raise InvalidValue("this sampler cannot read its completions' text: use stop_token_ids")
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
            if self._staged is not None:
                self.set_weights(self._staged)
                self._staged = None
            version = self._version
            requests = [r for r, _ in batch]
            decoded = await asyncio.to_thread(self._decode_round, requests)
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
                        sampling=request.params.record(),
                        routes=result.routes,
                    )
                )

    def _decode_round(self, requests: list[DecodeRequest]) -> list[Decoded | Exception]:
        try:
            return list(self.decode(requests))
        except Exception as error:  # one bad request fails alone: decoded again one by one
            return [error] if len(requests) == 1 else [self._decode_alone(r) for r in requests]

    def _decode_alone(self, request: DecodeRequest) -> Decoded | Exception:
        try:
            return self.decode([request])[0]
        except Exception as error:  # this request's own failure, for its caller alone
            return error

    async def load_weights(self, weights: Any, version: int) -> None:
        """Staged for the next round (a round in flight ends on the weights it began with);
        `version` counts from now: calls that start from now on sample from it."""
        self.check_weights(weights)
        self._staged = weights
        self._version = version

    def check_weights(self, weights: Any) -> None:
        """Refuse weights that do not fit the model, when they are loaded (not at a round)."""
        missing = set(self.model.state_dict()) - set(weights)
        if missing:
            raise InvalidValue(
                f"weights lack parameters of the sampler's model: {sorted(missing)[:3]}"
            )

    def set_weights(self, weights: Any) -> None:
        """Put `weights` into the model (between rounds, none in flight)."""
        self.model.load_state_dict(weights)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "version": self._version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self._version = int(state["version"])
