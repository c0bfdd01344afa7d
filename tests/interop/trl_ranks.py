"""`SamplesGRPOTrainer.train()` on the same samples and global batch, on however many processes
this script runs on: `python -m torch.distributed.run --nproc_per_node 2 trl_ranks.py OUT RUN...`
trains each named run and rank 0 saves each run's parameter update (after - before) to OUT.
The tests run the same `train_pass` on one process, in their own, and compare the updates.

An SGD step with no momentum, weight decay or gradient clipping moves the weights by
-learning_rate x the gradient, so equal updates are equal gradients.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from callgrove.batch import Sample
from callgrove.interop.trl import SamplesGRPOTrainer
from interop.trainer_samples import TEMPERATURE, plain_copy, reference_model, trainer_samples
from train.helpers import VOCAB

LEARNING_RATE = 0.5  # large enough that the update is far above float64 rounding of the weights
SEED = 3


@dataclass(frozen=True)
class Run:
    """One training pass: `samples` of the login group under `loss_type`, in generation batches
    of `generation_batch` samples (one optimizer step each), split evenly over the processes."""

    loss_type: str
    samples: int
    generation_batch: int
    shuffle: bool = False

    @property
    def name(self) -> str:
        return "-".join(str(value) for value in asdict(self).values())


def word_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocabulary = {f"t{i}": i for i in range(VOCAB)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocabulary, unk_token="t0")),
        pad_token="t0",
        eos_token="t1",
    )


def grpo_config(output_dir: Path | str, loss_type: str, **more):
    from trl import GRPOConfig

    settings = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "loss_type": loss_type,
        "beta": 0.0,
        "temperature": TEMPERATURE,
        "epsilon": 0.2,
        "epsilon_high": 0.25,
        "report_to": "none",
        "use_cpu": True,
        "save_strategy": "no",
        "logging_steps": 1,
        "bf16": False,
        "disable_tqdm": True,
    }
    return GRPOConfig(**(settings | more))


def login_samples(count: int) -> list[Sample]:
    samples = _login_samples()
    assert len(samples) >= count, f"the login group has {len(samples)} samples, not {count}"
    return list(samples[:count])


@functools.cache
def _login_samples() -> tuple[Sample, ...]:
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference, seed=SEED, temperature=TEMPERATURE, source="login")
    return tuple(samples)


def sgd_config(output_dir: Path | str, run: Run, processes: int):
    """One pass of plain SGD over `run`'s samples, each process `1 / processes` of every
    generation batch."""
    if run.generation_batch % processes:
        raise ValueError(f"{run.name}: {processes} processes do not split a batch evenly")
    return grpo_config(
        output_dir,
        run.loss_type,
        per_device_train_batch_size=run.generation_batch // processes,
        optim="sgd",
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,  # no clipping: the update stays linear in the gradient
        num_train_epochs=1,
        shuffle_dataset=run.shuffle,
        seed=SEED,
    )


def train_pass(run: Run, processes: int, output_dir: Path | str) -> dict[str, torch.Tensor]:
    """Each parameter's update over one pass of `run` on this process group (float64)."""
    reference = reference_model(torch.float64)
    model = plain_copy(reference)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = SamplesGRPOTrainer(
        model,
        train_dataset=login_samples(run.samples),
        args=sgd_config(output_dir, run, processes),
        processing_class=word_tokenizer(),
    )
    trainer.train()
    return {name: p.detach() - before[name] for name, p in model.named_parameters()}


def main(output: str, run_names: list[str]) -> None:
    import torch.distributed as dist

    runs = [
        Run(kind, int(n), int(batch), shuffle == "True")
        for kind, n, batch, shuffle in (name.split("-") for name in run_names)
    ]
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    updates = {}
    for run in runs:
        updates[run.name] = train_pass(run, processes, Path(output).parent / run.name)
    if not dist.is_initialized():
        torch.save({"processes": processes, "updates": updates}, output)
        return
    if dist.get_rank() == 0:
        torch.save({"processes": processes, "updates": updates}, output)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
