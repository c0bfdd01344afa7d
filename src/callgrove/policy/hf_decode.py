"""Batched sampling from a Hugging Face causal LM with its KV cache.

Prompts of different lengths decode together: left-padded into one prefill (a 2-D attention
mask hides the padding, position ids count each sequence's own tokens), then one new token per
sequence per step through the model's cache. Sampling is `callgrove.train.distribution`'s: temperature
and top-p over the full vocabulary (no hidden top-k), one uniform per token, and the
log-probability of each sampled token read from the same final distribution the token was drawn
from (the behaviour policy). Stop strings end a sequence once its decoded completion contains
one in the text its latest token added; that token is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import torch
from torch import nn

from callgrove.policy.decode import (
    Decoded,
    DecodeRequest,
    StopStrings,
    draw,
    request_generators,
    request_tensors,
)
from callgrove.train.distribution import sampling_distribution


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
    from transformers import DynamicCache

    device = next(model.parameters()).device
    vocab = model.get_output_embeddings().weight.shape[0]
    lengths = torch.tensor([len(r.prompt_ids) for r in requests], device=device)
    if int(lengths.min()) < 1:
        raise ValueError("cannot decode from an empty prompt")
    for r in requests:
        if int(np.max(r.prompt_ids)) >= vocab or int(np.min(r.prompt_ids)) < 0:
            raise ValueError(f"prompt holds token ids outside the vocabulary of {vocab}")
    batch, longest = len(requests), int(lengths.max())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = torch.full((batch, longest), pad, dtype=torch.long, device=device)
    mask = torch.zeros(batch, longest, dtype=torch.long, device=device)
    for i, r in enumerate(requests):
        prompts[i, longest - len(r.prompt_ids) :] = torch.as_tensor(r.prompt_ids, dtype=torch.long)
        mask[i, longest - len(r.prompt_ids) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    output = model(
        input_ids=prompts,
        attention_mask=mask,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,  # the prompt's last position alone: a long prompt's logits are huge
    )
    last = output.logits[:, -1]

    temperature, top_p, max_tokens, stop_ids = request_tensors(requests, vocab, device)
    text_of = partial(tokenizer.decode, skip_special_tokens=False)
    stop_strings = [StopStrings(text_of, r.params.stop) for r in requests]
    own = request_generators(requests)

    tokens: list[list[int]] = [[] for _ in requests]
    logprobs: list[list[float]] = [[] for _ in requests]
    running = torch.ones(batch, dtype=torch.bool, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    for step in range(int(max_tokens.max())):
        logp = sampling_distribution(last.double(), temperature, top_p)
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
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long, device=device)], dim=1)
        position = (lengths + step)[:, None]
        output = model(
            input_ids=chosen[:, None],
            attention_mask=mask,
            position_ids=position,
            cache=cache,
            use_cache=True,
        )
        last = output.logits[:, -1]
    return [
        Decoded(np.asarray(t, dtype=np.int32), np.asarray(lp, dtype=np.float64), bool(s))
        for t, lp, s in zip(tokens, logprobs, stopped.tolist(), strict=True)
    ]
