"""Does the loop learn? RL from scratch on the multi-agent `relay` environment, several seeds.

For each seed: a fresh reference decoder (no supervised warm-up) trained with the settings of
`examples/train.toml` (hierarchical GRPO with an entropy bonus, on `relay`: background
checker, two fresh helpers, a fork, a compaction), for `--steps` steps. Prints, per seed, the
minutes it took, the mean episode reward over the first and the last 20% of the steps, the
sampling surprisal (mean negative logprob per sampled token: it falls towards 0 when the
policy collapses onto one answer) at the end, and the mean forwarded-token ratio of the
tree-packed steps; writes the reward curves of every seed to one PNG and the figures to a JSON
file. `--set section.key=value` overrides any setting.

    nice -n 10 python benchmarks/learning.py [--seeds 0 1 2] [--steps 200] [--out runs/learning]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from callgrove.orchestrator.config import load_config
from callgrove.orchestrator.loop import train

REWARD = "train/all/episode/reward/mean"
CONFIG = Path(__file__).resolve().parent.parent / "examples" / "train.toml"
SEATS = ("leader", "helper", "fork", "checker")


def run_seed(seed: int, steps: int, out: Path, overrides: dict) -> dict:
    config = load_config(
        CONFIG,
        {
            "run.steps": steps,
            "run.out": str(out / f"seed_{seed}"),
            "run.seed": seed,
            "run.eval_every": 0,
            "monitor.live": False,
            "monitor.plot": False,
            **overrides,
        },
    )
    started = time.perf_counter()
    summary = train(config)
    minutes = (time.perf_counter() - started) / 60
    lines = [m for m in summary.metrics if REWARD in m]
    rewards = np.array([m[REWARD] for m in lines])
    fifth = max(1, len(rewards) // 5)
    ratios = [m["train/forwarded_token_ratio"] for m in lines]
    surprisal = [
        np.mean([m[k] for seat in SEATS if (k := f"train/all/{seat}/surprisal/mean") in m])
        for m in lines[-fifth:]
    ]
    return {
        "seed": seed,
        "steps": len(rewards),
        "minutes": round(minutes, 2),
        "first_20pct": round(float(rewards[:fifth].mean()), 4),
        "last_20pct": round(float(rewards[-fifth:].mean()), 4),
        "gain": round(float(rewards[-fifth:].mean() - rewards[:fifth].mean()), 4),
        "final_surprisal": round(float(np.mean(surprisal)), 3),
        "forwarded_token_ratio": round(float(np.mean(ratios)), 3),
        "rewards": [round(float(r), 4) for r in rewards],
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for result in results:
        rewards = np.array(result["rewards"])
        window = 5
        smooth = np.convolve(
            np.pad(rewards, (window - 1, 0), mode="edge"), np.ones(window) / window, "valid"
        )
        axis.plot(np.arange(1, len(rewards) + 1), smooth, label=f"seed {result['seed']}")
    axis.set_xlabel("step")
    axis.set_ylabel("mean episode reward (5-step mean)")
    axis.set_title("relay: RL from scratch (hierarchical GRPO, entropy bonus, tree-packed)")
    axis.set_ylim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("runs/learning"))
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--set", action="append", default=[], help="section.key=value")
    args = parser.parse_args()
    from callgrove.orchestrator.config import parse_override

    overrides = dict(parse_override(text) for text in args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in args.seeds:
        result = run_seed(seed, args.steps, args.out, overrides)
        results.append(result)
        print(
            f"seed {seed}: {result['steps']} steps in {result['minutes']:.1f} min · reward first 20% "
            f"{result['first_20pct']:.3f} → last 20% {result['last_20pct']:.3f} "
            f"(gain {result['gain']:+.3f}) · surprisal at the end {result['final_surprisal']:.2f} "
            f"· forwarded-token ratio {result['forwarded_token_ratio']:.2f}",
            flush=True,
        )
    png = args.png or args.out / "learning.png"
    plot(results, png)
    (args.out / "learning.json").write_text(json.dumps(results, indent=1))
    gains = [r["gain"] for r in results]
    print(f"gain over seeds: min {min(gains):+.3f}, mean {np.mean(gains):+.3f} · curves: {png}")


if __name__ == "__main__":
    main()
