"""Rollout routing replay measured: a mixture of experts' episodes sampled by one copy of the
model and scored by a learner on another, with and without replaying the sampler's routes
(benchmarks/moe_replay.py, tests/train/test_route_replay.py).

The sampler's routing can be made to differ from the learner's own as it does between engines:
`noisy_routers` sends a token whose best experts nearly tie to either (its top-k of the gate
probabilities plus a little noise that is a function of the logits, so a prefix forwarded
again routes alike), its gate weights still the probabilities at the chosen experts."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

from callgrove.batch import build_samples
from callgrove.episode import Agent, Call, Episode, sampling_record
from callgrove.networks.moe import Routing
from callgrove.policy.client import SamplingParams
from callgrove.policy.decode import DecodeRequest
from callgrove.policy.hf_decode import hf_decode
from callgrove.rows import build_rows
from callgrove.train.hf_trainer import HFLearner, HFOptions
from callgrove.train.settings import LearnerSettings

if TYPE_CHECKING:
    from torch import nn


def noisy_routers(model: nn.Module, near_tie: float) -> None:
    """Route `model` as a fused kernel may: gate probabilities within about `near_tie` of each
    other go either way."""
    import torch

    for router in Routing.of(model).routers:
        own = router.forward

        def forward(hidden, router=router, own=own):
            logits, _, _ = own(hidden)
            probabilities = torch.softmax(logits, dtype=torch.float, dim=-1)
            noise = torch.frac(torch.sin(logits.double() * 1e3).abs() * 1e3).to(probabilities)
            _, experts = torch.topk(probabilities + near_tie * noise, router.top_k, dim=-1)
            weights = probabilities.gather(1, experts)
            weights = weights / weights.sum(-1, keepdim=True)
            return logits, weights.to(logits.dtype), experts

        router.forward = forward


class _Sampling:
    """Calls sampled by a model, recorded with their routes."""

    def __init__(self, model: nn.Module, tokenizer, temperature: float, seed: int):
        import torch

        self.model, self.tokenizer = model, tokenizer
        self.params = SamplingParams(max_tokens=10, temperature=temperature)
        self.generator = torch.Generator().manual_seed(seed)
        self.episode = Episode(f"moe-{seed}", rewards={"score": 1.0})

    def text(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer(text)["input_ids"], dtype=np.int32)

    def agent(self, agent_id: str, name: str, **start) -> Agent:
        agent = Agent(agent_id, name, **start)
        self.episode.agents.append(agent)
        self.episode.ledger()
        return agent

    def call(self, agent: Agent, prompt: np.ndarray, purpose: str = "turn") -> Call:
        [decoded] = hf_decode(
            self.model, self.tokenizer, [DecodeRequest(prompt, self.params)], self.generator
        )
        call = Call.make(
            f"{agent.id}{len(agent.calls)}",
            len(list(self.episode.calls())) + 1,
            prompt,
            decoded.completion_ids,
            decoded.logprobs,
            purpose=purpose,
            routes=decoded.routes,
            sampling=sampling_record(self.params.temperature),
            advantages=0.5,
        )
        agent.add(call)
        self.episode.ledger()
        return call

    def then(self, call: Call, text: str) -> np.ndarray:
        return np.concatenate([self.episode.full_ids(call), self.text(text)])


def sampled_episode(model: nn.Module, tokenizer, temperature: float, seed: int = 7) -> Episode:
    """A leader that forks a subagent, starts a background one and compacts its history, every
    call sampled by `model` with its routes."""
    s = _Sampling(model, tokenizer, temperature, seed)
    leader = s.agent("L", "leader")
    fork = s.agent("F", "fork", parent="L", start="fork")
    helper = s.agent("B", "background", parent="L", start="background")
    first = s.call(leader, s.text("<|im_start|>user\nfind the bug<|im_end|>\n"))
    second = s.call(leader, s.then(first, "tool: ok\n"))
    forked = s.call(fork, s.then(second, "fork: check tests\n"))
    s.call(fork, s.then(forked, "tool: 3 failed\n"))
    s.call(helper, s.text("<|im_start|>user\nwatch the logs<|im_end|>\n"))
    summary = s.call(leader, s.then(second, "summarise\n"), purpose="compaction")
    s.call(leader, np.concatenate([s.text("summary: "), summary.completion_ids, s.text("\ngo\n")]))
    return s.episode


def learner_mismatch(
    model: nn.Module,
    episodes: list[Episode],
    settings: LearnerSettings,
    options: HFOptions | None = None,
) -> dict[str, float]:
    """One step of a learner on a copy of `model`: its mismatch against the sampler, measured
    before the update, and its routing metrics."""
    samples = build_samples([build_rows(episode) for episode in episodes])
    report = HFLearner(copy.deepcopy(model), settings, options).train_step(samples)
    return report.mismatch | report.extra
