"""The capture gateway: chat requests in, token prompts to the policy, every call in the ledger.

For each request the gateway finds who is calling (`attribution`), renders the conversation to
tokens, samples from the policy (any `PolicyClient`; over HTTP, `HttpPolicyClient` sends the
token ids to `/v1/completions`), parses the completion back into text and tool calls, appends
the call to the episode's ledger and waits for it to be durable (`episodes`), and only then
answers, in the API shape the client asked in (`routes`).

Invariant: a call's path ends one of two ways, never both and never neither: recorded (its
line durable, then it joins its episode, then the client hears the reply) or failed (the
client hears the error; a `failed` line records it, unless the client's own request was the
mistake).

Token-exact continuation: every recorded call is indexed by a hash of its conversation
(messages normalised: cache-control markers dropped, system text joined, reasoning left out)
through its answer. A request whose messages start with such a conversation is rendered as that
call's exact full token sequence plus the tokens of the messages added since, so the forest sees
the extension the harness meant; the longest such call wins, one of the requesting agent first.
A request that extends none (a compaction's next call, a fork that drops text) is rendered
whole and starts a new tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from callgrove.chat import ChatFormat, Message, tools_message
from callgrove.episode import TOKEN_DTYPE, Agent, Call, sampling_record
from callgrove.episode.record import share_routes
from callgrove.gateway.attribution import Identity
from callgrove.gateway.episodes import (
    Episodes,
    EpisodeState,
    LedgerWriteError,
    Recorded,
    chain_hashes,
    closed_error,
    message_key,
)
from callgrove.gateway.ledger import CallNote, LedgerAgent, call_line
from callgrove.policy import Completion, PolicyClient, SamplingParams
from callgrove.policy.client import DEFAULT_MAX_TOKENS
from callgrove.policy.http import Piece, UpstreamError, sample_from_pieces
from callgrove.serving.bodies import assistant_message
from callgrove.serving.dialects.dialect import ChatRequest, Dialect, Reply
from callgrove.serving.dialects.openai_chat import openai_history, openai_message, openai_tools
from callgrove.serving.streaming import PlainText
from callgrove.serving.web import DEFAULT_BODY_LIMIT, HttpError


def recorded_sampling(sent: dict | None, request: ChatRequest) -> dict | None:
    """A call's `sampling`: the distribution the policy sampled from (what was sent upstream,
    which its logprobs are under), with the client's own request beside it (`requested`) where
    the two differ (a training loop's settings replace the client's)."""
    if sent is None:
        return None
    asked = sampling_record(request.temperature, request.top_p)
    if all(sent.get(key) == value for key, value in asked.items()):
        return sent
    return {**sent, "requested": asked}


@dataclass(eq=False)
class HandledCall:
    """One call being handled: who makes it, what it extends, how it is sampled."""

    dialect: Dialect  # the client's API: its replies' and errors' shape
    request: ChatRequest
    state: EpisodeState
    agent: Agent
    who: Identity
    tools: Message | None
    tools_hash: bytes
    hashes: list[bytes]
    base: Recorded | None
    cut: int
    params: SamplingParams
    call_id: str | None = None  # handed out when the reply starts before the call is recorded


INT64_MAX = int(np.iinfo(np.int64).max)


def upstream_problem(
    prompt: np.ndarray, sample: Completion, max_tokens: int, vocab_size: int
) -> str | None:
    """What makes an upstream's sample unusable as a recorded call, or None: the ledger holds
    only token ids the policy has, log-probabilities that are ones, and what was asked for."""
    ids, logprobs, version = sample.completion_ids, sample.logprobs, sample.policy_version
    for name, values in (("prompt", prompt), ("completion", ids)):
        if values.dtype.kind not in "iu":
            return f"{name} token ids are not integers ({values.dtype})"
        if len(values) and (int(values.min()) < 0 or int(values.max()) >= vocab_size):
            return (
                f"{name} token ids run from {int(values.min())} to {int(values.max())}, "
                f"outside the vocabulary [0, {vocab_size})"
            )
    if not len(ids):
        return "the completion has no tokens"
    if len(ids) > max_tokens:
        return f"{len(ids)} completion tokens, more than the {max_tokens} asked for"
    if logprobs is None or len(logprobs) != len(ids):
        return f"{0 if logprobs is None else len(logprobs)} log-probabilities for {len(ids)} tokens"
    if not np.all(np.isfinite(logprobs)) or float(np.max(logprobs)) > 0:
        return "log-probabilities must be finite and at most 0"
    if version is not None and (
        not isinstance(version, int | np.integer)
        or isinstance(version, bool)
        or not 0 <= int(version) <= INT64_MAX
    ):
        return f"policy_version {version!r} is not a non-negative 64-bit integer"
    return None


class Gateway:
    """One call's path from request to recorded reply, over a ledger folder's `episodes`."""

    def __init__(
        self,
        policy: PolicyClient,
        chat: ChatFormat,
        ledger: str | Path,
        *,
        tokens: list[str] | None = None,
        body_limit: int = DEFAULT_BODY_LIMIT,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        passthrough: bool = False,
        sampling: SamplingParams | None = None,
        close_wait: float = 30.0,
    ):
        self.policy = policy
        self.chat = chat
        # `LedgerInUse` while another gateway holds the folder.
        self.episodes = Episodes(Path(ledger), close_wait)
        self.tokens = tokens or []
        self.body_limit = body_limit
        self.max_tokens = max_tokens
        # The upstream applies its own chat template: its reported token ids are recorded.
        self.passthrough = passthrough
        # A training loop's own sampling (temperature, top-p, seed, stop strings; its
        # max_tokens caps the request's): the calls are sampled as the loop samples its own.
        self.sampling = sampling
        self.vocab_size = chat.vocab_size
        self.in_flight = 0  # calls being handled now (`handling`)

    @contextlib.contextmanager
    def handling(self) -> Iterator[None]:
        """Count a call as in flight while it is handled (`_alone` reads the count)."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def _turn(
        self, dialect: Dialect, chat_request: ChatRequest, episode_id: str, who: Identity
    ) -> HandledCall:
        """Who calls, which recorded call the request extends, how it is sampled."""
        state = self.episodes.episode(episode_id)
        if state.closing or state.closed:
            raise closed_error(episode_id)
        agent = state.roster.agent_for(who, chat_request.messages)
        messages = chat_request.messages
        tools = tools_message(chat_request.tools)
        tools_hash = hashlib.blake2b(message_key(tools) if tools else b"", digest_size=16).digest()
        hashes = chain_hashes(messages)
        base, cut = state.base_for(agent, hashes, messages, tools_hash, who.purpose == "compaction")
        params = self._params(chat_request)
        state.enter()  # `leave` once the call is recorded or failed
        return HandledCall(
            dialect,
            chat_request,
            state,
            agent,
            who,
            tools,
            tools_hash,
            hashes,
            base,
            cut,
            params,
        )

    async def call(
        self, dialect: Dialect, chat_request: ChatRequest, episode_id: str, who: Identity
    ) -> Reply:
        """Render, sample, parse and record one call; returns the reply to send."""
        turn = self._turn(dialect, chat_request, episode_id, who)
        messages, base = chat_request.messages, turn.base
        try:
            if self.passthrough:
                prompt, sample, response, base = await self._passthrough(
                    chat_request, turn.params, turn.state, base
                )
                suffix = prompt[base.call.full_len :] if base else prompt
                new = messages[turn.cut :] if base else messages
            else:
                prompt, suffix, new = self._render(messages, turn, base)
                sample = self._checked(
                    prompt, await self.policy.sample(prompt, turn.params), turn.params
                )
                response = self.chat.parse(sample.completion_ids)
            return await self._record(turn, base, prompt, suffix, new, sample, response)
        except Exception as error:
            raise await self._failed(turn, error) from None
        finally:
            turn.state.leave()

    def streams(self, chat_request: ChatRequest) -> bool:
        """Whether this request's reply is streamed as the upstream samples it."""
        return chat_request.stream and not self.passthrough and hasattr(self.policy, "stream")

    async def stream_call(
        self, dialect: Dialect, chat_request: ChatRequest, episode_id: str, who: Identity
    ) -> tuple[str, AsyncIterator[bytes]]:
        """The call streamed: its id, and its events as the upstream's pieces arrive. Errors
        before the first piece are raised (`HttpError`), later ones end the stream in the API's
        error events; either way the ledger records the failure. The call's line is durable
        before the terminal events are sent."""
        turn = self._turn(dialect, chat_request, episode_id, who)
        try:
            prompt, suffix, new = self._render(chat_request.messages, turn, turn.base)
            pieces = self.policy.stream(prompt, turn.params)  # type: ignore[attr-defined]
            first = await anext(pieces)
        except StopAsyncIteration:
            turn.state.leave()
            raise await self._failed(turn, UpstreamError("upstream stream sent nothing")) from None
        except Exception as error:
            turn.state.leave()
            raise await self._failed(turn, error) from None
        turn.call_id = turn.state.next_call_id()
        return turn.call_id, self._stream_events(turn, prompt, suffix, new, first, pieces)

    async def _stream_events(
        self,
        turn: HandledCall,
        prompt: np.ndarray,
        suffix: np.ndarray,
        new: list[Message],
        first: Piece,
        pieces: AsyncIterator[Piece],
    ) -> AsyncIterator[bytes]:
        self.in_flight += 1
        recorded = False
        try:
            version = first.policy_version if first.policy_version is not None else 0
            out = turn.dialect.stream(turn.request, len(prompt), version)
            yield b"".join(out.opening())
            received = [first]
            plain = PlainText(self.chat)
            yield b"".join(out.text(plain.add(first.token_ids)))
            try:
                async for piece in pieces:
                    received.append(piece)
                    yield b"".join(out.text(plain.add(piece.token_ids)))
                sample = self._checked(prompt, sample_from_pieces(received, version), turn.params)
                response = self.chat.parse(sample.completion_ids)
                reply = await self._record(turn, turn.base, prompt, suffix, new, sample, response)
                recorded = True
            except Exception as error:
                recorded = True
                failed = await self._failed(turn, error)
                yield b"".join(turn.dialect.error_events(failed))
                return
            yield b"".join(out.closing(reply))
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away before the reply ended: the call never reached it whole, so
            # it is recorded as failed (not kept), and the upstream stops sampling it.
            if not recorded:
                await asyncio.shield(self._client_left(turn, pieces))
            raise
        finally:
            self.in_flight -= 1
            turn.state.leave()

    async def _client_left(self, turn: HandledCall, pieces: AsyncIterator[Piece]) -> None:
        await turn.state.record_failure(
            turn.agent, turn.dialect.name, "client disconnected before the reply ended"
        )
        closing = getattr(pieces, "aclose", None)
        if closing is not None:
            await closing()

    async def _failed(self, turn: HandledCall, error: BaseException) -> HttpError:
        """The client's error for a failed call, recorded in the ledger (an `HttpError` the
        gateway itself raised is the client's own mistake: not recorded)."""
        if isinstance(error, HttpError):
            return error
        if isinstance(error, LedgerWriteError):
            await turn.state.record_failure(turn.agent, turn.dialect.name, str(error))
            return HttpError(500, str(error), "server_error")
        if isinstance(error, UpstreamError):
            await turn.state.record_failure(turn.agent, turn.dialect.name, str(error))
            return HttpError(error.status, str(error), "upstream_error")
        # the policy failed: the client hears why; the ledger too
        await turn.state.record_failure(
            turn.agent, turn.dialect.name, f"{type(error).__name__}: {error}"
        )
        return HttpError(502, f"policy failed: {error}", "upstream_error")

    async def _record(
        self,
        turn: HandledCall,
        base: Recorded | None,
        prompt: np.ndarray,
        suffix: np.ndarray,
        new: list[Message],
        sample: Completion,
        response: Message,
    ) -> Reply:
        """Write the call's line and, once it is durable, add the call to its agent: a call is
        in the episode only if its line is on disk. Refused once the episode is closed."""
        state, agent, hashes = turn.state, turn.agent, turn.hashes
        if state.closed:
            raise closed_error(state.id, while_in_flight=True)

        previous = new[-1] if new else (base.response if base else None)
        state.seq += 1
        call = Call(
            id=turn.call_id or state.next_call_id(),
            seq=state.seq,
            completion_ids=sample.completion_ids,
            prompt_suffix=suffix,
            prompt_from=base.call.id if base else None,
            prompt_from_len=base.call.full_len if base else 0,
            logprobs=sample.logprobs,
            policy_version=sample.policy_version,
            purpose=turn.who.purpose,
            content={"prompt": [m.as_dict() for m in new], "response": response.as_dict()},
            sampling=recorded_sampling(sample.sampling, turn.request),
        )
        # a mixture of experts' routes, held as the prompt base's where they agree with them
        share_routes(call, sample.routes, state.find)
        history = chain_hashes([response], hashes[-1] if hashes else b"")[0]
        prompt_key = hashes[-1].hex() if hashes else ""
        note = CallNote(
            agent=LedgerAgent(agent.id, agent.name, agent.parent, agent.start),
            history=history.hex(),
            prompt_key=prompt_key,
            tools=turn.tools_hash.hex(),
            api=turn.dialect.name,
            harness=turn.who.harness,
            version=turn.who.version,
            path=turn.who.path,
            time=time.time(),
        )
        line = call_line(call, note)
        await state.append_call(call, line, await self._alone())
        agent.add(call)
        state.remember(
            Recorded(call, response, previous, history, turn.tools_hash, agent),
            prompt_key,
            new,
            turn.who.version,
        )
        return Reply(
            response,
            sample.finish_reason,
            len(prompt),
            len(sample.completion_ids),
            sample.policy_version,
            call_id=call.id,
        )

    def _checked(
        self, prompt: np.ndarray, sample: Completion, params: SamplingParams
    ) -> Completion:
        """The upstream's sample, if it can be recorded (`upstream_problem`); else a failed
        call, never a recorded one."""
        problem = upstream_problem(prompt, sample, params.max_tokens, self.vocab_size)
        if problem is not None:
            raise UpstreamError(f"upstream answer refused: {problem}", 502)
        return sample

    def _params(self, chat_request: ChatRequest) -> SamplingParams:
        max_tokens = min(chat_request.max_tokens, self.max_tokens)
        if self.sampling is None:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=chat_request.temperature,
                top_p=chat_request.top_p,
                stop_token_ids=self.chat.stop_token_ids,
                stop=chat_request.stop,
            )
        return msgspec.structs.replace(
            self.sampling,
            max_tokens=min(max_tokens, self.sampling.max_tokens),
            stop_token_ids=self.chat.stop_token_ids,
            stop=tuple(dict.fromkeys((*self.sampling.stop, *chat_request.stop))),
        )

    async def _alone(self) -> bool:
        """Whether no other call is in flight. One turn of the event loop first lets requests
        that have just arrived start (and count), so a burst is never taken for one call."""
        if self.in_flight > 1:
            return False
        await asyncio.sleep(0)
        return self.in_flight <= 1

    def _render(
        self, messages: list[Message], turn: HandledCall, base: Recorded | None
    ) -> tuple[np.ndarray, np.ndarray, list[Message]]:
        """(prompt, its suffix after the base call, the messages the suffix renders)."""
        if base is None:
            new = ([turn.tools] if turn.tools else []) + messages
            prompt = self.chat.render(new)
            return prompt, prompt, new
        new = messages[turn.cut :]
        suffix = np.concatenate(
            [self.chat.trailing(base.response, base.previous), self.chat.render(new, base.response)]
        ).astype(TOKEN_DTYPE)
        return np.concatenate([turn.state.full_ids(base.call), suffix]), suffix, new

    async def _passthrough(
        self,
        chat_request: ChatRequest,
        params: SamplingParams,
        state: EpisodeState,
        base: Recorded | None,
    ) -> tuple[np.ndarray, Completion, Message, Recorded | None]:
        """The upstream renders; its reported prompt ids are kept, referencing the base call
        only when they really start with its full sequence."""
        chat = getattr(self.policy, "chat", None)
        if chat is None:
            raise HttpError(500, "pass-through needs an HTTP upstream policy", "server_error")
        prompt, sample, raw = await chat(
            openai_history(chat_request.messages), openai_tools(chat_request.tools), params
        )
        sample = self._checked(prompt, sample, params)
        try:
            assistant_message(raw, "choices[0].message")
        except HttpError as error:  # the upstream's answer, not the client's request
            raise UpstreamError(f"upstream answer refused: {error.message}") from None
        response = openai_message(raw)
        if base is not None:
            length = base.call.full_len
            if len(prompt) <= length or not np.array_equal(
                prompt[:length], state.full_ids(base.call)
            ):
                base = None
        return prompt, sample, response, base
