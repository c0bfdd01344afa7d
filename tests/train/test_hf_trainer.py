"""The HF learner: a step's micro-batches add up to the tree-packed step, supervised rows train by
cross-entropy, LoRA trains only its adapters, gradient checkpointing changes nothing, and a saved
checkpoint continues exactly where it stopped."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch

from callgrove.batch import build_samples
from callgrove.credit import finalize_group
from callgrove.credit.grpo import GRPO
from callgrove.episode import load
from callgrove.networks.sizes import LoraSettings
from callgrove.rows import build_rows
from callgrove.train.hf_trainer import HFLearner, HFOptions
from callgrove.train.settings import LearnerSettings

from .helpers import EXAMPLES, give_advantages, sample_near_the_model, tiny_llama

pytestmark = pytest.mark.hf


def group_samples(supervised: bool = False, seed: int = 2):
    episodes = list(load(EXAMPLES / "login_group.jsonl"))
    for episode in episodes:
        episode.objective = "supervised" if supervised else None
    episode_rows = [build_rows(e) for e in episodes]
    if not supervised:
        give_advantages(episode_rows, seed)
        sample_near_the_model(tiny_llama(torch.float64), episode_rows, seed)
    return build_samples(episode_rows)


def learner(
    settings: LearnerSettings,
    seed: int = 0,
    adapter_seed: int = 0,
    **options,
) -> HFLearner:
    model = tiny_llama(torch.float64, "eager", seed).model
    torch.manual_seed(adapter_seed)
    return HFLearner(model, settings, HFOptions(**options))


def parameters(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_same_parameters(a, b):
    for name, value in a.items():
        assert torch.equal(b[name], value), name


@pytest.mark.parametrize("objective", ["rl", "sft"])
def test_packed_micro_batches_step_like_the_tree_packed_step(objective):
    samples = group_samples(supervised=objective == "sft")
    tree = learner(LearnerSettings(learning_rate=1e-2, objective=objective))
    packed = learner(
        LearnerSettings(learning_rate=1e-2, batching="packed", seq_len=80, objective=objective)
    )
    assert len(packed.model_batches(samples)) > 1
    tree_report, packed_report = tree.train_step(samples), packed.train_step(samples)
    assert tree_report.forwarded_tokens < packed_report.forwarded_tokens
    assert tree_report.row_tokens == packed_report.row_tokens
    assert tree_report.loss == pytest.approx(packed_report.loss, rel=1e-6)
    assert tree_report.grad_norm > 0
    assert tree.version == packed.version == 1
    # The step's gradients (left on the parameters) agree; Adam's steps of nearly-zero ones may not.
    for (name, got), want in zip(
        tree.model.named_parameters(), packed.model.parameters(), strict=True
    ):
        error = (got.grad - want.grad).norm() / want.grad.norm()
        assert error < 1e-5, name


def test_supervised_samples_have_no_advantages_and_their_loss_falls():
    samples = group_samples(supervised=True)
    assert all(s.advantages is None for s in samples)
    assert sum(s.num_loss_tokens for s in samples) > 0
    sft = learner(LearnerSettings(learning_rate=3e-2, objective="sft"))
    losses = [sft.train_step(samples).loss for _ in range(8)]
    assert losses[-1] < 0.8 * losses[0], losses
    with pytest.raises(ValueError, match="advantages"):
        learner(LearnerSettings(objective="rl")).train_step(samples)


def test_finalize_group_refuses_supervised_episodes():
    episodes = list(load(EXAMPLES / "login_group.jsonl"))
    episodes[1].objective = "supervised"
    with pytest.raises(ValueError, match="supervised"):
        finalize_group(GRPO(), episodes)


def test_lora_trains_only_its_adapters():
    samples = group_samples()
    lora = learner(LearnerSettings(learning_rate=1e-2), lora=LoraSettings(rank=4))
    assert set(lora.weights()) and all("lora_" in name for name in lora.weights())
    before = parameters(lora.hf_model)
    lora.train_step(samples)
    after = parameters(lora.hf_model)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all("lora_" in n for n in changed)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_lora_run_warns_of_nothing(checkpointing):
    """No FutureWarning on Hugging Face runs: none from wrapping a model with LoRA (with and
    without checkpointing), none from a step, and the clip fraction is reported."""
    samples = group_samples()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        trained = learner(
            LearnerSettings(), lora=LoraSettings(rank=4), gradient_checkpointing=checkpointing
        )
        report = trained.train_step(samples)
    assert 0.0 <= report.extra["clip_fraction"] <= 1.0


def test_gradient_checkpointing_gives_the_same_step():
    samples = group_samples()
    plain = learner(LearnerSettings(learning_rate=1e-2))
    checkpointed = learner(LearnerSettings(learning_rate=1e-2), gradient_checkpointing=True)
    assert plain.train_step(samples).loss == checkpointed.train_step(samples).loss
    assert_same_parameters(parameters(plain.model), parameters(checkpointed.model))


@pytest.mark.parametrize("lora", [None, LoraSettings(rank=4)])
def test_a_saved_checkpoint_continues_exactly(tmp_path, lora):
    samples = group_samples()
    settings = LearnerSettings(learning_rate=1e-2)
    straight = learner(settings, lora=lora)
    for _ in range(3):
        straight.train_step(samples)

    first = learner(settings, lora=lora)
    first.train_step(samples)
    first.save(tmp_path / "step-1")
    # Other initial trained weights (LoRA: the same base model, other adapters): the checkpoint
    # must set them.
    resumed = learner(settings, seed=0 if lora else 5, adapter_seed=5, lora=lora)
    resumed.load(tmp_path / "step-1")
    assert resumed.version == 1
    for _ in range(2):
        resumed.train_step(samples)
    assert resumed.version == straight.version == 3
    assert_same_parameters(parameters(straight.model), parameters(resumed.model))


def test_a_checkpoint_of_other_settings_is_refused(tmp_path):
    learner(LearnerSettings(), lora=LoraSettings(rank=4)).save(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="do not match"):
        learner(LearnerSettings()).load(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match="has no weights"):
        learner(LearnerSettings()).load(tmp_path)


def test_an_empty_step_still_counts():
    step = learner(LearnerSettings()).train_step([])
    assert step.loss == 0.0 and step.forwarded_tokens == 0


class _RunsCode:
    """Unpickled, it would create `marker`: what a crafted checkpoint could do instead."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (self.marker.touch, ())


def test_a_checkpoint_that_would_run_code_is_refused_unrun(tmp_path):
    learner(LearnerSettings()).save(tmp_path / "ckpt")
    marker = tmp_path / "ran"
    torch.save({"version": _RunsCode(marker)}, tmp_path / "ckpt" / "trainer.pt")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        learner(LearnerSettings()).load(tmp_path / "ckpt")
    assert not marker.exists()
