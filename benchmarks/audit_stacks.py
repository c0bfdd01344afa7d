"""Every stack's rows on the hard cases, refereed by `callgrove audit`, and the audit's speed.

    PYTHONPATH=src .venv/bin/python benchmarks/audit_stacks.py [--write docs/audit.md]

1. The table: for each stack (`callgrove.audit.stacks.STACKS`) and each hard case
   (`callgrove.synth.cases.HARD_CASES`), the sampled tokens to train and how many its rows train
   0 / 1 / 2+ times, in a wrong context, the trained tokens no policy sampled, the trained tokens
   of calls the capture says not to train (a rejected compaction attempt), and the tokens
   forwarded per sampled token. `--write` puts it into the file between its table markers.
2. The speed: the bundled harness groups (tests/data/harness_groups, 16 Claude Code and 16
   Codex episodes) and a synthetic capture with forks, twins, background agents and
   compactions, callgrove's samples audited; the best of `--repeat` runs, in sampled tokens
   per second, with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from callgrove.audit import AuditReport, audit
from callgrove.audit.batches import sample_rows
from callgrove.audit.stacks import STACKS
from callgrove.batch import build_samples
from callgrove.credit import GRPO, finalize_group
from callgrove.rows import build_rows
from callgrove.synth import Shape, synth_episodes
from callgrove.synth.cases import HARD_CASES

sys.path.insert(0, str(Path(__file__).parent))
from tree_scope_bench import DATA, read_groups

BEGIN, END = "<!-- audit table: begin -->", "<!-- audit table: end -->"
COLUMNS = (
    "stack", "case", "sampled", "0", "1", "2+", "wrong context", "unsampled trained",
    "not-to-train trained", "forwarded / sampled",
)  # fmt: skip


def table() -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for stack in STACKS.values():
        for case, make in HARD_CASES.items():
            episode = make(0)
            report = audit([episode], stack.rows(episode))
            lines.append(_line(stack.name, case, report))
    return "\n".join(lines)


def _line(stack: str, case: str, report: AuditReport) -> str:
    untrained = f"{report.untrained}"
    if report.twin_untrained:
        untrained += f" ({report.twin_untrained} twin)"
    cells = (
        stack, case, report.sampled_tokens, untrained, report.once, report.twice_or_more,
        report.wrong_context, report.unsampled_tokens, report.trained_not_to_train,
        f"{report.forwarded_per_sampled:.2f}",
    )  # fmt: skip
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def speed(name: str, episodes, repeat: int) -> str:
    rows = sample_rows(build_samples([build_rows(episode) for episode in episodes]))
    best, report = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        report = audit(episodes, rows)
        best = min(best, time.perf_counter() - started)
    assert report is not None and report.exact
    return (
        f"| {name} | {len(episodes)} | {report.sampled_tokens:,} | {report.row_tokens:,} | "
        f"{best * 1e3:.1f} | {report.sampled_tokens / best:,.0f} |"
    )


def synthetic(episodes: int) -> list:
    chosen = list(synth_episodes(Shape(context=4096, group_size=8), episodes, seed=0))
    by_group: dict[str, list] = {}
    for episode in chosen:
        by_group.setdefault(episode.group, []).append(episode)
    for group in by_group.values():
        finalize_group(GRPO(), group)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", type=Path, help="put the table into this file")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--synthetic", type=int, default=32, help="synthetic episodes")
    args = parser.parse_args()
    rows = table()
    print(rows)
    if args.write:
        text = args.write.read_text()
        head, rest = text.split(BEGIN)
        _, tail = rest.split(END)
        args.write.write_text(f"{head}{BEGIN}\n{rows}\n{END}{tail}")
    print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| capture | episodes | sampled tokens | row tokens | audit ms | sampled tokens / s |")
    print("|---|---|---|---|---|---|")
    for harness in ("claude-code", "codex"):
        groups = read_groups(DATA / f"{harness}.jsonl.xz", groups=8)
        print(speed(f"{harness} (bundled)", [e for g in groups for e in g], args.repeat))
    print(speed("synthetic, 4k context", synthetic(args.synthetic), args.repeat))


if __name__ == "__main__":
    main()
