"""vLLM against the Hugging Face sampler on the same SmolLM2 environment, in one run.

    python benchmarks/vllm_bench.py [--vllm-python .venv-vllm/bin/python | --url URL]
        [--episodes 16] [--max-tokens 64] [--updates 3] [--json out.json]

The `arithmetic` environment's episodes (one chat call each, SmolLM2-135M-Instruct, float32)
are run through each sampler (`callgrove.orchestrator.run_episode`, as the loop runs them) at
batch 1 (one episode at a time) and batch 8 (eight at once, which both samplers decode
together), the two samplers alternating per batch size so the machine's load drifts over both.
For each: calls and completion tokens per second of wall time and per CPU-second (this
process's, plus the vLLM server's whole process tree for vLLM). Then the weight-update time:
the full weights pushed into the server `--updates` times (written, paused, reloaded, resumed)
and a LoRA r=16 adapter loaded as many times, beside the Hugging Face sampler's in-process copy.

Both run on what the machine gives them: the server binds one core by default (vLLM's CPU
build); torch in this process gets `--threads`. Run it under `nice` on a shared machine; the
load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from callgrove.chat import JinjaFormat
from callgrove.episode import Episode
from callgrove.networks.hf import checkpoint_folder, load_model, resolve_model
from callgrove.networks.sizes import LoraSettings
from callgrove.orchestrator import run_episode
from callgrove.orchestrator.envs import make_env
from callgrove.policy import SamplingParams
from callgrove.policy.hf import HFSampler
from callgrove.policy.vllm import VllmSampler, VllmServer, VllmSettings
from callgrove.train.hf_trainer import HFLearner, HFOptions

ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        for one in [process, *process.children(recursive=True)]:
            try:
                times = one.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
    return total


async def run_wave(env, tasks, sampler, chat, params) -> list[Episode]:
    episodes = [Episode(id=f"bench-{i}", group="bench") for i in range(len(tasks))]
    return await asyncio.gather(
        *(
            run_episode(env, task, sampler, chat, params, episode)
            for task, episode in zip(tasks, episodes, strict=True)
        )
    )


async def measure(env, tasks, sampler, chat, params, batch, watched) -> dict[str, float]:
    calls = tokens = 0
    cpu_before = cpu_seconds(watched)
    started = time.perf_counter()
    for first in range(0, len(tasks), batch):
        for episode in await run_wave(env, tasks[first : first + batch], sampler, chat, params):
            if not episode.ok:
                raise RuntimeError(f"episode failed: {episode.errors}")
            for call in episode.calls():
                calls += 1
                tokens += len(call.completion_ids)
    wall = time.perf_counter() - started
    cpu = cpu_seconds(watched) - cpu_before
    return {
        "calls": calls,
        "tokens": tokens,
        "wall_s": wall,
        "cpu_s": cpu,
        "calls_per_s": calls / wall,
        "tokens_per_s": tokens / wall,
        "calls_per_cpu_s": calls / cpu,
        "tokens_per_cpu_s": tokens / cpu,
    }


async def timed_updates(sampler, weights, count: int) -> list[float]:
    seconds = []
    for version in range(1, count + 1):
        started = time.perf_counter()
        await sampler.load_weights(weights, sampler.version + 1)
        seconds.append(time.perf_counter() - started)
        del version
    return seconds


async def bench(args) -> dict:
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2-135m")
    folder = checkpoint_folder(resolve_model("smollm2-135m"))
    chat = JinjaFormat.from_tokenizer(tokenizer)
    env = make_env("arithmetic")
    rng = np.random.default_rng(0)
    tasks = [env.task(rng) for _ in range(args.episodes)]
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=1.0, stop_token_ids=chat.stop_token_ids
    )
    me = psutil.Process()
    server = None
    if args.url:
        url, watched_server = args.url, []
    else:
        settings = VllmSettings(python=args.vllm_python, max_model_len=2048)
        started = time.perf_counter()
        server = VllmServer.start(folder, settings, lora_rank=16)
        server.wait_ready(settings.startup_timeout)
        print(f"vLLM ready in {time.perf_counter() - started:.0f} s", flush=True)
        url, watched_server = server.url, [psutil.Process(server.process.pid)]
    hf = HFSampler(copy.deepcopy(model), tokenizer, seed=0, max_batch=8)
    vllm = VllmSampler([url], base_folder=folder, seed=0)
    results: dict = {"sampling": {}, "updates": {}}
    try:
        await run_wave(env, tasks[:2], vllm, chat, params)  # warm both
        await run_wave(env, tasks[:2], hf, chat, params)
        for batch in (1, 8):
            for name, sampler, watched in (
                ("vllm", vllm, [me, *watched_server]),
                ("hf", hf, [me]),
            ):
                figures = await measure(env, tasks, sampler, chat, params, batch, watched)
                results["sampling"][f"{name}/batch{batch}"] = figures
                print(
                    f"{name:4} batch {batch}: {figures['calls']} calls, {figures['tokens']} "
                    f"tokens in {figures['wall_s']:.1f} s: {figures['tokens_per_s']:.1f} tok/s, "
                    f"{figures['tokens_per_cpu_s']:.1f} tok/CPU-s",
                    flush=True,
                )
        full = {n: p.detach().clone() for n, p in model.named_parameters()}
        results["updates"]["vllm/full_s"] = await timed_updates(vllm, full, args.updates)
        results["updates"]["hf/full_s"] = await timed_updates(hf, full, args.updates)
        learner = HFLearner(copy.deepcopy(model), options=HFOptions(lora=LoraSettings(rank=16)))
        lora = VllmSampler([url], base_folder=folder, lora=LoraSettings(rank=16))
        try:
            results["updates"]["vllm/lora_s"] = await timed_updates(
                lora, learner.weights(), args.updates
            )
        finally:
            await lora.aclose()
        for key, values in results["updates"].items():
            print(f"update {key}: median {statistics.median(values):.3f} s of {values}")
    finally:
        await vllm.aclose()
        if server is not None:
            server.stop()
    results["load_average"] = os.getloadavg()
    results["threads"] = args.threads
    ratio = (
        results["sampling"]["vllm/batch8"]["tokens_per_s"]
        / results["sampling"]["hf/batch8"]["tokens_per_s"]
    )
    results["vllm_over_hf_batch8_tokens_per_s"] = ratio
    print(f"vLLM / HF tokens per second at batch 8: {ratio:.2f}; load {os.getloadavg()}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--url", default="", help="a running server (started with --enable-lora)")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = asyncio.run(bench(args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
