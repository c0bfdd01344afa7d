"""A Hugging Face causal LM as a policy: its sampler and what `[model] kind = "hf"` (or
`"vllm"`, for the learner) builds: learner, sampler, and the chat format of its own tokenizer
and template.

The sampler is the reference sampler's queue (calls made at the same moment decode together,
rounds run whole on one version, new weights load between rounds) over the HF decoder
(`callgrove.policy.hf_decode`: KV cache, temperature and top-p with no hidden top-k, stop
strings, logprobs from the logits). It holds its own copy of the model, so training never
changes weights under a round; `load_weights` stages the learner's trained parameters (the
adapters alone with LoRA) after each optimizer step, copied in before the next round. With
LoRA the copy is a plain model whose adapted projections hold their base weight plus the
adapters' product (`FoldedLora`): a decode step runs one matmul per projection, where peft's
layers run three (about 12% of a SmolLM2 round on a CPU).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from callgrove.errors import InvalidValue
from callgrove.policy.batching import LocalSampler
from callgrove.policy.decode import Decoded, DecodeRequest

if TYPE_CHECKING:
    from torch import nn


class FoldedLora:
    """A peft LoRA model as a plain copy whose adapted projections hold W0 + scale * B @ A
    (peft's own merge), refolded from the frozen W0 each time the adapters change, so no
    round-off builds up over steps. Adapters are named as in the peft model."""

    def __init__(self, peft_model: nn.Module):
        import torch
        from peft.tuners.lora import LoraLayer

        # (A name, B name, scale, base weight, the plain model's weight) per adapted projection
        self.projections: list[tuple[str, str, float, torch.Tensor, torch.Tensor]] = []
        self.adapters: dict[str, torch.Tensor] = {}
        plain = copy.deepcopy(peft_model)
        layers = [(n, m) for n, m in plain.named_modules() if isinstance(m, LoraLayer)]
        for name, layer in layers:
            for adapter in layer.active_adapters:
                a_name, b_name = (
                    f"{name}.lora_A.{adapter}.weight",
                    f"{name}.lora_B.{adapter}.weight",
                )
                self.adapters[a_name] = layer.lora_A[adapter].weight.detach().clone()
                self.adapters[b_name] = layer.lora_B[adapter].weight.detach().clone()
                base = layer.get_base_layer().weight
                self.projections.append(
                    (a_name, b_name, float(layer.scaling[adapter]), base.detach().clone(), base)
                )
        self.model = plain.merge_and_unload()  # the projections' weights stay the tensors above
        self.fold(self.adapters)

    def fold(self, adapters: dict[str, Any]) -> None:
        import torch

        self.adapters.update(adapters)
        with torch.no_grad():
            for a_name, b_name, scale, base, weight in self.projections:
                delta = self.adapters[b_name] @ self.adapters[a_name]
                weight.copy_(base + delta.to(base.dtype) * scale)


class HFSampler(LocalSampler):
    """A `TrainableSampler` over a Hugging Face causal LM held in this process (a LoRA model
    as its `FoldedLora`)."""

    decodes_text = True

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        seed: int = 0,
        max_batch: int = 64,
        lora: FoldedLora | None = None,
    ):
        super().__init__(lora.model if lora else model, seed, max_batch)
        self.tokenizer = tokenizer
        self.lora = lora

    def decode(self, requests: list[DecodeRequest]) -> list[Decoded]:
        from callgrove.policy.hf_decode import hf_decode

        return hf_decode(self.model, self.tokenizer, requests, self.generator)

    def check_weights(self, weights: Any) -> None:
        """`weights`: parameters by their name in the HF module (all of them, or the trained
        subset, such as LoRA adapters)."""
        known = self.lora.adapters if self.lora else dict(self.model.named_parameters())
        unknown = sorted(set(weights) - set(known))
        if unknown:
            raise InvalidValue(f"weights for parameters the sampler's model lacks: {unknown[:3]}")

    def set_weights(self, weights: Any) -> None:
        import torch

        if self.lora:
            self.lora.fold(weights)
            return
        parameters = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                parameters[name].copy_(value)
