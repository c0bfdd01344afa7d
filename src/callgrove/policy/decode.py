"""Batched sampling from the reference decoder with a KV cache.

Several prompts of different lengths decode together: prompts are right-padded into one
prefill, then each decode step forwards one new token per sequence, attending to that
sequence's cached keys and values only (a key mask hides the padding). Rotary positions are
each sequence's own, so every sequence sees exactly what it would see decoded alone.

Sampling follows `callgrove.policy.SamplingParams` through `sampling.distribution` (the function
the learners score with): logits divided by the temperature (0 is greedy), cut to the `top_k`
most likely tokens where asked, then to the smallest set whose probability reaches `top_p`,
renormalised; no hidden cut. The
log-probability returned for a token is the one under that final distribution, which is the
behaviour policy the importance ratio divides by. Draws are inverse
CDF over one uniform per token, taken from the sequence's own generator when its request has a
seed and from the shared one otherwise.

Stop strings need the text of a completion, so `decode` takes `text_of` (token ids to text, a
chat format's `text_of`): a sequence ends once the text its latest token added completes one of its
request's stop strings, and that token is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from callgrove.errors import InvalidValue
from callgrove.networks.tiny import Block, TinyDecoder, rotate
from callgrove.policy.client import SamplingParams
from callgrove.sampling.distribution import sampling_distribution


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """One prompt to continue, and how."""

    prompt_ids: np.ndarray
    params: SamplingParams
    """Stop strings among them need a decoder that reads text (`text_of`)."""


def request_tensors(
    requests: Sequence[DecodeRequest], vocab: int, device: torch.device
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The requests' distributions (temperatures and top-p as float64, top-k with 0 for no
    cut: `sampling_distribution`'s arguments), token budgets, and stop tokens as a (requests,
    vocabulary) mask: what a batched decoder reads every step."""
    temperature = torch.tensor([r.params.temperature for r in requests], dtype=torch.float64)
    top_p = torch.tensor([r.params.top_p for r in requests], dtype=torch.float64)
    top_k = torch.tensor([r.params.top_k or 0 for r in requests], dtype=torch.long)
    max_tokens = torch.tensor([r.params.max_tokens for r in requests], device=device)
    stops = torch.zeros(len(requests), vocab, dtype=torch.bool, device=device)
    for i, r in enumerate(requests):
        stops[i, [t for t in r.params.stop_token_ids if 0 <= t < vocab]] = True
    return (temperature, top_p, top_k), max_tokens, stops


@dataclass(frozen=True, slots=True)
class Decoded:
    completion_ids: np.ndarray  # int32
    logprobs: np.ndarray  # float64, one per completion token
    stopped: bool  # a stop token or string ended it (its last token is kept)
    # A mixture of experts' routes (prompt + completion - 1 tokens, layers, k), where recorded
    routes: np.ndarray | None = None


class StopStrings:
    """Tells, token by token, whether a completion's text has reached a stop string."""

    def __init__(self, text_of: Callable[[Sequence[int]], str], stops: tuple[str, ...]):
        self.text_of = text_of
        self.stops = stops
        self.longest = max((len(s) for s in stops), default=0)
        self.text_length = 0

    def reached(self, completion_ids: Sequence[int]) -> bool:
        if not self.stops:
            return False
        text = self.text_of(completion_ids)
        # A stop string may straddle the previous text and what the latest token added.
        window = text[max(0, self.text_length - self.longest + 1) :]
        self.text_length = len(text)
        return any(stop in window for stop in self.stops)


class KVCache:
    """Keys and values of every layer for a batch of sequences, grown one step at a time."""

    def __init__(self, layers: int):
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Append (B, heads, T, head_dim) keys and values; returns the layer's whole cache."""
        old_k, old_v = self.keys[layer], self.values[layer]
        self.keys[layer] = k if old_k is None else torch.cat([old_k, k], dim=2)
        self.values[layer] = v if old_v is None else torch.cat([old_v, v], dim=2)
        return self.keys[layer], self.values[layer]  # type: ignore[return-value]


def _block_step(
    block: Block,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: KVCache,
    layer: int,
    visible: torch.Tensor,
) -> torch.Tensor:
    """One block on (B, T, width) new tokens; `visible` is (B, 1, T, keys) True where allowed."""
    batch, tokens, width = x.shape
    qkv = block.qkv(block.attn_norm(x)).view(batch, tokens, 3, block.n_heads, -1)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, heads, T, head_dim)
    keys, values = cache.extend(layer, rotate(k, cos, sin), v)
    mixed = F.scaled_dot_product_attention(rotate(q, cos, sin), keys, values, attn_mask=visible)
    x = x + block.out(mixed.transpose(1, 2).reshape(batch, tokens, width))
    return x + block.down(F.gelu(block.up(block.mlp_norm(x))))


def _forward(
    model: TinyDecoder,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    cache: KVCache,
    visible: torch.Tensor,
) -> torch.Tensor:
    """Logits (B, T, vocab) of new tokens (B, T) at `positions` (B, T), extending `cache`."""
    x = model.embed(token_ids)
    angles = positions.to(torch.float64)[..., None] * model.inverse_frequency
    cos, sin = angles.cos().to(x.dtype)[:, None], angles.sin().to(x.dtype)[:, None]
    for layer, block in enumerate(model.blocks):
        x = _block_step(block, x, cos, sin, cache, layer, visible)
    return model.head(model.norm(x))


@torch.no_grad()
def decode(
    model: TinyDecoder,
    requests: Sequence[DecodeRequest],
    generator: torch.Generator,
    text_of: Callable[[Sequence[int]], str] | None = None,
) -> list[Decoded]:
    """Sample a completion for every request, all of them decoding together; `text_of` reads
    completions for stop strings (without it, a request with stop strings is refused)."""
    if not requests:
        return []
    if text_of is None and any(r.params.stop for r in requests):
        raise InvalidValue("stop strings need the completion's text: decode with text_of")
    device = next(model.parameters()).device
    lengths = torch.tensor([len(r.prompt_ids) for r in requests], device=device)
    if int(lengths.min()) < 1:
        raise InvalidValue("cannot decode from an empty prompt")
    vocab = model.config.vocab_size
    for r in requests:
        if len(r.prompt_ids) and (
            int(np.max(r.prompt_ids)) >= vocab or int(np.min(r.prompt_ids)) < 0
        ):
            raise InvalidValue(f"prompt holds token ids outside the vocabulary of {vocab}")
    batch, longest = len(requests), int(lengths.max())
    prompts = torch.zeros(batch, longest, dtype=torch.long, device=device)
    for i, r in enumerate(requests):
        prompts[i, : len(r.prompt_ids)] = torch.as_tensor(r.prompt_ids, dtype=torch.long)
    steps = torch.arange(longest, device=device)
    valid = steps[None, :] < lengths[:, None]  # (B, L) real prompt tokens
    causal = steps[None, :, None] >= steps[None, None, :]
    cache = KVCache(len(model.blocks))
    logits = _forward(
        model, prompts, steps.expand(batch, -1), cache, (causal & valid[:, None, :])[:, None]
    )
    last = logits[torch.arange(batch), lengths - 1]

    distribution, max_tokens, stops = request_tensors(requests, vocab, device)
    own = request_generators(requests)
    stop_strings = {
        i: (StopStrings(text_of, r.params.stop), [])
        for i, r in enumerate(requests)
        if r.params.stop and text_of
    }

    tokens, logprobs = [], []
    running = torch.ones(batch, dtype=torch.bool, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    key_valid = valid
    for step in range(int(max_tokens.max())):
        logp = sampling_distribution(last.double(), *distribution)
        chosen = draw(logp, generator, own)
        tokens.append(torch.where(running, chosen, -1))
        logprobs.append(logp.gather(1, chosen[:, None])[:, 0])
        hit = stops[torch.arange(batch), chosen] & running
        for i, (stop, completion) in stop_strings.items():
            if bool(running[i]):
                completion.append(int(chosen[i]))
                hit[i] |= stop.reached(completion)
        stopped |= hit
        running &= ~hit & (max_tokens > step + 1)
        if not bool(running.any()):
            break
        key_valid = torch.cat([key_valid, torch.ones(batch, 1, dtype=torch.bool)], dim=1)
        position = (lengths + step)[:, None]
        logits = _forward(model, chosen[:, None], position, cache, key_valid[:, None, None, :])
        last = logits[:, 0]
    token_matrix = torch.stack(tokens, dim=1).numpy()
    logprob_matrix = torch.stack(logprobs, dim=1).numpy()
    results = []
    for i in range(batch):
        count = int((token_matrix[i] >= 0).sum())
        results.append(
            Decoded(
                token_matrix[i, :count].astype(np.int32),
                logprob_matrix[i, :count].astype(np.float64),
                bool(stopped[i]),
            )
        )
    return results


def request_generators(requests: Sequence[DecodeRequest]) -> dict[int, torch.Generator]:
    """A generator of its own for each request that has a seed, by its index in the batch."""
    return {
        i: torch.Generator().manual_seed(r.params.seed)
        for i, r in enumerate(requests)
        if r.params.seed is not None
    }


def draw(
    logp: torch.Tensor, generator: torch.Generator, own: dict[int, torch.Generator]
) -> torch.Tensor:
    """One token per row of `logp` (B, vocab), inverse CDF over one uniform each (from the
    row's own generator where it has one, else the shared one)."""
    batch, vocab = logp.shape
    uniforms = torch.rand(batch, generator=generator, dtype=torch.float64)
    for i, g in own.items():
        uniforms[i] = torch.rand(1, generator=g, dtype=torch.float64)[0]
    cdf = logp.exp().cumsum(dim=-1)
    chosen = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None]).clamp(max=vocab - 1)
    return _nearest_kept(chosen[:, 0], logp)


def _nearest_kept(chosen: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Guard against float round-off landing the draw on a token outside the nucleus."""
    outside = torch.isinf(logp.gather(1, chosen[:, None])[:, 0])
    if bool(outside.any()):
        chosen = torch.where(outside, logp.argmax(dim=-1), chosen)
    return chosen


def new_generator(seed: int) -> torch.Generator:
    """The shared random source of a sampler (its state goes into checkpoints)."""
    return torch.Generator().manual_seed(seed)
