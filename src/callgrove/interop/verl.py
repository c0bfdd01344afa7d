"""Callgrove samples as a verl `DataProto` (verl 0.9.1; installed without its dependencies, see
the Makefile), with callgrove's advantages used as they are.

One batch row per sample, split as verl's rollout lays a row out: `prompts` (left-padded) are
the tokens before the first trained one, `responses` (right-padded) run from there to the
last trained token. Tensors: `prompts`, `responses`, `input_ids` (both, concatenated),
`attention_mask` (1 on every real token, holes included), `position_ids` (0, 1, ... from the
first real token, 0 on left padding, as verl computes them), `response_mask` (the loss mask:
0 on holes such as tool results and context-only calls), `advantages` and `returns` (per
response token, callgrove's), `rollout_log_probs` and `old_log_probs` (the sampling logprobs:
the ratio is taken against the policy that sampled each token, as in callgrove's own loss),
`token_level_scores` and `token_level_rewards` (the row reward at the last response token).
`non_tensor_batch`: `uid` (the group, or the episode where it has none), `episode`, `row`.

Hand the batch to the actor's update (`RayPPOTrainer._update_actor`, or the actor worker
group's `update_actor` on `batch.to_tensordict()` after `left_right_2_no_padding`), whose
`ppo_loss` (verl/workers/utils/losses.py) reads `old_log_probs` and `advantages` as given. Not
to `RayPPOTrainer.fit`: it recomputes `old_log_probs` with the training policy (unless
`algorithm.rollout_correction.bypass_mode`) and runs verl's advantage estimator.
`_update_actor` sets `meta_info["temperature"]` from `actor_rollout_ref.rollout.temperature`
over what the batch carries, and the actor divides its logits by it: `check_verl_config`
refuses a config whose temperature is not the samples', and the other settings under which
the actor's loss is not the clipped importance-ratio loss on these samples. verl scores
tokens at that one temperature with no top-p or top-k cut, so samples sampled otherwise are
refused (`trainer_rows`). Its vanilla policy loss also bounds a negative advantage's term by
`clip_ratio_c` x |A| (dual clip, 3 by default), which callgrove's own loss does not: the two
agree where no ratio exceeds `clip_ratio_c` (set it out of reach to train as callgrove does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from callgrove.batch.samples import Sample
from callgrove.interop.settings_check import refuse_settings, unknown_keys
from callgrove.interop.trainer_rows import (
    check_vocabulary,
    prompt_completion,
    refuse,
    shared_temperature,
    trained_span,
)

TRAINER = "verl"
# verl's loss_agg_mode values that are callgrove's normalisations (`token`, `sequence`); its
# others sum tokens instead of averaging them.
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean")
# The keys verl 0.9.1 knows in each section `check_verl_config` reads, by its place in
# `actor_rollout_ref` (or in the whole config, for `distillation`): the fields of its config
# dataclasses (verl/workers/config/actor.py, every actor strategy's; rollout.py;
# distillation.py; RolloutCorrectionConfig in verl/trainer/config/algorithm.py) and
# `_target_`. A misspelt key would leave verl's default in force, unchecked.
_KNOWN_NAMES = {
    "": "actor hybrid_engine model nccl_timeout ref rollout",
    "actor.": (
        "_target_ calculate_entropy calculate_sum_pi_squared checkpoint clip_ratio clip_ratio_c "
        "clip_ratio_high clip_ratio_low data_loader_seed engine entropy_checkpointing "
        "entropy_coeff entropy_from_logits_chunk_size entropy_from_logits_with_chunking "
        "freeze_vision_tower fsdp_config global_batch_info grad_clip kl_loss_coef kl_loss_type "
        "loss_agg_mode loss_scale_factor megatron model_config optim pad_to_length policy_loss "
        "ppo_epochs ppo_infer_max_token_len_per_gpu ppo_infer_micro_batch_size_per_gpu "
        "ppo_max_token_len_per_gpu ppo_micro_batch_size ppo_micro_batch_size_per_gpu "
        "ppo_mini_batch_size profile profiler qat rollout_n shuffle strategy tau_neg tau_pos "
        "torchtitan ulysses_sequence_parallel_size use_dynamic_bsz use_fused_kernels "
        "use_kl_loss use_prefix_grouper use_remove_padding use_rollout_log_probs "
        "use_torch_compile veomni"
    ),
    "actor.policy_loss.": (
        "_target_ clip_cov_lb clip_cov_ratio clip_cov_ub dro_beta kl_cov_ratio loss_mode "
        "ppo_kl_coef rollout_correction"
    ),
    "actor.policy_loss.rollout_correction.": (
        "_target_ bypass_mode loss_type rollout_is rollout_is_batch_normalize "
        "rollout_is_threshold rollout_rs rollout_rs_threshold"
    ),
    "rollout.": (
        "_target_ agent calculate_log_probs checkpoint_engine checkpoint_manager_class "
        "cudagraph_capture_sizes custom data_parallel_size disable_log_stats disaggregation "
        "do_sample dtype enable_chunked_prefill enable_prefix_caching "
        "enable_rollout_routing_replay enable_sleep_mode enforce_eager engine_kwargs "
        "expert_parallel_size free_cache_engine full_determinism gpu_memory_utilization "
        "ignore_eos layer_name_map layered_summon limit_images load_format "
        "log_prob_max_token_len_per_gpu log_prob_micro_batch_size "
        "log_prob_micro_batch_size_per_gpu log_prob_use_dynamic_bsz logprobs_mode "
        "max_model_len max_num_batched_tokens max_num_seqs mode "
        "moe_load_balance_metrics_interval moe_tensor_parallel_size mtp multi_stage_wake_up "
        "multi_turn n n_gpus_per_node name nnodes over_sample_rate "
        "pipeline_model_parallel_size profiler prometheus prompt_length qat quantization "
        "quantization_config_file repetition_penalty response_length router_config_path "
        "scheduling_policy seed server sglang_engine_mode skip_tokenizer_init "
        "standalone_gpu_memory_utilization temperature tensor_model_parallel_size top_k top_p "
        "trace val_kwargs"
    ),
    "distillation.": (
        "_target_ distillation_loss enabled n_gpus_per_node nnodes teacher_key teacher_models"
    ),
}
KNOWN_KEYS = {prefix: frozenset(names.split()) for prefix, names in _KNOWN_NAMES.items()}


def verl_arrays(
    samples: Sequence[Sample], pad_token_id: int, *, vocab_size: int | None = None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], float]:
    """The tensors and non-tensors of the batch as numpy arrays, and the one temperature every
    trained token was sampled at (set verl's rollout temperature to it). With `vocab_size`,
    token ids outside the model's vocabulary are refused."""
    split = prompt_completion(samples, pad_token_id, TRAINER)
    temperature = shared_temperature(samples, TRAINER)
    if vocab_size is not None:
        check_vocabulary(samples, vocab_size, TRAINER)
    prompts, responses = split.prompt_ids, split.completion_ids
    advantages, logprobs = split.advantages, split.logprobs
    scores = np.zeros_like(advantages)  # the reward at each row's last response token
    scores[np.arange(len(samples)), split.widths - 1] = [sample.reward for sample in samples]
    attention_mask = np.concatenate([split.prompt_mask, split.completion_mask], axis=1)
    position_ids = np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": split.loss_mask,
        "advantages": advantages,
        "returns": advantages,
        "rollout_log_probs": logprobs,
        "old_log_probs": logprobs,
        "token_level_scores": scores,
        "token_level_rewards": scores,
    }
    routes = verl_routes(samples, prompts.shape[1], responses.shape[1])
    if routes is not None:
        tensors["routed_experts"] = routes
    non_tensors = {
        "uid": np.array([s.group if s.group is not None else s.episode for s in samples], object),
        "episode": np.array([s.episode for s in samples], object),
        "row": np.array([s.row for s in samples], dtype=np.int64),
    }
    return tensors, non_tensors, temperature


def verl_routes(
    samples: Sequence[Sample], prompt_width: int, response_width: int
) -> np.ndarray | None:
    """A mixture of experts' routes as verl's actor replays them (`routed_experts`, int16
    (rows, prompt + response width, layers, k), on `input_ids`' positions; 0 on padding and on
    a token with none, which verl's replay leaves to the router: its Megatron actor replays
    every token but a row's last, its VeOmni actor routes a row of one repeated expert
    natively; verl/utils/megatron/router_replay_utils.py, verl/utils/veomni/router_replay.py).
    None when no sample carries routes. The actor replays with
    `actor_rollout_ref.actor.{megatron,veomni}.router_replay.mode: R3`."""
    if all(s.routes is None for s in samples):
        return None
    shape = next(s.routes.shape[1:] for s in samples if s.routes is not None)
    out = np.zeros((len(samples), prompt_width + response_width, *shape), dtype=np.int16)
    for index, sample in enumerate(samples):
        if sample.routes is None:
            raise refuse(sample, TRAINER, "has no routes where the batch's others have")
        span = trained_span(sample, TRAINER)
        kept = sample.routes[: span.end]
        first = prompt_width - span.start
        out[index, first : first + span.end] = np.where(kept < 0, 0, kept)
    return out


def to_data_proto(
    samples: Sequence[Sample], pad_token_id: int, *, vocab_size: int | None = None, **meta_info: Any
) -> Any:
    """The samples as a `verl.DataProto` (see the module docstring); `meta_info` is passed on,
    with `temperature` set to the one the samples were sampled at."""
    import torch
    from verl import DataProto

    tensors, non_tensors, temperature = verl_arrays(samples, pad_token_id, vocab_size=vocab_size)
    return DataProto.from_dict(
        tensors={name: torch.from_numpy(array.copy()) for name, array in tensors.items()},
        non_tensors=non_tensors,
        meta_info={"temperature": temperature, **meta_info},
    )


def check_verl_config(config: Any, samples: Sequence[Sample]) -> None:
    """Refuse a verl config (its `actor_rollout_ref` section, or the whole trainer config; an
    omegaconf config or a mapping) under which the actor's update on these samples' batch is
    not the clipped importance-ratio loss against their sampling logprobs:

    - `rollout.temperature` other than the samples': `_update_actor` puts it in the batch's
      `meta_info` and the actor divides its logits by it;
    - `actor.policy_loss.loss_mode` other than `vanilla` (or `bypass_mode` with `ppo_clip`
      and no rejection sampling, which runs the vanilla loss unchanged);
    - `actor.loss_agg_mode` other than `token-mean` (callgrove's `token` normalisation) or
      `seq-mean-token-mean` (its `sequence` one);
    - `actor.entropy_coeff` other than 0, `actor.use_kl_loss`, and (in a whole config)
      `distillation.enabled`: terms the clipped loss does not have (the KL loss also reads
      reference logprobs the batch does not carry);
    - a key verl does not know (`KNOWN_KEYS`) in the sections read here.

    Every refusal is named in one error.

    `actor.clip_ratio_low` / `clip_ratio_high` and `clip_ratio_c` (the dual clip) are the
    loss's own settings; micro-batching, dynamic batch sizes, remove-padding and sequence
    parallelism leave it unchanged (the loss is normalised over the whole mini-batch)."""
    temperature = shared_temperature(samples, TRAINER)
    section = _get(config, "actor_rollout_ref", None)
    whole = section is not None
    section = config if section is None else section
    actor, rollout = _get(section, "actor", {}), _get(section, "rollout", {})
    policy_loss = _get(actor, "policy_loss", {})
    sections = {
        "": section,
        "actor.": actor,
        "actor.policy_loss.": policy_loss,
        "actor.policy_loss.rollout_correction.": _get(policy_loss, "rollout_correction", {}),
        "rollout.": rollout,
    }
    if whole:
        sections["distillation."] = _get(config, "distillation", {})
    problems = _unknown_keys(sections)
    scored_at = _get(rollout, "temperature", 1.0)
    if np.float32(scored_at) != np.float32(temperature):
        problems.append(
            f"rollout.temperature is {scored_at:g} but the samples were sampled at "
            f"{temperature:g} (the actor update takes it over the batch's own): set it to "
            f"{temperature:g}"
        )
    loss_mode = _get(policy_loss, "loss_mode", "vanilla")
    if loss_mode == "bypass_mode":
        correction = _get(policy_loss, "rollout_correction", {})
        if _get(correction, "loss_type", "ppo_clip") != "ppo_clip":
            problems.append("bypass_mode's loss_type 'reinforce' is not the clipped loss")
        if _get(correction, "rollout_rs", None) is not None:
            problems.append("bypass_mode's rejection sampling (rollout_rs) drops tokens")
    elif loss_mode != "vanilla":
        problems.append(
            f"actor.policy_loss.loss_mode is {loss_mode!r}: only 'vanilla' is the clipped "
            "importance-ratio loss"
        )
    loss_agg_mode = _get(actor, "loss_agg_mode", "token-mean")
    if loss_agg_mode not in LOSS_AGG_MODES:
        problems.append(
            f"actor.loss_agg_mode is {loss_agg_mode!r}: 'token-mean' (callgrove's token "
            "normalisation) or 'seq-mean-token-mean' (its sequence one)"
        )
    if _get(actor, "entropy_coeff", 0) != 0:
        problems.append("actor.entropy_coeff adds an entropy term: set it to 0")
    if _get(actor, "use_kl_loss", False):
        problems.append(
            "actor.use_kl_loss adds a KL term against reference logprobs the batch does not "
            "carry: turn it off"
        )
    if whole and _get(_get(config, "distillation", {}), "enabled", False):
        problems.append("distillation.enabled replaces the actor's loss with a distillation one")
    refuse_settings(TRAINER, problems)


def _unknown_keys(sections: Mapping[str, Any]) -> list[str]:
    """A problem for each key verl does not know in `sections`, keyed by their `KNOWN_KEYS`
    prefix."""
    problems = []
    for prefix, held in sections.items():
        known = KNOWN_KEYS[prefix]
        if not prefix:  # a whole config whose actor_rollout_ref is misspelt reads as the section
            known |= {"actor_rollout_ref"}
        problems += unknown_keys(_keys(held), known, prefix)
    return problems


def _keys(section: Any) -> list[str]:
    """The keys of an omegaconf config, a mapping (verl's config dataclasses are ones) or an
    attribute namespace."""
    if section is None:
        return []
    if isinstance(section, Mapping) or hasattr(section, "keys"):
        return [str(key) for key in section]
    return list(vars(section))


def _get(section: Any, name: str, default: Any = None) -> Any:
    """A key of an omegaconf config, a mapping or an attribute namespace, or `default`."""
    if section is None:
        return default
    if isinstance(section, Mapping) or hasattr(section, "get"):
        return section.get(name, default)
    return getattr(section, name, default)
