"""The policy version read from a server that names none in its responses (`ServerVersions`),
against a stand-in speaking vLLM's shapes: a pushed LoRA adapter's name (`NAME-vN` on
`/v1/models`, `latest` for the newest), the weight version on `/weight_info` read around the
call, and what is recorded where neither tells (the client's newest, 0 before any). The real
server is in tests/gateway/test_vllm_gateway.py."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiohttp import web

from callgrove.policy import SamplingParams
from callgrove.policy.http import HttpPolicyClient, adapter_version

PROMPT = np.asarray([1, 2, 3], np.int32)
PARAMS = SamplingParams(max_tokens=2)


class StandIn:
    """Answers like vLLM: `models` listed as (id, parent), `weight` on /weight_info (None: no
    such path), `during_call` run while a call is being sampled."""

    def __init__(self, models, weight: str | None = "default", during_call=None):
        self.models = models
        self.weight = weight
        self.during_call = during_call or (lambda: None)
        self.asked: list[str] = []
        self.weight_reads = 0
        self.unknown_once: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.listing)
        app.router.add_get("/weight_info", self.weight_info)
        app.router.add_post("/v1/completions", self.complete)
        return app

    async def listing(self, _request):
        data = [{"id": name, "object": "model", "parent": parent} for name, parent in self.models]
        return web.json_response({"object": "list", "data": data})

    async def weight_info(self, _request):
        self.weight_reads += 1
        if self.weight is None:
            raise web.HTTPNotFound()
        return web.json_response({"weight_version": self.weight})

    async def complete(self, request):
        body = await request.json()
        self.asked.append(body["model"])
        if body["model"] in self.unknown_once:
            self.unknown_once.discard(body["model"])
            return web.json_response({"error": "model does not exist"}, status=404)
        self.during_call()
        choice = {"token_ids": [7, 8], "logprobs": {"token_logprobs": [-0.1, -0.2]}}
        if body.get("stream"):
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await response.prepare(request)
            for i, token in enumerate(choice["token_ids"]):
                chunk = {
                    "choices": [
                        {
                            "token_ids": [token],
                            "logprobs": {"token_logprobs": [-0.1]},
                            "finish_reason": "length" if i else None,
                        }
                    ]
                }
                await response.write(f"data: {web.json_response(chunk).text}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            return response
        return web.json_response({"choices": [{**choice, "finish_reason": "length"}]})


def calls(stand_in: StandIn, model: str, n: int = 1, stream: bool = False, versions=True):
    """The versions of `n` calls of a client asking for `model`, and the client."""

    async def go():
        runner = web.AppRunner(stand_in.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        client = HttpPolicyClient(f"http://127.0.0.1:{port}", model=model, server_versions=versions)
        try:
            found = []
            for _ in range(n):
                if stream:
                    pieces = [p async for p in client.stream(PROMPT, PARAMS)]
                    found.append([p.policy_version for p in pieces])
                else:
                    found.append((await client.sample(PROMPT, PARAMS)).policy_version)
            return found, client
        finally:
            await client.aclose()
            await runner.cleanup()

    return asyncio.run(go())


BASE_AND_ADAPTERS = [("policy", None), ("policy-v3", "policy"), ("policy-v12", "policy")]


def test_a_pushed_adapter_named_is_its_version():
    stand_in = StandIn(BASE_AND_ADAPTERS, weight="40")
    found, _ = calls(stand_in, "policy-v3", n=2)
    assert found == [3, 3]
    assert stand_in.asked == ["policy-v3"] * 2


def test_latest_asks_for_the_newest_adapter_listed_on_every_call():
    stand_in = StandIn(BASE_AND_ADAPTERS)
    found, _ = calls(stand_in, "latest")
    assert found == [12] and stand_in.asked == ["policy-v12"]  # 12 > 3: by number, not text
    stand_in.models = [("policy", None), ("policy-v13", "policy")]
    stand_in.unknown_once = {"policy-v13"}  # unloaded between listing and call: asked again
    found, _ = calls(stand_in, "latest")
    assert found == [13] and stand_in.asked[1:] == ["policy-v13", "policy-v13"]


def test_latest_with_no_adapter_asks_for_the_base_model_and_reads_its_weight_version():
    stand_in = StandIn([("policy", None)], weight="2")
    found, _ = calls(stand_in, "latest")
    assert found == [2] and stand_in.asked == ["policy"]


def test_a_base_model_whose_name_looks_like_an_adapter_names_no_version():
    stand_in = StandIn([("llama-v2", None)], weight="default")
    found, _ = calls(stand_in, "llama-v2")
    assert found == [0]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_full_weights_are_the_weight_version_read_before_and_after_the_call(stream):
    stand_in = StandIn([("policy", None)], weight="5")
    found, _ = calls(stand_in, "policy", stream=stream)
    assert found == ([[5, 5]] if stream else [5])
    assert stand_in.weight_reads == 2


def test_a_push_landing_while_the_call_waited_leaves_its_version_unknown():
    """Read 5 before and 6 after: either could have sampled it, so the client's newest is
    recorded (documented), not the reading before."""
    stand_in = StandIn([("policy", None)], weight="5")
    stand_in.during_call = lambda: setattr(stand_in, "weight", "6")
    found, client = calls(stand_in, "policy")
    assert found == [6] == [client.version]


@pytest.mark.parametrize("weight", [None, "default", "v3", "-1"], ids=repr)
def test_no_integer_weight_version_records_the_clients_newest(weight):
    stand_in = StandIn([("policy", None)], weight=weight)
    found, _ = calls(stand_in, "policy", n=2)
    assert found == [0, 0]
    if weight is None:  # a server without /weight_info is asked once, not on every call
        assert stand_in.weight_reads == 1


def test_a_client_not_told_to_read_versions_asks_nothing_more():
    stand_in = StandIn(BASE_AND_ADAPTERS, weight="9")
    found, _ = calls(stand_in, "policy-v3", versions=False)
    assert found == [0] and stand_in.weight_reads == 0


@pytest.mark.parametrize(
    ("name", "version"),
    [("policy-v0", 0), ("policy-v17", 17), ("a-b-v2", 2), ("policy-v01", None), ("v3", None)],
)
def test_adapter_names(name, version):
    assert adapter_version(name) == version
