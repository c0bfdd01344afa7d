"""Regenerate the Claude Code sessions in this folder with the real CLI and a scripted server.

Usage (root, for a network namespace with loopback only; the CLI as `make test` installs it):

    PYTHONPATH=src .venv/bin/python tests/data/claude_code/generate.py .harness/node_modules/.bin/claude

Each scenario runs `claude -p` (then, for some, `claude -p --continue`) offline (`unshare -n`,
loopback only, time-bounded) against an Anthropic Messages server in this file that answers
from a fixed script, with a fresh HOME. The server logs every request it answered to
`<scenario>/requests.jsonl` (the agent and parent-agent headers, whether it asked for a
summary, the message id it answered with): that log is the truth the importer is tested
against. The session files the CLI wrote under its HOME are copied to `<scenario>/sessions/`,
keeping their layout below the project folder.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripted import Answer, fresh_scenario, generate, run_cli, serve, sse

from callgrove.gateway.harness import QUIET

HERE = Path(__file__).resolve().parent
PORT = 18432
SESSION = "5e551011-0000-4000-8000-00000000c0de"
USAGE_SMALL = 300
COMPACTION_ASK = "Respond with TEXT ONLY"  # how a compaction request's last message begins


def spawn(marker: str, background: bool, kind: str = "general-purpose") -> dict[str, Any]:
    return {
        "name": "Agent",
        "input": {
            "description": f"helper {marker}",
            "prompt": f"{marker}: report a number.",
            "subagent_type": kind,
            "run_in_background": background,
        },
    }


def bash(command: str) -> dict[str, Any]:
    return {"name": "Bash", "input": {"command": command, "description": "print a word"}}


# Each scenario: the prompts of the CLI runs (the later ones continue the session, with
# `later_runs` as their options), and rules:
# the first rule whose marker is in the request's newest user text gives the answer (text,
# tool calls, input tokens reported). Compaction requests are answered with a summary.
SCENARIOS: dict[str, dict[str, Any]] = {
    "fresh_subagent": {
        "runs": ["START: ask one helper."],
        "rules": [
            ("FRESH-1: report", ("Helper answer: 7.", [], USAGE_SMALL)),
            ("START", ("I will ask a helper.", [spawn("FRESH-1", False)], USAGE_SMALL)),
            ("Helper answer", ("The helper said 7. Done.", [], USAGE_SMALL)),
        ],
    },
    "background_subagent": {
        "runs": ["START: ask a helper in the background."],
        "rules": [
            ("BG-1: report", ("Background answer: 5.", [], USAGE_SMALL)),
            ("START", ("Starting a background helper.", [spawn("BG-1", True)], USAGE_SMALL)),
            ("Background answer", ("The background helper said 5. Done.", [], USAGE_SMALL)),
        ],
    },
    "nested_subagent": {
        "runs": ["START: ask a helper that asks another."],
        "rules": [
            ("NEST-B: report", ("B answer: 9.", [], USAGE_SMALL)),
            ("B answer", ("A relays 9.", [], USAGE_SMALL)),
            ("NEST-A: report", ("A asks B.", [spawn("NEST-B", False)], USAGE_SMALL)),
            ("START", ("I will ask helper A.", [spawn("NEST-A", False)], USAGE_SMALL)),
            ("A relays", ("A relayed 9. Done.", [], USAGE_SMALL)),
        ],
    },
    "fork_subagent": {
        "runs": ["START: fork a helper."],
        "rules": [
            ("FORK-1: report", ("Fork answer: 4.", [], USAGE_SMALL)),
            ("START", ("I will fork a helper.", [spawn("FORK-1", False, "fork")], USAGE_SMALL)),
            ("Fork answer", ("The fork said 4. Done.", [], USAGE_SMALL)),
        ],
    },
    # A subagent that forks: its own file gets no toolUseResult for the fork (null), the fork's
    # file starts with the subagent's copied history, and its meta.json names the spawn.
    "subagent_fork": {
        "runs": ["START: ask a helper that forks."],
        "rules": [
            ("SFORK-B: report", ("Fork B answer: 3.", [], USAGE_SMALL)),
            ("Fork B answer", ("A relays 3.", [], USAGE_SMALL)),
            ("SFORK-A: report", ("A forks B.", [spawn("SFORK-B", False, "fork")], USAGE_SMALL)),
            ("START", ("I will ask helper A.", [spawn("SFORK-A", False)], USAGE_SMALL)),
            ("A relays", ("A relayed 3. Done.", [], USAGE_SMALL)),
        ],
    },
    "leader_compaction": {
        "runs": ["START: say one word.", "/compact", "NEXT: say another word."],
        "rules": [
            ("START", ("One.", [], USAGE_SMALL)),
            ("NEXT", ("Two.", [], USAGE_SMALL)),
        ],
    },
    # `claude --continue --fork-session`: the second run writes a session file of its own that
    # repeats the first session's lines, then its own turn.
    "fork_session": {
        "runs": ["START: print a word.", "NEXT: say another word."],
        "later_runs": ["--continue", "--fork-session"],
        "rules": [
            ("START", ("I will print it.", [bash("echo word-one")], USAGE_SMALL)),
            ("word-one", ("Printed word-one.", [], USAGE_SMALL)),
            ("NEXT", ("Two.", [], USAGE_SMALL)),
        ],
    },
}


def user_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") == "tool_result":
            inner = block.get("content")
            parts.append(inner if isinstance(inner, str) else user_text({"content": inner}))
    return "\n".join(parts)


def newest_user_text(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return user_text(users[-1]) if users else ""


class Script:
    def __init__(self, name: str, spec: dict[str, Any]):
        self.name = name
        self.rules = spec["rules"]

    def answer(self, body: dict[str, Any]) -> tuple[str | None, str, list[dict[str, Any]], int]:
        """(the rule that answered, the text, the tool calls, the input tokens reported)"""
        text = newest_user_text(body)
        if COMPACTION_ASK in text and "summary" in text:
            summary = "<summary>The user asked for a number; it was found.</summary>"
            return "compaction", summary, [], USAGE_SMALL
        for marker, (reply, tools, usage) in self.rules:
            if marker in text:
                return marker, reply, tools, usage
        return None, "Nothing more to do.", [], USAGE_SMALL


def answer(script: Script) -> Answer:
    """The server's answers for one scenario: Messages API streams, logged with the agent
    headers of each request."""

    def respond(number: int, path: str, headers: Any, body: dict[str, Any]):
        if not path.startswith("/v1/messages") or "count_tokens" in path:
            return None
        rule, text, tools, usage = script.answer(body)
        message_id = f"msg_{script.name}_r{number}"
        record = {
            "request": number,
            "path": path,
            "session_id": headers.get("x-claude-code-session-id"),
            "agent_id": headers.get("x-claude-code-agent-id"),
            "parent_agent_id": headers.get("x-claude-code-parent-agent-id"),
            "compaction": rule == "compaction",
            "rule": rule,
            "stream": body.get("stream"),
            "model": body.get("model"),
            "messages": len(body.get("messages", [])),
            "newest_user_text": newest_user_text(body)[:300],
            "tools": len(body.get("tools", [])),
            "message_id": message_id,
            "reply": text,
            "tool_calls": tools,
        }
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
        for index, tool in enumerate(tools):
            use_id = f"toolu_{script.name}_r{number}_{index}"
            blocks.append({"type": "tool_use", "id": use_id, **tool})
        return record, message_events(message_id, body.get("model"), blocks, usage)

    return respond


def message_events(
    message_id: str, model: Any, blocks: list[dict[str, Any]], usage: int
) -> list[bytes]:
    """One streamed Messages API answer."""
    start = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": usage, "output_tokens": 1},
    }
    events = [sse("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            opening = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        for kind, data in (
            ("content_block_start", {"content_block": opening}),
            ("content_block_delta", {"delta": delta}),
            ("content_block_stop", {}),
        ):
            events.append(sse(kind, {"type": kind, "index": index, **data}))
    stop = "tool_use" if len(blocks) > 1 else "end_turn"
    delta = {"stop_reason": stop, "stop_sequence": None}
    events.append(
        sse(
            "message_delta",
            {"type": "message_delta", "delta": delta, "usage": {"output_tokens": 20}},
        )
    )
    events.append(sse("message_stop", {"type": "message_stop"}))
    return events


def run_scenario(claude: str, name: str, spec: dict[str, Any]) -> None:
    target = HERE / name
    log = fresh_scenario(target)
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        work = Path(scratch) / "work"
        home.mkdir()
        work.mkdir()
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{PORT}",
            "ANTHROPIC_API_KEY": "offline",
            "IS_SANDBOX": "1",
            **QUIET,
        }
        server = serve(PORT, log, answer(Script(name, spec)))
        try:
            for index, prompt in enumerate(spec["runs"]):
                command = [claude, "-p", prompt, "--output-format", "json"]
                command += ["--model", "claude-sonnet-4-5", "--dangerously-skip-permissions"]
                later = spec.get("later_runs", ["--continue"])
                command += ["--session-id", SESSION] if index == 0 else later
                done = run_cli(command, work, env, 120)
                print(f"{name} run {index}: exit {done.returncode}", file=sys.stderr)
                print(done.stdout[-1500:], done.stderr[-1500:], file=sys.stderr)
        finally:
            server.shutdown()
            server.server_close()
        projects = home / ".claude" / "projects"
        for path in sorted(projects.rglob("*")):
            if path.is_file():
                relative = path.relative_to(projects)
                relative = Path(*relative.parts[1:])  # without the project folder (a temp path)
                (target / "sessions" / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target / "sessions" / relative)


if __name__ == "__main__":
    generate(__file__, __doc__.splitlines()[0], SCENARIOS, run_scenario, 900)
