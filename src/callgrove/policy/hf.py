"""A Hugging Face causal LM as a policy: its sampler, its chat-template renderer, and the backend
that `model = "hf:PATH"` or `model = "smollm2-135m"` builds (learner, sampler, renderer).

The sampler is the reference sampler's queue (calls made at the same moment decode together,
rounds run whole on one version, new weights load between rounds) over the HF decoder
(`callgrove.train.hf_decode`: KV cache, temperature and top-p with no hidden top-k, stop
strings, logprobs from the logits). It holds its own copy of the model, so training never
changes weights under a round; `load_weights` stages the learner's trained parameters (the
adapters alone with LoRA) after each optimizer step, copied in before the next round.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import numpy as np

from callgrove.episode import TOKEN_DTYPE
from callgrove.policy.backends import (
    LearnerConfig,
    ModelSettings,
    PolicyBackend,
    learner_settings,
)
from callgrove.policy.local import LocalSampler
from callgrove.policy.render import ROLES
from callgrove.train.decode import Decoded, DecodeRequest

if TYPE_CHECKING:
    from torch import nn

# `[model] options` a Hugging Face backend reads, with their defaults.
HF_OPTIONS = {
    "attention": "sdpa",
    "dtype": "float32",
    "lora_rank": 0,
    "lora_alpha": 32.0,
    "gradient_checkpointing": False,
}


class HFSampler(LocalSampler):
    """A `TrainableSampler` over a Hugging Face causal LM held in this process."""

    decodes_text = True

    def __init__(self, model: nn.Module, tokenizer, seed: int = 0, max_batch: int = 64):
        super().__init__(model, seed, max_batch)
        self.tokenizer = tokenizer

    def decode(self, requests: list[DecodeRequest]) -> list[Decoded]:
        from callgrove.train.hf_decode import hf_decode

        return hf_decode(self.model, self.tokenizer, requests, self.generator)

    def check_weights(self, weights: Any) -> None:
        """`weights`: parameters by their name in the HF module (all of them, or the trained
        subset, such as LoRA adapters)."""
        unknown = sorted(set(weights) - set(dict(self.model.named_parameters())))
        if unknown:
            raise ValueError(f"weights for parameters the sampler's model lacks: {unknown[:3]}")

    def set_weights(self, weights: Any) -> None:
        import torch

        parameters = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                parameters[name].copy_(value)


class ChatTemplateRenderer:
    """Messages rendered by the model's own chat template, one at a time.

    A message's tokens are what the template adds for it after a fixed system message, so the
    tokens of a history are the concatenation of its messages' (histories only grow, and
    nothing is re-tokenised); the assistant's header is what `add_generation_prompt` adds."""

    _BASE = ({"role": "system", "content": "."},)

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._base_text = self._template(self._BASE)
        ends = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        self._stop = tuple(sorted(t for t in ends if isinstance(t, int) and t >= 0))

    def _template(self, messages, generation: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation
        )

    def _added(self, text: str) -> np.ndarray:
        if not text.startswith(self._base_text):
            raise ValueError("the chat template rewrites earlier messages; cannot render alone")
        ids = self.tokenizer.encode(text[len(self._base_text) :], add_special_tokens=False)
        return np.asarray(ids, dtype=TOKEN_DTYPE)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self._stop

    def render(self, role: str, text: str) -> np.ndarray:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        return self._added(self._template([*self._BASE, {"role": role, "content": text}]))

    def generation_prompt(self) -> np.ndarray:
        return self._added(self._template(self._BASE, generation=True))

    def parse(self, completion_ids: np.ndarray) -> str:
        ids = np.asarray(completion_ids).tolist()
        if ids and ids[-1] in self._stop:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def show(self, token_ids: np.ndarray) -> str:
        return self.tokenizer.decode(np.asarray(token_ids).tolist(), skip_special_tokens=False)


def hf_backend(model: ModelSettings, learner: LearnerConfig, seed: int) -> PolicyBackend:
    """Learner, sampler and renderer of a Hugging Face model (`model.name`: `hf:PATH` or a
    packaged name); `model.options` as in `HF_OPTIONS`."""
    import torch

    from callgrove.train.hf_model import checkpoint_folder, load_model, resolve_model
    from callgrove.train.hf_trainer import HFLearner, HFOptions, LoraSettings

    unknown = sorted(set(model.options) - set(HF_OPTIONS))
    if unknown:
        raise ValueError(f"model.options: unknown {unknown} (known: {sorted(HF_OPTIONS)})")
    options = {**HF_OPTIONS, **model.options}
    torch.manual_seed(seed)
    hf_model, tokenizer = load_model(
        model.name, getattr(torch, options["dtype"]), options["attention"]
    )
    lora = (
        LoraSettings(rank=int(options["lora_rank"]), alpha=float(options["lora_alpha"]))
        if options["lora_rank"]
        else None
    )
    trainer = HFLearner(
        hf_model,
        learner_settings(learner),
        HFOptions(lora, bool(options["gradient_checkpointing"])),
    )
    sampler_model = copy.deepcopy(trainer.hf_model)
    sampler = HFSampler(sampler_model, tokenizer, seed, model.max_batch)
    folder = checkpoint_folder(resolve_model(model.name))
    return PolicyBackend(trainer, sampler, ChatTemplateRenderer(tokenizer), folder)
