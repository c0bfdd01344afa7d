"""Record real Claude Code and Codex episodes through the gateway, laid out as RL runs them.

    python benchmarks/record_harness_groups.py OUT --claude CLAUDE --codex CODEX \
        [--groups 8] [--group-size 2]

Each episode is one run of the harness CLI (offline: `callgrove gateway` in front of
`callgrove serve-policy --script`, the CLI in a loopback-only network namespace,
`callgrove.gateway.harness.run_harness`). Group g's task is its own prompt (`TASK-g ...`);
the episodes of a group differ in what the scripted model answers (one shell command, a
different one per episode, then a final reply).

RL runs every rollout in a sandbox at one fixed path, so the harness's system prompt (which
names its home and working folder) is the same bytes in every episode. To record that, every
run gets its own gateway and ledger and runs as the same episode id in the same folder (emptied
between runs); its closed record is then renamed to its own id and group and appended to
`OUT/HARNESS.jsonl` (callgrove episode JSON Lines, the gateway's default byte chat format).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from callgrove.gateway.harness import run_harness

SANDBOX_EPISODE = "rollout"
COMMANDS = ("ls -la", "pwd", "echo ready", "uname -s", "date +%Y", "wc -c /etc/hostname")


@contextlib.contextmanager
def server(*args: str) -> Iterator[str]:
    """`callgrove ARGS --port 0` as a process; yields its base URL; stopped afterwards."""
    process = subprocess.Popen(
        [sys.executable, "-c", "from callgrove.cli import main; main()", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        for line in process.stdout:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                yield found.group(1)
                break
        else:
            raise RuntimeError(f"callgrove {args[0]} exited: {process.stderr.read()[-2000:]}")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)


def script(harness: str, group: int, variant: int) -> dict:
    """One shell step, then a final answer; the command differs by episode within the group."""
    command = COMMANDS[(group + variant) % len(COMMANDS)]
    marker = f"TASK-{group}"
    if harness == "claude-code":
        call = {"name": "Bash", "arguments": {"command": command, "description": "look"}}
    else:
        call = {"name": "shell", "arguments": {"command": ["bash", "-lc", command]}}
    return {
        "rules": [
            {"when": marker, "reply": {"text": f"Checking with {command}.", "tool_calls": [call]}},
        ],
        "default": f"Task {group} done after {command} (episode {variant}).",
    }


def record(harness: str, cli: str, groups: int, group_size: int, out: Path) -> Path:
    target = out / f"{harness}.jsonl"
    target.unlink(missing_ok=True)
    sandbox = Path(tempfile.gettempdir()) / "cg-sandbox"
    for group in range(groups):
        for variant in range(group_size):
            with tempfile.TemporaryDirectory() as scratch:
                rules = Path(scratch) / "script.json"
                rules.write_text(json.dumps(script(harness, group, variant)))
                shutil.rmtree(sandbox, ignore_errors=True)
                with (
                    server("serve-policy", "--script", str(rules)) as upstream,
                    server("gateway", "--upstream", upstream, "--ledger", f"{scratch}/l") as gw,
                ):
                    prompt = f"TASK-{group}: inspect the working folder and report."
                    run = run_harness(
                        harness, prompt, gw, SANDBOX_EPISODE, sandbox, cli=cli, timeout=180
                    )
            if run.returncode != 0:
                raise RuntimeError(f"{harness} group {group}: {run.stderr[-2000:]}")
            record = run.record
            record["id"] = f"{harness}-g{group}-e{variant}"
            record["group"] = f"{harness}-g{group}"
            with target.open("a") as file:
                file.write(json.dumps(record) + "\n")
            calls = sum(len(a["calls"]) for a in record["agents"])
            print(f"{record['id']}: {len(record['agents'])} agents, {calls} calls", flush=True)
    shutil.rmtree(sandbox, ignore_errors=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--claude", help="the Claude Code CLI")
    parser.add_argument("--codex", help="the Codex CLI")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for harness, cli in (("claude-code", args.claude), ("codex", args.codex)):
        if cli:
            print(record(harness, cli, args.groups, args.group_size, args.out))


if __name__ == "__main__":
    main()
