"""Mixtures of experts: a small built-in one, and the routes of every token a model forwards.

A token's route is, for each MoE layer, the `k` experts its router sent it to; a sequence's
routes are an integer array (tokens, layers, k) (`ROUTE_DTYPE`, `NO_ROUTE` where a token has
none). `Routing` holds a model's routers (every module built like Qwen3-MoE's `TopKRouter`:
a `weight` of (experts, hidden), `top_k`, `norm_topk_prob`, a forward giving logits, gate
weights and experts) and, around a forward, records what each router chose or replays given
routes. Replaying is rollout routing replay (R3): each router still computes its logits from
the learner's weights, but the experts are the recorded ones and their gate weights the softmax
of those logits at them (renormalised among them where the router normalises), so the router's
gradient flows as without replay. A token without a recorded route is routed by the router's
own top-k. The state lives on the modules and the hooks are plain functions, so a deep copy of
the model (the sampler's) records and replays with its own weights.

`tiny-moe` names a built-in model (`TINY_MOE`): a random-initialised Qwen3-MoE (`MoeConfig`'s
size, 8 experts, top-2) over a byte-level tokenizer with a ChatML template, written once as a
checkpoint folder in the cache (`networks.hf.tiny_moe_folder`), so everything that opens a
Hugging Face folder opens it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from callgrove.episode.record import NO_ROUTE
from callgrove.errors import InvalidValue
from callgrove.networks.sizes import MoeConfig

TINY_MOE = "tiny-moe"
TINY_MOE_SEED = 0
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def moe_model(config: MoeConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A random-initialised Qwen3-MoE causal LM of `config`'s size, seeded."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    hf_config = Qwen3MoeConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=2 * config.d_ff,
        moe_intermediate_size=config.d_ff,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads,
        head_dim=config.d_model // config.n_heads,
        num_experts=config.experts,
        num_experts_per_tok=config.top_k,
        norm_topk_prob=True,
        max_position_embeddings=config.max_positions,
        tie_word_embeddings=False,
        # each expert a plain matmul: the grouped kernels take no float64, which tests use
        experts_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3MoeForCausalLM(hf_config)
    return model.to(dtype)


def byte_tokenizer():
    """A byte-level tokenizer (the 256 bytes, no merges) with ChatML's two special tokens and
    template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + 2,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=alphabet,
    )
    backend.train_from_iterator([], trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|im_end|>"
    )
    tokenizer.chat_template = CHATML
    return tokenizer


def _is_router(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("TopKRouter")
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and hasattr(module, "top_k")
        and hasattr(module, "norm_topk_prob")
    )


class Routing:
    """A model's routers, in layer order, recording or replaying routes around a forward.

    Over the replayed forwards since `replaying` began: `replayed` counts tokens with a
    recorded route (summed over layers), `differing` those whose router's own top-k, as a set,
    is not the recorded one."""

    def __init__(self, routers: list[nn.Module]):
        self.routers = routers
        self.recorded: list[list[torch.Tensor]] | None = None
        self.replay: torch.Tensor | None = None
        self.force = True
        self.replayed = 0
        self.differing = 0

    @classmethod
    def of(cls, model: nn.Module) -> Routing | None:
        """The routing of `model`'s routers (made once and kept on them, so a module wrapping
        the model finds the same), or None for a dense model."""
        routers = [m for m in model.modules() if _is_router(m)]
        if not routers:
            return None
        found = getattr(routers[0], "callgrove_routing", None)
        if isinstance(found, Routing) and found.routers == routers:
            return found
        routing = cls(routers)
        for layer, router in enumerate(routers):
            router.callgrove_routing = routing
            router.callgrove_layer = layer
            router.register_forward_hook(_route_hook)
        return routing

    @property
    def layers(self) -> int:
        return len(self.routers)

    @property
    def top_k(self) -> int:
        return int(self.routers[0].top_k)

    @property
    def experts(self) -> int:
        return int(self.routers[0].weight.shape[0])

    @contextmanager
    def recording(self) -> Iterator[list[list[torch.Tensor]]]:
        """Within it, every forward appends each layer's chosen experts (tokens, k) to the
        yielded lists (one per layer), in forward order."""
        self.recorded = [[] for _ in self.routers]
        try:
            yield self.recorded
        finally:
            self.recorded = None

    @contextmanager
    def replaying(self, routes: torch.Tensor | None, force: bool = True) -> Iterator[None]:
        """Within it, a forward's tokens (flattened in order) take `routes` (tokens, layers, k;
        `NO_ROUTE` rows route by the router's own top-k). None replays nothing; with `force`
        false the routers route as their own and only count where they differ from `routes`."""
        if routes is not None and tuple(routes.shape[1:]) != (self.layers, self.top_k):
            raise InvalidValue(
                f"routes of shape {tuple(routes.shape)} do not fit a model of {self.layers} MoE "
                f"layers routing {self.top_k} experts per token"
            )
        self.replay = routes
        self.force = force
        self.replayed = self.differing = 0
        try:
            yield
        finally:
            self.replay = None


def take_routes(recorded: list[list[torch.Tensor]]) -> torch.Tensor:
    """The routes recorded since the last take, (tokens, layers, k), and the lists emptied."""
    routes = torch.stack([torch.cat(layer) for layer in recorded], dim=1)
    for layer in recorded:
        layer.clear()
    return routes


def _route_hook(router: nn.Module, _inputs, output):
    routing: Routing = router.callgrove_routing
    logits, _weights, own = output
    if routing.replay is None:
        if routing.recorded is not None:
            routing.recorded[router.callgrove_layer].append(own.detach())
        return None
    recorded = routing.replay[:, router.callgrove_layer, :].to(own.device, torch.long)
    if len(recorded) != len(own):
        raise InvalidValue(f"{len(recorded)} replayed routes for a forward of {len(own)} tokens")
    known = recorded[:, 0] != NO_ROUTE
    experts = torch.where(known[:, None], recorded, own)
    differs = (own.sort(-1).values != experts.sort(-1).values).any(-1) & known
    routing.replayed += int(known.sum())
    routing.differing += int(differs.sum())
    if not routing.force:
        return None
    probabilities = torch.softmax(logits, dtype=torch.float, dim=-1)  # as the router computes
    weights = probabilities.gather(1, experts)
    if router.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return logits, weights.to(logits.dtype), experts
