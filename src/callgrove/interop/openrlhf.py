"""Callgrove samples as the `Experience` OpenRLHF 0.11.2's actor trains on (installed without its
dependencies, see the Makefile: its wheel pins deepspeed, flash-attn, ray and transformers
releases a CPU venv cannot take), with callgrove's advantages used as they are.

What the actor's policy loss reads (`ActorPPOTrainer.training_step` in
openrlhf/trainer/ray/ppo_actor.py): `sequences`, `attention_mask` and `action_mask` for the
forward (`Actor.forward` in openrlhf/models/actor.py), `action_log_probs` as the old policy,
`advantages`, and `rollout_log_probs` (read only by its train / rollout mismatch correction).
OpenRLHF lays a rollout out whole, with no prompt / completion split
(`_process_response_into_experience` in openrlhf/trainer/ppo_utils/samples_generator.py):
one right-padded row per sample, `sequences` (B, T) and `attention_mask` (1 on every real
token, holes included), and the per-action fields (B, T - 1) shifted by one token, entry t
being token t + 1's: `action_mask` (the loss mask: 0 on the prompt, holes such as tool
results and context-only calls, and padding), `action_log_probs` and `rollout_log_probs` (the
sampling logprobs), `advantages` and `returns` (callgrove's, per token). Per sample: `rewards`
(the row reward), `response_length` (first to last trained token) and `total_length` (real
tokens; OpenRLHF's dynamic batching balances on it). A row ends at its last trained token
(later tokens change no trained token's probability).

Hand the experience to the actor's replay buffer (`PolicyModelActor.append`, which splits it
into samples and strips their padding as OpenRLHF's own experiences are), not to OpenRLHF's
experience maker: that recomputes `action_log_probs` with the training policy and runs its
advantage estimator. With `action_log_probs` the sampling logprobs, the importance ratio is
taken against the policy that sampled each token, as in callgrove's own loss, and the
mismatch correction sees identical train and rollout logprobs, so its weights are 1.

OpenRLHF scores every token at one temperature (`--rollout.temperature`, which its actor
divides the logits by) and with no top-p or top-k cut, so samples sampled otherwise are
refused (`trainer_rows`); `check_openrlhf_args` refuses the settings that would make its loss
anything but the clipped ratio loss on these samples (see its docstring).
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from callgrove.batch.samples import Sample
from callgrove.interop.settings_check import refuse_settings, unknown_keys
from callgrove.interop.trainer_rows import (
    check_vocabulary,
    refuse_routes,
    shared_temperature,
    trained_span,
)

TRAINER = "OpenRLHF"
VERSION = "0.11.2"
PER_ACTION = ("action_mask", "action_log_probs", "rollout_log_probs", "advantages", "returns")
# Every argument of `train_ppo_ray`'s parser at `VERSION` (openrlhf/cli/train_ppo_ray.py), by
# section: its dest names, dotted as `parse_args()` holds them and `hierarchize` nests them.
_ARGUMENTS_BY_SECTION = {
    "": "local_rank use_ms",
    "actor": "adam.betas adam.eps adam.lr adam.weight_decay aux_loss_coef dual_clip "
    "entropy_coef eps_clip eps_clip_low_high freeze_visual_encoder gradient_checkpointing_enable "
    "gradient_checkpointing_reentrant loss_agg_mode lr_scheduler lr_warmup_ratio max_norm "
    "min_lr_ratio model_name_or_path muon.lr muon.momentum muon.nesterov muon.ns_steps "
    "num_gpus_per_node num_nodes optim policy_loss_type",
    "algo": "advantage.estimator advantage.gamma advantage.is_correction_gating "
    "advantage.is_correction_level advantage.is_correction_mode "
    "advantage.is_correction_threshold advantage.lambd advantage.no_std_norm "
    "dynamic_filtering_enable dynamic_filtering_range kl.estimator kl.horizon kl.init_coef "
    "kl.target kl.unbiased_gradient kl.use_loss",
    "ckpt": "best_metric_key disable_ds load_enable max_mem max_num output_dir path save_hf "
    "save_steps",
    "critic": "adam.betas adam.eps adam.lr adam.weight_decay freezing_steps lr_scheduler "
    "lr_warmup_ratio max_norm min_lr_ratio model_name_or_path muon.lr muon.momentum "
    "muon.nesterov muon.ns_steps num_gpus_per_node num_nodes optim save_value_network "
    "value_clip",
    "data": "apply_chat_template dataloader_num_workers disable_fast_tokenizer image_key "
    "input_key input_template label_key max_images_per_prompt max_len max_samples "
    "prompt_dataset prompt_probs prompt_split",
    "ds": "adam_offload attn_implementation deepcompile enable_sleep experts_implementation "
    "grad_accum_dtype load_in_4bit lora.alpha lora.dropout lora.rank lora.target_modules "
    "overlap_comm packing_samples param_dtype ring_attn_head_stride ring_attn_size "
    "tensor_parallel_size use_liger_kernel use_universal_ckpt value_head_prefix zero_stage zpg",
    "eval": "dataset n_samples_per_prompt split steps temperature",
    "logger": "logging_steps tensorboard_dir wandb.group wandb.key wandb.org wandb.project "
    "wandb.run_name",
    "ref": "num_gpus_per_node num_nodes offload",
    "reward": "clip_range model_name_or_path normalize_enable num_gpus_per_node num_nodes "
    "offload overlong_buffer_len overlong_penalty_factor remote_url stop_properly_penalty_coef",
    "rollout": "batch_size max_new_tokens max_tokens_per_gpu micro_batch_size "
    "n_samples_per_prompt temperature top_p vllm_generate_batch_size",
    "train": "agent_func_path async_enable async_queue_size batch_size colocate_actor_ref "
    "colocate_all colocate_critic_reward dynamic_batch_enable ema_beta enable_ema "
    "full_determinism_enable max_epochs max_tokens_per_gpu micro_batch_size num_episodes "
    "partial_rollout_enable seed",
    "vllm": "enable_prefix_caching enable_sleep enforce_eager gpu_memory_utilization "
    "num_engines sync_backend sync_with_ray tensor_parallel_size",
}
ARGUMENTS = frozenset(
    f"{section}.{name}" if section else name
    for section, names in _ARGUMENTS_BY_SECTION.items()
    for name in names.split()
)


def openrlhf_arrays(
    samples: Sequence[Sample], pad_token_id: int = 0, *, vocab_size: int | None = None
) -> tuple[dict[str, np.ndarray], float]:
    """The experience's tensors as numpy arrays (the module docstring lists them), and the
    one temperature every trained token was sampled at (set `--rollout.temperature` to it).
    With `vocab_size`, token ids outside the model's vocabulary are refused."""
    refuse_routes(samples, TRAINER)
    ends = [trained_span(sample, TRAINER).end for sample in samples]
    temperature = shared_temperature(samples, TRAINER)
    if vocab_size is not None:
        check_vocabulary(samples, vocab_size, TRAINER)
    rows, width = len(samples), max(ends)
    arrays = {
        "sequences": np.full((rows, width), pad_token_id, dtype=np.int64),
        "attention_mask": np.zeros((rows, width), dtype=np.int64),
        # OpenRLHF's own producer builds the action mask as int64 (zeros_like the attention mask)
        "action_mask": np.zeros((rows, width - 1), dtype=np.int64),
        "action_log_probs": np.zeros((rows, width - 1), dtype=np.float32),
        "rollout_log_probs": np.zeros((rows, width - 1), dtype=np.float32),
        "advantages": np.zeros((rows, width - 1), dtype=np.float32),
        "returns": np.zeros((rows, width - 1), dtype=np.float32),
        "rewards": np.array([sample.reward for sample in samples], dtype=np.float32),
        "response_length": np.zeros(rows, dtype=np.int64),
        "total_length": np.array(ends, dtype=np.float32),
    }
    for index, (sample, end) in enumerate(zip(samples, ends, strict=True)):
        arrays["sequences"][index, :end] = sample.token_ids[:end]
        arrays["attention_mask"][index, :end] = 1
        # entry t of a per-action field belongs to token t + 1 (the token logits t predict)
        actions = slice(1, end)
        arrays["action_mask"][index, : end - 1] = sample.loss_mask[actions]
        for name in ("action_log_probs", "rollout_log_probs"):
            arrays[name][index, : end - 1] = sample.logprobs[actions]
        for name in ("advantages", "returns"):
            arrays[name][index, : end - 1] = sample.advantages[actions]
        trained = np.flatnonzero(sample.loss_mask)
        arrays["response_length"][index] = trained[-1] - trained[0] + 1
    return arrays, temperature


def to_experience(
    samples: Sequence[Sample], pad_token_id: int = 0, *, vocab_size: int | None = None
) -> Any:
    """The samples as one OpenRLHF `Experience` (openrlhf.trainer.ppo_utils.experience), one
    row per sample (see the module docstring); its `info` holds each row's reward, as
    OpenRLHF's own experiences do, for its logging."""
    import torch
    from openrlhf.trainer.ppo_utils.experience import Experience

    arrays, _ = openrlhf_arrays(samples, pad_token_id, vocab_size=vocab_size)
    tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
    return Experience(**tensors, info={"reward": tensors["rewards"].clone()})


def check_openrlhf_args(args: Any, samples: Sequence[Sample]) -> None:
    """Refuse OpenRLHF settings (`train_ppo_ray`'s arguments: nested, as its `hierarchize` makes
    them, a namespace or a mapping with `actor`, `rollout`, `algo`; or flat, as `parse_args()`
    gives them, dotted names such as `rollout.temperature`, in a namespace or a dict) under
    which the actor's loss on these samples is not the clipped importance-ratio loss against
    their sampling logprobs, naming every one:

    - a name `train_ppo_ray` does not have (`ARGUMENTS`), or one given both nested and flat;
    - `rollout.temperature` other than the samples': the actor divides its logits by it;
    - `actor.policy_loss_type` other than `ppo` (GSPO takes one ratio per sequence);
    - `actor.entropy_coef` other than unset or 0, `actor.aux_loss_coef` above OpenRLHF's
      1e-8 threshold, and `algo.kl.use_loss` with `algo.kl.init_coef` > 0: terms the
      clipped loss does not have (the KL loss also reads reference logprobs the experience
      does not carry);
    - a train / rollout correction (`algo.advantage.is_correction_level` other than `off`)
      whose band drops identical policies (a `ratio` gate whose band leaves out 1): the
      experience's train and rollout logprobs are the same, every other gate keeps weight 1.

    `actor.eps_clip_low_high` (or `actor.eps_clip`), `actor.dual_clip` and
    `actor.loss_agg_mode` (`token-mean`: over every trained token; `seq-mean-token-mean`: per
    sequence, then over sequences) are the loss's own settings; packing, dynamic batching and
    micro-batch sizes leave it unchanged."""
    temperature = shared_temperature(samples, TRAINER)
    setting, problems = _dotted(args)
    problems += unknown_keys(setting, ARGUMENTS)
    problems += _loss_problems(setting, temperature)
    refuse_settings(TRAINER, problems)


def _loss_problems(setting: Mapping[str, Any], temperature: float) -> list[str]:
    """Why the actor's loss under `setting` (dotted names; absent ones take OpenRLHF's
    defaults) is not the clipped ratio on samples sampled at `temperature`."""
    problems = []
    scored_at = setting.get("rollout.temperature", 1.0)
    if np.float32(scored_at) != np.float32(temperature):
        problems.append(
            f"rollout.temperature is {scored_at:g} but the samples were sampled at "
            f"{temperature:g} (the actor divides its logits by it): set it to {temperature:g}"
        )
    loss_type = setting.get("actor.policy_loss_type", "ppo")
    if loss_type != "ppo":
        problems.append(
            f"actor.policy_loss_type is {loss_type!r}: only 'ppo' takes the importance ratio "
            "per token"
        )
    if setting.get("actor.entropy_coef") not in (None, 0, 0.0):
        problems.append("actor.entropy_coef adds an entropy term: leave it unset or 0")
    if setting.get("actor.aux_loss_coef", 0) > 1e-8:
        problems.append("actor.aux_loss_coef adds the MoE balancing loss: set it to 0")
    if setting.get("algo.kl.use_loss", False) and setting.get("algo.kl.init_coef", 0.01) > 0:
        problems.append(
            "algo.kl.use_loss with algo.kl.init_coef > 0 adds a KL loss (against reference "
            "logprobs the experience does not carry): turn it off or set the coefficient to 0"
        )
    if setting.get("algo.advantage.is_correction_level", "off") != "off":
        gate = setting.get("algo.advantage.is_correction_gating", "ratio")
        bounds = list(setting.get("algo.advantage.is_correction_threshold", (0.5, 5.0)))
        # train_ppo_ray reads a single value as an upper bound (parse_args() keeps it single)
        low, high = [0.0, *bounds] if len(bounds) == 1 else bounds
        identical = 1.0 if gate == "ratio" else 0.0  # the gated statistic of identical policies
        if not low <= identical <= high:
            problems.append(
                f"algo.advantage.is_correction_threshold [{low:g}, {high:g}] leaves out "
                f"{identical:g}, the {gate} gate's value where train and rollout logprobs "
                "agree, as they do on these samples: every token would be dropped or reweighted"
            )
    return problems


# What holds a section of settings, nested: `hierarchize`'s namespaces, or mappings.
_SECTIONS = (Mapping, SimpleNamespace, Namespace)


def _dotted(args: Any, prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """Every setting in `args` under its dotted name, nested or flat alike, and a problem for
    each name given twice (once nested, once dotted)."""
    items = args.items() if isinstance(args, Mapping) else vars(args).items()
    setting: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, _SECTIONS):
            found, twice = _dotted(value, f"{name}.")
            problems += twice
        else:
            found = {name: value}
        for dotted, inner in found.items():
            if dotted in setting:
                problems.append(f"{dotted} is given twice, nested and dotted")
            setting[dotted] = inner
    return setting, problems
