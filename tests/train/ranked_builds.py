"""What the ranks tests train: float64 learners that every rank builds alike (seeded), and a
step's samples of synthetic groups with forks, forks of forks, background agents, twins and
compactions, credited by GRPO. The ranks import this module to build their learners."""

from __future__ import annotations

import torch

from callgrove.batch import Sample, build_samples
from callgrove.credit import GRPO, finalize_group
from callgrove.episode import sampling_record
from callgrove.networks.sizes import LoraSettings
from callgrove.rows import build_rows
from callgrove.synth import Shape, synth_episode
from callgrove.train.hf_trainer import HFLearner, HFOptions
from callgrove.train.learner import ModelLearner, TinyLearner
from callgrove.train.settings import LearnerSettings

from .helpers import CONFIG, VOCAB, tiny_llama

SHAPE = Shape(
    leader_calls=4,
    fresh=1,
    forks=1,
    fork_depth=2,
    background=1,
    twins=1,
    subagent_calls=2,
    compactions=1,
    context=64,
    group_size=2,
    vocab=VOCAB,
)
# Each call samples at one of these (temperature, top-p): the ranks score every token under its own.
SAMPLINGS = [(1.0, 1.0), (0.7, 1.0), (1.3, 0.9)]


def step_samples(first_seed: int, groups: int = 3) -> list[Sample]:
    """`groups` groups of `SHAPE`, from episode seed `first_seed` on, credited by GRPO."""
    episodes = [
        synth_episode(SHAPE, seed)
        for seed in range(first_seed, first_seed + groups * SHAPE.group_size)
    ]
    for start in range(0, len(episodes), SHAPE.group_size):
        finalize_group(GRPO(), episodes[start : start + SHAPE.group_size])
    for episode in episodes:
        for number, call in enumerate(episode.calls()):
            call.sampling = sampling_record(*SAMPLINGS[number % len(SAMPLINGS)])
            call.policy_version = number % 2  # some sampled by the weights a first step trains
    return build_samples([build_rows(e) for e in episodes])


def tiny(settings: LearnerSettings, seed: int = 0) -> ModelLearner:
    learner = TinyLearner(CONFIG, settings, seed)
    learner.model.double()
    learner.build_optimizer()
    return learner


def hf(lora: bool, settings: LearnerSettings, seed: int = 0) -> ModelLearner:
    model = tiny_llama(torch.float64, "eager", seed).model
    options = HFOptions(LoraSettings(rank=4) if lora else None)
    learner = HFLearner(model, settings, options)
    learner.model.double()  # peft's adapters too
    learner.build_optimizer()
    return learner


def moe(folder: str, settings: LearnerSettings, seed: int = 0) -> ModelLearner:
    """The built-in mixture of experts in float64, from the folder the test made (the ranks
    come from a forkserver that may predate the test's cache setting)."""
    from callgrove.networks.hf import load_model

    model, _ = load_model(f"hf:{folder}", torch.float64)
    return HFLearner(model, settings)
