"""One rank of the learner: its process, started by the driver, serving the driver's commands.

A rank joins the process group on the TCP store the driver opened: on `cuda` rank r uses GPU r
and NCCL, on `cpu` gloo. It builds its learner with the build function (the same model in every
rank), shards it (`fsdp.shard`) and builds the optimizer over the shards.

A step, exactly as one process would take it:
- the rank packs its share of the rows as the one-process learner packs a step, and divides
  every micro-batch's loss by the denominator of the whole step;
- every rank runs as many forward and backward passes as the busiest (idle passes add a zero
  gradient): each pass gathers the shards from all ranks;
- gradient clipping uses the whole gradient's norm, and the loss is summed across ranks before
  the finite check, so all ranks step or all refuse: a step whose loss or gradient is not
  finite is refused by all ranks alike (`FloatingPointError`), and the learner goes on;
- each rank returns what its forwards measured per token, for the driver's metrics.

Every collective has a timeout (`timeout_s`), so a rank that stops answering fails its peers'
collectives, and so the step, in bounded time. Any other error in a rank goes back to the
driver, which stops the learner.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from callgrove.train.learner import (
    LEARNER_PHASES,
    ModelLearner,
    peak_memory,
    reset_peak_memory,
)
from callgrove.train.ranks.fsdp import shard
from callgrove.train.ranks.shipping import RankStep, Share, Shipped, sharded_like, shipped
from callgrove.train.settings import LearnerSettings

Build = Callable[[LearnerSettings], ModelLearner]
"""Builds one rank's learner from the learner settings: the same model in every rank."""


@dataclass(frozen=True, slots=True)
class RankSpec:
    rank: int
    world_size: int
    port: int
    build: Build
    settings: LearnerSettings
    device: str
    timeout_s: float
    threads: int


class _Agreed(Exception):
    """An error every rank raised alike after agreeing on it: the ranks stay in step. (Not a
    `CallgroveError`: it never leaves a rank's process, whose driver raises the error named.)"""


class _Rank:
    """One rank: its process group, its learner over the shards, and the commands it serves."""

    def __init__(self, spec: RankSpec):
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

    def train_step(self, share: Share) -> RankStep:
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
        return RankStep(
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

    def weights(self, _: None) -> Shipped | None:
        return shipped(self.learner.trained_weights(), self.spec.rank == 0)

    def state_dict(self, _: None) -> Shipped | None:
        return shipped(self.learner.state_dict(), self.spec.rank == 0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        learner = self.learner
        reference = learner.state_dict()
        local = {key: sharded_like(value, reference.get(key)) for key, value in state.items()}
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
                name: sharded_like(value, parameter)
                if isinstance(value, torch.Tensor) and value.dim() > 0
                else value
                for name, value in values.items()
            }
        return {**state, "state": per_parameter}

    def _reduce(self, value: float, op: dist.ReduceOp) -> float:
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return float(tensor.item())


def serve(spec: RankSpec, pipe: Connection) -> None:
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
