"""`[model]`: which model a run trains and samples, one struct per kind (a tagged union on
`kind`), read without torch.

- `tiny`: the reference decoder (`callgrove.networks.TinyDecoder`) over the character vocabulary
  of the built-in environments, trained from scratch;
- `hf`: a Hugging Face causal LM (`name`: `hf:PATH`, a checkpoint folder or .gguf file, or a
  packaged name such as `smollm2-135m`) with its own tokenizer and chat template, sampled in
  this process;
- `vllm`: the same, sampled by vLLM servers (`[model.vllm]`: `callgrove.policy.vllm`).

`kind` may be left out: `name = "tiny"` (or no name) is `tiny`, another name `hf`, and a
`[model.vllm]` table makes it `vllm`. `callgrove.models.open_model` builds any
of them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from callgrove.chat import PARSERS
from callgrove.errors import InvalidValue
from callgrove.formats.ranges import check_choice, check_range
from callgrove.networks.sizes import LoraSettings, TinyConfig
from callgrove.policy.vllm import DTYPES, VllmSettings

_TINY = TinyConfig()  # the reference decoder's default size, written there once
_LORA = LoraSettings(rank=1)  # the adapters' defaults, written there once


class _Model(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="kind"):
    max_batch: int = 512
    """The most calls one sampling round decodes together."""

    def __post_init__(self) -> None:
        check_range("max_batch", self.max_batch, at_least=1)

    @property
    def kind(self) -> str:
        """`tiny`, `hf` or `vllm`: the tag this struct is written with."""
        return str(self.__struct_config__.tag)


class TinyModel(_Model, tag="tiny"):
    """`kind = "tiny"`: the reference decoder's size (it checks itself)."""

    d_model: int = _TINY.d_model
    n_heads: int = _TINY.n_heads
    n_layers: int = _TINY.n_layers
    d_ff: int = _TINY.d_ff

    def __post_init__(self) -> None:
        super().__post_init__()
        self.size(_TINY.vocab_size)

    def size(self, vocab_size: int) -> TinyConfig:
        """The decoder's size over a vocabulary of `vocab_size` tokens."""
        return TinyConfig(vocab_size, self.d_model, self.n_heads, self.n_layers, self.d_ff)


class HfModel(_Model, tag="hf"):
    """`kind = "hf"`: a Hugging Face causal LM, sampled in this process."""

    name: str
    """`hf:PATH` (a local checkpoint folder or .gguf file; hub ids are not fetched) or a
    packaged name (`smollm2-135m`)."""
    attention: str = "sdpa"
    """The attention implementation each block runs through (transformers' names)."""
    dtype: str = "float32"
    lora_rank: int = 0
    """Train low-rank adapters of this rank on the attention projections (0: every weight)."""
    lora_alpha: float = _LORA.alpha
    gradient_checkpointing: bool = False
    tool_parser: str = "hermes"
    """How tool calls are read back from completions (`callgrove.chat.PARSERS`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.name.startswith("hf:") and ("/" in self.name or ":" in self.name):
            raise InvalidValue(
                f"name {self.name!r}: expected 'hf:PATH' or a packaged name (`hf:PATH` is a local "
                "checkpoint folder or .gguf file: hub ids such as 'org/model' are not fetched)"
            )
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("tool_parser", self.tool_parser, PARSERS)
        check_range("lora_rank", self.lora_rank, at_least=0)
        check_range("lora_alpha", self.lora_alpha, above=0)

    def lora(self) -> LoraSettings | None:
        """The adapters `lora_rank` asks for (None: every weight trains)."""
        return LoraSettings(self.lora_rank, self.lora_alpha) if self.lora_rank else None


class VllmModel(HfModel, tag="vllm"):
    """`kind = "vllm"`: a Hugging Face model trained here and sampled by vLLM servers."""

    vllm: VllmSettings = msgspec.field(default_factory=VllmSettings)
    """`[model.vllm]`: where the servers come from and how started ones run."""


ModelSettings = TinyModel | HfModel | VllmModel
MODEL_KINDS: dict[str, type[ModelSettings]] = {"tiny": TinyModel, "hf": HfModel, "vllm": VllmModel}


def model_from_name(name: str, **settings: Any) -> ModelSettings:
    """The settings a command line's `--model NAME` means: `tiny`, or a Hugging Face model."""
    if name == "tiny":
        return TinyModel(**{k: v for k, v in settings.items() if k in TinyModel.__struct_fields__})
    return HfModel(
        name=name, **{k: v for k, v in settings.items() if k in HfModel.__struct_fields__}
    )


OLD_FORMS_END = "0.2.0"
"""The release from which the old spellings (`[model] options`, a Hugging Face `[model]` with the
reference decoder's sizes, `--template`) are no longer read; until then each is read with a note
saying so."""
_UNTIL = f"(read so until callgrove {OLD_FORMS_END})"

_TINY_ONLY = ("d_model", "n_heads", "n_layers", "d_ff")
# `[model] options` (a table of a Hugging Face model's settings) before they were keys of their own.
_OPTIONS = ("attention", "dtype", "lora_rank", "lora_alpha", "gradient_checkpointing")


def model_table(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A `[model]` table as the union reads it: `kind` filled in where left out, and the
    spellings it replaced converted; with a note for each converted one."""
    table = dict(raw)
    notes = []
    # What a run saved before `kind`: its config wrote `vllm = null` and `options = {}` unset.
    if "vllm" in table and table["vllm"] is None:
        del table["vllm"]
    if table.get("options") == {}:
        del table["options"]
    if "kind" not in table:
        name = table.get("name", "tiny")
        table["kind"] = "tiny" if name == "tiny" else "vllm" if "vllm" in table else "hf"
        # Before `kind`, one table held every kind's keys and the name's backend read its own.
        # Keys the other kind defines are left out, with a note; any other stays an error.
        if table["kind"] != "tiny":
            sizes = [key for key in _TINY_ONLY if key in table]
            for key in sizes:
                del table[key]
            if sizes:
                notes.append(
                    f"model.{', model.'.join(sizes)}: the reference decoder's size, left out "
                    f'for {name!r} (a checkpoint has its own; write kind = "hf" without them) '
                    f"{_UNTIL}"
                )
    if table["kind"] == "tiny" and table.get("name") == "tiny":
        del table["name"]
    if table["kind"] == "tiny" and "vllm" in table:
        raise InvalidValue(
            'model.vllm: vLLM serves Hugging Face checkpoints (kind = "vllm" with name = '
            "'hf:PATH' or 'smollm2-135m'), not the reference decoder"
        )
    options = table.pop("options", None)
    if isinstance(options, dict):
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise InvalidValue(f"model.options: unknown {unknown} (known: {list(_OPTIONS)})")
        table.update(options)
        keys = ", ".join(f"{key} = {value!r}" for key, value in options.items())
        notes.append(f"model.options is no more: read as [model] {keys}, write them so {_UNTIL}")
    elif options is not None:
        table["options"] = options  # not a table: the union says what is wrong
    return table, notes
