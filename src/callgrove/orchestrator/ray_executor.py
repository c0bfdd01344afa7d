"""Episodes on Ray: environment workers and the sampler as actors (the `ray` extra).

`--executor ray` keeps the loop, the learner and every sink in the driver and moves what scales
out: `env_workers` async `EnvWorker` actors run episodes (each on an `EpisodeLoop`, as locally,
so an episode records itself the same way), and one `SamplerActor` holds the sampler, batching
the calls of every worker's episodes. A worker's policy client forwards each
call to the sampler actor. The driver's sampler is the actor's, through its handle
(`RaySampler`): the driver holds no copy of the model for sampling, a checkpoint keeps the
actor's sampler state, and after each optimizer step the new weights go into the object store
once and the sampler actor loads them between decoding rounds.

`ray.address` empty starts a Ray of this machine for the run (`LocalCluster`): a process of its
own, in a session of its own, starts it and holds it, and a guard ends that session (every Ray
process started for the run) once the driver is gone, however it ends. (`ray.init` in the driver
leaves Ray's agents running for a minute or more after a driver killed with SIGKILL, two more
after each kill.)

Episodes come back as their `callgrove.episode/1` JSON line (prompts compacted), so what
crosses the wire is the record itself. Cancelling an episode in the driver cancels it on its
worker, which still returns it (with its kept calls and a `Cancelled` error). A non-empty
`ray.address` names a cluster to join (`auto`, `ray://host:10001`), which the run leaves as it
found it.

With `[model.vllm]` the sampler actor's vLLM sampler starts each server inside a
`VllmServerActor`, which owns the server's process, reports its URL and stops it with itself
(killed, its server goes too: a guard process ends the server's group once the actor is gone,
`callgrove.policy.guard`); the sampler then
talks HTTP to the URLs the actors reported, so servers can sit on any node of a cluster (pushed
weights are written to `weights_dir`, which those nodes must share). The driver keeps no server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import ray

from callgrove.episode import Episode, episode_from_wire
from callgrove.episode.io import encode_episode
from callgrove.forest import compact_prompts
from callgrove.formats.wire import episode_decoder
from callgrove.models import open_model
from callgrove.orchestrator.config import TrainConfig
from callgrove.orchestrator.env import EpisodeLoop
from callgrove.orchestrator.envs import make_env
from callgrove.orchestrator.errors import RunError
from callgrove.policy import Completion, SamplingParams
from callgrove.policy.guard import end_group, guard_group
from callgrove.policy.vllm import VllmServer, VllmSettings


@ray.remote(num_cpus=0)
class VllmServerActor:
    """One vLLM server process, owned by this actor (`VllmServer`)."""

    def __init__(self, model_folder: str, settings: VllmSettings, lora_rank: int):
        self.server = VllmServer.start(Path(model_folder), settings, lora_rank)

    def url(self) -> str:
        return self.server.url

    def wait_ready(self, timeout: float) -> None:
        self.server.wait_ready(timeout)

    def exit_code(self) -> int | None:
        return self.server.exit_code

    def pid(self) -> int:
        return self.server.process.pid

    def stop(self) -> None:
        self.server.stop()


class RayVllmServer:
    """The sampler's handle on a server in a `VllmServerActor` (a `StartedServer`)."""

    def __init__(self, actor: Any, url: str, started_with: tuple[Path, VllmSettings, int]):
        self.actor = actor
        self.url = url
        self.started_with = started_with

    @classmethod
    def start(cls, model_folder: Path, settings: VllmSettings, lora_rank: int) -> RayVllmServer:
        actor = VllmServerActor.remote(str(model_folder), settings, lora_rank)
        url = ray.get(actor.url.remote())
        return cls(actor, url, (model_folder, settings, lora_rank))

    @property
    def startup_timeout(self) -> float:
        return self.started_with[1].startup_timeout

    @property
    def exit_code(self) -> int | None:
        """The server's exit code (None while it runs, or where its actor is gone with it)."""
        try:
            return ray.get(self.actor.exit_code.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return None

    def wait_ready(self, timeout: float) -> None:
        ray.get(self.actor.wait_ready.remote(timeout))

    def relaunch(self) -> RayVllmServer:
        self.stop()
        return RayVllmServer.start(*self.started_with)

    def stop(self) -> None:
        # Where its actor is gone, its server went with it.
        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            ray.get(self.actor.stop.remote(), timeout=60)
        ray.kill(self.actor)


@ray.remote
class SamplerActor:
    """The run's sampler (built by the same backend as locally) behind an async actor."""

    def __init__(self, config: dict[str, Any]):
        import torch

        torch.set_num_threads(1)
        settings = _config(config)
        self.sampler = open_model(
            settings.model,
            seed=settings.run.seed,
            learner=settings.train,
            launch_server=RayVllmServer.start,
        ).sampler

    async def sample(self, prompt_ids: Any, params: SamplingParams) -> Completion:
        return await self.sampler.sample(prompt_ids, params)

    async def load_weights(self, weights: Any, version: int) -> int:
        await self.sampler.load_weights(weights, version)
        return version

    def version(self) -> int:
        return self.sampler.version

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)

    async def close(self) -> None:
        """Stop the servers it started (vLLM's), before the actor goes."""
        if callable(getattr(self.sampler, "aclose", None)):
            await self.sampler.aclose()


class RemotePolicy:
    """A `PolicyClient` that forwards each call to the sampler actor (an environment worker's);
    its version is the newest a call came back with."""

    def __init__(self, actor: Any):
        self.actor = actor
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    async def sample(self, prompt_ids: Any, params: SamplingParams) -> Completion:
        sample = await self.actor.sample.remote(prompt_ids, params)
        self._version = max(self._version, sample.policy_version)
        return sample


@contextlib.contextmanager
def actor_of_the_run(what: str) -> Iterator[None]:
    """An actor of the run that died (killed, crashed, or failed to start) stops the run with
    one line naming it."""
    try:
        yield
    except ray.exceptions.RayActorError as error:
        reason = (str(error).strip().splitlines() or ["no reason given"])[0].rstrip(".")
        raise RunError(
            f"Ray's {what} died ({reason}); the run stops here: run the same command again to "
            "continue from its last checkpoint"
        ) from None


class RaySampler(RemotePolicy):
    """The driver's sampler: the sampler actor's, through its handle (a `TrainableSampler`);
    its version is the one last pushed, which the dispatcher counts a step's lag from."""

    async def load_weights(self, weights: Any, version: int) -> None:
        with actor_of_the_run("sampler actor"):
            await self.actor.load_weights.remote(ray.put(weights), version)
        self._version = version

    def state_dict(self) -> dict[str, Any]:
        with actor_of_the_run("sampler actor"):
            return ray.get(self.actor.state_dict.remote())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with actor_of_the_run("sampler actor"):
            ray.get(self.actor.load_state_dict.remote(state))


@ray.remote
class EnvWorker:
    """Runs episodes of the configured environment; returns each as its JSON line."""

    def __init__(self, config: dict[str, Any], sampler: Any, chat: Any, params: Any):
        settings = _config(config)
        self.env = make_env(settings.env.name, settings.env.options)
        self.policy = RemotePolicy(sampler)
        self.chat = chat
        self.params = params
        self.timeout = settings.dispatch.episode_timeout
        self.running: dict[str, asyncio.Task[Episode]] = {}
        self.episodes = EpisodeLoop()

    async def run(self, episode_id: str, group: str | None, task: Any) -> bytes:
        job = asyncio.ensure_future(
            self.episodes.run(
                self.env,
                task,
                self.policy,
                self.chat,
                self.params,
                Episode(id=episode_id, group=group),
                self.timeout,
            )
        )
        self.running[episode_id] = job
        try:
            episode = await asyncio.shield(job)
        except asyncio.CancelledError:
            job.cancel()
            episode = await job
        finally:
            self.running.pop(episode_id, None)
        if any(True for _ in episode.calls()):
            compact_prompts(episode)
        return encode_episode(episode)

    def cancel(self, episode_id: str) -> bool:
        job = self.running.get(episode_id)
        if job is None:
            return False
        job.cancel()
        return True


def _raw(config: TrainConfig) -> dict[str, Any]:
    """The config as plain data, how actors receive it."""
    return msgspec.to_builtins(config)


def _config(raw: dict[str, Any]) -> TrainConfig:
    from callgrove.orchestrator.config import config_from_dict

    return config_from_dict(raw, source="driver config")


# The process that starts and holds a run's Ray (`LocalCluster`): it prints the cluster's
# address, then waits to be ended with it.
_HOLD_RAY = """
import threading, ray
ray.init(address="local", include_dashboard=False, log_to_driver=False, configure_logging=False)
print(ray.get_runtime_context().gcs_address, flush=True)
threading.Event().wait()
"""


class LocalCluster:
    """A Ray of this machine for one run, started and held by a process in a session of its own,
    which a guard ends, with every process Ray started in it, once the driver is gone."""

    def __init__(self, holder: subprocess.Popen[bytes], address: str):
        self.holder = holder
        self.address = address

    @classmethod
    def start(cls) -> LocalCluster:
        # What `ray.init` does in a process that starts a Ray: token authentication on (saving a
        # token if there is none) unless RAY_AUTH_MODE says otherwise; the holder inherits it,
        # and this process connects with it.
        from ray._private.authentication.authentication_token_setup import (
            enable_token_auth_by_default,
        )

        enable_token_auth_by_default()
        with tempfile.TemporaryFile() as log:
            holder = subprocess.Popen(
                [sys.executable, "-c", _HOLD_RAY],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # its group is Ray's processes, which the guard ends
            )
            guard_group(holder.pid)
            assert holder.stdout is not None
            address = holder.stdout.readline().decode().strip()
            if not address:
                holder.wait()
                log.seek(0)
                tail = log.read()[-2000:].decode(errors="replace").strip()
                raise RunError(f"Ray did not start (exit code {holder.returncode}): {tail}")
        return cls(holder, address)

    def stop(self) -> None:
        end_group(self.holder.pid, grace=10.0)
        self.holder.wait()


def _answers(address: str) -> None:
    """A cluster address `host:port` (or `ray://host:port`) at which nothing answers is an error
    at once: Ray would retry connecting to it for a quarter of an hour."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():  # `auto`, or a form Ray resolves itself
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as error:
        raise RunError(
            f"ray.address {address!r}: nothing answers there ({error.strerror or error}); start "
            "the cluster, or leave ray.address empty for a Ray of this machine"
        ) from None


class RayExecutor:
    """The driver's handle on the actors: the sampler actor (`sampler`), started before the
    driver builds its learner, then the environment workers (an `EpisodeRunner`)."""

    def __init__(
        self,
        config: TrainConfig,
        sampler: RaySampler,
        connected: bool,
        cluster: LocalCluster | None,
    ):
        """`connected`: whether this run connected this process to Ray (and disconnects it);
        `cluster`: the run's own Ray, if it started one."""
        self.config = config
        self.sampler = sampler
        self.workers: list[Any] = []
        self._next: Iterator[Any] = iter(())
        self._connected = connected
        self._cluster = cluster

    @classmethod
    def start(cls, config: TrainConfig) -> RayExecutor:
        """Ray (this run's own, unless `ray.address` names a cluster or this process is
        connected to one already) and the sampler actor."""
        cluster, connected = None, not ray.is_initialized()
        if connected:
            # Workers import what the driver can: its import path and its current folder,
            # where `make_env` looks for an environment's module.
            path = [p for p in (os.environ.get("PYTHONPATH"), os.getcwd()) if p]
            env_vars = {"PYTHONPATH": os.pathsep.join(path)}
            options: dict[str, Any] = {
                "log_to_driver": False,
                "configure_logging": False,
                "runtime_env": {"env_vars": env_vars},
            }
            if config.ray.address:
                _answers(config.ray.address)
            else:
                cluster = LocalCluster.start()
            try:
                ray.init(address=cluster.address if cluster else config.ray.address, **options)
            except ConnectionError as error:
                raise RunError(f"ray.address {config.ray.address!r}: {error}") from None
        return cls(config, RaySampler(SamplerActor.remote(_raw(config))), connected, cluster)

    def start_workers(self, chat: Any, params: SamplingParams) -> None:
        self.workers = [
            EnvWorker.remote(_raw(self.config), self.sampler.actor, chat, params)
            for _ in range(self.config.ray.env_workers)
        ]
        self._next = itertools.cycle(self.workers)

    async def run_episode(self, episode: Episode, task: Any) -> Episode:
        worker = next(self._next)
        with actor_of_the_run(f"environment worker {self.workers.index(worker)}"):
            reference = worker.run.remote(episode.id, episode.group, task)
            try:
                line = await reference
            except asyncio.CancelledError:
                await worker.cancel.remote(episode.id)
                line = await reference
        return episode_from_wire(episode_decoder.decode(line))

    def close(self) -> None:
        with contextlib.suppress(ray.exceptions.RayActorError):  # one that failed to start
            ray.get(self.sampler.actor.close.remote())
        for actor in [*self.workers, self.sampler.actor]:
            ray.kill(actor)
        if self._connected:
            ray.shutdown()
        if self._cluster is not None:
            self._cluster.stop()
