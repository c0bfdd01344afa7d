"""Callgrove samples as prime-rl's training samples, written from prime-rl's source at commit
559b44772e471d1538537b8805cc77f3824a5e64 (`src/prime_rl/transports/rollouts/types.py`,
`TrainingSample`; prime-rl is not on PyPI and does not install on CPU Python 3.11).

A `TrainingSample` is one flat branch of a rollout: `token_ids`, `mask` (trainable tokens),
`logprobs` and `temperatures` aligned per position, `env_name`, and `advantages` over the
whole sequence; the other fields (reference logprobs, multimodal inputs, routed experts, loss
weight streams) stay absent. It is a msgspec struct encoded as an array (`array_like`) with
trailing defaults omitted, so a sample with advantages is written with the seven absent fields
before them as nil. prime-rl's orchestrator hands a list of them to its packer
(`prepare_sample` in `src/prime_rl/trainer/batch.py`), which decodes them as
`msgspec.msgpack.Decoder(list[TrainingSample])` would.

The temperatures are per position, and a position's is the one its logits are divided by:
prime-rl's trainer divides the logits at position i, which predict token i + 1, by
`temperatures[i]` (`src/prime_rl/trainer/rl/train.py`, and its fused head in
`src/prime_rl/trainer/models/layers/lm_head.py`), so position i carries the temperature token
i + 1 was sampled at. Rows sampled at several temperatures are fine. Positions followed by no
trained token carry 1.0, as prime-rl's own padding does: the last position predicts nothing in
its sample, and the others only untrained tokens. The value must still be finite and positive
there, because prime-rl's default loss multiplies by its masks instead of selecting with them
(a NaN logprob anywhere would make the loss NaN).

prime-rl scores a token under its temperature alone, so trained tokens sampled with a top-p or
top-k cut, or greedily (temperature 0), are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

from callgrove.batch.samples import Sample
from callgrove.errors import InvalidValue
from callgrove.interop.trainer_rows import (
    check_uncut,
    check_vocabulary,
    filled_routes,
    refuse,
    trained_span,
)

TRAINER = "prime-rl"
COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"
# What a position followed by no trained token carries (prime-rl pads with it too).
UNSCORED_TEMPERATURE = 1.0


class RoutedExperts(msgspec.Struct, array_like=True, omit_defaults=True):
    """prime-rl's `RoutedExperts` at `COMMIT` (types.py, lines 15-18): a (tokens, layers, k)
    array as its bytes, its shape and its numpy dtype's name."""

    data: bytes
    shape: list[int]
    dtype: str


class TrainingSample(msgspec.Struct, array_like=True, omit_defaults=True):
    """prime-rl's `TrainingSample` at `COMMIT`: its fields, in its order, with its defaults."""

    token_ids: list[int]
    mask: list[bool]
    logprobs: list[float]
    temperatures: list[float]
    env_name: str
    ref_logprobs: list[float] | None = None
    mm_kwargs: dict | None = None
    routed_experts: RoutedExperts | None = None
    mm_token_type_ids: list[int] | None = None
    rl_weights: list[float] | None = None
    ce_weights: list[float] | None = None
    ref_kl_weights: list[float] | None = None
    advantages: list[float] | None = None


def predicting_temperatures(sample: Sample) -> np.ndarray:
    """Per position, the temperature prime-rl divides its logits by: the temperature of the
    token it predicts where that token is trained, `UNSCORED_TEMPERATURE` elsewhere."""
    out = np.full(sample.num_tokens, UNSCORED_TEMPERATURE, dtype=np.float64)
    next_trained = sample.loss_mask[1:].astype(bool)
    out[:-1][next_trained] = sample.temperatures[1:][next_trained]
    return out


def prime_rl_samples(
    samples: Sequence[Sample], env_name: str, *, vocab_size: int | None = None
) -> list[TrainingSample]:
    """One `TrainingSample` per sample, `env_name` its environment (prime-rl keys its metrics
    by it; `all` is reserved there). With `vocab_size`, token ids outside the model's
    vocabulary are refused."""
    if env_name == "all":
        raise InvalidValue(f"{TRAINER}: env_name 'all' is reserved for its aggregate metrics")
    if not samples:
        raise InvalidValue(f"{TRAINER}: no samples to write")
    check_uncut(samples, TRAINER)
    if vocab_size is not None:
        check_vocabulary(samples, vocab_size, TRAINER)
    out = []
    for sample in samples:
        trained_span(sample, TRAINER)
        if (sample.temperatures[sample.loss_mask.astype(bool)] <= 0).any():
            raise refuse(
                sample,
                TRAINER,
                f"has trained tokens sampled greedily (temperature 0), which {TRAINER} cannot "
                "score: it divides the logits by the temperature",
            )
        out.append(
            TrainingSample(
                token_ids=sample.token_ids.tolist(),
                mask=sample.loss_mask.astype(bool).tolist(),
                logprobs=sample.logprobs.tolist(),
                temperatures=predicting_temperatures(sample).tolist(),
                env_name=env_name,
                routed_experts=routed_experts(sample),
                advantages=sample.advantages.tolist(),
            )
        )
    return out


def routed_experts(sample: Sample) -> RoutedExperts | None:
    """A mixture of experts' routes as prime-rl's trainer replays them
    (`trainer.enable_router_replay`; src/prime_rl/trainer/rl/data.py, lines 197-208): one row per
    token, a token without one given its predecessor's, as prime-rl fills a row's last token;
    unsigned, as its own orchestrator sends them."""
    if sample.routes is None:
        return None
    routes = filled_routes(sample.routes, previous=True)
    narrow = routes.astype(np.uint8 if routes.max(initial=0) < 256 else np.uint16)
    return RoutedExperts(narrow.tobytes(), list(narrow.shape), str(narrow.dtype))


def write_prime_rl(
    path: str | Path, samples: Sequence[Sample], env_name: str, *, vocab_size: int | None = None
) -> None:
    """The samples as one msgpack list of `TrainingSample`s at `path`."""
    records = prime_rl_samples(samples, env_name, vocab_size=vocab_size)
    Path(path).write_bytes(msgspec.msgpack.encode(records))
