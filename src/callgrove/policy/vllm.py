"""vLLM servers as the loop's sampler: token ids in, token ids and sampled logprobs out, new
weights pushed into the servers after every optimizer step.

`[model.vllm]` in a training config turns it on for a Hugging Face model (`hf:PATH`,
`smollm2-135m`); the learner stays in this process. The sampler either starts `servers` vLLM
servers itself (`VllmServer`: the interpreter `python` names, loopback, a free port, a bounded
wait for `/health`, stopped on close; on Ray, each inside an actor, `RayVllmServer`) or uses
running ones (`urls`).

Calls go to `/v1/completions` with the prompt as token ids and `return_token_ids`
(`callgrove.policy.http`). A started server reports the logprobs of the distribution it sampled
(`--logprobs-mode processed_logprobs`: tempered and top-p renormalised), which each call records
as its `sampling`; a running server given by URL must have been started so too. Each call goes to
the server with the fewest calls in flight. A server that stops answering fails the calls it
held (the error names it; nothing is made up, and no call is sent again, where another version
could answer it). A server started here is then restarted, up to `restarts` times (a warning
names it, its exit code and the restart's number): calls go to the other servers meanwhile, or
wait for it where none is left, and it takes calls again only once it holds the current weights
(the last full weights pushed, or the current LoRA adapter). A server given by URL, or one whose
restarts are used up, is dropped; the sampler goes on with the rest and fails every call once
none is left.

Weights after every step; a call never spans two versions, and carries the version it was sent
under. Full weights are written as one safetensors file and reloaded in place: new calls wait,
the calls in flight finish on the version they started on, then every server is paused
(`/pause?mode=wait`, for clients other than this one), reloads (`/collective_rpc`
`reload_weights`) and resumes. A LoRA adapter is written in PEFT's layout and loaded beside the
one in use under a new name (`/v1/load_lora_adapter`), which later calls then name: the calls in
flight go on under the adapter they named, so the push waits for none of them, and the previous
adapter is unloaded once the last of them is back (servers hold two adapters, `--max-loras 2`).
A server on another machine needs `weights_dir` on a filesystem it shares.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import numpy as np

from callgrove.errors import InvalidValue, RunFailed
from callgrove.formats.ranges import check_choice, check_range
from callgrove.policy.client import Completion, SamplingParams
from callgrove.policy.guard import guard_group
from callgrove.policy.http import HttpPolicyClient, UpstreamError, adapter_name

if TYPE_CHECKING:
    from callgrove.networks.sizes import LoraSettings

# The name a started server serves its base model under (the gateway asks for it by default).
SERVED_MODEL = "policy"
_WEIGHTS_FILE = "model.safetensors"
DTYPES = ("float32", "bfloat16", "float16")
_EMBEDDING = "model.embed_tokens.weight"
RESTARTS = 2
MAX_RESTARTS = 10


class VllmSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`[model.vllm]`: where the vLLM servers come from and how started ones run."""

    urls: list[str] = []
    """Running servers to use (not started or stopped here); empty: start `servers`."""
    served_model: str = SERVED_MODEL
    """The model name the servers serve the base weights under."""
    weights_dir: str = ""
    """Where pushed weights are written (empty: a temporary folder, removed on close); servers
    on other machines must see it at the same path."""
    request_timeout: float = 600.0
    # Started servers only:
    servers: int = 1
    python: str = ".venv-vllm/bin/python"
    """The interpreter with vLLM installed (`make vllm` creates `.venv-vllm`)."""
    kv_cache_gb: int = 2
    """GiB of KV cache per server (vLLM's CPU build takes whole GiB)."""
    max_model_len: int = 2048
    dtype: str = "float32"
    startup_timeout: float = 300.0
    restarts: int = RESTARTS
    """How many times each server that dies is started again (at most `MAX_RESTARTS`; 0:
    dropped at once).
    Two ride out the odd crash of a long run; a server that keeps dying is dropped, not
    restarted for ever."""
    eager: bool = True
    """Skip vLLM's torch.compile warm-up (`--enforce-eager`): on a busy CPU it took more than
    4 minutes, where an eager server is ready in about one."""
    extra_args: list[str] = []
    """More `vllm serve` arguments, as given."""

    def __post_init__(self) -> None:
        check_range("servers", self.servers, at_least=1)
        check_range("kv_cache_gb", self.kv_cache_gb, at_least=1)
        check_range("max_model_len", self.max_model_len, at_least=16)
        check_range("startup_timeout", self.startup_timeout, above=0)
        check_range("restarts", self.restarts, at_least=0, at_most=MAX_RESTARTS)
        check_range("request_timeout", self.request_timeout, above=0)
        check_choice("dtype", self.dtype, DTYPES)
        if not self.served_model:
            raise InvalidValue("served_model: empty")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise InvalidValue(f"urls: {url!r} is not an http:// or https:// URL")
        if self.urls:
            default = VllmSettings()
            given = [
                name for name in _STARTED_ONLY if getattr(self, name) != getattr(default, name)
            ]
            if given:
                raise InvalidValue(
                    f"{', '.join(given)}: settings of servers callgrove starts; with urls the "
                    "servers are already running (leave them out, or leave out urls)"
                )


_STARTED_ONLY = (
    "servers",
    "python",
    "kv_cache_gb",
    "max_model_len",
    "dtype",
    "startup_timeout",
    "restarts",
    "eager",
    "extra_args",
)


class VllmError(RunFailed, RuntimeError):
    """A vLLM server could not start, or no server is left to sample."""


def interpreter(settings: VllmSettings) -> Path:
    """The interpreter that starts servers; a `FileNotFoundError` saying how to get one."""
    python = Path(settings.python)
    if not python.is_file():
        raise FileNotFoundError(
            f"vllm.python {settings.python}: no such interpreter (`make vllm` creates "
            ".venv-vllm with vLLM's CPU build; or give vllm.urls of running servers)"
        )
    return python


STARTING_REPORT_EVERY = 15.0
"""Seconds between the lines saying a server is still starting."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """One `vllm serve` process on loopback, in its own process group, its output in a log."""

    def __init__(
        self,
        process: subprocess.Popen,
        url: str,
        log: Path,
        started_with: tuple[Path, VllmSettings, int],
    ):
        self.process = process
        self.url = url
        self.log = log
        self.started_with = started_with
        """(model folder, settings, LoRA rank): what `relaunch` starts again."""

    @classmethod
    def start(
        cls,
        model_folder: Path,
        settings: VllmSettings,
        lora_rank: int = 0,
        log_dir: Path | None = None,
    ) -> VllmServer:
        """Launch a server of `model_folder` (not waiting for it: see `wait_ready`)."""
        python = interpreter(settings)
        port = free_port()
        log_dir = log_dir or Path(tempfile.mkdtemp(prefix="callgrove-vllm-"))
        log = log_dir / f"vllm-{port}.log"
        command = [
            str(python),
            *("-m", "vllm.entrypoints.openai.api_server"),
            *("--model", str(model_folder), "--served-model-name", settings.served_model),
            *("--host", "127.0.0.1", "--port", str(port)),
            *("--max-model-len", str(settings.max_model_len), "--dtype", settings.dtype),
            # The logprobs of the distribution sampled from, not the untempered one.
            *("--logprobs-mode", "processed_logprobs"),
            "--enable-scale-out",
            *(("--enforce-eager",) if settings.eager else ()),
            *(
                (
                    *("--enable-lora", "--max-lora-rank", str(_max_lora_rank(lora_rank))),
                    *("--max-loras", "2"),  # the adapter in use and the one pushed beside it
                )
                if lora_rank
                else ()
            ),
            *settings.extra_args,
        ]
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(settings.kv_cache_gb),
            "VLLM_SERVER_DEV_MODE": "1",  # /pause, /resume and /collective_rpc
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "HF_HUB_OFFLINE": "1",
        }
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its workers are stopped with it
            )
        guard_group(process.pid)  # ended with this process, however it ends
        server = cls(process, f"http://127.0.0.1:{port}", log, (model_folder, settings, lora_rank))
        atexit.register(server.stop)  # never outlives this process, whatever fails before close
        return server

    def wait_ready(self, timeout: float) -> None:
        """Return once `/health` answers; a `VllmError` quoting the log if the server exits or
        `timeout` seconds pass. A server takes a minute or more to start: a line on stderr says
        so when the wait begins and every `STARTING_REPORT_EVERY` seconds."""
        import httpx

        started = time.monotonic()
        deadline = started + timeout
        report = started
        while True:
            if time.monotonic() >= report:
                print(
                    f"waiting for the vLLM server {self.url} to start: "
                    f"{time.monotonic() - started:.0f} s of at most {timeout:g} s (its log: "
                    f"{self.log})",
                    file=sys.stderr,
                    flush=True,
                )
                report += STARTING_REPORT_EVERY
            if self.process.poll() is not None:
                raise VllmError(
                    f"vLLM server {self.url} exited with code {self.process.returncode} while "
                    f"starting; the end of its log ({self.log}):\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise VllmError(
                    f"vLLM server {self.url} was not ready after {timeout:g} s; the end of its "
                    f"log ({self.log}):\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def relaunch(self) -> VllmServer:
        """A new server started as this one was (on a new port; see `wait_ready`), after what is
        left of this one is stopped."""
        self.stop(grace=5)
        model_folder, settings, lora_rank = self.started_with
        return VllmServer.start(model_folder, settings, lora_rank, self.log.parent)

    @property
    def startup_timeout(self) -> float:
        return self.started_with[1].startup_timeout

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.log.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return "(no log)"

    @property
    def exit_code(self) -> int | None:
        return self.process.poll()

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to its process group, SIGKILL after `grace` seconds."""
        atexit.unregister(self.stop)
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # workers left behind by the leader


# The values vLLM 0.32 takes for --max-lora-rank.
_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _max_lora_rank(rank: int) -> int:
    for allowed in _MAX_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise InvalidValue(
        f"LoRA rank {rank}: vLLM serves adapters of rank {_MAX_LORA_RANKS[-1]} at most"
    )


class StartedServer(Protocol):
    """A server the sampler started and may restart: `VllmServer`, or one in a Ray actor
    (`callgrove.orchestrator.ray_executor.RayVllmServer`)."""

    url: str

    @property
    def exit_code(self) -> int | None: ...

    @property
    def startup_timeout(self) -> float: ...

    def wait_ready(self, timeout: float) -> None: ...

    def relaunch(self) -> StartedServer: ...

    def stop(self) -> None: ...


Launcher = Callable[[Path, VllmSettings, int], StartedServer]
"""Starts one server of (model folder, settings, LoRA rank) without waiting for it."""


def start_servers(
    model_folder: Path, settings: VllmSettings, lora_rank: int = 0, launch: Launcher | None = None
) -> list[StartedServer]:
    """`settings.servers` servers (`launch`: how each starts; a `VllmServer` here by default),
    started together and waited for; all stopped if one fails."""
    launch = launch or VllmServer.start
    servers: list[StartedServer] = []
    try:
        for _ in range(settings.servers):
            servers.append(launch(model_folder, settings, lora_rank))
        for server in servers:
            server.wait_ready(settings.startup_timeout)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


@dataclass
class _Upstream:
    """One server as the sampler sees it."""

    client: HttpPolicyClient
    process: StartedServer | None
    in_flight: int = 0
    gone: str | None = None
    """Why it was dropped (None: in use)."""
    restarting: bool = False
    restarts: int = 0
    """How many times it was restarted."""


class VllmSampler:
    """A `TrainableSampler` over one or more vLLM servers (see the module)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        served_model: str = SERVED_MODEL,
        base_folder: Path | None = None,
        lora: LoraSettings | None = None,
        weights_dir: str | Path = "",
        processes: Sequence[StartedServer] = (),
        seed: int = 0,
        timeout: float = 600.0,
        restarts: int = RESTARTS,
    ):
        """`processes`: servers this sampler started (stopped by `aclose`, restarted up to
        `restarts` times each when they die); `base_folder`: the served checkpoint, named in a
        LoRA adapter's config."""
        if not urls:
            raise InvalidValue("a vLLM sampler needs at least one server")
        started = {p.url: p for p in processes}
        check_range("restarts", restarts, at_least=0, at_most=MAX_RESTARTS)
        self.timeout = timeout
        self.served_model = served_model
        self.upstreams = [
            _Upstream(self._client(url), started.get(url.rstrip("/"))) for url in urls
        ]
        self.restarts = restarts
        self.base_folder = base_folder
        self.lora = lora
        self._own_weights_dir = not weights_dir
        self.weights_dir = Path(weights_dir or tempfile.mkdtemp(prefix="callgrove-weights-"))
        self._version = 0
        self._adapter: str | None = None  # the LoRA adapter later calls name
        self._written: Path | None = None  # the folder of the weights last pushed
        self._seeds = np.random.default_rng(seed)
        self._open = asyncio.Event()
        self._open.set()
        self._idle: asyncio.Condition | None = None
        self._pushing: asyncio.Lock | None = None  # a weight push, or a restarted server's
        self._restarting: set[asyncio.Task] = set()
        self._adapter_calls: Counter[str | None] = Counter()  # calls in flight per adapter
        self._retiring: set[asyncio.Task] = set()  # adapters unloaded once their calls are back
        self._closed = False
        self.update_seconds: list[float] = []
        """Wall time of each weight push (write, pause, load, resume)."""

    @property
    def version(self) -> int:
        return self._version

    @property
    def live(self) -> list[_Upstream]:
        """The servers that take calls (not dropped, not restarting)."""
        return [u for u in self.upstreams if u.gone is None and not u.restarting]

    def _client(self, url: str) -> HttpPolicyClient:
        return HttpPolicyClient(
            url, model=self.served_model, timeout=self.timeout, tempered_logprobs=True
        )

    def _condition(self) -> asyncio.Condition:
        if self._idle is None:
            self._idle = asyncio.Condition()
        return self._idle

    def _push_lock(self) -> asyncio.Lock:
        if self._pushing is None:
            self._pushing = asyncio.Lock()
        return self._pushing

    async def _notify(self) -> None:
        async with self._condition():
            self._condition().notify_all()

    async def _route(self) -> _Upstream:
        """The least loaded server taking calls, once no push holds calls back; while none
        takes calls but one is restarting, its restart is waited for."""
        while True:
            await self._open.wait()  # returns at once (no other task runs) when open
            live = self.live
            if live:
                return min(live, key=lambda u: u.in_flight)
            if not self._restarts_pending():
                raise VllmError(f"no vLLM server left: {self.dropped_reasons()}")
            async with self._condition():
                await self._condition().wait_for(
                    lambda: bool(self.live) or not self._restarts_pending()
                )

    async def sample(self, prompt_ids: np.ndarray, params: SamplingParams) -> Completion:
        upstream = await self._route()
        version, adapter = self._version, self._adapter
        client, process = upstream.client, upstream.process
        if params.seed is None:  # reproducible draws from the run's seed
            params = msgspec.structs.replace(params, seed=int(self._seeds.integers(2**31)))
        upstream.in_flight += 1
        self._adapter_calls[adapter] += 1
        try:
            sample = await client.sample(prompt_ids, params)
        except UpstreamError as error:
            if error.status in (502, 504) and not await _answers(client, process):
                raise UpstreamError(self._lost(upstream, process, str(error))) from None
            raise
        finally:
            upstream.in_flight -= 1
            self._adapter_calls[adapter] -= 1
            await self._notify()
        return replace(sample, policy_version=version)

    def _lost(self, upstream: _Upstream, process: StartedServer | None, why: str) -> str:
        """A call's server stopped answering: restart or drop it (once, whichever of its calls
        fails first) and say so; the failed call's message."""
        url = upstream.client.base_url
        code = process.exit_code if process is not None else None
        died = f"exited with code {code}" if code is not None else why
        if upstream.process is not process or upstream.gone or upstream.restarting:
            fate = "dropped" if upstream.gone else "restarting"
            return f"vLLM server {url} stopped answering ({died}); this call failed ({fate})"
        if process is not None and upstream.restarts < self.restarts:
            upstream.restarting = True
            upstream.restarts += 1
            count = f"restart {upstream.restarts} of {self.restarts}"
            warnings.warn(
                f"vLLM server {url} stopped answering ({died}); its calls in flight failed; "
                f"restarting it ({count})",
                stacklevel=3,
            )
            task = asyncio.create_task(self._restart(upstream))
            self._restarting.add(task)
            task.add_done_callback(self._restarting.discard)
            return f"vLLM server {url} stopped answering ({died}); this call failed ({count})"
        self._drop(
            upstream,
            f"{died}; "
            + (
                "a server given by URL is not restarted"
                if process is None
                else f"no restart left ({upstream.restarts} of {self.restarts} used)"
            ),
        )
        return (
            f"vLLM server {url} stopped answering ({upstream.gone}); this call failed and the "
            f"server is dropped ({len(self.live)} of {len(self.upstreams)} left)"
        )

    async def _restart(self, upstream: _Upstream) -> None:
        """Start a dead server again and bring it to the current weights before it takes calls;
        dropped if that fails."""
        assert upstream.process is not None
        old_url = upstream.client.base_url
        try:
            server = await asyncio.to_thread(upstream.process.relaunch)
            upstream.process = server
            if self._closed:
                server.stop()
                upstream.gone = "the sampler closed while it restarted"
                return
            await asyncio.to_thread(server.wait_ready, server.startup_timeout)
            async with self._push_lock():  # no push runs meanwhile: the current weights stay
                old_client, upstream.client = upstream.client, self._client(server.url)
                await old_client.aclose()
                if self._written is not None:
                    await self._push(upstream, self._written, self._version)
                if self._adapter is not None:
                    upstream.client.model = self._adapter
                if upstream.gone is None:
                    upstream.restarting = False
                    warnings.warn(
                        f"vLLM server {old_url} restarted as {server.url} "
                        f"(restart {upstream.restarts} of {self.restarts}), on version "
                        f"{self._version}",
                        stacklevel=2,
                    )
        except Exception as error:
            self._drop(upstream, f"restart {upstream.restarts} failed: {error}")
        finally:
            if upstream.gone is not None:
                upstream.restarting = False
            await self._notify()

    def _drop(self, upstream: _Upstream, why: str) -> None:
        if upstream.gone is not None:
            return
        upstream.gone = why
        warnings.warn(
            f"vLLM server {upstream.client.base_url} dropped: {upstream.gone} "
            f"({len(self.live)} of {len(self.upstreams)} left)",
            stacklevel=2,
        )

    def _restarts_pending(self) -> bool:
        return any(u.restarting for u in self.upstreams)

    def dropped_reasons(self) -> str:
        return "; ".join(f"{u.client.base_url}: {u.gone}" for u in self.upstreams if u.gone)

    async def load_weights(self, weights: Any, version: int) -> None:
        """Push `weights` (the learner's trained parameters by their Hugging Face names: all of
        them, or the LoRA adapters alone) into every server; calls sent from now on carry
        `version`. A server restarting meanwhile is brought to them before it takes calls."""
        started = time.perf_counter()
        self._open.clear()
        try:
            async with self._push_lock():
                await self._load(weights, version)
        finally:
            self._open.set()
        self.update_seconds.append(time.perf_counter() - started)

    async def _load(self, weights: Any, version: int) -> None:
        if self.lora is None:  # reloaded in place: no call may be under way
            async with self._condition():
                await self._condition().wait_for(lambda: all(u.in_flight == 0 for u in self.live))
        else:  # at most two adapters loaded: the previous push's must be gone
            await asyncio.gather(*self._retiring)
        if not self.live and not self._restarts_pending():
            raise VllmError(f"no vLLM server left to load weights: {self.dropped_reasons()}")
        folder = await asyncio.to_thread(self._write, weights, version)
        pushed_to = self.live
        await asyncio.gather(*(self._push(u, folder, version) for u in pushed_to))
        if pushed_to and not self.live and not self._restarts_pending():
            raise VllmError(f"no vLLM server took the new weights: {self.dropped_reasons()}")
        previous, self._written = self._written, folder
        self._version = version
        if self.lora is None:
            if previous is not None and previous != folder:
                shutil.rmtree(previous, ignore_errors=True)
            return
        old, self._adapter = self._adapter, adapter_name(self.served_model, version)
        for upstream in self.live:
            upstream.client.model = self._adapter
        if old is not None:
            self._retire(old, previous)
        if self._adapter_calls[old] == 0:  # nothing holds it up: gone before the push ends
            await asyncio.gather(*self._retiring)

    def _write(self, weights: dict[str, Any], version: int) -> Path:
        from safetensors.torch import save_file

        folder = self.weights_dir / f"v{version}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        if self.lora is None:
            tensors = {n: t.detach().contiguous() for n, t in weights.items()}
            if "lm_head.weight" not in tensors and _EMBEDDING in tensors:
                # A head tied to the embedding (Hugging Face names the shared parameter once):
                # vLLM's in-place reload leaves a tied head on its old tensor unless the file
                # names the head too.
                tensors["lm_head.weight"] = tensors[_EMBEDDING].clone()
            save_file(tensors, folder / _WEIGHTS_FILE)
            return folder
        tensors = {}
        for name, tensor in weights.items():
            if ".lora_" not in name:
                raise InvalidValue(f"LoRA weights hold {name!r}, which is not an adapter's")
            # PEFT's files name adapters without the adapter's own name ("default").
            tensors[name.replace(".default.", ".")] = tensor.detach().contiguous()
        save_file(tensors, folder / "adapter_model.safetensors")
        config = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": str(self.base_folder or ""),
            "r": self.lora.rank,
            "lora_alpha": self.lora.alpha,
            "lora_dropout": self.lora.dropout,
            "target_modules": list(self.lora.target_modules),
            "bias": "none",
            "fan_in_fan_out": False,
            "modules_to_save": None,
            "use_rslora": False,
            "use_dora": False,
        }
        (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
        return folder

    async def _push(self, upstream: _Upstream, folder: Path, version: int) -> None:
        """One server onto the weights (of `version`) in `folder`; a server that fails to is
        dropped. Full weights also set the server's weight version (`/weight_info`)."""
        try:
            if self.lora is not None:
                await upstream.client.control(
                    "/v1/load_lora_adapter",
                    {
                        "lora_name": adapter_name(self.served_model, version),
                        "lora_path": str(folder),
                        # a running server may hold this name from an earlier run: this run's
                        # version N replaces it
                        "load_inplace": True,
                    },
                )
                return
            await upstream.client.control("/pause?mode=wait", None)
            try:
                await upstream.client.control(
                    "/collective_rpc",
                    {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
                )
                await upstream.client.control(
                    "/update_weight_version", {"new_version": str(version)}
                )
            finally:
                await upstream.client.control("/resume", None)
        except UpstreamError as error:
            self._drop(upstream, f"loading new weights failed: {error}")

    def _retire(self, adapter: str, folder: Path | None) -> None:
        """Unload `adapter` from the servers holding it once no call in flight names it, then
        remove its `folder`: a server reads an adapter's file again whenever it swaps it back
        into a batch, so the file stays while any call names it."""
        holders = self.live

        async def unload() -> None:
            async with self._condition():
                await self._condition().wait_for(lambda: self._adapter_calls[adapter] == 0)
            await asyncio.gather(*(self._unload(u, adapter) for u in holders if u in self.live))
            if folder is not None and folder != self._written:
                shutil.rmtree(folder, ignore_errors=True)

        task = asyncio.create_task(unload())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _unload(self, upstream: _Upstream, adapter: str) -> None:
        try:
            await upstream.client.control("/v1/unload_lora_adapter", {"lora_name": adapter})
        except UpstreamError as error:  # the old adapter stays loaded: harmless, but said
            warnings.warn(
                f"vLLM server {upstream.client.base_url} kept adapter {adapter}: {error}",
                stacklevel=2,
            )

    def state_dict(self) -> dict[str, Any]:
        return {"seeds": self._seeds.bit_generator.state, "version": self._version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._seeds.bit_generator.state = state["seeds"]
        self._version = int(state["version"])

    async def aclose(self) -> None:
        self._closed = True
        for task in self._retiring:  # the servers go: nothing to unload from
            task.cancel()
        for upstream in self.upstreams:
            await upstream.client.aclose()
            if upstream.process is not None:
                await asyncio.to_thread(upstream.process.stop)
        # A restart waiting for its server sees it stopped and ends; so does an unload.
        await asyncio.gather(*self._restarting, *self._retiring, return_exceptions=True)
        # A server given by URL goes on holding the last weights pushed, and vLLM reads an
        # adapter's files again whenever it swaps it back in: that folder stays.
        held = any(u.process is None and u.gone is None for u in self.upstreams)
        keep = self._written if held else None
        if keep is not None:
            for folder in self.weights_dir.iterdir():
                if folder != keep:
                    shutil.rmtree(folder, ignore_errors=True)
        elif self._own_weights_dir:
            shutil.rmtree(self.weights_dir, ignore_errors=True)


async def _answers(client: HttpPolicyClient, process: StartedServer | None) -> bool:
    """Whether a server is still there (its process runs and `/health` answers)."""
    import httpx

    if process is not None and process.exit_code is not None:
        return False
    try:
        async with httpx.AsyncClient(timeout=5) as session:
            health = await session.get(client.base_url + "/health")
    except httpx.HTTPError:
        return False
    return health.status_code == 200


def vllm_sampler(
    settings: VllmSettings,
    model_folder: Path,
    lora: LoraSettings | None,
    seed: int,
    launch: Launcher | None = None,
) -> VllmSampler:
    """The sampler `[model.vllm]` describes: over `urls`, or over servers started here (by
    `launch`, as in `start_servers`)."""
    processes = (
        []
        if settings.urls
        else start_servers(model_folder, settings, lora.rank if lora is not None else 0, launch)
    )
    return VllmSampler(
        settings.urls or [p.url for p in processes],
        served_model=settings.served_model,
        base_folder=model_folder,
        lora=lora,
        weights_dir=settings.weights_dir,
        processes=processes,
        seed=seed,
        timeout=settings.request_timeout,
        restarts=settings.restarts,
    )
