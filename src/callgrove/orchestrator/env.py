"""The environment API: an environment runs one episode and its agents record themselves.

An environment is an object with a `name`, a way to draw tasks, and one coroutine:

    class Reverse:
        name = "reverse"
        def task(self, rng): return "".join(rng.choice(list("0123456789"), 3))
        def eval_tasks(self): return ["123", "907"]
        async def run(self, episode: EpisodeRun, task) -> float | dict[str, float]:
            answer = await episode.leader.ask(f"reverse {task}")
            return float(answer == task[::-1])

An environment may also have `close()`, called once when the run ends (one that holds a server
or worker processes stops them there).

`run` gets the episode's leader and starts subagents from any agent: `spawn` (a fresh agent:
its own system prompt and task, nothing else), `fork` (a new agent that starts from a copy of
its parent's whole history), and `background` (a fresh agent run as a task next to the
leader; its answer may be awaited, or never). `ask` sends an agent a message and returns its
reply; `compact` asks an agent for a summary of its history and starts it over from that
summary. It returns the episode's rewards; `AgentHandle.reward` gives an agent its own.

Every policy call is recorded as it completes on the agent that made it, with its exact prompt
and completion ids, the sampling logprobs, the policy version and the next ledger `seq`, so the
finished episode is a `callgrove.episode/1` record without any bookkeeping by the author.
Rendering is token-exact (`callgrove.chat`, message by message): an agent's history only grows
(the tokens its chat template puts after a reply included), so a call's prompt extends its
agent's previous full sequence, a fork's first call extends the call
it copied, and a compaction call continues the old history while the call after it is a root.

How an episode ends is recorded, never invented: an exception in `run` (or a policy call that
failed inside it) makes the episode `ok: false` with the error and the agent that raised; a
timeout is a `Timeout` error; a cancellation a `Cancelled` one. Background agents still running
when `run` returns are stopped: their kept calls stay, and their agent's `meta.ended` says
`stopped` (`finished` or `failed` otherwise; a failed background agent fails the episode). No
agent is added for a failure: an episode that never started has no agents.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import msgspec
import numpy as np

from callgrove.chat import ChatFormat, Message
from callgrove.episode import TOKEN_DTYPE, Agent, Call, Episode
from callgrove.formats.wire import WireEnv, WireError
from callgrove.policy import PolicyClient, SamplingParams
from callgrove.policy.backends import ModelSettings, build_sampler

Rewards = float | dict[str, float]
EMPTY = np.zeros(0, dtype=TOKEN_DTYPE)
History = tuple[np.ndarray, Message | None]
"""An agent's history: its tokens and its newest message (None: empty)."""


@runtime_checkable
class Environment(Protocol):
    name: str

    def task(self, rng: np.random.Generator) -> Any:
        """One training task (JSON-serialisable), drawn from `rng`."""
        ...

    def eval_tasks(self) -> Sequence[Any]:
        """The fixed tasks an evaluation runs."""
        ...

    async def run(self, episode: EpisodeRun, task: Any) -> Rewards:
        """Run one episode of `task`; return its rewards (a number is `{"reward": number}`)."""
        ...


class PolicyCallError(RuntimeError):
    """A policy call failed; names the agent whose call it was."""

    def __init__(self, agent: str, cause: BaseException):
        super().__init__(f"policy call of agent {agent} failed: {type(cause).__name__}: {cause}")
        self.agent = agent
        self.cause = cause


class AgentHandle:
    """One agent of a running episode: its token history and its record."""

    def __init__(self, run: EpisodeRun, record: Agent, start: History, system: History):
        self.run = run
        self.record = record
        self.history, self.last = start
        """The history's tokens, and its newest message (which the next one is rendered after)."""
        self._system = system

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def name(self) -> str:
        return self.record.name

    def say(self, text: str, role: str = "user") -> None:
        """Add a message to the history without calling the policy."""
        message = Message(role, text)
        self.history = np.concatenate([self.history, self.run.chat.segment(message, self.last)])
        self.last = message

    async def ask(self, text: str | None = None, purpose: str = "turn") -> str:
        """Send `text` (a user message; none: continue as is) and return the reply's text."""
        chat = self.run.chat
        parts, previous = [self.history], self.last
        if text is not None:
            message = Message("user", text)
            parts.append(chat.segment(message, previous))
            previous = message
        parts.append(chat.generation_prompt())
        prompt = np.concatenate(parts)
        completion = await self.run.call(self, prompt, purpose)
        reply = chat.text_of(completion)
        self.last = Message("assistant", reply)
        self.history = np.concatenate([prompt, completion, chat.trailing(self.last, previous)])
        return reply

    async def compact(self, instruction: str, restart: Callable[[str], str] | None = None) -> str:
        """Ask for a summary of the history (a `compaction` call continuing it), then start the
        history over: the agent's system message and a user message holding the summary
        (`restart(summary)` words it; default: the summary itself). Returns the summary."""
        summary = await self.ask(instruction, purpose="compaction")
        self.history, self.last = self._system[0].copy(), self._system[1]
        self.say(restart(summary) if restart else summary)
        return summary

    def spawn(self, name: str, system: str | None = None) -> AgentHandle:
        """A fresh subagent: its own system prompt, nothing of this agent's history."""
        return self.run.new_agent(name, parent=self, start="fresh", system=system)

    def fork(self, name: str) -> AgentHandle:
        """A subagent that starts from a copy of this agent's whole history."""
        return self.run.new_agent(
            name, parent=self, start="fork", history=(self.history, self.last)
        )

    def background(
        self, name: str, work: Callable[[AgentHandle], Awaitable[Any]], system: str | None = None
    ) -> Background:
        """Start a fresh subagent running `work(agent)` next to this one; await its `task` for
        the answer, or never (it is stopped when the episode's `run` returns)."""
        agent = self.run.new_agent(name, parent=self, start="background", system=system)
        return self.run.start_background(agent, work)

    def reward(self, **named: float) -> None:
        """This agent's own rewards (its seat is scored by these instead of the episode's)."""
        self.record.rewards = {
            **(self.record.rewards or {}),
            **{k: reward_value(k, v) for k, v in named.items()},
        }


@dataclass(frozen=True, slots=True)
class Background:
    """A background subagent and the task running it."""

    agent: AgentHandle
    task: asyncio.Task[Any]

    def answer(self) -> Any | None:
        """Its result if it finished without error, else None (without waiting)."""
        if self.task.done() and not self.task.cancelled() and self.task.exception() is None:
            return self.task.result()
        return None


class EpisodeRun:
    """What `Environment.run` is handed: the leader, and the recording of every call."""

    def __init__(
        self,
        episode: Episode,
        policy: PolicyClient,
        chat: ChatFormat,
        params: SamplingParams,
        leader_system: str | None = None,
    ):
        self.episode = episode
        self.policy = policy
        self.chat = chat
        self.params = params
        self.seq = 0
        self.policy_seconds = 0.0
        """Seconds spent waiting on the policy's calls (their queue and decoding)."""
        self._background: list[Background] = []
        self.leader = self.new_agent("leader", parent=None, start="root", system=leader_system)

    def new_agent(
        self,
        name: str,
        parent: AgentHandle | None,
        start: str,
        system: str | None = None,
        history: History | None = None,
    ) -> AgentHandle:
        record = Agent(
            id=f"{name}-{len(self.episode.agents)}" if parent else name,
            name=name,
            parent=None if parent is None else parent.id,
            start=start,
        )
        self.episode.agents.append(record)
        message = None if system is None else Message("system", system)
        system_history = (EMPTY if message is None else self.chat.segment(message, None), message)
        start = system_history if history is None else (history[0].copy(), history[1])
        return AgentHandle(self, record, start, system_history)

    async def call(self, agent: AgentHandle, prompt: np.ndarray, purpose: str) -> np.ndarray:
        """Sample from the policy and record the call on `agent`; returns the completion ids."""
        asked = time.perf_counter()
        try:
            sample = await self.policy.sample(prompt, self.params)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            raise PolicyCallError(agent.id, error) from error
        finally:
            self.policy_seconds += time.perf_counter() - asked
        seq = self.seq
        self.seq += 1
        agent.record.add(
            Call.make(
                f"c{seq}",
                seq,
                prompt,
                sample.completion_ids,
                sample.logprobs,
                policy_version=sample.policy_version,
                purpose=purpose,
                sampling=sample.sampling,
            )
        )
        return np.asarray(sample.completion_ids, dtype=TOKEN_DTYPE)

    def start_background(
        self, agent: AgentHandle, work: Callable[[AgentHandle], Awaitable[Any]]
    ) -> Background:
        background = Background(agent, asyncio.ensure_future(work(agent)))
        self._background.append(background)
        return background

    async def stop_background(self) -> list[WireError]:
        """Stop background agents still running; say how each ended; their errors."""
        errors = []
        for background in self._background:
            agent, task = background.agent, background.task
            if not task.done():
                task.cancel()
            try:
                await task
                ended = "finished"
            except asyncio.CancelledError:
                ended = "stopped"
            except Exception as error:
                ended = "failed"
                errors.append(error_record(error, agent.id))
            agent.record.meta = {**(agent.record.meta or {}), "ended": ended}
        return errors


def error_record(error: BaseException, agent: str | None = None) -> WireError:
    """The episode error of an exception (a failed policy call names its agent)."""
    if isinstance(error, PolicyCallError):
        return WireError(
            type=type(error.cause).__name__, message=str(error.cause), agent=error.agent
        )
    if agent is not None:
        return WireError(type=type(error).__name__, message=str(error), agent=agent)
    return WireError(type=type(error).__name__, message=str(error))


def cancelled_error(message: str = "") -> WireError:
    return WireError(type="Cancelled", message=message)


async def run_episode(
    env: Environment,
    task: Any,
    policy: PolicyClient,
    chat: ChatFormat,
    params: SamplingParams,
    episode: Episode,
    timeout: float | None = None,
) -> Episode:
    """Run `env` on `task` into `episode` (which carries the id, group and run); never raises
    for what went wrong in the episode: errors, timeouts and cancellation are recorded on it."""
    episode.env = episode.env or WireEnv(id=env.name, name=env.name)
    episode.task = task
    run = EpisodeRun(episode, policy, chat, params)
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            result = await env.run(run, task)
        episode.rewards = _rewards(result)
    except TimeoutError:
        episode.errors.append(WireError(type="Timeout", message=f"episode ran past {timeout} s"))
    except asyncio.CancelledError:
        episode.errors.append(cancelled_error("cancelled while running"))
    except Exception as error:
        episode.errors.append(error_record(error))
    episode.errors.extend(await run.stop_background())
    episode.ok = not episode.errors
    if not episode.ok:
        episode.rewards = {}
    episode.meta = {
        **(episode.meta or {}),
        "seconds": round(time.perf_counter() - started, 6),
        "policy_seconds": round(run.policy_seconds, 6),
    }
    return episode


def sample_episode(
    env: Environment,
    task: Any,
    model: str | ModelSettings = "tiny",
    *,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    episode_id: str = "e0",
    group: str = "g0",
) -> Episode:
    """One episode of `env` on `task`, sampled by `model` (a backend name such as `tiny`,
    `hf:PATH` or `smollm2-135m`, or `[model]` settings) with no learner built: what an
    environment's author runs to see its episodes. The model's stop tokens end each call."""
    settings = model if isinstance(model, ModelSettings) else ModelSettings(name=model)
    sampler, chat = build_sampler(settings, seed)
    params = sampling or SamplingParams()
    stops = tuple(dict.fromkeys(params.stop_token_ids + chat.stop_token_ids))
    params = msgspec.structs.replace(params, stop_token_ids=stops)
    episode = Episode(id=episode_id, group=group)
    return asyncio.run(run_episode(env, task, sampler, chat, params, episode))


# Beyond this a group's mean or spread of rewards may overflow to infinity.
MAX_REWARD = 1e12


class RewardError(ValueError):
    """A reward that is not a finite number of sane size: it fails its episode."""


def reward_value(name: str, value: Any) -> float:
    """A reward as a float: an int or float (not a bool or a string, which would pass as one by
    coercion), finite, of magnitude at most `MAX_REWARD`."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise RewardError(f"reward {name!r} is {value!r}, not a number")
    number = float(value)
    if not math.isfinite(number) or abs(number) > MAX_REWARD:
        raise RewardError(f"reward {name!r} is {number!r}: it must be finite, within ±{MAX_REWARD}")
    return number


def _rewards(result: Rewards) -> dict[str, float]:
    if isinstance(result, dict):
        return {str(k): reward_value(str(k), v) for k, v in result.items()}
    return {"reward": reward_value("reward", result)}
