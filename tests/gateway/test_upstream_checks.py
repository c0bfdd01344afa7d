"""What an upstream answers is checked before it can be a call: token ids, logprobs and versions
that are not JSON integers / numbers are refused by name (never cast), and credentials in the
upstream URL never reach an error, a ledger line or the wire as part of the URL."""

from __future__ import annotations

import asyncio
import base64
import json
import socket

import orjson
import pytest

from callgrove.policy.http import (
    HttpPolicyClient,
    UpstreamError,
    piece_from_chunk,
    sample_from_chat,
    sample_from_completion,
)
from callgrove.serving.web import open_bind_warning

from .helpers import gateway_client

GOOD_IDS, GOOD_LOGPROBS = [4, 5], [-0.5, -1.0]
# Each is a value a cast would have taken: 1.5 -> 1, true -> 1, "-0.5" -> -0.5, 2**40 wrapped.
BAD_IDS = [[4, 1.5], [True, 5], [4, "5"], [4, 2**40], [4, None], "45"]
BAD_LOGPROBS = [[-0.5, "-1.0"], [-0.5, True], [-0.5, [1]]]
BAD_VERSIONS = [1.5, "3", True, [1]]


def completion(ids=GOOD_IDS, logprobs=GOOD_LOGPROBS, **top):
    return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": logprobs}}], **top}


def chat(prompt=(1, 2), ids=GOOD_IDS, logprobs=GOOD_LOGPROBS, **top):
    return {
        "prompt_token_ids": list(prompt) if isinstance(prompt, tuple) else prompt,
        "choices": [
            {
                "message": {"role": "assistant", "content": "hi"},
                "token_ids": ids,
                "logprobs": {"content": [{"logprob": v} for v in logprobs]},
            }
        ],
        **top,
    }


PARSERS = {
    "completion": lambda payload: sample_from_completion(payload, 0),
    "chunk": piece_from_chunk,
    "chat": lambda payload: sample_from_chat(payload, 0),
}


@pytest.mark.parametrize("ids", BAD_IDS, ids=repr)
@pytest.mark.parametrize("parser", ["completion", "chunk", "chat"])
def test_token_ids_that_are_not_integers_are_refused_by_field(parser, ids):
    payload = (chat if parser == "chat" else completion)(
        ids=ids, logprobs=GOOD_LOGPROBS[: len(ids)] if isinstance(ids, list) else GOOD_LOGPROBS
    )
    with pytest.raises(UpstreamError, match=r"token_ids") as refused:
        PARSERS[parser](payload)
    assert refused.value.status == 502


@pytest.mark.parametrize("prompt", BAD_IDS, ids=repr)
def test_prompt_token_ids_that_are_not_integers_are_refused(prompt):
    with pytest.raises(UpstreamError, match="prompt_token_ids"):
        sample_from_chat(chat(prompt=prompt), 0)


@pytest.mark.parametrize("logprobs", BAD_LOGPROBS, ids=repr)
@pytest.mark.parametrize("parser", ["completion", "chunk"])
def test_logprobs_that_are_not_numbers_are_refused_by_field(parser, logprobs):
    with pytest.raises(UpstreamError, match="token_logprobs"):
        PARSERS[parser](completion(logprobs=logprobs))


@pytest.mark.parametrize("version", BAD_VERSIONS, ids=repr)
@pytest.mark.parametrize("parser", ["completion", "chunk", "chat"])
def test_a_policy_version_that_is_not_an_integer_is_refused(parser, version):
    build = chat if parser == "chat" else completion
    with pytest.raises(UpstreamError, match="policy_version"):
        PARSERS[parser](build(policy_version=version))


def test_good_answers_still_parse_exactly():
    sample = sample_from_completion(completion(policy_version=3), 0)
    assert sample.completion_ids.tolist() == GOOD_IDS and sample.policy_version == 3
    assert sample.logprobs.tolist() == GOOD_LOGPROBS
    piece = piece_from_chunk(completion(ids=[], logprobs=[]))
    assert piece.token_ids.tolist() == [] and piece.policy_version is None
    prompt, sample, _ = sample_from_chat(chat(logprobs=[0, -1.0]), 7)
    assert prompt.tolist() == [1, 2] and sample.policy_version == 7


class Upstream:
    """A loopback upstream answering `body` with `status`, keeping each request's head."""

    def __init__(self, body: dict, status: bytes = b"200 OK"):
        self.raw, self.status, self.heads = orjson.dumps(body), status, []

    async def serve(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head.decode())
        length = next(
            int(line.split(":")[1])
            for line in head.decode().lower().splitlines()
            if line.startswith("content-length")
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 " + self.status + b"\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(self.raw)).encode() + b"\r\n\r\n" + self.raw
        )
        await writer.drain()
        writer.close()


BODY = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def through_gateway(tmp_path, url_of):
    """(the client's answer, the episode's calls file, the closed record) of one call through a
    gateway whose upstream URL is `url_of(port)`, answering `upstream`."""

    async def go(upstream):
        server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
        policy = HttpPolicyClient(url_of(server.sockets[0].getsockname()[1]), timeout=5)
        _, client = gateway_client(policy, tmp_path / "ledger")
        try:
            async with client:
                answer = await client.post("/e/ep/v1/chat/completions", json=BODY)
                calls = (tmp_path / "ledger" / "ep.calls.jsonl").read_text()
                record = (await client.post("/e/ep/close", json={})).json()
        finally:
            await policy.aclose()
            server.close()
        return answer, calls, record

    return go


def test_a_non_integer_id_is_a_failed_call_naming_the_field(tmp_path):
    upstream = Upstream(completion(ids=[4, 1.5]))
    answer, calls, record = asyncio.run(
        through_gateway(tmp_path, lambda port: f"http://127.0.0.1:{port}")(upstream)
    )
    assert answer.status_code == 502
    assert "choices[0].token_ids holds 1.5" in answer.json()["error"]["message"]
    assert [c for a in record["agents"] for c in a["calls"]] == []
    assert "1.5" in record["meta"]["gateway"]["failed_calls"][0]["error"]
    assert all("failed" in json.loads(line) for line in calls.splitlines())


SECRET = "s3cr%40t-pw"  # percent-encoded '@' in the password


@pytest.mark.parametrize("answer", ["refused", "unreachable"])
def test_credentials_in_the_upstream_url_are_sent_as_auth_and_echoed_nowhere(tmp_path, answer):
    upstream = Upstream({"error": "overloaded"}, b"503 Service Unavailable")
    if answer == "unreachable":
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            closed_port = free.getsockname()[1]
    answered, calls, record = asyncio.run(
        through_gateway(
            tmp_path,
            lambda port: (
                f"http://trainer:{SECRET}@127.0.0.1:"
                f"{closed_port if answer == 'unreachable' else port}"
            ),
        )(upstream)
    )
    said = answered.text + calls + json.dumps(record)
    assert answered.status_code in (502, 503)
    for secret in (SECRET, "s3cr@t-pw", "trainer:"):
        assert secret not in said
    if answer == "refused":  # the credentials went as basic auth, not in the request line
        (head,) = upstream.heads
        token = base64.b64encode(b"trainer:s3cr@t-pw").decode()
        auth = [line for line in head.splitlines() if line.lower().startswith("authorization:")]
        assert [line.partition(":")[2].strip() for line in auth] == [f"Basic {token}"]
        assert SECRET not in head.splitlines()[0]


def test_credentials_and_a_token_together_are_refused():
    with pytest.raises(ValueError, match="not both"):
        HttpPolicyClient("http://u:p@127.0.0.1:1", token="t")
    assert HttpPolicyClient("http://127.0.0.1:1/").base_url == "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("host", "tokens", "warns"),
    [
        ("127.0.0.1", [], False),
        ("::1", [], False),
        ("localhost", [], False),
        ("0.0.0.0", [], True),
        ("::", [], True),
        ("10.1.2.3", [], True),
        ("gpu-box.internal", [], True),
        ("0.0.0.0", ["tok"], False),
    ],
)
def test_binding_beyond_loopback_without_a_token_warns(host, tokens, warns):
    warning = open_bind_warning(host, tokens)
    assert (warning is not None) == warns
    if warns:
        assert host in warning and "--token" in warning


@pytest.mark.parametrize("command", ["gateway", "serve-policy"])
def test_the_cli_warns_before_serving_beyond_loopback(tmp_path, monkeypatch, command):
    from typer.testing import CliRunner

    from callgrove.cli.app import app
    from callgrove.serving import web

    served = []
    monkeypatch.setattr(web, "serve", lambda app, host, port, ready: served.append(host))
    monkeypatch.delenv("CALLGROVE_TOKEN", raising=False)
    script = tmp_path / "s.json"
    script.write_text('{"rules": [], "default": "done"}')
    options = (
        ["--upstream", "http://127.0.0.1:1", "--ledger", str(tmp_path / "ledger")]
        if command == "gateway"
        else ["--script", str(script)]
    )
    opened = CliRunner().invoke(app, [command, *options, "--host", "0.0.0.0"])
    assert served == ["0.0.0.0"], opened.output
    assert "beyond loopback" in opened.output
    closed = CliRunner().invoke(app, [command, *options, "--host", "0.0.0.0", "--token", "t"])
    assert "beyond loopback" not in closed.output and served == ["0.0.0.0"] * 2


def test_a_gateway_that_stops_gives_up_its_ledger_folder_at_once(tmp_path, monkeypatch):
    import gc

    from typer.testing import CliRunner

    from callgrove.cli.app import app
    from callgrove.gateway.ledger import LedgerLock
    from callgrove.serving import web

    monkeypatch.setattr(web, "serve", lambda app, host, port, ready: None)  # serves, then stops
    ledger = tmp_path / "ledger"
    gc.disable()  # the lock must not wait for the collector to free the stopped gateway
    try:
        done = CliRunner().invoke(
            app, ["gateway", "--upstream", "http://127.0.0.1:1", "--ledger", str(ledger)]
        )
        assert done.exit_code == 0, done.output
        LedgerLock(ledger).release()  # a second gateway may take the folder now
    finally:
        gc.enable()
