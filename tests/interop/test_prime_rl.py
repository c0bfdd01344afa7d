"""prime-rl's packer and RL loss on the file `write_prime_rl` wrote equal the plain-torch
reference loss, value and gradient.

prime-rl is not on PyPI and does not install on CPU Python 3.11, so what its trainer does with
the file is written here from its source at commit 559b44772e471d1538537b8805cc77f3824a5e64
(`prime_rl.COMMIT`), each piece naming its upstream file:

- src/prime_rl/transports/rollouts/types.py: `TrainingSample` (and the structs it names), which
  the file is decoded into with `msgspec.msgpack.Decoder(list[TrainingSample])`;
- src/prime_rl/trainer/batch.py: `prepare_sample` (one sample, position ids 0, 1, ...),
  `packed_samples_into_micro_bs` (first fit by decreasing length, position ids restarting per
  sample) and `pad_micro_batch`;
- src/prime_rl/trainer/rl/data.py: the micro-batch as tensors (values float32);
- src/prime_rl/trainer/rl/train.py and src/prime_rl/trainer/rl/loss.py: labels shifted left,
  the logits cast to float32 (`cast_float_and_contiguous`, models/layers/lm_head.py) and divided
  at position i by `temperatures[i]`, the log-probabilities shifted right, split per sample, the
  default loss (`default_loss_fn`, DPPO-Binary-TV: a token whose probability moved beyond
  `dppo_mask_high` / `dppo_mask_low` in its advantage's direction leaves the policy term, plus
  `kl_tau` x log-ratio^2 on every trained token) summed and divided by the step's trained
  tokens (`rl_scale`).

That default loss is not a PPO clip, so the reference runs with its `probability_mask` trust
region and `squared_log_ratio` (tests/interop/reference_loss.py). The packed micro-batch is
forwarded whole, its samples kept apart by the restarting position ids as prime-rl's varlen
attention keeps them (transformers builds the block-causal mask from them).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from callgrove.batch import build_samples
from callgrove.episode import sampling_record
from callgrove.formats.problems import InputError
from callgrove.interop import prime_rl
from train.helpers import VOCAB

from .reference_loss import Agreement, Clip, agreement, clipped_share, reference_loss
from .trainer_samples import (
    SOURCES,
    credited_rows,
    first_loss_call,
    plain_copy,
    reference_model,
    trainer_samples,
)

TOLERANCE = 1e-5
TEMPERATURES = (0.7, 1.0, (0.6, 1.0))
SEQ_LEN = 1024  # prime-rl's trainer.model.seq_len: every sample here fits whole
PAD_TO_MULTIPLE_OF = 8


# --- src/prime_rl/transports/rollouts/types.py at prime_rl.COMMIT ---------------------------
class EncodedTensor(msgspec.Struct, array_like=True, gc=False):
    dtype: str
    shape: list[int]
    data: bytes


class RoutedExperts(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    data: bytes
    shape: list[int]
    dtype: str


class UpstreamTrainingSample(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    token_ids: list[int]
    mask: list[bool]
    logprobs: list[float]
    temperatures: list[float]
    env_name: str
    ref_logprobs: list[float] | None = None
    mm_kwargs: dict[str, EncodedTensor] | None = None
    routed_experts: RoutedExperts | None = None
    mm_token_type_ids: list[int] | None = None
    rl_weights: list[float] | None = None
    ce_weights: list[float] | None = None
    ref_kl_weights: list[float] | None = None
    advantages: list[float] | None = None


def read_training_samples(path: Path) -> list[UpstreamTrainingSample]:
    return msgspec.msgpack.Decoder(list[UpstreamTrainingSample]).decode(path.read_bytes())


# --- src/prime_rl/trainer/batch.py at prime_rl.COMMIT (text samples, one train worker) -------
@dataclass
class MicroBatch:
    input_ids: list[int]
    loss_mask: list[bool]
    advantages: list[float]
    inference_logprobs: list[float]
    position_ids: list[int]
    sequence_lengths: list[int]
    temperatures: list[float]


def prepare_sample(sample: UpstreamTrainingSample, seq_len: int) -> MicroBatch:
    # prime-rl truncates a longer sample to seq_len; none is longer here.
    assert len(sample.token_ids) <= seq_len
    assert sample.advantages is not None and sample.rl_weights is None
    return MicroBatch(
        input_ids=list(sample.token_ids),
        loss_mask=list(sample.mask),
        advantages=list(sample.advantages),
        inference_logprobs=list(sample.logprobs),
        position_ids=list(range(len(sample.token_ids))),
        sequence_lengths=[len(sample.token_ids)],
        temperatures=list(sample.temperatures),
    )


def packed_samples_into_micro_bs(samples: list[MicroBatch], max_seq_len: int) -> list[MicroBatch]:
    """First fit decreasing: each sample in the first bin it fits, bins concatenated."""
    samples = sorted(samples, key=lambda sample: -len(sample.input_ids))
    bins: list[list[MicroBatch]] = []
    for sample in samples:
        for content in bins:
            if sum(len(s.input_ids) for s in content) + len(sample.input_ids) <= max_seq_len:
                content.append(sample)
                break
        else:
            bins.append([sample])
    return [
        MicroBatch(
            **{
                name: [value for s in content for value in getattr(s, name)]
                for name in MicroBatch.__dataclass_fields__
            }
        )
        for content in bins
    ]


def pad_micro_batch(micro_batch: MicroBatch, pad_to_multiple_of: int) -> MicroBatch:
    padding = (
        pad_to_multiple_of - len(micro_batch.input_ids) % pad_to_multiple_of
    ) % pad_to_multiple_of
    if pad_to_multiple_of <= 1 or not padding:
        return micro_batch
    micro_batch.input_ids.extend([1] * padding)
    micro_batch.advantages.extend([0.0] * padding)
    micro_batch.loss_mask.extend([False] * padding)
    micro_batch.position_ids.extend(range(padding))
    micro_batch.sequence_lengths[-1] += padding
    micro_batch.inference_logprobs.extend([0.0] * padding)
    micro_batch.temperatures.extend([1.0] * padding)
    return micro_batch


def prepare_batch(rollouts: list[UpstreamTrainingSample], seq_len: int) -> list[MicroBatch]:
    micro_batches = packed_samples_into_micro_bs(
        [prepare_sample(r, seq_len) for r in rollouts], seq_len
    )
    return [pad_micro_batch(m, PAD_TO_MULTIPLE_OF) for m in micro_batches]


# --- src/prime_rl/trainer/rl/loss.py (DefaultLossConfig defaults: configs/trainer.py) -------
@dataclass(frozen=True)
class DefaultLossConfig:
    dppo_mask_low: float = 0.2
    dppo_mask_high: float = 0.2
    adv_tau: float = 1.0
    kl_tau: float = 1e-3


def shift_tensor_left(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t[:, 1:], torch.zeros((t.shape[0], 1), dtype=t.dtype)], dim=1)


def shift_tensor_right(t: torch.Tensor, pad_value: float) -> torch.Tensor:
    return torch.cat([torch.full((t.shape[0], 1), pad_value, dtype=t.dtype), t[:, :-1]], dim=1)


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.gather(logits.log_softmax(dim=-1), -1, index.unsqueeze(-1)).squeeze(-1)


def default_loss_fn(
    trainer_logprobs, inference_logprobs, advantages, loss_mask, config: DefaultLossConfig
) -> torch.Tensor:
    log_importance_ratio = trainer_logprobs - inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    probs_diff = torch.exp(trainer_logprobs) - torch.exp(inference_logprobs)
    invalid_high = probs_diff > config.dppo_mask_high
    invalid_low = probs_diff < -config.dppo_mask_low
    is_masked = torch.where(advantages > 0, invalid_high, invalid_low)
    keep_mask = loss_mask & ~is_masked
    pg_loss = keep_mask * (config.adv_tau * advantages) * importance_ratio
    kl_loss = loss_mask * log_importance_ratio**2
    return (-pg_loss + config.kl_tau * kl_loss).sum()


# --- src/prime_rl/trainer/rl/train.py: one step's forward and backward ----------------------
def prime_rl_step(
    model: torch.nn.Module,
    micro_batches: list[MicroBatch],
    config: DefaultLossConfig,
    float32: bool = True,
) -> torch.Tensor:
    """The step's loss, each micro-batch's backward run as prime-rl runs it. `float32`: as
    prime-rl computes (its data loader's float32 tensors, its float32 logits); otherwise every
    value stays in float64, to show the semantics agree beyond float32's rounding."""
    dtype = torch.float32 if float32 else torch.float64
    rl_scale = max(sum(sum(m.loss_mask) for m in micro_batches), 1)
    vocab_size = model.config.vocab_size
    total = torch.zeros((), dtype=dtype)
    for micro_batch in micro_batches:
        input_ids = torch.tensor(micro_batch.input_ids, dtype=torch.long)[None]
        position_ids = torch.tensor(micro_batch.position_ids, dtype=torch.long)[None]
        advantages = torch.tensor(micro_batch.advantages, dtype=dtype)[None]
        inference_logprobs = torch.tensor(micro_batch.inference_logprobs, dtype=dtype)[None]
        loss_mask = torch.tensor(micro_batch.loss_mask, dtype=torch.bool)[None]
        temperatures = torch.tensor(micro_batch.temperatures, dtype=dtype)[None]
        labels = shift_tensor_left(input_ids)
        # No cache: transformers then keeps the packed samples apart by their position ids.
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
        logits = logits.to(dtype)
        logprobs = selective_log_softmax(logits / temperatures.unsqueeze(-1), labels)
        logprobs = shift_tensor_right(logprobs, pad_value=math.log(1.0 / vocab_size))
        lengths = micro_batch.sequence_lengths
        loss = sum(
            default_loss_fn(t, i, a, m, config)
            for t, i, a, m in zip(
                logprobs.squeeze(0).split(lengths),
                inference_logprobs.squeeze(0).split(lengths),
                advantages.squeeze(0).split(lengths),
                loss_mask.squeeze(0).split(lengths),
                strict=True,
            )
        )
        loss = loss / rl_scale
        loss.backward()
        total = total + loss.detach()
    return total


def reference_clip(config: DefaultLossConfig) -> Clip:
    """The reference loss prime-rl's default loss is (its advantage scale left at 1)."""
    assert config.adv_tau == 1.0
    return Clip(
        clip_low=config.dppo_mask_low,
        clip_high=config.dppo_mask_high,
        normalisation="token",
        trust_region="probability_mask",
        squared_log_ratio=config.kl_tau,
    )


def own_token_temperatures(samples, records):
    """The temperatures as the writer had them before (each token's own, 1 where unknown): the
    misalignment these tests exist to catch."""
    return [
        msgspec.structs.replace(
            record,
            temperatures=np.nan_to_num(sample.temperatures.astype(np.float64), nan=1.0).tolist(),
        )
        for sample, record in zip(samples, records, strict=True)
    ]


def measure_prime_rl(
    source: str,
    temperature: float | tuple[float, ...],
    config: DefaultLossConfig = DefaultLossConfig(),
    float32: bool = True,
    own_temperatures: bool = False,
    seed: int = 0,
) -> Agreement:
    """prime-rl's loss on `write_prime_rl`'s file against the reference, on a float64 model."""
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference, seed, temperature, source)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "samples.msgpack"
        prime_rl.write_prime_rl(path, samples, source, vocab_size=VOCAB)
        records = read_training_samples(path)
    if own_temperatures:
        records = own_token_temperatures(samples, records)
    model = plain_copy(reference)
    got = prime_rl_step(model, prepare_batch(records, SEQ_LEN), config, float32)
    want_model = plain_copy(reference)
    want = reference_loss(want_model, samples, reference_clip(config))
    want.backward()
    return agreement(got, want, model, want_model)


# Tight enough on this small model that the mask drops some tokens and keeps others.
TIGHT = DefaultLossConfig(dppo_mask_low=0.002, dppo_mask_high=0.002)


@pytest.mark.parametrize("temperature", TEMPERATURES, ids=str)
@pytest.mark.parametrize("source", SOURCES)
def test_prime_rls_loss_on_the_written_file_is_the_reference(source, temperature):
    measured = measure_prime_rl(source, temperature)
    assert measured.loss <= TOLERANCE and measured.gradient <= TOLERANCE, measured


@pytest.mark.parametrize("source", SOURCES)
def test_prime_rls_mask_drops_the_tokens_the_reference_drops(source):
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference, 0, 0.7, source)
    share = clipped_share(plain_copy(reference), samples, reference_clip(TIGHT))
    assert 0 < share < 1, share
    measured = measure_prime_rl(source, 0.7, TIGHT)
    assert measured.loss <= TOLERANCE and measured.gradient <= TOLERANCE, measured


def test_beyond_float32_the_two_agree_to_float64s_rounding():
    measured = measure_prime_rl("synthetic", (0.6, 1.0), TIGHT, float32=False)
    assert measured.loss <= 1e-10 and measured.gradient <= 1e-10, measured


@pytest.mark.parametrize("temperature", [0.7, (0.6, 1.0)], ids=str)
def test_each_tokens_own_temperature_at_its_position_is_wrong(temperature):
    measured = measure_prime_rl("login", temperature, own_temperatures=True)
    assert measured.loss > 1e-3 and measured.gradient > 1e-2, measured


def test_a_position_carries_the_temperature_of_the_token_it_predicts(tmp_path):
    episode_rows = credited_rows(temperature=(0.6, 0.8, 1.3), source="synthetic")
    for call in (c for er in episode_rows for c in er.forest.calls):
        call.logprobs = -np.linspace(0.1, 2.0, len(call.completion_ids))
    samples = [s for s in build_samples(episode_rows) if s.num_loss_tokens]
    path = tmp_path / "samples.msgpack"
    prime_rl.write_prime_rl(path, samples, "synthetic")
    for record, sample in zip(read_training_samples(path), samples, strict=True):
        written = np.asarray(record.temperatures)
        predicts_trained = sample.loss_mask[1:] == 1
        assert np.array_equal(
            written[:-1][predicts_trained], sample.temperatures[1:][predicts_trained]
        )
        assert (written[:-1][~predicts_trained] == prime_rl.UNSCORED_TEMPERATURE).all()
        assert written[-1] == prime_rl.UNSCORED_TEMPERATURE
    assert len({t for r in read_training_samples(path) for t in r.temperatures}) == 4


# prime-rl's TrainingSample at prime_rl.COMMIT: field names in declaration order; from
# ref_logprobs on every field defaults to None.
FIELDS = list(UpstreamTrainingSample.__struct_fields__)
FIRST_OPTIONAL = FIELDS.index("ref_logprobs")


def test_the_file_holds_prime_rls_struct_field_by_field(tmp_path):
    episode_rows = credited_rows()
    for call in (c for er in episode_rows for c in er.forest.calls):
        call.logprobs = -np.linspace(0.1, 2.0, len(call.completion_ids))
    samples = build_samples(episode_rows)
    path = tmp_path / "samples.msgpack"
    prime_rl.write_prime_rl(path, samples, "login")

    assert list(prime_rl.TrainingSample.__struct_fields__) == FIELDS
    assert prime_rl.TrainingSample.__struct_config__.array_like
    assert prime_rl.TrainingSample.__struct_config__.omit_defaults
    written = msgspec.msgpack.decode(path.read_bytes())  # untyped: the wire as it is
    assert len(written) == len(samples)
    for record, sample in zip(written, samples, strict=True):
        assert len(record) == len(FIELDS)  # advantages last, the absent fields nil before it
        fields = dict(zip(FIELDS, record, strict=True))
        assert fields["token_ids"] == sample.token_ids.tolist()
        assert fields["mask"] == sample.loss_mask.astype(bool).tolist()
        assert all(isinstance(m, bool) for m in fields["mask"])
        assert np.array_equal(np.float32(fields["logprobs"]), sample.logprobs)
        assert np.array_equal(np.float32(fields["advantages"]), sample.advantages)
        assert fields["env_name"] == "login"
        for name in FIELDS[FIRST_OPTIONAL:-1]:
            assert fields[name] is None, name
        assert len({len(fields[n]) for n in ("token_ids", "mask", "logprobs", "temperatures")}) == 1


def test_refusals_name_the_row_and_call():
    episode_rows = credited_rows()
    for call in (c for er in episode_rows for c in er.forest.calls):
        call.logprobs = -np.linspace(0.1, 2.0, len(call.completion_ids))
    samples = build_samples(episode_rows)
    with pytest.raises(ValueError, match="reserved"):
        prime_rl.prime_rl_samples(samples, "all")
    with pytest.raises(InputError, match="outside the model's vocabulary of 40"):
        prime_rl.prime_rl_samples(samples, "login", vocab_size=40)
    prime_rl.prime_rl_samples(samples, "login", vocab_size=VOCAB)
    first = first_loss_call(episode_rows)
    for sampling, refusal in (
        (sampling_record(1.0, 0.9), "top-p or top-k cut"),
        (sampling_record(1.0, 1.0, 20), "top-p or top-k cut"),
        (sampling_record(0.0, 1.0), "greedily"),
    ):
        first.sampling = sampling
        broken = build_samples(episode_rows)
        with pytest.raises(InputError, match=refusal) as refused:
            prime_rl.prime_rl_samples(broken, "login")
        assert refused.value.problem.episode == episode_rows[0].episode.id
        assert refused.value.problem.call is not None


def test_unscored_positions_must_stay_finite():
    """Why the writer never leaves a NaN where no trained token follows: prime-rl multiplies by
    its masks, so a NaN log-probability off the mask still reaches the loss."""
    mask = torch.tensor([False, True, True])
    logprobs = torch.tensor([float("nan"), -1.0, -2.0])
    loss = default_loss_fn(
        logprobs, torch.tensor([0.0, -1.1, -1.9]), torch.ones(3), mask, DefaultLossConfig()
    )
    assert torch.isnan(loss)
