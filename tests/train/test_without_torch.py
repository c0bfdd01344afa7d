"""Without torch, the trainer's torch-backed names say which extra to install; the rest (its
settings included) still works."""

from __future__ import annotations

import subprocess
import sys

# Run in a fresh interpreter where importing torch fails as it does when it is not installed.
PROGRAM = """
import sys
sys.modules["torch"] = None  # `import torch` now raises ModuleNotFoundError
import callgrove as cg
rows = cg.build_rows(next(cg.load("examples/login_bug.jsonl")))
print(len(rows.rows))
from callgrove.train import LearnerSettings
from callgrove.networks import TinyConfig
TinyConfig()
LearnerSettings(learning_rate=0.1)
try:
    from callgrove.networks import TinyDecoder
except ModuleNotFoundError as error:
    print(error)
"""


def test_import_without_torch_names_the_extra():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, check=True
    )
    rows, message = done.stdout.strip().splitlines()
    assert rows == "5"  # everything before the trainer needs no torch
    assert "pip install 'callgrove[train]'" in message and "torch" in message
