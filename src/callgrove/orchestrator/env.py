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
agent is added for a failure: an episode that never started has no agents. Whatever an
environment raises, `SystemExit` and `KeyboardInterrupt` included, is its episode's failure.

Episodes run on an event loop of their own in a thread of its own (`EpisodeLoop`), apart from
the loop that dispatches and trains: an environment that blocks its loop (a synchronous sleep or
a busy loop in `run`) cannot stop the dispatcher's clock, so its episode still ends as a
`Timeout`, and the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import ctypes
import dataclasses
import math
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import msgspec
import numpy as np

from callgrove.chat import ChatFormat, Message
from callgrove.episode import TOKEN_DTYPE, Agent, Call, Episode
from callgrove.errors import RunFailed, StateError
from callgrove.formats.wire import WireEnv, WireError
from callgrove.models import ModelSettings, model_from_name, open_model
from callgrove.policy import PolicyClient, SamplingParams
from callgrove.policy.client import Completion

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


class PolicyCallError(RunFailed, RuntimeError):
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
                routes=sample.routes,
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
            except BaseException as error:  # SystemExit too: the agent's failure, not the run's
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
    """Run `env` on `task` into `episode` (which carries the id, group and run) on an
    `EpisodeLoop` of its own, and return it; never raises for what went wrong in the episode:
    errors, timeouts and cancellation are recorded on it. The episode returned is `episode`
    unless its loop was blocked by an environment and abandoned (see `EpisodeLoop`)."""
    episodes = EpisodeLoop()
    try:
        return await episodes.run(env, task, policy, chat, params, episode, timeout)
    finally:
        episodes.close()


BLOCKED_AFTER = 3.0
"""Seconds an episode's event loop may run no callback of ours, once the episode is past its
timeout or cancelled, before it counts as blocked by its environment (a synchronous sleep or a
busy loop in `run`) and is abandoned (`EpisodeLoop`)."""

_ATTEMPT: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar(
    "episode_attempt", default=None
)
"""The episode a task on an episode loop works for (tasks inherit it from their creator)."""


class EnvironmentBlocked(BaseException):
    """Raised in the thread of an abandoned episode loop, to end an environment's busy loop there
    (a BaseException, so that an environment's `except Exception` does not swallow it; so not a
    `CallgroveError` either: the episode it ends is already recorded as failed)."""


class EpisodeLoop:
    """Where environments' episodes run: an event loop in a daemon thread of its own, whose
    policy calls are made on the caller's loop (where the sampler batches them).

    Every episode an `EpisodeLoop` runs shares that one loop, as they would share the caller's,
    so an environment may keep loop-bound state (a client, a lock) across its episodes. The
    caller's clock stays its own: an episode past its timeout (or cancelled) whose loop then
    runs nothing for `BLOCKED_AFTER` seconds has blocked it, and the loop is abandoned. The
    episode running when it blocked ends as a `Timeout` (`Cancelled` if it was being cancelled)
    with what it recorded so far; the others on that loop start over on a fresh one, their
    calls so far never recorded. The abandoned thread is told to stop (`EnvironmentBlocked` is
    raised in it, which ends a busy loop; a sleep ends in its own time) and never keeps the
    process from exiting.
    """

    def __init__(self) -> None:
        self._host: _Host | None = None

    async def run(
        self,
        env: Environment,
        task: Any,
        policy: PolicyClient,
        chat: ChatFormat,
        params: SamplingParams,
        episode: Episode,
        timeout: float | None = None,
    ) -> Episode:
        """As `run_episode`, on this loop: use the episode returned, which is `episode` unless
        its loop was abandoned (then a copy of it, or a fresh record of the episode started
        over)."""
        episode.env = episode.env or WireEnv(id=env.name, name=env.name)
        episode.task = task
        started = time.perf_counter()
        while True:
            if self._host is None or self._host.abandoned:
                self._host = _Host(asyncio.get_running_loop())
            host = self._host
            run = EpisodeRun(episode, host.policy(policy), chat, params)
            attempt = host.start(env, task, run, timeout)
            cancelled = await self._wait(host, attempt, timeout)
            if attempt.ended:
                if attempt.task is not None and attempt.task.cancelled():
                    # Cancelled before its first step: `_play`, which records how an episode
                    # ended, never ran.
                    episode.errors.append(cancelled_error("cancelled before it started"))
                    return _conclude(run, started)
                return episode
            if cancelled or attempt.blamed:
                return _abandoned(attempt, timeout, cancelled, started)
            # Started over from what it carried (its blocked loop changes nothing meanwhile).
            episode = dataclasses.replace(episode, agents=[], errors=[], rewards={}, ok=True)

    async def _wait(self, host: _Host, attempt: _Attempt, timeout: float | None) -> bool:
        """Until the attempt ends on its loop, or its loop is abandoned as blocked (its loop
        watched from `timeout` on); whether it was cancelled meanwhile (the cancellation is
        passed on to it, never raised here)."""
        caller = asyncio.get_running_loop()
        if timeout is not None:
            attempt.watch = caller.call_later(timeout, host.watch, attempt)
        cancelled = False
        try:
            while not attempt.settled:
                try:
                    await attempt.finished
                except asyncio.CancelledError:
                    if attempt.finished.cancelled():  # cancelled with this task: wake on another
                        attempt.finished = caller.create_future()
                    if not cancelled:
                        host.cancel(attempt)
                        if attempt.watch is not None:
                            attempt.watch.cancel()
                        attempt.watch = caller.call_later(BLOCKED_AFTER, host.watch, attempt)
                    cancelled = True
        finally:
            if attempt.watch is not None:
                attempt.watch.cancel()
        return cancelled

    def close(self) -> None:
        """Stop the loop (its episodes have ended) and its thread (an abandoned one is
        stopping already, in its own time)."""
        if self._host is not None and not self._host.abandoned:
            self._host.close()
        self._host = None


@dataclass(eq=False)
class _Attempt:
    """One start of an episode on a loop."""

    run: EpisodeRun
    finished: asyncio.Future[None]
    """On the caller's loop: done once the attempt is `settled`."""
    settled: bool = False
    """The episode ended on its loop (`ended`), or that loop was abandoned first."""
    ended: bool = False
    task: asyncio.Task[None] | None = None
    watch: asyncio.TimerHandle | None = None
    """When the caller looks at whether its loop is blocked."""
    blamed: bool = False
    """Its loop was abandoned while this episode blocked it."""


class _Host:
    """One episode loop's thread (`EpisodeLoop`), seen from the caller's loop `caller`."""

    def __init__(self, caller: asyncio.AbstractEventLoop):
        self.caller = caller
        self.loop = asyncio.new_event_loop()
        self.loop.set_task_factory(self._new_task)
        self.owners: weakref.WeakKeyDictionary[asyncio.Task[Any], _Attempt] = (
            weakref.WeakKeyDictionary()
        )
        self.attempts: set[_Attempt] = set()
        self.abandoned = False
        self._policies: dict[int, _CallerPolicy] = {}
        self.to_loop = _Mailbox(self.loop)
        self.to_caller = _Mailbox(caller)
        self._checks: set[asyncio.Task[None]] = set()
        self.thread = threading.Thread(target=self._serve, name="episode-loop", daemon=True)
        self.thread.start()

    def policy(self, policy: PolicyClient) -> _CallerPolicy:
        """`policy`, called from this loop; one object per policy, as environments that keep
        state per policy expect."""
        if id(policy) not in self._policies:
            self._policies[id(policy)] = _CallerPolicy(policy, self)
        return self._policies[id(policy)]

    def _new_task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        if (owner := _ATTEMPT.get()) is not None:
            self.owners[task] = owner
        return task

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        while not self.abandoned:
            try:
                self.loop.run_forever()
                break
            except BaseException:  # an environment's KeyboardInterrupt or SystemExit in a task
                continue  # of its own, which holds it (its episode records it): serve on
        with contextlib.suppress(BaseException):  # what is left is stopped, however it ends
            left = asyncio.all_tasks(self.loop)
            for task in left:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            self.loop.close()

    def _call(self, callback: Callable[..., Any], *args: Any) -> bool:
        """`callback(*args)` on this loop; False if the loop is closed."""
        return self.to_loop.post(callback, *args)

    def _back(self, callback: Callable[..., Any], *args: Any) -> None:
        """`callback(*args)` on the caller's loop, unless it is closed (a thread outliving it)."""
        self.to_caller.post(callback, *args)

    def start(
        self, env: Environment, task: Any, run: EpisodeRun, timeout: float | None
    ) -> _Attempt:
        attempt = _Attempt(run, self.caller.create_future())
        self.attempts.add(attempt)

        def begin() -> None:
            token = _ATTEMPT.set(attempt)
            attempt.task = self.loop.create_task(_play(env, task, run, timeout))
            _ATTEMPT.reset(token)
            attempt.task.add_done_callback(lambda _: self._back(self._ended, attempt))

        if not self._call(begin):
            self._ended(attempt)
        return attempt

    def _ended(self, attempt: _Attempt) -> None:
        self.attempts.discard(attempt)
        attempt.ended = attempt.settled = True
        _settle(attempt.finished)

    def cancel(self, attempt: _Attempt) -> None:
        self._call(lambda: attempt.task is not None and attempt.task.cancel())

    def watch(self, attempt: _Attempt) -> None:
        """An episode past its time: abandon its loop unless the loop runs a callback within
        `BLOCKED_AFTER` seconds (then look again after as long)."""
        if not attempt.settled:
            check = self.caller.create_task(self._check(attempt))
            self._checks.add(check)
            check.add_done_callback(self._checks.discard)

    async def _check(self, attempt: _Attempt) -> None:
        pong = self.caller.create_future()
        if self._call(self._back, _settle, pong):
            done, _ = await asyncio.wait({pong}, timeout=BLOCKED_AFTER)
            if done:
                if not attempt.settled:
                    attempt.watch = self.caller.call_later(BLOCKED_AFTER, self.watch, attempt)
                return
        self.abandon()

    def abandon(self) -> None:
        """Give up on the blocked loop: blame the episode whose task runs on it (every episode
        on it if no episode's does), release each waiting episode, and stop the thread."""
        if self.abandoned:
            return
        self.abandoned = True
        running = asyncio.current_task(self.loop)  # what blocks it, read from this thread
        culprit = None if running is None else self.owners.get(running)
        for attempt in self.attempts:
            attempt.blamed = culprit is None or attempt is culprit
            attempt.settled = True
            _settle(attempt.finished)
        self.attempts.clear()
        self._call(self.loop.stop)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(self.thread.ident or 0), ctypes.py_object(EnvironmentBlocked)
        )

    def close(self, wait: float = BLOCKED_AFTER) -> None:
        if self._call(self.loop.stop):
            self.thread.join(wait)


def _settle(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


class _Mailbox:
    """Callbacks for one loop, posted from another thread and run in batches: a batch costs one
    wake-up of the loop's thread, not one per callback (each wake-up a switch of threads)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._posted: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def post(self, callback: Callable[..., Any], *args: Any) -> bool:
        """Run `callback(*args)` on the loop; False if the loop is closed."""
        with self._lock:
            self._posted.append((callback, args))
            first = len(self._posted) == 1
        if first:
            try:
                self.loop.call_soon_threadsafe(self._run)
            except RuntimeError:
                return False
        return True

    def _run(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, []
        for callback, args in posted:
            try:
                callback(*args)
            except Exception as error:  # reported as the loop reports a failed callback; the
                self.loop.call_exception_handler(  # batch's others still run
                    {"message": f"callback {callback!r} failed", "exception": error}
                )


class _CallerPolicy:
    """The caller's policy, called from an episode loop: each call is made on the caller's loop
    (where the sampler batches it with every other), the completion handed back."""

    def __init__(self, policy: PolicyClient, host: _Host):
        self.policy = policy
        self.host = host
        self._calls: dict[asyncio.Future[Completion], asyncio.Task[Completion]] = {}

    @property
    def version(self) -> int:
        return self.policy.version

    async def sample(self, prompt_ids: np.ndarray, params: SamplingParams) -> Completion:
        answer: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        if not self.host.to_caller.post(self._start, prompt_ids, params, answer):
            raise StateError("the loop that samples is closed")
        try:
            return await answer
        except asyncio.CancelledError:
            self.host.to_caller.post(self._cancel, answer)
            raise

    def _start(self, prompt_ids: np.ndarray, params: SamplingParams, answer: Any) -> None:
        if answer.done():  # cancelled before it was started
            return
        try:
            call = self.host.caller.create_task(self.policy.sample(prompt_ids, params))
        except Exception as error:  # a policy whose `sample` raises before it is awaited
            self.host.to_loop.post(_fail, answer, error)
            return
        self._calls[answer] = call
        call.add_done_callback(lambda _: self._done(call, answer))

    def _done(self, call: asyncio.Task[Completion], answer: Any) -> None:
        self._calls.pop(answer, None)
        self.host.to_loop.post(self._answer, call, answer)

    def _cancel(self, answer: Any) -> None:
        if (call := self._calls.pop(answer, None)) is not None:
            call.cancel()

    def _answer(self, call: asyncio.Task[Completion], answer: Any) -> None:
        if answer.done():
            return
        if call.cancelled():
            answer.cancel()
        elif (error := call.exception()) is not None:
            _fail(answer, error)
        else:
            answer.set_result(call.result())


async def _play(env: Environment, task: Any, run: EpisodeRun, timeout: float | None) -> None:
    """The episode on its loop: `env.run`, then its background agents stopped; how it ended is
    recorded on `run.episode`."""
    episode = run.episode
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            result = await env.run(run, task)
        episode.rewards = _rewards(result)
    except TimeoutError:
        episode.errors.append(WireError(type="Timeout", message=f"episode ran past {timeout} s"))
    except asyncio.CancelledError:
        episode.errors.append(cancelled_error("cancelled while running"))
    except BaseException as error:  # an environment's SystemExit or KeyboardInterrupt too: on
        episode.errors.append(error_record(error))  # this thread it is never the user's Ctrl-C
    episode.errors.extend(await run.stop_background())
    _conclude(run, started)


def _abandoned(
    attempt: _Attempt, timeout: float | None, cancelled: bool, started: float
) -> Episode:
    """The episode of an attempt whose loop was abandoned: a copy of what it recorded (its
    thread may still change the original), failed as a timeout or a cancellation."""
    run = attempt.run
    episode = copy.deepcopy(run.episode)
    blocked = "its environment blocked its event loop (a synchronous sleep or busy loop in run?)"
    episode.errors.append(
        cancelled_error(f"cancelled while running; {blocked}")
        if cancelled
        else WireError(type="Timeout", message=f"episode ran past {timeout} s; {blocked}")
    )
    return _conclude(run, started, episode)


def _conclude(run: EpisodeRun, started: float, episode: Episode | None = None) -> Episode:
    episode = episode or run.episode
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
    """One episode of `env` on `task`, sampled by `model` (a name as `--model` takes it:
    `tiny`, `hf:PATH` or `smollm2-135m`; or `[model]` settings) with no learner built: what an
    environment's author runs to see its episodes. The model's stop tokens end each call."""
    opened = open_model(model_from_name(model) if isinstance(model, str) else model, seed=seed)
    sampler, chat = opened.sampler, opened.chat
    params = sampling or SamplingParams()
    stops = tuple(dict.fromkeys(params.stop_token_ids + chat.stop_token_ids))
    params = msgspec.structs.replace(params, stop_token_ids=stops)
    episode = Episode(id=episode_id, group=group)
    return asyncio.run(run_episode(env, task, sampler, chat, params, episode))


# Beyond this a group's mean or spread of rewards may overflow to infinity.
MAX_REWARD = 1e12


class RewardError(RunFailed, ValueError):
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
