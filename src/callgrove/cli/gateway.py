"""`callgrove serve-policy`, `callgrove gateway` and `callgrove harness`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from callgrove.cli.app import EXIT_USAGE, app, err, out
from callgrove.formats.problems import InputError

Host = Annotated[
    str, typer.Option("--host", help="Address to bind (loopback unless told otherwise).")
]
TOKEN_HELP = "A client bearer token that is accepted (repeatable); none: no key needed."


def _chat(tokenizer: Path | None, template: Path | None, parser: str):
    from callgrove.gateway.chat import Chat

    if (tokenizer is None) != (template is None):
        err.print("error: --tokenizer and --template go together")
        raise typer.Exit(EXIT_USAGE)
    if tokenizer is None:
        return Chat.builtin()
    return Chat.jinja(tokenizer, template, parser)  # type: ignore[arg-type]


def _announce(what: str, host: str) -> Callable[[int], None]:
    def ready(port: int) -> None:
        # One line on stdout that scripts (and tests) wait for.
        out.print(f"{what} listening on http://{host}:{port}")
        sys.stdout.flush()

    return ready


def _tokens(tokens: list[str] | None, env: str) -> list[str]:
    found = list(tokens or [])
    if os.environ.get(env):
        found.append(os.environ[env])
    return found


@app.command("serve-policy")
def serve_policy(
    script: Annotated[
        Path | None, typer.Option("--script", help="Answer from this script (JSON rules).")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Model name; `tiny` for the reference decoder.")
    ] = None,
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="tokenizer.json of a Jinja chat format.")
    ] = None,
    template: Annotated[
        Path | None, typer.Option("--template", help="Jinja chat template file.")
    ] = None,
    parser: Annotated[
        str, typer.Option("--tool-parser", help="Tool-call parser of the template.")
    ] = "hermes",
    host: Host = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port (0 picks a free one).")] = 8000,
    token: Annotated[list[str] | None, typer.Option("--token", help=TOKEN_HELP)] = None,
) -> None:
    """Serve a policy on an OpenAI-compatible API with vLLM's token extras."""
    from callgrove.gateway.script import Script, ScriptedPolicy
    from callgrove.gateway.serve import PolicyServer
    from callgrove.gateway.web import serve

    chat = _chat(tokenizer, template, parser)
    if script is None:
        err.print(
            "error: give --script FILE (the model backends plug in with --model when present)"
        )
        raise typer.Exit(EXIT_USAGE)
    try:
        policy = ScriptedPolicy(Script.load(script), chat)
    except InputError as error:
        err.print(f"error: {error}")
        raise typer.Exit(EXIT_USAGE) from None
    server = PolicyServer(policy, chat, model or "policy", _tokens(token, "CALLGROVE_TOKEN"))
    serve(server.app(), host, port, _announce("serve-policy", host))


@app.command("gateway")
def gateway(
    upstream: Annotated[
        str, typer.Option("--upstream", help="Inference server base URL (OpenAI API).")
    ],
    ledger: Annotated[
        Path, typer.Option("--ledger", help="Folder of the ledger and episodes.jsonl.")
    ],
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="tokenizer.json of a Jinja chat format.")
    ] = None,
    template: Annotated[
        Path | None, typer.Option("--template", help="Jinja chat template file.")
    ] = None,
    parser: Annotated[
        str, typer.Option("--tool-parser", help="Tool-call parser of the template.")
    ] = "hermes",
    host: Host = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port (0 picks a free one).")] = 8100,
    token: Annotated[list[str] | None, typer.Option("--token", help=TOKEN_HELP)] = None,
    upstream_token: Annotated[
        str | None,
        typer.Option(
            "--upstream-token", envvar="CALLGROVE_UPSTREAM_TOKEN", help="Bearer token upstream."
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Upstream timeout in seconds.")
    ] = 600.0,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Cap on tokens per completion.")
    ] = 4096,
) -> None:
    """Capture gateway: harnesses in front, UPSTREAM behind, every call in LEDGER."""
    from callgrove.gateway.app import Gateway
    from callgrove.gateway.web import serve
    from callgrove.policy.http import HttpPolicyClient

    chat = _chat(tokenizer, template, parser)
    policy = HttpPolicyClient(upstream, token=upstream_token, timeout=timeout)
    server = Gateway(
        policy, chat, ledger, tokens=_tokens(token, "CALLGROVE_TOKEN"), max_tokens=max_tokens
    )
    recovered = server.recover()
    if recovered:
        err.print(f"recovered {recovered} episode ledger(s) from {ledger}")
    serve(server.app(), host, port, _announce("gateway", host))
