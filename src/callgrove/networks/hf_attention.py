"""Packed and tree-packed attention through a Hugging Face model, block by block.

A layout splits the forwarded tokens into blocks of queries: a packed sequence, or a trie path
whose queries also see the keys of its head's ancestors. Each block goes through the model's own
attention kernel (`eager` or `sdpa`) with an explicit 4-D mask of that block alone, (1, 1,
queries, keys): ancestors all visible, the block itself causal. The attention cost of a batch is
therefore the sum over its blocks, which for a trie is at most what its rows cost row-wise;
nothing is ever N x N.

The blocks reach the attention function as a forward keyword argument through a registered
attention implementation (`callgrove_blockwise_<base>`) that, without blocks, is the base
implementation itself, so the same model also decodes with a KV cache.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from callgrove.errors import InvalidValue
from callgrove.networks.tiny import AttentionLayout, TreeLayout, VarlenLayout

BLOCKWISE_PREFIX = "callgrove_blockwise_"
BASE_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True, slots=True)
class AttentionBlock:
    start: int
    end: int
    context: torch.Tensor | None
    """Indices of the ancestor keys every query of the block sees; None when there are none."""
    mask: torch.Tensor | None
    """(1, 1, queries, context + queries): boolean (True = may attend) for sdpa, additive for
    eager; None for a plain causal block under sdpa (its causal kernel needs no mask)."""


@dataclass(frozen=True, slots=True)
class AttentionBlocks:
    blocks: list[AttentionBlock]
    placeholder: torch.Tensor
    """An empty 4-D mask handed to the model in place of its own, which it would build N x N."""

    @property
    def attention_pairs(self) -> int:
        """Query-key pairs the kernels compute (masked ones included)."""
        return sum(
            (b.end - b.start) * (b.end - b.start + (0 if b.context is None else len(b.context)))
            for b in self.blocks
        )


def _block_spans(layout: AttentionLayout) -> list[tuple[int, int, torch.Tensor | None]]:
    if isinstance(layout, VarlenLayout):
        return [(s, e, None) for s, e in layout.bounds if e > s]
    if isinstance(layout, TreeLayout):
        return [(s, e, context if len(context) else None) for s, e, context in layout.paths]
    raise TypeError(f"no attention blocks for a {type(layout).__name__}")


def _visible(queries: int, context: int, device: torch.device | str) -> torch.Tensor:
    """Bottom-right causal: every ancestor key visible, the block's own keys causally."""
    ones = torch.ones(queries, context + queries, dtype=torch.bool, device=device)
    return ones.tril(context)


def _as_mask(visible: torch.Tensor, attention: str, dtype: torch.dtype) -> torch.Tensor:
    if attention == "sdpa":
        return visible[None, None]
    # Additive, with the dtype's minimum rather than -inf, as the model's own eager masks are.
    additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return additive.masked_fill(~visible, torch.finfo(dtype).min)[None, None]


def attention_blocks(
    layout: AttentionLayout, attention: str, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> AttentionBlocks:
    blocks = []
    for start, end, context in _block_spans(layout):
        context_len = 0 if context is None else len(context)
        mask = (
            None
            if attention == "sdpa" and context is None
            else _as_mask(_visible(end - start, context_len, device), attention, dtype)
        )
        blocks.append(
            AttentionBlock(start, end, None if context is None else context.to(device), mask)
        )
    placeholder = torch.zeros((1, 1, 0, 0), dtype=torch.bool, device=device)
    return AttentionBlocks(blocks, placeholder)


def dense_mask(
    layout: AttentionLayout, num_tokens: int, attention: str, dtype: torch.dtype
) -> torch.Tensor:
    """The same attention as one (1, 1, N, N) mask over the whole batch (N x N: a reference)."""
    visible = torch.zeros(num_tokens, num_tokens, dtype=torch.bool)
    for start, end, context in _block_spans(layout):
        visible[start:end, start:end] = _visible(end - start, 0, "cpu")
        if context is not None:
            visible[start:end, context] = True
    return _as_mask(visible, attention, dtype)


def register_blockwise(base: str) -> str:
    """Register `callgrove_blockwise_<base>` (attention and mask functions); its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    base = base.removeprefix(BLOCKWISE_PREFIX)
    if base not in BASE_ATTENTION:
        raise InvalidValue(f"attention must be one of {BASE_ATTENTION}, not {base!r}")
    name = BLOCKWISE_PREFIX + base
    AttentionInterface.register(name, partial(_blockwise_attention, base))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


def _base_function(base: str, module: nn.Module):
    if base == "sdpa":
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ALL_ATTENTION_FUNCTIONS["sdpa"]
    # Eager attention is each architecture's own function, beside its attention module.
    function = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if function is None:
        raise TypeError(f"{type(module).__name__} has no eager attention function")
    return function


def _blockwise_attention(
    base: str,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """(batch 1, heads, tokens, head_dim) in; (1, tokens, heads, head_dim) out, as the model's
    attention functions return it."""
    blocks: AttentionBlocks | None = kwargs.pop("callgrove_blocks", None)
    function = _base_function(base, module)
    if blocks is None:
        return function(module, query, key, value, attention_mask, **kwargs)
    outputs = []
    for block in blocks.blocks:
        keys, values = key[:, :, block.start : block.end], value[:, :, block.start : block.end]
        if block.context is not None:
            keys = torch.cat([key.index_select(2, block.context), keys], dim=2)
            values = torch.cat([value.index_select(2, block.context), values], dim=2)
        out, _ = function(
            module, query[:, :, block.start : block.end], keys, values, block.mask, **kwargs
        )
        outputs.append(out)
    return torch.cat(outputs, dim=1), None
