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

With `loss_type="dapo"` (or `"bnpo"` on one micro-batch) TRL's loss is callgrove's `token`
normalisation; with `"grpo"` it is the `sequence` one; `epsilon_low` / `epsilon_high` are
`clip_low` / `clip_high`. TRL scores every token at its one `temperature` and with no top-p or
top-k cut, so samples sampled otherwise are refused (`trainer_rows`).

Training on samples instead of TRL's own generation: TRL 1.16 has no public hook that takes
externally computed advantages (its documented `rollout_func` returns token ids and logprobs,
and TRL then computes per-sequence advantages from rewards). `SamplesGRPOTrainer` therefore
overrides two private methods of `GRPOTrainer`: `_generate_and_score_completions` (the batch
comes from the samples) and `_get_train_sampler` (no prompt repeated `num_generations` times:
the samples already hold whole groups). Everything else is TRL's: buffering over
`steps_per_generation`, `num_iterations`, gradient accumulation, the loss, the optimizer,
logging and checkpoints. Without a trainer loop, `GRPOTrainer.compute_loss(model,
trl_batch(...))` (public) gives the loss of one batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from callgrove.batch.samples import SAMPLE_SCHEMA, Sample, samples_from_table, samples_to_table
from callgrove.interop.trainer_rows import prompt_completion, shared_temperature

try:
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from trl import GRPOTrainer
    from trl.trainer.grpo_trainer import RepeatSampler
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(
        "callgrove.interop.trl needs TRL, the `trl` extra: pip install 'callgrove[trl]'",
        name=missing.name,
    ) from None

if TYPE_CHECKING:
    import torch

TRAINER = "TRL"


def trl_batch(
    samples: Sequence[Sample],
    pad_token_id: int,
    temperature: float = 1.0,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """The batch `GRPOTrainer.compute_loss` takes, one row per sample: `prompt_ids` /
    `prompt_mask` (left-padded), `completion_ids` / `completion_mask` (right-padded; the
    attention mask), `tool_mask` (1 on trained tokens, 0 on holes), `advantages` and
    `old_per_token_logps` (B, T), and `num_items_in_batch` (trained tokens).

    `temperature` is the trainer's (`GRPOConfig.temperature`); every trained token must have
    been sampled at it, with no top-p or top-k cut."""
    import torch

    split = prompt_completion(samples, pad_token_id, TRAINER)
    sampled_at = shared_temperature(samples, TRAINER)
    if np.float32(sampled_at) != np.float32(temperature):
        raise ValueError(
            f"{TRAINER}: the samples were sampled at temperature {sampled_at:g}, the trainer "
            f"scores at {temperature:g}: set GRPOConfig(temperature={sampled_at:g})"
        )
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


def samples_dataset(samples: Sequence[Sample]) -> Dataset:
    """The samples as a `datasets.Dataset` (one row per sample, `SAMPLE_SCHEMA`'s columns), the
    form `GRPOTrainer` takes its training data in."""
    return Dataset(InMemoryTable(samples_to_table(samples)))


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
    `datasets.Dataset`), each trained once per pass with its own advantages. The module
    docstring names the two private methods it overrides and why. It does not evaluate: TRL's
    evaluation generates from prompts."""

    def __init__(self, model: Any, train_dataset: Sequence[Sample], **kwargs: Any):
        for taken, reason in _NOT_TAKEN.items():
            if kwargs.get(taken) is not None:
                raise TypeError(f"SamplesGRPOTrainer takes no {taken}: {reason}")
        super().__init__(
            model,
            reward_funcs=[_advantages_come_from_callgrove],
            train_dataset=samples_dataset(train_dataset),
            **kwargs,
        )

    def _get_train_sampler(self, dataset: Any = None) -> RepeatSampler:
        return RepeatSampler(
            data_source=self.train_dataset if dataset is None else dataset,
            mini_repeat_count=1,
            batch_size=self.args.generation_batch_size,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        samples = samples_from_table(pa.Table.from_pylist(inputs, schema=SAMPLE_SCHEMA))
        return trl_batch(
            samples, self._tokenizer.pad_token_id, self.temperature, self.accelerator.device
        )
