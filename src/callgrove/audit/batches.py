"""What a trainer was fed, read back as rows of tokens with their loss mask and advantages.

The forms are the ones callgrove's adapters hand each trainer (`callgrove.interop`):

- callgrove samples (`.parquet`, `.arrow`, `.jsonl`; `callgrove samples`), which name each
  row's episode and agent;
- prime-rl's `TrainingSample` list (`.msgpack`; `write_prime_rl`);
- a dict of tensors saved with `torch.save` (`.pt`) or `numpy.savez` (`.npz`) in one of the
  layouts below, told by its keys: TRL's GRPO batch (`trl_batch`), verl's `DataProto`
  tensors (`verl_arrays`; save `dict(data.batch.items())`), OpenRLHF's `Experience`
  (`openrlhf_arrays`) and NeMo RL's train data (`nemo_rl_arrays`, `write_nemo_rl`).

A row is its real tokens only (padding dropped by the batch's attention mask or lengths), with
the loss on where the trainer's loss would be: TRL's `completion_mask` times `tool_mask`,
verl's `response_mask`, OpenRLHF's `action_mask` (entry t is token t + 1's), NeMo RL's
`token_mask` times `sample_mask`, prime-rl's `mask`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import msgspec
import numpy as np

from callgrove.audit.referee import TrainedRow
from callgrove.batch import SAMPLE_FORMS, Sample, read_samples
from callgrove.errors import InvalidValue
from callgrove.formats.problems import InputError
from callgrove.interop.prime_rl import TrainingSample

PRIME_RL_SUFFIX = ".msgpack"
TENSOR_SUFFIXES = (".pt", ".npz")

Arrays = Mapping[str, np.ndarray]


def _trl(arrays: Arrays) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    width = arrays["prompt_ids"].shape[1]
    real = np.concatenate([arrays["prompt_mask"], arrays["completion_mask"]], axis=1) == 1
    ids = np.concatenate([arrays["prompt_ids"], arrays["completion_ids"]], axis=1)
    completion_loss = arrays["completion_mask"] * arrays.get(
        "tool_mask", np.ones_like(arrays["completion_mask"])
    )
    loss = np.zeros(ids.shape, dtype=bool)
    loss[:, width:] = completion_loss == 1
    advantages = _padded_left(arrays.get("advantages"), width, ids.shape)
    yield from _masked_rows(ids, real, loss, advantages)


def _verl(arrays: Arrays) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    ids = arrays["input_ids"]
    width = ids.shape[1] - arrays["responses"].shape[1]
    loss = np.zeros(ids.shape, dtype=bool)
    loss[:, width:] = arrays["response_mask"] == 1
    advantages = _padded_left(arrays.get("advantages"), width, ids.shape)
    yield from _masked_rows(ids, arrays["attention_mask"] == 1, loss, advantages)


def _openrlhf(arrays: Arrays) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    ids = arrays["sequences"]
    # entry t of a per-action field is token t + 1's
    loss = np.zeros(ids.shape, dtype=bool)
    loss[:, 1:] = arrays["action_mask"] == 1
    advantages = _padded_left(arrays.get("advantages"), 1, ids.shape)
    yield from _masked_rows(ids, arrays["attention_mask"] == 1, loss, advantages)


def _nemo_rl(arrays: Arrays) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    ids = arrays["input_ids"]
    real = np.arange(ids.shape[1])[None, :] < arrays["input_lengths"][:, None]
    sample_mask = arrays.get("sample_mask", np.ones(len(ids)))
    loss = (arrays["token_mask"] == 1) & (sample_mask[:, None] > 0)
    loss[:, 0] = False  # the loss reads the mask from position 1: the first token predicts none
    yield from _masked_rows(ids, real, loss, arrays.get("advantages"))


LAYOUTS: dict[str, tuple[frozenset[str], Callable]] = {
    "trl": (frozenset({"prompt_ids", "prompt_mask", "completion_ids", "completion_mask"}), _trl),
    "verl": (frozenset({"input_ids", "attention_mask", "responses", "response_mask"}), _verl),
    "openrlhf": (frozenset({"sequences", "attention_mask", "action_mask"}), _openrlhf),
    "nemo-rl": (frozenset({"input_ids", "input_lengths", "token_mask"}), _nemo_rl),
}
"""Each tensor layout by name: the keys that tell it, and how its rows are read."""

BATCH_FORMS = ("samples", "prime-rl", *LAYOUTS)


def _padded_left(
    values: np.ndarray | None, width: int, shape: tuple[int, ...]
) -> np.ndarray | None:
    """Per-response values placed behind `width` columns of zeros, as wide as the tokens."""
    if values is None:
        return None
    out = np.zeros(shape, dtype=np.float64)
    out[:, width : width + values.shape[1]] = values
    return out


def _masked_rows(ids, real, loss, advantages):
    for index in range(len(ids)):
        keep = real[index]
        row_advantages = None if advantages is None else advantages[index][keep]
        yield ids[index][keep], loss[index][keep], row_advantages


def batch_form(path: Path, arrays_keys: frozenset[str] | None = None) -> str:
    """Which form of batch `path` is, by its suffix and, for tensors, by its keys."""
    if path.suffix in SAMPLE_FORMS:
        return "samples"
    if path.suffix == PRIME_RL_SUFFIX:
        return "prime-rl"
    if arrays_keys is not None:
        for name, (keys, _read) in LAYOUTS.items():
            if keys <= arrays_keys:
                return name
        raise InputError(
            f"{path}: its tensors ({', '.join(sorted(arrays_keys))}) are none of the batch "
            f"layouts callgrove reads ({', '.join(LAYOUTS)})"
        )
    raise InvalidValue(
        f"{path}: a batch ends in {', '.join([*SAMPLE_FORMS, PRIME_RL_SUFFIX, *TENSOR_SUFFIXES])}"
    )


def read_batch(path: Path, form: str | None = None) -> tuple[str, list[TrainedRow]]:
    """The rows of the batch at `path` and its form (`form`, or told by the file)."""
    if path.suffix in TENSOR_SUFFIXES:
        arrays = _load_arrays(path)
        form = form or batch_form(path, frozenset(arrays))
        keys, read = LAYOUTS[form]
        missing = keys - set(arrays)
        if missing:
            raise InputError(f"{path}: not a {form} batch: no {', '.join(sorted(missing))}")
        rows = [
            TrainedRow(ids, loss, advantages, f"{path} row {index}")
            for index, (ids, loss, advantages) in enumerate(read(arrays))
        ]
        return form, rows
    form = form or batch_form(path)
    if form == "samples":
        return form, sample_rows(read_samples(path), str(path))
    if form == "prime-rl":
        return form, _prime_rl_rows(path)
    raise InvalidValue(f"{path}: a {form} batch is a tensor file ({', '.join(TENSOR_SUFFIXES)})")


def sample_rows(samples: Sequence[Sample], where: str = "") -> list[TrainedRow]:
    """callgrove samples as the rows they train, each named `{where} row N` (from 0)."""
    prefix = f"{where} " if where else ""
    return [
        TrainedRow(
            sample.token_ids,
            sample.loss_mask.astype(bool),
            sample.advantages,
            f"{prefix}row {index}",
            sample.episode,
            sample.agent,
            sample.seat,
        )
        for index, sample in enumerate(samples)
    ]


def _prime_rl_rows(path: Path) -> list[TrainedRow]:
    try:
        samples = msgspec.msgpack.decode(path.read_bytes(), type=list[TrainingSample])
    except msgspec.DecodeError as error:
        raise InputError(f"{path}: not a list of prime-rl TrainingSamples: {error}") from None
    return [
        TrainedRow(
            np.asarray(sample.token_ids, dtype=np.int64),
            np.asarray(sample.mask, dtype=bool),
            None if sample.advantages is None else np.asarray(sample.advantages),
            f"{path} row {index}",
        )
        for index, sample in enumerate(samples)
    ]


def _load_arrays(path: Path) -> dict[str, np.ndarray]:
    """A dict of named arrays from `torch.save` (tensors only: nothing else is unpickled) or
    `numpy.savez`."""
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as saved:
                return {name: saved[name] for name in saved.files}
        import torch

        saved = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError) as error:
        raise InputError(f"{path}: cannot be read as saved tensors: {error}") from None
    if not isinstance(saved, Mapping):
        raise InputError(
            f"{path}: holds a {type(saved).__name__}, not a dict of tensors (save the batch's "
            "tensors as a dict)"
        )
    return {
        name: value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        for name, value in saved.items()
    }
