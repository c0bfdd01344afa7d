"""Where a run's results go, so that a run killed at any moment resumes without loss or repeats.

    OUT/config.toml                       the resolved config
    OUT/metrics.jsonl                     one line per step ({"step": N, metric: value, ...})
    OUT/step_N/train/traces.jsonl         the step's episodes (trained and dropped), one a line
    OUT/step_N/train/samples.jsonl        the step's sample table (one line per training row)
    OUT/step_N/eval/traces.jsonl          the step's evaluation episodes
    OUT/unused/train/traces.jsonl         episodes still in flight (cancelled) or finished but
                                          never trained when a run ended (a failed step's too)
    OUT/checkpoint.pt                     model, optimizer, sampler RNG, progress, data position

A step's files are written whole and renamed into place, then its metrics line is appended,
then the checkpoint replaces the previous one. Every whole-file write goes through
`formats.output.NewFile` (a unique, locked temporary beside the target, renamed into place), so
the temporary of a write killed midway is removed by the next write to that target. A
restart loads the checkpoint of step K, cuts `metrics.jsonl` back to steps <= K, removes the
directories of later steps and redoes them: no line is written twice, and nothing a finished
step recorded is lost. Optional sinks (W&B in offline mode, TensorBoard) get the same metrics.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from callgrove.episode import Episode, EpisodeWriter
from callgrove.errors import UsageError
from callgrove.formats.output import NewFile, write_text
from callgrove.orchestrator.errors import RunError

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_KEYS = frozenset({"progress", "learner", "config"})
METRICS = "metrics.jsonl"


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """An `OSError` while writing `path` names it: a write that fails on a full disk (or past a
    size limit) does not by itself."""
    try:
        yield
    except OSError as error:
        if error.filename is None:
            raise OSError(error.errno, error.strerror or str(error), str(path)) from error
        raise


def write_episodes_atomically(path: Path, episodes: Iterable[Episode]) -> int:
    """Write episodes one per line to `path` through a temporary file renamed into place (a new
    file of `EpisodeWriter` is one).

    The records come from the recorder, which builds them by the format's rules, so they are
    written as they are (checking each again costs more than running a no-op episode)."""
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with EpisodeWriter(path) as writer:
            for episode in episodes:
                writer.write(episode)
            return writer.lines


def write_json_lines_atomically(path: Path, records: Iterable[dict[str, Any]]) -> None:
    write_text_atomically(path, "".join(json.dumps(record) + "\n" for record in records))


def write_text_atomically(path: Path, text: str) -> None:
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)


def append_episodes(path: Path, episodes: Iterable[Episode]) -> int:
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with EpisodeWriter(path, append=True) as writer:
            for episode in episodes:
                writer.write(episode)
            return writer.lines


def step_dir(out: Path, step: int) -> Path:
    return out / f"step_{step}"


def rewind(out: Path, step: int) -> None:
    """Forget everything after `step`: later step directories and metrics lines, and the
    `final` line of the process that ran before (the counters go on; this one writes its own)."""
    for child in out.glob("step_*"):
        number = child.name.removeprefix("step_")
        if number.isdigit() and int(number) > step and child.is_dir():  # a file is not the run's
            shutil.rmtree(child)
    metrics = out / METRICS
    if metrics.exists():
        kept = [
            line
            for line, record in _metric_lines(metrics)
            if record.get("step", 0) <= step and not record.get("final")
        ]
        write_text_atomically(metrics, "".join(kept))


def _metric_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Whole lines only (a line cut by a crash is dropped), each with its record; a line that
    is not a metrics record is an error naming it."""
    lines = []
    for number, line in enumerate(path.read_text().splitlines(keepends=True), 1):
        if not line.endswith("\n"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            raise RunError(
                f"{path} line {number}: not a metrics record ({line.strip()[:60]!r}); "
                "the file is damaged: remove that line to continue"
            )
        lines.append((line, record))
    return lines


def read_metrics(out: Path) -> list[dict[str, Any]]:
    path = out / METRICS
    return [record for _, record in _metric_lines(path)] if path.exists() else []


def save_checkpoint(out: Path, state: dict[str, Any]) -> None:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    with writing(out / CHECKPOINT):
        new = NewFile(out / CHECKPOINT)
        try:
            new.temp.write_bytes(buffer.getvalue())
        except BaseException:
            new.discard()
            raise
        new.commit()


class NotTorchData(UsageError):
    """A file `torch.load` cannot read as data alone; `why` is torch's reason, in a line."""

    def __init__(self, path: Path, why: str):
        super().__init__(
            f"{path}: not a weights file callgrove can load safely ({why}): only what "
            "torch.save writes of tensors, numbers, strings and containers is read, and "
            "nothing in the file is run"
        )
        self.why = why


# Torch's lines around the reason a file was refused: its advice is to load the file again
# with code running, which is never what callgrove does with a file it was handed.
_TORCH_ADVICE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def load_torch_data(path: Path, map_location: str | None = None) -> Any:
    """What `torch.save` wrote at `path`, read as data (`weights_only`): tensors, numbers,
    strings and containers, never objects whose loading runs code. A `NotTorchData` naming
    the file for anything else (a crafted pickle, a file cut short, JSON, random bytes); an
    `OSError` (which names the file) where it cannot be read at all."""
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on pickle protocols: noise here
            return torch.load(path, map_location=map_location, weights_only=True)
    except OSError:
        raise
    except Exception as error:
        said = [line.strip() for line in str(error).splitlines() if line.strip()]
        said = [line for line in said if not line.startswith(_TORCH_ADVICE)]
        if said:
            reason = said[0].split(". ")[0].rstrip(".")
        elif isinstance(error, EOFError):
            reason = "it ends too soon: empty or cut short"
        else:
            reason = "no reason given"
        raise NotTorchData(path, f"{type(error).__name__}: {reason}") from None


def load_checkpoint(out: Path) -> dict[str, Any] | None:
    """The checkpoint of `out` (None if it has none), read as data: tensors, numbers, strings
    and containers, never objects whose loading runs code."""
    path = out / CHECKPOINT
    if not path.exists():
        return None
    try:
        state = load_torch_data(path)
    except (NotTorchData, OSError) as error:
        why = error.why if isinstance(error, NotTorchData) else f"OSError: {error.strerror}"
        raise RunError(
            f"{path} cannot be read as a checkpoint ({why}): it is damaged or was not written "
            "by callgrove train; restore it, or move the run folder away to start over"
        ) from None
    if not isinstance(state, dict) or not state.keys() >= CHECKPOINT_KEYS:
        raise RunError(f"{path} is not a callgrove train checkpoint (no {sorted(CHECKPOINT_KEYS)})")
    return state


class JsonlSink:
    """Always on: `metrics.jsonl`, appended and flushed line by line."""

    def __init__(self, out: Path):
        self.path = out / METRICS
        self._stream = self.path.open("a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with writing(self.path):
            self._stream.write(json.dumps({"step": step, **metrics}) + "\n")
            self._stream.flush()
            os.fsync(self._stream.fileno())

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass  # the sample table is a file of its step

    def close(self) -> None:
        self._stream.close()


class WandbSink:
    """W&B, offline unless `monitor.wandb_mode` says online (offline, nothing leaves the
    machine; `wandb sync OUT/wandb/offline-run-*` uploads later), under the configured project,
    entity and run name (the name defaults to the run's id)."""

    def __init__(self, out: Path, monitor: Any, config: dict[str, Any], run_id: str):
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self._wandb = wandb
        self.run = wandb.init(
            project=monitor.wandb_project,
            entity=monitor.wandb_entity or None,
            name=monitor.wandb_name or run_id,
            dir=str(out),
            mode=monitor.wandb_mode,
            config=config,
            resume="allow",
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        columns = list(rows[0])
        table = self._wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class TensorBoardSink:
    def __init__(self, out: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        lines = [" | ".join(str(v) for v in row.values()) for row in rows]
        self.writer.add_text("samples", "\n\n".join(lines), step)

    def close(self) -> None:
        self.writer.close()
