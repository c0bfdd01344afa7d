"""Policy backends by model name: what builds the learner, its sampler and the renderer.

`model.name` in a training config picks a backend by its prefix (`tiny`; `hf:PATH` and the
packaged `smollm2-135m` for Hugging Face models, `callgrove.policy.hf`). A factory gets the model settings, the learner settings and the run's
seed and returns a `PolicyBackend`; `register_backend` adds one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from callgrove.batch.tree import TreeSettings
from callgrove.formats.ranges import check_range
from callgrove.policy.learner import Learner, TrainableSampler
from callgrove.policy.render import CharRenderer, Renderer

if TYPE_CHECKING:
    from callgrove.train import TinyConfig
    from callgrove.train.learner import LearnerSettings


class ModelSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`[model]`: which backend, and the reference decoder's size (other backends read
    their own settings from `options`)."""

    name: str = "tiny"
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128
    max_batch: int = 512
    options: dict[str, Any] = {}

    def __post_init__(self) -> None:
        _factory(self.name)
        check_range("max_batch", self.max_batch, at_least=1)
        if self.name == "tiny":
            with_trainer(lambda: tiny_config(self))


class LearnerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`[train]`: the optimizer and how a step's rows are forwarded."""

    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    batching: str = "tree"
    tree_scope: str = TreeSettings().scope
    """Which rows share trie nodes: `tree`, `episode`, `group`, or `step` (rows of every group,
    a trie per micro-batch of `seq_len` nodes)."""
    seq_len: int = 4096
    """Tokens a micro-batch forwards (packed rows, or the trie nodes of tree scope `step`)."""
    clip_low: float = 0.2
    clip_high: float = 0.2
    normalisation: str = "token"
    entropy_coef: float = 0.0
    """Weight of the entropy bonus on every trained token (see `LossSettings`)."""
    mismatch_cap: float | None = None
    """Truncated importance sampling: cap each token's sampler-to-learner weight at this
    (unset: off; see `LossSettings`)."""
    mismatch_mask: str = "off"
    """`token` or `row`: drop tokens (or rows) whose sampler-to-learner ratio leaves
    `mismatch_bounds` (`off`: keep all)."""
    mismatch_bounds: list[float] = msgspec.field(default_factory=lambda: [0.5, 2.0])
    objective: str = "rl"
    """`rl` (episodes of `[env]`, the clipped policy-gradient loss) or `sft` (the episodes of
    `[data]`, cross-entropy on their assistant tokens)."""

    def __post_init__(self) -> None:
        # The learner's own checks run where the config is read, so a value outside its choices
        # or range (`objective = "rlhf"`, `learning_rate = inf`) is a config error naming the key.
        with_trainer(lambda: learner_settings(self))


def with_trainer(check: Callable[[], object]) -> None:
    """Run a check of settings the trainer defines (they live beside torch). Without torch a
    config still loads; training then says which extra to install."""
    try:
        import callgrove.train  # noqa: F401
    except ModuleNotFoundError:
        return
    check()


def learner_settings(learner: LearnerConfig) -> LearnerSettings:
    """The learner's settings (`callgrove.train.learner.LearnerSettings`) from `[train]`."""
    from callgrove.train import LossSettings
    from callgrove.train.learner import LearnerSettings

    return LearnerSettings(
        learning_rate=learner.learning_rate,
        weight_decay=learner.weight_decay,
        max_grad_norm=learner.max_grad_norm,
        batching=learner.batching,
        tree_scope=learner.tree_scope,
        seq_len=learner.seq_len,
        loss=LossSettings(
            learner.clip_low,
            learner.clip_high,
            learner.normalisation,
            learner.entropy_coef,
            learner.mismatch_cap,
            learner.mismatch_mask,
            _bounds(learner.mismatch_bounds),
        ),
        objective=learner.objective,
    )


def _bounds(values: list[float]) -> tuple[float, float]:
    if len(values) != 2:
        raise ValueError(f"mismatch_bounds must be [low, high], not {values}")
    return values[0], values[1]


@dataclass
class PolicyBackend:
    learner: Learner
    sampler: TrainableSampler
    renderer: Renderer
    model_folder: Path | None = None
    """The model's checkpoint folder (its tokenizer and chat template render imported
    transcripts for supervised training); None for a model without one."""


BackendFactory = Callable[[ModelSettings, LearnerConfig, int], PolicyBackend]
_BACKENDS: dict[str, BackendFactory] = {}


def register_backend(prefix: str, factory: BackendFactory) -> None:
    _BACKENDS[prefix] = factory


def build_policy(model: ModelSettings, learner: LearnerConfig, seed: int) -> PolicyBackend:
    return _factory(model.name)(model, learner, seed)


def _factory(name: str) -> BackendFactory:
    prefix = name.split(":", 1)[0]
    if prefix not in _BACKENDS:
        known = ", ".join(sorted(_BACKENDS))
        raise ValueError(
            f"name {name!r}: no backend {prefix!r} (known: {known}; `hf:PATH` is a local "
            "checkpoint folder or .gguf file: hub ids such as 'org/model' are not fetched)"
        )
    return _BACKENDS[prefix]


def tiny_config(model: ModelSettings) -> TinyConfig:
    """The reference decoder's size (it checks itself) over the character vocabulary."""
    from callgrove.train import TinyConfig

    return TinyConfig(
        vocab_size=CharRenderer().vocab_size,
        d_model=model.d_model,
        n_heads=model.n_heads,
        n_layers=model.n_layers,
        d_ff=model.d_ff,
    )


def _tiny(model: ModelSettings, learner: LearnerConfig, seed: int) -> PolicyBackend:
    """The reference decoder over the character vocabulary of the built-in environments."""
    from callgrove.policy.local import LocalSampler
    from callgrove.train.learner import TinyLearner

    renderer = CharRenderer()
    config = tiny_config(model)
    trainer = TinyLearner(config, learner_settings(learner), seed)
    from callgrove.train import TinyDecoder

    sampler_model = TinyDecoder(config)
    sampler_model.load_state_dict(trainer.weights())
    sampler = LocalSampler(sampler_model, seed, model.max_batch, text_of=renderer.parse)
    return PolicyBackend(trainer, sampler, renderer)


register_backend("tiny", _tiny)


def _hf(model: ModelSettings, learner: LearnerConfig, seed: int) -> PolicyBackend:
    from callgrove.policy.hf import hf_backend

    return hf_backend(model, learner, seed)


register_backend("hf", _hf)
register_backend("smollm2-135m", _hf)
