"""Callgrove samples as NeMo RL's GRPO training batch, written from NeMo RL's source at commit
7ea279abfbeb698b092856d0dab61e7cf39bc909 (`nemo_rl/algorithms/loss/loss_functions.py`,
`ClippedPGLossFn` and `ClippedPGLossDataDict`, and `nemo_rl/algorithms/grpo.py`, where the train
data is built; `nemo-rl` on PyPI is an empty placeholder and the package does not install on CPU
Python 3.11).

The batch is a dict of tensors, one right-padded row per sample, every per-token tensor aligned
with `input_ids` (the loss reads each as `[:, 1:]`, next to the log-probability of the token
at that position): `input_ids` (int64), `input_lengths` (int32), `token_mask` (int64, the loss
mask: 0 on prompts, tool results and context-only calls), `advantages`, `generation_logprobs`
and `prev_logprobs` (float32; both the sampling logprobs) and `sample_mask` (float32, one per
row). Wrap it as `BatchedDataDict(batch)`. With tensor or context parallelism NeMo RL needs the
width padded to a multiple (its `policy.make_sequence_length_divisible_by`): pass it as
`divisible_by`.

The ratio. `ClippedPGLossFn` takes its PPO ratio against `prev_logprobs`, which NeMo RL's GRPO
loop recomputes with the policy before training (and it recomputes the advantages too); the
sampling logprobs (`generation_logprobs`) enter only through its importance-sampling
correction. So the ratio is the recorded one, the sampler's, in two ways, which
`check_nemo_rl_loss_config` tells apart:

- `recorded`: train this batch as it is (`policy.train`), `prev_logprobs` the sampling ones.
  The ratio is the recorded one and its clip is against the sampler, as callgrove's loss is.
- `recomputed`: `prev_logprobs` recomputed by the policy, and
  `use_importance_sampling_correction: true`, whose weight exp(prev - generation) times the
  ratio exp(current - prev) is the recorded ratio, value and gradient; but the clip is then on
  exp(current - prev), against the policy the update started from, not against the sampler.

NeMo RL scores every token under its generation config's one temperature, top-p and top-k (it
divides the logits by the temperature, then cuts top-k and top-p as vLLM does): samples whose
trained tokens were sampled under several are refused (`shared_sampling`), and the one they
share is returned for that config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from callgrove.batch.samples import NO_TOP_K, Sample
from callgrove.errors import InvalidValue
from callgrove.interop.settings_check import refuse_settings, unknown_keys
from callgrove.interop.trainer_rows import (
    check_known_sampling,
    check_vocabulary,
    refuse,
    trained_span,
)

TRAINER = "NeMo RL"
COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
# Where `prev_logprobs` come from when the loss runs (see the module's docstring).
PREV_LOGPROBS = ("recorded", "recomputed")
# `ClippedPGLossConfig`'s defaults at `COMMIT`, for the keys that decide the ratio or add a
# term of their own.
LOSS_DEFAULTS: dict[str, Any] = {
    "disable_ppo_ratio": False,
    "sequence_level_importance_ratios": False,
    "use_importance_sampling_correction": False,
    "truncated_importance_sampling_type": None,
    "truncated_importance_sampling_ratio": None,
    "truncated_importance_sampling_ratio_min": None,
    "force_on_policy_ratio": False,
    "use_cispo": False,
    "reference_policy_kl_penalty": 0.01,
    "use_kl_in_reward": False,
    "positive_example_nll_weight": 0.0,
}
# Every key of `ClippedPGLossConfig` at `COMMIT`. It is a pydantic model with extra="allow", so
# NeMo RL keeps a misspelt key and trains with the default of the one meant.
LOSS_KEYS = frozenset(
    {
        *LOSS_DEFAULTS,
        "token_level_loss",
        "ratio_clip_min",
        "ratio_clip_max",
        "ratio_clip_c",
        "reference_policy_kl_type",
        "kl_input_clamp_value",
        "kl_output_clamp_value",
        "use_on_policy_kl_approximation",
    }
)
# Where NeMo RL's master config holds the loss config.
SECTION = "loss_fn"


@dataclass(frozen=True, slots=True)
class GenerationSampling:
    """The distribution NeMo RL must score the samples under: its `policy.generation`
    `temperature`, `top_p` and `top_k` (None: no top-k cut), which it applies at training too."""

    temperature: float
    top_p: float
    top_k: int | None

    def as_config(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


def shared_sampling(samples: Sequence[Sample]) -> GenerationSampling:
    """The one (temperature, top-p, top-k) every trained token of `samples` was sampled under:
    NeMo RL scores every token under one, so samples under several are refused."""
    if not samples:
        raise InvalidValue(f"{TRAINER}: no samples")
    first: tuple[float, float, int] | None = None
    for sample in samples:
        check_known_sampling(sample, TRAINER)
        trained = sample.loss_mask.astype(bool)
        settings = np.stack(
            [
                sample.temperatures[trained].astype(np.float64),
                sample.top_p[trained].astype(np.float64),
                sample.top_k[trained].astype(np.float64),
            ],
            axis=1,
        )
        for temperature, top_p, top_k in np.unique(settings, axis=0):
            # Samples hold float32: the shortest decimal of each is what its call recorded.
            value = (float(str(np.float32(temperature))), float(str(np.float32(top_p))), int(top_k))
            if value[0] <= 0:
                raise refuse(
                    sample,
                    TRAINER,
                    f"has trained tokens sampled greedily (temperature 0), which {TRAINER} "
                    "cannot score: it divides the logits by the temperature",
                )
            if first is None:
                first = value
            elif value != first:
                raise refuse(
                    sample,
                    TRAINER,
                    f"has trained tokens sampled at {describe(value)} and others (in it or an "
                    f"earlier row) at {describe(first)}: "
                    f"{TRAINER} scores every token at one temperature and one top-p or top-k cut "
                    "(its generation config's)",
                )
    assert first is not None  # every sample trains a token (`trained_span`)
    temperature, top_p, top_k = first
    return GenerationSampling(temperature, top_p, None if top_k == NO_TOP_K else top_k)


def describe(setting: tuple[float, float, int]) -> str:
    temperature, top_p, top_k = setting
    cut = "no top-k" if top_k == NO_TOP_K else f"top-k {top_k}"
    return f"temperature {temperature:g}, top-p {top_p:g}, {cut}"


def nemo_rl_arrays(
    samples: Sequence[Sample],
    pad_token_id: int = 0,
    *,
    divisible_by: int = 1,
    vocab_size: int | None = None,
) -> tuple[dict[str, np.ndarray], GenerationSampling]:
    """The batch as numpy arrays, its width padded up to a multiple of `divisible_by`, and the
    sampling every trained token shares. With `vocab_size`, token ids outside the model's
    vocabulary are refused."""
    if divisible_by < 1:
        raise InvalidValue(f"{TRAINER}: divisible_by must be at least 1, not {divisible_by}")
    for sample in samples:
        trained_span(sample, TRAINER)
    sampling = shared_sampling(samples)
    if vocab_size is not None:
        check_vocabulary(samples, vocab_size, TRAINER)
        if not 0 <= pad_token_id < vocab_size:
            raise InvalidValue(
                f"{TRAINER}: pad_token_id {pad_token_id} is outside the vocabulary of {vocab_size}"
            )
    rows = len(samples)
    longest = max(sample.num_tokens for sample in samples)
    width = -(-longest // divisible_by) * divisible_by
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
    batch["prev_logprobs"] = batch["generation_logprobs"].copy()
    routes = nemo_rl_routes(samples, width)
    if routes is not None:
        batch["routed_experts"] = routes
    return batch, sampling


def nemo_rl_routes(samples: Sequence[Sample], width: int) -> np.ndarray | None:
    """A mixture of experts' routes as NeMo RL's Megatron policy replays them (`routed_experts`,
    (rows, width, layers, k) on `input_ids`' positions, right-padded; nemo_rl/models/megatron/
    router_replay.py): a token without a route keeps all -1, NeMo RL's own mark for one its
    router routes (a row's last token), and padding holds experts 0..k-1 as its vLLM path
    fills it. None when no sample carries routes. Replay with `policy.router_replay.enabled`."""
    if all(s.routes is None for s in samples):
        return None
    layers, k = next(s.routes.shape[1:] for s in samples if s.routes is not None)
    out = np.broadcast_to(np.arange(k, dtype=np.int16), (len(samples), width, layers, k)).copy()
    for index, sample in enumerate(samples):
        if sample.routes is None:
            raise refuse(sample, TRAINER, "has no routes where the batch's others have")
        out[index, : len(sample.routes)] = sample.routes
    return out


def write_nemo_rl(
    path: str | Path,
    samples: Sequence[Sample],
    pad_token_id: int = 0,
    *,
    divisible_by: int = 1,
    vocab_size: int | None = None,
) -> GenerationSampling:
    """The batch as torch tensors saved with `torch.save` at `path` (load it with
    `BatchedDataDict(torch.load(path))`); returns the sampling to generate and score under
    (`policy.generation`: `.as_config()`)."""
    import torch

    batch, sampling = nemo_rl_arrays(
        samples, pad_token_id, divisible_by=divisible_by, vocab_size=vocab_size
    )
    torch.save({name: torch.from_numpy(array) for name, array in batch.items()}, path)
    return sampling


def check_nemo_rl_loss_config(config: Mapping[str, Any], prev_logprobs: str = "recorded") -> None:
    """Refuse a `ClippedPGLossFn` config under which its loss is not the clipped ratio against
    the sampler, with `prev_logprobs` `recorded` (the batch as written) or `recomputed` (by the
    policy, as NeMo RL's GRPO loop does). `config` is the loss config (a dict; absent keys
    take NeMo RL's defaults) or NeMo RL's master config, which holds it under `loss_fn`.

    Refused, all named at once: keys `ClippedPGLossConfig` does not have (NeMo RL would keep
    them and train with the defaults), the ratio settings the module docstring names, and the
    terms callgrove's loss does not have: `reference_policy_kl_penalty` other than 0 (its
    default 0.01 adds a KL term that reads `reference_policy_logprobs`, which the batch does
    not hold; `use_kl_in_reward` moves it out of the loss) and `positive_example_nll_weight`
    other than 0."""
    if prev_logprobs not in PREV_LOGPROBS:
        raise InvalidValue(
            f"{TRAINER}: prev_logprobs is one of {PREV_LOGPROBS}, not {prev_logprobs!r}"
        )
    loss, problems = loss_section(config)
    setting = {**LOSS_DEFAULTS, **loss}
    problems += ratio_problems(setting, prev_logprobs) + term_problems(setting)
    refuse_settings(
        f"{TRAINER}: with {prev_logprobs} prev_logprobs this loss config does not train the "
        "recorded ratio",
        problems,
    )


def loss_section(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[str]]:
    """The loss config in `config`, flat or under `loss_fn`, and a problem for each key there
    that `ClippedPGLossConfig` does not have (and each loss key left outside `loss_fn`, which
    NeMo RL would not read)."""
    if SECTION not in config:
        return config, unknown_keys(config, LOSS_KEYS | {SECTION})
    loss = config[SECTION]
    if not isinstance(loss, Mapping):
        return {}, [f"{SECTION} is {type(loss).__name__}, not the loss config's mapping"]
    outside = [
        f"{key} is set outside {SECTION}, where NeMo RL does not read it"
        for key in config
        if key in LOSS_KEYS
    ]
    return loss, outside + unknown_keys(loss, LOSS_KEYS, f"{SECTION}.")


def ratio_problems(setting: Mapping[str, Any], prev_logprobs: str) -> list[str]:
    """Why the ratio under `setting` (defaults filled in) is not the recorded one."""
    problems = []
    if setting["disable_ppo_ratio"]:
        problems.append("disable_ppo_ratio trains -A x logprob (REINFORCE), with no ratio")
    if setting["use_cispo"]:
        problems.append("use_cispo weighs the logprob by a detached clipped ratio (CISPO)")
    if setting["sequence_level_importance_ratios"]:
        problems.append(
            "sequence_level_importance_ratios gives each sequence one ratio (GSPO), not each token"
        )
    truncation = setting["truncated_importance_sampling_type"]
    if prev_logprobs == "recorded":
        if setting["force_on_policy_ratio"]:
            problems.append(
                "force_on_policy_ratio replaces prev_logprobs by the current ones (ratio 1)"
            )
        if truncation is not None and not truncation_keeps_one(setting):
            problems.append(
                f"{truncation} truncation bounds exclude 1, the importance weight of recorded "
                "prev_logprobs"
            )
    else:
        if not setting["use_importance_sampling_correction"]:
            problems.append(
                "without use_importance_sampling_correction the ratio is against the recomputed "
                "prev_logprobs (1 at the first update), not the sampler"
            )
        if truncation is not None:
            problems.append(
                f"truncated_importance_sampling_type {truncation} truncates the recorded ratio"
            )
    return problems


def term_problems(setting: Mapping[str, Any]) -> list[str]:
    """The terms `setting` adds to the clipped loss, which callgrove's loss does not have."""
    problems = []
    penalty = setting["reference_policy_kl_penalty"]
    # ClippedPGLossFn zeroes the loss's penalty itself when the KL goes into the reward.
    if penalty != 0 and not setting["use_kl_in_reward"]:
        problems.append(
            f"reference_policy_kl_penalty {penalty} adds a KL term against "
            "reference_policy_logprobs, which the batch does not hold: set it to 0"
        )
    if setting["positive_example_nll_weight"] != 0:
        problems.append(
            "positive_example_nll_weight adds an NLL term on positive examples: set it to 0"
        )
    return problems


def truncation_keeps_one(setting: Mapping[str, Any]) -> bool:
    """Whether a truncated importance-sampling setting leaves a weight of exactly 1 as it is."""
    high = setting["truncated_importance_sampling_ratio"]
    low = setting["truncated_importance_sampling_ratio_min"]
    low = 0.0 if low is None else low
    return high is not None and low <= 1.0 <= high
