"""Callgrove samples as NeMo RL's GRPO training batch, written from NeMo RL's source at commit
7ea279abfbeb698b092856d0dab61e7cf39bc909 (`nemo_rl/algorithms/loss/loss_functions.py`,
`ClippedPGLossDataDict`, and `nemo_rl/algorithms/grpo.py`, where the train data is built;
`nemo-rl` on PyPI is an empty placeholder and the package does not install on CPU Python 3.11).

The batch is a dict of tensors, one right-padded row per sample, every per-token tensor aligned
with `input_ids` (the loss reads each as `[:, 1:]`, next to the log-probability of the token
at that position): `input_ids` (int64), `input_lengths` (int32), `token_mask` (int64, the loss
mask: 0 on prompts, tool results and context-only calls), `advantages` and
`generation_logprobs` (float32, the sampling logprobs), and `sample_mask` (float32, one per
row). NeMo RL's workers add `prev_logprobs` and `reference_policy_logprobs` themselves. Wrap
it as `BatchedDataDict(batch)`.

NeMo RL scores every token at its generation config's one temperature with no top-p or top-k
cut: samples sampled otherwise are refused (`trainer_rows`), and the temperature they share is
returned for that config.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from callgrove.batch.samples import Sample
from callgrove.interop.trainer_rows import shared_temperature, trained_span

TRAINER = "NeMo RL"
COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"


def nemo_rl_arrays(
    samples: Sequence[Sample], pad_token_id: int = 0
) -> tuple[dict[str, np.ndarray], float]:
    """The batch as numpy arrays, and the temperature every trained token was sampled at."""
    for sample in samples:
        trained_span(sample, TRAINER)
    temperature = shared_temperature(samples, TRAINER)
    rows, width = len(samples), max(sample.num_tokens for sample in samples)
    batch = {
        "input_ids": np.full((rows, width), pad_token_id, dtype=np.int64),
        "input_lengths": np.array([s.num_tokens for s in samples], dtype=np.int32),
        "token_mask": np.zeros((rows, width), dtype=np.int64),
        "advantages": np.zeros((rows, width), dtype=np.float32),
        "generation_logprobs": np.zeros((rows, width), dtype=np.float32),
        "sample_mask": np.ones(rows, dtype=np.float32),
    }
    for index, sample in enumerate(samples):
        length = sample.num_tokens
        batch["input_ids"][index, :length] = sample.token_ids
        batch["token_mask"][index, :length] = sample.loss_mask
        batch["advantages"][index, :length] = sample.advantages
        batch["generation_logprobs"][index, :length] = sample.logprobs
    return batch, temperature


def write_nemo_rl(path: str | Path, samples: Sequence[Sample], pad_token_id: int = 0) -> float:
    """The batch as torch tensors saved with `torch.save` at `path` (load it with
    `BatchedDataDict(torch.load(path))`); returns the temperature to generate and score at."""
    import torch

    batch, temperature = nemo_rl_arrays(samples, pad_token_id)
    torch.save({name: torch.from_numpy(array) for name, array in batch.items()}, path)
    return temperature
