"""`check` streams: its memory does not grow with the number of episodes it checks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from callgrove.episode import save

from .helpers import healthy

# VmHWM, not ru_maxrss: ru_maxrss keeps the high-water mark of the forked copy of the test
# process from before exec, which could hide the command's own.
_PEAK = """
import sys
from callgrove.cli import app
try:
    app(sys.argv[1:])
except SystemExit:
    pass
status = open("/proc/self/status").read().split("VmHWM:")[1]
print(status.split()[0], file=sys.stderr)
"""


def _peak_kib(*args: str) -> int:
    """Peak resident memory of one command run in its own process, its output discarded."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=True,
    )
    return int(done.stderr.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("mode", [[], ["--json"]])
def test_check_memory_does_not_grow_with_the_episodes(tmp_path, mode):
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    save(small, (healthy(f"e{i}") for i in range(1_000)))
    save(large, (healthy(f"e{i}") for i in range(10_000)))
    growth = _peak_kib("check", str(large), *mode) - _peak_kib("check", str(small), *mode)
    # 9,000 more episodes: only the ids seen (to find repeated ones) may add up, a few MB;
    # holding a table row or a JSON record per episode took several times that
    assert growth < 6 * 1024, f"peak grew by {growth / 1024:.1f} MiB"
