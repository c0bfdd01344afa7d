"""Training a Hugging Face causal LM on a step's samples: one optimizer step per `train_step`.

The step's rows are tree-packed (a trie per group: every distinct token forwarded once) or laid
end to end in packed micro-batches of at most `seq_len` tokens; either way the loss has one
denominator over the whole step, so the accumulated gradient is the step's gradient; the
objective (`rl` or `sft`) is the learner settings' (`callgrove.train.learner`). LoRA adapters (peft) and gradient checkpointing are options; `save` and `load` keep everything
needed to continue: the trained weights, the optimizer, the version and the random state.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from callgrove.errors import InvalidValue
from callgrove.networks.hf import HFPolicyModel
from callgrove.networks.lora import with_lora
from callgrove.networks.sizes import LoraSettings
from callgrove.train.learner import ModelLearner
from callgrove.train.settings import LearnerSettings

_TRAINER_STATE = "trainer.pt"
_WEIGHTS = "weights.safetensors"


@dataclass(frozen=True, slots=True)
class HFOptions:
    """What a Hugging Face model adds to the learner settings."""

    lora: LoraSettings | None = None
    gradient_checkpointing: bool = False


class HFLearner(ModelLearner):
    """A Hugging Face causal LM in training (optionally LoRA-wrapped), its optimizer and its
    version (optimizer steps taken)."""

    def __init__(
        self,
        model: nn.Module,
        settings: LearnerSettings | None = None,
        options: HFOptions | None = None,
    ):
        self.options = options = options or HFOptions()
        if options.gradient_checkpointing:
            # Non-reentrant: recomputation sees the forward's keyword arguments (the blocks).
            model.activation_checkpointing_enable({"use_reentrant": False})
        if options.lora is not None:
            model = with_lora(model, options.lora)
        super().__init__(HFPolicyModel(model), settings or LearnerSettings())

    @property
    def hf_model(self) -> nn.Module:
        """The trained Hugging Face module (a peft model with LoRA)."""
        return self.model.model

    def trained_weights(self) -> dict[str, torch.Tensor]:
        """The trained parameters (the adapters alone with LoRA), named as in the Hugging Face
        module."""
        return {name: p.detach() for name, p in self.hf_model.named_parameters() if p.requires_grad}

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": self.trained_weights(),
            "optimizer": self.optimizer.state_dict(),
            "version": self._version,
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        weights = state["weights"]
        trainable = {n: p for n, p in self.hf_model.named_parameters() if p.requires_grad}
        if weights.keys() != trainable.keys():
            missing = sorted(trainable.keys() - weights.keys())[:3]
            extra = sorted(weights.keys() - trainable.keys())[:3]
            raise InvalidValue(
                f"checkpoint weights do not match the model (missing {missing}, extra {extra}): "
                "was it saved with other LoRA settings or another model?"
            )
        with torch.no_grad():
            for name, p in trainable.items():
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
        state = torch.load(folder / _TRAINER_STATE, weights_only=True)  # data, never code
        state["weights"] = load_file(folder / _WEIGHTS)
        self.load_state_dict(state)
