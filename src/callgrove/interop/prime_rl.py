"""Callgrove samples as prime-rl's training samples, written from prime-rl's source at commit
559b44772e471d1538537b8805cc77f3824a5e64 (`src/prime_rl/transports/rollouts/types.py`,
`TrainingSample`; prime-rl is not on PyPI and does not install on CPU Python 3.11).

A `TrainingSample` is one flat branch of a rollout: `token_ids`, `mask` (trainable tokens),
`logprobs` and `temperatures` aligned per token, `env_name`, and `advantages` over the whole
sequence; the other fields (reference logprobs, multimodal inputs, routed experts, loss weight
streams) stay absent. It is a msgspec struct encoded as an array (`array_like`) with trailing
defaults omitted, so a sample with advantages is written with the seven absent fields before
them as nil. prime-rl's orchestrator hands a list of them to its packer (`prepare_sample` in
`src/prime_rl/trainer/batch.py`), which decodes them as `msgspec.msgpack.Decoder(
list[TrainingSample])` would.

Temperatures are per token, so rows sampled at several temperatures are fine; prime-rl
scores a token under its temperature alone, so trained tokens sampled with a top-p or top-k
cut are refused. On untrained tokens whose sampling is unknown the temperature is written as
1 (prime-rl reads it only where the mask is set).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

from callgrove.batch.samples import Sample
from callgrove.interop.trainer_rows import check_uncut, trained_span

TRAINER = "prime-rl"
COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"


class TrainingSample(msgspec.Struct, array_like=True, omit_defaults=True):
    """prime-rl's `TrainingSample` at `COMMIT`: its fields, in its order, with its defaults."""

    token_ids: list[int]
    mask: list[bool]
    logprobs: list[float]
    temperatures: list[float]
    env_name: str
    ref_logprobs: list[float] | None = None
    mm_kwargs: dict | None = None
    routed_experts: list | None = None
    mm_token_type_ids: list[int] | None = None
    rl_weights: list[float] | None = None
    ce_weights: list[float] | None = None
    ref_kl_weights: list[float] | None = None
    advantages: list[float] | None = None


def prime_rl_samples(samples: Sequence[Sample], env_name: str) -> list[TrainingSample]:
    """One `TrainingSample` per sample, `env_name` its environment (prime-rl keys its metrics
    by it; `all` is reserved there)."""
    if env_name == "all":
        raise ValueError(f"{TRAINER}: env_name 'all' is reserved for its aggregate metrics")
    check_uncut(samples, TRAINER)
    out = []
    for sample in samples:
        trained_span(sample, TRAINER)
        temperatures = np.where(np.isnan(sample.temperatures), 1.0, sample.temperatures)
        out.append(
            TrainingSample(
                token_ids=sample.token_ids.tolist(),
                mask=sample.loss_mask.astype(bool).tolist(),
                logprobs=sample.logprobs.tolist(),
                temperatures=temperatures.tolist(),
                env_name=env_name,
                advantages=sample.advantages.tolist(),
            )
        )
    return out


def write_prime_rl(path: str | Path, samples: Sequence[Sample], env_name: str) -> None:
    """The samples as one msgpack list of `TrainingSample`s at `path`."""
    Path(path).write_bytes(msgspec.msgpack.encode(prime_rl_samples(samples, env_name)))
