"""What a run shows: metrics per seat, the sample table, a live display and the reward plot.

Metrics are keyed `{scope}/{subset}/{agent}/{metric}`: scope `train` or `eval`, subset `all`,
the agent's seat (its name: `leader`, `helper`, ...), then the metric, with `episode` in the
seat's place for episode-level totals. A cancelled episode belongs to no seat (nobody finished
running it): it is counted only under `dispatcher/cancelled/{train,eval}`. An error is charged
to the seat it names; an error naming no agent only to the episode totals.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from callgrove.chat import ChatFormat
from callgrove.episode import Episode, off_policy_steps
from callgrove.orchestrator.degeneracy import DETECTORS
from callgrove.orchestrator.step import PreparedStep

SUBSET = "all"


def is_cancelled(episode: Episode) -> bool:
    return any(error.type == "Cancelled" for error in episode.errors)


def seat_metrics(scope: str, episodes: Sequence[Episode]) -> dict[str, float]:
    """Per seat: reward, tokens, calls, rows, errors, degeneracy rates and surprisal (the mean
    negative sampling logprob of a call's tokens: an estimate of the policy's entropy, which
    falls towards 0 when the policy collapses onto one answer); episode totals."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    totals: dict[str, list[float]] = defaultdict(list)
    for episode in episodes:
        if is_cancelled(episode):
            continue
        named = defaultdict(int)
        for error in episode.errors:
            if isinstance(error.agent, str):
                named[error.agent] += 1
        degeneracy = (episode.meta or {}).get("degeneracy", {})
        calls_meta = degeneracy.get("calls", {})
        rows_of = defaultdict(int)
        for row in degeneracy.get("rows", []):
            rows_of[row["agent"]] += 1
        for agent in episode.agents:
            seat = values[agent.name]
            if episode.ok:
                seat["reward"].append(episode.reward_of(agent))
            seat["tokens"].append(sum(len(c.completion_ids) for c in agent.calls))
            seat["calls"].append(len(agent.calls))
            seat["errors"].append(named[agent.id])
            if episode.ok:
                seat["rows"].append(rows_of[agent.id])
            for call in agent.calls:
                if call.logprobs is not None and len(call.logprobs):
                    seat["surprisal"].append(-float(np.mean(call.logprobs)))
                flags = calls_meta.get(call.id, {}).get("flags")
                if flags is not None:
                    for detector in DETECTORS:
                        seat[f"{detector}_rate"].append(float(detector in flags))
        totals["ok"].append(float(episode.ok))
        totals["errors"].append(len(episode.errors))
        totals["calls"].append(sum(1 for _ in episode.calls()))
        totals["tokens"].append(sum(len(c.completion_ids) for c in episode.calls()))
        if episode.ok:
            totals["reward"].append(episode.reward)
    prefix = f"{scope}/{SUBSET}"
    metrics = {
        f"{prefix}/{seat}/{name}/mean": float(np.mean(series))
        for seat, by_name in values.items()
        for name, series in by_name.items()
        if series
    }
    metrics |= {
        f"{prefix}/episode/{name}/mean": float(np.mean(s)) for name, s in totals.items() if s
    }
    metrics[f"{prefix}/episode/count"] = float(len(totals["ok"]))
    return metrics


def staleness_metrics(episodes: Sequence[Episode], step: int) -> dict[str, float]:
    """Off-policy spread of the episodes a step trains on."""
    readings = [off_policy_steps(e, step) for e in episodes]
    if not readings:
        return {}
    total = np.array([r.total for r in readings])
    return {
        "off_policy/mean": float(total.mean()),
        "off_policy/max": float(total.max()),
        "off_policy/in_flight/mean": float(np.mean([r.in_flight for r in readings])),
        "off_policy/in_queue/mean": float(np.mean([r.in_queue for r in readings])),
    }


def step_degeneracy_metrics(prepared: PreparedStep) -> dict[str, float]:
    report = prepared.degeneracy
    metrics = {
        "degeneracy/rows": float(report.rows),
        "degeneracy/dropped_rows": float(report.dropped_rows),
        "credit/unassigned_calls": float(prepared.unassigned_calls),
    }
    for seat, flags in report.row_flags.items():
        for detector, count in flags.items():
            metrics[f"train/{SUBSET}/{seat}/{detector}_rows/rate"] = count / report.seat_rows[seat]
    for seat, advantages in prepared.advantages.items():
        metrics[f"train/{SUBSET}/{seat}/advantage/abs_mean"] = float(np.mean(np.abs(advantages)))
    return metrics


def sample_table(
    step: int, prepared: PreparedStep, chat: ChatFormat, limit: int
) -> list[dict[str, Any]]:
    """One line per training row (the first `limit`): seat, row index, decoded text, reward and
    the advantage of the leaf call."""
    table = []
    for er in prepared.episode_rows:
        for row in er.rows:
            if len(table) >= limit:
                return table
            advantage = row.leaf.advantages
            table.append(
                {
                    "step": step,
                    "episode": er.episode.id,
                    "agent": row.agent.id,
                    "seat": row.agent.name,
                    "branch_idx": row.index,
                    "text": chat.show(er.token_ids(row)[-48:]),
                    "reward": round(float(row.reward), 4),
                    "advantage": None if advantage is None else round(float(np.mean(advantage)), 4),
                }
            )
    return table


# A step's seconds by phase, in the order a step runs them: metric `time/{phase}_s`, the live
# view's label, and what the phase holds.
STEP_PHASES = {
    "sampling": (
        "sampling",
        "waiting for the step's groups: the policy generating (scoring aside); episodes of "
        "the next steps go on generating while the learner trains",
    ),
    "scoring": (
        "scoring",
        "the environments' own time outside policy calls (scoring, tools, a harness CLI), "
        "summed over the step's episodes and counted within the wait",
    ),
    "credit": ("credit", "the algorithm's credit on every group"),
    "batching": (
        "batching",
        "rows, degeneracy and samples, then packing them into the learner's model batches",
    ),
    "forward_backward": ("fwd+bwd", "the learner's forward and backward passes"),
    "optimizer": ("optimizer", "gradient clipping and the optimizer's update"),
    "weight_push": ("push", "the new weights into the sampler (and the executor's workers)"),
    "eval": ("eval", "evaluation, when due"),
    "write": ("write", "the step's episode and sample files"),
}


def step_profile(
    *,
    waited: float,
    episodes: Sequence[Episode],
    prepared: PreparedStep,
    learner: dict[str, float],
    train: float,
    weight_push: float,
    evaluation: float,
    write: float,
) -> dict[str, float]:
    """The step's seconds by phase (`STEP_PHASES`), each a part of the step's wall time, so
    they sum to no more than `time/step_s` (the rest: handing work to the learner's thread,
    the learner's mismatch metrics). `learner`: a `StepReport.seconds` (a learner that does not
    report its phases leaves its whole time to forward_backward)."""
    own = sum(
        max(float(meta.get("seconds", 0.0)) - float(meta.get("policy_seconds", 0.0)), 0.0)
        for meta in (episode.meta or {} for episode in episodes)
    )
    scoring = min(own, waited)
    learned = learner or {"forward_backward": train}
    seconds = {
        "sampling": waited - scoring,
        "scoring": scoring,
        "credit": prepared.seconds.get("credit", 0.0),
        "batching": prepared.seconds.get("batching", 0.0) + learned.get("batching", 0.0),
        "forward_backward": learned.get("forward_backward", 0.0),
        "optimizer": learned.get("optimizer", 0.0),
        "weight_push": weight_push,
        "eval": evaluation,
        "write": write,
    }
    return {f"time/{phase}_s": seconds[phase] for phase in STEP_PHASES}


def profile_text(metrics: dict[str, float]) -> str:
    """The step's time and the phases that took at least 1% of it, largest first."""
    step = metrics.get("time/step_s")
    if not step:
        return ""
    shown = sorted(
        (
            (metrics[f"time/{phase}_s"], label)
            for phase, (label, _) in STEP_PHASES.items()
            if metrics.get(f"time/{phase}_s", 0.0) >= 0.01 * step
        ),
        reverse=True,
    )
    parts = " + ".join(f"{label} {seconds:.2f}" for seconds, label in shown)
    return f"step {step:.2f}s = {parts}" if parts else f"step {step:.2f}s"


# What "behind" means on the live line and in the plot, said once.
STALENESS = "policy versions between the weights that sampled a call and the weights trained on it"


def progress_line(
    step: int,
    total: int,
    metrics: dict[str, float],
    in_flight: int,
    elapsed_s: float,
    steps_done: int,
) -> str:
    """The live line of a step: where the run is, its loss, reward by seat, time taken and
    left (from this session's pace), throughput, how stale the trained calls were, and where
    the step's seconds went (`profile_text`)."""
    rewards = _seat_values(metrics, "reward")
    seats = "  ".join(f"{seat} {value:.2f}" for seat, value in sorted(rewards.items()))
    left = (total - step) * elapsed_s / steps_done if steps_done else None
    loss = metrics.get("train/loss")
    parts = [
        f"step {step}/{total}",
        f"loss {loss:.4g}" if loss is not None else "",
        f"reward {seats}" if seats else "",
        f"elapsed {clock(elapsed_s)}",
        f"ETA {clock(left)}" if left is not None else "",
        f"tok/s {metrics.get('throughput/tokens_per_s', 0):.0f}",
        f"in flight {in_flight}",
        f"calls {metrics.get('off_policy/mean', 0):.2f} versions behind "
        f"(max {metrics.get('off_policy/max', 0):.0f})",
        f"mismatch {_mismatch(metrics)}",
        profile_text(metrics),
    ]
    return "  ".join(part for part in parts if part)


def clock(seconds: float) -> str:
    """Seconds as H:MM:SS (M:SS under an hour)."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _seat_values(metrics: dict[str, float], name: str) -> dict[str, float]:
    return {
        key.split("/")[2]: value
        for key, value in metrics.items()
        if key.startswith(f"train/{SUBSET}/") and key.endswith(f"/{name}/mean")
    }


class LiveDisplay:
    """The run's progress, redrawn every step: a table of seats with the progress line under
    it on a terminal, the progress line alone otherwise. `first_step`: the step the run
    resumed after (the ETA is paced by the steps of this session)."""

    def __init__(self, console: Console, total_steps: int, enabled: bool, first_step: int = 0):
        self.console = console
        self.total = total_steps
        self.enabled = enabled
        self.first_step = first_step
        self.started = time.monotonic()
        self._live = None
        if enabled and console.is_terminal:
            from rich.live import Live

            self._live = Live(console=console, auto_refresh=False, transient=False)
            self._live.start()
            self.console.print(f"[dim]versions behind: {STALENESS}[/]")

    def update(self, step: int, metrics: dict[str, float], in_flight: int) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.started
        line = progress_line(step, self.total, metrics, in_flight, elapsed, step - self.first_step)
        if self._live is None:
            self.console.print(line, markup=False)
            return
        rewards = _seat_values(metrics, "reward")
        table = Table(title=f"callgrove train · step {step}/{self.total}", expand=False)
        for column in ("seat", "reward", "completion tokens", "calls"):
            table.add_column(column)
        for seat in sorted(rewards):
            table.add_row(
                seat,
                f"{rewards[seat]:.3f}",
                f"{metrics.get(f'train/{SUBSET}/{seat}/tokens/mean', 0):.1f}",
                f"{metrics.get(f'train/{SUBSET}/{seat}/calls/mean', 0):.1f}",
            )
        table.caption = (
            f"{line} · forwarded ratio {metrics.get('train/forwarded_token_ratio', 0):.2f}"
        )
        self._live.update(table, refresh=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()


def _mismatch(metrics: dict[str, float]) -> str:
    """The step's mean logprob difference between learner and sampler: on the tokens the trained
    weights sampled, and over all (older versions' calls too)."""
    on_policy = metrics.get("train/mismatch/on_policy/mean_abs")
    every = metrics.get("train/mismatch/all/mean_abs", 0.0)
    return f"{every:.1e}" if on_policy is None else f"{on_policy:.1e} (all {every:.1e})"


# The plot's panels: (title, y label, [(metric key or a seat pattern, label)], log scale).
# `{seat}` stands for every seat the run has; a panel with no metric in the run is left out.
PANELS = (
    ("reward", "reward (smoothed)", [], False),  # drawn by `_rewards`
    ("loss", "loss", [("train/loss", "loss")], False),
    (
        "entropy and sampler/learner mismatch",
        "nats",
        [
            ("train/{seat}/surprisal", "{seat} surprisal (sampling entropy estimate)"),
            ("train/mismatch/on_policy/mean_abs", "|learner - sampler| logprob, trained version"),
            ("train/mismatch/all/mean_abs", "|learner - sampler| logprob, all calls"),
            ("train/mismatch/all/k3", "KL k3, all calls"),
        ],
        True,
    ),
    ("clip fraction", "share of trained tokens", [("train/clip_fraction", "clipped")], False),
    ("gradient norm", "norm (before clipping)", [("train/grad_norm", "grad norm")], False),
    (
        "completion length per seat",
        "tokens per agent",
        [("train/{seat}/tokens", "{seat}")],
        False,
    ),
    (
        "throughput",
        "per second",
        [
            ("throughput/tokens_per_s", "sampled tokens/s"),
            ("train/forwarded_token_ratio", "row tokens per forwarded token"),
        ],
        True,
    ),
    (
        "staleness",
        "versions behind",
        [("off_policy/mean", "mean"), ("off_policy/max", "max")],
        False,
    ),
)


def plot_run(metrics: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path | None:
    """The run's curves as a PNG titled with the run's name: reward by seat (and evaluation),
    then a panel for each of `PANELS` the metrics hold."""
    lines = [m for m in metrics if "step" in m and not m.get("final")]
    if not lines:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = plotted_panels(lines)
    columns = 2
    rows = (len(drawn) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(12, 3.2 * rows), sharex=True, squeeze=False)
    for axis, ((name, ylabel, _keys, log), series) in zip(axes.flat, drawn, strict=False):
        if name == "reward":
            _rewards(axis, lines)
        for label, steps, values in series:
            axis.plot(steps, np.maximum(values, 1e-12) if log else values, label=label)
        if log and series:
            axis.set_yscale("log")
        axis.set_title(name, fontsize=10)
        axis.set_ylabel(ylabel, fontsize=8)
        axis.grid(alpha=0.3)
        if len(series) > 1:
            axis.legend(fontsize=6)
    for axis in list(axes.flat)[len(drawn) :]:
        axis.set_visible(False)
    for axis in axes[-1]:
        axis.set_xlabel("step")
    last = lines[-1]["step"]
    figure.suptitle(f"{title} · {last} steps" if title else f"{last} steps", fontsize=12)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plotted_panels(lines: Sequence[dict[str, Any]]) -> list[tuple[tuple, list]]:
    """The panels of `PANELS` the metric lines have data for (reward always), each with its
    series: (label, steps, values)."""
    seats = sorted({k.split("/")[2] for m in lines for k in m if k.startswith(f"train/{SUBSET}/")})
    seats = [seat for seat in seats if seat != "episode"]
    drawn = [(panel, _series(lines, panel[2], seats)) for panel in PANELS]
    return [(panel, series) for panel, series in drawn if series or panel[0] == "reward"]


def _rewards(axis: Any, lines: Sequence[dict[str, Any]]) -> None:
    keys = sorted({k for m in lines for k in m if k.endswith("/reward/mean")})
    for key in keys:
        steps, values = zip(*[(m["step"], m[key]) for m in lines if key in m], strict=True)
        label = key.removesuffix("/reward/mean").replace(f"/{SUBSET}/", " ")
        style = "--" if key.startswith("eval/") else "-"
        width = 2.5 if "/episode/" in key else 1.2
        axis.plot(steps, _smooth(values), style, label=label, linewidth=width)
    if keys:
        axis.legend(fontsize=6, ncol=2)


def _series(
    lines: Sequence[dict[str, Any]], keys: list[tuple[str, str]], seats: list[str]
) -> list[tuple[str, tuple, tuple]]:
    """(label, steps, values) of each key the metrics hold (`{seat}` once for every seat)."""
    found = []
    for key, label in keys:
        for seat in seats if "{seat}" in key else [""]:
            name = key.replace("train/{seat}/", f"train/{SUBSET}/{seat}/") + (
                "/mean" if "{seat}" in key else ""
            )
            points = [(m["step"], m[name]) for m in lines if name in m]
            if points:
                steps, values = zip(*points, strict=True)
                found.append((label.replace("{seat}", seat), steps, values))
    return found


def _smooth(values: Sequence[float], window: int = 5) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if len(array) < window:
        return array
    kernel = np.ones(window) / window
    padded = np.concatenate([np.full(window - 1, array[0]), array])
    return np.convolve(padded, kernel, mode="valid")


def learner_metrics(report: Any, version: int) -> dict[str, float]:
    """An optimizer step's report (`callgrove.train.learner.StepReport`) as metrics."""
    return {
        "train/loss": report.loss,
        "train/grad_norm": report.grad_norm,
        "train/samples": float(report.samples),
        "train/loss_tokens": float(report.loss_tokens),
        "train/forwarded_tokens": float(report.forwarded_tokens),
        "train/row_tokens": float(report.row_tokens),
        "train/forwarded_token_ratio": report.forwarded_token_ratio,
        **(
            {"train/clip_fraction": report.extra["clip_fraction"]}
            if "clip_fraction" in report.extra
            else {}
        ),
        "policy/version": float(version),
        **{f"train/mismatch/{key}": value for key, value in report.mismatch.items()},
        # a mixture of experts' routing replay (`callgrove.train.learner.RouteTally`)
        **{f"train/{key}": v for key, v in report.extra.items() if key.startswith("routes/")},
    }
