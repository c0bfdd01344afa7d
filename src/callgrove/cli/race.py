"""`callgrove race`: callgrove's RL step against TRL's `GRPOTrainer`, on the same model, task
and settings, interleaved in one run (`callgrove.bench.race`)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from callgrove.bench.race import SETTING_HELP, TARGETS, RaceSettings
from callgrove.cli.app import app, err, out, safe
from callgrove.errors import EXIT_USAGE

DEFAULT = RaceSettings()
Sampler = StrEnum("Sampler", {name: name for name in TARGETS})  # type: ignore[misc]
DEFAULT_SAMPLER = Sampler(DEFAULT.sampler)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """What the trainers write to stdout meanwhile (TRL's and transformers' log lines, prints,
    C libraries, child processes) goes to stderr: stdout carries the race's figures alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@app.command("race")
def race_command(
    seeds: Annotated[
        list[int] | None,
        typer.Option(
            "--seed",
            help=f"{SETTING_HELP['seeds']} (repeatable; default {' '.join(map(str, DEFAULT.seeds))}).",
        ),
    ] = None,
    steps: Annotated[int, typer.Option(min=1, help=SETTING_HELP["steps"])] = DEFAULT.steps,
    group_size: Annotated[
        int, typer.Option(min=2, help=SETTING_HELP["group_size"])
    ] = DEFAULT.group_size,
    groups_per_step: Annotated[
        int, typer.Option(min=1, help=SETTING_HELP["groups_per_step"])
    ] = DEFAULT.groups_per_step,
    max_tokens: Annotated[
        int, typer.Option(min=1, help=SETTING_HELP["max_tokens"])
    ] = DEFAULT.max_tokens,
    temperature: Annotated[
        float, typer.Option(min=0.0, help=SETTING_HELP["temperature"])
    ] = DEFAULT.temperature,
    lr: Annotated[float, typer.Option(help=SETTING_HELP["lr"])] = DEFAULT.lr,
    threads: Annotated[int, typer.Option(min=1, help=SETTING_HELP["threads"])] = DEFAULT.threads,
    off_policy_steps: Annotated[
        int, typer.Option(min=0, help=SETTING_HELP["off_policy_steps"])
    ] = DEFAULT.off_policy_steps,
    sampler: Annotated[Sampler, typer.Option(help=SETTING_HELP["sampler"])] = DEFAULT_SAMPLER,
    vllm_python: Annotated[
        str, typer.Option(help=SETTING_HELP["vllm_python"])
    ] = DEFAULT.vllm_python,
    out_dir: Annotated[
        Path | None, typer.Option("--out", "-o", help="Keep the runs and figures.json here.")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="The figures on stdout as one JSON object (settings, versions, runs)"
        ),
    ] = False,
) -> None:
    """Race callgrove's loop (Hugging Face or vLLM sampler) against TRL's GRPOTrainer.

    Both train SmolLM2-135M with LoRA r=16 on the arithmetic environment: the same tasks,
    groups, completion length, temperature, learning rate, seeds and steps; one run of each
    per seed, interleaved. Prints seconds per step split into sampling, scoring, credit and
    batching, forward and backward, optimizer and weight push, throughput per second and per
    CPU-second, rewards, and how many times faster callgrove's median step is. Needs TRL
    (the hf and trl extras).
    """
    from callgrove.bench.race import race_folder, race_lines, run_race, trl_version

    try:
        trl_version()
    except ImportError as error:
        err.print(f"error: {safe(error)}")
        raise typer.Exit(EXIT_USAGE) from None
    settings = RaceSettings(
        seeds=tuple(seeds or DEFAULT.seeds),
        steps=steps,
        group_size=group_size,
        groups_per_step=groups_per_step,
        max_tokens=max_tokens,
        temperature=temperature,
        lr=lr,
        threads=threads,
        off_policy_steps=off_policy_steps,
        sampler=sampler.value,
        vllm_python=vllm_python,
    )
    with stdout_to_stderr():
        race = run_race(settings, race_folder(out_dir), say=lambda line: err.print(safe(line)))
    if as_json:
        sys.stdout.write(json.dumps(race) + "\n")
        return
    for line in race_lines(race):
        out.print(safe(line))
