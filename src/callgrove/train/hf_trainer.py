"""Training a Hugging Face causal LM on a step's samples: one optimizer step per `train_step`.

The step's rows are tree-packed (a trie per group: every distinct token forwarded once) or laid
end to end in packed micro-batches of at most `seq_len` tokens; either way the loss has one
denominator over the whole step, so the accumulated gradient is the step's gradient. The
objective is the clipped policy-gradient loss (`rl`: sampling logprobs and advantages on the
loss tokens) or cross-entropy on the loss tokens (`sft`: imported transcripts, no advantages).
LoRA adapters (peft) and gradient checkpointing are options; `save` and `load` keep everything
needed to continue: the trained weights, the optimizer, the version and the random state.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from callgrove.batch import PackSettings, Sample, pack
from callgrove.batch.tree import TreeSettings, pack_samples
from callgrove.train.batches import ModelBatch, micro_batch_model_batch, tree_model_batch
from callgrove.train.hf_model import HFPolicyModel
from callgrove.train.loss import LossSettings, policy_loss, supervised_loss

BATCHINGS = ("tree", "packed")
OBJECTIVES = ("rl", "sft")
_TRAINER_STATE = "trainer.pt"
_WEIGHTS = "weights.safetensors"


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """Low-rank adapters on the attention projections; only they train."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True, slots=True)
class HFTrainSettings:
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    batching: str = "tree"
    tree_scope: str = "group"
    seq_len: int = 2048
    objective: str = "rl"
    loss: LossSettings = field(default_factory=LossSettings)
    lora: LoraSettings | None = None
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.batching not in BATCHINGS:
            raise ValueError(f"batching must be one of {BATCHINGS}, not {self.batching!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, not {self.objective!r}")


@dataclass(slots=True)
class HFStepReport:
    """What one optimizer step did."""

    loss: float
    samples: int
    loss_tokens: int
    forwarded_tokens: int
    """Tokens the model forwarded (distinct trie nodes when tree-packed)."""
    row_tokens: int
    """Tokens the same rows hold row-wise."""
    grad_norm: float
    seconds: float

    @property
    def forwarded_token_ratio(self) -> float:
        return self.row_tokens / max(self.forwarded_tokens, 1)

    @property
    def tokens_per_second(self) -> float:
        """Row-wise tokens trained on per second of the step."""
        return self.row_tokens / max(self.seconds, 1e-9)


class HFLearner:
    """A Hugging Face causal LM in training (optionally LoRA-wrapped), its optimizer and its
    version (optimizer steps taken)."""

    def __init__(self, model: nn.Module, settings: HFTrainSettings = HFTrainSettings()):
        self.settings = settings
        if settings.gradient_checkpointing:
            # Non-reentrant: recomputation sees the forward's keyword arguments (the blocks).
            model.activation_checkpointing_enable({"use_reentrant": False})
        if settings.lora is not None:
            model = _with_lora(model, settings.lora)
        self.policy = HFPolicyModel(model)
        self.trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.AdamW(
            self.trainable.values(), lr=settings.learning_rate, weight_decay=settings.weight_decay
        )
        self._version = 0

    @property
    def model(self) -> nn.Module:
        """The trained module (a peft model with LoRA)."""
        return self.policy.model

    @property
    def version(self) -> int:
        return self._version

    def model_batches(self, samples: Sequence[Sample]) -> list[ModelBatch]:
        if not samples:
            return []
        if self.settings.batching == "tree":
            trie = pack_samples(samples, TreeSettings(self.settings.tree_scope))
            return [tree_model_batch(trie)]
        packed = pack(samples, PackSettings(seq_len=self.settings.seq_len))
        return [micro_batch_model_batch(mb) for mb in packed.ranks[0] if mb.num_tokens]

    def loss(self, batch: ModelBatch, denominator: float) -> torch.Tensor:
        if self.settings.objective == "sft":
            return supervised_loss(self.policy, batch, denominator)
        return policy_loss(self.policy, batch, self.settings.loss, denominator)

    def train_step(self, samples: Sequence[Sample]) -> HFStepReport:
        """One optimizer step on `samples`; the version goes up by one even when nothing trained
        (it counts steps)."""
        started = time.perf_counter()
        batches = self.model_batches(samples)
        loss_tokens = sum(s.num_loss_tokens for s in samples)
        denominator = self._denominator(samples, loss_tokens)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for batch in batches:
            loss = self.loss(batch, denominator)
            loss.backward()
            total += float(loss.detach())
        grad_norm = 0.0
        if batches and loss_tokens:
            norm = torch.nn.utils.clip_grad_norm_(
                self.trainable.values(), self.settings.max_grad_norm
            )
            grad_norm = float(norm)
            self.optimizer.step()
        self._version += 1
        return HFStepReport(
            loss=total,
            samples=len(samples),
            loss_tokens=loss_tokens,
            forwarded_tokens=sum(b.num_tokens for b in batches),
            row_tokens=sum(b.num_row_tokens for b in batches),
            grad_norm=grad_norm,
            seconds=time.perf_counter() - started,
        )

    def _denominator(self, samples: Sequence[Sample], loss_tokens: int) -> float:
        if self.settings.objective == "rl" and self.settings.loss.normalisation == "sequence":
            return float(max(sum(1 for s in samples if s.num_loss_tokens), 1))
        return float(max(loss_tokens, 1))

    def weights(self) -> dict[str, torch.Tensor]:
        """The trained parameters (the adapters alone with LoRA), detached copies, for a sampler's
        `load_weights`."""
        return {name: p.detach().clone() for name, p in self.trainable.items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": self.weights(),
            "optimizer": self.optimizer.state_dict(),
            "version": self._version,
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        weights = state["weights"]
        if weights.keys() != self.trainable.keys():
            missing = sorted(self.trainable.keys() - weights.keys())[:3]
            extra = sorted(weights.keys() - self.trainable.keys())[:3]
            raise ValueError(
                f"checkpoint weights do not match the model (missing {missing}, extra {extra}): "
                "was it saved with other LoRA settings or another model?"
            )
        with torch.no_grad():
            for name, p in self.trainable.items():
                p.copy_(weights[name])
        self.optimizer.load_state_dict(state["optimizer"])
        self._version = int(state["version"])
        torch.set_rng_state(state["torch_rng"])

    def save(self, folder: str | Path) -> Path:
        """A checkpoint folder: trained weights as safetensors, optimizer, version and random
        state; written beside `folder` and renamed into place, so it is whole or absent."""
        from safetensors.torch import save_file

        folder = Path(folder)
        staging = folder.with_name(f".{folder.name}.saving")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        state = self.state_dict()
        weights = {name: t.contiguous() for name, t in state.pop("weights").items()}
        save_file(weights, staging / _WEIGHTS)
        torch.save(state, staging / _TRAINER_STATE)
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
        return folder

    def load(self, folder: str | Path) -> None:
        """Continue from a folder written by `save` (same model and LoRA settings)."""
        from safetensors.torch import load_file

        folder = Path(folder)
        for name in (_WEIGHTS, _TRAINER_STATE):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"checkpoint {folder} has no {name}")
        state = torch.load(folder / _TRAINER_STATE, weights_only=False)
        state["weights"] = load_file(folder / _WEIGHTS)
        self.load_state_dict(state)


def _with_lora(model: nn.Module, lora: LoraSettings) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)
