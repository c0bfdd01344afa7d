"""The dispatcher: groups of episodes in flight, stamped with the policy span they covered.

Invariants:
- Every dispatched episode comes back exactly once: in a group handed to a step (trained, or
  dropped as stale), from `evaluate`, or from `stop` (cancelled in flight, or finished after
  the last step). A failed episode comes back as itself (`ok: false`, its errors), counted in
  `dispatcher/errored/{train,eval}`; a cancelled one carries a `Cancelled` error and is counted
  in `dispatcher/cancelled/{train,eval}`. Nothing is invented for a failure. A failure outside
  any episode (the environment's `task()` or `eval_tasks()`, a runner that raises) stops
  generation, and the next `collect` (or `evaluate`) raises it as a `RunError`.
- Each episode's `run.policy` is the span of policy versions its generation covered (the
  version when it started, the version when it ended); staleness is only ever derived from it
  (`callgrove.episode.off_policy_steps`).
- Generation runs at most `max_off_policy_steps` steps ahead of training: a group is launched
  only while the groups taken for training plus those in flight stay below
  `(version + 1 + max_off_policy_steps) * groups_per_step` (a resumed run counts the groups of
  the steps done before it). A group that still comes back staler than that (it finished late)
  is dropped whole before it trains.
- Evaluation episodes are pinned: the loop loads no new weights while they run, so their span
  is one version, and they are never dropped for staleness.

Tasks are drawn per group from a generator seeded by (seed, group index), so a group launched
again after a restart gets the same task; a task must be JSON, as its episodes record it.
Episodes run on an `EpisodeLoop` of the dispatcher's (or a runner's workers), so an environment
that blocks its own loop never stops the dispatcher's.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from callgrove.chat import ChatFormat
from callgrove.episode import Episode, off_policy_steps
from callgrove.errors import InvalidValue
from callgrove.formats.ranges import check_range
from callgrove.formats.wire import WireEnv, WirePolicy, WireRun
from callgrove.orchestrator.env import Environment, EpisodeLoop, cancelled_error
from callgrove.orchestrator.errors import RunError
from callgrove.policy import PolicyClient, SamplingParams

SUBSETS = ("train", "eval")
# Runs one episode to its end (errors recorded on it): in this process by default, or on a
# worker (`callgrove.orchestrator.ray_executor`).
EpisodeRunner = Callable[[Episode, Any], Awaitable[Episode]]


class DispatchSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """`[dispatch]`: how many episodes run, in which groups, and how far ahead of training."""

    group_size: int = 8
    """Episodes of one task, compared with each other when credit is assigned."""
    groups_per_step: int = 4
    max_in_flight: int = 256
    """Episodes in flight at most (training generation; evaluation runs besides)."""
    max_off_policy_steps: int = 1
    """How many steps generation may run ahead of training (0: strictly on-policy)."""
    episode_timeout: float | None = 300.0
    """Seconds an episode may run before it ends as a `Timeout` error (None: no limit)."""

    def __post_init__(self) -> None:
        for name in ("group_size", "groups_per_step", "max_in_flight"):
            check_range(name, getattr(self, name), at_least=1)
        check_range("max_off_policy_steps", self.max_off_policy_steps, at_least=0)
        if self.episode_timeout is not None:
            check_range("episode_timeout", self.episode_timeout, above=0)
        if self.max_in_flight < self.group_size:
            raise InvalidValue("max_in_flight must hold at least one group (group_size)")


@dataclass(eq=False)
class Group:
    """One task's episodes, compared with each other when credit is assigned."""

    index: int
    task: Any
    episodes: list[Episode] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"g{self.index}"


@dataclass
class Collected:
    """What `collect` handed to one step: groups that train and groups dropped as stale."""

    trained: list[Group]
    stale: list[Group]


class Dispatcher:
    def __init__(
        self,
        env: Environment,
        policy: PolicyClient,
        chat: ChatFormat,
        params: SamplingParams,
        settings: DispatchSettings,
        run_id: str,
        seed: int = 0,
        next_group: int = 0,
        relaunch: Iterable[int] = (),
        runner: EpisodeRunner | None = None,
        steps_done: int = 0,
    ):
        """A resumed run passes what its checkpoint holds: the next group's index, the groups
        launched but not trained (`relaunch`), and the steps done, whose groups count against
        the room ahead of training as they did before the restart."""
        self.env = env
        self.policy = policy
        self.chat = chat
        self.params = params
        self.settings = settings
        self.run_id = run_id
        self.seed = seed
        self.next_group = next_group
        self._relaunch = sorted(relaunch)
        self.runner = runner or self._run_here
        self._episodes = EpisodeLoop()  # where `_run_here` runs them
        self.counters: Counter[str] = Counter()
        # Groups handed to steps (trained): each step takes `groups_per_step`; dropped ones
        # free their room.
        self.taken = steps_done * settings.groups_per_step
        self.in_flight_episodes = 0
        self._live: dict[int, asyncio.Task[Group]] = {}
        # The episode tasks of each group (or evaluation) still gathering, for `stop`.
        self._episode_tasks: dict[str, list[asyncio.Task[Episode]]] = {}
        # Finished groups; None once generation failed outside any episode (`_failure`).
        self._done: asyncio.Queue[Group | None] = asyncio.Queue()
        self._failure: RunError | None = None
        self._changed = asyncio.Condition()
        self._producer: asyncio.Task[None] | None = None

    # -- generation ------------------------------------------------------------------------

    def start(self) -> None:
        self._producer = self._watched(self._produce())

    def _watched(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """A task whose failure stops the run: nothing else awaits it, so `collect` is woken to
        raise it (else the loop would wait for groups that never come)."""
        task = asyncio.ensure_future(work)
        task.add_done_callback(self._failed)
        return task

    def _failed(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None or self._failure is not None:
            return
        error = task.exception()
        if not isinstance(error, RunError):
            wrapped = RunError(f"generation failed: {type(error).__name__}: {error}")
            wrapped.__cause__, error = error, wrapped
        self._failure = error
        self._done.put_nowait(None)

    async def notify(self) -> None:
        """Wake the producer: the policy version moved or room was freed."""
        async with self._changed:
            self._changed.notify_all()

    def _room(self) -> bool:
        settings = self.settings
        if self.in_flight_episodes + settings.group_size > settings.max_in_flight:
            return False
        ahead = (self.policy.version + 1 + settings.max_off_policy_steps) * settings.groups_per_step
        return self.taken + len(self._live) + self._done.qsize() < ahead

    async def _produce(self) -> None:
        while True:
            async with self._changed:
                await self._changed.wait_for(self._room)
            self._launch(self._take_index())

    def _take_index(self) -> int:
        if self._relaunch:
            return self._relaunch.pop(0)
        index = self.next_group
        self.next_group += 1
        return index

    def task_of(self, index: int) -> Any:
        try:
            task = self.env.task(np.random.default_rng([self.seed, index]))
        except Exception as error:
            raise RunError(
                f"environment {self.env.name!r}: task() of group {index} raised "
                f"{type(error).__name__}: {error}"
            ) from error
        return self._recordable(task, f"task() of group {index}")

    def _recordable(self, task: Any, source: str) -> Any:
        """`task`, which every episode of it records: it must be JSON."""
        try:
            msgspec.json.encode(task)
        except (TypeError, ValueError) as error:
            raise RunError(
                f"environment {self.env.name!r}: {source} returned a task that is not JSON, which "
                f"its episodes could not record ({error})"
            ) from None
        return task

    def _launch(self, index: int) -> None:
        group = Group(index, self.task_of(index))
        self.in_flight_episodes += self.settings.group_size
        self._live[index] = self._watched(self._run_group(group))

    async def _run_group(self, group: Group) -> Group:
        launch = uuid.uuid4().hex[:8]  # tells this launch of the group from one after a restart
        episodes = [
            Episode(id=f"{group.id}-{number}-{launch}", group=group.id)
            for number in range(self.settings.group_size)
        ]
        group.episodes = await self._run_all(
            group.id, episodes, [group.task] * len(episodes), "train"
        )
        self._live.pop(group.index, None)
        await self._done.put(group)
        await self.notify()
        return group

    async def _run_all(
        self, key: str, episodes: list[Episode], tasks: list[Any], subset: str
    ) -> list[Episode]:
        """Run the episodes side by side, each as its own asyncio task (`stop` cancels them)."""
        running = [
            asyncio.create_task(self._run_one(episode, task, subset))
            for episode, task in zip(episodes, tasks, strict=True)
        ]
        self._episode_tasks[key] = running
        try:
            return list(await asyncio.gather(*running))
        except BaseException:
            for task in running:  # one raised outside its episode: the others stop with it
                task.cancel()
            raise
        finally:
            del self._episode_tasks[key]

    async def _run_one(self, episode: Episode, task: Any, subset: str) -> Episode:
        start = self.policy.version
        episode.env = WireEnv(id=self.env.name, name=self.env.name)
        try:
            episode = await self.runner(episode, task)
        except asyncio.CancelledError:  # cancelled before the episode's own handler ran
            episode.task, episode.ok = task, False
            episode.errors.append(cancelled_error("cancelled before it started"))
        episode.run = WireRun(
            id=self.run_id, type=subset, policy=WirePolicy(start=start, end=self.policy.version)
        )
        if subset == "train":
            self.in_flight_episodes -= 1
        self._count(episode, subset)
        return episode

    async def _run_here(self, episode: Episode, task: Any) -> Episode:
        return await self._episodes.run(
            self.env,
            task,
            self.policy,
            self.chat,
            self.params,
            episode,
            self.settings.episode_timeout,
        )

    def _count(self, episode: Episode, subset: str) -> None:
        if episode.ok:
            return
        cancelled = any(error.type == "Cancelled" for error in episode.errors)
        self.counters[f"dispatcher/{'cancelled' if cancelled else 'errored'}/{subset}"] += 1

    # -- handing groups to steps -----------------------------------------------------------

    async def collect(self, step: int) -> Collected:
        """The next `groups_per_step` fresh groups to finish (in the order they finished), and
        every stale group met on the way; all of them are stamped with `step`."""
        trained, stale = [], []
        while len(trained) < self.settings.groups_per_step:
            group = await self._done.get()
            if group is None:
                self._done.put_nowait(None)  # and for whoever collects next
                raise self._failure  # type: ignore[misc]
            for episode in group.episodes:
                episode.run.step = step  # type: ignore[union-attr]
            if self.is_stale(group, step):
                stale.append(group)
                self.counters["dispatcher/stale_groups/train"] += 1
                self.counters["dispatcher/stale_episodes/train"] += len(group.episodes)
            else:
                trained.append(group)
                self.taken += 1
            await self.notify()
        return Collected(trained, stale)

    def is_stale(self, group: Group, step: int) -> bool:
        limit = self.settings.max_off_policy_steps
        return any(off_policy_steps(e, step).total > limit for e in group.episodes)

    def pending_groups(self) -> list[int]:
        """Groups launched but not yet handed to a step: a restart launches them again."""
        queued = self._done._queue  # type: ignore[attr-defined]
        finished = [group.index for group in queued if group is not None]
        return sorted([*self._live, *finished, *self._relaunch])

    # -- evaluation ------------------------------------------------------------------------

    async def evaluate(self, step: int, repeats: int = 1) -> list[Episode]:
        """Each evaluation task `repeats` times, all at once, on the current policy version."""
        version = self.policy.version
        episodes, tasks = [], []
        try:
            eval_tasks = list(self.env.eval_tasks())
        except Exception as error:
            raise RunError(
                f"environment {self.env.name!r}: eval_tasks() raised {type(error).__name__}: "
                f"{error}"
            ) from error
        eval_tasks = [self._recordable(task, "eval_tasks()") for task in eval_tasks]
        for number, task in enumerate(eval_tasks):
            for repeat in range(repeats):
                episodes.append(
                    Episode(id=f"eval{step}-{number}-{repeat}", group=f"eval{step}-{number}")
                )
                tasks.append(task)
        episodes = await self._run_all(f"eval{step}", episodes, tasks, "eval")
        for episode in episodes:
            episode.run.step = step  # type: ignore[union-attr]
            span = episode.run.policy  # type: ignore[union-attr]
            if (span.start, span.end) != (version, version):
                raise RuntimeError(f"evaluation episode {episode.id} spans {span}: not pinned")
        return episodes

    # -- shutdown --------------------------------------------------------------------------

    async def stop(self) -> list[Episode]:
        """Stop generating; cancel what is in flight. Returns every episode not handed to a step
        (cancelled ones carry a `Cancelled` error), so each still reaches a sink once."""
        if self._producer is not None:
            self._producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._producer
        for running in list(self._episode_tasks.values()):
            for task in running:
                task.cancel()
        # Each finished group joins the queue; a failed one is already the run's failure.
        await asyncio.gather(*self._live.values(), return_exceptions=True)
        self._episodes.close()
        groups = []
        while not self._done.empty():
            if (group := self._done.get_nowait()) is not None:
                groups.append(group)
        return [episode for group in groups for episode in group.episodes]
