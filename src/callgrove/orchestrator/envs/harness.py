"""A real harness CLI (Claude Code, Codex) as an environment of the RL loop.

Each episode runs the CLI on its task through a capture gateway (`callgrove.gateway.harness`)
and becomes the episode the gateway closes: the harness's calls, attributed to its agents, are
the episode's calls.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from callgrove.chat import ChatFormat, JinjaFormat
from callgrove.errors import InvalidValue, StateError
from callgrove.gateway.harness import HARNESSES, run_harness
from callgrove.gateway.in_training import LocalGateway


class HarnessEnvironment:
    """A real harness CLI as an orchestrator environment (`callgrove.orchestrator.Environment`).

    Each task is `{"prompt": ..., "check": ...}` (the check optional). The harness runs through
    a gateway that records every call; the episode the gateway closes becomes the orchestrator's
    episode (its agents and calls replace the leader the run started with), and the check's
    reward is the episode's reward.

    Without `gateway` the environment runs its own gateway in this process
    (`callgrove.gateway.in_training`) over the policy being trained (`EpisodeRun.policy`), rendering
    with that policy's tokenizer and chat template and sampling as the loop samples: the
    harness's calls are on-policy and their token ids are the learner's, so `callgrove train`
    trains on them. Its ledger is `FOLDER/ledger`. With `gateway` (a URL) the calls go to that
    gateway instead, whose upstream must then serve the policy being trained.
    """

    def __init__(
        self,
        harness: str,
        tasks: list[dict[str, Any]],
        gateway: str | None = None,
        folder: str | os.PathLike[str] = "harness-runs",
        *,
        timeout: float = 300.0,
        cli: str | None = None,
        extra_args: list[str] | None = None,
    ):
        if harness not in HARNESSES:
            raise InvalidValue(f"unknown harness {harness!r}; known: {', '.join(HARNESSES)}")
        if not tasks or not all(isinstance(t, dict) and "prompt" in t for t in tasks):
            raise InvalidValue("tasks must be a non-empty list of {'prompt': ..., 'check': ...}")
        self.name = harness
        self.harness = harness
        self.tasks = tasks
        self.gateway = gateway
        self.folder = Path(folder)
        self.timeout = timeout
        self.cli = cli
        self.extra_args = extra_args or []
        self.local: LocalGateway | None = None
        self._starting: asyncio.Lock | None = None

    def task(self, rng: Any) -> dict[str, Any]:
        return self.tasks[int(rng.integers(len(self.tasks)))]

    def eval_tasks(self) -> list[dict[str, Any]]:
        return list(self.tasks)

    async def _gateway_for(self, episode: Any) -> str:
        """The gateway's URL: the one given, or this process's over the episode's policy."""
        if self.gateway is not None:
            return self.gateway
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if self.local is None:
                chat = harness_chat(episode.chat)
                self.local = await asyncio.to_thread(
                    LocalGateway,
                    episode.policy,
                    asyncio.get_running_loop(),
                    chat,
                    self.folder / "ledger",
                    sampling=episode.params,
                )
        if self.local.policy is not episode.policy:
            raise StateError("the in-process gateway serves one policy; this episode has another")
        return self.local.url

    def close(self) -> None:
        """Stop the in-process gateway, if one was started."""
        if self.local is not None:
            self.local.close()
            self.local = None

    async def run(self, episode: Any, task: dict[str, Any]) -> dict[str, float]:
        record = episode.episode
        gateway = await self._gateway_for(episode)
        stop = threading.Event()
        try:
            run = await asyncio.to_thread(
                run_harness,
                self.harness,
                task["prompt"],
                gateway,
                record.id,
                self.folder,
                check=task.get("check"),
                timeout=self.timeout,
                cli=self.cli,
                extra_args=self.extra_args,
                task=task,
                stop=stop,
            )
        except asyncio.CancelledError:
            stop.set()  # the CLI dies with the episode instead of running on in its thread
            raise
        if run.returncode != 0:
            raise StateError(f"{self.harness} exited {run.returncode}: {run.stderr[-500:]}")
        closed = run.closed
        _check_vocabulary(closed, episode.chat.vocab_size)
        record.agents[:] = closed.agents
        return closed.rewards


def _check_vocabulary(episode: Any, vocab_size: int | None) -> None:
    """Refuse calls whose token ids the policy being trained cannot embed.

    The gateway renders with its own chat format; unless that is the trained policy's tokenizer
    and template (`callgrove gateway --model`, its upstream serving that policy), the ids mean
    nothing to the learner, which would otherwise fail deep inside its embedding."""
    if vocab_size is None:
        return
    for agent in episode.agents:
        for call in agent.calls:
            for part in (call.prompt_suffix, call.completion_ids):
                if len(part) and int(part.max()) >= vocab_size:
                    raise InvalidValue(
                        f"episode {episode.id}, agent {agent.id}, call {call.id}: token id "
                        f"{int(part.max())} is outside the vocabulary of the policy being trained "
                        f"({vocab_size} ids); the gateway must render with that policy's "
                        "tokenizer and chat template and sample from it"
                    )


def harness_chat(chat: ChatFormat) -> ChatFormat:
    """The policy being trained's chat format, if a harness's conversations can be rendered in
    it: a model's own tokenizer and chat template."""
    if not isinstance(chat, JinjaFormat):
        raise InvalidValue(
            "a harness run against the policy being trained renders with that policy's tokenizer "
            f"and chat template, and its chat format ({chat.name}) is none: train a Hugging Face "
            "model (model.name = 'hf:PATH' or 'smollm2-135m'), or give the environment a "
            "`gateway` URL whose upstream serves the policy"
        )
    return chat
