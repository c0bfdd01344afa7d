"""Supervised fine-tuning in the training loop: `[train] objective = "sft"` trains on the
episodes of `[data]` instead of dispatching environments.

The data are read once at the start: every file under `[data] paths` is classified by its first
lines (`callgrove.transcripts.accounting.sniff`); Claude Code sessions (with their subagent files)
and Codex rollouts (all of them read together, so subagent threads join their parents) are
imported and rendered with the model's own tokenizer and chat template; callgrove episode files
are read as they are (their token ids must be the model's). What cannot be used is reported with
its file and line and counted; nothing is dropped silently, and a run with nothing to train on
stops with an error.

Every episode's rows become samples with a loss mask and no advantages (`objective:
supervised`); rows with nothing to train (no assistant token, or none left after cutting to
`max_row_tokens`) and duplicate rows are counted and left out. A step takes the next
`rows_per_step` samples of a per-epoch permutation drawn from the run's seed, so the samples of
step N depend on N alone: a resumed run continues with exactly the samples it would have seen.
Each step is one optimizer step of cross-entropy over the step's rows (tree-packed or packed,
`[train] batching`), then its metrics line and the checkpoint, as in the RL loop.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from rich.console import Console

from callgrove.batch import TOKEN_FIELDS, Sample, build_samples
from callgrove.chat import ChatFormat, JinjaFormat
from callgrove.episode import Episode, load
from callgrove.formats.problems import Diagnostics, Problem
from callgrove.models import PolicyBackend
from callgrove.orchestrator import monitors, sinks
from callgrove.orchestrator.config import ConfigError, DataSection, TrainConfig, to_toml
from callgrove.orchestrator.learning import check_row_lengths, learner_step, policy_backend
from callgrove.orchestrator.run_folder import Progress, nothing_to_do, open_run, restore
from callgrove.rows import build_rows
from callgrove.transcripts import ImportReport, TranscriptRenderer, import_claude_code, import_codex
from callgrove.transcripts.accounting import CLAUDE_CODE, CODEX, EPISODES, sniff
from callgrove.transcripts.claude_code import find_sessions


@dataclass
class SupervisedData:
    """The samples a supervised run trains on, and the account of everything read."""

    samples: list[Sample]
    episodes: int
    files: Counter[str] = field(default_factory=Counter)
    """Files read, by kind."""
    problems: list[Problem] = field(default_factory=list)
    left_out: Counter[str] = field(default_factory=Counter)
    """Rows not trained, by reason."""
    cut_tokens: int = 0
    dropped_content: Counter[str] = field(default_factory=Counter)
    """Message content the chat template left out of the tokens, by what it was."""

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]


def data_files(paths: list[str]) -> list[Path]:
    """The JSON Lines files under `paths` (folders searched recursively), in order."""
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            files += sorted(path.rglob("*.jsonl"))
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"data.paths: {text}: no such file or folder")
    return list(dict.fromkeys(files))


def load_data(data: DataSection, chat: ChatFormat, vocab_size: int) -> SupervisedData:
    """Import, render (with `chat`, the model's own format, as RL renders) and cut every
    episode under `data.paths` (see the module docstring)."""
    if not data.paths:
        raise ConfigError('data.paths: objective "sft" needs folders or files to train on')
    if not isinstance(chat, JinjaFormat):
        raise ConfigError(
            'train.objective "sft": the model has no tokenizer and chat template to render '
            'transcripts with; use [model] kind = "hf" (name = "hf:PATH" or "smollm2-135m")'
        )
    if data.rows_per_step < 1 or data.max_row_tokens < 0:
        raise ConfigError("data.rows_per_step must be positive and data.max_row_tokens >= 0")
    files = data_files(data.paths)
    kinds = {path: sniff(path) for path in files}
    report = ImportReport()
    chat.allow_dropped = data.allow_dropped_content
    renderer = TranscriptRenderer(chat)
    transcripts = _claude_code_sessions([p for p in files if kinds[p] == CLAUDE_CODE], report)
    codex = [p for p in files if kinds[p] == CODEX]
    if codex:
        transcripts += import_codex(codex, report)
    episodes = renderer.episodes(transcripts, report.diagnostics)
    diagnostics = report.diagnostics
    for path in (p for p in files if kinds[p] == EPISODES):
        episodes += _episode_file(path, diagnostics)
    for path in (p for p in files if kinds[p] not in (CLAUDE_CODE, CODEX, EPISODES)):
        diagnostics.add(Problem(f"not training data: {kinds[path]}", file=str(path)))
    result = SupervisedData(
        [],
        len(episodes),
        Counter(kinds.values()),
        list(diagnostics.problems),
        dropped_content=Counter(chat.dropped),
    )
    for episode in episodes:
        result.samples += _trained_samples(episode, data.max_row_tokens, vocab_size, result)
    if not result.samples:
        raise ConfigError(
            f"data.paths: nothing to train on in {len(files)} file(s) ({len(episodes)} "
            f"episodes; rows left out: {dict(result.left_out) or 'none'}; "
            f"{len(result.errors)} error(s): {'; '.join(map(str, result.errors[:3]))})"
        )
    return result


def _claude_code_sessions(files: list[Path], report: ImportReport) -> list:
    """Each session file imported with its subagent files; subagent files whose session is
    not among `files` are imported as their own episodes (as `import_claude_code` does)."""
    subagent_files = {
        p for p in files if p.name.startswith("agent-") or p.parent.name == "subagents"
    }
    claimed: set[Path] = set()
    transcripts = []
    for main in (p for p in files if p not in subagent_files):
        for session in find_sessions(main, ImportReport()):
            claimed.update(path for path, _layout in session.subagents)
        transcripts += import_claude_code(main, report)
    for orphan in sorted(subagent_files - claimed):
        transcripts += import_claude_code(orphan, report)
    return transcripts


def _episode_file(path: Path, diagnostics: Diagnostics) -> list[Episode]:
    episodes = list(load(path, diagnostics))
    for episode in episodes:
        # Trained by cross-entropy here, whatever objective the episode was sampled for.
        episode.objective = "supervised"
    return episodes


def _trained_samples(
    episode: Episode, max_tokens: int, vocab_size: int, account: SupervisedData
) -> list[Sample]:
    samples = build_samples(build_rows(episode))
    largest = max((int(s.token_ids.max(initial=0)) for s in samples), default=0)
    if largest >= vocab_size:
        account.problems.append(
            Problem(
                f"token id {largest} is outside the model's vocabulary ({vocab_size}): the "
                "episode was tokenized for another model; not trained",
                episode=episode.id,
            )
        )
        account.left_out["episode tokenized for another model"] += len(samples)
        return []
    kept = []
    for sample in samples:
        if sample.duplicate_of is not None:
            account.left_out["duplicate row"] += 1
            continue
        if max_tokens and sample.num_tokens > max_tokens:
            account.cut_tokens += sample.num_tokens - max_tokens
            sample = cut(sample, max_tokens)
        if not sample.num_loss_tokens:
            account.left_out["no assistant token" + (" in the cut" if max_tokens else "")] += 1
            continue
        kept.append(sample)
    return kept


def cut(sample: Sample, length: int) -> Sample:
    """The sample's first `length` tokens (its per-token arrays sliced, metadata kept)."""
    return replace(
        sample,
        **{
            name: None if getattr(sample, name) is None else getattr(sample, name)[:length]
            for name in TOKEN_FIELDS
        },
    )


def step_samples(
    samples: list[Sample], step: int, per_step: int, seed: int
) -> tuple[list[Sample], int]:
    """The samples of `step` (from 1) and the epoch it starts in: consecutive slices of
    per-epoch permutations drawn from `seed`."""
    start = (step - 1) * per_step
    chosen: list[Sample] = []
    while len(chosen) < per_step:
        epoch, offset = divmod(start + len(chosen), len(samples))
        order = np.random.default_rng([seed, epoch]).permutation(len(samples))
        take = order[offset : offset + per_step - len(chosen)]
        chosen += [samples[i] for i in take]
    return chosen, start // len(samples)


@dataclass
class SupervisedSummary:
    out: Path
    first_step: int
    last_step: int
    metrics: list[dict[str, Any]]
    data: SupervisedData
    plot: Path | None = None


def train_supervised(config: TrainConfig, console: Console) -> SupervisedSummary:
    """Run (or resume) supervised fine-tuning as `config` describes."""
    with open_run(config) as checkpoint:
        return _train(config, console, checkpoint)


def _train(
    config: TrainConfig, console: Console, checkpoint: dict[str, Any] | None
) -> SupervisedSummary:
    out = Path(config.run.out)
    backend = policy_backend(config)
    data = load_data(config.data, backend.chat, _vocab_size(backend))
    _print_account(console, data)
    check_row_lengths(
        data.samples, config.train, "data.paths", "or cut rows with data.max_row_tokens"
    )
    if (done := nothing_to_do(checkpoint, config.run.steps)) is not None:
        return SupervisedSummary(out, done, done, sinks.read_metrics(out), data)

    progress = Progress.new()

    def state() -> dict[str, Any]:
        return {
            "progress": msgspec.to_builtins(progress),
            "learner": backend.learner.state_dict(),
            "config": msgspec.to_builtins(config),
        }

    if checkpoint is None:
        sinks.save_checkpoint(out, state())  # the folder is a run from here on
    else:
        progress = checkpoint["progress"]
        restore(out, checkpoint, ("learner", backend.learner))
    first = progress.step
    sinks.rewind(out, first)
    sinks.write_text_atomically(out / "config.toml", to_toml(config))
    metric_sinks = [sinks.JsonlSink(out)]
    step = first
    try:
        for step in range(first + 1, config.run.steps + 1):
            metrics = _step(step, config, backend, data)
            for sink in metric_sinks:
                sink.log(step, metrics)
            progress = Progress(step=step, run_id=progress.run_id)
            sinks.save_checkpoint(out, state())
            if config.monitor.live:
                console.print(
                    f"step {step}: loss {metrics['train/loss']:.4f} · "
                    f"{metrics['throughput/row_tokens_per_s']:.0f} row tokens/s · "
                    f"epoch {int(metrics['data/epoch'])}",
                    markup=False,
                )
    finally:
        for sink in metric_sinks:
            sink.close()
    metrics = sinks.read_metrics(out)
    plot = plot_supervised(metrics, out / "loss.png") if config.monitor.plot else None
    return SupervisedSummary(out, first, progress.step, metrics, data, plot)


def _vocab_size(backend: PolicyBackend) -> int:
    hf_model = getattr(backend.learner, "hf_model", None)
    if hf_model is None:
        return 0
    return int(hf_model.get_input_embeddings().weight.shape[0])


def _step(
    step: int, config: TrainConfig, backend: PolicyBackend, data: SupervisedData
) -> dict[str, float]:
    samples, epoch = step_samples(data.samples, step, config.data.rows_per_step, config.run.seed)
    started = time.perf_counter()
    report = learner_step(step, backend.learner, samples, config.train)
    elapsed = time.perf_counter() - started
    return monitors.learner_metrics(report, backend.learner.version) | {
        "data/epoch": float(epoch),
        "throughput/row_tokens_per_s": report.row_tokens / max(elapsed, 1e-9),
        "throughput/forwarded_tokens_per_s": report.forwarded_tokens / max(elapsed, 1e-9),
        "time/step_s": elapsed,
    }


def _print_account(console: Console, data: SupervisedData) -> None:
    files = ", ".join(f"{count} {kind}" for kind, count in sorted(data.files.items()))
    console.print(
        f"supervised data: {files or 'no files'} → {data.episodes} episodes, "
        f"{len(data.samples)} rows to train ({data.cut_tokens} tokens cut)",
        markup=False,
    )
    for reason, count in sorted(data.left_out.items()):
        console.print(f"  rows left out: {count} ({reason})", markup=False)
    for what, count in sorted(data.dropped_content.items()):
        console.print(
            f"  the chat template leaves out {what} in {count} message(s) "
            "(data.allow_dropped_content)",
            markup=False,
        )
    for problem in data.problems:
        console.print(f"  {problem.severity}: {problem}", markup=False)


def plot_supervised(metrics: list[dict[str, Any]], path: Path) -> Path | None:
    """Loss and row tokens per second by step, as a PNG."""
    lines = [m for m in metrics if "train/loss" in m]
    if not lines:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (loss, speed) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    steps = [m["step"] for m in lines]
    loss.plot(steps, [m["train/loss"] for m in lines], color="tab:blue")
    loss.set_ylabel("cross-entropy (nats/token)")
    loss.grid(alpha=0.3)
    speed.plot(steps, [m["throughput/row_tokens_per_s"] for m in lines], color="tab:green")
    speed.set_ylabel("row tokens / s")
    speed.set_xlabel("step")
    speed.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
