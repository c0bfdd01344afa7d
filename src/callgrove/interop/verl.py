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

verl's own advantage estimator must not run on this batch: hand it to the actor's policy
update (whose loss reads `advantages` as given), not to a trainer step that recomputes them.
verl scores tokens at one temperature (its rollout config's) and with no top-p or top-k cut,
so samples sampled otherwise are refused (`trainer_rows`). Its vanilla policy loss also
applies dual clipping (`clip_ratio_c`, 3 by default) to negative advantages, which callgrove's
loss does not; the two agree where no ratio exceeds `clip_ratio_c`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from callgrove.batch.samples import Sample
from callgrove.interop.trainer_rows import prompt_completion, shared_temperature

TRAINER = "verl"


def verl_arrays(
    samples: Sequence[Sample], pad_token_id: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], float]:
    """The tensors and non-tensors of the batch as numpy arrays, and the one temperature every
    trained token was sampled at (set verl's rollout temperature to it)."""
    split = prompt_completion(samples, pad_token_id, TRAINER)
    temperature = shared_temperature(samples, TRAINER)
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
    non_tensors = {
        "uid": np.array([s.group if s.group is not None else s.episode for s in samples], object),
        "episode": np.array([s.episode for s in samples], object),
        "row": np.array([s.row for s in samples], dtype=np.int64),
    }
    return tensors, non_tensors, temperature


def to_data_proto(samples: Sequence[Sample], pad_token_id: int, **meta_info: Any) -> Any:
    """The samples as a `verl.DataProto` (see the module docstring); `meta_info` is passed on,
    with `temperature` set to the one the samples were sampled at."""
    import torch
    from verl import DataProto

    tensors, non_tensors, temperature = verl_arrays(samples, pad_token_id)
    return DataProto.from_dict(
        tensors={name: torch.from_numpy(array.copy()) for name, array in tensors.items()},
        non_tensors=non_tensors,
        meta_info={"temperature": temperature, **meta_info},
    )
