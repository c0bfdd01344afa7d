"""Raw vLLM decoding speed under the flags callgrove starts servers with, one variant at a time.

    python benchmarks/vllm_flags.py [--variants eager+lora,eager,graph] [--max-tokens 64]
        [--json out.json]

Each variant is a server started by `VllmServer.start` (so with callgrove's own flags:
processed logprobs, scale-out) of the packaged SmolLM2-135M-Instruct, float32: `eager` adds
`--enforce-eager` (callgrove's default), `graph` leaves vLLM's torch.compile warm-up on, `+lora`
adds `--enable-lora` at rank 16 (what a LoRA run starts). Against each, batches of 1 and 8
`/v1/completions` calls (a 40-token token-id prompt, `--max-tokens` new tokens, no stop at
EOS, T = 0.7, top-p 0.9) with and without `logprobs`, after one warm-up call: completion tokens
per second of wall time, and how long the server took to be ready. This isolates the server
from callgrove's sampler and loop; the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import httpx

from callgrove.networks.hf import checkpoint_folder, resolve_model
from callgrove.policy.vllm import VllmServer, VllmSettings

VARIANTS = {
    "eager+lora": (True, 16),
    "eager": (True, 0),
    "graph": (False, 0),
    "graph+lora": (False, 16),
}
PROMPT = list(range(100, 140))


async def completion(client: httpx.AsyncClient, url: str, max_tokens: int, logprobs: bool) -> int:
    body = {
        "model": VllmSettings().served_model,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "top_p": 0.9,
        "ignore_eos": True,
        "return_token_ids": True,
        **({"logprobs": 1} if logprobs else {}),
    }
    response = await client.post(f"{url}/v1/completions", json=body, timeout=600)
    response.raise_for_status()
    return len(response.json()["choices"][0]["token_ids"])


async def tokens_per_second(url: str, batch: int, max_tokens: int, logprobs: bool) -> float:
    async with httpx.AsyncClient() as client:
        await completion(client, url, max_tokens, logprobs)
        start = time.monotonic()
        tokens = 0
        for _ in range(2):
            calls = [completion(client, url, max_tokens, logprobs) for _ in range(batch)]
            tokens += sum(await asyncio.gather(*calls))
        return tokens / (time.monotonic() - start)


def measure(name: str, max_tokens: int, python: str) -> dict:
    eager, lora_rank = VARIANTS[name]
    settings = VllmSettings(python=python, eager=eager)
    folder = checkpoint_folder(resolve_model("smollm2-135m"))
    started = time.monotonic()
    server = VllmServer.start(folder, settings, lora_rank=lora_rank)
    try:
        server.wait_ready(settings.startup_timeout)
        row = {"variant": name, "ready_s": round(time.monotonic() - started, 1)}
        for batch in (1, 8):
            for logprobs in (False, True):
                rate = asyncio.run(tokens_per_second(server.url, batch, max_tokens, logprobs))
                row[f"batch{batch}{'_logprobs' if logprobs else ''}_tok_s"] = round(rate, 1)
        row["load_average"] = [round(x, 2) for x in os.getloadavg()]
        return row
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="eager+lora,eager,graph")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--vllm-python", default=VllmSettings().python)
    parser.add_argument("--json", help="Also write the rows to this file")
    args = parser.parse_args()
    rows = []
    for name in args.variants.split(","):
        if name not in VARIANTS:
            parser.error(f"--variants: {name!r} is not one of {', '.join(VARIANTS)}")
        rows.append(measure(name, args.max_tokens, args.vllm_python))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
