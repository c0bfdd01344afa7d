"""What a run shows: metrics per seat, the sample table, a live display and the reward plot.

Metrics are keyed `{scope}/{subset}/{agent}/{metric}`: scope `train` or `eval`, subset `all`,
the agent's seat (its name: `leader`, `helper`, ...), then the metric, with `episode` in the
seat's place for episode-level totals. A cancelled episode belongs to no seat (nobody finished
running it): it is counted only under `dispatcher/cancelled/{train,eval}`. An error is charged
to the seat it names; an error naming no agent only to the episode totals.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from callgrove.episode import Episode, off_policy_steps
from callgrove.orchestrator.degeneracy import DETECTORS
from callgrove.orchestrator.step import PreparedStep
from callgrove.policy.render import Renderer

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
    step: int, prepared: PreparedStep, renderer: Renderer, limit: int
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
                    "text": renderer.show(row.token_ids[-48:]),
                    "reward": round(float(row.reward), 4),
                    "advantage": None if advantage is None else round(float(np.mean(advantage)), 4),
                }
            )
    return table


class LiveDisplay:
    """A table in the terminal, redrawn every step: reward by seat, throughput, staleness."""

    def __init__(self, console: Console, total_steps: int, enabled: bool):
        self.console = console
        self.total = total_steps
        self.enabled = enabled
        self._live = None
        if enabled and console.is_terminal:
            from rich.live import Live

            self._live = Live(console=console, auto_refresh=False, transient=False)
            self._live.start()

    def update(self, step: int, metrics: dict[str, float], in_flight: int) -> None:
        if not self.enabled:
            return
        rewards = {
            key.split("/")[2]: value
            for key, value in metrics.items()
            if key.startswith("train/all/") and key.endswith("/reward/mean")
        }
        seats = "  ".join(f"{seat} {value:.2f}" for seat, value in sorted(rewards.items()))
        line = (
            f"step {step}/{self.total}  {seats}  tok/s {metrics.get('throughput/tokens_per_s', 0):.0f}"
            f"  in flight {in_flight}  stale {metrics.get('off_policy/mean', 0):.2f}"
            f"  mismatch {_mismatch(metrics)}"
        )
        if self._live is None:
            self.console.print(line)
            return
        table = Table(title=f"callgrove train · step {step}/{self.total}", expand=False)
        for column in ("seat", "reward", "tokens", "calls"):
            table.add_column(column)
        for seat in sorted(rewards):
            table.add_row(
                seat,
                f"{rewards[seat]:.3f}",
                f"{metrics.get(f'train/all/{seat}/tokens/mean', 0):.1f}",
                f"{metrics.get(f'train/all/{seat}/calls/mean', 0):.1f}",
            )
        table.caption = (
            f"tokens/s {metrics.get('throughput/tokens_per_s', 0):.0f} · in flight {in_flight}"
            f" · off-policy {metrics.get('off_policy/mean', 0):.2f}"
            f" · forwarded ratio {metrics.get('train/forwarded_token_ratio', 0):.2f}"
            f" · sampler/learner mismatch {_mismatch(metrics)}"
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


def plot_run(metrics: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Reward curves by seat (and evaluation), the forwarded-token ratio and the
    sampler/learner mismatch, as a PNG."""
    lines = [m for m in metrics if "step" in m and not m.get("final")]
    if not lines:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rewards, ratio, mismatch) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    keys = sorted({k for m in lines for k in m if k.endswith("/reward/mean")})
    for key in keys:
        points = [(m["step"], m[key]) for m in lines if key in m]
        steps, values = zip(*points, strict=True)
        label = key.removesuffix("/reward/mean").replace("/all/", " ")
        style = "--" if key.startswith("eval/") else "-"
        width = 2.5 if "/episode/" in key else 1.2
        rewards.plot(steps, _smooth(values), style, label=label, linewidth=width)
    rewards.set_ylabel("reward (smoothed)")
    rewards.legend(fontsize=7, ncol=2)
    rewards.grid(alpha=0.3)
    points = [
        (m["step"], m["train/forwarded_token_ratio"])
        for m in lines
        if "train/forwarded_token_ratio" in m
    ]
    if points:
        steps, values = zip(*points, strict=True)
        ratio.plot(steps, values, color="tab:green")
    ratio.set_ylabel("row tokens / forwarded tokens")
    ratio.grid(alpha=0.3)
    for key, label in (
        ("on_policy/mean_abs", "mean |learner - sampler| logprob, the trained version's calls"),
        ("all/mean_abs", "mean |learner - sampler| logprob, all calls"),
        ("all/k3", "KL k3, all calls"),
    ):
        points = [
            (m["step"], m[f"train/mismatch/{key}"]) for m in lines if f"train/mismatch/{key}" in m
        ]
        if points:
            steps, values = zip(*points, strict=True)
            mismatch.plot(steps, np.maximum(values, 1e-12), label=label)
    mismatch.set_yscale("log")
    mismatch.set_ylabel("sampler/learner mismatch")
    mismatch.legend(fontsize=7)
    mismatch.set_xlabel("step")
    mismatch.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


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
        "policy/version": float(version),
        **{f"train/mismatch/{key}": value for key, value in report.mismatch.items()},
    }
