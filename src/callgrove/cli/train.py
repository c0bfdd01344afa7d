"""`callgrove train CONFIG`: run (or resume) the RL loop a TOML config describes."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from callgrove.cli.app import app, err, out
from callgrove.cli.model_options import ModelOption
from callgrove.errors import EXIT_FAILED, EXIT_USAGE
from callgrove.orchestrator.config import EXECUTORS, TrainConfig

if TYPE_CHECKING:
    from callgrove.orchestrator.loop import RunSummary, SupervisedSummary

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command it interrupted

# run.executor's choices, listed by --help as every --executor's are
RunExecutor = StrEnum("RunExecutor", {name: name for name in EXECUTORS})


RunExecutorOption = Annotated[
    RunExecutor | None,
    typer.Option(
        "--executor", help="Where rollouts run: in this process, or on Ray (run.executor)."
    ),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Any setting: section.key=value (repeatable)."),
]


@app.command("train")
def train_command(
    config: Annotated[Path | None, typer.Argument(help="TOML config (none: the defaults).")] = None,
    steps: Annotated[int | None, typer.Option(help="Training steps (run.steps).")] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", "-o", help="Output folder (run.out).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Run seed (run.seed).")] = None,
    model: ModelOption = None,
    executor: RunExecutorOption = None,
    set_: SetOption = None,
    quiet: Annotated[bool, typer.Option(help="No live display.")] = False,
) -> None:
    """Train: episodes of the configured environment, scored by groups, tree-packed steps.

    With train.objective=sft: cross-entropy on the sessions and episode files of data.paths.

    Writes OUT/step_N/{train,eval}/traces.jsonl, metrics.jsonl, config.toml, a checkpoint and
    rewards.png; run the same command again after a crash to continue from the checkpoint.
    """
    from callgrove.orchestrator.config import load_config

    try:
        overrides = _overrides(set_, steps, out_dir, seed, model, executor, quiet)
        resolved = load_config(config, overrides)
        from callgrove.formats.output import removed_if_unused
        from callgrove.orchestrator.loop import train
        from callgrove.orchestrator.run_folder import LOCK

        # Some settings are refused only once the run has made and locked its folder (an
        # unknown environment or model): a folder this command made and left holding only its
        # lock is removed again, whatever stopped the run.
        with removed_if_unused(resolved.run.out, leftovers=(LOCK,)):
            summary = train(resolved, err)
    except ModuleNotFoundError as error:  # torch (callgrove.train names its extra), wandb, ...
        err.print(f"error: {error}", markup=False)
        raise typer.Exit(EXIT_USAGE) from None
    except OSError as error:  # a full disk, a folder made read-only under a run
        where = f"{error.filename}: " if error.filename else ""
        err.print(f"error: {where}{error.strerror or error}", markup=False)
        raise typer.Exit(EXIT_FAILED) from None
    except KeyboardInterrupt:  # the run stopped where it stood, its episodes kept
        err.print(
            "interrupted: every step finished is kept; run the same command again to continue",
            markup=False,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    _print_summary(summary, resolved)


def _overrides(
    settings: list[str] | None,
    steps: int | None,
    out_dir: Path | None,
    seed: int | None,
    model: str | None,
    executor: RunExecutor | None,
    quiet: bool,
) -> dict[str, Any]:
    """The config settings the command line gives: every `--set`, then the options that
    name one (those given)."""
    from callgrove.orchestrator.config import parse_override

    overrides: dict[str, Any] = {}
    for text in settings or []:
        key, value = parse_override(text)
        overrides[key] = value
    named = {
        "run.steps": steps,
        "run.out": out_dir,
        "run.seed": seed,
        "model.name": model,  # its kind follows from the name, as with --set model.name
        "run.executor": executor and executor.value,
    }
    overrides |= {
        k: str(v) if isinstance(v, Path) else v for k, v in named.items() if v is not None
    }
    if quiet:
        overrides["monitor.live"] = False
    return overrides


def _print_summary(summary: RunSummary | SupervisedSummary, resolved: TrainConfig) -> None:
    """What the run did, in one line on stdout: the steps trained and where, the last reward,
    the loss (sft) and the plot; or that there was nothing left to train."""
    if summary.first_step == summary.last_step:
        out.print(
            f"nothing to train: {summary.out} holds {summary.last_step} steps and run.steps is "
            f"{resolved.run.steps}",
            markup=False,
        )
        return
    rewards = [
        m["train/all/episode/reward/mean"]
        for m in summary.metrics
        if "train/all/episode/reward/mean" in m
    ]
    reward = rewards[-1] if rewards else None
    sft = resolved.train.objective == "sft"
    losses = [m["train/loss"] for m in summary.metrics if sft and "train/loss" in m]
    out.print(
        f"trained steps {summary.first_step + 1}..{summary.last_step} into {summary.out}"
        + (f" · last reward {reward:.3f}" if reward is not None else "")
        + (f" · loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "")
        + (f" · plot {summary.plot}" if summary.plot else ""),
        markup=False,
    )
