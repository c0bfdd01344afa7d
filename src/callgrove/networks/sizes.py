"""The networks' sizes and adapters, torch-free: a config's `[model]` is checked without torch."""

from __future__ import annotations

from dataclasses import dataclass

from callgrove.errors import InvalidValue
from callgrove.formats.ranges import check_range


@dataclass(frozen=True, slots=True)
class TinyConfig:
    """The reference decoder's size; its defaults are `[model] kind = "tiny"`'s."""

    vocab_size: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff"):
            check_range(name, getattr(self, name), at_least=1)
        check_range("rope_base", self.rope_base, above=1)
        if self.d_model % (2 * self.n_heads):
            raise InvalidValue(
                f"d_model ({self.d_model}) must split into n_heads ({self.n_heads}) heads of even "
                "width (rotary embeddings rotate pairs): a multiple of 2 * n_heads"
            )


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """Low-rank adapters on the attention projections; only they train (`[model] lora_rank`
    turns them on; `lora_alpha` defaults to `alpha`'s default here)."""

    rank: int
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True, slots=True)
class MoeConfig:
    """A small mixture-of-experts decoder's size (Qwen3-MoE shaped: every layer's MLP is
    `experts` experts of width `d_ff`, each token routed to `top_k` of them); its defaults are
    `[model] kind = "moe"`'s."""

    vocab_size: int = 64
    d_model: int = 64
    n_heads: int = 2  # heads of 32: the smallest vLLM's CPU attention takes
    n_kv_heads: int = 1
    n_layers: int = 2
    d_ff: int = 32
    experts: int = 8
    top_k: int = 2
    max_positions: int = 32768

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_kv_heads", "n_layers", "d_ff"):
            check_range(name, getattr(self, name), at_least=1)
        check_range("experts", self.experts, at_least=2)
        check_range("top_k", self.top_k, at_least=1, at_most=self.experts)
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise InvalidValue(
                f"d_model ({self.d_model}) must split into n_heads ({self.n_heads}) heads, "
                f"shared evenly by n_kv_heads ({self.n_kv_heads})"
            )
