"""An upstream answer that cannot be a call is the upstream's fault, whichever API the client
speaks and whichever way the gateway asks (token prompt, stream or pass-through): a 502 in the
client's API error shape and a `failed` ledger line, never the client's 400 and never a call."""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest

from callgrove.policy.http import HttpPolicyClient

from .helpers import CannedUpstream, gateway_client

IDS, LOGPROBS = [65, 66], [-0.5, -0.25]
GOOD_MESSAGE = {"role": "assistant", "content": "AB"}


def completion_choice(**changed):
    return {
        "token_ids": IDS,
        "logprobs": {"token_logprobs": LOGPROBS},
        "finish_reason": "stop",
        **changed,
    }


def chat_answer(message=GOOD_MESSAGE, **changed):
    choice = {
        "message": message,
        "token_ids": IDS,
        "logprobs": {"content": [{"logprob": v} for v in LOGPROBS]},
        "finish_reason": "stop",
    }
    return {"prompt_token_ids": [1, 2, 3], "choices": [{**choice, **changed}]}


# Pass-through answers (the upstream's `/v1/chat/completions`): each malformed in one place.
PASSTHROUGH = {
    "message a string": chat_answer("AB"),
    "message role wizard": chat_answer({"role": "wizard", "content": "AB"}),
    "message role user": chat_answer({"role": "user", "content": "AB"}),
    "message content a number": chat_answer({"role": "assistant", "content": 5}),
    "tool_calls a string": chat_answer({"role": "assistant", "tool_calls": "abc"}),
    "tool call function a number": chat_answer(
        {"role": "assistant", "tool_calls": [{"id": "a", "function": 5}]}
    ),
    "tool call name a number": chat_answer(
        {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": 5}}]}
    ),
    "no choices": {"prompt_token_ids": [1, 2, 3]},
    "choices empty": {"prompt_token_ids": [1, 2, 3], "choices": []},
    "choices an object": {"prompt_token_ids": [1, 2, 3], "choices": {"0": 1}},
    "choice a list": {"prompt_token_ids": [1, 2, 3], "choices": [[1]]},
    "logprobs a list": chat_answer(logprobs=[1]),
    "logprobs content a string": chat_answer(logprobs={"content": "x"}),
    "logprob entry a number": chat_answer(logprobs={"content": [1, 2]}),
    "token_ids a string": chat_answer(token_ids="AB"),
    "prompt_token_ids an object": {**chat_answer(), "prompt_token_ids": {"a": 1}},
}
# Token-prompt answers (the upstream's `/v1/completions`).
COMPLETIONS = {
    "no choices": {},
    "choices a string": {"choices": "x"},
    "choice a list": {"choices": [[1]]},
    "token_ids an object": {"choices": [completion_choice(token_ids={"a": 1})]},
    "logprobs a list": {"choices": [completion_choice(logprobs=[1, 2])]},
    "token_logprobs a string": {"choices": [completion_choice(logprobs={"token_logprobs": "x"})]},
    "sampling a string": {"choices": [completion_choice()], "sampling": "greedy"},
    "policy_version negative": {"choices": [completion_choice()], "policy_version": -1},
}
# Streamed answers: SSE bodies.
STREAMS = {
    "chunk a list": b"data: [1]\n\n",
    "chunk not JSON": b"data: {oops\n\n",
    "chunk without choices": b'data: {"id": "x"}\n\n',
    "choice a string": b'data: {"choices": ["x"]}\n\n',
    "nothing but the end": b"data: [DONE]\n\n",
}
NOT_JSON = {"an HTML page": b"<html>bad gateway</html>", "a JSON list": b"[1, 2]"}

APIS = {
    "chat": ("/v1/chat/completions", {}),
    "messages": ("/v1/messages", {"anthropic-version": "2023-06-01"}),
    "responses": ("/v1/responses", {}),
}


def request_body(api: str, stream: bool) -> dict:
    if api == "responses":
        return {"model": "m", "input": "hi", "stream": stream, "max_output_tokens": 8}
    return {
        "model": "m",
        "max_tokens": 8,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    }


def one_call(tmp_path, api: str, answer: bytes, *, passthrough=False, stream=False):
    """(status, error object, ledger lines, closed record) of one call whose upstream gives
    `answer` (with status 200)."""
    kind = "text/event-stream" if stream else "application/json"

    async def go():
        async with CannedUpstream(lambda path, body: ("200 OK", kind, answer)) as upstream:
            policy = HttpPolicyClient(upstream.url, timeout=10)
            _, client = gateway_client(policy, tmp_path / "ledger", passthrough=passthrough)
            path, headers = APIS[api]
            try:
                async with client:
                    answered = await client.post(
                        f"/e/ep{path}", json=request_body(api, stream), headers=headers
                    )
                    lines = (tmp_path / "ledger" / "ep.calls.jsonl").read_text().splitlines()
                    record = (await client.post("/e/ep/close", json={})).json()
            finally:
                await policy.aclose()
        return answered, [json.loads(line) for line in lines], record

    answered, lines, record = asyncio.run(go())
    return answered, lines, record


def check_upstream_fault(api: str, answered, lines: list[dict], record: dict) -> None:
    assert answered.status_code == 502, answered.text
    error = answered.json()
    if api == "messages":  # Anthropic's error shape
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
    else:
        assert error["error"]["code"] == 502 and error["error"]["type"] == "upstream_error"
    assert "upstream" in (error["error"]["message"])
    assert [list(line) for line in lines] == [["failed"]]  # one failed line, no call
    assert [c for a in record["agents"] for c in a["calls"]] == []
    assert len(record["meta"]["gateway"]["failed_calls"]) == 1


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("case", [*PASSTHROUGH, *NOT_JSON])
def test_a_malformed_passthrough_answer_is_a_502_and_a_failed_line(tmp_path, api, case):
    answer = NOT_JSON[case] if case in NOT_JSON else orjson.dumps(PASSTHROUGH[case])
    check_upstream_fault(api, *one_call(tmp_path, api, answer, passthrough=True))


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("case", [*COMPLETIONS, *NOT_JSON])
def test_a_malformed_completion_is_a_502_and_a_failed_line(tmp_path, api, case):
    answer = NOT_JSON[case] if case in NOT_JSON else orjson.dumps(COMPLETIONS[case])
    check_upstream_fault(api, *one_call(tmp_path, api, answer))


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("case", STREAMS)
def test_a_malformed_stream_before_its_first_piece_is_a_502_and_a_failed_line(tmp_path, api, case):
    check_upstream_fault(api, *one_call(tmp_path, api, STREAMS[case], stream=True))


def test_a_well_formed_passthrough_answer_is_still_a_call(tmp_path):
    answered, _, record = one_call(tmp_path, "chat", orjson.dumps(chat_answer()), passthrough=True)
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == "AB"
    (call,) = record["agents"][0]["calls"]
    assert call["completion_ids"] == IDS and call["logprobs"] == LOGPROBS


def long_stream(prompt_tokens: int) -> bytes:
    """A stream whose first event carries `prompt_tokens` prompt ids, as vLLM's does."""
    first = {"prompt_token_ids": [65] * prompt_tokens, "choices": [completion_choice()]}
    return b"data: " + orjson.dumps(first) + b"\n\ndata: [DONE]\n\n"


@pytest.mark.parametrize("api", APIS)
def test_a_first_line_past_aiohttps_cap_is_read(tmp_path, api):
    answer = long_stream(400_000)  # a 1.6 MB line: aiohttp's own cap is 512 KiB
    answered, lines, record = one_call(tmp_path, api, answer, stream=True)
    assert answered.status_code == 200, answered.text[:300]
    (line,) = lines
    assert "failed" not in line
    (call,) = record["agents"][0]["calls"]
    assert call["completion_ids"] == IDS


def test_a_line_past_the_documented_limit_is_an_upstream_error(tmp_path, monkeypatch):
    from callgrove.policy import http

    monkeypatch.setattr(http, "UPSTREAM_EVENT_LIMIT", 1024 * 1024)
    answered, lines, record = one_call(tmp_path, "chat", long_stream(400_000), stream=True)
    check_upstream_fault("chat", answered, lines, record)
    assert "1048576-byte limit" in answered.json()["error"]["message"]
