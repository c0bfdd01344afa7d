"""The driver: the process that holds the learner (the loop, its sampler) keeps no model, only
a pipe to each rank, and sends every rank each command.

The ranks start from a forkserver with torch already imported and meet on a TCP store the
driver opens on a free loopback port. A step's rows are dealt among the ranks
(`callgrove.batch.packing.deal`); the driver reports the metrics over every rank's forwards, the
mismatch and clip fraction, as one process would.

Faults: a rank that dies (any signal, any exit) is noticed at once through its process
sentinel; the learner then stops its other ranks (they may wait in a collective on the dead
one) and raises `RankFailed` naming the rank. A failure inside one rank (an error its peers did
not share) stops the learner too, raising the same kind of error; a step that all ranks refused
alike raises `FloatingPointError`, and the learner goes on.
"""

from __future__ import annotations

import builtins
import contextlib
import multiprocessing
import pickle
import signal
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.distributed as dist

import callgrove.errors
from callgrove.batch import Sample
from callgrove.batch.packing import deal
from callgrove.errors import InvalidValue, RunFailed
from callgrove.train.learner import (
    LEARNER_PHASES,
    StepReport,
    clip_fraction,
    mismatch_metrics,
    step_denominator,
)
from callgrove.train.ranks.rank import Build, RankSpec, serve
from callgrove.train.ranks.shipping import RankStep, Share
from callgrove.train.settings import LearnerSettings, check_world_size

TIMEOUT_S = 600.0
"""How long a collective waits for the other ranks, and the driver for the ranks to start."""
DEVICES = ("cpu", "cuda")
# Imported once by the forkserver the ranks are forked from, so a rank starts in a fraction of a
# second (torch's optimizers import its compiler on first use); `__main__` so that a script's own
# build function is found there.
PRELOAD = [
    "__main__",
    "torch",
    "torch._dynamo",
    "torch.distributed.fsdp",
    "callgrove.train.ranks.rank",
    "callgrove.train.ranks.shipping",
    "callgrove.train.ranks.fsdp",
]
CLOSE_WAIT_S = 10.0
PEER_EXIT_WAIT_S = 1.0
"""How long an error of one rank waits for a peer's death that may have caused it."""


class RankFailed(RunFailed, ChildProcessError):
    """A rank of the learner died, or failed alone; its other ranks were stopped, so the learner
    can do no more. (An `OSError`: `callgrove train` reports it in one line and exits 1, and the
    same command resumes from the run's last checkpoint.)"""


class RankedLearner:
    """A `Learner` of `settings.world_size` ranks, each holding a shard of the model that
    `build` makes (see `callgrove.train.ranks`)."""

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
            raise InvalidValue(f"device must be one of {DEVICES}, not {device!r}")
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
            spec = RankSpec(
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
                target=serve, args=(spec, theirs), name=f"learner-rank-{rank}", daemon=True
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
        """One optimizer step over `samples`, dealt among the ranks (`deal`)."""
        started = time.perf_counter()
        loss_tokens = sum(s.num_loss_tokens for s in samples)
        denominator = step_denominator(self.settings, samples)
        shares = [
            Share([samples[i] for i in dealt], dealt, denominator, loss_tokens, len(samples))
            for dealt in deal(
                samples,
                self.world_size,
                batching=self.settings.batching,
                tree_scope=self.settings.tree_scope,
            )
        ]
        steps: list[RankStep] = self._call("train_step", shares)
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
                    self._blame_a_dead_peer(rank, command)
                    self._raise(rank, command, *replies[rank][1:])
            for sentinel in [r for r in ready if r in ended]:
                if ended[sentinel] not in replies:
                    self._died(ended[sentinel], command)
        agreed = [reply for _, reply in sorted(replies.items()) if reply[0] == "agreed"]
        if agreed:
            raise FloatingPointError(agreed[0][2])
        return [replies[rank][1] for rank in range(self.world_size)]

    def _blame_a_dead_peer(self, rank: int, command: str) -> None:
        """A rank whose peer died fails in a collective with it ("connection reset by peer"),
        and that error can arrive before the death is seen: the death is the cause to name.
        The peer's sockets close as it exits, a moment before it can be reaped."""
        others = {self._processes[r].sentinel: r for r in range(self.world_size) if r != rank}
        for sentinel in wait(list(others), PEER_EXIT_WAIT_S):
            peer = self._processes[others[sentinel]]
            peer.join(CLOSE_WAIT_S)
            if peer.exitcode != 0:  # one that ended on its own has sent its reason
                self._died(others[sentinel], command)

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
        """A rank's own error, as the same kind of error (a builtin one or one of
        `callgrove.errors`, such as `InvalidValue`; else RuntimeError)."""
        self._stop_all(f"learner rank {rank} failed in {command}: {kind}: {message}")
        known = getattr(builtins, kind, None) or getattr(callgrove.errors, kind, None)
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


def ranked_or_local(build: Build, settings: LearnerSettings, **ranked: Any) -> Any:
    """The learner `settings.world_size` asks for: `build`'s in this process at 1, else a
    `RankedLearner` of that many ranks (`ranked`: its other arguments)."""
    if settings.world_size == 1:
        return build(settings)
    return RankedLearner(build, settings, **ranked)
