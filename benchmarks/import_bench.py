"""Importing and rendering a Claude Code session with its subagents: time against size.

The session is the real flat-layout session in tests/data/real (a 1 MB leader file and its
subagent), repeated until it reaches each size: copy k continues the conversation where copy
k-1 ended and starts its own subagent, with every id made unique per copy. Each size is
imported and rendered with the built-in tokenizer, best of a few runs, all in one process so
the ratios are comparable.

    .venv/bin/python benchmarks/import_bench.py [--sizes 2.5 5 10 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from callgrove.transcripts import ImportReport, Renderer, import_claude_code

SOURCE = (
    Path(__file__).resolve().parent.parent
    / "tests/data/real/iansherr__claude-code-log/test/test_data/real_projects"
    / "-Users-dain-workspace-coderabbit-review-helper"
)
SESSION = "cb2e607c-c758-415a-8b45-c49e4631906a"
AGENT = "ea02459f"
ID_FIELDS = {"uuid", "parentUuid", "logicalParentUuid", "requestId", "tool_use_id", "agentId"}


def _suffixed(value: Any, suffix: str, key: str | None = None) -> Any:
    """Every id in a record, made unique for one copy."""
    if isinstance(value, dict):
        is_block = value.get("type") in ("tool_use", "message")
        return {
            k: (
                f"{v}{suffix}"
                if isinstance(v, str) and (k in ID_FIELDS or (k == "id" and is_block))
                else _suffixed(v, suffix, k)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_suffixed(v, suffix, key) for v in value]
    return value


def build_session(folder: Path, megabytes: float) -> int:
    """Write a session of about `megabytes` into `folder`; returns its size in bytes."""
    main = [orjson.loads(x) for x in (SOURCE / f"{SESSION}.jsonl").read_bytes().splitlines()]
    agent = [orjson.loads(x) for x in (SOURCE / f"agent-{AGENT}.jsonl").read_bytes().splitlines()]
    target = int(megabytes * 1_000_000)
    written = 0
    last_uuid: str | None = None
    copy = 0
    with open(folder / f"{SESSION}.jsonl", "wb") as session:
        while written < target:
            suffix = f"-{copy}"
            lines = [orjson.dumps(r) + b"\n" for r in _suffixed(agent, suffix)]
            (folder / f"agent-{AGENT}{suffix}.jsonl").write_bytes(b"".join(lines))
            written += sum(len(x) for x in lines)
            for record in _suffixed(main, suffix):
                if written >= target:  # the last copy may stop mid-conversation
                    break
                if record.get("parentUuid", 0) is None and last_uuid is not None:
                    record["parentUuid"] = last_uuid
                last_uuid = record.get("uuid", last_uuid)
                line = orjson.dumps(record) + b"\n"
                session.write(line)
                written += len(line)
            copy += 1
    return written


def run_once(folder: Path) -> tuple[float, int, int]:
    start = time.perf_counter()
    episodes = [Renderer().episode(t) for t in import_claude_code(folder, ImportReport())]
    seconds = time.perf_counter() - start
    calls = sum(len(list(e.calls())) for e in episodes)
    tokens = sum(len(c.prompt_suffix) + len(c.completion_ids) for e in episodes for c in e.calls())
    return seconds, calls, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[2.5, 5, 10, 20])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folders = []
        for size in args.sizes:
            folder = Path(tmp) / str(size)
            folder.mkdir()
            folders.append((folder, build_session(folder, size) / 1e6))
        best = [float("inf")] * len(folders)
        counts = [(0, 0)] * len(folders)
        for _ in range(args.repeat):  # rounds over all sizes, so noise hits each size alike
            for i, (folder, _mb) in enumerate(folders):
                seconds, calls, tokens = run_once(folder)
                best[i] = min(best[i], seconds)
                counts[i] = (calls, tokens)
    print(f"{'MB':>6} {'seconds':>8} {'MB/s':>6} {'calls':>6} {'new tokens':>11} {'s/MB':>7}")
    for (_, megabytes), seconds, (calls, tokens) in zip(folders, best, counts, strict=True):
        print(
            f"{megabytes:6.1f} {seconds:8.3f} {megabytes / seconds:6.1f} {calls:6d} {tokens:11d}"
            f" {seconds / megabytes:7.3f}"
        )
    per_mb = [s / mb for (_, mb), s in zip(folders, best, strict=True)]
    print(f"time per MB, largest over smallest size: {per_mb[-1] / per_mb[0]:.2f} (1.00 = linear)")
    ten = [s for (_, mb), s in zip(folders, best, strict=True) if 9 <= mb <= 12]
    if ten:
        print(f"~10 MB session with subagents: {ten[0]:.2f} s (target < 3 s)")


if __name__ == "__main__":
    main()
