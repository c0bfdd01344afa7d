"""serve-policy: completions and chat, whole and streamed, with vLLM's token extras."""

from __future__ import annotations

import asyncio

import numpy as np

from callgrove.chat import BuiltinFormat, Message
from callgrove.policy.script import SCRIPT_LOGPROB, Script, newest_messages
from gateway.helpers import policy_client, scripted, sse_events, write_script

RULES = [
    {
        "when": "weather",
        "reply": {
            "text": "Checking.",
            "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}],
        },
    },
    {"when": "hello", "reply": "Hi there!", "times": 1},
]


def run(coroutine):
    return asyncio.run(coroutine)


def test_completion_from_token_ids_carries_token_extras_and_version(tmp_path):
    async def go():
        async with policy_client(scripted(write_script(tmp_path / "s.json", RULES))) as client:
            prompt = BuiltinFormat().render([Message("user", "hello")]).tolist()
            body = {
                "prompt": prompt,
                "logprobs": 0,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
            }
            return (await client.post("/v1/completions", json=body)).json()

    payload = run(go())
    choice = payload["choices"][0]
    expected = BuiltinFormat().completion(Message("assistant", "Hi there!"), None).tolist()
    assert choice["token_ids"] == expected
    assert (
        payload["prompt_token_ids"] == BuiltinFormat().render([Message("user", "hello")]).tolist()
    )
    assert choice["logprobs"]["token_logprobs"] == [SCRIPT_LOGPROB] * len(expected)
    assert choice["logprobs"]["tokens"][0] == f"token_id:{expected[0]}"
    assert choice["text"].startswith("Hi there!")
    assert payload["policy_version"] == 0
    assert payload["usage"]["completion_tokens"] == len(expected)


def test_text_prompt_and_times_limit_fall_back_to_default(tmp_path):
    async def go():
        async with policy_client(scripted(write_script(tmp_path / "s.json", RULES))) as client:
            prompt = "<|start|>user\nhello"  # text prompts are byte-encoded: no turn markers
            first = (await client.post("/v1/completions", json={"prompt": prompt})).json()
            second = (await client.post("/v1/completions", json={"prompt": prompt})).json()
            return first, second

    first, second = run(go())
    assert first["choices"][0]["text"].startswith("Hi there!")
    assert second["choices"][0]["text"].startswith("done")  # the rule fired its one time


def test_streamed_completion_chunks_add_up(tmp_path):
    async def go():
        async with policy_client(scripted(write_script(tmp_path / "s.json", RULES))) as client:
            prompt = BuiltinFormat().render([Message("user", "weather please")]).tolist()
            whole = (
                await client.post("/v1/completions", json={"prompt": prompt, "logprobs": 0})
            ).json()
            streamed = await client.post(
                "/v1/completions", json={"prompt": prompt, "logprobs": 0, "stream": True}
            )
            return whole, sse_events(streamed.text)

    whole, events = run(go())
    assert events[-1][1] == "[DONE]"
    chunks = [data for _, data in events[:-1]]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == whole["choices"][0][
        "token_ids"
    ]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["policy_version"] == 0 for c in chunks)


def test_chat_completion_parses_tool_calls_whole_and_streamed(tmp_path):
    async def go():
        async with policy_client(scripted(write_script(tmp_path / "s.json", RULES))) as client:
            body = {"messages": [{"role": "user", "content": "weather in Oslo?"}], "logprobs": True}
            whole = (await client.post("/v1/chat/completions", json=body)).json()
            streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
            return whole, sse_events(streamed.text)

    whole, events = run(go())
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert call["function"]["arguments"] == '{"city":"Oslo"}'
    assert choice["message"]["content"] == "Checking."
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert whole["prompt_token_ids"][-1] == ord("\n")
    first = events[0][1]
    assert first["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert first["prompt_token_ids"] == whole["prompt_token_ids"]
    assert events[1][1]["choices"][0]["finish_reason"] == "tool_calls"
    assert events[-1][1] == "[DONE]"


def test_tokens_body_limit_and_bad_prompts_are_refused(tmp_path):
    async def go():
        policy = scripted(write_script(tmp_path / "s.json", RULES))
        async with policy_client(policy, tokens=["secret"], body_limit=1000) as client:
            no_key = await client.post("/v1/completions", json={"prompt": "x"})
            headers = {"authorization": "Bearer secret"}
            big = await client.post("/v1/completions", json={"prompt": "x" * 2000}, headers=headers)
            bad = await client.post("/v1/completions", json={"prompt": [1.5]}, headers=headers)
            ok = await client.get("/v1/models", headers=headers)
            return no_key, big, bad, ok

    no_key, big, bad, ok = run(go())
    assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"
    assert big.status_code == 413
    assert bad.status_code == 400 and "prompt" in bad.json()["error"]["message"]
    assert ok.json()["data"][0]["policy_version"] == 0


def test_newest_messages_are_those_after_the_last_assistant_turn():
    chat = BuiltinFormat()
    history = [Message("user", "first"), Message("assistant", "answer"), Message("user", "second")]
    tail = chat.decode(newest_messages(chat, chat.render(history)))
    assert "second" in tail and "first" not in tail and "answer" not in tail


def test_bad_script_names_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"rules": [{"when": "x", "reply": {"tool_calls": [{}]}}]}')
    try:
        Script.load(path)
    except Exception as error:
        assert str(path) in str(error) and "name" in str(error)
    else:
        raise AssertionError("a tool call without a name must be refused")
    assert np.isclose(SCRIPT_LOGPROB, -0.25)
