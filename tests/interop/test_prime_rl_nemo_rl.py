"""The prime-rl and NeMo RL writers, field by field against the schemas their sources define at
the pinned commits (neither package installs on CPU Python 3.11, so the schemas are read from
their source: prime-rl's `TrainingSample` in src/prime_rl/transports/rollouts/types.py, NeMo
RL's `ClippedPGLossDataDict` in nemo_rl/algorithms/loss/loss_functions.py and the train data
grpo.py builds)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

from callgrove.batch import build_samples
from callgrove.episode import sampling_record
from callgrove.formats.problems import InputError
from callgrove.interop import nemo_rl, prime_rl

from .trainer_samples import TEMPERATURE, credited_rows, first_loss_call

# prime-rl's TrainingSample at prime_rl.COMMIT: (field, type), in declaration order; the struct
# is array_like with omit_defaults, every field from ref_logprobs on defaults to None.
PRIME_RL_FIELDS = [
    ("token_ids", "list[int]"),
    ("mask", "list[bool]"),
    ("logprobs", "list[float]"),
    ("temperatures", "list[float]"),
    ("env_name", "str"),
    ("ref_logprobs", "list[float] | None"),
    ("mm_kwargs", "dict[str, EncodedTensor] | None"),
    ("routed_experts", "RoutedExperts | None"),
    ("mm_token_type_ids", "list[int] | None"),
    ("rl_weights", "list[float] | None"),
    ("ce_weights", "list[float] | None"),
    ("ref_kl_weights", "list[float] | None"),
    ("advantages", "list[float] | None"),
]
FIRST_OPTIONAL = 5
# NeMo RL at nemo_rl.COMMIT: what ClippedPGLossFn reads, less what its workers compute.
NEMO_RL_FIELDS = {
    "input_ids": (torch.int64, 2),
    "input_lengths": (torch.int32, 1),
    "token_mask": (torch.int64, 2),
    "advantages": (torch.float32, 2),
    "generation_logprobs": (torch.float32, 2),
    "sample_mask": (torch.float32, 1),
}


def samples_with_logprobs():
    episode_rows = credited_rows()
    for er in episode_rows:
        for call in er.forest.calls:
            call.logprobs = -np.linspace(0.1, 2.0, len(call.completion_ids))
    return episode_rows, build_samples(episode_rows)


def test_prime_rl_training_samples_match_its_schema_field_by_field(tmp_path):
    episode_rows, samples = samples_with_logprobs()
    # Per-token temperatures: one call sampled hotter than the rest.
    hot = first_loss_call(episode_rows)
    hot.sampling = sampling_record(1.3, 1.0)
    samples = build_samples(episode_rows)
    path = tmp_path / "samples.msgpack"
    prime_rl.write_prime_rl(path, samples, "login")

    assert [f for f in prime_rl.TrainingSample.__struct_fields__] == [n for n, _ in PRIME_RL_FIELDS]
    assert prime_rl.TrainingSample.__struct_config__.array_like
    assert prime_rl.TrainingSample.__struct_config__.omit_defaults
    written = msgspec.msgpack.decode(path.read_bytes())  # untyped: the wire as it is
    assert len(written) == len(samples)
    for record, sample in zip(written, samples, strict=True):
        assert len(record) == len(PRIME_RL_FIELDS)
        fields = dict(zip([n for n, _ in PRIME_RL_FIELDS], record, strict=True))
        assert fields["token_ids"] == sample.token_ids.tolist()
        assert fields["mask"] == sample.loss_mask.astype(bool).tolist()
        assert all(isinstance(m, bool) for m in fields["mask"])
        assert fields["logprobs"] == pytest.approx(sample.logprobs.tolist())
        assert fields["temperatures"] == pytest.approx(sample.temperatures.tolist())
        assert fields["env_name"] == "login"
        assert fields["advantages"] == pytest.approx(sample.advantages.tolist())
        for name, _ in PRIME_RL_FIELDS[FIRST_OPTIONAL:-1]:
            assert fields[name] is None, name
        assert len({len(fields[n]) for n in ("token_ids", "mask", "logprobs", "temperatures")}) == 1
    assert any(np.isclose(record[3], 1.3).any() for record in written)


def test_prime_rl_refuses_cut_sampling_and_the_reserved_env_name():
    episode_rows, samples = samples_with_logprobs()
    with pytest.raises(ValueError, match="reserved"):
        prime_rl.prime_rl_samples(samples, "all")
    first_loss_call(episode_rows).sampling = sampling_record(1.0, 0.9)
    with pytest.raises(InputError, match="top-p or top-k cut"):
        prime_rl.prime_rl_samples(build_samples(episode_rows), "login")


def test_nemo_rl_batch_matches_its_schema_field_by_field(tmp_path):
    _, samples = samples_with_logprobs()
    path = tmp_path / "batch.pt"
    temperature = nemo_rl.write_nemo_rl(path, samples)
    batch = torch.load(path)

    assert temperature == TEMPERATURE
    assert set(batch) == set(NEMO_RL_FIELDS)
    rows, width = len(samples), max(s.num_tokens for s in samples)
    for name, (dtype, dims) in NEMO_RL_FIELDS.items():
        assert batch[name].dtype == dtype, name
        assert batch[name].shape == ((rows, width) if dims == 2 else (rows,)), name
    # The loss reads every per-token tensor as [:, 1:], next to the logprob of the same token.
    shifted_mask = batch["token_mask"][:, 1:].bool()
    for index, sample in enumerate(samples):
        length = int(batch["input_lengths"][index])
        assert length == sample.num_tokens
        assert batch["input_ids"][index, :length].tolist() == sample.token_ids.tolist()
        trained = np.flatnonzero(sample.loss_mask)
        mask = shifted_mask[index]
        assert np.array_equal(
            batch["generation_logprobs"][index, 1:][mask].numpy(), sample.logprobs[trained]
        )
        assert np.array_equal(
            batch["advantages"][index, 1:][mask].numpy(), sample.advantages[trained]
        )
        assert not batch["token_mask"][index, length:].any()
    assert batch["sample_mask"].tolist() == [1.0] * rows


def test_nemo_rl_refuses_rows_sampled_at_two_temperatures():
    episode_rows, _ = samples_with_logprobs()
    first_loss_call(episode_rows).sampling = sampling_record(0.6, 1.0)
    with pytest.raises(InputError, match="one temperature"):
        nemo_rl.nemo_rl_arrays(build_samples(episode_rows))
