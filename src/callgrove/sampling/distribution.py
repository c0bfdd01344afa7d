"""The sampling distribution: what a sampler draws from and what a learner scores, one function.

The importance ratio divides the learner's probability of a token by the probability it had
when it was sampled, so both sides must compute the same distribution from the same logits.
Every sampler of the project (`decode`, `hf_decode`) and every loss (`train.loss`) calls
`sampling_distribution`:

1. logits divided by the temperature (0 is greedy: the whole mass on the argmax, ties to the
   lowest id);
2. a top-k cut, where asked: the k most likely tokens, renormalised;
3. a top-p cut: the smallest set of the most likely tokens whose mass (after the top-k cut)
   reaches `top_p`, renormalised.

The order of the cuts is vLLM's. A learner also passes the tokens it scores as `keep`: the
sampled token is always in the sampler's own cut, but a learner's logits differ from the
sampler's by round-off, and a token at the edge of the nucleus would otherwise score -inf.
"""

from __future__ import annotations

import torch

# Round-off at the edge of the nucleus: a token whose preceding mass is this close to top_p is
# still cut, as it is when the mass reaches top_p exactly.
_EDGE = 1e-12


def sampling_distribution(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probabilities (B, vocab) of the distribution each row samples from; -inf outside
    its cuts. `temperature`, `top_p` and `top_k` (0: no top-k cut) are (B,); `keep` (B, vocab)
    marks tokens never cut. Computed in the dtype of `logits`; differentiable."""
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits.dtype)
    logp = torch.log_softmax(logits / scale[:, None], dim=-1)
    if not cuts(temperature, top_p, top_k):
        return logp  # nothing is cut: no sort over the vocabulary
    cuts_k = top_k is not None and bool((top_k > 0).any())
    with torch.no_grad():  # which tokens are cut is not differentiated
        kept = _kept(logp.detach(), greedy, top_p, top_k if cuts_k else None)
        if keep is not None:
            kept |= keep & ~greedy[:, None]
    cut = torch.where(kept, logp, torch.tensor(-torch.inf, dtype=logp.dtype))
    return torch.log_softmax(cut, dim=-1)


def cuts(temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor | None) -> bool:
    """Whether any row's distribution cuts tokens (greedy, top-p below 1, or a top-k)."""
    return (
        bool((temperature <= 0).any())
        or bool((top_p < 1).any())
        or (top_k is not None and bool((top_k > 0).any()))
    )


def _kept(
    logp: torch.Tensor, greedy: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor | None
) -> torch.Tensor:
    """(B, vocab) True on the tokens the cuts keep."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    if top_k is not None:
        rank = torch.arange(logp.shape[-1], device=logp.device)
        in_k = (top_k <= 0)[:, None] | (rank[None, :] < top_k[:, None])
        sorted_logp = torch.log_softmax(
            torch.where(in_k, sorted_logp, torch.tensor(-torch.inf, dtype=logp.dtype)), dim=-1
        )
    probabilities = sorted_logp.exp()
    mass_before = probabilities.cumsum(dim=-1) - probabilities
    keep_sorted = mass_before < top_p.to(mass_before.dtype)[:, None] - _EDGE
    if top_k is not None:
        keep_sorted &= in_k
    keep_sorted[:, 0] = True
    keep_sorted[greedy, 1:] = False
    return torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
