"""The trainer's settings, torch-free: a training config's `[train]` section is `LearnerSettings`.

A config loads and is checked without torch; the learner reads the same struct it was given.
`LearnerSettings` extends `LossSettings`, so the loss takes the learner's settings as they are.
"""

from __future__ import annotations

import os

import msgspec

from callgrove.batch.tree import TreeSettings
from callgrove.errors import UsageError
from callgrove.formats.ranges import check_choice, check_range

NORMALISATIONS = ("token", "sequence")
MISMATCH_MASKS = ("off", "token", "row")
BATCHINGS = ("tree", "packed")
OBJECTIVES = ("rl", "sft")


class LossSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """PPO-style clipping of the importance ratio against the sampling policy, and how the
    per-token terms are averaged: over every trained token of the batch (`token`), or within
    each row and then over the rows that train something (`sequence`).

    `entropy_coef` subtracts that multiple of the entropy of the model's distribution at each
    trained token from the token's term: a policy trained from scratch otherwise tends to
    collapse onto one answer for every task, after which a group's episodes all score alike,
    every advantage is zero and learning stops.

    Mismatch corrections (off by default). The sampler and the learner compute the same
    distribution from different code (a KV cache, another engine, lower precision), so before
    the update the ratio of their probabilities, the mismatch ratio m = exp(learner - sampler),
    is 1 only up to their differences. With a correction on, the importance ratio splits into
    the learner against its own weights before the update (clipped as above; 1 at the forward,
    carrying the gradient) times m, detached, as a weight per token:
    `mismatch_cap` caps that weight at C (truncated importance sampling); `mismatch_mask`
    zeroes it on tokens (`token`) or on whole rows (`row`, by the geometric mean of m over the
    row's trained tokens) whose m leaves `mismatch_bounds`."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    normalisation: str = "token"
    entropy_coef: float = 0.0
    """Weight of the entropy bonus on every trained token."""
    mismatch_cap: float | None = None
    """Truncated importance sampling: cap each token's sampler-to-learner weight at this
    (unset: off)."""
    mismatch_mask: str = "off"
    """`token` or `row`: drop tokens (or rows) whose sampler-to-learner ratio leaves
    `mismatch_bounds` (`off`: keep all)."""
    mismatch_bounds: tuple[float, float] = (0.5, 2.0)

    def __post_init__(self) -> None:
        check_choice("normalisation", self.normalisation, NORMALISATIONS)
        check_range("clip_low", self.clip_low, at_least=0, below=1)
        check_range("clip_high", self.clip_high, at_least=0)
        check_range("entropy_coef", self.entropy_coef, at_least=0)
        if self.mismatch_cap is not None:
            check_range("mismatch_cap", self.mismatch_cap, above=0)
        check_choice("mismatch_mask", self.mismatch_mask, MISMATCH_MASKS)
        low, high = self.mismatch_bounds
        check_range("mismatch_bounds[0]", low, at_least=0, below=1)
        check_range("mismatch_bounds[1]", high, above=1)

    @property
    def corrects_mismatch(self) -> bool:
        return self.mismatch_cap is not None or self.mismatch_mask != "off"


class LearnerSettings(LossSettings, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """`[train]`: the optimizer, how a step's rows are forwarded, the objective and its loss."""

    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    batching: str = "tree"
    tree_scope: str = TreeSettings().scope
    """Which rows share trie nodes: `tree`, `episode`, `group`, or `step` (rows of every group,
    a trie per micro-batch of `seq_len` nodes)."""
    seq_len: int = 4096
    """Tokens a micro-batch forwards: packed rows end to end, or the trie nodes of tree scope
    `step`."""
    objective: str = "rl"
    """`rl` (episodes of `[env]`, the clipped policy-gradient loss) or `sft` (the episodes of
    `[data]`, cross-entropy on their assistant tokens)."""
    world_size: int = 1
    """Processes the learner trains in: 1, this one; N > 1, N ranks of torch.distributed that
    the learner starts (gloo on the CPU), the model sharded across them by FSDP2 and each step's
    rows dealt among them; the update is the one process's (`callgrove.train.ranks`)."""
    route_replay: bool = True
    """Mixtures of experts: each token forwarded through the experts its sampler routed it to
    (rollout routing replay), where its call recorded them; false: the learner's own routing."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("batching", self.batching, BATCHINGS)
        check_choice("objective", self.objective, OBJECTIVES)
        TreeSettings(self.tree_scope)  # checks the scope
        check_range("learning_rate", self.learning_rate, above=0)
        check_range("weight_decay", self.weight_decay, at_least=0)
        check_range("max_grad_norm", self.max_grad_norm, above=0)
        check_range("seq_len", self.seq_len, at_least=1)
        check_range("world_size", self.world_size, at_least=1)
        # Not `check_world_size` here: a checkpoint's settings, from a larger machine, must
        # still load on this one (`train.world_size` may change on resume).


def usable_cpus() -> int:
    """The CPU cores this process may run on (its affinity mask, which a container or
    `taskset` narrows), else every core of the machine."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS)
        return os.cpu_count() or 1


def check_world_size(world_size: int, device: str = "cpu") -> None:
    """Refuse more learner ranks than this machine has room for, before any starts: each rank is
    a process of its own, on `cpu` one usable core each (more only queue on the same cores),
    on `cuda` one GPU each (rank r trains on GPU r). A `UsageError` saying what there is and
    what to set."""
    if world_size <= 1:
        return
    if device == "cuda":
        import torch

        have = torch.cuda.device_count()
        what = f"{have} GPU{'s are' if have != 1 else ' is'} present (rank r trains on GPU r)"
    else:
        have = usable_cpus()
        what = (
            f"this machine has {have} usable CPU core{'s' if have != 1 else ''} for its ranks "
            "(each a process of its own)"
        )
    if world_size > have:
        limit = f"at most {have}" if have > 1 else "1 (the learner in this process)"
        raise UsageError(f"train.world_size {world_size}: {what}; set train.world_size to {limit}")
