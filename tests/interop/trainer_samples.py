"""Credited samples for the trainer adapters' tests: rows with holes (tool results between turns,
context-only calls), advantages that change along a row, stale sampling logprobs near a model's
own (some importance ratios clipped, some not), no top-p or top-k cut.

Two sources: `login`, the bundled two-episode group, and `synthetic`, a group of generated
episodes with fresh subagents, forks and forks of forks, background agents, twins and a
compaction in every agent. Calls are sampled at one temperature, or at several taken in turn
(`temperature` a tuple) for the trainers that score each token at its own."""

from __future__ import annotations

import copy

import numpy as np
import torch

from callgrove.batch import Sample, build_samples
from callgrove.episode import load, sampling_record
from callgrove.rows import EpisodeRows, build_rows
from callgrove.synth import Shape, synth_episode
from train.helpers import EXAMPLES, VOCAB, sample_near_the_model, tiny_llama

TEMPERATURE = 1.0
SOURCES = ("login", "synthetic")
# Every kind of agent and both fork depths, small enough for a float64 model on a CPU.
SYNTHETIC = Shape(
    leader_calls=6,
    fresh=2,
    forks=1,
    fork_depth=2,
    background=1,
    twins=1,
    subagent_calls=3,
    compactions=1,
    context=96,
    group_size=2,
    vocab=VOCAB,
)


def source_episodes(source: str):
    if source == "login":
        return load(EXAMPLES / "login_group.jsonl")
    return [synth_episode(SYNTHETIC, seed) for seed in range(SYNTHETIC.group_size)]


def credited_rows(
    seed: int = 0, temperature: float | tuple[float, ...] = TEMPERATURE, source: str = "login"
) -> list[EpisodeRows]:
    """Rows of `source` with an advantage per completion token; calls sampled at `temperature`,
    or at each of a tuple's in turn."""
    episode_rows = [build_rows(e) for e in source_episodes(source)]
    rng = np.random.default_rng(seed)
    temperatures = temperature if isinstance(temperature, tuple) else (temperature,)
    for er in episode_rows:
        for number, call in enumerate(er.forest.calls):
            call.advantages = rng.normal(size=len(call.completion_ids))  # one per token
            call.sampling = sampling_record(temperatures[number % len(temperatures)], 1.0)
    return episode_rows


def first_loss_call(episode_rows: list[EpisodeRows]):
    """The first call with loss in the first row of the first episode."""
    first = episode_rows[0]
    return first.loss_calls(first.rows[0])[0]


def reference_model(dtype: torch.dtype = torch.float64):
    """The tiny random Llama behind callgrove's reference interface (`HFPolicyModel`)."""
    return tiny_llama(dtype, "eager")


def plain_copy(reference) -> torch.nn.Module:
    """The same weights as a plain `LlamaForCausalLM`, as a trainer loads it. Its attention is
    sdpa: transformers' eager attention turns a left-padded batch's fully masked pad rows
    into NaN, which reach every token through the next layer (0 x NaN)."""
    from transformers import LlamaForCausalLM

    config = copy.deepcopy(reference.model.config)  # the copy's attention is its own
    model = LlamaForCausalLM(config).to(next(reference.parameters()).dtype)
    model.load_state_dict(reference.model.state_dict())
    model.set_attn_implementation("sdpa")
    return model


def trainer_samples(
    reference,
    seed: int = 0,
    temperature: float | tuple[float, ...] = TEMPERATURE,
    source: str = "login",
) -> tuple[list[EpisodeRows], list[Sample]]:
    episode_rows = credited_rows(seed, temperature, source)
    sample_near_the_model(reference, episode_rows, seed)
    samples = [s for s in build_samples(episode_rows) if s.num_loss_tokens]
    assert_rows_have_holes_and_varying_advantages(samples)
    return episode_rows, samples


def assert_rows_have_holes_and_varying_advantages(samples: list[Sample]) -> None:
    """The samples exercise what the adapters must carry over (else the tests prove little)."""
    holes = 0
    for sample in samples:
        trained = np.flatnonzero(sample.loss_mask)
        holes += int(trained[-1] - trained[0] + 1 - len(trained))
    assert holes > 0, "no row has a hole inside its trained span"
    assert any(len(np.unique(s.advantages[s.loss_mask == 1])) > 1 for s in samples)
