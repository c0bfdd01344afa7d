"""The SmolLM2 RL recipe of docs/results.md sampled by vLLM and by the Hugging Face sampler,
for the same wall time, seed by seed in one script run.

    python benchmarks/vllm_rl.py [--minutes 8] [--seeds 0 1 2] [--out runs/vllm_rl]
        [--vllm-python .venv-vllm/bin/python] [--json R.json] [--markdown R.md]

Each run is `callgrove train examples/smollm2_arithmetic.toml` (`arithmetic`, SmolLM2-135M-Instruct
with LoRA r=16, GRPO, 2 groups of 8 per step, 12 tokens at T = 0.7, learning rate 2e-4), stopped after
`--minutes` of wall time from its start (a started vLLM server's start-up counts: a user waits
for it too). The two samplers alternate within each seed, and which goes first alternates
across seeds, so the machine's load drifts over both. Reported per run: steps done, the mean
episode reward of the first and last quarter of its steps, the median step time and its
sampling share, the median weight push, and the largest learner-sampler logprob mismatch at
step 1 (before any update: how exactly the learner scores what the sampler drew).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from callgrove.orchestrator.sinks import read_metrics

ROOT = Path(__file__).resolve().parents[1]
REWARD = "train/all/episode/reward/mean"
MISMATCH = "train/mismatch/on_policy/max_abs"
RECIPE = ROOT / "examples" / "smollm2_arithmetic.toml"


def command(sampler: str, seed: int, out: Path, vllm_python: str) -> list[str]:
    train = [sys.executable, "-c", "from callgrove.cli import main; main()", "train", str(RECIPE)]
    train += ["--seed", str(seed), "--out", str(out), "--quiet", "--set", "run.steps=1000"]
    if sampler == "vllm":
        vllm = f'model.vllm={{servers=1, python="{vllm_python}", kv_cache_gb=2}}'
        train += ["--set", vllm]
    return train


def run_for(argv: list[str], minutes: float, log: Path) -> float:
    """Run `argv` until `minutes` pass (then end it); its wall seconds. A run that ends
    before then failed (the recipe asks for more steps than fit): its log's tail is the error."""
    started = time.monotonic()
    with log.open("w") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            code = process.wait(timeout=minutes * 60)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # its vLLM server goes with it
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        else:
            sys.exit(f"{log}: the run ended early (exit {code}):\n{log.read_text()[-3000:]}")
    return time.monotonic() - started


def summary(out: Path, sampler: str, seed: int, wall: float) -> dict:
    steps = [m for m in read_metrics(out) if REWARD in m]
    rewards = np.array([m[REWARD] for m in steps])
    quarter = max(len(rewards) // 4, 1)
    step_times = [m["time/step_s"] for m in steps]
    sampling = [m.get("time/sampling_s", 0.0) for m in steps]
    pushes = [m["time/weight_push_s"] for m in steps if "time/weight_push_s" in m]
    return {
        "sampler": sampler,
        "seed": seed,
        "wall_s": round(wall, 1),
        "steps": len(steps),
        "reward_first_quarter": float(rewards[:quarter].mean()) if len(steps) else None,
        "reward_last_quarter": float(rewards[-quarter:].mean()) if len(steps) else None,
        "step_s_median": statistics.median(step_times) if steps else None,
        "sampling_share": sum(sampling) / sum(step_times) if steps else None,
        "weight_push_s_median": statistics.median(pushes) if pushes else None,
        "mismatch_step_1": steps[0].get(MISMATCH) if steps else None,
    }


def markdown(rows: list[dict], minutes: float, load: tuple[float, ...]) -> str:
    def number(value, digits):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        f"{minutes:g} minutes of wall time per run; load average at the end "
        + " / ".join(f"{x:.1f}" for x in load),
        "",
        "| sampler | seed | steps | reward, first quarter | last quarter | step (median) "
        "| sampling share | weight push | mismatch at step 1 (max) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['sampler']} | {r['seed']} | {r['steps']} "
            f"| {number(r['reward_first_quarter'], 3)} | {number(r['reward_last_quarter'], 3)} "
            f"| {number(r['step_s_median'], 1)} s | {number(r['sampling_share'], 2)} "
            f"| {number(r['weight_push_s_median'], 2)} s | {number(r['mismatch_step_1'], 6)} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "vllm_rl")
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    rows = []
    for index, seed in enumerate(args.seeds):
        order = ("vllm", "hf") if index % 2 == 0 else ("hf", "vllm")
        for sampler in order:
            out = args.out / f"{sampler}_{seed}"
            out.mkdir(parents=True, exist_ok=True)
            argv = command(sampler, seed, out, args.vllm_python)
            wall = run_for(argv, args.minutes, out / "stdout.log")
            rows.append(summary(out, sampler, seed, wall))
            print(json.dumps(rows[-1]), flush=True)
    table = markdown(rows, args.minutes, os.getloadavg())
    print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(table)


if __name__ == "__main__":
    main()
