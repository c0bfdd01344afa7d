"""Low-rank adapters (peft) on a Hugging Face model: what `[model] lora_rank` turns on."""

from __future__ import annotations

import warnings

from torch import nn

from callgrove.networks.sizes import LoraSettings


def peft_lora_config(lora: LoraSettings):
    """`lora` as peft's `LoraConfig` (what a peft model, or another trainer, is given)."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )


def with_lora(model: nn.Module, lora: LoraSettings) -> nn.Module:
    """`model` wrapped by peft with `lora`'s adapters (only they train)."""
    from peft import get_peft_model

    config = peft_lora_config(lora)
    with warnings.catch_warnings():
        # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing` alias while it
        # wraps the model (its FutureWarning named nothing of ours, on every LoRA run); the
        # checkpointing it asks about is set above with `activation_checkpointing_enable`.
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        return get_peft_model(model, config)
