"""The one door to a model: `open_model(settings)` builds what a command needs of `[model]`.

`callgrove train` (RL and SFT), `serve-policy`, `gateway --model`, `import --model` and
`race` all open their model here, so one `[model]` (or one `--model NAME`) means the same chat
format, sampler and learner everywhere. Each kind of `callgrove.models.settings` has its
builder: the reference decoder (`tiny`), a Hugging Face model sampled in this process (`hf`,
`callgrove.models.hf`), or one sampled by vLLM servers (`vllm`, `callgrove.policy.vllm`). Whether
the learner trains in this process or across ranks is `train.world_size`'s, decided by
`callgrove.train.ranks.ranked_or_local` for every kind.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from callgrove.chat import BuiltinFormat, CharFormat, ChatFormat, JinjaFormat
from callgrove.errors import InvalidValue
from callgrove.models.backend import PolicyBackend
from callgrove.models.settings import HfModel, ModelSettings, TinyModel, VllmModel
from callgrove.policy.client import TrainableSampler
from callgrove.policy.vllm import Launcher
from callgrove.train.settings import LearnerSettings

if TYPE_CHECKING:
    from callgrove.train.learner import TinyLearner


def open_model(
    settings: ModelSettings,
    *,
    seed: int = 0,
    learner: LearnerSettings | None = None,
    sample: bool = True,
    sampler: TrainableSampler | None = None,
    launch_server: Launcher | None = None,
    chat: ChatFormat | None = None,
) -> PolicyBackend:
    """The model's chat format; its sampler unless `sample` is False (another samples: a
    gateway's upstream); its learner where `learner` settings are given.

    `sampler`: one that runs elsewhere (Ray's sampler actor), used as it is; no copy of the
    model is made here for sampling. `launch_server`: how `vllm` servers start (a process here
    by default; on Ray, in an actor). `chat`: the vocabulary the reference decoder works over
    (default: the characters of the built-in environments); a Hugging Face model brings its own.
    """
    if isinstance(settings, TinyModel):
        built = _tiny(settings, seed, learner, sample and sampler is None, chat or CharFormat())
    elif isinstance(settings, VllmModel):
        built = _vllm(settings, seed, learner, sample and sampler is None, launch_server)
    else:
        built = _hf(settings, seed, learner, sample and sampler is None)
    if sampler is not None:
        built.sampler = sampler
    return built


def _tiny(
    settings: TinyModel,
    seed: int,
    learner: LearnerSettings | None,
    sample: bool,
    chat: ChatFormat,
) -> PolicyBackend:
    from callgrove.networks import require_torch

    require_torch()
    size = settings.size(chat.vocab_size)
    trainer = None
    if learner is not None:
        from callgrove.train.learner import TinyLearner
        from callgrove.train.ranks import ranked_or_local

        trainer = ranked_or_local(partial(TinyLearner, size, seed=seed), learner)
    built = PolicyBackend(chat, learner=trainer)  # type: ignore[arg-type]
    if sample:
        built.sampler = _tiny_sampler(settings, seed, chat, trainer)
    return built


def _tiny_sampler(
    settings: TinyModel, seed: int, chat: ChatFormat, trainer: TinyLearner | None
) -> TrainableSampler:
    """The reference decoder, seeded, holding the learner's weights where there is one."""
    import torch

    from callgrove.networks.tiny import TinyDecoder
    from callgrove.policy.batching import LocalSampler

    torch.manual_seed(seed)
    model = TinyDecoder(settings.size(chat.vocab_size))
    if trainer is not None:
        model.load_state_dict(trainer.weights())
    return LocalSampler(model, seed, settings.max_batch, text_of=chat.text_of)


def _hf(
    settings: HfModel, seed: int, learner: LearnerSettings | None, sample: bool
) -> PolicyBackend:
    from callgrove.networks import require_torch

    require_torch()
    from callgrove.models.hf import hf_backend, hf_chat, hf_sampler, hf_tokenizer

    if learner is not None:
        return hf_backend(settings, learner, seed, sample)
    if sample:
        return hf_sampler(settings, seed)
    return PolicyBackend(hf_chat(hf_tokenizer(settings), settings))


def _vllm(
    settings: VllmModel,
    seed: int,
    learner: LearnerSettings | None,
    sample: bool,
    launch_server: Launcher | None,
) -> PolicyBackend:
    if sample and not settings.vllm.urls:
        from callgrove.policy.vllm import interpreter

        interpreter(settings.vllm)  # before the model loads: a missing venv is said at once
    built = _hf(settings, seed, learner, sample=False)
    if sample:
        from callgrove.networks.hf import checkpoint_folder, resolve_model
        from callgrove.policy.vllm import vllm_sampler

        folder = checkpoint_folder(resolve_model(settings.name))
        built.sampler = vllm_sampler(settings.vllm, folder, settings.lora(), seed, launch_server)
    return built


def chat_from_files(
    tokenizer: Path | None,
    template: Path | None,
    variables: dict[str, Any] | None = None,
    *,
    parser: str = "hermes",
    allow_dropped: bool = False,
) -> ChatFormat:
    """A chat format from files where no model is named: a model folder (its tokenizer.json
    and chat template), a tokenizer.json with a template file (or a folder with another
    template), or neither: the built-in byte format. An `InvalidValue` for a lone template or
    tokenizer.json; `InputError`s of the template as they are."""
    if tokenizer is None and template is None:
        return BuiltinFormat()
    folder = tokenizer is not None and tokenizer.is_dir()
    if tokenizer is None or (template is None and not folder):
        raise InvalidValue(
            "--chat-template needs --tokenizer, and a tokenizer.json needs --chat-template (a "
            "model folder holds both)"
        )
    if folder and template is None:
        return JinjaFormat.from_folder(
            tokenizer, variables, allow_dropped=allow_dropped, parser=parser
        )
    if folder:
        tokenizer = tokenizer / "tokenizer.json"
    return JinjaFormat(
        tokenizer,
        template,  # type: ignore[arg-type]
        variables,
        allow_dropped=allow_dropped,
        parser=parser,
    )
