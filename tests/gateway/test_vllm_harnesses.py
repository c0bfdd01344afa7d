"""The real Claude Code and Codex CLIs through the gateway to the session's real vLLM server of
SmolLM2-135M-Instruct (`tests/conftest.py`), and `callgrove train` over a harness environment
sampling with that server.

SmolLM2 has an 8,192-token context (the session server allows 1,024), and both CLIs' default
first requests are longer: Claude Code 2.1.332's renders to about 20,750 tokens, Codex 0.169's
to about 8,640. The runs here therefore ask each CLI for a small request through its own
options (`SMALL_REQUEST`): Claude Code without built-in tools and with a one-line system prompt
(about 420 tokens), Codex with a one-line instruction file and its tools and instruction
sections turned off (about 100 tokens). The gateway caps completions at `MAX_TOKENS`. Every
recorded call must then be what vLLM sampled, token for token: its logprobs equal a
teacher-forced Hugging Face forward of the same weights over the recorded prompt and
completion, and the episode passes `callgrove check`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from callgrove.episode import load
from callgrove.gateway.harness import run_harness
from callgrove.gateway.ledger import EPISODES_FILE

from .helpers import server_process
from .test_real_harnesses import check_cli, cli
from .test_vllm_gateway import teacher_forced

# One worker runs every vLLM test, so `pytest -n 2` starts one session server, not two.
pytestmark = [pytest.mark.vllm, pytest.mark.harness, pytest.mark.xdist_group("vllm")]
# A question SmolLM2 often answers briefly, so a run ends in a few short calls.
PROMPT = "What is 2+2? Answer with a number only."
MAX_TOKENS = 48
INSTRUCTIONS = "You are a helpful assistant."
CODEX_OFF = (
    "include_environment_context=false",
    "include_apps_instructions=false",
    "include_collaboration_mode_instructions=false",
    "skills.include_instructions=false",
    "features.shell_tool=false",
    "features.view_image=false",
    "features.multi_agent=false",
    "features.goals=false",
    'web_search="disabled"',
    "tools.experimental_request_user_input.enabled=false",
)


def small_request(harness: str, folder: Path) -> list[str]:
    """The CLI options that keep its requests within SmolLM2's context (see the module)."""
    if harness == "claude-code":
        return ["--tools", "", "--system-prompt", INSTRUCTIONS]
    instructions = folder / "instructions.md"
    instructions.write_text(INSTRUCTIONS + "\n")
    settings = (f"model_instructions_file={json.dumps(str(instructions))}", *CODEX_OFF)
    return [arg for setting in settings for arg in ("-c", setting)]


@pytest.fixture(scope="module")
def smollm2_model():
    from callgrove.networks.hf import load_model

    torch.set_num_threads(2)
    model, tokenizer = load_model("smollm2-135m")
    return model.eval(), tokenizer


def assert_recorded_as_sampled(episode, model, tokenizer) -> None:
    """Every call's logprobs are the teacher-forced ones of its recorded tokens, and each later
    call of an agent extends its previous call's tokens."""
    for agent in episode.agents:
        for earlier, later in zip(agent.calls, agent.calls[1:], strict=False):
            assert later.prompt_from == earlier.id
        for call in agent.calls:
            completion = call.completion_ids
            assert len(call.logprobs) == len(completion) > 0
            want = teacher_forced(model, episode.prompt_ids(call), completion, call.sampling)
            np.testing.assert_allclose(call.logprobs, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_a_harness_through_the_gateway_to_vllm_is_recorded_token_exact(
    tmp_path, vllm_url, smollm2_folder, smollm2_model, harness
):
    model, tokenizer = smollm2_model
    ledger = tmp_path / "ledger"
    args = (
        *("gateway", "--upstream", vllm_url, "--upstream-model", "policy"),
        *("--model", f"hf:{smollm2_folder}", "--upstream-processed-logprobs"),
        *("--ledger", str(ledger), "--max-tokens", str(MAX_TOKENS)),
    )
    with server_process(*args, timeout=300) as (_, gateway):
        run = run_harness(
            harness,
            PROMPT,
            gateway,
            f"vllm-{harness}",
            tmp_path / "runs",
            cli=cli("claude" if harness == "claude-code" else "codex"),
            timeout=240,
            extra_args=small_request(harness, tmp_path),
        )
    (episode,) = load(ledger / EPISODES_FILE)
    assert "failed_calls" not in (episode.meta or {}).get("gateway", {}), episode.meta
    (leader,) = episode.agents
    assert leader.start == "root" and leader.calls
    assert PROMPT in tokenizer.decode(episode.prompt_ids(leader.calls[0]))
    last = tokenizer.decode(leader.calls[-1].completion_ids, skip_special_tokens=True).strip()
    if harness == "codex":
        # Codex ends its turn on a completion cut at the cap: one call, its text the answer.
        assert run.returncode == 0, run.stderr[-2000:]
        assert len(leader.calls) == 1
        messages = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        said = [
            m["item"]["text"]
            for m in messages
            if m.get("type") == "item.completed" and m["item"]["type"] == "agent_message"
        ]
        assert said[-1].strip() == last
    else:
        # Claude Code asks again after a completion cut at the cap ("Output token limit hit"),
        # up to three times, and ends the turn on an answer that stopped by itself. It says
        # how many calls it made; the gateway recorded each of them.
        result = json.loads(run.stdout)
        assert result["num_turns"] == len(leader.calls)
        if run.returncode == 0:
            assert result["result"].strip() == last
        else:
            assert (run.returncode, result.get("api_error")) == (1, "max_output_tokens"), result
    assert_recorded_as_sampled(episode, model, tokenizer)
    check_cli(ledger)


def test_callgrove_train_over_codex_samples_with_vllm_and_pushes_each_step(
    tmp_path, vllm_weights_restored, smollm2_folder, train_cli
):
    """Two steps over real Codex: the environment's in-process gateway renders Codex's requests
    with SmolLM2's template and samples them from vLLM (`[model.vllm]`); after step 1 the
    learner's weights are pushed into the server, and step 2's calls carry version 1."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder)
    runs, out = tmp_path / "runs", tmp_path / "out"
    # Episode ids are GROUP-NUMBER-LAUNCH and the work folder RUNS/EPISODE/work: each group's
    # first episode scores 1, its second 0, so every step has an advantage and changes weights.
    check = 'case "$(basename "$(dirname "$PWD")")" in *-0-????????) exit 0;; esac; exit 1'
    config = tmp_path / "train.toml"
    config.write_text(
        f"""
[run]
steps = 2
out = "{out}"
[env]
name = "callgrove.orchestrator.envs.harness:HarnessEnvironment"
[env.options]
harness = "codex"
tasks = [{{prompt = {json.dumps(PROMPT)}, check = {json.dumps(check)}}}]
folder = "{runs}"
timeout = 240
cli = "{cli("codex")}"
extra_args = {json.dumps(small_request("codex", tmp_path))}
[model]
name = "smollm2-135m"
[model.vllm]
urls = ["{vllm_weights_restored}"]
[sampling]
max_tokens = 16
temperature = 0.7
top_p = 0.9
[dispatch]
group_size = 2
groups_per_step = 1
max_in_flight = 2
max_off_policy_steps = 0
[algorithm]
name = "grpo"
[train]
learning_rate = 1e-4
[degeneracy]
drop = []
[monitor]
live = false
plot = false
"""
    )
    train_cli(config)
    for step in (1, 2):
        lines = (out / f"step_{step}/train/traces.jsonl").read_text().splitlines()
        traces = [json.loads(line) for line in lines]
        assert len(traces) == 2 and all(t["ok"] for t in traces), traces
        assert sorted(t["rewards"]["check"] for t in traces) == [0.0, 1.0]
        for trace in traces:
            (leader,) = trace["agents"]
            (call,) = leader["calls"]
            # Codex's request in SmolLM2's chat format, sampled by the weights of the step
            # before: step 2 by the version step 1 pushed.
            assert PROMPT in tokenizer.decode(call["prompt_ids"])
            assert call["policy_version"] == step - 1
            assert call["sampling"]["temperature"] == 0.7
    metrics = [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if '"final"' not in line
    ]
    assert [m["policy/version"] for m in metrics] == [1, 2]
    for m in metrics:
        # The learner scores each step's calls with the weights it holds at that step; the
        # server sampled step 2 with the weights step 1 made, else this would be far from zero.
        assert m["train/mismatch/on_policy/mean_abs"] < 1e-4
        assert 0 < m["time/weight_push_s"] < 60
    trained = torch.load(out / "checkpoint.pt", weights_only=False)["learner"]["weights"]
    initial = load_file(smollm2_folder / "model.safetensors")
    assert any(not torch.equal(w, initial[n]) for n, w in trained.items())
    # The same calls were closed into the in-process gateway's ledger and check clean.
    closed = [
        json.loads(line) for line in (runs / "ledger" / EPISODES_FILE).read_text().splitlines()
    ]
    assert len(closed) >= 4
    check_cli(runs / "ledger")
