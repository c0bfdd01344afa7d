"""The HTTP policy client's failures: each becomes an `UpstreamError` with the status to answer."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from callgrove.policy import SamplingParams
from callgrove.policy.http import HttpPolicyClient, UpstreamError


def sample_from(url: str, timeout: float = 5.0) -> UpstreamError:
    async def go():
        client = HttpPolicyClient(url, timeout=timeout)
        try:
            with pytest.raises(UpstreamError) as caught:
                await client.sample(np.arange(5, dtype=np.int32), SamplingParams(max_tokens=4))
        finally:
            await client.aclose()
        return caught.value

    return asyncio.run(go())


def test_a_closed_port_is_unreachable_502():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    error = sample_from(f"http://127.0.0.1:{port}")
    assert error.status == 502 and "unreachable" in str(error)


def test_a_server_that_never_answers_times_out_504():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        error = sample_from(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
    assert error.status == 504 and "timed out" in str(error)


def test_an_error_status_and_a_body_without_token_ids_are_refused():
    async def serve(reader, writer, status: bytes, body: bytes):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        await writer.drain()
        writer.close()

    async def go(status: bytes, body: bytes):
        server = await asyncio.start_server(lambda r, w: serve(r, w, status, body), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = HttpPolicyClient(f"http://127.0.0.1:{port}")
        try:
            with pytest.raises(UpstreamError) as caught:
                await client.sample(np.arange(3, dtype=np.int32), SamplingParams(max_tokens=2))
        finally:
            await client.aclose()
            server.close()
        return caught.value

    overloaded = asyncio.run(go(b"503 Service Unavailable", b'{"error": "overloaded"}'))
    assert overloaded.status == 503 and "overloaded" in str(overloaded)
    bare = asyncio.run(go(b"200 OK", b'{"choices": [{"text": "hi"}]}'))
    assert bare.status == 502 and "return_token_ids" in str(bare)


def _answering(body: dict):
    """A one-route upstream answering `body` (JSON) to every request, and its URL."""
    import orjson

    raw = orjson.dumps(body)

    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
        )
        await writer.drain()
        writer.close()

    return serve


def sampled(body: dict, params: SamplingParams, **options):
    async def go():
        server = await asyncio.start_server(_answering(body), "127.0.0.1", 0)
        client = HttpPolicyClient(
            f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", **options
        )
        try:
            return await client.sample(np.arange(3, dtype=np.int32), params)
        finally:
            await client.aclose()
            server.close()

    return asyncio.run(go())


ANSWER = {"choices": [{"token_ids": [4, 5], "logprobs": {"token_logprobs": [-0.5, -1.0]}}]}
TEMPERED = SamplingParams(max_tokens=2, temperature=0.5, top_p=0.9)


def test_the_sampling_an_upstream_names_is_recorded():
    named = {"temperature": 0.5, "top_p": 0.9, "top_k": None, "engine": "serve-policy"}
    assert sampled({**ANSWER, "sampling": named}, TEMPERED).sampling == named
    with pytest.raises(UpstreamError, match="top_p"):
        sampled({**ANSWER, "sampling": {"temperature": 0.5, "top_p": 7}}, TEMPERED)


def test_untold_logprobs_are_recorded_only_where_they_cannot_be_untempered():
    whole = SamplingParams(max_tokens=2)
    assert sampled(ANSWER, whole).sampling == {"temperature": 1.0, "top_p": 1.0, "top_k": None}
    with pytest.raises(UpstreamError, match="processed_logprobs") as refused:
        sampled(ANSWER, TEMPERED)
    assert refused.value.status == 400
    told = sampled(ANSWER, TEMPERED, tempered_logprobs=True)
    assert told.sampling == {"temperature": 0.5, "top_p": 0.9, "top_k": None}
