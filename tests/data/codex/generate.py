"""Regenerate the Codex sessions in this folder with the real CLI and a scripted model server.

Usage (root, for a network namespace with loopback only; Node and npm on the PATH):

    npm install --prefix /opt/codex-cli @openai/codex@0.169.0
    python tests/data/codex/generate.py /opt/codex-cli/node_modules/.bin/codex

Each scenario runs `codex exec` once, offline (`unshare -n`, loopback only, time-bounded),
against a Responses API server in this file that answers from a fixed script. The server logs
every request it answered to `<scenario>/requests.jsonl`: that log is the truth the importer is
tested against (each model call the CLI made must become exactly one call of the right agent).
The rollout files Codex wrote are copied to `<scenario>/sessions/`.

The server only serves this data generation: it listens on 127.0.0.1, answers a bounded number
of requests, and stops with its scenario.
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

HERE = Path(__file__).resolve().parent
PORT = 18431
LOGGED_METADATA = (
    "thread_id",
    "agent_name",
    "request_kind",
    "window_number",
    "history_initialization",
    "parent_thread_id",
    "subagent_kind",
)
USAGE_SMALL = 200
AGENT_TOOLS = "multi_agent_v1"  # the tool namespace of subagent tools in 0.169
USAGE_LARGE = 50_000  # above the compaction limit: the CLI compacts before its next call

CONFIG = """model = "gpt-test"
model_provider = "local"
approval_policy = "never"
sandbox_mode = "danger-full-access"
[model_providers.local]
name = "local"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
env_key = "LOCAL_KEY"
"""

SCENARIOS: dict[str, dict[str, Any]] = {
    "tool_call": {"prompt": "Print hi with a shell command.", "args": []},
    "spawn_fresh": {"prompt": "Ask a helper to count to three.", "args": [], "fork": False},
    "spawn_fork": {"prompt": "Fork a helper to check the plan.", "args": [], "fork": True},
    "auto_compaction": {
        "prompt": "Print hi, then summarise.",
        "args": ["-c", "model_auto_compact_token_limit=20000"],
        "compact": True,
    },
}


def message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def function_call(
    name: str, arguments: dict[str, Any], call_id: str, namespace: str | None = None
) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "name": name,
        "arguments": json.dumps(arguments),
        "call_id": call_id,
    }
    return item if namespace is None else {**item, "namespace": namespace}


def last_tool_output(body: dict[str, Any]) -> str:
    outputs = [i for i in body.get("input", []) if i.get("type") == "function_call_output"]
    output = outputs[-1].get("output", "") if outputs else ""
    return output if isinstance(output, str) else json.dumps(output)


def spawned_agent_id(body: dict[str, Any]) -> str:
    text = last_tool_output(body)
    try:
        found = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()
    if isinstance(found, dict):
        for key in ("agent_id", "id", "thread_id", "agent_path"):
            if isinstance(found.get(key), str):
                return found[key]
    return text.strip()


class Script:
    """What the model answers: decided by the scenario, the agent, and its turn number."""

    def __init__(self, name: str, spec: dict[str, Any]):
        self.name = name
        self.spec = spec
        self.turns: dict[str, int] = {}  # thread id -> turn requests answered so far
        self.compacted = False

    def answer(
        self, meta: dict[str, Any], body: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], int]:
        thread = str(meta.get("thread_id"))
        if meta.get("request_kind") == "compaction":
            self.compacted = True
            return [
                message("Summary: printed hi with a shell command; nothing else is open.")
            ], USAGE_SMALL
        turn = self.turns.get(thread, 0)
        self.turns[thread] = turn + 1
        if meta.get("parent_thread_id"):
            return [message(f"Helper result: all checked ({turn + 1}).")], USAGE_SMALL
        if self.name == "tool_call" or self.spec.get("compact"):
            if turn == 0:
                large = USAGE_LARGE if self.spec.get("compact") else USAGE_SMALL
                return [
                    function_call("exec_command", {"cmd": "echo hi"}, f"call-{self.name}-0")
                ], large
            return [message("Done: the command printed hi.")], USAGE_SMALL
        if turn == 0:
            arguments = {"message": "Count to three and report.", "fork_context": self.spec["fork"]}
            return [
                function_call("spawn_agent", arguments, f"call-{self.name}-spawn", AGENT_TOOLS)
            ], USAGE_SMALL
        if turn == 1:
            target = spawned_agent_id(body)
            arguments = {"targets": [target], "timeout_ms": 20000}
            return [
                function_call("wait_agent", arguments, f"call-{self.name}-wait", AGENT_TOOLS)
            ], USAGE_SMALL
        return [message("The helper finished; all done.")], USAGE_SMALL


def answer(script: Script) -> Answer:
    """The server's answers for one scenario: Responses API streams, logged with the thread
    headers and turn metadata of each request."""

    def respond(number: int, path: str, headers: Any, body: dict[str, Any]):
        meta = json.loads(headers.get("x-codex-turn-metadata") or "{}")
        items, input_tokens = script.answer(meta, body)
        for index, item in enumerate(items):
            kind = "fc" if item["type"] == "function_call" else "msg"
            item["id"] = f"{kind}_{script.name}_r{number}_{index}"
        record = {
            "request": number,
            "path": path,
            "thread_id": headers.get("thread-id"),
            "session_id": headers.get("session-id"),
            "parent_thread_id": headers.get("x-codex-parent-thread-id"),
            "subagent": headers.get("x-openai-subagent"),
            "window_id": headers.get("x-codex-window-id"),
            "metadata": {k: meta.get(k) for k in LOGGED_METADATA if k in meta},
            "input": [
                {k: i.get(k) for k in ("type", "role", "id", "call_id", "name") if k in i}
                for i in body.get("input", [])
            ],
            "tools": len(body.get("tools", [])),
            "output": items,
        }
        response_id = f"resp_{script.name}_r{number}"
        usage = {
            "input_tokens": input_tokens,
            "output_tokens": 20,
            "total_tokens": input_tokens + 20,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        events = [
            sse("response.created", {"type": "response.created", "response": {"id": response_id}})
        ]
        for index, item in enumerate(items):
            done = {"type": "response.output_item.done", "output_index": index, "item": item}
            events.append(sse("response.output_item.done", done))
        completed = {"id": response_id, "usage": usage}
        events.append(
            sse("response.completed", {"type": "response.completed", "response": completed})
        )
        return record, events

    return respond


def run_scenario(codex: str, name: str, spec: dict[str, Any]) -> None:
    target = HERE / name
    log = fresh_scenario(target)
    with tempfile.TemporaryDirectory(dir=os.environ.get("CODEX_GEN_TMP")) as scratch:
        home = Path(scratch)
        (home / "codex").mkdir()
        (home / "work").mkdir()
        (home / "codex" / "config.toml").write_text(CONFIG.format(port=PORT))
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "CODEX_HOME": str(home / "codex"),
            "LOCAL_KEY": "offline",
        }
        server = serve(PORT, log, answer(Script(name, spec)))
        try:
            command = [
                codex,
                "exec",
                "--skip-git-repo-check",
                "--json",
                *spec["args"],
                spec["prompt"],
            ]
            done = run_cli(command, home / "work", env, 90)
            (target / "exec.jsonl").write_text(done.stdout)
            print(f"{name}: exit {done.returncode}", file=sys.stderr)
        finally:
            server.shutdown()
            server.server_close()
        for rollout in sorted((home / "codex" / "sessions").rglob("rollout-*.jsonl")):
            shutil.copy(rollout, target / "sessions" / rollout.name)


if __name__ == "__main__":
    generate(__file__, __doc__.splitlines()[0], SCENARIOS, run_scenario, 600)
