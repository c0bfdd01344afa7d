"""Does training every call exactly once matter? Each row scheme, the same environments, seeds.

Runs `callgrove train` (the settings of `examples/train.toml`: the tiny reference decoder from
scratch, hierarchical GRPO, an entropy bonus) once per environment, condition and seed, with
the same steps and settings, and writes one table (Markdown and JSON) and one plot (PNG).

Conditions: every `[rows] scheme` with the defaults, and the two open questions as variants of
`exactly_once`: a background agent's rows credited with the episode's reward or not trained
(`rows.background_reward = "episode"` / `"none"`; `relay` only, the environment with a
background agent), and compaction calls not trained (`rows.train_compaction = false`).

Environments: `relay` (every agent scored on its own answers, the episode on all of them),
`handoff` (only the final answer is scored, and it needs the fresh helper's, the fork's and
the compaction summary's work) and `repair` (a harness's shape: fresh readers, a forked editor,
a compaction, a test suite on the final answer only). Per condition the table gives the mean episode reward over the
last 20% of the steps (mean over seeds, and each seed's), the gain over the first 20%, each
seat's score over the last 20% (read off the episodes' `meta.seats`), the loss tokens and row
tokens trained per step and the step time. The plot: mean episode reward per step (mean of
the seeds, smoothed), loss tokens per step and step time, per environment.

    nice -n 10 python benchmarks/schemes.py [--steps 50] [--seeds 0 1 2] [--workers 2]
        [--out runs/schemes] [--results benchmarks/results]

`--credit` runs exactly-once's rows with each `[algorithm]` credit option for subagents scored
by the episode's reward (`shared_reward_credit`, `shared_reward_scale`) against `exactly_once`
and `leader_only`, and writes `credit.{md,json,png}`: the table adds, seed by seed, how many
seeds end above leader-only and exactly-once, and the reward at equal compute (within the wall
time and the loss tokens the cheapest run of the environment spent); the plot adds the reward
against loss tokens and against wall time:

    nice -n 19 python benchmarks/schemes.py --credit --envs handoff --steps 40 --seeds 0 1 2 3 4
        --workers 1

`--smollm2` runs the most telling case of the tiny decoder's results again with SmolLM2-135M-
Instruct (LoRA, as the README's SmolLM2 recipe): `handoff`, `leader_only` against
`exactly_once`, one run at a time, the two schemes alternating seed by seed so both see the same
machine load. It writes `schemes_smollm2.{md,json,png}` (the settings in the JSON):

    nice -n 10 python benchmarks/schemes.py --smollm2 --steps N --workers 1

`--replot` redraws the plot beside a stored result from the runs it holds, rerunning nothing
(every result JSON this script writes keeps them; the published `schemes.json` predates that,
and its plot is redrawn only by running again):

    python benchmarks/schemes.py --replot benchmarks/results/credit_200.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from pathlib import Path

import numpy as np

CONFIG = Path(__file__).resolve().parent.parent / "examples" / "train.toml"
REWARD = "train/all/episode/reward/mean"
SCHEMES = ("exactly_once", "leader_only", "drop_subagents", "per_agent", "first_branch")
# Seat columns: the answer scores each environment records in `meta.seats`, by the seat.
SEATS = {
    "relay": {
        "leader": ("copy",),
        "fresh": ("helper_first", "helper_middle"),
        "fork": ("fork",),
        "background": ("checker",),
        "summary": ("summary",),
        "after compaction": ("final",),
    },
    "handoff": {
        "leader": ("copy",),
        "fresh": ("helper",),
        "fork": ("fork",),
        "summary": ("summary",),
        "after compaction": ("final",),
    },
    "repair": {
        "fresh": ("reader_a", "reader_b"),
        "fork": ("editor",),
        "summary": ("summary",),
        "after compaction": ("final",),
    },
}
SEAT_COLUMNS = ("leader", "fresh", "fork", "background", "summary", "after compaction")
ENV_OVERRIDES = {
    "relay": {},
    # One helper an episode: it has no sibling to be baselined against within the episode.
    "handoff": {"algorithm.local_seats": []},
    # Two readers an episode, neither with a reward of its own: within the episode they would
    # only be baselined against each other's equal reward.
    "repair": {"algorithm.local_seats": []},
}


# The SmolLM2 run: the handoff environment worded for an instruct model (its terse prompts get
# prose back, scoring about 0.01 with no spread to learn from) and the README's SmolLM2 recipe
# (LoRA r=16, temperature 0.7), with what a few steps on two shared cores need: one group of 8
# a step; 5 tokens a call (the longest answer is 4 digits and its end, and an episode's five
# calls run one after another, so the sampler's time goes with it); a learning rate of 5e-4 (the
# recipe's 2e-4 moves it too little in so few steps); no episode timeout (at this load the
# sampler took longer than the default 300 s for a step's episodes, which then all failed).
SMOLLM2 = {
    "model.kind": "hf",
    "model.name": "smollm2-135m",
    "model.lora_rank": 16,
    "model.max_batch": 16,
    "env.options": {"wording": "instruct"},
    "sampling.max_tokens": 5,
    "sampling.temperature": 0.7,
    "train.learning_rate": 5e-4,
    "dispatch.group_size": 8,
    "dispatch.groups_per_step": 1,
    "dispatch.episode_timeout": 3600.0,
}
SMOLLM2_SCHEMES = ("exactly_once", "leader_only")

# `--credit`: exactly-once's rows with each credit option for subagents scored by the episode's
# reward (`[algorithm] shared_reward_credit`, `shared_reward_scale`), against the two schemes.
CREDIT_CONDITIONS = {
    "exactly_once": {"rows.scheme": "exactly_once"},
    "leader_only": {"rows.scheme": "leader_only"},
    "shared scale 0": {"algorithm.shared_reward_scale": 0.0},
    "shared scale 0.5": {"algorithm.shared_reward_scale": 0.5},
    # The coefficient at 0 still counts the subagents' tokens in the step's token mean, so the
    # leader's gradient is smaller than under leader_only by their share: on handoff leader-only
    # trains 378 loss tokens a step, exactly-once 627 (schemes.md). This gives the leader
    # leader-only's step size back, to tell the denominator from the credit.
    "shared scale 0, lr x1.66": {
        "algorithm.shared_reward_scale": 0.0,
        "train.learning_rate": 1e-3 * 627 / 378,
    },
    # The same learning rate for the two schemes: does either gain from the larger step alone?
    "exactly_once, lr x1.66": {"train.learning_rate": 1e-3 * 627 / 378},
    "leader_only, lr x1.66": {
        "rows.scheme": "leader_only",
        "train.learning_rate": 1e-3 * 627 / 378,
    },
    # Two more steps of the same ratio: is either scheme's best rate beyond x1.66?
    **{
        f"{scheme}, lr x{(627 / 378) ** power:.2f}": {
            "rows.scheme": scheme,
            "train.learning_rate": 1e-3 * (627 / 378) ** power,
        }
        for power in (2, 3)
        for scheme in ("exactly_once", "leader_only")
    },
    "shared leave_one_out": {"algorithm.shared_reward_credit": "leave_one_out"},
    "shared seat_normalised": {"algorithm.shared_reward_credit": "seat_normalised"},
}


def conditions(env: str) -> list[tuple[str, dict]]:
    found = [(scheme, {"rows.scheme": scheme}) for scheme in SCHEMES]
    if env == "relay":
        found.append(("background: episode reward", {"rows.background_reward": "episode"}))
        found.append(("background: not trained", {"rows.background_reward": "none"}))
    found.append(("compaction not trained", {"rows.train_compaction": False}))
    return found


def run_folder(out: Path, env: str, condition: str, seed: int) -> Path:
    return out / env / condition.replace(" ", "_").replace(":", "") / f"seed_{seed}"


def run_one(job: dict) -> dict:
    from callgrove.orchestrator.config import load_config
    from callgrove.orchestrator.loop import train

    out = Path(job["out"])
    config = load_config(
        CONFIG,
        {
            "run.steps": job["steps"],
            "run.out": str(out),
            "run.seed": job["seed"],
            "run.eval_every": 0,
            "env.name": job["env"],
            "monitor.live": False,
            "monitor.plot": False,
            **ENV_OVERRIDES[job["env"]],
            **job["overrides"],
        },
    )
    started = time.perf_counter()
    summary = train(config)
    lines = [m for m in summary.metrics if REWARD in m]
    seats = []
    for step in range(1, len(lines) + 1):
        scores: dict[str, list[float]] = {}
        with open(out / f"step_{step}" / "train" / "traces.jsonl") as file:
            for line in file:
                episode = json.loads(line)
                for name, value in ((episode.get("meta") or {}).get("seats") or {}).items():
                    scores.setdefault(name, []).append(value)
        seats.append({name: float(np.mean(values)) for name, values in scores.items()})
    return {
        **{k: job[k] for k in ("env", "condition", "seed")},
        "minutes": (time.perf_counter() - started) / 60,
        "reward": [m[REWARD] for m in lines],
        "loss_tokens": [m["train/loss_tokens"] for m in lines],
        "row_tokens": [m["train/row_tokens"] for m in lines],
        "forwarded_tokens": [m["train/forwarded_tokens"] for m in lines],
        "step_s": [m["time/step_s"] for m in lines],
        "seats": seats,
    }


def conditions_run(runs: list[dict], env: str) -> list[str]:
    """The conditions `runs` hold for `env`, in the order they were listed."""
    listed = [name for name, _ in conditions(env)] + list(CREDIT_CONDITIONS)
    found = {r["condition"] for r in runs if r["env"] == env}
    return [name for name in dict.fromkeys(listed) if name in found]


def cost_per_step(run: dict, spent: str) -> np.ndarray:
    """What each step of the run spent of `spent` (`step_s`: seconds, `loss_tokens`: tokens
    trained); the first step's seconds, which also build the model and start the sampler, are
    counted as the median of the others'."""
    cost = np.array(run[spent], dtype=np.float64)
    if spent == "step_s" and len(cost) > 1:
        cost[0] = np.median(cost[1:])
    return cost


def reward_within(run: dict, spent: str, budget: float) -> float:
    """The run's mean episode reward over the last 20% of the steps it took within `budget` of
    `spent`, counted from its first step."""
    cost = np.cumsum(cost_per_step(run, spent))
    within = max(1, int(np.searchsorted(cost, budget * (1 + 1e-9), side="right")))
    return float(np.mean(run["reward"][:within][-max(1, within // 5) :]))


def equal_compute(mine: list[dict], everyone: list[dict], spent: str) -> dict:
    """Each seed's reward within the budget of `spent` the cheapest run of its environment used."""
    budget = min(float(np.sum(cost_per_step(r, spent))) for r in everyone)
    per_seed = [reward_within(r, spent, budget) for r in mine]
    return {"budget": budget, "mean": float(np.mean(per_seed)), "seeds": per_seed}


def summarise(runs: list[dict]) -> list[dict]:
    table = []
    for env in SEATS:
        everyone = [r for r in runs if r["env"] == env]
        for condition in conditions_run(runs, env):
            mine = sorted(
                (r for r in everyone if r["condition"] == condition), key=lambda r: r["seed"]
            )
            fifth = max(1, len(mine[0]["reward"]) // 5)
            last = [float(np.mean(r["reward"][-fifth:])) for r in mine]
            first = [float(np.mean(r["reward"][:fifth])) for r in mine]
            seats = {}
            for column, names in SEATS[env].items():
                per_seed = [
                    float(
                        np.mean(
                            [
                                np.mean([s[n] for n in names if n in s])
                                for s in r["seats"][-fifth:]
                                if any(n in s for n in names)
                            ]
                            or [np.nan]
                        )
                    )
                    for r in mine
                ]
                seats[column] = {"mean": float(np.mean(per_seed)), "seeds": per_seed}
            table.append(
                {
                    "env": env,
                    "condition": condition,
                    "seeds": [r["seed"] for r in mine],
                    "steps": len(mine[0]["reward"]),
                    "reward_last": {"mean": float(np.mean(last)), "seeds": last},
                    "gain": {
                        "mean": float(np.mean(np.subtract(last, first))),
                        "seeds": list(np.subtract(last, first)),
                    },
                    "seats_last": seats,
                    "equal_wall_time": equal_compute(mine, everyone, "step_s"),
                    "equal_loss_tokens": equal_compute(mine, everyone, "loss_tokens"),
                    # The first step also builds the model and starts the sampler: left out.
                    "loss_tokens_per_step": float(
                        np.mean([np.mean(r["loss_tokens"]) for r in mine])
                    ),
                    "row_tokens_per_step": float(np.mean([np.mean(r["row_tokens"]) for r in mine])),
                    "forwarded_tokens_per_step": float(
                        np.mean([np.mean(r["forwarded_tokens"]) for r in mine])
                    ),
                    "step_s": float(np.mean([np.median(r["step_s"][1:]) for r in mine])),
                    "minutes": float(np.sum([r["minutes"] for r in mine])),
                }
            )
    return table


def markdown(table: list[dict]) -> str:
    def spread(values: list[float]) -> str:
        return " / ".join(f"{v:.3f}" for v in values)

    head = (
        "| env | condition | reward, last 20% (mean; per seed) | gain over first 20% (per seed) | "
        + " | ".join(SEAT_COLUMNS)
        + " | loss tokens / step | row tokens / step | forwarded tokens / step | step s (median) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in table:
        seats = [
            "–" if c not in row["seats_last"] else f"{row['seats_last'][c]['mean']:.3f}"
            for c in SEAT_COLUMNS
        ]
        lines.append(
            f"| {row['env']} | {row['condition']} | {row['reward_last']['mean']:.3f} "
            f"({spread(row['reward_last']['seeds'])}) | {spread(row['gain']['seeds'])} | "
            + " | ".join(seats)
            + f" | {row['loss_tokens_per_step']:.0f} | {row['row_tokens_per_step']:.0f} | "
            f"{row['forwarded_tokens_per_step']:.0f} | "
            f"{row['step_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def credit_markdown(table: list[dict]) -> str:
    """Per environment, each condition against leader-only and exactly-once seed by seed, at
    equal steps, equal wall time and equal loss tokens."""

    def spread(values: list[float]) -> str:
        return " / ".join(f"{v:.3f}" for v in values)

    def above(row: dict, other: dict | None, key: str) -> str:
        if other is None or other is row or other["seeds"] != row["seeds"]:
            return "–"
        wins = sum(a > b for a, b in zip(row[key]["seeds"], other[key]["seeds"], strict=True))
        return f"{wins}/{len(row['seeds'])}"

    head = (
        "| env | condition | reward, last 20% (mean; per seed) | seeds above leader_only | "
        "seeds above exactly_once | at equal wall time (mean; per seed) | above leader_only | "
        "at equal loss tokens (mean; per seed) | above leader_only | loss tokens / step | "
        "step s (median) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in table:
        mine = {t["condition"]: t for t in table if t["env"] == row["env"]}
        leader, once = mine.get("leader_only"), mine.get("exactly_once")
        lines.append(
            f"| {row['env']} | {row['condition']} | {row['reward_last']['mean']:.3f} "
            f"({spread(row['reward_last']['seeds'])}) | {above(row, leader, 'reward_last')} | "
            f"{above(row, once, 'reward_last')} | {row['equal_wall_time']['mean']:.3f} "
            f"({spread(row['equal_wall_time']['seeds'])}) | "
            f"{above(row, leader, 'equal_wall_time')} | {row['equal_loss_tokens']['mean']:.3f} "
            f"({spread(row['equal_loss_tokens']['seeds'])}) | "
            f"{above(row, leader, 'equal_loss_tokens')} | {row['loss_tokens_per_step']:.0f} | "
            f"{row['step_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def per_step_markdown(runs: list[dict]) -> str:
    """Every run's episode reward at every step, and its mean over the second half: for a run of
    a few steps, where the last 20% is one step of one group."""
    steps = max(len(r["reward"]) for r in runs)
    head = "| condition | seed | " + " | ".join(f"step {n}" for n in range(1, steps + 1))
    head += " | mean, second half |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for run in sorted(runs, key=lambda r: (r["env"], r["condition"], r["seed"])):
        rewards = run["reward"]
        lines.append(
            f"| {run['condition']} | {run['seed']} | "
            + " | ".join(f"{value:.3f}" for value in rewards)
            + f" | {np.mean(rewards[len(rewards) // 2 :]):.3f} |"
        )
    return "\n".join(lines) + "\n"


def running_mean(values: np.ndarray, window: int) -> np.ndarray:
    return np.convolve(values, np.ones(window) / window, mode="valid")


def line_style(names: list[str], condition: str) -> dict:
    """One colour per condition in every panel (from 20 where the default cycle's 10 would
    repeat); exactly-once thick and black."""
    if condition == "exactly_once":
        return {"lw": 2.4, "color": "black"}
    if len(names) > 10:
        from matplotlib import colormaps

        return {"lw": 1.2, "color": colormaps["tab20"](names.index(condition) % 20)}
    return {"lw": 1.2, "color": f"C{names.index(condition)}"}


# Each environment's six panels as a grid of 2 x 3, read row by row: the episode reward against
# steps, loss tokens and wall time on top; what the steps cost and the seats' scores below.
PANEL_PLACES = {
    "reward": (0, 0),
    "reward against loss tokens": (0, 1),
    "reward against wall time": (0, 2),
    "loss tokens": (1, 0),
    "step time": (1, 1),
    "seats": (1, 2),
}


def plot(runs: list[dict], table: list[dict], path: Path) -> None:
    """Per environment, a block of six panels in two rows of three, its conditions' legend to
    its right: one readable page width, however many environments and conditions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = [env for env in SEATS if any(r["env"] == env for r in runs)]
    figure = plt.figure(figsize=(19, 8.4 * len(envs)), layout="constrained")
    for block, env in zip(figure.subfigures(len(envs), 1, squeeze=False)[:, 0], envs, strict=True):
        grid = block.subplots(2, 3)
        panel = {name: grid[row][column] for name, (row, column) in PANEL_PLACES.items()}
        names = conditions_run(runs, env)
        for condition in names:
            style = line_style(names, condition)
            mine = [r for r in runs if r["env"] == env and r["condition"] == condition]
            if not mine:
                continue
            steps = min(len(r["reward"]) for r in mine)
            x = np.arange(1, steps + 1)
            reward = np.mean([r["reward"][:steps] for r in mine], axis=0)
            window = max(1, steps // 10)
            panel["reward"].plot(
                x[window - 1 :], running_mean(reward, window), label=condition, **style
            )
            panel["loss tokens"].plot(
                x, np.mean([r["loss_tokens"][:steps] for r in mine], axis=0), **style
            )
            seconds = np.mean([r["step_s"][1:steps] for r in mine], axis=0)
            panel["step time"].plot(x[window:], running_mean(seconds, window), **style)
            # Equal compute: the same reward curve against what the steps cost so far.
            smoothed = running_mean(reward, window)
            for name, spent in (
                ("reward against loss tokens", "loss_tokens"),
                ("reward against wall time", "step_s"),
            ):
                cost = np.mean([np.cumsum(cost_per_step(r, spent)[:steps]) for r in mine], axis=0)
                panel[name].plot(cost[window - 1 :], smoothed, **style)
        seats = [c for c in SEAT_COLUMNS if c in SEATS[env]]
        mine = [t for t in table if t["env"] == env]
        width = 0.8 / max(1, len(mine))
        for number, line in enumerate(mine):
            panel["seats"].bar(
                np.arange(len(seats)) + number * width,
                [line["seats_last"][seat]["mean"] for seat in seats],
                width,
                color=line_style(names, line["condition"])["color"],
            )
        panel["seats"].set_xticks(
            np.arange(len(seats)) + 0.4 - width / 2, [s.replace(" ", "\n") for s in seats]
        )
        panel["seats"].set_ylim(0, 1)
        block.suptitle(env, fontsize=16, fontweight="bold")
        for name, title, xlabel in (
            ("reward", "episode reward (mean of seeds, running mean)", "step"),
            (
                "reward against loss tokens",
                "episode reward against loss tokens trained so far",
                "loss tokens",
            ),
            (
                "reward against wall time",
                "episode reward against wall time so far",
                "seconds (sum of step times)",
            ),
            ("loss tokens", "loss tokens trained per step", "step"),
            ("step time", "step time (s, mean of seeds, running mean)", "step"),
            ("seats", "score per seat, last 20% of steps", None),
        ):
            panel[name].set_title(title, fontsize=12)
            if xlabel:
                panel[name].set_xlabel(xlabel)
            panel[name].grid(alpha=0.3)
        handles, labels = panel["reward"].get_legend_handles_labels()
        block.legend(handles, labels, loc="outside right upper", fontsize=10, title="condition")
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", nargs="+", default=list(SEATS), choices=list(SEATS))
    parser.add_argument("--out", type=Path, default=Path("runs/schemes"))
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    parser.add_argument(
        "--tables-only", action="store_true", help="remake the table and plot from OUT/runs.json"
    )
    parser.add_argument(
        "--credit",
        action="store_true",
        help="exactly-once's rows with each credit option for subagents without rewards of "
        "their own, against exactly_once and leader_only: credit.{md,json,png}",
    )
    parser.add_argument(
        "--conditions",
        nargs="+",
        choices=list(dict.fromkeys([*CREDIT_CONDITIONS, *(n for n, _ in conditions("relay"))])),
        help="only these conditions (default: all of the mode's)",
    )
    parser.add_argument(
        "--replot",
        type=Path,
        nargs="+",
        metavar="RESULT.json",
        help="redraw RESULT.png from the runs a stored RESULT.json holds, rerunning nothing",
    )
    parser.add_argument(
        "--smollm2",
        action="store_true",
        help="handoff with SmolLM2-135M (LoRA): leader_only against exactly_once",
    )
    args = parser.parse_args()
    if args.replot:
        for path in args.replot:
            found = json.loads(path.read_text())
            if "runs" not in found:
                parser.error(f"{path} holds no runs: its plot is redrawn only by running again")
            plot(found["runs"], found["table"], path.with_suffix(".png"))
            print(f"wrote {path.with_suffix('.png')}")
        return
    if args.smollm2 and args.out == parser.get_default("out"):
        args.out = Path("runs/schemes_smollm2")
    if args.credit and args.out == parser.get_default("out"):
        args.out = Path("runs/credit")
    if args.tables_only:
        runs = json.loads((args.out / "runs.json").read_text())
        for run in runs:  # runs.json written before it recorded them: read off the run folder
            if "forwarded_tokens" not in run:
                folder = run_folder(args.out, run["env"], run["condition"], run["seed"])
                with open(folder / "metrics.jsonl") as file:
                    lines = [m for m in map(json.loads, file) if REWARD in m]
                run["forwarded_tokens"] = [m["train/forwarded_tokens"] for m in lines]
        write_results(runs, args)
        return
    if args.smollm2:
        # Seed by seed, the two schemes one after the other: with one worker they alternate.
        chosen = [
            ("handoff", scheme, {"rows.scheme": scheme, **SMOLLM2}) for scheme in SMOLLM2_SCHEMES
        ]
    elif args.credit:
        chosen = [
            (env, name, CREDIT_CONDITIONS[name])
            for env in args.envs
            for name in args.conditions or CREDIT_CONDITIONS
        ]
    else:
        chosen = [
            (env, name, overrides)
            for env in args.envs
            for name, overrides in conditions(env)
            if not args.conditions or name in args.conditions
        ]
    jobs = [
        {
            "env": env,
            "condition": condition,
            "overrides": overrides,
            "seed": seed,
            "steps": args.steps,
            "out": str(run_folder(args.out, env, condition, seed)),
        }
        for seed in args.seeds
        for env, condition, overrides in chosen
    ]
    started = time.perf_counter()
    runs = []
    args.out.mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        for result in pool.imap_unordered(run_one, jobs):
            runs.append(result)
            print(
                f"[{(time.perf_counter() - started) / 60:5.1f} min] {result['env']} "
                f"{result['condition']} seed {result['seed']}: reward last 20% "
                f"{np.mean(result['reward'][-max(1, len(result['reward']) // 5) :]):.3f}",
                flush=True,
            )
            (args.out / "runs.json").write_text(json.dumps(runs))  # what finished, so far
    write_results(runs, args)
    print(f"{(time.perf_counter() - started) / 60:.1f} minutes in all")


def write_results(runs: list[dict], args: argparse.Namespace) -> None:
    table = summarise(runs)
    args.results.mkdir(parents=True, exist_ok=True)
    steps = sorted({len(r["reward"]) for r in runs})
    seeds = sorted({r["seed"] for r in runs})
    stem = "schemes_smollm2" if args.smollm2 else "credit" if args.credit else "schemes"
    found = {"steps": steps, "seeds": seeds, "table": table}
    if args.smollm2:  # what differs from examples/train.toml
        found["settings"] = SMOLLM2
    if args.credit:
        named = {name: overrides for env in SEATS for name, overrides in conditions(env)}
        named |= CREDIT_CONDITIONS
        run = {r["condition"] for r in runs}
        found["conditions"] = {n: o for n, o in named.items() if n in run}
    # Every step of every run, so that the plot can be redrawn (`--replot`) without a rerun.
    found["runs"] = runs
    (args.results / f"{stem}.json").write_text(json.dumps(found, indent=1))
    text = markdown(table)
    if args.credit:
        text = f"{credit_markdown(table)}\n{text}"
    if args.credit and not args.tables_only:  # remade tables may join several runs' commands
        made_by = (
            f"`nice -n 19 python benchmarks/schemes.py --credit --envs {' '.join(args.envs)} "
            f"--steps {max(steps)} --seeds {' '.join(map(str, seeds))} --workers "
            f"{args.workers}`; every step of every run in {stem}.json"
        )
        text = f"{made_by}\n\n{text}"
    if args.smollm2:
        made_by = (
            f"`nice -n 10 python benchmarks/schemes.py --smollm2 --steps {max(steps)} --seeds "
            f"{' '.join(map(str, seeds))} --workers 1`"
        )
        text = f"{made_by}; settings in {stem}.json\n\n{text}\n{per_step_markdown(runs)}"
    (args.results / f"{stem}.md").write_text(text)
    plot(runs, table, args.results / f"{stem}.png")
    print(text)


if __name__ == "__main__":
    main()
