"""Batched sampling from a Hugging Face causal LM with its KV cache.

Prompts of different lengths decode together. The prefill forwards each distinct prompt once
(a group's calls share one prompt: its cache is copied to each of them) and the prefix all of
them share once (a chat template's system turn); each prompt's own tokens follow, left-padded
(a 2-D attention mask hides the padding, position ids count each sequence's own tokens). Then
one new token per sequence per step through the model's cache. A mixture of experts' routes
are recorded for every token forwarded for a request (`callgrove.networks.moe`): its prompt and
every completion token but the last, which is never forwarded. Sampling is
`callgrove.sampling.distribution`'s: temperature, top-k and top-p over the full vocabulary (no
hidden cut), one uniform per token, and the
log-probability of each sampled token read from the same final distribution the token was drawn
from (the behaviour policy). Stop strings end a sequence once its decoded completion contains
one in the text its latest token added; that token is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from functools import partial

import numpy as np
import torch
from torch import nn

from callgrove.episode.record import ROUTE_DTYPE
from callgrove.errors import InvalidValue
from callgrove.networks.moe import Routing, take_routes
from callgrove.policy.decode import (
    Decoded,
    DecodeRequest,
    StopStrings,
    draw,
    request_generators,
    request_tensors,
)
from callgrove.sampling.distribution import sampling_distribution


@torch.no_grad()
def hf_decode(
    model: nn.Module,
    tokenizer,
    requests: Sequence[DecodeRequest],
    generator: torch.Generator,
) -> list[Decoded]:
    """Sample a completion for every request, all of them decoding together."""
    if not requests:
        return []
    vocab = model.get_output_embeddings().weight.shape[0]
    if min(len(r.prompt_ids) for r in requests) < 1:
        raise InvalidValue("cannot decode from an empty prompt")
    for r in requests:
        if int(np.max(r.prompt_ids)) >= vocab or int(np.min(r.prompt_ids)) < 0:
            raise InvalidValue(f"prompt holds token ids outside the vocabulary of {vocab}")
    routing = Routing.of(model)
    with routing.recording() if routing else nullcontext() as recorded:
        return _decode(model, tokenizer, requests, generator, recorded)


def _decode(
    model: nn.Module,
    tokenizer,
    requests: Sequence[DecodeRequest],
    generator: torch.Generator,
    recorded: list[list[torch.Tensor]] | None,
) -> list[Decoded]:
    """`hf_decode`'s work, recording routes into `recorded` where it is given."""
    device = next(model.parameters()).device
    vocab = model.get_output_embeddings().weight.shape[0]
    lengths = torch.tensor([len(r.prompt_ids) for r in requests], device=device)
    batch = len(requests)
    unique, row_of = _unique_prompts(requests)
    cache, last, mask, prompt_routes = _prefill(model, tokenizer, unique, device, recorded)
    if len(unique) < batch:  # identical prompts (a group's calls) share one prefill
        index = torch.as_tensor(row_of, device=device)
        cache.reorder_cache(index)
        last, mask = last[index], mask[index]

    distribution, max_tokens, stop_ids = request_tensors(requests, vocab, device)
    text_of = partial(tokenizer.decode, skip_special_tokens=False)
    stop_strings = [StopStrings(text_of, r.params.stop) for r in requests]
    own = request_generators(requests)

    tokens: list[list[int]] = [[] for _ in requests]
    logprobs: list[list[float]] = [[] for _ in requests]
    routes = [[prompt_routes[row]] if recorded else [] for row in row_of]
    running = torch.ones(batch, dtype=torch.bool, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    steps = int(max_tokens.max())
    # Every key the round will hold, made once: a step's mask is a prefix of it.
    keys = mask.shape[1]
    mask = torch.cat([mask, torch.ones(batch, steps, dtype=torch.long, device=device)], dim=1)
    for step in range(steps):
        logp = sampling_distribution(last.double(), *distribution)
        chosen = draw(logp, generator, own)
        picked = logp.gather(1, chosen[:, None])[:, 0]
        hit = stop_ids[torch.arange(batch), chosen]
        for i in torch.nonzero(running)[:, 0].tolist():
            tokens[i].append(int(chosen[i]))
            logprobs[i].append(float(picked[i]))
            if not hit[i] and stop_strings[i].reached(tokens[i]):
                hit[i] = True
        hit &= running
        stopped |= hit
        running &= ~hit & (max_tokens > step + 1)
        if not bool(running.any()):
            break
        position = (lengths + step)[:, None]
        output = model(
            input_ids=chosen[:, None],
            attention_mask=mask[:, : keys + step + 1],
            position_ids=position,
            cache=cache,
            use_cache=True,
        )
        last = output.logits[:, -1]
        if recorded:  # the token just forwarded, for the requests still running
            forwarded = take_routes(recorded)
            for i in torch.nonzero(running)[:, 0].tolist():
                routes[i].append(forwarded[i : i + 1])
    return [
        Decoded(
            np.asarray(t, dtype=np.int32),
            np.asarray(lp, dtype=np.float64),
            bool(s),
            torch.cat(r).cpu().numpy().astype(ROUTE_DTYPE) if r else None,
        )
        for t, lp, s, r in zip(tokens, logprobs, stopped.tolist(), routes, strict=True)
    ]


def _unique_prompts(requests: Sequence[DecodeRequest]) -> tuple[list[np.ndarray], list[int]]:
    """The distinct prompts, in order of first appearance, and each request's among them."""
    index: dict[bytes, int] = {}
    unique: list[np.ndarray] = []
    row_of = []
    for r in requests:
        key = np.asarray(r.prompt_ids, dtype=np.int64).tobytes()
        if key not in index:
            index[key] = len(unique)
            unique.append(np.asarray(r.prompt_ids, dtype=np.int64))
        row_of.append(index[key])
    return unique, row_of


def _common_prefix(prompts: Sequence[np.ndarray]) -> int:
    """Tokens every prompt starts with, leaving each at least one of its own (whose logits
    start its completion)."""
    shortest = min(len(p) for p in prompts)
    first = prompts[0][: shortest - 1]
    differs = np.zeros(len(first), dtype=bool)
    for p in prompts[1:]:
        differs |= p[: len(first)] != first
    return int(np.argmax(differs)) if differs.any() else len(first)


def _prefill(
    model: nn.Module,
    tokenizer,
    prompts: Sequence[np.ndarray],
    device: torch.device,
    recorded: list[list[torch.Tensor]] | None,
) -> tuple[object, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The KV cache of `prompts`, the logits (prompts, vocab) at their last tokens, the key
    mask (prompts, keys), and each prompt's routes (tokens, layers, k) where `recorded` holds
    the model's (else none). Their common prefix (a chat template's system turn, a harness's
    system prompt) is forwarded once; the rest of each prompt follows it, left-padded, so the
    padding sits between the prefix and a prompt's own tokens (masked, and skipped by the
    position ids)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    shared = _common_prefix(prompts) if len(prompts) > 1 else 0
    prefix_routes = []
    if shared:
        prefix = torch.as_tensor(prompts[0][:shared], device=device)[None]
        model(input_ids=prefix, cache=cache, use_cache=True, logits_to_keep=1)
        cache.reorder_cache(torch.zeros(len(prompts), dtype=torch.long, device=device))
        if recorded:
            prefix_routes = [take_routes(recorded)]
    own = [p[shared:] for p in prompts]
    longest = max(len(p) for p in own)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tokens = torch.full((len(own), longest), pad, dtype=torch.long, device=device)
    own_mask = torch.zeros(len(own), longest, dtype=torch.long, device=device)
    for i, p in enumerate(own):
        tokens[i, longest - len(p) :] = torch.as_tensor(p, device=device)
        own_mask[i, longest - len(p) :] = 1
    mask = torch.cat([torch.ones(len(own), shared, dtype=torch.long, device=device), own_mask], 1)
    output = model(
        input_ids=tokens,
        attention_mask=mask,
        position_ids=shared + (own_mask.cumsum(-1) - 1).clamp(min=0),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,  # the prompt's last position alone: a long prompt's logits are huge
    )
    routes = []
    if recorded:  # each prompt's own tokens, its left padding dropped, behind the prefix's
        flat = take_routes(recorded)
        padded = flat.reshape(len(own), longest, *flat.shape[1:])
        routes = [
            torch.cat([*prefix_routes, padded[i, longest - len(p) :]]) for i, p in enumerate(own)
        ]
    return cache, output.logits[:, -1], mask, routes
