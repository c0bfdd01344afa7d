"""`callgrove serve-policy`, `callgrove gateway`, `callgrove harness` and `callgrove close`."""

from __future__ import annotations

import math
import os
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any, NoReturn
from urllib.parse import urlsplit

import orjson
import typer

from callgrove.chat import ChatFormat
from callgrove.cli.app import app, err, out, safe
from callgrove.cli.model_options import (
    MODEL_NAMES,
    ChatTemplateOption,
    ModelOption,
    OldTemplateOption,
    ParserOption,
    TokenizerOption,
    chat_template,
    open_chat,
)
from callgrove.errors import EXIT_USAGE, InvalidValue, UsageError
from callgrove.formats.problems import InputError
from callgrove.policy.client import DEFAULT_MAX_TOKENS

Host = Annotated[
    str, typer.Option("--host", help="Address to bind (loopback unless told otherwise).")
]


# Options serve-policy and the gateway share (the model's: `callgrove.cli.model_options`).
Port = Annotated[int, typer.Option("--port", help="Port (0 picks a free one).")]
Tokens = Annotated[
    list[str] | None,
    typer.Option(
        "--token", help="A client bearer token that is accepted (repeatable); none: no key needed."
    ),
]


def _refuse(message: str) -> NoReturn:
    """A usage error: one line, exit 2."""
    raise UsageError(message)


def _check_serving(
    host: str,
    port: int,
    tokens: list[str],
    parser: str,
    max_tokens: int,
) -> None:
    """The options both servers take, checked before anything starts."""
    from callgrove.chat import PARSERS

    if not host.strip():
        _refuse("--host is empty")
    if not 0 <= port <= 65535:
        _refuse(f"--port {port}: a port is 0 (any free one) to 65535")
    if any(not token.strip() for token in tokens):
        _refuse("--token is empty: give a token, or no --token for no key")
    if parser not in PARSERS:
        _refuse(f"--tool-parser {parser!r}: known are {', '.join(sorted(PARSERS))}")
    if max_tokens < 1:
        _refuse(f"--max-tokens {max_tokens}: at least 1")


def _check_upstream(upstream: str, timeout: float, model: str, token: str | None) -> None:
    """The gateway's upstream options, checked before anything starts."""
    try:
        parts = urlsplit(upstream)
        parts.port  # noqa: B018 - a port that is not one raises here
        url = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        url = False
    if not url:  # not echoed: it may carry credentials
        _refuse("--upstream is not an http:// or https:// URL with a host (http://HOST:PORT)")
    if not (math.isfinite(timeout) and timeout > 0):
        _refuse(f"--timeout {timeout}: a number of seconds above 0")
    if not model.strip() or model != model.strip():
        _refuse(f"--upstream-model {model!r}: the name the upstream serves, without blanks")
    if token is not None and not token.strip():
        _refuse("--upstream-token is empty")


def _set_weights(policy: Any, path: Path) -> None:
    """The reference decoder's weights from the state dict `torch.save` wrote (`--weights`),
    read as data: a usage error naming the file for one that is not such a state dict, or not
    of this model (its keys or shapes)."""
    from callgrove.orchestrator.sinks import load_torch_data

    state = load_torch_data(path, map_location="cpu")
    if not isinstance(state, dict):
        _refuse(f"{path}: not a state dict (holds a {type(state).__name__}, not tensors by name)")
    try:
        policy.set_weights(state)
    except (RuntimeError, TypeError, ValueError) as error:  # missing, unexpected or misshapen
        # torch says "Error(s) in loading state_dict for TinyDecoder:", then a line a problem
        first, *rest = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
        _refuse(f"{path}: not the reference decoder's weights: {first} {'; '.join(rest)}".strip())


def _serve(what: str, app: Any, host: str, port: int, tokens: list[str]) -> None:
    """Serve `app` until interrupted, warning first when it is open beyond loopback."""
    from callgrove.serving import web

    warning = web.open_bind_warning(host, tokens)
    if warning is not None:
        err.print(f"warning: {what}: {warning}")

    def ready(bound: int) -> None:
        # One line on stdout that scripts (and tests) wait for.
        out.print(f"{what} listening on http://{host}:{bound}")
        sys.stdout.flush()

    try:
        web.serve(app, host, port, ready)
    except OSError as error:  # the address is taken, unknown or not this machine's
        _refuse(f"cannot listen on {host}:{port}: {error}")


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
    model: ModelOption = None,
    tokenizer: TokenizerOption = None,
    template: ChatTemplateOption = None,
    old_template: OldTemplateOption = None,
    parser: ParserOption = "hermes",
    host: Host = "127.0.0.1",
    port: Port = 8000,
    token: Tokens = None,
    weights: Annotated[
        Path | None, typer.Option("--weights", help="State dict of the reference decoder.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the reference decoder.")] = 0,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Most tokens a request may ask for (more: 400).")
    ] = DEFAULT_MAX_TOKENS,
) -> None:
    """Serve a policy on an OpenAI-compatible API with vLLM's token extras."""
    from callgrove.models import model_from_name, open_model
    from callgrove.policy.script import Script, ScriptedPolicy
    from callgrove.serving.policy_server import REFERENCE_CONTEXT, PolicyServer

    if (script is None) == (model is None):
        _refuse(f"give either --script FILE or --model ({MODEL_NAMES})")
    tokens = _tokens(token, "CALLGROVE_TOKEN")
    _check_serving(host, port, tokens, parser, max_tokens)
    if not 0 <= seed < 2**63:
        _refuse(f"--seed {seed}: a non-negative 64-bit integer")
    if weights is not None and model != "tiny":
        _refuse("--weights is the reference decoder's state dict: it goes with --model tiny")
    context = None
    try:
        # The reference decoder samples over the chat format given (by default, bytes); a
        # Hugging Face model brings its own.
        template = chat_template(template, old_template)
        given = open_chat(None, tokenizer, template, parser) if model in (None, "tiny") else None
        if script is not None:
            chat, policy = given, ScriptedPolicy(Script.load(script), given)
        else:
            opened = open_model(model_from_name(model, tool_parser=parser), seed=seed, chat=given)
            chat, policy, context = opened.chat, opened.sampler, opened.context
            if model == "tiny":
                context = REFERENCE_CONTEXT
                if weights is not None:
                    _set_weights(policy, weights)
    except (InputError, OSError, RuntimeError, ValueError) as error:
        _refuse(str(error))
    server = PolicyServer(
        policy, chat, model or "policy", tokens, max_tokens=max_tokens, context=context
    )
    _serve("serve-policy", server.app(), host, port, tokens)


# The gateway's own options.
UpstreamOption = Annotated[
    str, typer.Option("--upstream", help="Inference server base URL (OpenAI API).")
]
LedgerOption = Annotated[
    Path, typer.Option("--ledger", help="Folder of the ledger and episodes.jsonl.")
]
ChatModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Render with this model's chat format (its tokenizer and template; its weights "
        "are not loaded): the name serve-policy or train samples it under.",
    ),
]
UpstreamTokenOption = Annotated[
    str | None,
    typer.Option(
        "--upstream-token", envvar="CALLGROVE_UPSTREAM_TOKEN", help="Bearer token upstream."
    ),
]
UpstreamTimeoutOption = Annotated[
    float, typer.Option("--timeout", help="Upstream timeout in seconds.")
]
PassthroughOption = Annotated[
    bool,
    typer.Option(
        "--passthrough",
        help="The upstream applies its own chat template (chat completions); record the "
        "prompt_token_ids / token_ids it reports.",
    ),
]
MaxTokensOption = Annotated[int, typer.Option("--max-tokens", help="Cap on tokens per completion.")]
UpstreamModelOption = Annotated[
    str,
    typer.Option(
        "--upstream-model",
        help="The model name sent upstream (what the server serves, such as vLLM's "
        "--served-model-name); `latest`: the newest LoRA adapter callgrove's sampler pushed "
        "(NAME-vN on /v1/models), asked for on every call. Each call's policy version is "
        "read from the server: the adapter's N, or the weight version on /weight_info.",
    ),
]
ProcessedLogprobsOption = Annotated[
    bool,
    typer.Option(
        "--upstream-processed-logprobs",
        help="The upstream reports logprobs of the distribution it sampled, tempered and "
        "top-p cut (vLLM started with --logprobs-mode processed_logprobs), so calls at any "
        "temperature and top_p are recorded; without it only temperature 1 and top_p 1.",
    ),
]
UpstreamGgufOption = Annotated[
    str | None,
    typer.Option(
        "--upstream-gguf",
        help="The upstream is llama-cpp-python's server of this GGUF file (`smollm2-135m` or "
        "`hf:FILE.gguf`; with --passthrough): it reports no token ids, so they are recovered "
        "with the file's own tokenizer and chat template.",
    ),
]


@app.command("gateway")
def gateway(
    upstream: UpstreamOption,
    ledger: LedgerOption,
    model: ChatModelOption = None,
    tokenizer: TokenizerOption = None,
    template: ChatTemplateOption = None,
    old_template: OldTemplateOption = None,
    parser: ParserOption = "hermes",
    host: Host = "127.0.0.1",
    port: Port = 8100,
    token: Tokens = None,
    upstream_token: UpstreamTokenOption = None,
    timeout: UpstreamTimeoutOption = 600.0,
    passthrough: PassthroughOption = False,
    max_tokens: MaxTokensOption = DEFAULT_MAX_TOKENS,
    upstream_model: UpstreamModelOption = "policy",
    upstream_processed_logprobs: ProcessedLogprobsOption = False,
    upstream_gguf: UpstreamGgufOption = None,
) -> None:
    """Capture gateway: harnesses in front, UPSTREAM behind, every call in LEDGER.

    Point a client at http://HOST:PORT/e/EPISODE/v1 (or send the API key cg:EPISODE) and its
    calls are recorded under EPISODE, in LEDGER/EPISODE.calls.jsonl; a call naming no episode
    is recorded under `untagged`. Chat completions, Responses and Messages APIs are served.

    Agents are told apart by the headers X-Callgrove-Agent (its id), X-Callgrove-Parent (the
    agent that started it), X-Callgrove-Start (root, fresh, fork or background),
    X-Callgrove-Name and X-Callgrove-Purpose (turn or compaction); Claude Code's and Codex's
    own session and thread headers are read too.

    `callgrove close EPISODE --gateway URL --reward NAME=VALUE` (or POST /e/EPISODE/close)
    closes an episode: its record is appended to LEDGER/episodes.jsonl, which every command
    reads (`callgrove rows LEDGER/episodes.jsonl`). docs/gateway.md has the whole protocol.
    """
    from callgrove.gateway.routes import Routes

    tokens = _tokens(token, "CALLGROVE_TOKEN")
    _check_serving(host, port, tokens, parser, max_tokens)
    _check_upstream(upstream, timeout, upstream_model, upstream_token)
    if ledger.exists() and not ledger.is_dir():
        _refuse(f"--ledger {ledger}: a file, not a folder")
    if upstream_gguf and upstream_processed_logprobs:
        _refuse(
            "llama.cpp reports untempered logprobs: --upstream-processed-logprobs "
            "does not go with --upstream-gguf"
        )
    try:
        chat = open_chat(model, tokenizer, chat_template(template, old_template), parser)
    except (InputError, OSError, ValueError) as error:
        _refuse(str(error))
    policy = _upstream_policy(
        upstream,
        upstream_model,
        upstream_token,
        timeout,
        passthrough,
        upstream_processed_logprobs,
        upstream_gguf,
    )
    server = _open_gateway(policy, chat, ledger, tokens, max_tokens, passthrough)
    _recover_ledger(server, ledger)
    try:
        _serve("gateway", Routes(server).app(), host, port, tokens)
    finally:  # a stopped gateway gives up its ledger folder at once, not when it is collected
        server.episodes.release()


def _upstream_policy(
    upstream: str,
    model: str,
    token: str | None,
    timeout: float,
    passthrough: bool,
    processed_logprobs: bool,
    gguf: str | None,
) -> Any:
    """The client of the upstream server: llama.cpp's for `--upstream-gguf`, else the OpenAI
    API's; a usage error for one that cannot be made."""
    from callgrove.policy.http import HttpPolicyClient

    try:
        if gguf:
            return _llama_cpp_client(gguf, passthrough, upstream, token, timeout, model)
        return HttpPolicyClient(
            upstream,
            model=model,
            token=token,
            timeout=timeout,
            tempered_logprobs=processed_logprobs,
            server_versions=True,
        )
    except (ImportError, OSError, ValueError) as error:
        _refuse(str(error))


def _open_gateway(
    policy: Any,
    chat: ChatFormat,
    ledger: Path,
    tokens: list[str],
    max_tokens: int,
    passthrough: bool,
) -> Any:
    """The gateway on its ledger folder: a usage error for a folder another gateway holds or
    one that cannot be used."""
    from callgrove.gateway.core import Gateway
    from callgrove.gateway.ledger import LedgerInUse

    try:
        return Gateway(
            policy,
            chat,
            ledger,
            tokens=tokens,
            max_tokens=max_tokens,
            passthrough=passthrough,
        )
    except (LedgerInUse, OSError) as error:
        _refuse(str(error))


def _recover_ledger(server: Any, ledger: Path) -> None:
    """Recover the episodes a previous gateway left open in `ledger`, saying on stderr what
    was recovered and what was set aside as damaged."""
    from callgrove.gateway.ledger import QUARANTINE

    with warnings.catch_warnings(record=True) as found:
        warnings.simplefilter("always")
        recovered = server.episodes.recover()
    for warning in found:
        err.print(f"warning: {safe(warning.message)}")
    if recovered:
        err.print(f"recovered {recovered} open episode ledger(s) from {ledger}")
    if server.episodes.quarantined:
        err.print(
            f"quarantined {len(server.episodes.quarantined)} damaged episode ledger(s) in "
            f"{ledger / QUARANTINE}: {', '.join(sorted(server.episodes.quarantined))}"
        )


def _llama_cpp_client(
    name: str, passthrough: bool, upstream: str, token: str | None, timeout: float, model: str
):
    from callgrove.networks.hf import resolve_model
    from callgrove.policy.llama_cpp import LlamaCppPolicyClient

    if not passthrough:
        raise InvalidValue("--upstream-gguf goes with --passthrough (the server renders the chat)")
    source = resolve_model(name)
    if source.gguf_file is None:
        raise InvalidValue(f"--upstream-gguf {name}: not a GGUF file")
    return LlamaCppPolicyClient(upstream, source.path, model=model, token=token, timeout=timeout)


@app.command("harness")
def harness(
    kind: Annotated[str, typer.Argument(help="The harness: claude-code or codex.")],
    prompt: Annotated[str, typer.Argument(help="The task, as the harness's prompt.")],
    gateway_url: Annotated[str, typer.Option("--gateway", help="The gateway's base URL.")],
    episode: Annotated[
        str, typer.Option("--episode", help="Episode id the calls are recorded under.")
    ],
    folder: Annotated[
        Path, typer.Option("--folder", help="Where the run's home and work folders go.")
    ] = Path("harness-runs"),
    check: Annotated[
        str | None,
        typer.Option("--check", help="Shell command run in the work folder; exit 0 scores 1."),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds the CLI may run.")] = 120.0,
    cli: Annotated[
        str | None, typer.Option("--cli", help="Path of the harness CLI (default: on PATH).")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Model name the harness sends.")
    ] = None,
    arg: Annotated[
        list[str] | None, typer.Option("--arg", help="Extra CLI argument (repeatable).")
    ] = None,
) -> None:
    """Run a real harness CLI offline through the gateway, score it, close its episode."""
    from callgrove.gateway.harness import run_harness

    try:
        run = run_harness(
            kind,
            prompt,
            gateway_url,
            episode,
            folder,
            check=check,
            timeout=timeout,
            cli=cli,
            model=model,
            extra_args=list(arg or []),
        )
    except (ValueError, FileNotFoundError) as error:
        _refuse(str(error))
    agents = ", ".join(
        f"{a['id']} ({a['start']}, {len(a['calls'])} calls)" for a in run.record["agents"]
    )
    out.print(
        f"{kind} exited {run.returncode} after {run.seconds:.1f}s; "
        f"{'no check' if run.reward is None else f'reward {run.reward}'}; agents: {agents}"
    )
    if run.returncode != 0:
        raise typer.Exit(1)


@app.command("close")
def close(
    episode: Annotated[str, typer.Argument(help="The episode to close.")],
    gateway_url: Annotated[
        str, typer.Option("--gateway", help="The gateway's base URL (http://HOST:PORT).")
    ],
    reward: Annotated[
        list[str] | None,
        typer.Option("--reward", metavar="NAME=VALUE", help="A reward (repeatable)."),
    ] = None,
    failed: Annotated[
        bool, typer.Option("--failed", help="The episode failed (ok: false): it takes no credit.")
    ] = False,
    group: Annotated[
        str | None, typer.Option("--group", help="The group it is scored with.")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", envvar="CALLGROVE_TOKEN", help="The gateway's client token, if it has one."
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="The closed episode's record on stdout, as JSON.")
    ] = False,
) -> None:
    """Close an episode on a running gateway: its record goes to LEDGER/episodes.jsonl.

    The close waits for the episode's calls in flight and takes no new ones; the record
    comes back (--json prints it whole).
    """
    from callgrove.gateway.harness import close_episode

    rewards: dict[str, float] = {}
    for text in reward or []:
        name, _, value = text.partition("=")
        try:
            rewards[name.strip()] = float(value)
        except ValueError:
            err.print(f"error: --reward {safe(text)}: expected NAME=NUMBER")
            raise typer.Exit(EXIT_USAGE) from None
    body: dict[str, Any] = {"ok": not failed}
    if rewards:
        body["rewards"] = rewards
    if group is not None:
        body["group"] = group
    record, _ = close_episode(gateway_url, episode, token or "callgrove", body)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
        return
    agents = record.get("agents", [])
    calls = sum(len(agent.get("calls", [])) for agent in agents)
    out.print(
        f"closed {safe(episode)}: {len(agents)} agent(s), {calls} call(s)"
        + (f", rewards {safe(rewards)}" if rewards else ", no reward")
    )
