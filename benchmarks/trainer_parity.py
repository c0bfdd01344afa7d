"""Each trainer's own loss on callgrove's samples against the plain-torch reference loss.

    python benchmarks/trainer_parity.py [--trainers TRL verl ...] [--no-processes]
        [--json FILE] [--markdown FILE]

For every trainer the adapters hand samples to, and every case (the bundled `login` group and a
`synthetic` group with forks, forks of forks, background agents, twins and compaction; sampled
at T = 0.7 and 1.0, and for the trainers that score each token at its own temperature, calls
alternating 0.6 / 1.0), the samples are stale (sampling logprobs near, not at, the model's own,
so ratios clip) and the trainer's own code computes the loss and its gradient on a float64
tiny Llama. Printed: per trainer, the largest relative loss difference and the largest
relative gradient difference over its cases (a parameter's |g - g_ref| over the larger of
|g_ref| and the whole gradient's norm), and TRL's two-process update against one process's
over the same global batch. The cases are the ones tests/interop/ asserts on: this script
imports their `measure` functions, so the table is what the tests check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SOURCES = ("login", "synthetic")
TEMPERATURES = (0.7, 1.0)
ALTERNATING = (0.6, 1.0)


def cases() -> dict[str, dict[str, Callable[[], object]]]:
    """Per trainer, per case name, a function measuring its `Agreement` (imported lazily, each
    trainer's test module with its trainer)."""
    from interop import test_nemo_rl, test_openrlhf, test_prime_rl, test_trl, test_verl

    out: dict[str, dict[str, Callable[[], object]]] = {}
    for source in SOURCES:
        for temperature in TEMPERATURES:
            case = f"{source}, T={temperature:g}"
            for loss_type in ("dapo", "bnpo", "grpo"):
                out.setdefault(f"TRL ({loss_type})", {})[case] = (
                    lambda s=source, t=temperature, k=loss_type: test_trl.measure(s, t, k)
                )
            out.setdefault("verl", {})[case] = lambda s=source, t=temperature: test_verl.measure(
                s, t
            )
            out.setdefault("NeMo RL", {})[case] = lambda s=source, t=temperature: (
                test_nemo_rl.measure_nemo_rl(s, t)
            )
            out.setdefault("OpenRLHF", {})[case] = lambda s=source, t=temperature: (
                test_openrlhf.measure(s, t)
            )
        for temperature in (*TEMPERATURES, ALTERNATING):
            shown = (
                "/".join(f"{t:g}" for t in temperature)
                if isinstance(temperature, tuple)
                else (f"{temperature:g}")
            )
            out.setdefault("prime-rl", {})[f"{source}, T={shown}"] = (
                lambda s=source, t=temperature: test_prime_rl.measure_prime_rl(s, t)
            )
    return out


def measure(chosen: list[str] | None) -> list[dict]:
    table = []
    for trainer, by_case in cases().items():
        if chosen and not any(trainer.startswith(name) for name in chosen):
            continue
        started = time.perf_counter()
        figures = {case: run() for case, run in by_case.items()}
        table.append(
            {
                "trainer": trainer,
                "cases": len(figures),
                "loss": max(f.loss for f in figures.values()),
                "gradient": max(f.gradient for f in figures.values()),
                "seconds": time.perf_counter() - started,
                "by_case": {
                    c: {"loss": f.loss, "gradient": f.gradient} for c, f in figures.items()
                },
            }
        )
        print(f"{trainer}: done in {table[-1]['seconds']:.0f} s", file=sys.stderr)
    return table


def two_processes() -> dict:
    from interop.test_trl_processes import measure_processes

    started = time.perf_counter()
    difference = measure_processes()
    return {"trl_two_processes_update": difference, "seconds": time.perf_counter() - started}


def markdown(table: list[dict], processes: dict | None) -> str:
    lines = [
        "| trainer | cases | largest loss difference | largest gradient difference |",
        "|---|---|---|---|",
    ]
    for row in table:
        lines.append(
            f"| {row['trainer']} | {row['cases']} | {row['loss']:.1e} | {row['gradient']:.1e} |"
        )
    if processes is not None:
        lines.append(
            f"| TRL on 2 processes (update vs 1 process) | 1 | | "
            f"{processes['trl_two_processes_update']:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", nargs="*", help="Only these (TRL, verl, prime-rl, ...).")
    parser.add_argument("--no-processes", action="store_true", help="Skip TRL on 2 processes.")
    parser.add_argument("--json", type=Path, help="Write the figures as JSON here.")
    parser.add_argument("--markdown", type=Path, help="Write the table as Markdown here.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = measure(args.trainers)
    wants_trl = not args.trainers or "TRL" in args.trainers
    processes = None if args.no_processes or not wants_trl else two_processes()
    text = markdown(table, processes)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps({"trainers": table, "processes": processes}, indent=1))


if __name__ == "__main__":
    main()
