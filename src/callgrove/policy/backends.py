"""Policy backends by model name: what builds the learner, its sampler and the chat.

`model.name` in a training config picks a backend by its prefix (`tiny`; `hf:PATH` and the
packaged `smollm2-135m` for Hugging Face models, `callgrove.policy.hf`). A factory gets the model settings, the learner settings and the run's
seed and returns a `PolicyBackend`; `register_backend` adds one. `[model.vllm]` then replaces
the backend's sampler with vLLM servers of its checkpoint (`callgrove.policy.vllm`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from callgrove.chat import CharFormat, ChatFormat
from callgrove.formats.ranges import check_range
from callgrove.policy.learner import PolicyBackend, TrainableSampler
from callgrove.policy.vllm import Launcher, VllmSettings
from callgrove.train import require_torch
from callgrove.train.settings import LearnerSettings

if TYPE_CHECKING:
    from callgrove.train import TinyConfig


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
    vllm: VllmSettings | None = None
    """`[model.vllm]`: sample with vLLM servers instead of in this process."""

    def __post_init__(self) -> None:
        _factory(self.name)
        if self.vllm is not None and self.name == "tiny":
            raise ValueError(
                "vllm: vLLM serves Hugging Face checkpoints (name = 'hf:PATH' or "
                "'smollm2-135m'), not the reference decoder"
            )
        check_range("max_batch", self.max_batch, at_least=1)
        if self.name == "tiny":
            with_trainer(lambda: tiny_config(self))


def with_trainer(check: Callable[[], object]) -> None:
    """Run a check of settings the trainer defines (they live beside torch). Without torch a
    config still loads; training then says which extra to install."""
    if importlib.util.find_spec("torch") is None:
        return
    check()


BackendFactory = Callable[[ModelSettings, LearnerSettings, int, bool], PolicyBackend]
"""(model, learner settings, seed, with_sampler): with_sampler False leaves the backend's
sampler None, for one that samples elsewhere (vLLM servers, Ray's sampler actor)."""
SamplerFactory = Callable[[ModelSettings, int], tuple[TrainableSampler, ChatFormat]]


@dataclass(frozen=True)
class Backend:
    build: BackendFactory
    sampler: SamplerFactory | None = None
    """The sampler and chat format alone, no learner (none: `build`'s, with default learner
    settings): what sampling an episode without training needs."""


_BACKENDS: dict[str, Backend] = {}


def register_backend(
    prefix: str, factory: BackendFactory, sampler: SamplerFactory | None = None
) -> None:
    _BACKENDS[prefix] = Backend(factory, sampler)


def build_policy(
    model: ModelSettings,
    learner: LearnerSettings,
    seed: int,
    launch_server: Launcher | None = None,
    sampler: TrainableSampler | None = None,
) -> PolicyBackend:
    """`launch_server`: how `[model.vllm]` servers start (a process here by default; on Ray,
    in an actor). `sampler`: one that runs elsewhere (Ray's sampler actor), used as it is; no
    copy of the model is made here for sampling."""
    require_torch()  # every learner trains with it
    if sampler is None and model.vllm is not None and not model.vllm.urls:
        from callgrove.policy.vllm import interpreter

        interpreter(model.vllm)  # before the model loads: a missing venv is said at once
    backend = _factory(model.name).build(
        model, learner, seed, sampler is None and model.vllm is None
    )
    if sampler is not None:
        backend.sampler = sampler
    elif model.vllm is not None:
        from callgrove.policy.vllm import vllm_sampler
        from callgrove.train.hf_model import checkpoint_folder, resolve_model

        options = getattr(backend.learner, "options", None)  # an HFLearner's LoRA settings
        lora = getattr(options, "lora", None)
        folder = checkpoint_folder(resolve_model(model.name))
        backend.sampler = vllm_sampler(model.vllm, folder, lora, seed, launch_server)
    return backend


def build_sampler(model: ModelSettings, seed: int) -> tuple[TrainableSampler, ChatFormat]:
    """A model's sampler and chat format, without building a learner or its optimizer (vLLM
    servers, which take the learner's weights, come with one)."""
    backend = _factory(model.name)
    if backend.sampler is not None and model.vllm is None:
        return backend.sampler(model, seed)
    built = build_policy(model, LearnerSettings(), seed)
    return built.sampler, built.chat


def _factory(name: str) -> Backend:
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
        vocab_size=CharFormat().vocab_size,
        d_model=model.d_model,
        n_heads=model.n_heads,
        n_layers=model.n_layers,
        d_ff=model.d_ff,
    )


def _tiny_sampler(
    model: ModelSettings, seed: int, weights: dict[str, Any] | None = None
) -> tuple[TrainableSampler, ChatFormat]:
    """The reference decoder over the character vocabulary of the built-in environments,
    seeded (or holding `weights`)."""
    require_torch()
    import torch

    from callgrove.policy.local import LocalSampler
    from callgrove.train import TinyDecoder

    chat = CharFormat()
    torch.manual_seed(seed)
    sampler_model = TinyDecoder(tiny_config(model))
    if weights is not None:
        sampler_model.load_state_dict(weights)
    return LocalSampler(sampler_model, seed, model.max_batch, text_of=chat.text_of), chat


def _tiny(
    model: ModelSettings, learner: LearnerSettings, seed: int, with_sampler: bool
) -> PolicyBackend:
    from callgrove.train.learner import TinyLearner
    from callgrove.train.ranks import ranked_or_local

    trainer = ranked_or_local(partial(TinyLearner, tiny_config(model), seed=seed), learner)
    sampler, chat = _tiny_sampler(model, seed, trainer.weights())
    return PolicyBackend(trainer, sampler if with_sampler else None, chat)  # type: ignore[arg-type]


register_backend("tiny", _tiny, _tiny_sampler)


def _hf(
    model: ModelSettings, learner: LearnerSettings, seed: int, with_sampler: bool
) -> PolicyBackend:
    from callgrove.policy.hf import hf_backend

    return hf_backend(model, learner, seed, with_sampler)


def _hf_sampler(model: ModelSettings, seed: int) -> tuple[TrainableSampler, ChatFormat]:
    require_torch()
    from callgrove.policy.hf import hf_sampler

    return hf_sampler(model, seed)


register_backend("hf", _hf, _hf_sampler)
register_backend("smollm2-135m", _hf, _hf_sampler)
