"""Importing and rendering a Claude Code session with its subagents: time against size.

The session is the real flat-layout session in tests/data/real (a 1 MB leader file and its
subagent), repeated until it reaches each size: copy k continues the conversation where copy
k-1 ended and starts its own subagent, with every id made unique per copy. Each size is
imported and rendered with the built-in tokenizer, best of a few runs, all in one process so
the ratios are comparable.

With `--against REF` it compares this tree's importer with the one at git revision REF instead:
each round imports every size once with each version, in alternation, each in a fresh process
(best of 3 there), and reports CPU time beside wall time: on a shared machine the wall time of
one run mostly measures how long the process waited for a core.

    .venv/bin/python benchmarks/import_bench.py [--sizes 2.5 5 10 20] [--repeat 3]
    .venv/bin/python benchmarks/import_bench.py --against REF [--sizes 2.5 10] [--repeat 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

import orjson

from callgrove.transcripts import ImportReport, TranscriptRenderer, import_claude_code

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
    episodes = [TranscriptRenderer().episode(t) for t in import_claude_code(folder, ImportReport())]
    seconds = time.perf_counter() - start
    calls = sum(len(list(e.calls())) for e in episodes)
    tokens = sum(len(c.prompt_suffix) + len(c.completion_ids) for e in episodes for c in e.calls())
    return seconds, calls, tokens


ROOT = Path(__file__).resolve().parent.parent
# One measurement in a child process: its importer is the one on its PYTHONPATH.
CHILD = """
import sys, time
sys.path.insert(0, sys.argv[2])
from import_bench import run_once
best = None
for _ in range(3):
    cpu, wall = time.process_time(), time.perf_counter()
    run_once(sys.argv[1])
    found = (time.process_time() - cpu, time.perf_counter() - wall)
    best = found if best is None else (min(best[0], found[0]), min(best[1], found[1]))
print(*best)
"""


def measure(folder: Path, src: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds), best of 3, of importing `folder` with the code in `src`."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(Path(__file__).parent)],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        check=True,
    )
    cpu, wall = map(float, done.stdout.split())
    return cpu, wall


def compare(folders: list[tuple[Path, float]], against: str, repeat: int, tmp: Path) -> None:
    """This tree's importer against the one at git revision `against`, interleaved."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", against, "src"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as sources:
        sources.extractall(tmp / "against", filter="data")
    versions = {"this tree": str(ROOT / "src"), against: str(tmp / "against" / "src")}
    found: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(repeat):
        for i, (folder, _mb) in enumerate(folders):
            for name, src in versions.items():
                found.setdefault((name, i), []).append(measure(folder, src))
    print(f"{'MB':>6} {'version':>12} {'CPU s':>7} {'median':>7} {'wall s':>7} {'median':>7}")
    for i, (_, megabytes) in enumerate(folders):
        for name in versions:
            cpu = [c for c, _ in found[name, i]]
            wall = [w for _, w in found[name, i]]
            print(
                f"{megabytes:6.1f} {name[:12]:>12} {min(cpu):7.3f} {statistics.median(cpu):7.3f}"
                f" {min(wall):7.3f} {statistics.median(wall):7.3f}"
            )
        mine, theirs = (sorted(c for c, _ in found[name, i]) for name in versions)
        print(
            f"{megabytes:6.1f} CPU time, this tree / {against}: best {mine[0] / theirs[0]:.3f},"
            f" median {statistics.median(mine) / statistics.median(theirs):.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[2.5, 5, 10, 20])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", metavar="REF", help="compare with the importer at REF")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folders = []
        for size in args.sizes:
            folder = Path(tmp) / str(size)
            folder.mkdir()
            folders.append((folder, build_session(folder, size) / 1e6))
        if args.against:
            compare(folders, args.against, args.repeat, Path(tmp))
            return
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
