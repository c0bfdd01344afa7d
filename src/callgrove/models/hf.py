"""What `[model] kind = "hf"` (or `"vllm"`, for the learner) opens: the chat format of the
model's own tokenizer and template, its sampler (`callgrove.policy.hf.HFSampler`) and its
learner (`callgrove.train.hf_trainer.HFLearner`, in this process or across ranks).
"""

from __future__ import annotations

import copy
from functools import partial
from typing import TYPE_CHECKING, Any

from callgrove.chat import JinjaFormat
from callgrove.models.backend import PolicyBackend
from callgrove.models.settings import HfModel
from callgrove.policy.hf import FoldedLora, HFSampler
from callgrove.train.settings import LearnerSettings

if TYPE_CHECKING:
    from torch import nn

    from callgrove.train.hf_trainer import HFLearner, HFOptions


def hf_tokenizer(model: HfModel) -> Any:
    """The model's tokenizer, without its weights."""
    from transformers import AutoTokenizer

    from callgrove.networks.hf import checkpoint_folder, resolve_model

    return AutoTokenizer.from_pretrained(checkpoint_folder(resolve_model(model.name)))


def hf_chat(tokenizer: Any, model: HfModel) -> JinjaFormat:
    """The model's own chat format: its tokenizer and chat template, its tool-call parser."""
    return JinjaFormat.from_tokenizer(tokenizer, model.tool_parser)


def _load(model: HfModel, seed: int) -> tuple[nn.Module, Any]:
    import torch

    from callgrove.networks.hf import load_model

    torch.manual_seed(seed)
    return load_model(model.name, getattr(torch, model.dtype), model.attention)


def hf_sampler(model: HfModel, seed: int) -> PolicyBackend:
    """The sampler and chat format of a Hugging Face model, and its context
    (`max_position_embeddings`, where its config says); no learner."""
    hf_model, tokenizer = _load(model, seed)
    context = getattr(hf_model.config, "max_position_embeddings", None)
    return PolicyBackend(
        hf_chat(tokenizer, model),
        HFSampler(hf_model, tokenizer, seed, model.max_batch),
        context=context if isinstance(context, int) else None,
    )


def hf_backend(
    model: HfModel, learner: LearnerSettings, seed: int, with_sampler: bool
) -> PolicyBackend:
    """Learner, sampler (None unless `with_sampler`) and chat format of a Hugging Face model.
    With `world_size` ranks the ranks load the model themselves, and this process only
    samples."""
    from callgrove.train.hf_trainer import HFLearner
    from callgrove.train.ranks import ranked_or_local

    options = _hf_options(model)
    trainer = ranked_or_local(
        partial(hf_learner, model, seed),
        learner,
        options=options,
        preload=["transformers.modeling_utils", *(["peft"] if options.lora else [])],
    )
    tokenizer = hf_tokenizer(model)
    chat = hf_chat(tokenizer, model)
    if not with_sampler:  # it samples elsewhere (`open_model`): no copy of the model here
        return PolicyBackend(chat, learner=trainer)
    local = isinstance(trainer, HFLearner)
    sampled = _sampled_copy(trainer.hf_model if local else None, model, seed, options)
    lora = FoldedLora(sampled) if options.lora else None
    sampler = HFSampler(sampled, tokenizer, seed, model.max_batch, lora)
    if not local:
        sampler.set_weights(trainer.weights())  # the ranks' (LoRA adapters start at random)
    return PolicyBackend(chat, sampler, trainer)


def _sampled_copy(
    trained: nn.Module | None, model: HfModel, seed: int, options: HFOptions
) -> nn.Module:
    """The model the sampler decodes with: the learner's in this process (with LoRA the
    sampler folds the adapters into a copy of its own, `FoldedLora`; else a copy), or one
    loaded here where the ranks hold theirs."""
    if trained is not None:
        return trained if options.lora else copy.deepcopy(trained)
    from callgrove.networks.lora import with_lora

    loaded, _ = _load(model, seed)
    return with_lora(loaded, options.lora) if options.lora else loaded


def hf_learner(model: HfModel, seed: int, learner: LearnerSettings) -> HFLearner:
    """A Hugging Face model's learner (what each rank of a `RankedLearner` builds, seeded
    alike)."""
    from callgrove.train.hf_trainer import HFLearner

    hf_model, _ = _load(model, seed)
    return HFLearner(hf_model, learner, _hf_options(model))


def _hf_options(model: HfModel) -> HFOptions:
    from callgrove.train.hf_trainer import HFOptions

    return HFOptions(model.lora(), model.gradient_checkpointing)
