"""The training loop: dispatch, step, write, checkpoint; resumable at any moment.

Each step: collect the step's groups from the dispatcher (stale ones dropped), prepare samples
(credit, rows, degeneracy), one optimizer step in a worker thread while generation goes on,
the new weights to the sampler, evaluation if due (pinned to the new version), then the step's
files, its metrics line and the checkpoint, in that order (`callgrove.orchestrator.sinks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console

from callgrove.credit import Algorithm
from callgrove.episode import Episode
from callgrove.models import PolicyBackend
from callgrove.orchestrator import monitors, sinks
from callgrove.orchestrator.config import ConfigError, Resolved, TrainConfig, resolve, to_toml
from callgrove.orchestrator.dispatcher import Dispatcher
from callgrove.orchestrator.env import Environment
from callgrove.orchestrator.envs import make_env
from callgrove.orchestrator.learning import learner_step, policy_backend
from callgrove.orchestrator.memory import keep_freed_memory
from callgrove.orchestrator.run_folder import Progress, nothing_to_do, open_run, restore
from callgrove.orchestrator.step import prepare_step
from callgrove.orchestrator.supervised import SupervisedSummary, train_supervised


@dataclass
class RunSummary:
    out: Path
    first_step: int
    last_step: int
    metrics: list[dict[str, Any]] = field(default_factory=list)
    plot: Path | None = None
    unused_episodes: int = 0


def train(config: TrainConfig, console: Console | None = None) -> RunSummary | SupervisedSummary:
    """Run (or resume) the training described by `config`; returns where it wrote what.
    `[train] objective = "sft"` trains on `[data]` (`callgrove.orchestrator.supervised`)."""
    console = console or Console(stderr=True)
    if config.run.keep_freed_memory:
        keep_freed_memory()
    if config.train.objective == "sft":
        return train_supervised(config, console)
    with steady_heap():
        return asyncio.run(train_async(config, console))


@contextlib.contextmanager
def steady_heap(young_threshold: int = 50_000) -> Iterator[None]:
    """Fewer garbage-collector passes while the loop runs (restored after).

    A step makes many small objects per episode (records, tasks, rows), and most live until
    the step is written. With Python's defaults the collector then runs a young pass every 700
    new objects and every so often a full pass over everything alive, together about as
    costly as building the episodes' rows. So what exists when the loop starts (modules, the
    model) is frozen out of the passes, and a young pass waits for `young_threshold` new
    objects; cyclic garbage is still collected, in fewer, larger passes.
    """
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(young_threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


async def train_async(config: TrainConfig, console: Console) -> RunSummary:
    with open_run(config) as checkpoint:
        return await _train(config, console, checkpoint)


def environment(config: TrainConfig) -> Environment:
    try:
        return make_env(config.env.name, config.env.options)
    except ValueError as error:
        raise ConfigError(f"env: {error}") from None


async def _train(
    config: TrainConfig, console: Console, checkpoint: dict[str, Any] | None
) -> RunSummary:
    out = Path(config.run.out)
    if (done := nothing_to_do(checkpoint, config.run.steps)) is not None:
        return RunSummary(out, done, done, sinks.read_metrics(out))
    env = environment(config)
    executor = _executor(config)
    try:
        return await _run(config, console, checkpoint, env, executor)
    finally:
        if executor:
            executor.close()


async def _run(
    config: TrainConfig,
    console: Console,
    checkpoint: dict[str, Any] | None,
    env: Environment,
    executor: Any,
) -> RunSummary:
    out = Path(config.run.out)
    backend = policy_backend(config, executor.sampler if executor else None)
    resolved = resolve(config, tuple(backend.chat.stop_token_ids))
    algorithm = resolved.algorithm
    progress = await _start_or_resume(config, checkpoint, backend, algorithm, executor)
    first = progress.step
    sinks.rewind(out, first)
    sinks.write_text_atomically(out / "config.toml", to_toml(config))

    if executor:
        executor.start_workers(backend.chat, resolved.sampling)
    dispatcher = _dispatcher(config, resolved, env, backend, executor, progress)
    metric_sinks = _metric_sinks(config, out, progress.run_id)
    display = monitors.LiveDisplay(console, config.run.steps, config.monitor.live, first)
    # The episodes handed to the step under way until its checkpoint is saved: a step that
    # fails (or is interrupted) leaves them unused, never lost.
    handed: list[Episode] = []
    dispatcher.start()
    try:
        for step in range(first + 1, config.run.steps + 1):
            metrics, table = await _step(step, config, resolved, backend, dispatcher, out, handed)
            for sink in metric_sinks:
                sink.log(step, metrics)
                sink.log_samples(step, table)
            progress = _progress_after(step, dispatcher, progress.run_id)
            sinks.save_checkpoint(out, _checkpoint_state(config, progress, backend, algorithm))
            handed.clear()
            display.update(step, metrics, dispatcher.in_flight_episodes)
    finally:
        leftovers = [*handed, *await dispatcher.stop()]
        if callable(getattr(env, "close", None)):  # an environment holding a server or workers
            env.close()
        unused = sinks.append_episodes(out / "unused" / "train" / "traces.jsonl", leftovers)
        _close_metric_sinks(metric_sinks, max(first, progress.step), dispatcher)
        display.close()
        if callable(getattr(backend.sampler, "aclose", None)):  # servers it started
            await backend.sampler.aclose()
    metrics = sinks.read_metrics(out)
    title = f"callgrove train · {out.name} (run {progress.run_id})"
    plot = monitors.plot_run(metrics, out / "rewards.png", title) if config.monitor.plot else None
    return RunSummary(out, first, progress.step, metrics, plot, unused)


async def _start_or_resume(
    config: TrainConfig,
    checkpoint: dict[str, Any] | None,
    backend: PolicyBackend,
    algorithm: Algorithm,
    executor: Any,
) -> Progress:
    """The run's progress: a new run's, saved as its first checkpoint, or the checkpoint's,
    with learner, sampler and algorithm restored; the sampler then has the learner's weights."""
    out = Path(config.run.out)
    if checkpoint is None:
        progress = Progress.new()
        # the folder is a run from here on
        sinks.save_checkpoint(out, _checkpoint_state(config, progress, backend, algorithm))
    else:
        progress = checkpoint["progress"]
        restore(
            out,
            checkpoint,
            ("learner", backend.learner),
            ("sampler", backend.sampler),
            ("algorithm", algorithm),
        )
    if checkpoint is not None or executor:  # a restored learner, or a sampler actor's own copy
        await backend.sampler.load_weights(backend.learner.weights(), backend.learner.version)
    return progress


def _checkpoint_state(
    config: TrainConfig, progress: Progress, backend: PolicyBackend, algorithm: Algorithm
) -> dict[str, Any]:
    """What a checkpoint holds: enough to carry the run on exactly where it stands."""
    return {
        "progress": msgspec.to_builtins(progress),
        "learner": backend.learner.state_dict(),
        "sampler": backend.sampler.state_dict(),
        "algorithm": algorithm.state_dict(),
        "config": msgspec.to_builtins(config),
    }


def _progress_after(step: int, dispatcher: Dispatcher, run_id: str) -> Progress:
    """Where the run stands once `step` is done: what a resumed run starts from."""
    return Progress(
        step=step,
        run_id=run_id,
        next_group=dispatcher.next_group,
        pending=dispatcher.pending_groups(),
        counters=dict(dispatcher.counters),
    )


def _dispatcher(
    config: TrainConfig,
    resolved: Resolved,
    env: Environment,
    backend: PolicyBackend,
    executor: Any,
    progress: Progress,
) -> Dispatcher:
    """The dispatcher, carrying on from `progress` (its next group, groups pending, counters)."""
    dispatcher = Dispatcher(
        env,
        backend.sampler,
        backend.chat,
        resolved.sampling,
        config.dispatch,
        run_id=progress.run_id,
        seed=config.run.seed,
        next_group=progress.next_group,
        relaunch=progress.pending,
        runner=executor.run_episode if executor else None,
        steps_done=progress.step,
    )
    dispatcher.counters.update(progress.counters)
    return dispatcher


async def _step(
    step: int,
    config: TrainConfig,
    resolved: Resolved,
    backend: PolicyBackend,
    dispatcher: Dispatcher,
    out: Path,
    handed: list[Episode],
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One step; `handed` gets the episodes it collects."""
    started = time.perf_counter()
    collected = await dispatcher.collect(step)
    handed += [e for group in [*collected.trained, *collected.stale] for e in group.episodes]
    waited = time.perf_counter() - started
    groups = [group.episodes for group in collected.trained]
    prepared = prepare_step(
        groups, resolved.algorithm, resolved.degeneracy, resolved.sampling, config.rows
    )
    trained_at = time.perf_counter()
    report = await asyncio.to_thread(
        learner_step, step, backend.learner, prepared.samples, config.train
    )
    pushed_at = time.perf_counter()
    train_seconds = pushed_at - trained_at
    await backend.sampler.load_weights(backend.learner.weights(), backend.learner.version)
    await dispatcher.notify()

    evaluated_at = time.perf_counter()
    evaluated = []
    if config.run.eval_every and step % config.run.eval_every == 0:
        evaluated = await dispatcher.evaluate(step, config.run.eval_repeats)

    written_at = time.perf_counter()
    episodes = [e for group in groups for e in group]
    dropped = [e for group in collected.stale for e in group.episodes]
    for episode in dropped:
        episode.meta = {**(episode.meta or {}), "dropped": "stale"}
    here = sinks.step_dir(out, step)
    sinks.write_episodes_atomically(here / "train" / "traces.jsonl", [*episodes, *dropped])
    table = monitors.sample_table(step, prepared, backend.chat, config.monitor.samples_per_step)
    sinks.write_json_lines_atomically(here / "train" / "samples.jsonl", table)
    if evaluated:
        sinks.write_episodes_atomically(here / "eval" / "traces.jsonl", evaluated)

    ended = time.perf_counter()
    elapsed = ended - started
    tokens = sum(len(c.completion_ids) for e in episodes for c in e.calls())
    metrics = monitors.seat_metrics("train", episodes)
    metrics |= monitors.staleness_metrics(episodes, step)
    metrics |= monitors.step_degeneracy_metrics(prepared)
    if evaluated:
        metrics |= monitors.seat_metrics("eval", evaluated)
    metrics |= {k: float(v) for k, v in dispatcher.counters.items()}
    metrics |= monitors.learner_metrics(report, backend.learner.version)
    metrics["train/unknown_sampling_calls"] = float(prepared.unknown_sampling_calls)
    metrics |= monitors.step_profile(
        waited=waited,
        episodes=episodes,
        prepared=prepared,
        learner=report.seconds,
        train=train_seconds,
        weight_push=evaluated_at - pushed_at,
        evaluation=written_at - evaluated_at,
        write=ended - written_at,
    )
    metrics |= {
        "throughput/tokens_per_s": tokens / max(elapsed, 1e-9),
        "throughput/episodes_per_s": len(episodes) / max(elapsed, 1e-9),
        "time/step_s": elapsed,
        "time/wait_s": waited,
        "time/train_s": train_seconds,
        "dispatcher/in_flight": float(dispatcher.in_flight_episodes),
    }
    return metrics, table


def _metric_sinks(config: TrainConfig, out: Path, run_id: str) -> list[Any]:
    chosen: list[Any] = [sinks.JsonlSink(out)]
    if config.monitor.wandb:
        chosen.append(sinks.WandbSink(out, config.monitor, msgspec.to_builtins(config), run_id))
    if config.monitor.tensorboard:
        chosen.append(sinks.TensorBoardSink(out))
    return chosen


def _close_metric_sinks(metric_sinks: list[Any], step: int, dispatcher: Dispatcher) -> None:
    """Each sink gets the run's final counters (at its last step done), then closes."""
    final = {"final": True, **{k: float(v) for k, v in dispatcher.counters.items()}}
    for sink in metric_sinks:
        sink.log(step, final)
        sink.close()


def _executor(config: TrainConfig) -> Any:
    """On Ray, the actors' handle (`RayExecutor`), its sampler actor started; else None."""
    if config.run.executor != "ray":
        return None
    from callgrove.orchestrator.ray_executor import RayExecutor

    return RayExecutor.start(config)
