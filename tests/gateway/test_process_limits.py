"""A gateway process at its limits: a streamed call whose upstream's first line (the whole
prompt's token ids) is far past aiohttp's 512 KiB line cap, and hundreds of episodes that are
never closed (what a crashed harness leaves) under a low descriptor limit."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from .helpers import server_process, sse_events, write_script

pytestmark = pytest.mark.processes

OPEN_FILES = 128  # the gateway's descriptor limit
EPISODES = 300  # open at once: more than the limit
LONG = "x" * 300_000  # 300,000 byte-format tokens: "120," each, a first line of 1.2 MB
APIS = {
    "chat": ("/v1/chat/completions", {}),
    "messages": ("/v1/messages", {"anthropic-version": "2023-06-01"}),
    "responses": ("/v1/responses", {}),
}
TERMINAL = {"chat": "[DONE]", "messages": "message_stop", "responses": "response.completed"}


def body_for(api: str, text: str, stream: bool) -> dict:
    if api == "responses":
        return {"model": "m", "input": text, "stream": stream, "max_output_tokens": 16}
    return {
        "model": "m",
        "max_tokens": 16,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    }


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("limits")
    script = write_script(folder / "script.json", [], "done")
    ledger = folder / "ledger"
    with (
        server_process("serve-policy", "--script", str(script)) as (_, upstream),
        server_process(
            "gateway", "--upstream", upstream, "--ledger", str(ledger), open_files=OPEN_FILES
        ) as (gateway, url),
    ):
        yield upstream, gateway, url, ledger


def test_the_upstreams_first_line_really_is_over_a_mebibyte(servers):
    upstream, *_ = servers
    body = {"model": "m", "prompt": LONG, "max_tokens": 4, "stream": True}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{upstream}/v1/completions", json=body) as response,
    ):
        first = next(response.iter_lines())
    assert len(first) > 1024 * 1024
    assert len(json.loads(first[len("data: ") :])["prompt_token_ids"]) == len(LONG)


@pytest.mark.parametrize("api", APIS)
def test_a_streamed_call_with_a_prompt_past_the_line_cap_is_answered_and_recorded(servers, api):
    _, _, url, ledger = servers
    path, headers = APIS[api]
    with httpx.Client(base_url=url, timeout=120) as client:
        answered = client.post(
            f"/e/long-{api}{path}", json=body_for(api, LONG, True), headers=headers
        )
    assert answered.status_code == 200, answered.text[:500]
    events = sse_events(answered.text)
    assert TERMINAL[api] in {name or data for name, data in events if name or data == "[DONE]"}
    (line,) = [json.loads(x) for x in (ledger / f"long-{api}.calls.jsonl").read_text().splitlines()]
    assert "failed" not in line
    assert len(line["prompt_ids"]) > len(LONG)  # the whole prompt, and the chat markup


def test_episodes_never_closed_hold_no_descriptors_and_the_gateway_stays_up(servers):
    _, gateway, url, _ = servers
    with httpx.Client(base_url=url, timeout=60) as client:
        before = client.get("/health").json()["episodes"]
        for number in range(EPISODES):
            answered = client.post(
                f"/e/open-{number}/v1/chat/completions", json=body_for("chat", "hi", False)
            )
            assert answered.status_code == 200, (number, answered.text)
        descriptors = len(os.listdir(f"/proc/{gateway.pid}/fd"))
        health = client.get("/health")
        closed = [
            client.post(f"/e/open-{number}/close", json={"rewards": {"r": 1.0}})
            for number in (0, EPISODES // 2, EPISODES - 1)
        ]
    assert descriptors < OPEN_FILES // 2  # none held per episode
    assert health.status_code == 200 and health.json()["episodes"] == before + EPISODES
    for close in closed:
        assert close.status_code == 200, close.text
        assert [len(agent["calls"]) for agent in close.json()["agents"]] == [1]
