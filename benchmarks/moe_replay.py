"""Rollout routing replay on the built-in mixture of experts (`tiny-moe`): the learner's mismatch
against its sampler with and without replaying the sampler's routes, and RL reward curves with
and without it; the routes' bytes per token.

    PYTHONPATH=src .venv/bin/python benchmarks/moe_replay.py               # the mismatch table
    PYTHONPATH=src .venv/bin/python benchmarks/moe_replay.py --curves      # + 2 x seeds RL runs

1. Mismatch: episodes with a fork, a background agent and a compaction sampled by one copy of
   `tiny-moe` (`callgrove.bench.moe.sampled_episode`, `--episodes` of them), scored by a learner
   on another copy before its update: the mean and largest |learner - sampler| log-probability
   over the trained tokens, and the share of token-layers whose learner top-k is not the
   recorded one. Three samplers: the learner's exact twin (float64); the twin routing near ties
   either way, as engines' fused kernels may (`noisy_routers`); and the model in bfloat16 with
   the learner in float32 (another precision). At T = 1 and T = 0.7.
2. Curves (`--curves`): `callgrove train` on `relay` with `[model] name = "tiny-moe"` for
   `--steps` steps, `--seeds` seeds, `[train] route_replay` true and false; each run's mean
   episode reward over its last 20 steps, and its mismatch.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from callgrove.bench.moe import learner_mismatch, noisy_routers, sampled_episode
from callgrove.episode import Stats
from callgrove.networks.hf import load_model
from callgrove.train.settings import LearnerSettings

ROOT = Path(__file__).resolve().parents[1]
NEAR_TIE = 0.01


def samplers(model: torch.nn.Module):
    """(name, the sampler's model, the learner's dtype) of each scenario."""
    twin = copy.deepcopy(model)
    noisy = copy.deepcopy(model)
    noisy_routers(noisy, NEAR_TIE)
    low = copy.deepcopy(model).to(torch.bfloat16)
    return [
        ("exact twin, float64", twin, torch.float64),
        (f"near ties either way ({NEAR_TIE}), float64", noisy, torch.float64),
        ("sampler bfloat16, learner float32", low, torch.float32),
    ]


def mismatch_table(episodes: int) -> tuple[list[dict], float]:
    model, tokenizer = load_model("tiny-moe", torch.float64)
    rows, stats = [], Stats()
    for name, sampler, dtype in samplers(model):
        learner_model = copy.deepcopy(model).to(dtype)
        for temperature in (1.0, 0.7):
            sampled = [
                sampled_episode(sampler, tokenizer, temperature, seed) for seed in range(episodes)
            ]
            for episode in sampled:
                stats.add(episode)
            for replay in (True, False):
                found = learner_mismatch(
                    learner_model, sampled, LearnerSettings(route_replay=replay)
                )
                rows.append(
                    {
                        "sampler": name,
                        "temperature": temperature,
                        "replay": replay,
                        "mean_abs": found["all/mean_abs"],
                        "max_abs": found["all/max_abs"],
                        "topk_differs": found["routes/topk_differs"],
                    }
                )
    return rows, stats.route_bytes_per_token


def curves(steps: int, seeds: int, folder: Path) -> list[dict]:
    """One `callgrove train` run per seed and setting; what each ended with."""
    config = (ROOT / "examples" / "train.toml").read_text()
    runs = []
    for seed in range(seeds):
        for replay in (True, False):
            out = folder / f"seed{seed}-{'replay' if replay else 'own'}"
            command = [
                str(Path(sys.executable).with_name("callgrove")), "train", str(folder / "moe.toml"),
                "--steps", str(steps), "--seed", str(seed), "-o", str(out),
                "--set", f"train.route_replay={'true' if replay else 'false'}",
            ]  # fmt: skip
            (folder / "moe.toml").write_text(_moe_config(config))
            subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            runs.append({"seed": seed, "replay": replay, **_ending(out / "metrics.jsonl")})
    return runs


def _moe_config(config: str) -> str:
    """examples/train.toml with `[model]` the built-in mixture of experts."""
    head, rest = config.split("[model]", 1)
    _, tail = rest.split("\n\n", 1)
    return f'{head}[model]\nkind = "hf"\nname = "tiny-moe"\n\n{tail}'


def _ending(metrics: Path) -> dict:
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [m for m in lines if "train/all/episode/reward/mean" in m]
    last = steps[-20:]
    return {
        "reward_last20": float(np.mean([m["train/all/episode/reward/mean"] for m in last])),
        "mismatch_mean_abs": float(
            np.mean([m.get("train/mismatch/all/mean_abs", np.nan) for m in last])
        ),
        "topk_differs": float(np.mean([m.get("train/routes/topk_differs", np.nan) for m in last])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--curves", action="store_true")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("-o", "--out", type=Path, help="write every figure here (.json)")
    args = parser.parse_args()
    os.environ.setdefault("CALLGROVE_CACHE", tempfile.mkdtemp(prefix="callgrove-moe-"))
    rows, route_bytes = mismatch_table(args.episodes)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| sampler | T | replay | mean abs | max abs | learner top-k differs |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['sampler']} | {row['temperature']:g} | {'yes' if row['replay'] else 'no'} | "
            f"{row['mean_abs']:.2e} | {row['max_abs']:.2e} | {row['topk_differs']:.3f} |"
        )
    print(f"\nroutes stored: {route_bytes:.1f} bytes per token (int16, 2 layers x top-2)")
    figures: dict = {"mismatch": rows, "route_bytes_per_token": route_bytes}
    if args.curves:
        with tempfile.TemporaryDirectory(prefix="callgrove-moe-runs-") as folder:
            figures["curves"] = curves(args.steps, args.seeds, Path(folder))
        print("\n| seed | replay | reward, last 20 steps | mismatch mean abs | top-k differs |")
        print("|---|---|---|---|---|")
        for run in figures["curves"]:
            print(
                f"| {run['seed']} | {'yes' if run['replay'] else 'no'} | "
                f"{run['reward_last20']:.3f} | {run['mismatch_mean_abs']:.2e} | "
                f"{run['topk_differs']:.3f} |"
            )
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
