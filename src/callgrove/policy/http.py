"""A policy behind an OpenAI-compatible server: token ids in, token ids and log-probabilities out.

`HttpPolicyClient` sends the prompt as a list of token ids to `/v1/completions` and asks for the
token extras vLLM and SGLang return (`return_token_ids`, per-token `logprobs`,
`return_tokens_as_token_ids`), so what it hands back is exactly what was sampled, never a
re-tokenisation of text. `callgrove serve-policy` answers the same shapes, with the policy
version in every response.

Which distribution the server's logprobs are under is recorded on every sample (a call's
`sampling`): the one the server names in its response (`sampling`, as serve-policy does),
else the request's own settings where the logprobs are known to be of them: at temperature 1
and top-p 1 (nothing is tempered or cut), or at any settings for a server that reports
processed log-probabilities (`tempered_logprobs`: vLLM started with `--logprobs-mode
processed_logprobs`). Otherwise the call fails saying so: vLLM's default logprobs are those of
the untempered distribution, and recording them as the behaviour policy's would skew every
importance ratio.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import numpy as np
import orjson

from callgrove.episode import LOGPROB_DTYPE, TOKEN_DTYPE
from callgrove.episode.checks import sampling_problem
from callgrove.policy.client import Completion, SamplingParams


class UpstreamError(Exception):
    """The inference server failed or answered something without the token fields."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


def completion_request(
    prompt_ids: np.ndarray, params: SamplingParams, model: str
) -> dict[str, object]:
    """The `/v1/completions` body for a token prompt, with vLLM / SGLang token extras."""
    body: dict[str, object] = {
        "model": model,
        "prompt": np.ascontiguousarray(
            prompt_ids, dtype=TOKEN_DTYPE
        ),  # orjson writes arrays natively
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.stop:
        body["stop"] = list(params.stop)
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def reported_distribution(payload: dict, params: SamplingParams, tempered: bool) -> dict:
    """The distribution an upstream's logprobs are under (see the module): an `UpstreamError`
    where it cannot be known."""
    named = payload.get("sampling")
    if named is not None:
        problem = sampling_problem(named)
        if problem is not None:
            raise UpstreamError(f"upstream named its sampling distribution wrongly: {problem}")
        return named
    if tempered or (params.temperature == 1.0 and params.top_p == 1.0):
        return params.recorded()
    raise UpstreamError(
        "the upstream does not say which distribution its logprobs are under, and at "
        f"temperature {params.temperature} / top_p {params.top_p} a server's default ones are "
        "untempered (not the behaviour policy's): start vLLM with --logprobs-mode "
        "processed_logprobs and tell the client so (tempered_logprobs), or sample at "
        "temperature 1 and top_p 1",
        status=400,
    )


TOKEN_ID_MAX = int(np.iinfo(TOKEN_DTYPE).max)


def token_ids_of(values: Any, field: str) -> np.ndarray:
    """An upstream's token ids as the stored dtype: every one a JSON integer that fits, else an
    `UpstreamError` naming the field (a cast would truncate 1.5 to 1, or wrap a large id)."""
    if not isinstance(values, list):
        raise UpstreamError(f"upstream {field} is not a list of token ids")
    for value in values:
        if type(value) is not int:  # bools and floats are ints to numpy
            raise UpstreamError(f"upstream {field} holds {value!r}, not an integer token id")
        if not 0 <= value <= TOKEN_ID_MAX:
            raise UpstreamError(f"upstream {field} holds {value}, not a token id")
    return np.asarray(values, dtype=TOKEN_DTYPE)


def logprobs_of(values: Any, field: str) -> np.ndarray:
    """An upstream's per-token log-probabilities: JSON numbers, else an `UpstreamError` naming
    the field (numpy would read the string "-0.5" or `true` as a number)."""
    if not isinstance(values, list):
        raise UpstreamError(f"upstream {field} is not a list of log-probabilities")
    for value in values:
        if type(value) not in (float, int):
            raise UpstreamError(f"upstream {field} holds {value!r}, not a log-probability")
    return np.asarray(values, dtype=LOGPROB_DTYPE)


def version_of(payload: dict, fallback: int | None) -> int | None:
    """The response's `policy_version`: a JSON integer (1.5 or "3" is an `UpstreamError`, never
    rounded), else `fallback` where it says none."""
    version = payload.get("policy_version")
    if version is None:
        return fallback
    if type(version) is not int:
        raise UpstreamError(f"upstream policy_version {version!r} is not an integer")
    return version


def sample_from_completion(payload: dict, fallback_version: int) -> Completion:
    """The sample a `/v1/completions` response carries; an error when its token fields lack."""
    try:
        choice = payload["choices"][0]
        ids = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise UpstreamError("upstream response has no choices") from None
    if not ids:
        raise UpstreamError(
            "upstream response has no completion token ids (choices[0].token_ids): "
            "the server must support return_token_ids"
        )
    if not isinstance(logprobs, list) or len(logprobs) != len(ids) or None in logprobs:
        raise UpstreamError(
            "upstream response has no per-token logprobs matching its token ids "
            "(choices[0].logprobs.token_logprobs)"
        )
    finish = "length" if choice.get("finish_reason") == "length" else "stop"
    return Completion(
        completion_ids=token_ids_of(ids, "choices[0].token_ids"),
        logprobs=logprobs_of(logprobs, "choices[0].logprobs.token_logprobs"),
        policy_version=version_of(payload, fallback_version),
        finish_reason=finish,
    )


@dataclass(frozen=True, slots=True)
class Piece:
    """One chunk of a streamed completion: its new tokens, their logprobs, and (on the last
    chunk) why sampling ended."""

    token_ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: str | None
    policy_version: int | None
    sampling: dict | None = None
    """The distribution the logprobs are under (`reported_distribution`), set by the client."""


def piece_from_chunk(payload: dict) -> Piece:
    """The piece a streamed `/v1/completions` chunk carries (vLLM: each chunk's `token_ids` and
    `logprobs.token_logprobs` are deltas)."""
    try:
        choice = payload["choices"][0]
        ids = choice.get("token_ids") or []
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
    except (KeyError, IndexError, TypeError, AttributeError):
        raise UpstreamError("upstream stream chunk has no choices") from None
    if not isinstance(ids, list) or not isinstance(logprobs, list) or len(logprobs) != len(ids):
        raise UpstreamError(
            "upstream stream chunk has no per-token logprobs matching its token ids "
            "(choices[0].logprobs.token_logprobs, choices[0].token_ids)"
        )
    return Piece(
        token_ids_of(ids, "stream chunk choices[0].token_ids"),
        logprobs_of(logprobs, "stream chunk choices[0].logprobs.token_logprobs"),
        choice.get("finish_reason"),
        version_of(payload, None),
    )


def sample_from_pieces(pieces: list[Piece], fallback_version: int) -> Completion:
    """The whole sample of a streamed completion."""
    if not pieces or not sum(len(p.token_ids) for p in pieces):
        raise UpstreamError("upstream stream ended without completion token ids")
    if pieces[-1].finish_reason is None:
        raise UpstreamError("upstream stream ended before its finish reason")
    versions = [p.policy_version for p in pieces if p.policy_version is not None]
    return Completion(
        completion_ids=np.concatenate([p.token_ids for p in pieces]),
        logprobs=np.concatenate([p.logprobs for p in pieces]),
        policy_version=versions[0] if versions else fallback_version,
        finish_reason="length" if pieces[-1].finish_reason == "length" else "stop",
        sampling=next((p.sampling for p in pieces if p.sampling is not None), None),
    )


def sample_from_chat(payload: dict, fallback_version: int) -> tuple[np.ndarray, Completion, dict]:
    """(prompt ids, sample, the choice's message) of a chat response with vLLM's token fields."""
    try:
        choice = payload["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise UpstreamError("upstream chat response has no choices[0].message") from None
    prompt = payload.get("prompt_token_ids") or choice.get("prompt_token_ids")
    if not prompt:
        raise UpstreamError(
            "upstream chat response has no prompt_token_ids: the server must support "
            "return_token_ids"
        )
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [entry.get("logprob") for entry in content if isinstance(entry, dict)]
    sample = sample_from_completion(
        {
            "choices": [
                {
                    "token_ids": choice.get("token_ids"),
                    "logprobs": {"token_logprobs": logprobs},
                    "finish_reason": choice.get("finish_reason"),
                }
            ],
            "policy_version": payload.get("policy_version"),
        },
        fallback_version,
    )
    return token_ids_of(prompt, "prompt_token_ids"), sample, message


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(the URL without `user:password@`, the (user, password) it carried or None)."""
    parts = urlsplit(url)
    if parts.username is None and "@" not in parts.netloc:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return bare, (unquote(parts.username or ""), unquote(parts.password or ""))


class HttpPolicyClient:
    """`PolicyClient` over HTTP; one pooled keep-alive connection set for all concurrent calls.

    aiohttp (its C HTTP parser) and orjson keep the client's own cost per call well under a
    millisecond: at the gateway's rates the HTTP client is most of what a call costs.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "policy",
        token: str | None = None,
        timeout: float = 600.0,
        max_connections: int = 256,
        tempered_logprobs: bool = False,
    ):
        """`tempered_logprobs`: the server reports logprobs of the distribution it sampled from
        at any settings (see the module). Credentials in the URL (`user:password@host`) are
        sent as basic auth and kept out of the URL, so no error or ledger line can echo them."""
        self.base_url, credentials = split_credentials(base_url.rstrip("/"))
        if credentials is not None and token:
            raise ValueError("give the upstream credentials in its URL or as a token, not both")
        self.tempered_logprobs = tempered_logprobs
        self.model = model
        self.timeout = timeout
        self.max_connections = max_connections
        self._headers = {"content-type": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        elif credentials is not None:
            pair = base64.b64encode(":".join(credentials).encode()).decode()
            self._headers["authorization"] = f"Basic {pair}"
        self._version = 0
        self._session: Any = None  # an aiohttp session, made in (and bound to) the running loop
        self._session_loop: Any = None

    @property
    def version(self) -> int:
        """The policy version of the latest sample the server returned."""
        return self._version

    async def sample(self, prompt_ids: np.ndarray, params: SamplingParams) -> Completion:
        body = completion_request(prompt_ids, params, self.model)
        payload = await self._post("/v1/completions", body)
        sample = sample_from_completion(payload, self._version)
        self._version = max(self._version, sample.policy_version)
        return replace(sample, sampling=self._distribution(payload, params))

    def _distribution(self, payload: dict, params: SamplingParams) -> dict:
        return reported_distribution(payload, params, self.tempered_logprobs)

    async def stream(self, prompt_ids: np.ndarray, params: SamplingParams) -> AsyncIterator[Piece]:
        """Sample like `sample`, streamed: the pieces as the server sends them (SSE)."""
        import aiohttp

        body = {**completion_request(prompt_ids, params, self.model), "stream": True}
        try:
            async with self._client().post(
                self.base_url + "/v1/completions",
                data=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
            ) as response:
                if response.status != 200:
                    raise _status_error(response.status, await response.read())
                async for line in response.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    try:
                        payload = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        raise UpstreamError(
                            "upstream streamed something that is not JSON"
                        ) from None
                    if not isinstance(payload, dict):
                        raise UpstreamError("upstream streamed JSON that is not an object")
                    piece = replace(
                        piece_from_chunk(payload), sampling=self._distribution(payload, params)
                    )
                    if piece.policy_version is not None:
                        self._version = max(self._version, piece.policy_version)
                    yield piece
        except TimeoutError:
            raise UpstreamError(f"upstream {self.base_url} timed out", 504) from None
        except aiohttp.ClientError as error:
            raise UpstreamError(f"upstream {self.base_url} unreachable: {error}") from None

    async def chat(
        self, messages: list[dict], tools: list[dict], params: SamplingParams
    ) -> tuple[np.ndarray, Completion, dict]:
        """Pass-through: the upstream renders the chat itself and reports the token ids it used."""
        body: dict[str, object] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": True,
            "top_logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if tools:
            body["tools"] = tools
        if params.stop:
            body["stop"] = list(params.stop)
        payload = await self._post("/v1/chat/completions", body)
        prompt, sample, message = sample_from_chat(payload, self._version)
        self._version = max(self._version, sample.policy_version)
        return prompt, replace(sample, sampling=self._distribution(payload, params)), message

    def _client(self) -> Any:
        import asyncio

        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session_loop = loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, ttl_dns_cache=None),
                timeout=aiohttp.ClientTimeout(
                    total=self.timeout, sock_connect=min(self.timeout, 10.0)
                ),
                headers=self._headers,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def _post(self, path: str, body: dict) -> dict:
        import aiohttp

        url = self.base_url + path
        try:
            async with self._client().post(
                url, data=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
            ) as response:
                status = response.status
                raw = await response.read()
        except TimeoutError:
            raise UpstreamError(f"upstream {self.base_url} timed out", 504) from None
        except aiohttp.ClientError as error:
            raise UpstreamError(f"upstream {self.base_url} unreachable: {error}") from None
        if status != 200:
            raise _status_error(status, raw)
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise UpstreamError("upstream answered something that is not JSON") from None
        if not isinstance(payload, dict):
            raise UpstreamError("upstream answered JSON that is not an object")
        return payload

    async def control(self, path: str, body: dict | None = None) -> None:
        """POST a control request (a weight reload, an adapter load) whose answer is only its
        status; an `UpstreamError` naming `path` unless it is 200."""
        import aiohttp

        try:
            async with self._client().post(self.base_url + path, json=body) as response:
                if response.status != 200:
                    text = (await response.read())[:500].decode(errors="replace")
                    raise UpstreamError(f"{path} answered {response.status}: {text}")
        except TimeoutError:
            raise UpstreamError(f"{path}: upstream {self.base_url} timed out", 504) from None
        except aiohttp.ClientError as error:
            raise UpstreamError(f"{path}: upstream {self.base_url} unreachable: {error}") from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def _status_error(status: int, raw: bytes) -> UpstreamError:
    text = raw[:500].decode(errors="replace")
    return UpstreamError(
        f"upstream answered {status}: {text}", status if 400 <= status < 600 else 502
    )
