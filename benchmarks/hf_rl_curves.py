"""Reward curves of RL runs (one per seed): the first and last quarter's mean episode reward of
each run, and one figure with every run.

    python benchmarks/hf_rl_curves.py RUN_DIR [RUN_DIR ...] [--plot docs/hf_rl.png]

A run directory is a `callgrove train` output (its `metrics.jsonl`). Exits 1 unless every run's
last quarter is above its first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from callgrove.orchestrator.sinks import read_metrics

REWARD = "train/all/episode/reward/mean"


def rewards(run: Path) -> np.ndarray:
    return np.array([m[REWARD] for m in read_metrics(run) if REWARD in m])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--plot", type=Path, help="write the curves as a PNG")
    args = parser.parse_args()
    curves = {run: rewards(run) for run in args.runs}
    climbed = True
    for run, curve in curves.items():
        quarter = max(len(curve) // 4, 1)
        first, last = curve[:quarter].mean(), curve[-quarter:].mean()
        climbed &= bool(last > first)
        print(
            f"{run}: {len(curve)} steps, mean episode reward first quarter {first:.3f}, "
            f"last quarter {last:.3f} ({'up' if last > first else 'NOT up'})"
        )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(7, 3.5))
        for run, curve in curves.items():
            steps = np.arange(1, len(curve) + 1)
            smooth = np.convolve(curve, np.ones(5) / 5, mode="valid")
            (line,) = axes.plot(steps, curve, alpha=0.25)
            axes.plot(steps[4:], smooth, color=line.get_color(), label=run.name)
        axes.set_xlabel("step")
        axes.set_ylabel("mean episode reward")
        axes.legend(fontsize=8)
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(args.plot, dpi=90)
        print(f"figure: {args.plot}")
    sys.exit(0 if climbed else 1)


if __name__ == "__main__":
    main()
