"""Write the ATIF trajectories Harbor's own converters make from the recorded sessions.

harbor 0.26.0's converters need Python 3.12 (its `harbor.environments.base` uses PEP 695
generics), so this runs outside the project's 3.11 venv, in one holding harbor and the few
packages its converter modules import, all installed with --no-deps:

    python3.12 -m venv /tmp/h312
    /tmp/h312/bin/pip install --no-deps harbor==0.26.0 pydantic pydantic-core \
        typing-extensions annotated-types typing-inspection toml shortuuid platformdirs \
        jinja2 markupsafe
    /tmp/h312/bin/python tests/data/atif/generate.py

Each recorded scenario becomes `<harness>_<scenario>.json` here.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from harbor.agents.installed.claude_code import ClaudeCode
from harbor.agents.installed.codex import Codex

DATA = Path(__file__).resolve().parent.parent


def _claude_code(scenario: Path, logs: Path) -> dict | None:
    # Harbor looks for <logs>/sessions/projects/<project>/<session>.jsonl
    project = logs / "sessions" / "projects" / "project"
    shutil.copytree(scenario / "sessions", project)
    trajectory = ClaudeCode(logs_dir=logs).convert_trajectory(logs)
    return None if trajectory is None else trajectory.to_json_dict()


def _codex(scenario: Path, logs: Path) -> dict | None:
    shutil.copytree(scenario / "sessions", logs / "sessions")
    trajectory = Codex(logs_dir=logs).convert_trajectory(logs)
    return None if trajectory is None else trajectory.to_json_dict()


def main() -> None:
    out = Path(__file__).resolve().parent
    for harness, convert in (("claude_code", _claude_code), ("codex", _codex)):
        for scenario in sorted(p for p in (DATA / harness).iterdir() if p.is_dir()):
            with tempfile.TemporaryDirectory() as logs:
                record = convert(scenario, Path(logs))
            if record is None:
                print(f"{harness}/{scenario.name}: harbor made no trajectory")
                continue
            target = out / f"{harness}_{scenario.name}.json"
            target.write_text(json.dumps(record, indent=1) + "\n")
            print(f"{target.name}: {len(record['steps'])} steps")


if __name__ == "__main__":
    main()
