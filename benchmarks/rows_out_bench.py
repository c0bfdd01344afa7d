"""Peak memory of `callgrove rows IN --out rows.parquet` on a large input.

Synthetic multi-agent episodes (`callgrove synth`, the 4k preset: a leader with fresh, fork,
background and twin subagents that compact) are written once, then repeated under new ids up
to the target size. The command runs in a child process that reports its own peak resident
memory (VmHWM); the figure printed is that peak beside the input's size, and the Parquet
file's row groups.

    .venv/bin/python benchmarks/rows_out_bench.py              # ~200 MB input
    .venv/bin/python benchmarks/rows_out_bench.py --mb 20      # quick
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from callgrove.cli import app

# The measured child: the real CLI entry point; its last stderr line is its peak RSS in KiB.
_PROBE = """
import atexit, sys
def peak():
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    print(status.split()[0], file=sys.stderr)
atexit.register(peak)
from callgrove.cli import main
sys.argv = ["callgrove", "rows", sys.argv[1], "--out", sys.argv[2]]
main()
"""


def _input(folder: Path, megabytes: float, seed_episodes: int) -> tuple[Path, int]:
    """A JSON Lines file of about `megabytes`, and how many episodes it holds."""
    seed = folder / "seed.jsonl"
    try:
        app(["synth", str(seed), "--episodes", str(seed_episodes)])
    except SystemExit as done:
        if done.code:
            raise
    lines = seed.read_bytes().splitlines(keepends=True)
    path, target = folder / "episodes.jsonl", int(megabytes * 1e6)
    written = count = 0
    with path.open("wb") as out:
        while written < target:
            line = lines[count % len(lines)]
            line = line.replace(b'"id":"', b'"id":"r%d-' % count, 1)  # ids stay unique
            out.write(line)
            written += len(line)
            count += 1
    return path, count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=200.0, help="input size in MB")
    parser.add_argument("--seed-episodes", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        source, episodes = _input(folder, args.mb, args.seed_episodes)
        target = folder / "rows.parquet"
        start = time.perf_counter()
        child = subprocess.run(
            [sys.executable, "-c", _PROBE, str(source), str(target)],
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - start
        if child.returncode != 0:
            print(child.stdout[-2000:], child.stderr[-2000:])
            return 1
        peak_mb = int(child.stderr.split()[-1]) / 1024
        size_mb = source.stat().st_size / 1e6
        meta = pq.ParquetFile(target).metadata
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        print(f"input: {size_mb:.0f} MB JSON Lines, {episodes:,} episodes")
        print(
            f"output: {target.stat().st_size / 1e6:.0f} MB Parquet, {meta.num_rows:,} rows in "
            f"{len(groups)} row groups ({min(groups):,}-{max(groups):,} rows each)"
        )
        print(
            f"rows --out: {seconds:.1f} s, peak RSS {peak_mb:.0f} MB "
            f"({peak_mb / size_mb:.2f}x the input)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
