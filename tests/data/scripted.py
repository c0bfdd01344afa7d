"""The scripted model server and the loopback-only run that the data generators share.

`tests/data/claude_code/generate.py` and `tests/data/codex/generate.py` each run a real
harness CLI offline against a server that answers from a fixed script. This module holds what
they have in common: the server (loopback only, a bounded number of requests, every answered
request appended to a log), Server-Sent Events framing, and re-running a generator inside a
network namespace with only loopback.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_REQUESTS = 40

# (request number, path, headers, body) -> (the log record, the Server-Sent Events to send);
# None: the path is not the model API (answered 404, not logged)
Answer = Callable[[int, str, Any, dict[str, Any]], tuple[dict[str, Any], list[bytes]] | None]


def sse(kind: str, data: dict[str, Any]) -> bytes:
    """One Server-Sent Event."""
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def serve(port: int, log: Path, answer: Answer) -> http.server.HTTPServer:
    """Start the scripted server on 127.0.0.1:`port`; stop it with `shutdown()`."""
    count = {"n": 0}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", 0)))
            body = json.loads(raw or b"{}")
            with lock:
                number = count["n"] + 1
                if number > MAX_REQUESTS:
                    self.send_error(429, "request budget of the scripted server spent")
                    return
                found = answer(number, self.path, self.headers, body)
                if found is None:
                    self.send_error(404)
                    return
                count["n"] = number
                record, events = found
                with open(log, "a", encoding="utf-8") as stream:
                    stream.write(json.dumps(record) + "\n")
            payload = b"".join(events)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def fresh_scenario(folder: Path) -> Path:
    """`folder` emptied, with an empty `sessions/`; the path of its request log."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "sessions").mkdir(parents=True)
    return folder / "requests.jsonl"


def run_cli(
    command: list[str], cwd: Path, env: dict[str, str], seconds: int
) -> subprocess.CompletedProcess[str]:
    """One run of a harness CLI, without input, bounded in time."""
    return subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=seconds,
        check=False,
    )


def generate(
    script: str,
    description: str,
    scenarios: dict[str, Any],
    run: Callable[[str, str, Any], None],
    seconds: int,
) -> None:
    """A generator's command line: the CLI's path, then the scenarios to run (all by default).

    It re-runs itself in a network namespace with only loopback (root), bounded in time."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("cli", help="path of the harness executable")
    parser.add_argument("scenarios", nargs="*", default=list(scenarios))
    args = parser.parse_args()
    cli = os.path.abspath(args.cli)
    if os.environ.get("SCRIPTED_INSIDE") != "1":
        argv = " ".join([cli, *args.scenarios])
        inner = f"ip link set lo up && SCRIPTED_INSIDE=1 {sys.executable} {script} {argv}"
        command = ["timeout", str(seconds), "unshare", "-n", "bash", "-c", inner]
        raise SystemExit(subprocess.call(command))
    for name in args.scenarios:
        run(cli, name, scenarios[name])
