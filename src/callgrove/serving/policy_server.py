"""`callgrove serve-policy`: any `PolicyClient` behind an OpenAI-compatible HTTP server.

`/v1/completions` takes the prompt as text or as token ids, `/v1/chat/completions` renders the
messages with the chat format; both answer whole or as SSE, with vLLM's token extras
(`prompt_token_ids`, per-choice `token_ids`, per-token logprobs; `return_tokens_as_token_ids`
names tokens `token_id:N`), the policy version (`policy_version`) and the distribution the
logprobs are under (`sampling`, as a call records it) in every response.

The policy samples on an event loop of its own, in a thread of its own (`PolicyThread`): a
decoding round never holds up `/health` or the reading of other requests, and requests that
arrive together still batch. What the server cannot honour is refused with a 400 naming the
field, never ignored: `max_tokens` past the server's limit, token ids outside the vocabulary,
the sampling options in `UNSERVED` at any but their neutral value, and a prompt that with its
`max_tokens` does not fit the model's context (OpenAI's `context_length_exceeded`, checked
before anything is sampled).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from callgrove.chat import ChatFormat, tools_message
from callgrove.episode import TOKEN_DTYPE
from callgrove.formats.routes import PROMPT_START, ROUTED_EXPERTS, encode_routed_experts
from callgrove.policy import Completion, PolicyClient, SamplingParams
from callgrove.policy.threads import LoopPolicy
from callgrove.serving.bodies import check_completions
from callgrove.serving.dialects import ERROR_HANDLERS
from callgrove.serving.dialects.dialect import (
    DEFAULT_MAX_TOKENS,
    ChatRequest,
    Reply,
    max_tokens_of,
    number_of,
    stops_of,
)
from callgrove.serving.dialects.openai_chat import OPENAI_CHAT
from callgrove.serving.web import (
    DEFAULT_BODY_LIMIT,
    HttpError,
    check_headers,
    check_token,
    json_response,
    read_json,
    request_key,
    sse_event,
    sse_response,
)

STREAM_CHUNK_TOKENS = 16
REFERENCE_CONTEXT = 8192
"""The reference decoder's context here: its prefill attends over a (prompt x prompt) mask, so
memory and time grow with the prompt's square (8192 tokens: about 0.5 GB and 5 s on a CPU;
300,000 would ask for 90 GB)."""

# Request fields this server does not implement, with the values that ask for nothing of them
# (absent is neutral too): any other value is a 400, as the client would get something else.
UNSERVED: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "top_logprobs": (0,),
    "prompt_logprobs": (0,),
    "echo": (False,),
    "suffix": ("",),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "repetition_penalty": (1,),
    "length_penalty": (1,),
    "min_p": (0,),
    "min_tokens": (0,),
    "logit_bias": ({},),
    "bad_words": ([],),
    "allowed_token_ids": (),
    "ignore_eos": (False,),
    "use_beam_search": (False,),
    "response_format": ({"type": "text"},),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "tool_choice": ("auto",),
    "skip_special_tokens": (False,),  # completions' text keeps special tokens
    "include_stop_str_in_output": (True,),  # a stop string's token is kept
}


def refuse_unserved(data: dict[str, Any]) -> None:
    """A 400 naming the first field of `UNSERVED` that asks for what this server does not do."""
    for key, neutral in UNSERVED.items():
        value = data.get(key)
        if value is not None and not any(
            (value == v and type(value) is not bool) or value is v for v in neutral
        ):
            raise HttpError(
                400,
                f"{key} {orjson.dumps(value).decode()[:80]} is not supported by this server "
                f"(only {' or '.join(orjson.dumps(v).decode() for v in neutral) or 'absent'})",
            )


class PolicyThread:
    """A policy on an event loop of its own, in a daemon thread: sampling (a decoding round
    runs on its loop's thread) never blocks the loop that serves HTTP."""

    def __init__(self, policy: PolicyClient):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="callgrove-policy", daemon=True
        )
        self._thread.start()
        self.client = LoopPolicy(policy, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)


def _routed_experts(data: dict[str, Any], sample: Completion) -> dict[str, str]:
    """vLLM's `routed_experts` of a mixture of experts' sample (none for a dense model's), from
    the request's `routed_experts_prompt_start` on."""
    if sample.routes is None:
        return {}
    start = data.get(PROMPT_START) or 0  # checked with the body (`serving.bodies`)
    return {ROUTED_EXPERTS: encode_routed_experts(sample.routes[start:])}


def _logprob_block(
    chat: ChatFormat, ids: np.ndarray, logprobs: np.ndarray, as_ids: bool, offset: int = 0
) -> dict[str, Any]:
    tokens = [f"token_id:{int(t)}" if as_ids else chat.decode(np.asarray([t])) for t in ids]
    return {
        "tokens": tokens,
        "token_logprobs": [float(v) for v in logprobs],
        "top_logprobs": None,
        "text_offset": list(range(offset, offset + len(ids))),
    }


def _chat_logprobs(
    chat: ChatFormat, ids: np.ndarray, logprobs: np.ndarray, as_ids: bool
) -> dict[str, Any]:
    content = []
    for token, value in zip(ids, logprobs, strict=True):
        text = f"token_id:{int(token)}" if as_ids else chat.decode(np.asarray([token]))
        content.append(
            {
                "token": text,
                "logprob": float(value),
                "bytes": list(text.encode()),
                "top_logprobs": [],
            }
        )
    return {"content": content}


class PolicyServer:
    """The serve-policy routes over one policy and chat format."""

    def __init__(
        self,
        policy: PolicyClient,
        chat: ChatFormat,
        model: str = "policy",
        tokens: list[str] | None = None,
        body_limit: int = DEFAULT_BODY_LIMIT,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        context: int | None = None,
    ):
        """`max_tokens`: the most tokens one completion may ask for (more is a 400);
        `context`: the most tokens a prompt and its completion may hold together (None: the
        policy has no such limit, as a script)."""
        self.policy = policy
        self.chat = chat
        self.model = model
        self.tokens = tokens or []
        self.body_limit = body_limit
        self.max_tokens = max_tokens
        self.context = context
        self.sampler = PolicyThread(policy)

    def close(self) -> None:
        self.sampler.close()

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route(OPENAI_CHAT.path, self.chat_completions, methods=["POST"]),
                Route("/health", self.health, methods=["GET"]),
            ],
            exception_handlers=ERROR_HANDLERS,
        )

    async def health(self, request: Request) -> Response:
        return json_response({"ok": True, "policy_version": self.policy.version})

    async def models(self, request: Request) -> Response:
        try:
            check_headers(request)
            check_token(request_key(request), self.tokens)
        except HttpError as error:
            return OPENAI_CHAT.error_response(error)
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "owned_by": "callgrove",
                        "policy_version": self.policy.version,
                    }
                ],
            }
        )

    def _params(
        self,
        data: dict[str, Any],
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop: tuple[str, ...],
    ) -> SamplingParams:
        refuse_unserved(data)
        if max_tokens > self.max_tokens:
            raise HttpError(
                400, f"max_tokens {max_tokens} is over this server's limit of {self.max_tokens}"
            )
        stop_ids = data.get("stop_token_ids") or []
        if not isinstance(stop_ids, list):
            raise HttpError(400, "stop_token_ids must be a list of token ids")
        self._check_ids(stop_ids, "stop_token_ids")
        seed = data.get("seed")
        if seed is not None and (type(seed) is not int or not 0 <= seed < 2**63):
            raise HttpError(400, "seed must be a non-negative 64-bit integer")
        top_k = data.get("top_k")
        if top_k is not None and (type(top_k) is not int or top_k < -1):
            raise HttpError(400, "top_k must be an integer: at least 1, or -1 or 0 for no cut")
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k if top_k and top_k > 0 else None,  # vLLM's -1 and 0: no cut
                stop_token_ids=tuple(stop_ids) or self.chat.stop_token_ids,
                stop=stop,
                seed=seed,
            )
        except ValueError as error:
            raise HttpError(400, str(error)) from None

    def _check_ids(self, ids: list[Any], field: str) -> None:
        vocab = self.chat.vocab_size
        for token in ids:
            if type(token) is not int or not 0 <= token < vocab:
                raise HttpError(
                    400, f"{field} holds {token!r}, not a token id of this model [0, {vocab})"
                )

    async def _sample(self, prompt: np.ndarray, params: SamplingParams) -> Completion:
        if not len(prompt):
            raise HttpError(400, "the prompt is empty")
        if self.context is not None and len(prompt) + params.max_tokens > self.context:
            raise HttpError(
                400,
                f"this model's maximum context length is {self.context} tokens, but "
                f"{len(prompt) + params.max_tokens} were asked for: {len(prompt)} in the prompt "
                f"and {params.max_tokens} for the completion (max_tokens)",
                code="context_length_exceeded",
            )
        try:
            return await self.sampler.client.sample(prompt, params)
        except HttpError:
            raise
        except Exception as error:  # a backend failure is the client's 500, with its reason
            raise HttpError(500, f"sampling failed: {error}", "server_error") from None

    async def completions(self, request: Request) -> Response:
        try:
            check_headers(request)
            check_token(request_key(request), self.tokens)
            data = await read_json(request, self.body_limit)
            check_completions(data)
            prompt = data.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list | str):
                prompt = prompt[0]
            if isinstance(prompt, str):
                prompt_ids = self.chat.encode(prompt)
            elif isinstance(prompt, list) and prompt:
                self._check_ids(prompt, "prompt")
                prompt_ids = np.asarray(prompt, dtype=TOKEN_DTYPE)
            else:
                raise HttpError(400, "prompt must be a string or a non-empty list of token ids")
            top = data.get("logprobs")
            if top is not None and top is not False and (type(top) is not int or top != 0):
                raise HttpError(
                    400,
                    f"logprobs {top!r} asks for the top alternatives of each token, which this "
                    "server does not return: logprobs 0 gives each sampled token's",
                )
            request_chat = ChatRequest(
                messages=[],
                tools=[],
                model=str(data.get("model") or self.model),
                stream=bool(data.get("stream")),
                max_tokens=16,
            )
            params = self._params(
                data,
                max_tokens_of(data, "max_tokens"),
                number_of(data, "temperature", 1.0, 0, 2),
                number_of(data, "top_p", 1.0, 1e-9, 1.0),
                stops_of(data.get("stop")),
            )
            sample = await self._sample(prompt_ids, params)
        except HttpError as error:
            return OPENAI_CHAT.error_response(error)
        return self._completion_response(request_chat, data, prompt_ids, sample)

    def _completion_response(
        self, request: ChatRequest, data: dict[str, Any], prompt_ids: np.ndarray, sample: Completion
    ) -> Response:
        as_ids = bool(data.get("return_tokens_as_token_ids"))
        want_ids = bool(data.get("return_token_ids", True))
        want_logprobs = data.get("logprobs") is not None and data.get("logprobs") is not False
        ids, logprobs = sample.completion_ids, sample.logprobs
        base = {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": request.model,
            "policy_version": sample.policy_version,
            "sampling": sample.sampling,  # the distribution the logprobs are under
        }
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt_ids) + len(ids),
        }
        if not request.stream:
            choice: dict[str, Any] = {
                "index": 0,
                "text": self.chat.decode(ids),
                "finish_reason": sample.finish_reason,
                "logprobs": _logprob_block(self.chat, ids, logprobs, as_ids)
                if want_logprobs
                else None,
            }
            payload = {**base, "choices": [choice], "usage": usage}
            choice.update(_routed_experts(data, sample))
            if want_ids:
                choice["token_ids"] = ids.tolist()
                choice["prompt_token_ids"] = prompt_ids.tolist()
                payload["prompt_token_ids"] = prompt_ids.tolist()
            return json_response(payload)
        events = []
        for start in range(0, len(ids), STREAM_CHUNK_TOKENS):
            piece = slice(start, start + STREAM_CHUNK_TOKENS)
            last = start + STREAM_CHUNK_TOKENS >= len(ids)
            choice = {
                "index": 0,
                "text": self.chat.decode(ids[piece]),
                "finish_reason": sample.finish_reason if last else None,
                "logprobs": _logprob_block(self.chat, ids[piece], logprobs[piece], as_ids, start)
                if want_logprobs
                else None,
            }
            chunk: dict[str, Any] = {**base, "choices": [choice]}
            if want_ids:
                choice["token_ids"] = ids[piece].tolist()
                if start == 0:
                    chunk["prompt_token_ids"] = prompt_ids.tolist()
            if last:
                chunk["usage"] = usage
                choice.update(_routed_experts(data, sample))
            events.append(sse_event(chunk))
        events.append(b"data: [DONE]\n\n")
        return sse_response(events)

    async def chat_completions(self, request: Request) -> Response:
        try:
            check_headers(request)
            check_token(request_key(request), self.tokens)
            data = await read_json(request, self.body_limit)
            chat_request = OPENAI_CHAT.request(data)
            tools = tools_message(chat_request.tools)
            messages = ([tools] if tools else []) + chat_request.messages
            prompt_ids = self.chat.render(messages)
            params = self._params(
                data,
                chat_request.max_tokens,
                chat_request.temperature,
                chat_request.top_p,
                chat_request.stop,
            )
            sample = await self._sample(prompt_ids, params)
        except HttpError as error:
            return OPENAI_CHAT.error_response(error)
        as_ids = bool(data.get("return_tokens_as_token_ids"))
        choice: dict[str, Any] = {}
        top: dict[str, Any] = {"sampling": sample.sampling}  # what the logprobs are under
        if data.get("logprobs"):
            choice["logprobs"] = _chat_logprobs(
                self.chat, sample.completion_ids, sample.logprobs, as_ids
            )
        if data.get("return_token_ids", True):
            choice["token_ids"] = sample.completion_ids.tolist()
            top["prompt_token_ids"] = prompt_ids.tolist()
        choice.update(_routed_experts(data, sample))
        reply = Reply(
            self.chat.parse(sample.completion_ids),
            sample.finish_reason,
            len(prompt_ids),
            len(sample.completion_ids),
            sample.policy_version,
            {"choice": choice, "top": top},
        )
        if chat_request.stream:
            return sse_response(OPENAI_CHAT.reply_events(chat_request, reply))
        return json_response(OPENAI_CHAT.reply(chat_request, reply))
