"""callgrove's RL step against TRL's `GRPOTrainer` on the same model, task and settings
(`callgrove race`, `benchmarks/trl_race.py`).

Both train SmolLM2-135M-Instruct (the packaged `smollm2-135m`, float32, CPU) with LoRA r=16
(alpha 32, q/k/v/o projections) on the `arithmetic` environment's tasks (the same tasks in the
same order: group i's task is `Arithmetic.task(default_rng([seed, i]))`, as callgrove's
dispatcher draws it), the same prompt tokens (the model's chat template, user turn and
generation prompt), `--groups-per-step` groups of `--group-size` completions per step, at most
`--max-tokens` completion tokens at `--temperature` (top-p 1; both score at it), the same
learning rate, GRPO advantages (reward minus the group mean, not scaled by the std), the
clipped loss at 0.2 normalised per token (TRL `loss_type="dapo"`, beta 0), one optimizer step
per generation, gradients clipped at norm 1, float32 and no gradient checkpointing (TRL's
defaults turn on bf16 autocast, about 12 times slower on this CPU, and checkpointing; callgrove
trains in float32 without it). Runs interleave: for each seed callgrove's loop (`callgrove train` with the Hugging
Face sampler), then TRL's trainer with its own generation.

Reported per trainer: seconds per step (median and best), split into sampling, scoring, credit
and batching, forward and backward, optimizer and weight push (callgrove: its metrics.jsonl
profile; TRL: its `_generate`, `_calculate_rewards`, the rest of
`_generate_and_score_completions`, `training_step` less that, and the optimizer step, timed
around TRL's own methods); episodes and trained tokens per second and per CPU-second (process
CPU time over the steps); and the mean reward of the last step and of all steps.

By default callgrove trains on-policy as TRL does (`dispatch.max_off_policy_steps = 0`: a step's
groups are sampled by the weights it trains); `--off-policy-steps 1` lets the loop generate the
next step's groups while the learner trains (one step of lag, corrected by the clipped
importance ratio), which pays where sampler and learner have hardware of their own, not on a
CPU they share. Figures vary on a shared machine; compare within a
run. Versions: the installed TRL (printed), transformers and peft.

`--sampler vllm` has callgrove's loop sample through a vLLM server it starts (`[model.vllm]`,
the interpreter `--vllm-python`, weights pushed as a LoRA adapter after every step) while TRL
keeps its own generation. The server's start (about a minute) is before the first step, so
outside the step times; its CPU is another process's, so the per-CPU-second figures are left
out for such runs (None) rather than counting the learner's share alone. Target: 1.5x TRL's
step with the Hugging Face sampler, 3x with vLLM.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from callgrove.chat import Message
from callgrove.errors import InvalidValue
from callgrove.models import HfModel
from callgrove.orchestrator.config import config_from_dict
from callgrove.orchestrator.envs.arithmetic import Arithmetic, score
from callgrove.orchestrator.loop import train
from callgrove.orchestrator.monitors import STEP_PHASES
from callgrove.policy.vllm import VllmSettings

MODEL = HfModel(name="smollm2-135m", lora_rank=16)
"""What both trainers train: SmolLM2-135M-Instruct with LoRA adapters of rank 16."""
REWARD = "train/all/episode/reward/mean"
TARGETS = {"hf": 1.5, "vllm": 3.0}
"""How many times TRL's median step callgrove's should be, by callgrove's sampler."""
# The phases both trainers report, from callgrove's `STEP_PHASES`.
PHASES = ("sampling", "scoring", "credit+batching", "forward_backward", "optimizer", "weight_push")


TRL_MISSING = "the race needs TRL and its datasets: pip install 'callgrove[hf,trl]'"


@dataclass(frozen=True, slots=True)
class RaceSettings:
    """What both trainers run (the docstring above says how each is set from these)."""

    seeds: tuple[int, ...] = (0, 1)
    steps: int = 3
    group_size: int = 4
    groups_per_step: int = 2
    max_tokens: int = 12
    temperature: float = 0.7
    lr: float = 2e-4
    threads: int = 1
    off_policy_steps: int = 0
    sampler: str = "hf"
    vllm_python: str = VllmSettings().python

    def __post_init__(self) -> None:
        if self.sampler not in TARGETS:
            raise InvalidValue(f"sampler {self.sampler!r}: one of {', '.join(TARGETS)}")


# The help of each setting, for the command line and the script alike.
SETTING_HELP = {
    "seeds": "Run seeds: each trains both trainers, interleaved",
    "steps": "Optimizer steps per run",
    "group_size": "Completions per prompt (GRPO's group)",
    "groups_per_step": "Groups per optimizer step",
    "max_tokens": "Completion tokens at most",
    "temperature": "Sampling temperature (both score at it)",
    "lr": "Learning rate",
    "threads": "Torch threads (a shared CPU: 1)",
    "off_policy_steps": (
        "Steps of lag callgrove's loop allows (dispatch.max_off_policy_steps; 0: on-policy, "
        "as TRL trains)"
    ),
    "sampler": (
        "What samples for callgrove's loop: hf (in the learner's process) or vllm (a server "
        "it starts)"
    ),
    "vllm_python": "The interpreter that starts the vLLM server (--sampler vllm)",
}


def trl_version() -> str:
    """The installed TRL's version; an ImportError saying how to install it otherwise."""
    try:
        import datasets  # noqa: F401  TRL's trainer reads its prompts from a Dataset
        import trl
    except ImportError as error:
        raise ImportError(TRL_MISSING) from error
    return trl.__version__


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def callgrove_run(settings: RaceSettings, seed: int, out: Path) -> dict[str, Any]:
    model = msgspec.to_builtins(MODEL)
    if settings.sampler == "vllm":
        model |= {"kind": "vllm", "vllm": {"python": settings.vllm_python}}
    config = config_from_dict(
        {
            "run": {"steps": settings.steps, "out": str(out), "seed": seed},
            "env": {"name": "arithmetic"},
            "model": model,
            "sampling": {"max_tokens": settings.max_tokens, "temperature": settings.temperature},
            "dispatch": {
                "group_size": settings.group_size,
                "groups_per_step": settings.groups_per_step,
                "max_off_policy_steps": settings.off_policy_steps,
            },
            "algorithm": {"name": "grpo"},
            "train": {"learning_rate": settings.lr, "max_grad_norm": 1.0},
            "degeneracy": {"drop": []},  # TRL drops nothing either
            "monitor": {"live": False, "plot": False, "samples_per_step": 0},
        }
    )
    cpu_before = cpu_seconds()
    summary = train(config)
    cpu = cpu_seconds() - cpu_before
    steps = [m for m in summary.metrics if not m.get("final")]
    phases = []
    for m in steps:
        seconds = {phase: m[f"time/{phase}_s"] for phase in STEP_PHASES}
        phases.append(
            {
                "sampling": seconds["sampling"],
                "scoring": seconds["scoring"],
                "credit+batching": seconds["credit"] + seconds["batching"],
                "forward_backward": seconds["forward_backward"],
                "optimizer": seconds["optimizer"],
                "weight_push": seconds["weight_push"],
            }
        )
    return {
        "step_seconds": [m["time/step_s"] for m in steps],
        "phases": phases,
        "episodes": [m["train/all/episode/count"] for m in steps],
        "trained_tokens": [m["train/loss_tokens"] for m in steps],
        "rewards": [m[REWARD] for m in steps],
        "cpu_seconds": cpu if settings.sampler == "hf" else None,  # a server's is not counted
    }


class PhaseClock:
    """Seconds spent in named methods of one object, per optimizer step."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []

    def wrap(self, owner: Any, method: str, phase: str) -> None:
        inner = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.add(phase, time.perf_counter() - started)

        setattr(owner, method, timed)

    def add(self, phase: str, seconds: float) -> None:
        self.current[phase] = self.current.get(phase, 0.0) + seconds


def trl_run(settings: RaceSettings, seed: int, out: Path, tasks: list[dict]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from callgrove.networks.hf import checkpoint_folder, resolve_model
    from callgrove.networks.lora import peft_lora_config

    folder = checkpoint_folder(resolve_model(MODEL.name))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    dataset = trl_dataset(tokenizer, tasks)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    lora = MODEL.lora()
    per_step = settings.group_size * settings.groups_per_step
    rewards: list[list[float]] = []

    def arithmetic_reward(completions: list[str], answer: list[int], **_: Any) -> list[float]:
        given = [score(text, target) for text, target in zip(completions, answer, strict=True)]
        rewards.append(given)
        return given

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[arithmetic_reward],
        args=trl_config(settings, seed, out),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_lora_config(lora),
    )
    clock = trl_phase_clock(trainer)
    trained_tokens = count_trained_tokens(trainer)  # outside the clock: counting is not timed
    step_seconds: list[float] = []
    trainer.add_callback(step_timer(clock, step_seconds))
    cpu_before = cpu_seconds()
    trainer.train()
    cpu = cpu_seconds() - cpu_before
    return {
        "step_seconds": step_seconds,
        "phases": [trl_phases(seconds) for seconds in clock.steps],
        "episodes": [float(per_step)] * len(step_seconds),
        "trained_tokens": trained_tokens,
        "rewards": [float(np.mean(r)) for r in rewards],
        "cpu_seconds": cpu,
    }


def trl_dataset(tokenizer: Any, tasks: list[dict]) -> Any:
    """The tasks as TRL's prompts (the tokens callgrove's loop renders, as text) and answers."""
    from datasets import Dataset

    from callgrove.models.hf import hf_chat

    chat = hf_chat(tokenizer, MODEL)
    prompts = [chat.show(chat.render([Message("user", Arithmetic.question(t))])) for t in tasks]
    answers = [Arithmetic.answer(t) for t in tasks]
    return Dataset.from_dict({"prompt": prompts, "answer": answers})


def trl_config(settings: RaceSettings, seed: int, out: Path) -> Any:
    """TRL's settings matching callgrove's step (the module docstring says which and why)."""
    from trl import GRPOConfig

    per_step = settings.group_size * settings.groups_per_step
    return GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=per_step,
        num_generations=settings.group_size,
        generation_batch_size=per_step,
        max_completion_length=settings.max_tokens,
        temperature=settings.temperature,
        top_p=1.0,
        gradient_checkpointing=False,
        bf16=False,  # callgrove trains in float32; on a CPU without bf16 units autocast crawls
        learning_rate=settings.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="none",
        num_iterations=1,
        gradient_accumulation_steps=1,
        max_steps=settings.steps,
        seed=seed,
        shuffle_dataset=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        dataloader_num_workers=0,
        log_completions=False,
    )


def trl_phase_clock(trainer: Any) -> PhaseClock:
    """A clock around the trainer's methods that `trl_phases` makes the phases of."""
    clock = PhaseClock()
    clock.wrap(trainer, "_generate", "sampling")
    clock.wrap(trainer, "_calculate_rewards", "scoring")
    clock.wrap(trainer, "_generate_and_score_completions", "prepare")
    clock.wrap(trainer, "training_step", "training_step")
    return clock


def count_trained_tokens(trainer: Any) -> list[float]:
    """The completion tokens of each batch the trainer makes, appended as it makes them."""
    trained_tokens: list[float] = []
    inner_generate = trainer._generate_and_score_completions

    def counted(*a: Any, **k: Any) -> dict[str, Any]:
        batch = inner_generate(*a, **k)
        trained_tokens.append(float(batch["completion_mask"].sum()))
        return batch

    trainer._generate_and_score_completions = counted
    return trained_tokens


def step_timer(clock: PhaseClock, step_seconds: list[float]) -> Any:
    """A `TrainerCallback` appending each step's seconds to `step_seconds`, timing the
    optimizer step into `clock` and closing the clock's record of each step."""
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.perf_counter()
            clock.current = {}

        def on_pre_optimizer_step(self, *_: Any, **__: Any) -> None:
            self.optimizing = time.perf_counter()

        def on_optimizer_step(self, *_: Any, **__: Any) -> None:
            clock.add("optimizer", time.perf_counter() - self.optimizing)

        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_seconds.append(time.perf_counter() - self.started)
            clock.steps.append(clock.current)
            print(f"TRL step {len(step_seconds)}: {step_seconds[-1]:.2f} s, {clock.current}")

    return Steps()


def trl_phases(seconds: dict[str, float]) -> dict[str, float]:
    """One step's timed methods as the race's phases: each method's time includes the timed
    methods it calls, so a phase is its method's time less theirs."""
    sampling, scoring = seconds.get("sampling", 0.0), seconds.get("scoring", 0.0)
    prepare = seconds.get("prepare", 0.0)
    return {
        "sampling": sampling,
        "scoring": scoring,
        "credit+batching": prepare - sampling - scoring,
        "forward_backward": seconds.get("training_step", 0.0) - prepare,
        "optimizer": seconds.get("optimizer", 0.0),
        "weight_push": 0.0,  # one model samples and trains
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over every run of one trainer (all seeds' steps together)."""
    seconds = [s for run in runs for s in run["step_seconds"]]
    total = sum(seconds)
    episodes = sum(sum(run["episodes"]) for run in runs)
    tokens = sum(sum(run["trained_tokens"]) for run in runs)
    cpu = None if None in (cpus := [run["cpu_seconds"] for run in runs]) else sum(cpus)
    return {
        "median_s": statistics.median(seconds),
        "best_s": min(seconds),
        "phases": {
            phase: statistics.median([p[phase] for run in runs for p in run["phases"]])
            for phase in PHASES
        },
        "episodes_per_s": episodes / total,
        "tokens_per_s": tokens / total,
        "episodes_per_cpu_s": None if cpu is None else episodes / cpu,
        "tokens_per_cpu_s": None if cpu is None else tokens / cpu,
        "last_reward": [run["rewards"][-1] for run in runs],
        "mean_reward": [float(np.mean(run["rewards"])) for run in runs],
    }


def race_folder(out: Path | None) -> Path:
    """Where a race keeps its runs: `out`, or a fresh temporary folder."""
    return out or Path(tempfile.mkdtemp(prefix="trl-race-"))


def run_race(
    settings: RaceSettings, out: Path, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Both trainers, interleaved per seed, their runs kept under `out`; the settings,
    versions, load average, figures and runs, also written to OUT/figures.json. `say` hears
    progress."""
    import torch

    import callgrove

    version = trl_version()
    torch.set_num_threads(settings.threads)
    say(f"TRL {version}; {settings} -> {out}")
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {"callgrove": [], "TRL": []}
    for seed in settings.seeds:
        groups = (settings.steps + 1) * settings.groups_per_step  # a step of lag: more drawn
        tasks = [Arithmetic().task(np.random.default_rng([seed, i])) for i in range(groups)]
        runs["callgrove"].append(callgrove_run(settings, seed, out / f"callgrove-{seed}"))
        for number, phases in enumerate(runs["callgrove"][-1]["phases"], 1):
            say(f"callgrove seed {seed} step {number}: {phases}")
        runs["TRL"].append(trl_run(settings, seed, out / f"trl-{seed}", tasks))
        say(f"TRL seed {seed}: {runs['TRL'][-1]['step_seconds']}")
    figures = {name: summary(trainer_runs) for name, trainer_runs in runs.items()}
    import peft
    import transformers

    race = {
        "settings": asdict(settings),
        "versions": {
            "callgrove": callgrove.__version__,
            "trl": version,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "torch": torch.__version__,
        },
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "speedup": figures["TRL"]["median_s"] / figures["callgrove"]["median_s"],
        "figures": figures,
        "runs": runs,
    }
    (out / "figures.json").write_text(json.dumps(race, indent=1))
    return race


def race_lines(race: dict[str, Any]) -> list[str]:
    """The race's figures as lines of text: a trainer each, then the verdict."""
    lines = []
    for name, f in race["figures"].items():
        split = ", ".join(f"{phase} {s:.2f}" for phase, s in f["phases"].items())
        per_cpu = (
            "per CPU-second not measured (a server samples)"
            if f["episodes_per_cpu_s"] is None
            else f"{f['episodes_per_cpu_s']:.3f} episodes/CPU-s, "
            f"{f['tokens_per_cpu_s']:.2f} tokens/CPU-s"
        )
        lines.append(
            f"{name:9s} step median {f['median_s']:.2f} s, best {f['best_s']:.2f} s ({split}); "
            f"{f['episodes_per_s']:.2f} episodes/s, {f['tokens_per_s']:.1f} trained tokens/s, "
            f"{per_cpu}; reward last step {f['last_reward']}, mean {f['mean_reward']}"
        )
    sampler = race["settings"]["sampler"]
    target = TARGETS[sampler]
    verdict = "meets" if race["speedup"] >= target else "BELOW"
    lines.append(
        f"callgrove's median step ({sampler} sampler) is {race['speedup']:.2f}x TRL's speed "
        f"({verdict} the {target}x target)"
    )
    return lines
