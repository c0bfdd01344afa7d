"""A tiny decoder-only transformer that runs packed varlen batches and tree-packed batches alike.

Positions enter only through rotary embeddings of the given position ids, so a trie node at depth
d is rotated exactly as the token at position d of every row that holds it. What differs between
the two layouts is which keys a query may see, and that is the attention layout's business.
"""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from callgrove.networks.sizes import TinyConfig


class VarlenLayout:
    """Independent sequences laid end to end (`cu_seqlens`): causal attention inside each."""

    def __init__(self, cu_seqlens: list[int]):
        self.bounds = list(pairwise(cu_seqlens))

    def to(self, device: torch.device | str) -> VarlenLayout:
        return self

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(1, heads, tokens, head_dim) in and out: the fused CPU kernels take 4-d inputs only."""
        parts = [
            F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True)
            for s, e in self.bounds
            if e > s
        ]
        return torch.cat(parts, dim=2)


class TreeLayout:
    """Trie paths laid end to end: each path's queries see the keys of its head's ancestors and,
    causally, its own; a path without ancestors is plain causal attention. Nothing N x N.
    On CPU a path with ancestors runs two fused kernels (`AncestorsThenCausal`); elsewhere, or
    with `fused=False`, one masked kernel call over the path's rows of the mask."""

    def __init__(self, path_bounds: list[int], contexts: list[torch.Tensor], fused: bool = True):
        self.path_bounds = path_bounds
        self.paths = list(zip(path_bounds[:-1], path_bounds[1:], contexts, strict=True))
        self.fused = fused

    def to(self, device: torch.device | str) -> TreeLayout:
        contexts = [context.to(device) for _, _, context in self.paths]
        return TreeLayout(self.path_bounds, contexts, self.fused)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(1, heads, tokens, head_dim) in and out."""
        parts = []
        for start, end, context in self.paths:
            q_path, k_path, v_path = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
            if len(context) == 0:
                parts.append(F.scaled_dot_product_attention(q_path, k_path, v_path, is_causal=True))
                continue
            k_context, v_context = k.index_select(2, context), v.index_select(2, context)
            if self.fused and q.device.type == "cpu":
                parts.append(
                    AncestorsThenCausal.apply(q_path, k_context, v_context, k_path, v_path)
                )
                continue
            keys, values = (
                torch.cat([k_context, k_path], dim=2),
                torch.cat([v_context, v_path], dim=2),
            )
            # Bottom-right causal: every ancestor is visible, the path itself causally.
            visible = torch.ones(end - start, keys.shape[2], dtype=torch.bool, device=q.device)
            visible = visible.tril(len(context))
            parts.append(F.scaled_dot_product_attention(q_path, keys, values, attn_mask=visible))
        return torch.cat(parts, dim=2)


class AncestorsThenCausal(torch.autograd.Function):
    """A path's attention as two fused CPU flash-attention calls and no mask: over its ancestors'
    keys (all visible) and over its own (causal), merged by their log-sum-exps. In the backward
    each call is handed the merged output and log-sum-exp, from which the flash backward forms
    the merged attention weights of its keys, so each gives exactly its share of the gradients."""

    @staticmethod
    def forward(ctx, q, k_context, v_context, k_own, v_own):  # type: ignore[override]
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        out_context, lse_context = flash(q, k_context, v_context, 0.0, False)
        out_own, lse_own = flash(q, k_own, v_own, 0.0, True)
        lse = torch.logaddexp(lse_context, lse_own)
        out = (lse_context - lse).exp()[..., None] * out_context
        out = out + (lse_own - lse).exp()[..., None] * out_own
        ctx.save_for_backward(q, k_context, v_context, k_own, v_own, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k_context, v_context, k_own, v_own, out, lse = ctx.saved_tensors
        flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        grad_out = grad_out.contiguous()
        dq_context, dk_context, dv_context = flash_backward(
            grad_out, q, k_context, v_context, out, lse, 0.0, False
        )
        dq_own, dk_own, dv_own = flash_backward(grad_out, q, k_own, v_own, out, lse, 0.0, True)
        return dq_context + dq_own, dk_context, dv_context, dk_own, dv_own


AttentionLayout = VarlenLayout | TreeLayout


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (..., tokens, head_dim), halves rotated against each other."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, config: TinyConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.attn_norm = RMSNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)
        self.mlp_norm = RMSNorm(config.d_model)
        self.up = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.down = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: AttentionLayout
    ) -> torch.Tensor:
        tokens, width = x.shape
        qkv = self.qkv(self.attn_norm(x)).view(tokens, 3, 1, self.n_heads, -1)
        q, k, v = qkv.permute(1, 2, 3, 0, 4)  # each (1, heads, tokens, head_dim)
        mixed = layout.attend(rotate(q, cos, sin), rotate(k, cos, sin), v)
        x = x + self.out(mixed[0].transpose(0, 1).reshape(tokens, width))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class TinyDecoder(nn.Module):
    """Token ids and position ids of one flat batch in, next-token logits out."""

    def __init__(self, config: TinyConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        head_dim = config.d_model // config.n_heads
        inverse = config.rope_base ** (
            -torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
        )
        self.register_buffer("inverse_frequency", inverse, persistent=False)

    def forward(
        self,
        token_ids: torch.Tensor,
        position_ids: torch.Tensor,
        layout: AttentionLayout,
        at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (N, vocab), or only at the positions `at` (len(at), vocab)."""
        x = self.embed(token_ids)
        angles = position_ids.to(torch.float64)[:, None] * self.inverse_frequency[None, :]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin, layout)
        return self.head(self.norm(x if at is None else x[at]))
