"""The networks samplers and learners share (the `train` extra, torch): the reference decoder
(`tiny`), a Hugging Face causal LM seen through callgrove's batches (`hf`) with its blockwise
attention, and their sizes and adapters.

The sizes (`TinyConfig`, `LoraSettings`) are torch-free, so a config's `[model]` is checked
without torch; the torch-backed names load on first use and say which extra installs torch.
"""

from __future__ import annotations

from callgrove.lazy import lazy_names
from callgrove.networks.sizes import LoraSettings, TinyConfig

_TORCH_NAMES = {
    name: "callgrove.networks.tiny"
    for name in ("AttentionLayout", "TinyDecoder", "TreeLayout", "VarlenLayout")
}


def require_torch() -> None:
    """Torch is importable, else a `ModuleNotFoundError` saying which extra installs it."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as missing:
        raise ModuleNotFoundError(
            "callgrove's models and learners need torch, the `train` extra: pip install "
            "'callgrove[train]' (from a checkout: pip install -e '.[train]')",
            name=missing.name,
        ) from None


__getattr__ = lazy_names(__name__, _TORCH_NAMES, require_torch)

__all__ = ["LoraSettings", "TinyConfig", "require_torch", *sorted(_TORCH_NAMES)]
