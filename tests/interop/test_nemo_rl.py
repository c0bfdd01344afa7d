"""NeMo RL's clipped policy-gradient loss on the tensors `write_nemo_rl` saved equals the
plain-torch reference loss, value and gradient, under the loss configs
`check_nemo_rl_loss_config` accepts, and differs under those it refuses.

NeMo RL does not install on CPU Python 3.11 (`nemo-rl` on PyPI is an empty placeholder), so
what it does with the batch is written here from its source at commit
7ea279abfbeb698b092856d0dab61e7cf39bc909 (`nemo_rl.COMMIT`), each piece naming its file:

- nemo_rl/models/automodel/data.py: the forward of an unpacked batch (attention mask all ones,
  position ids 0, 1, ...) and the normalisers, `global_valid_toks` (the trained tokens,
  `token_mask[:, 1:]` x `sample_mask`) and `global_valid_seqs`;
- nemo_rl/models/automodel/train.py: the logits divided by the generation temperature
  (`apply_temperature_scaling`), in the model's dtype;
- nemo_rl/distributed/model_utils.py, `get_next_token_logprobs_from_logits`: the logits cast to
  float32, the last position dropped, top-k then top-p cut (`apply_top_k_top_p`,
  nemo_rl/algorithms/logits_sampling_utils.py), log-softmax, the next token gathered; a
  trained token a cut removed is masked out (`mask_out_neg_inf_logprobs`,
  nemo_rl/algorithms/utils.py; nemo_rl/algorithms/loss/utils.py). Its `get_logprobs` (how the
  GRPO loop recomputes `prev_logprobs`) is the same, with a 0 in front;
- nemo_rl/algorithms/loss/loss_functions.py, `ClippedPGLossFn.__call__`: the ratio against
  `prev_logprobs` (or 1 with `force_on_policy_ratio`, the log-probability with
  `disable_ppo_ratio`, one per sequence with `sequence_level_importance_ratios`), the clip to
  [1 - ratio_clip_min, 1 + ratio_clip_max], the dual clip `ratio_clip_c`, CISPO, the
  importance-sampling correction exp(prev - generation) with its truncations, and `masked_mean`
  (note its + 1e-8) over tokens or over sequences. Its KL and NLL terms are not written here:
  the configs below set them to 0.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from callgrove.batch import build_samples
from callgrove.episode import Agent, Call, Episode, sampling_record
from callgrove.formats.problems import InputError
from callgrove.interop import nemo_rl
from callgrove.interop.settings_check import SettingsRefused
from callgrove.rows import build_rows
from callgrove.sampling.distribution import sampling_distribution
from callgrove.train import LossSettings
from callgrove.train.loss import policy_terms
from train.helpers import VOCAB, row_batch, sample_near_the_model

from .reference_loss import Agreement, Clip, agreement, clipped_share, reference_loss
from .trainer_samples import (
    SOURCES,
    TEMPERATURE,
    credited_rows,
    first_loss_call,
    plain_copy,
    reference_model,
    trainer_samples,
)

TOLERANCE = 1e-5
UNCLIPPED = Clip(clip_low=1e9, clip_high=1e9)

# --- nemo_rl/algorithms/loss/loss_functions.py: ClippedPGLossConfig's defaults --------------
UPSTREAM_DEFAULTS: dict[str, Any] = {
    "disable_ppo_ratio": False,
    "token_level_loss": True,
    "sequence_level_importance_ratios": False,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
    "ratio_clip_c": None,
    "reference_policy_kl_penalty": 0.01,
    "use_kl_in_reward": False,
    "use_importance_sampling_correction": False,
    "truncated_importance_sampling_type": None,
    "truncated_importance_sampling_ratio": None,
    "truncated_importance_sampling_ratio_min": None,
    "use_on_policy_kl_approximation": False,
    "force_on_policy_ratio": False,
    "use_cispo": False,
    "positive_example_nll_weight": 0.0,
}
NO_EXTRA_TERMS = {"reference_policy_kl_penalty": 0.0}


# --- nemo_rl/algorithms/logits_sampling_utils.py: apply_top_k_top_p (forward) ----------------
def apply_top_k_top_p(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """-inf on the tokens the cuts remove: top-k first, then top-p on what top-k kept; the
    gradient of a removed token's logit is 0 (upstream's backward masks it; -inf does here)."""
    cut_k = top_k is not None and top_k > 0
    if top_p == 1.0:
        if not cut_k:
            return logits
        threshold = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        return torch.where(logits >= threshold, logits, -torch.inf)
    with torch.no_grad():
        ordered, order = logits.sort(dim=-1, descending=False)
        keep_k = torch.ones_like(ordered, dtype=torch.bool)
        if cut_k:
            keep_k = ordered >= ordered[..., logits.shape[-1] - top_k, None]
            ordered = ordered.masked_fill(~keep_k, -torch.inf)
        keep_p = ordered.softmax(dim=-1).cumsum(dim=-1) > 1 - top_p
        keep_p[..., -1] = True
        keep = torch.zeros_like(keep_p).scatter(-1, order, keep_k & keep_p)
    return torch.where(keep, logits, -torch.inf)


# --- the worker's scoring (automodel/train.py, distributed/model_utils.py, loss/utils.py) ---
def next_token_logprobs(
    model, batch, sampling: nemo_rl.GenerationSampling, float32: bool = True
) -> torch.Tensor:
    """(B, S - 1): each next token's log-probability as NeMo RL's loss receives it. `float32`:
    as NeMo RL computes it; otherwise in float64, to show the semantics agree beyond float32's
    rounding."""
    input_ids = batch["input_ids"]
    rows, width = input_ids.shape
    logits = model(
        input_ids=input_ids,
        attention_mask=torch.ones((rows, width), dtype=torch.bool),
        position_ids=torch.arange(width).repeat(rows, 1),
    ).logits
    if sampling.temperature != 1.0:
        logits = logits / sampling.temperature
    logits = logits.to(torch.float32 if float32 else torch.float64)[:, :-1]
    logits = apply_top_k_top_p(logits, sampling.top_k, sampling.top_p)
    logprobs = logits.log_softmax(dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
    if sampling.top_p != 1.0 or (sampling.top_k or 0) > 0:
        mask = (batch["token_mask"] * batch["sample_mask"][:, None])[:, 1:]
        keep = mask * (~torch.isinf(logprobs)).float()
        logprobs = torch.where(keep.bool(), logprobs, 0.0)
    return logprobs


def recomputed_prev_logprobs(model, batch, sampling) -> torch.Tensor:
    """`policy.get_logprobs`, as NeMo RL's GRPO loop fills `prev_logprobs` before training."""
    with torch.no_grad():
        logprobs = next_token_logprobs(model, batch, sampling)
    return torch.cat([torch.zeros_like(logprobs[:, :1]), logprobs], dim=1)


# --- nemo_rl/algorithms/utils.py: masked_mean ------------------------------------------------
def masked_mean(values, mask, dim=None, global_normalization_factor=None):
    factor = (
        mask.sum(dim=dim) if global_normalization_factor is None else global_normalization_factor
    )
    return (values * mask).sum(dim=dim) / (factor + 1e-8)


# --- nemo_rl/algorithms/loss/loss_functions.py: ClippedPGLossFn.__call__ ---------------------
def clipped_pg_loss(curr_logprobs, data, config: dict[str, Any]) -> torch.Tensor:
    cfg = {**UPSTREAM_DEFAULTS, **config}
    if cfg["reference_policy_kl_penalty"] != 0 and not cfg["use_kl_in_reward"]:
        raise NotImplementedError("the KL term is not written here")
    if cfg["positive_example_nll_weight"] != 0:
        raise NotImplementedError("the NLL term is not written here")
    token_level = cfg["token_level_loss"]
    token_mask = data["token_mask"][:, 1:]
    sample_mask = data["sample_mask"]
    advantages = data["advantages"][:, 1:]
    generation_logprobs = data["generation_logprobs"][:, 1:]
    mask = token_mask * sample_mask.unsqueeze(-1)
    global_valid_toks = (data["token_mask"][:, 1:] * sample_mask.unsqueeze(-1)).sum()
    global_valid_seqs = sample_mask.sum()
    if cfg["force_on_policy_ratio"]:
        prev_logprobs = curr_logprobs.detach()
        ratios = (curr_logprobs - curr_logprobs.detach()).exp()
        ratios_clamped = ratios
    else:
        prev_logprobs = data["prev_logprobs"][:, 1:]
        if not cfg["disable_ppo_ratio"]:
            log_ratios = curr_logprobs - prev_logprobs
            if cfg["sequence_level_importance_ratios"]:
                seq_ratio = masked_mean(log_ratios, token_mask, dim=-1).unsqueeze(-1).exp()
                ratios = seq_ratio.repeat(1, advantages.shape[1])
            else:
                ratios = log_ratios.exp()
            ratios_clamped = ratios.clamp(1.0 - cfg["ratio_clip_min"], 1.0 + cfg["ratio_clip_max"])
        else:
            ratios = curr_logprobs
            ratios_clamped = curr_logprobs
    if cfg["use_cispo"]:
        clip_loss = -advantages * ratios_clamped.detach() * curr_logprobs
    else:
        clip_loss = torch.max(-advantages * ratios, -advantages * ratios_clamped)
    if cfg["ratio_clip_c"] is not None:
        bound = -advantages * cfg["ratio_clip_c"]
        clip_loss = torch.where(advantages < 0, torch.min(clip_loss, bound), clip_loss)
    if cfg["sequence_level_importance_ratios"]:
        seq_difference = ((prev_logprobs - generation_logprobs) * mask).sum(dim=-1)
        weights = torch.nan_to_num(
            torch.exp(seq_difference).detach(), nan=0.0, posinf=0.0, neginf=0.0
        )
        weights = weights.unsqueeze(-1)
    else:
        weights = torch.exp(prev_logprobs - generation_logprobs)
        weights = torch.nan_to_num(weights, nan=0.0, posinf=0.0, neginf=0.0)
    truncation = cfg["truncated_importance_sampling_type"]
    if truncation == "tis":
        low = cfg["truncated_importance_sampling_ratio_min"] or 0.0
        weights = weights.clamp(min=low, max=cfg["truncated_importance_sampling_ratio"])
    elif truncation == "icepop":
        kept = (weights >= cfg["truncated_importance_sampling_ratio_min"]) & (
            weights <= cfg["truncated_importance_sampling_ratio"]
        )
        weights = torch.where(kept, weights, torch.zeros_like(weights))
    elif truncation is not None:
        raise NotImplementedError(f"{truncation} is not written here")
    if not cfg["use_importance_sampling_correction"]:
        weights = torch.ones_like(prev_logprobs)
    if token_level:
        return masked_mean(weights * clip_loss, mask, global_normalization_factor=global_valid_toks)
    per_sequence = masked_mean(weights * clip_loss, token_mask, dim=-1)
    return masked_mean(per_sequence, sample_mask, global_normalization_factor=global_valid_seqs)


def nemo_rl_step(
    model, batch, sampling, config, prev_logprobs: str, float32: bool = True
) -> torch.Tensor:
    """One training pass over the batch, `prev_logprobs` as written (`recorded`) or filled by
    the policy first (`recomputed`); backward run."""
    data = dict(batch)
    if prev_logprobs == "recomputed":
        data["prev_logprobs"] = recomputed_prev_logprobs(model, data, sampling)
    loss = clipped_pg_loss(next_token_logprobs(model, data, sampling, float32), data, config)
    loss.backward()
    return loss


def saved_batch(samples, **options) -> tuple[dict[str, torch.Tensor], nemo_rl.GenerationSampling]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "batch.pt"
        sampling = nemo_rl.write_nemo_rl(path, samples, vocab_size=VOCAB, **options)
        return torch.load(path), sampling


def reference_clip(config: dict[str, Any], prev_logprobs: str) -> Clip:
    """The reference loss a config trains when its ratio is the recorded one: before any
    update, recomputed `prev_logprobs` are the model's, so no clip binds."""
    cfg = {**UPSTREAM_DEFAULTS, **config}
    normalisation = "token" if cfg["token_level_loss"] else "sequence"
    if prev_logprobs == "recomputed":
        return Clip(clip_low=1e9, clip_high=1e9, normalisation=normalisation)
    return Clip(cfg["ratio_clip_min"], cfg["ratio_clip_max"], cfg["ratio_clip_c"], normalisation)


def measure_nemo_rl(
    source: str,
    temperature: float,
    config: dict[str, Any] = NO_EXTRA_TERMS,
    prev_logprobs: str = "recorded",
    float32: bool = True,
    seed: int = 0,
) -> Agreement:
    """NeMo RL's loss on `write_nemo_rl`'s tensors against the reference (float64 model)."""
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference, seed, temperature, source)
    return compare(reference, samples, config, prev_logprobs, float32)


def compare(
    reference, samples, config, prev_logprobs, float32: bool = True, wanted: dict | None = None
) -> Agreement:
    """`wanted` keeps each reference loss computed (and its model's gradients) by its clip."""
    batch, sampling = saved_batch(samples)
    if not float32:
        # The reference divides by the samples' float32 temperature, NeMo RL by the config's
        # decimal one; beyond float32 their 2e-8 difference would show.
        sampling = replace(sampling, temperature=float(np.float32(sampling.temperature)))
    model = plain_copy(reference)
    got = nemo_rl_step(model, batch, sampling, config, prev_logprobs, float32)
    wanted = {} if wanted is None else wanted
    clip = reference_clip(config, prev_logprobs)
    if clip not in wanted:
        want_model = plain_copy(reference)
        want = reference_loss(want_model, samples, clip)
        want.backward()
        wanted[clip] = want, want_model
    want, want_model = wanted[clip]
    return agreement(got, want, model, want_model)


@pytest.mark.parametrize("token_level_loss", [True, False])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("source", SOURCES)
def test_nemo_rls_loss_on_the_written_batch_is_the_reference(source, temperature, token_level_loss):
    config = {**NO_EXTRA_TERMS, "token_level_loss": token_level_loss}
    nemo_rl.check_nemo_rl_loss_config(config)
    measured = measure_nemo_rl(source, temperature, config)
    assert measured.loss <= TOLERANCE and measured.gradient <= TOLERANCE, measured


@pytest.mark.parametrize("source", SOURCES)
def test_the_samples_clip_some_ratios_and_not_others(source):
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference, 0, 0.7, source)
    assert 0 < clipped_share(plain_copy(reference), samples, Clip()) < 1


def test_beyond_float32_the_two_agree_to_float64s_rounding():
    measured = measure_nemo_rl("synthetic", 0.7, float32=False)
    assert measured.loss <= 1e-10 and measured.gradient <= 1e-10, measured


# (config, prev_logprobs): the checker accepts exactly those whose loss is the reference's.
CONFIGS = [
    ({}, "recorded"),
    ({"ratio_clip_min": 0.1, "ratio_clip_max": 0.28, "ratio_clip_c": 3.0}, "recorded"),
    ({"use_importance_sampling_correction": True}, "recorded"),
    (
        {
            "use_importance_sampling_correction": True,
            "truncated_importance_sampling_type": "tis",
            "truncated_importance_sampling_ratio": 2.0,
        },
        "recorded",
    ),
    (
        {
            "use_importance_sampling_correction": True,
            "truncated_importance_sampling_type": "icepop",
            "truncated_importance_sampling_ratio": 2.0,
            "truncated_importance_sampling_ratio_min": 1.5,
        },
        "recorded",
    ),
    ({"force_on_policy_ratio": True}, "recorded"),
    ({"disable_ppo_ratio": True}, "recorded"),
    ({"use_cispo": True}, "recorded"),
    ({"sequence_level_importance_ratios": True, "token_level_loss": False}, "recorded"),
    ({}, "recomputed"),
    ({"use_importance_sampling_correction": True}, "recomputed"),
    ({"use_importance_sampling_correction": True, "force_on_policy_ratio": True}, "recomputed"),
    (
        {
            "use_importance_sampling_correction": True,
            "truncated_importance_sampling_type": "tis",
            "truncated_importance_sampling_ratio": 1.1,
        },
        "recomputed",
    ),
    (
        {
            "use_importance_sampling_correction": True,
            "sequence_level_importance_ratios": True,
            "token_level_loss": False,
        },
        "recomputed",
    ),
]


def test_the_checker_accepts_exactly_the_configs_whose_loss_is_the_reference():
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference, 0, 0.7, "login")
    wanted: dict = {}
    for config, prev_logprobs in CONFIGS:
        config = {**NO_EXTRA_TERMS, **config}
        try:
            nemo_rl.check_nemo_rl_loss_config(config, prev_logprobs)
            accepted = True
        except ValueError:
            accepted = False
        measured = compare(reference, samples, config, prev_logprobs, wanted=wanted)
        equal = measured.loss <= TOLERANCE and measured.gradient <= TOLERANCE
        assert accepted == equal, (config, prev_logprobs, measured)
        if not equal:  # not a near miss: the ratio is another one
            assert max(measured.loss, measured.gradient) > 1e-3, (config, measured)


def test_recomputed_prev_logprobs_clip_against_the_policy_not_the_sampler():
    """With the correction on, the ratio is the recorded one but nothing is clipped at the
    first update, where the reference clips the ratio against the sampler."""
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference, 0, 0.7, "login")
    batch, sampling = saved_batch(samples)
    model = plain_copy(reference)
    config = {**NO_EXTRA_TERMS, "use_importance_sampling_correction": True}
    got = nemo_rl_step(model, batch, sampling, config, "recomputed")
    want_model = plain_copy(reference)
    want = reference_loss(want_model, samples, Clip())
    want.backward()
    measured = agreement(got, want, model, want_model)
    assert measured.gradient > 1e-2, measured


def test_padding_to_a_multiple_changes_nothing_in_the_loss():
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference, 0, 0.7, "synthetic")
    longest = max(s.num_tokens for s in samples)
    losses = []
    for divisible_by in (1, 8, 128):
        batch, sampling = saved_batch(samples, divisible_by=divisible_by)
        width = batch["input_ids"].shape[1]
        assert width % divisible_by == 0 and width - divisible_by < longest <= width
        with torch.no_grad():
            losses.append(
                clipped_pg_loss(
                    next_token_logprobs(reference.model, batch, sampling), batch, NO_EXTRA_TERMS
                )
            )
    # The same tokens and values: only float32's summation order over a wider row changes.
    for loss in losses[1:]:
        assert abs(loss.item() - losses[0].item()) <= 1e-6 * abs(losses[0].item()), losses


def sampled_episode_rows(reference, temperature: float, top_p: float, top_k: int | None):
    """Two episodes of a leader's turns, each completion drawn from `reference` under the cut
    (callgrove's `sampling_distribution`, its samplers' own), tool tokens between turns; then
    stale sampling logprobs near the model's own, as `trainer_samples` makes them. The trained
    tokens must be ones the cut keeps: NeMo RL masks out a token its cut removed."""
    rng = np.random.default_rng(7)
    episodes = []
    for number in range(2):
        leader = Agent("L", "leader")
        tokens = rng.integers(2, VOCAB, size=6).tolist()
        for turn in range(4):
            prompt = [*tokens, *rng.integers(2, VOCAB, size=3).tolist()]  # a tool result
            completion = []
            for _ in range(8):
                with torch.no_grad():
                    logits = reference.model(input_ids=torch.tensor([prompt + completion])).logits
                log_distribution = sampling_distribution(
                    logits[0, -1:],
                    torch.tensor([temperature], dtype=torch.float64),
                    torch.tensor([top_p], dtype=torch.float64),
                    torch.tensor([top_k or 0]),
                )[0]
                completion.append(
                    int(torch.multinomial(log_distribution.exp(), 1, generator=GENERATOR))
                )
            call = Call.make(
                f"c{number}.{turn}", turn + 1, prompt, completion, np.zeros(len(completion))
            )
            call.sampling = sampling_record(temperature, top_p, top_k)
            call.advantages = rng.normal(size=len(completion))
            leader.add(call)
            tokens = prompt + completion
        episodes.append(Episode(f"e{number}", [leader], group="g", rewards={"r": float(number)}))
    episode_rows = [build_rows(episode) for episode in episodes]
    sample_near_the_model(reference, episode_rows, 0)
    return episode_rows


GENERATOR = torch.Generator().manual_seed(0)


@pytest.mark.parametrize(("top_p", "top_k"), [(0.8, None), (1.0, 20), (0.9, 30)])
def test_a_shared_cut_is_scored_under_nemo_rls_generation_config(top_p, top_k):
    reference = reference_model(torch.float64)
    episode_rows = sampled_episode_rows(reference, 0.7, top_p, top_k)
    samples = [s for s in build_samples(episode_rows) if s.num_loss_tokens]
    batch, sampling = saved_batch(samples)
    assert sampling == nemo_rl.GenerationSampling(0.7, top_p, top_k)
    with torch.no_grad():
        scored = next_token_logprobs(plain_copy(reference), batch, sampling)
    trained = batch["token_mask"][:, 1:].bool()
    assert (scored[trained] < 0).all()  # no trained token masked out by the cut

    model = plain_copy(reference)
    got = nemo_rl_step(model, batch, sampling, NO_EXTRA_TERMS, "recorded")
    want = policy_terms(reference, row_batch(episode_rows), LossSettings()).loss
    want.backward()
    measured = agreement(got, want, model, reference.model)
    assert measured.loss <= TOLERANCE and measured.gradient <= TOLERANCE, measured

    uncut = nemo_rl.GenerationSampling(0.7, 1.0, None)
    with torch.no_grad():
        ignoring_the_cut = clipped_pg_loss(
            next_token_logprobs(plain_copy(reference), batch, uncut), batch, NO_EXTRA_TERMS
        )
    assert abs(ignoring_the_cut.item() - got.item()) > 1e-3 * abs(got.item())


def test_the_batch_holds_what_clipped_pg_loss_reads(tmp_path):
    episode_rows = credited_rows()
    for call in (c for er in episode_rows for c in er.forest.calls):
        call.logprobs = -np.linspace(0.1, 2.0, len(call.completion_ids))
    samples = build_samples(episode_rows)
    path = tmp_path / "batch.pt"
    sampling = nemo_rl.write_nemo_rl(path, samples, divisible_by=16)
    batch = torch.load(path)

    assert sampling.as_config() == {"temperature": TEMPERATURE, "top_p": 1.0, "top_k": None}
    fields = {
        "input_ids": (torch.int64, 2),
        "input_lengths": (torch.int32, 1),
        "token_mask": (torch.int64, 2),
        "advantages": (torch.float32, 2),
        "generation_logprobs": (torch.float32, 2),
        "prev_logprobs": (torch.float32, 2),
        "sample_mask": (torch.float32, 1),
    }
    assert set(batch) == set(fields)
    rows, width = len(samples), batch["input_ids"].shape[1]
    assert width % 16 == 0 and width - 16 < max(s.num_tokens for s in samples)
    for name, (dtype, dims) in fields.items():
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
        for name in ("generation_logprobs", "prev_logprobs"):
            assert np.array_equal(batch[name][index, 1:][mask].numpy(), sample.logprobs[trained])
        assert np.array_equal(
            batch["advantages"][index, 1:][mask].numpy(), sample.advantages[trained]
        )
        assert not batch["token_mask"][index, length:].any()
    assert batch["sample_mask"].tolist() == [1.0] * rows


def test_refusals_name_the_row_and_call():
    episode_rows = credited_rows()
    for call in (c for er in episode_rows for c in er.forest.calls):
        call.logprobs = -np.linspace(0.1, 2.0, len(call.completion_ids))
    samples = build_samples(episode_rows)
    with pytest.raises(InputError, match="outside the model's vocabulary of 40"):
        nemo_rl.nemo_rl_arrays(samples, vocab_size=40)
    with pytest.raises(ValueError, match="divisible_by"):
        nemo_rl.nemo_rl_arrays(samples, divisible_by=0)
    first = first_loss_call(episode_rows)
    for sampling, refusal in (
        (sampling_record(0.6, 1.0), "one temperature and one top-p or top-k cut"),
        (sampling_record(1.0, 0.9), "top-p 0.9"),
        (sampling_record(1.0, 1.0, 20), "top-k 20"),
        (sampling_record(0.0, 1.0), "greedily"),
    ):
        first.sampling = sampling
        with pytest.raises(InputError, match=refusal) as refused:
            nemo_rl.nemo_rl_arrays(build_samples(episode_rows))
        assert refused.value.problem.episode == episode_rows[0].episode.id
        assert refused.value.problem.call is not None


def test_the_checker_names_the_setting_and_takes_nemo_rls_defaults():
    nemo_rl.check_nemo_rl_loss_config(NO_EXTRA_TERMS)
    with pytest.raises(ValueError, match="use_importance_sampling_correction"):
        nemo_rl.check_nemo_rl_loss_config(NO_EXTRA_TERMS, "recomputed")
    with pytest.raises(ValueError, match="force_on_policy_ratio"):
        nemo_rl.check_nemo_rl_loss_config({**NO_EXTRA_TERMS, "force_on_policy_ratio": True})
    with pytest.raises(ValueError, match="prev_logprobs is one of"):
        nemo_rl.check_nemo_rl_loss_config({}, "fresh")


def test_the_checker_knows_every_key_of_clipped_pg_loss_config():
    upstream = {*UPSTREAM_DEFAULTS, "reference_policy_kl_type"}
    upstream |= {"kl_input_clamp_value", "kl_output_clamp_value"}
    assert upstream == nemo_rl.LOSS_KEYS
    nemo_rl.check_nemo_rl_loss_config({**UPSTREAM_DEFAULTS, **NO_EXTRA_TERMS})


@pytest.mark.parametrize("prev_logprobs", nemo_rl.PREV_LOGPROBS)
def test_nemo_rls_default_kl_penalty_is_refused(prev_logprobs):
    """Its default 0.01 adds a KL term against reference logprobs the batch does not hold."""
    config = {"use_importance_sampling_correction": True}
    with pytest.raises(SettingsRefused, match=r"reference_policy_kl_penalty 0\.01 adds a KL term"):
        nemo_rl.check_nemo_rl_loss_config(config, prev_logprobs)
    with pytest.raises(SettingsRefused, match="positive_example_nll_weight"):
        nemo_rl.check_nemo_rl_loss_config(
            {**config, **NO_EXTRA_TERMS, "positive_example_nll_weight": 0.1}, prev_logprobs
        )
    nemo_rl.check_nemo_rl_loss_config({**config, **NO_EXTRA_TERMS}, prev_logprobs)
    # With use_kl_in_reward ClippedPGLossFn sets the loss's own penalty to 0.
    nemo_rl.check_nemo_rl_loss_config({**config, "use_kl_in_reward": True}, prev_logprobs)


def test_the_loss_config_is_checked_flat_or_under_loss_fn_as_the_master_config_holds_it():
    refused = {"reference_policy_kl_penalty": 0.01, "use_cispo": True}
    master = {"grpo": {"num_generations_per_prompt": 8}, "policy": {}, "loss_fn": refused}
    for config in (refused, master):
        with pytest.raises(
            SettingsRefused,
            match=r"use_cispo.*reference_policy_kl_penalty",
        ):
            nemo_rl.check_nemo_rl_loss_config(config)
    nemo_rl.check_nemo_rl_loss_config(NO_EXTRA_TERMS)
    nemo_rl.check_nemo_rl_loss_config({**master, "loss_fn": NO_EXTRA_TERMS})
    # A loss key beside loss_fn is one NeMo RL never reads.
    with pytest.raises(SettingsRefused, match="use_cispo is set outside loss_fn"):
        nemo_rl.check_nemo_rl_loss_config({"loss_fn": NO_EXTRA_TERMS, "use_cispo": True})
    with pytest.raises(SettingsRefused, match="loss_fn is list"):
        nemo_rl.check_nemo_rl_loss_config({"loss_fn": []})


def test_a_misspelt_key_is_refused_with_the_key_it_resembles():
    """NeMo RL's config keeps unknown keys (extra="allow") and trains with the defaults."""
    typo = {
        **NO_EXTRA_TERMS,
        "reference_policy_kl_penalty": 0.0,
        "use_importance_sampling_corection": True,
    }
    with pytest.raises(
        SettingsRefused,
        match=r"unknown setting use_importance_sampling_corection \(did you mean "
        r"use_importance_sampling_correction\?\)",
    ):
        nemo_rl.check_nemo_rl_loss_config(typo, "recomputed")
    with pytest.raises(
        SettingsRefused,
        match=r"unknown setting loss_fn.ratio_clip_mx \(did you mean loss_fn.ratio_clip_max\?\)",
    ):
        nemo_rl.check_nemo_rl_loss_config({"loss_fn": {**NO_EXTRA_TERMS, "ratio_clip_mx": 0.28}})
    with pytest.raises(SettingsRefused, match=r"unknown setting los_fn \(did you mean loss_fn\?\)"):
        nemo_rl.check_nemo_rl_loss_config({**NO_EXTRA_TERMS, "los_fn": {}})


def test_every_bad_setting_is_named_in_one_error():
    config = {
        "force_on_policy_ratio": True,
        "use_cispo": True,
        "disable_ppo_ratio": True,
        "ratio_clip_mx": 0.28,
    }
    with pytest.raises(SettingsRefused) as refused:
        nemo_rl.check_nemo_rl_loss_config({"loss_fn": config})
    message = str(refused.value)
    for named in (
        "ratio_clip_mx",
        "disable_ppo_ratio",
        "use_cispo",
        "force_on_policy_ratio",
        "reference_policy_kl_penalty",
    ):
        assert named in message, (named, message)
    assert refused.value.exit_code == 2  # a usage error: the config cannot be used
