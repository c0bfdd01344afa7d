"""The learner as N ranks of torch.distributed: FSDP2 (`fully_shard`) shards the model across
processes the learner starts itself, each step's rows are dealt among them, and the update is
the one process's.

`RankedLearner` satisfies `callgrove.policy.Learner`. The process that holds it (the driver:
the loop, its sampler) keeps no model, only a pipe to each rank; the ranks hold the shards, the
optimizer's shards, and run the steps. They start from a forkserver with torch already imported
and meet on a TCP store the driver opens on a free loopback port; on `cuda` rank r uses GPU r
and NCCL, on `cpu` gloo. The build function runs in every rank and must build the same model
there (seeded), which is then sharded: a stack of blocks (every entry of a model's outermost
`nn.ModuleList`: the tiny decoder's blocks, a Hugging Face model's decoder layers, LoRA
adapters inside them) one FSDP unit each, the rest one unit at the root.

Exact across world sizes (`world_size = 1`, the learner in one process, is the reference):
- the driver deals the step's rows whole, in the units tree packing needs together (the rows of
  one trie: a call tree, an episode, a group; a group for tree scope `step`, whose tries then
  form within each rank), each rank taking the next heaviest unit while it is the lightest,
  weighed by the tokens it forwards (trie nodes tree-packed, row tokens packed); each rank
  packs its share as the one-process learner packs a step;
- every micro-batch's loss is divided by the denominator of the whole step (`step_denominator`
  over all its rows), and the gradient shards are reduced by sum, not FSDP's mean, so every
  parameter's gradient is the one-process sum over the same rows;
- every rank runs as many forward and backward passes as the busiest (idle passes add a zero
  gradient): each pass gathers the shards from all ranks;
- gradient clipping uses the whole gradient's norm, and the loss is summed across ranks before
  the finite check, so all ranks step or all refuse;
- the metrics are every rank's: each rank returns what its forwards measured per token, and the
  driver reports the mismatch and clip fraction over all of them as one process would.

Checkpoints: `state_dict` gathers the full state into the one-process learner's format
(`ModelLearner.state_dict`, `HFLearner.state_dict`), so a checkpoint taken at one world size
loads at any other; `load_state_dict` gives every rank the full state to keep its shards of.
`weights()` is the gathered full state (the adapters alone with LoRA), as the one-process
learner gives it.

Faults: a rank that dies (any signal, any exit) is noticed at once through its process
sentinel; the learner then stops its other ranks (they may wait in a collective on the dead
one) and raises `RankFailed` naming the rank. Every collective has a timeout (`timeout_s`), so
a rank that stops answering fails its peers' collectives, and so the step, in bounded time. A
failure inside one rank (an error its peers did not share) stops the learner too, raising the
same kind of error; a step whose loss or gradient is not finite is refused by all ranks alike
(`FloatingPointError`), and the learner goes on.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from callgrove.batch import Sample
from callgrove.batch.packing import deal_to_ranks
from callgrove.batch.tree import trie_nodes
from callgrove.errors import RunFailed
from callgrove.train.learner import (
    LEARNER_PHASES,
    Measured,
    ModelLearner,
    StepReport,
    clip_fraction,
    mismatch_metrics,
    peak_memory,
    reset_peak_memory,
    step_denominator,
)
from callgrove.train.settings import LearnerSettings, check_world_size

TIMEOUT_S = 600.0
"""How long a collective waits for the other ranks, and the driver for the ranks to start."""
DEVICES = ("cpu", "cuda")
# Imported once by the forkserver the ranks are forked from, so a rank starts in a fraction of a
# second (torch's optimizers import its compiler on first use); `__main__` so that a script's own
# build function is found there.
PRELOAD = ["__main__", "torch", "torch._dynamo", "torch.distributed.fsdp", "callgrove.train.ranks"]
CLOSE_WAIT_S = 10.0

Build = Callable[[LearnerSettings], ModelLearner]
"""Builds one rank's learner from the learner settings: the same model in every rank."""


class RankFailed(RunFailed, ChildProcessError):
    """A rank of the learner died, or failed alone; its other ranks were stopped, so the learner
    can do no more. (An `OSError`: `callgrove train` reports it in one line and exits 1, and the
    same command resumes from the run's last checkpoint.)"""


@dataclass(frozen=True, slots=True)
class _RankSpec:
    rank: int
    world_size: int
    port: int
    build: Build
    settings: LearnerSettings
    device: str
    timeout_s: float
    threads: int


@dataclass(frozen=True, slots=True)
class _Share:
    """One rank's part of a step, and what it needs of the whole step."""

    samples: list[Sample]
    indices: np.ndarray
    """Each sample's index in the step's samples."""
    denominator: float
    loss_tokens: int
    step_samples: int


@dataclass(frozen=True, slots=True)
class _RankStep:
    loss: float
    """The whole step's loss (summed across ranks)."""
    grad_norm: float
    forwarded_tokens: int
    row_tokens: int
    measured: list[Measured]
    seconds: dict[str, float]
    peak_memory: dict[str, float]


class _Agreed(Exception):
    """An error every rank raised alike after agreeing on it: the ranks stay in step. (Not a
    `CallgroveError`: it never leaves a rank's process, whose driver raises the error named.)"""


class RankedLearner:
    """A `Learner` of `settings.world_size` ranks, each holding a shard of the model that
    `build` makes (see the module docstring)."""

    def __init__(
        self,
        build: Build,
        settings: LearnerSettings,
        device: str = "cpu",
        timeout_s: float = TIMEOUT_S,
        options: Any = None,
        preload: Sequence[str] = (),
    ):
        """`preload`: modules the build imports (a Hugging Face model's), imported once where
        the ranks are forked from when this learner is the first to start there."""
        if device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
        check_world_size(settings.world_size, device)  # before any process or store starts
        self.settings = settings
        self.world_size = settings.world_size
        self.options = options
        """What the built learner adds to the settings (an `HFLearner`'s `HFOptions`)."""
        self._version = 0
        self._lock = threading.Lock()
        self._failure: str | None = None
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([*PRELOAD, *preload])  # no effect once it runs
        # The ranks meet here: a store on a free loopback port, alive as long as the learner.
        self._store = dist.TCPStore(
            "127.0.0.1",
            0,
            None,
            True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        threads = max(1, torch.get_num_threads() // self.world_size)
        self._processes: list[multiprocessing.process.BaseProcess] = []
        self._pipes: list[Connection] = []
        for rank in range(self.world_size):
            ours, theirs = context.Pipe()
            spec = _RankSpec(
                rank,
                self.world_size,
                self._store.port,
                build,
                settings,
                device,
                timeout_s,
                threads,
            )
            process = context.Process(
                target=_serve, args=(spec, theirs), name=f"learner-rank-{rank}", daemon=True
            )
            process.start()
            theirs.close()
            self._processes.append(process)
            self._pipes.append(ours)
        self._finalizer = weakref.finalize(self, _stop, self._processes, self._pipes, True)
        self._collect("start", timeout_s)

    @property
    def version(self) -> int:
        return self._version

    @property
    def pids(self) -> list[int]:
        """The ranks' process ids, rank by rank."""
        return [int(p.pid or 0) for p in self._processes]

    def train_step(self, samples: Sequence[Sample]) -> StepReport:
        """One optimizer step over `samples`, dealt among the ranks (see the module docstring)."""
        started = time.perf_counter()
        loss_tokens = sum(s.num_loss_tokens for s in samples)
        denominator = step_denominator(self.settings, samples)
        shares = [
            _Share([samples[i] for i in dealt], dealt, denominator, loss_tokens, len(samples))
            for dealt in deal(samples, self.settings, self.world_size)
        ]
        steps: list[_RankStep] = self._call("train_step", shares)
        self._version += 1
        measured = [m for step in steps for m in step.measured]
        first = steps[0]
        seconds = {phase: first.seconds[phase] for phase in LEARNER_PHASES if phase != "batching"}
        # Dealing, the transfers and the ranks' packing: the rest of the step's wall time.
        seconds["batching"] = time.perf_counter() - started - sum(seconds.values())
        return StepReport(
            loss=first.loss,
            samples=len(samples),
            loss_tokens=loss_tokens,
            forwarded_tokens=sum(step.forwarded_tokens for step in steps),
            row_tokens=sum(step.row_tokens for step in steps),
            grad_norm=first.grad_norm,
            mismatch=mismatch_metrics(measured, samples, self._version - 1),
            extra=clip_fraction(measured) | _most(step.peak_memory for step in steps),
            seconds={phase: seconds[phase] for phase in LEARNER_PHASES},
        )

    def weights(self) -> Any:
        """The gathered weights, as the one-process learner's `weights()` gives them."""
        return self._call("weights", [None] * self.world_size)[0].value()

    def state_dict(self) -> dict[str, Any]:
        """The gathered full state, in the one-process learner's format."""
        return self._call("state_dict", [None] * self.world_size)[0].value()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a full state (one taken at any world size)."""
        self._call("load_state_dict", [state] * self.world_size)
        self._version = int(state["version"])

    def close(self) -> None:
        """Stop the ranks (also done when the learner is collected or the process exits)."""
        self._finalizer()

    def _call(self, command: str, payloads: Sequence[Any]) -> list[Any]:
        with self._lock:
            if self._failure is not None:
                raise RankFailed(f"the learner stopped earlier: {self._failure}")
            for rank, (pipe, payload) in enumerate(zip(self._pipes, payloads, strict=True)):
                try:
                    pipe.send_bytes(pickle.dumps((command, payload), pickle.HIGHEST_PROTOCOL))
                except OSError:  # its end is closed: it died
                    self._died(rank, command)
            return self._collect(command)

    def _collect(self, command: str, timeout_s: float | None = None) -> list[Any]:
        """Every rank's reply to `command`. A rank's death, or an error of one rank alone, stops
        the learner at once; `timeout_s` bounds the wait (none: the ranks' collectives do)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        replies: dict[int, tuple] = {}
        while len(replies) < self.world_size:
            waiting = {self._pipes[r]: r for r in range(self.world_size) if r not in replies}
            ended = {self._processes[r].sentinel: r for r in waiting.values()}
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready = wait([*waiting, *ended], left)
            if not ready:
                self._fail(
                    f"learner ranks {sorted(waiting.values())} of {self.world_size} did not "
                    f"answer {command} within {timeout_s} s"
                )
            for pipe in [r for r in ready if r in waiting]:
                rank = waiting[pipe]
                try:
                    replies[rank] = pickle.loads(pipe.recv_bytes())
                except (EOFError, OSError):
                    self._died(rank, command)
                if replies[rank][0] == "error":
                    self._raise(rank, command, *replies[rank][1:])
            for sentinel in [r for r in ready if r in ended]:
                if ended[sentinel] not in replies:
                    self._died(ended[sentinel], command)
        agreed = [reply for _, reply in sorted(replies.items()) if reply[0] == "agreed"]
        if agreed:
            raise FloatingPointError(agreed[0][2])
        return [replies[rank][1] for rank in range(self.world_size)]

    def _died(self, rank: int, command: str) -> None:
        process = self._processes[rank]
        process.join(CLOSE_WAIT_S)
        code = process.exitcode
        if code is None:
            how = "stopped answering"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        self._fail(
            f"learner rank {rank} of {self.world_size} (pid {process.pid}) {how} during "
            f"{command}; its other ranks were stopped"
        )

    def _raise(self, rank: int, command: str, kind: str, message: str, trace: str) -> None:
        """A rank's own error, as the same kind of error (a builtin one; else RuntimeError)."""
        self._stop_all(f"learner rank {rank} failed in {command}: {kind}: {message}")
        known = getattr(builtins, kind, None)
        error_type = (
            known if isinstance(known, type) and issubclass(known, Exception) else RuntimeError
        )
        error = error_type(f"learner rank {rank}: {message}")
        error.add_note(trace)
        raise error

    def _fail(self, message: str) -> None:
        self._stop_all(message)
        raise RankFailed(message)

    def _stop_all(self, message: str) -> None:
        self._failure = message
        _stop(self._processes, self._pipes, False)


def _most(figures: Iterable[dict[str, float]]) -> dict[str, float]:
    """Each figure's largest value over the ranks (the busiest GPU's peak memory)."""
    most: dict[str, float] = {}
    for figure in figures:
        for name, value in figure.items():
            most[name] = max(most.get(name, value), value)
    return most


def _stop(
    processes: Sequence[multiprocessing.process.BaseProcess],
    pipes: Sequence[Connection],
    gently: bool,
) -> None:
    """End the ranks: asked to close when `gently` (each leaves its process group), then
    killed; none is left running."""
    if gently:
        for pipe in pipes:
            with contextlib.suppress(OSError):  # a rank already gone
                pipe.send_bytes(pickle.dumps(("close", None)))
        deadline = time.monotonic() + CLOSE_WAIT_S
        for process in processes:
            process.join(max(deadline - time.monotonic(), 0.0))
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(CLOSE_WAIT_S)
    for pipe in pipes:
        pipe.close()


def deal(samples: Sequence[Sample], settings: LearnerSettings, ranks: int) -> list[np.ndarray]:
    """Each rank's samples (indices into `samples`, ascending): whole units (a sample packed;
    the rows of one trie tree-packed, a group for tree scope `step`), each of the heaviest left
    to the rank holding the fewest tokens, weighed by what it forwards."""
    if settings.batching == "packed":
        units = [[i] for i in range(len(samples))]
        weights = np.array([s.num_tokens for s in samples], dtype=np.int64)
    else:
        keyed: dict[tuple, list[int]] = {}
        for index, sample in enumerate(samples):
            keyed.setdefault(_unit(sample, settings.tree_scope), []).append(index)
        units = list(keyed.values())
        weights = np.array(
            [trie_nodes([samples[i].token_ids for i in unit]) for unit in units], dtype=np.int64
        )
    order = np.argsort(-weights, kind="stable")
    return [
        np.sort(np.asarray([i for u in members for i in units[u]], dtype=np.int64))
        for members in deal_to_ranks(order, weights, ranks)
    ]


def _unit(sample: Sample, scope: str) -> tuple:
    """The rows that share a trie at `scope` stay on one rank (at scope `step`, a group's)."""
    if scope == "tree":
        return ("tree", sample.episode, sample.root)
    if scope == "episode" or sample.group is None:
        return ("episode", sample.episode)
    return ("group", sample.group)


def shard(model: nn.Module, mesh: DeviceMesh) -> None:
    """FSDP2 over `model`: each block of its outermost block stacks a unit, the rest the root's;
    gradient shards reduced by sum (the loss already divides by the whole step's count)."""
    for block in _blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # A plain sum: gloo has no pre-multiplied sum, which a factor asks for otherwise.
            module.set_force_sum_reduction_for_comms(True)


def _blocks(module: nn.Module):
    for child in module.children():
        if isinstance(child, nn.ModuleList):
            yield from child
        else:
            yield from _blocks(child)


class _Rank:
    """One rank: its process group, its learner over the shards, and the commands it serves."""

    def __init__(self, spec: _RankSpec):
        self.spec = spec
        torch.set_num_threads(spec.threads)
        if spec.device == "cuda":
            self.device = torch.device("cuda", spec.rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
            if sys.platform == "linux":  # gloo's own connections stay on loopback too
                os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        timeout = timedelta(seconds=spec.timeout_s)
        store = dist.TCPStore("127.0.0.1", spec.port, None, False, timeout=timeout)
        dist.init_process_group(
            "nccl" if spec.device == "cuda" else "gloo",
            store=store,
            rank=spec.rank,
            world_size=spec.world_size,
            timeout=timeout,
            device_id=self.device if spec.device == "cuda" else None,
        )
        self.mesh = init_device_mesh(spec.device, (spec.world_size,))
        # FSDP2 warns that a model returning a view (a Hugging Face model's logits) would lose
        # its backward hook to an in-place change of that view; the losses change none.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
        self.learner = spec.build(spec.settings)
        shard(self.learner.model, self.mesh)
        self.learner.build_optimizer()  # over the shards

    def train_step(self, share: _Share) -> _RankStep:
        learner = self.learner
        started = time.perf_counter()
        reset_peak_memory(self.device)
        with_samples = learner.batches_with_samples(share.samples)
        passes = int(self._reduce(len(with_samples), dist.ReduceOp.MAX))
        batched = time.perf_counter()
        total, measured = learner.accumulate(
            with_samples, share.denominator, passes - len(with_samples)
        )
        total = self._reduce(total, dist.ReduceOp.SUM)
        forwarded = time.perf_counter()
        try:
            grad_norm = learner.update(
                total, passes > 0 and share.loss_tokens > 0, share.step_samples
            )
        except FloatingPointError as error:  # the whole step's loss and norm: every rank's
            raise _Agreed(str(error)) from None
        learner._version += 1
        stepped = time.perf_counter()
        batches = [batch for batch, _ in with_samples]
        return _RankStep(
            loss=total,
            grad_norm=grad_norm,
            forwarded_tokens=sum(b.num_tokens for b in batches),
            row_tokens=sum(b.num_row_tokens for b in batches),
            measured=[replace(m, samples=share.indices[m.samples]) for m in measured],
            seconds=dict(
                zip(
                    LEARNER_PHASES,
                    (batched - started, forwarded - batched, stepped - forwarded),
                    strict=True,
                )
            ),
            peak_memory=peak_memory(self.device),
        )

    def weights(self, _: None) -> Any:
        return self._gathered(self.learner.trained_weights())

    def state_dict(self, _: None) -> Any:
        return self._gathered(self.learner.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        learner = self.learner
        reference = learner.state_dict()
        local = {key: _sharded_like(value, reference.get(key)) for key, value in state.items()}
        if "optimizer" in state:
            local["optimizer"] = self._sharded_optimizer(state["optimizer"])
        learner.load_state_dict(local)

    def _sharded_optimizer(self, state: dict[str, Any]) -> dict[str, Any]:
        """An optimizer state with each parameter's moments sharded as the parameter is."""
        parameters = list(self.learner.trainable.values())
        per_parameter = {}
        for index, values in state["state"].items():
            parameter = parameters[int(index)] if int(index) < len(parameters) else None
            per_parameter[index] = {
                name: _sharded_like(value, parameter)
                if isinstance(value, torch.Tensor) and value.dim() > 0
                else value
                for name, value in values.items()
            }
        return {**state, "state": per_parameter}

    @torch.no_grad()
    def _gathered(self, value: Any) -> _Shipped | None:
        """`value` whole on rank 0, its tensors in buffers of shared memory (None on the other
        ranks; every rank takes part in each gather)."""
        tensors: list[torch.Tensor] = []

        def placed(item: Any) -> Any:
            if isinstance(item, torch.Tensor):
                tensors.append(item)
                return _Place(len(tensors) - 1)
            if isinstance(item, dict):
                return {key: placed(v) for key, v in item.items()}
            if isinstance(item, list | tuple):
                return type(item)(placed(v) for v in item)
            return item

        skeleton = placed(value)
        places: list[tuple[torch.dtype, tuple[int, ...], int]] = []
        ends = Counter[torch.dtype]()
        for tensor in tensors:  # a DTensor's shape and dtype are the whole tensor's
            places.append((tensor.dtype, tuple(tensor.shape), ends[tensor.dtype]))
            ends[tensor.dtype] += tensor.numel()
        keep = self.spec.rank == 0
        buffers = {dtype: torch.empty(end, dtype=dtype) for dtype, end in ends.items()}
        for tensor, (dtype, _, offset) in zip(tensors, places, strict=True):
            whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            if keep:
                buffers[dtype][offset : offset + whole.numel()].copy_(whole.detach().reshape(-1))
        if not keep:
            return None
        for buffer in buffers.values():
            buffer.share_memory_()
        return _Shipped(skeleton, places, buffers)

    def _reduce(self, value: float, op: dist.ReduceOp) -> float:
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return float(tensor.item())


@dataclass(frozen=True, slots=True)
class _Place:
    index: int


@dataclass(frozen=True, slots=True)
class _Shipped:
    """A value whose tensors lie end to end in one buffer of shared memory per dtype: what
    crosses the pipe is a file descriptor a buffer, and the bytes are written once (a full
    model's weights every step, for the sampler)."""

    skeleton: Any
    """The value with a `_Place` for each tensor."""
    places: list[tuple[torch.dtype, tuple[int, ...], int]]
    """Each tensor's dtype, shape and offset in its dtype's buffer."""
    buffers: dict[torch.dtype, torch.Tensor]

    def value(self) -> Any:
        """The value, its tensors views of the buffers."""
        tensors = [
            self.buffers[dtype][offset : offset + math.prod(shape)].view(shape)
            for dtype, shape, offset in self.places
        ]

        def filled(item: Any) -> Any:
            if isinstance(item, _Place):
                return tensors[item.index]
            if isinstance(item, dict):
                return {key: filled(v) for key, v in item.items()}
            if isinstance(item, list | tuple):
                return type(item)(filled(v) for v in item)
            return item

        return filled(self.skeleton)


def _sharded_like(value: Any, reference: Any) -> Any:
    """`value` (whole) sharded as `reference` is, where that is a DTensor, recursively."""
    if isinstance(reference, DTensor) and isinstance(value, torch.Tensor):
        local = value.to(device=reference.device, dtype=reference.dtype)
        # Every rank holds the whole value: each keeps its shard, no communication.
        return distribute_tensor(
            local, reference.device_mesh, reference.placements, src_data_rank=None
        )
    if isinstance(value, dict) and isinstance(reference, dict):
        return {key: _sharded_like(v, reference.get(key)) for key, v in value.items()}
    return value


def _serve(spec: _RankSpec, pipe: Connection) -> None:
    """A rank's process: start, then answer the driver's commands until it closes the pipe."""
    # Ctrl-C in a terminal reaches the whole process group: the driver decides, the ranks
    # follow it (an interrupted driver closes their pipes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rank = _Rank(spec)
    except BaseException as error:
        _reply(pipe, ("error", type(error).__name__, str(error), traceback.format_exc()))
        return
    _reply(pipe, ("ok", None))
    while True:
        try:
            command, payload = pickle.loads(pipe.recv_bytes())
        except (EOFError, OSError):  # the driver is gone
            os._exit(0)
        if command == "close":
            dist.destroy_process_group()
            return
        try:
            reply = ("ok", getattr(rank, command)(payload))
        except _Agreed as error:
            reply = ("agreed", "FloatingPointError", str(error), "")
        except BaseException as error:
            reply = ("error", type(error).__name__, str(error), traceback.format_exc())
        _reply(pipe, reply)


def _reply(pipe: Connection, reply: tuple) -> None:
    try:
        # torch's pickler for processes: a shipped buffer travels as a file descriptor.
        pipe.send_bytes(ForkingPickler.dumps(reply, pickle.HIGHEST_PROTOCOL))
    except OSError:  # the driver is gone
        os._exit(0)


def ranked_or_local(build: Build, settings: LearnerSettings, **ranked: Any) -> Any:
    """The learner `settings.world_size` asks for: `build`'s in this process at 1, else a
    `RankedLearner` of that many ranks (`ranked`: its other arguments)."""
    if settings.world_size == 1:
        return build(settings)
    return RankedLearner(build, settings, **ranked)
