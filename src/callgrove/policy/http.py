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

A call's `policy_version` is the one the response names (serve-policy's `policy_version`);
where it names none, a client made with `server_versions` reads it from the server
(`ServerVersions`: vLLM reports none in its responses), and otherwise it is the newest version
the client has been told so far (0 before any).
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import numpy as np
import orjson

from callgrove.episode import LOGPROB_DTYPE, TOKEN_DTYPE
from callgrove.episode.checks import sampling_problem
from callgrove.episode.record import ROUTE_DTYPE
from callgrove.errors import InvalidValue, RunFailed
from callgrove.formats.routes import ROUTED_EXPERTS, decode_routed_experts
from callgrove.policy.client import Completion, SamplingParams
from callgrove.sampling import Distribution


class UpstreamError(RunFailed):
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
        **distribution_fields(params),
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


def distribution_fields(distribution: Distribution) -> dict[str, object]:
    """The sampling distribution as a request's fields (no `top_k`: no cut)."""
    fields: dict[str, object] = {
        "temperature": distribution.temperature,
        "top_p": distribution.top_p,
    }
    if distribution.top_k is not None:
        fields["top_k"] = distribution.top_k
    return fields


def reported_distribution(payload: dict, params: SamplingParams, tempered: bool) -> dict:
    """The distribution an upstream's logprobs are under (see the module): an `UpstreamError`
    where it cannot be known."""
    named = payload.get("sampling")
    if named is not None:
        problem = sampling_problem(named)
        if problem is not None:
            raise UpstreamError(f"upstream named its sampling distribution wrongly: {problem}")
        return named
    if tempered or params.whole:
        return params.record()
    raise UpstreamError(
        "the upstream does not say which distribution its logprobs are under, and at "
        f"{distribution_fields(params)} a server's default ones are "
        "untempered (not the behaviour policy's): start vLLM with --logprobs-mode "
        "processed_logprobs and tell the client so (tempered_logprobs), or sample at "
        "temperature 1 and top_p 1",
        status=400,
    )


TOKEN_ID_MAX = int(np.iinfo(TOKEN_DTYPE).max)

UPSTREAM_EVENT_LIMIT = 64 * 1024 * 1024
"""The longest line a streamed answer may send: its first event carries the whole prompt's
`prompt_token_ids` (vLLM, serve-policy), at most about 8 bytes a token, so 64 MiB holds a
prompt of some 8 million tokens, far past any context (aiohttp's own limit, 512 KiB, cut
prompts of about 140,000 tokens)."""


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
        routes=routes_of(choice),
    )


def routes_of(choice: dict) -> np.ndarray | None:
    """A choice's `routed_experts` (a mixture of experts' routes, vLLM's field), or None."""
    text = choice.get(ROUTED_EXPERTS)
    if text is None:
        return None
    try:
        return decode_routed_experts(text, f"choices[0].{ROUTED_EXPERTS}").astype(ROUTE_DTYPE)
    except InvalidValue as error:
        raise UpstreamError(f"upstream response: {error}") from None


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
    routes: np.ndarray | None = None  # a mixture of experts' routes, on the chunk that has them


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
        routes=routes_of(choice),
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
        routes=next((p.routes for p in reversed(pieces) if p.routes is not None), None),
    )


def sample_from_chat(payload: dict, fallback_version: int) -> tuple[np.ndarray, Completion, dict]:
    """(prompt ids, sample, the choice's message) of a chat response with vLLM's token fields."""
    try:
        choice = payload["choices"][0]
        message = choice["message"]
        prompt = payload.get("prompt_token_ids") or choice.get("prompt_token_ids")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise UpstreamError("upstream chat response has no choices[0].message") from None
    if not prompt:
        raise UpstreamError(
            "upstream chat response has no prompt_token_ids: the server must support "
            "return_token_ids"
        )
    try:
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [entry.get("logprob") for entry in content]
    except (TypeError, AttributeError):
        raise UpstreamError(
            "upstream chat response's choices[0].logprobs.content is not a list of "
            "per-token logprobs"
        ) from None
    sample = sample_from_completion(
        {
            "choices": [
                {
                    "token_ids": choice.get("token_ids"),
                    "logprobs": {"token_logprobs": logprobs},
                    "finish_reason": choice.get("finish_reason"),
                    ROUTED_EXPERTS: choice.get(ROUTED_EXPERTS),
                }
            ],
            "policy_version": payload.get("policy_version"),
        },
        fallback_version,
    )
    return token_ids_of(prompt, "prompt_token_ids"), sample, message


def adapter_name(served_model: str, version: int) -> str:
    """The name callgrove's vLLM sampler loads the LoRA adapter of `version` under."""
    return f"{served_model}-v{version}"


def adapter_version(name: str) -> int | None:
    """The version an adapter name of `adapter_name`'s form says, else None."""
    found = _ADAPTER.fullmatch(name)
    return int(found.group(1)) if found else None


_ADAPTER = re.compile(r".+-v(0|[1-9][0-9]{0,17})")
LATEST = "latest"
"""The upstream model name that asks for the newest adapter the server lists."""


class ServerVersions:
    """The policy version a vLLM server holds, read around each call.

    - A LoRA adapter that callgrove's sampler pushed is listed on `/v1/models` (with its base
      model as `parent`) under `adapter_name`'s form, `NAME-vN`: a call to it is version N.
      The model name `latest` asks for the newest such adapter on every call (the base model
      where none is listed).
    - Full weights pushed by callgrove's sampler set the server's weight version
      (`/update_weight_version`, read back on `/weight_info`; vLLM's dev endpoints). It is read
      before a call and again once the call's first tokens are back: a server callgrove
      pushes pauses for the calls it runs to finish (`/pause?mode=wait`), so equal readings
      are the version that sampled the call. Readings that differ (a push landed while the
      call waited to start), a version that is not an integer (vLLM's own is "default"), or a
      server without `/weight_info` leave it unknown: the call then records the newest version
      the client read or was told before (0 before any).
    """

    def __init__(self) -> None:
        self.adapters: dict[str, int | None] = {}
        """Model names seen, with the version each names (None: not a pushed adapter)."""
        self.weight_info = True
        """Whether the server answers `/weight_info` (one 404 says it does not)."""


@dataclass(frozen=True, slots=True)
class _Asked:
    """What one call asks for: the model name, and the version known before it is sent
    (the adapter's, or the server's weight version read then; None: unknown)."""

    model: str
    version: int | None
    from_weights: bool


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
        server_versions: bool = False,
    ):
        """`tempered_logprobs`: the server reports logprobs of the distribution it sampled from
        at any settings (see the module); `server_versions`: read each call's version from the
        server (`ServerVersions`) where its response names none. Credentials in the URL
        (`user:password@host`) are sent as basic auth and kept out of the URL, so no error or
        ledger line can echo them."""
        self.base_url, credentials = split_credentials(base_url.rstrip("/"))
        if credentials is not None and token:
            raise InvalidValue("give the upstream credentials in its URL or as a token, not both")
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
        self.versions = ServerVersions() if server_versions else None
        self._session: Any = None  # an aiohttp session, made in (and bound to) the running loop
        self._session_loop: Any = None

    @property
    def version(self) -> int:
        """The policy version of the latest sample the server returned."""
        return self._version

    async def sample(self, prompt_ids: np.ndarray, params: SamplingParams) -> Completion:
        asked, payload = await self._post_asked(
            "/v1/completions", lambda model: completion_request(prompt_ids, params, model)
        )
        sample = sample_from_completion(payload, await self._settled(asked))
        self._version = max(self._version, sample.policy_version)
        return replace(sample, sampling=self._distribution(payload, params))

    async def _post_asked(self, path: str, body_for: Callable[[str], dict]) -> tuple[_Asked, dict]:
        """POST a call for the model `_ask` picks. The newest adapter can be unloaded between
        asking which it is and the call reaching the server (which then answers 404, having
        sampled nothing): the call is then asked once more."""
        for retry in (False, True):
            asked = await self._ask()
            try:
                return asked, await self._post(path, body_for(asked.model))
            except UpstreamError as error:
                if retry or error.status != 404 or self.model != LATEST:
                    raise
        raise AssertionError("unreachable")

    async def _ask(self) -> _Asked:
        """The model a call asks for and the version known before it is sent."""
        if self.versions is None:
            return _Asked(self.model, None, False)
        model = await self._latest() if self.model == LATEST else self.model
        if model not in self.versions.adapters:
            await self._list_adapters()
            self.versions.adapters.setdefault(model, None)  # not listed: no adapter of ours
        named = self.versions.adapters[model]
        if named is not None:
            return _Asked(model, named, False)
        return _Asked(model, await self._weight_version(), True)

    async def _settled(self, asked: _Asked) -> int:
        """A call's version once its first tokens are back: the one known before it was sent
        where that still holds, else the client's newest (see `ServerVersions`)."""
        if asked.version is None:
            return self._version
        if asked.from_weights and await self._weight_version() != asked.version:
            return self._version
        return asked.version

    async def _models(self) -> list[dict]:
        """`/v1/models`' entries (none where the server has no such path)."""
        listing = await self._get("/v1/models")
        if listing is None:
            return []
        data = listing.get("data")
        if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
            raise UpstreamError("upstream /v1/models is not a list of models (data)")
        return data

    async def _list_adapters(self) -> list[dict]:
        """`/v1/models`, its entries' versions remembered (`ServerVersions.adapters`)."""
        assert self.versions is not None
        data = await self._models()
        for entry in data:
            name = entry.get("id")
            if isinstance(name, str):
                self.versions.adapters[name] = (
                    adapter_version(name) if entry.get("parent") else None
                )
        return data

    async def _latest(self) -> str:
        """The newest pushed adapter the server lists, else its base model."""
        assert self.versions is not None
        data = await self._list_adapters()
        listed = [e["id"] for e in data if isinstance(e.get("id"), str)]
        adapters = [(v, n) for n in listed if (v := self.versions.adapters.get(n)) is not None]
        if adapters:
            return max(adapters)[1]
        bases = [e["id"] for e in data if isinstance(e.get("id"), str) and not e.get("parent")]
        if not bases:
            raise UpstreamError("upstream /v1/models lists no model to ask for as 'latest'")
        return bases[0]

    async def _weight_version(self) -> int | None:
        """The server's weight version (`/weight_info`) where it is an integer."""
        assert self.versions is not None
        if not self.versions.weight_info:
            return None
        info = await self._get("/weight_info")
        if info is None:
            self.versions.weight_info = False
            return None
        value = info.get("weight_version")
        if not isinstance(value, str) or not value.isdecimal() or len(value) > 18:
            return None
        version = int(value)
        self._version = max(self._version, version)
        return version

    async def _get(self, path: str) -> dict | None:
        """A GET's JSON object; None where the server has no such path (404)."""
        import aiohttp

        try:
            async with self._client().get(self.base_url + path) as response:
                status, raw = response.status, await response.read()
        except TimeoutError:
            raise UpstreamError(f"{path}: upstream {self.base_url} timed out", 504) from None
        except aiohttp.ClientError as error:
            raise UpstreamError(f"{path}: upstream {self.base_url} unreachable: {error}") from None
        if status == 404:
            return None
        if status != 200:
            raise _status_error(status, raw)
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise UpstreamError(f"upstream {path} answered something that is not JSON") from None
        if not isinstance(payload, dict):
            raise UpstreamError(f"upstream {path} answered JSON that is not an object")
        return payload

    def _distribution(self, payload: dict, params: SamplingParams) -> dict:
        return reported_distribution(payload, params, self.tempered_logprobs)

    async def stream(self, prompt_ids: np.ndarray, params: SamplingParams) -> AsyncIterator[Piece]:
        """Sample like `sample`, streamed: the pieces as the server sends them (SSE)."""
        import aiohttp
        from aiohttp.http_exceptions import LineTooLong

        asked = await self._ask()
        body = {**completion_request(prompt_ids, params, asked.model), "stream": True}
        version: int | None = None  # settled once the first piece is back
        try:
            async with self._client().post(
                self.base_url + "/v1/completions",
                data=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
            ) as response:
                if response.status != 200:
                    raise _status_error(response.status, await response.read())
                while line := await response.content.readline(max_line_length=UPSTREAM_EVENT_LIMIT):
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
                    if piece.policy_version is None and self.versions is not None:
                        if version is None:
                            version = await self._settled(asked)
                        piece = replace(piece, policy_version=version)
                    if piece.policy_version is not None:
                        self._version = max(self._version, piece.policy_version)
                    yield piece
        except TimeoutError:
            raise UpstreamError(f"upstream {self.base_url} timed out", 504) from None
        except aiohttp.ClientError as error:
            raise UpstreamError(f"upstream {self.base_url} unreachable: {error}") from None
        except LineTooLong:
            raise UpstreamError(
                f"upstream streamed a line over the {UPSTREAM_EVENT_LIMIT}-byte limit"
            ) from None

    async def chat(
        self, messages: list[dict], tools: list[dict], params: SamplingParams
    ) -> tuple[np.ndarray, Completion, dict]:
        """Pass-through: the upstream renders the chat itself and reports the token ids it used."""
        body: dict[str, object] = {
            "messages": messages,
            "max_tokens": params.max_tokens,
            **distribution_fields(params),
            "logprobs": True,
            "top_logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if tools:
            body["tools"] = tools
        if params.stop:
            body["stop"] = list(params.stop)
        asked, payload = await self._post_asked(
            "/v1/chat/completions", lambda model: {"model": model, **body}
        )
        prompt, sample, message = sample_from_chat(payload, await self._settled(asked))
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
