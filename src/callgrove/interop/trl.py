"""Callgrove samples as TRL's GRPO batch, and a `GRPOTrainer` that trains on them (the `trl`
extra, TRL 1.16.0).

TRL's batch splits each row into a prompt (left-padded) and a completion (right-padded).
`completion_mask` is the completion's *attention* mask: TRL forwards
`cat(prompt_mask, completion_mask)` as the attention mask, so it is 1 on every real completion
token, holes included. The loss holes (tool results, context-only calls inside the trained
span) go in `tool_mask`, which TRL multiplies into the loss mask. Per-token advantages are
(B, T), read as they are; `old_per_token_logps` carries the sampling logprobs, so the
importance ratio is taken against the policy that sampled each token, as in callgrove's own
loss (`callgrove.train.loss`).

A row's prompt is its tokens before the first trained one; its completion runs from there to
its last trained token (later tokens change no trained token's probability).

TRL's per-token term is the clipped ratio (`epsilon` / `epsilon_high` are `clip_low` /
`clip_high`; `delta` is the dual clip) under the loss types `ACCEPTED_LOSS_TYPES` names; they
differ in how the terms are normalised (docs/trainers-trl.md). TRL scores every token at its one
`temperature` and with no top-p or top-k cut, so samples sampled otherwise are refused
(`trainer_rows`).

Training on samples instead of TRL's own generation: TRL 1.16 has no public hook that takes
externally computed advantages (its documented `rollout_func` returns token ids and logprobs,
and TRL then computes per-sequence advantages from rewards). `SamplesGRPOTrainer` therefore
overrides two private methods of `GRPOTrainer`: `_generate_and_score_completions` (the batch
comes from the samples) and `_get_train_sampler` (each sample once per pass, no prompt
repeated `num_generations` times: the samples already hold whole groups). Everything else is
TRL's: buffering over `steps_per_generation`, `num_iterations`, gradient accumulation, data
parallelism, the loss, the optimizer, logging and checkpoints. Without a trainer loop,
`GRPOTrainer.compute_loss(model, trl_batch(...))` (public) gives the loss of one batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Sampler

from callgrove.batch.samples import SAMPLE_SCHEMA, Sample, samples_from_table, samples_to_table
from callgrove.errors import InvalidValue
from callgrove.interop.settings_check import SettingsRefused, refuse_settings
from callgrove.interop.trainer_rows import (
    check_vocabulary,
    prompt_completion,
    refuse_routes,
    shared_temperature,
)

try:
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from trl import GRPOTrainer
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(
        "callgrove.interop.trl needs TRL, the `trl` extra: pip install 'callgrove[trl]'",
        name=missing.name,
    ) from None

if TYPE_CHECKING:
    from trl import GRPOConfig

TRAINER = "TRL"
ACCEPTED_LOSS_TYPES = ("dapo", "bnpo", "grpo", "dr_grpo", "luspo")
"""The loss types whose per-token term is the clipped ratio against `old_per_token_logps`
(TRL 1.16's `_compute_loss`); `cispo`, `sapo` and `vespo` weight the terms otherwise."""
REMAINDER_LOSS_TYPE = "dapo"
"""The one loss type under which a pass's last, partial generation batch trains exactly: it
divides by the generation batch's trained tokens, to which rows without loss add nothing. The
others divide by row counts (`grpo`, `dr_grpo`, `luspo`) or by each micro-batch's own tokens
(`bnpo`), which rows without loss would change."""
FILLER_COLUMN = "fills_the_generation_batch"
"""The training dataset's flag for rows that only fill a pass's last generation batch."""


def trl_batch(
    samples: Sequence[Sample],
    pad_token_id: int,
    temperature: float = 1.0,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """The batch `GRPOTrainer.compute_loss` takes, one row per sample: `prompt_ids` /
    `prompt_mask` (left-padded), `completion_ids` / `completion_mask` (right-padded; the
    attention mask), `tool_mask` (1 on trained tokens, 0 on holes), `advantages` and
    `old_per_token_logps` (B, T), and `num_items_in_batch` (these samples' trained tokens; on
    several processes TRL's `dapo` needs the count over all of them, which `SamplesGRPOTrainer`
    gathers).

    `temperature` is the trainer's (`GRPOConfig.temperature`); every trained token must have
    been sampled at it, with no top-p or top-k cut."""
    refuse_routes(samples, TRAINER)
    split = prompt_completion(samples, pad_token_id, TRAINER)
    check_temperature(samples, temperature)
    batch = {
        "prompt_ids": split.prompt_ids,
        "prompt_mask": split.prompt_mask,
        "completion_ids": split.completion_ids,
        "completion_mask": split.completion_mask,
        # TRL pads tool_mask with 1: only the holes inside a completion are 0.
        "tool_mask": np.where(split.completion_mask == 1, split.loss_mask, 1),
        "advantages": split.advantages,
        "old_per_token_logps": split.logprobs,
    }
    tensors = {name: torch.from_numpy(array).to(device) for name, array in batch.items()}
    trained = sum(sample.num_loss_tokens for sample in samples)
    tensors["num_items_in_batch"] = torch.tensor(trained, device=device)
    return tensors


def check_temperature(samples: Sequence[Sample], temperature: float) -> None:
    """Refuse samples TRL would score at another temperature than they were sampled at (or
    whose sampling is unknown: `trainer_rows`)."""
    mismatch = temperature_problem(samples, temperature)
    if mismatch is not None:
        raise SettingsRefused(f"{TRAINER}: {mismatch}")


def temperature_problem(samples: Sequence[Sample], temperature: float) -> str | None:
    """Why TRL at `temperature` would not score `samples` as sampled, or None."""
    sampled_at = shared_temperature(samples, TRAINER)
    if np.float32(sampled_at) == np.float32(temperature):
        return None
    return (
        f"the samples were sampled at temperature {sampled_at:g}, the trainer scores at "
        f"{temperature:g}: set GRPOConfig(temperature={sampled_at:g})"
    )


def check_settings(args: GRPOConfig) -> None:
    """Refuse, all named at once, the `GRPOConfig` settings under which TRL 1.16's loss is not
    the clipped ratio against the samples' sampling logprobs, or under which
    `SamplesGRPOTrainer` cannot run. Settings that only steer TRL's own generation or rewards
    (`top_p`, `top_k`, `min_p`, `repetition_penalty`, `mask_truncated_completions`,
    `scale_rewards`, ...) never reach the loss: `_compute_loss` scores at `temperature` alone.
    (A `GRPOConfig` is a dataclass: it takes no unknown key.)"""
    refuse_settings("SamplesGRPOTrainer", settings_problems(args))


def settings_problems(args: GRPOConfig) -> list[str]:
    """`check_settings`'s refusals, each naming its `GRPOConfig` setting."""
    epsilon_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
    refused = {
        "loss_type": (
            args.loss_type not in ACCEPTED_LOSS_TYPES,
            f"{args.loss_type!r} does not weight each token by the clipped ratio; "
            f"take one of {', '.join(ACCEPTED_LOSS_TYPES)}",
        ),
        "beta": (
            args.beta != 0.0,
            "adds a KL term to a reference model whose logprobs SamplesGRPOTrainer does not "
            "compute; set beta=0.0",
        ),
        "use_vllm": (
            args.use_vllm,
            "starts a generation engine SamplesGRPOTrainer never uses, and its importance "
            "correction multiplies a ratio the batch does not carry (the samples' logprobs are "
            "already the sampler's); set use_vllm=False",
        ),
        "importance_sampling_level": (
            args.importance_sampling_level != "token",
            "'sequence' replaces each token's ratio by its sequence's geometric mean; "
            "set importance_sampling_level='token'",
        ),
        "top_entropy_quantile": (
            args.top_entropy_quantile < 1.0,
            "drops the lower-entropy tokens from the loss; set top_entropy_quantile=1.0",
        ),
        "off_policy_mask_threshold": (
            args.off_policy_mask_threshold is not None,
            "drops negative-advantage rows far from the sampler; set it to None",
        ),
        "entropy_coef": (
            args.entropy_coef != 0.0 or args.use_adaptive_entropy,
            "adds an entropy bonus; set entropy_coef=0.0 and use_adaptive_entropy=False",
        ),
        "delta": (
            args.delta is not None and args.delta <= 1 + epsilon_high,
            f"at or below 1 + epsilon_high ({1 + epsilon_high:g}) clips positive advantages' "
            "ratios too; above it, it is the dual clip of negative advantages' terms",
        ),
        "remove_unused_columns": (
            args.remove_unused_columns,
            "would remove the samples' columns; set remove_unused_columns=False",
        ),
    }
    return [f"GRPOConfig {setting}: {reason}" for setting, (bad, reason) in refused.items() if bad]


def filler_rows(samples: int, args: GRPOConfig) -> int:
    """How many rows without loss fill a pass's last generation batch (0 when the samples fill
    whole ones); a `SettingsRefused` where the loss type cannot train that batch exactly."""
    generation_batch = args.generation_batch_size
    remainder = samples % generation_batch
    if not remainder:
        return 0
    if args.loss_type == REMAINDER_LOSS_TYPE:
        return generation_batch - remainder
    per_step = args.world_size * args.steps_per_generation
    current = args.per_device_train_batch_size
    fitting = sorted(
        (
            size
            for size in range(1, samples // per_step + 1)
            if samples % (size * per_step) == 0 and size * per_step % args.num_generations == 0
        ),
        key=lambda size: (abs(size - current), size > current),
    )
    advice = (
        f"per_device_train_batch_size={fitting[0]} does"
        if fitting
        else f"no per_device_train_batch_size does with num_processes x steps_per_generation "
        f"= {per_step} and num_generations = {args.num_generations}"
    )
    raise SettingsRefused(
        f"SamplesGRPOTrainer: {samples} samples in generation batches of {generation_batch} "
        f"(per_device_train_batch_size {current} x num_processes {args.world_size} x "
        f"steps_per_generation {args.steps_per_generation}): {remainder} samples would not "
        f"train, and loss_type={args.loss_type!r} cannot train a partial generation batch "
        f"exactly. Pick a generation batch that divides {samples} ({advice}), or "
        f"loss_type={REMAINDER_LOSS_TYPE!r}, which trains the remainder"
    )


class OncePerPass(Sampler[int]):
    """Each pass over the dataset: the samples (shuffled, or in order), then the filler rows, in
    generation batches of `generation_batch`, each batch's indices given `repeat_count` times in
    a row (TRL reads a generation batch once per `steps_per_generation x num_iterations` steps).
    Every process draws the same order (same seed); accelerate deals each process its part."""

    def __init__(
        self,
        samples: int,
        fillers: int,
        generation_batch: int,
        repeat_count: int,
        shuffle: bool,
        seed: int,
    ):
        self.samples = samples
        self.fillers = fillers
        self.generation_batch = generation_batch
        self.repeat_count = repeat_count
        self.shuffle = shuffle
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            order = torch.randperm(self.samples, generator=self.generator).tolist()
        else:
            order = list(range(self.samples))
        order += range(self.samples, self.samples + self.fillers)
        for start in range(0, len(order), self.generation_batch):
            for _ in range(self.repeat_count):
                yield from order[start : start + self.generation_batch]

    def __len__(self) -> int:
        return (self.samples + self.fillers) * self.repeat_count


def _advantages_come_from_callgrove(completions: list, **_: Any) -> list[float]:
    """TRL requires a reward source; `SamplesGRPOTrainer` never calls it (the samples carry
    credited advantages)."""
    raise RuntimeError("SamplesGRPOTrainer takes its advantages from the samples")


_NOT_TAKEN = {
    "reward_funcs": "the samples carry their advantages",
    "eval_dataset": "TRL's evaluation generates from prompts",
}


class SamplesGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose training data is callgrove samples (`train_dataset`: a sequence of
    `Sample`, e.g. `read_samples(path)` or a loop step's `build_samples`, held as a
    `datasets.Dataset`), each trained once per pass with its own advantages, on one process or
    several. The module docstring names the two private methods it overrides and why. It does
    not evaluate: TRL's evaluation generates from prompts.

    Refused at construction: samples sampled at another temperature than `args.temperature`
    and the settings `check_settings` names (all in one error), token ids outside the model's
    vocabulary, a Mixture-of-Experts router loss, and a remainder of samples the loss type
    cannot train exactly (`filler_rows`)."""

    def __init__(
        self, model: Any, train_dataset: Sequence[Sample], args: GRPOConfig, **kwargs: Any
    ):
        for taken, reason in _NOT_TAKEN.items():
            if kwargs.get(taken) is not None:
                raise TypeError(f"SamplesGRPOTrainer takes no {taken}: {reason}")
        samples = list(train_dataset)
        if not samples:
            raise InvalidValue("SamplesGRPOTrainer: no samples to train on")
        problems = settings_problems(args)
        mismatch = temperature_problem(samples, args.temperature)
        if mismatch is not None:
            problems.append(f"GRPOConfig temperature: {mismatch}")
        refuse_settings("SamplesGRPOTrainer", problems)
        fillers = filler_rows(len(samples), args)
        super().__init__(
            model,
            reward_funcs=[_advantages_come_from_callgrove],
            train_dataset=_training_dataset(samples, fillers),
            args=args,
            **kwargs,
        )
        self._real_samples, self._filler_rows = len(samples), fillers
        if self.aux_loss_enabled:
            raise SettingsRefused(
                "SamplesGRPOTrainer: the model's router load-balancing loss would be added to the "
                "policy loss; set GRPOConfig(router_aux_loss_coef=0.0)"
            )
        unwrapped = self.accelerator.unwrap_model(self.model)
        check_vocabulary(samples, _vocabulary_size(unwrapped), TRAINER)

    def _get_train_sampler(self, dataset: Any = None) -> OncePerPass:
        return OncePerPass(
            samples=self._real_samples,
            fillers=self._filler_rows,
            generation_batch=self.args.generation_batch_size,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        samples = samples_from_table(pa.Table.from_pylist(inputs, schema=SAMPLE_SCHEMA))
        device = self.accelerator.device
        batch = trl_batch(samples, self._tokenizer.pad_token_id, self.temperature, device)
        fills = [bool(row[FILLER_COLUMN]) for row in inputs]
        batch["tool_mask"][torch.tensor(fills, device=device)] = 0
        trained = sum(s.num_loss_tokens for s, f in zip(samples, fills, strict=True) if not f)
        # `dapo` divides each process's loss by num_items_in_batch / num_processes, and data
        # parallelism averages the processes' gradients: the count must be the whole generation
        # batch's, over every process, as TRL's own generation path gathers it.
        local = torch.tensor(trained, device=device)
        batch["num_items_in_batch"] = self.accelerator.gather(local).sum()
        return batch


def _training_dataset(samples: list[Sample], fillers: int) -> Dataset:
    """The samples, then `fillers` copies of the shortest one flagged as fillers (their loss is
    masked out, so they only fill a pass's last generation batch)."""
    shortest = min(samples, key=lambda sample: sample.num_tokens)
    table = samples_to_table([*samples, *[shortest] * fillers])
    flags = pa.array([False] * len(samples) + [True] * fillers, type=pa.bool_())
    return Dataset(InMemoryTable(table.append_column(FILLER_COLUMN, flags)))


def _vocabulary_size(model: torch.nn.Module) -> int:
    """The ids the model can both embed and score."""
    sizes = [model.get_input_embeddings().weight.shape[0]]
    output = model.get_output_embeddings()
    if output is not None:
        sizes.append(output.weight.shape[0])
    return min(sizes)
