"""Real Claude Code and Codex CLIs, offline in loopback-only namespaces, through the gateway.

The CLIs are installed by the test command (`make test` puts pinned releases in `.harness/`);
a missing CLI fails these tests rather than skipping them. Each run is scripted by
`serve-policy --script`, so the episode the gateway closes must have exactly the agents, starts,
parents and per-agent call counts the script made the harness produce, and pass `callgrove check`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from callgrove.chat import BuiltinFormat
from callgrove.gateway.harness import run_harness
from callgrove.gateway.ledger import EPISODES_FILE
from callgrove.transcripts import ImportReport, import_claude_code, import_codex

from .helpers import SRC, server_process, write_script

pytestmark = pytest.mark.harness

BIN = Path(__file__).resolve().parents[2] / ".harness" / "node_modules" / ".bin"


def cli(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{path} is missing: `make test` installs the pinned harness CLIs there"
    return str(path)


def agent(spawn_prompt: str, background: bool | None = False) -> dict:
    arguments = {
        "description": "helper",
        "prompt": spawn_prompt,
        "subagent_type": "general-purpose",
    }
    if background is not None:
        arguments["run_in_background"] = background
    return {"name": "Agent", "arguments": arguments}


CLAUDE_SCRIPT = [
    {"when": "NESTED-B", "reply": "B says 7"},
    {"when": "B says 7", "reply": "A relays 7"},
    {
        "when": "TASK-A",
        "reply": {"text": "A delegates.", "tool_calls": [agent("NESTED-B: give a number")]},
    },
    {"when": "BG-C", "reply": "C background done"},
    {
        "when": "A relays 7",
        "reply": {
            "text": "Now in the background.",
            "tool_calls": [agent("BG-C: work quietly", None)],
        },
    },
    {"when": "C background done", "reply": "Leader finished after C.", "times": 1},
    {
        "when": "START-ALL",
        "reply": {"text": "Leader delegates.", "tool_calls": [agent("TASK-A: ask a helper")]},
    },
]


def check_cli(ledger: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from callgrove.cli import main; main()",
            "check",
            str(ledger / EPISODES_FILE),
        ],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_claude_code_fresh_nested_and_background_subagents(tmp_path):
    with gateway_for(tmp_path, CLAUDE_SCRIPT, "Leader waiting.") as (gateway, ledger):
        run = run_harness(
            "claude-code",
            "START-ALL now",
            gateway,
            "cc-shapes",
            tmp_path / "runs",
            cli=cli("claude"),
            timeout=90,
            check="test -d .",
        )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.reward == 1.0
    agents = {a["id"]: a for a in run.record["agents"]}
    leader = next(a for a in agents.values() if a["start"] == "root")
    by_prompt = {}
    for a in agents.values():
        first = " ".join(m.get("content") or "" for m in a["calls"][0]["content"]["prompt"])
        for marker in ("TASK-A", "NESTED-B", "BG-C"):
            if marker in first:
                by_prompt[marker] = a
    a, b, c = by_prompt["TASK-A"], by_prompt["NESTED-B"], by_prompt["BG-C"]
    assert len(agents) == 4
    assert (leader["parent"], len(leader["calls"])) == (None, 4)
    assert (a["start"], a["parent"], len(a["calls"])) == ("fresh", leader["id"], 2)
    assert (b["start"], b["parent"], len(b["calls"])) == ("fresh", a["id"], 1)
    assert (c["start"], c["parent"], len(c["calls"])) == ("background", leader["id"], 1)
    # Each later call of an agent continues its previous call token for token.
    for each in (leader, a):
        calls = each["calls"]
        assert all(
            later["prompt_from"] == earlier["id"] for earlier, later in itertools.pairwise(calls)
        )
    check_cli(ledger)


def test_codex_leader_turns_through_the_responses_api(tmp_path):
    rules = [{"when": "START-CODEX", "reply": "codex leader done"}]
    with gateway_for(tmp_path, rules, "ok") as (gateway, ledger):
        run = run_harness(
            "codex",
            "START-CODEX please",
            gateway,
            "cx-leader",
            tmp_path / "runs",
            cli=cli("codex"),
            timeout=90,
        )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "codex leader done" in run.stdout
    (leader,) = run.record["agents"]
    assert (leader["start"], leader["parent"], len(leader["calls"])) == ("root", None, 1)
    assert leader["calls"][0]["logprobs"] and leader["calls"][0]["policy_version"] == 0
    check_cli(ledger)


def gateway_for(tmp_path: Path, rules: list[dict], default: str):
    """serve-policy --script and a gateway in front of it, as a context of (gateway URL, ledger)."""

    @contextmanager
    def both():
        script = write_script(tmp_path / "script.json", rules, default=default)
        ledger = tmp_path / "ledger"
        with ExitStack() as stack:
            _, upstream = stack.enter_context(
                server_process("serve-policy", "--script", str(script))
            )
            _, gateway = stack.enter_context(
                server_process("gateway", "--upstream", upstream, "--ledger", str(ledger))
            )
            yield gateway, ledger

    return both()


def scripted_run(
    tmp_path: Path,
    rules: list[dict],
    default: str,
    harness: str,
    prompt: str,
    episode: str,
    **options,
):
    """One harness run through gateway -> serve-policy --script; (the run, the ledger folder)."""
    with gateway_for(tmp_path, rules, default) as (gateway, ledger):
        run = run_harness(
            harness,
            prompt,
            gateway,
            episode,
            tmp_path / "runs",
            cli=cli("claude" if harness == "claude-code" else "codex"),
            **options,
        )
    assert run.returncode == 0, run.stderr[-2000:]
    return run, ledger


def test_claude_code_compaction_continues_then_restarts_the_tree(tmp_path):
    rules = [
        {"when": "This session is being continued", "reply": "after compaction", "in": "prompt"},
        {"when": "START-ONE", "reply": "first answer"},
    ]
    with gateway_for(tmp_path, rules, "<summary>SUMMARY: the user said START-ONE</summary>") as (
        gateway,
        ledger,
    ):
        runs = tmp_path / "runs"
        common = {"cli": cli("claude"), "timeout": 90}
        first = run_harness(
            "claude-code", "START-ONE go", gateway, "cc-compact", runs, close=False, **common
        )
        compact = run_harness(
            "claude-code",
            "/compact",
            gateway,
            "cc-compact",
            runs,
            close=False,
            extra_args=["--continue"],
            **common,
        )
        last = run_harness(
            "claude-code",
            "NEXT-STEP",
            gateway,
            "cc-compact",
            runs,
            extra_args=["--continue"],
            **common,
        )
    assert [first.returncode, compact.returncode, last.returncode] == [0, 0, 0], last.stderr[-2000:]
    (leader,) = last.record["agents"]
    calls = leader["calls"]
    assert [c["purpose"] for c in calls] == ["turn", "compaction", "turn"]
    assert calls[1]["prompt_from"] == calls[0]["id"]  # the compaction call extends the history
    assert "prompt_from" not in calls[2]  # the call after it starts from the summary: a new tree
    check_cli(ledger)


def test_claude_code_subagent_compaction(tmp_path):
    """A subagent whose tool output fills its context compacts, then goes on from the summary.

    With `--autocompact 100000` the subagent's context passes the limit after its second step
    (its system prompt and tools are ~48k byte tokens, each step's output ~31k): Claude Code then
    asks it for a summary and restarts it from that summary. The compaction request leaves out
    the step whose tool call is still pending (it comes back after the summary), so it extends
    the subagent's first call, not its second."""
    step = {
        "text": "Sub works.",
        "tool_calls": [
            {
                "name": "Bash",
                "arguments": {
                    "command": "python3 -c \"print('z' * 29000)\"; echo sub-step-output",
                    "description": "step",
                },
            }
        ],
    }
    rules = [
        {"when": "summary of the conversation", "reply": "<summary>SUB SUMMARY</summary>"},
        {"when": "SUB SUMMARY", "reply": "sub finished 5", "times": 1, "in": "prompt"},
        {"when": "SUB-TASK", "reply": step, "times": 1},
        {"when": "sub-step-output", "reply": step, "times": 1},
        {"when": "sub finished 5", "reply": "Leader done after sub.", "times": 1},
        {
            "when": "START-SUB",
            "reply": {"text": "Delegating.", "tool_calls": [agent("SUB-TASK: do steps")]},
        },
    ]
    run, ledger = scripted_run(
        tmp_path,
        rules,
        "Waiting.",
        "claude-code",
        "START-SUB please",
        "cc-subcompact",
        timeout=150,
        extra_args=["--autocompact", "100000", "--dangerously-skip-permissions"],
    )
    assert "Leader done after sub." in run.stdout
    leader, sub = run.record["agents"]
    assert (leader["start"], [c["purpose"] for c in leader["calls"]]) == ("root", ["turn"] * 2)
    assert leader["calls"][1]["prompt_from"] == leader["calls"][0]["id"]
    assert (sub["start"], sub["parent"]) == ("fresh", leader["id"])
    first, second, compaction, after = sub["calls"]
    assert [c["purpose"] for c in sub["calls"]] == ["turn", "turn", "compaction", "turn"]
    assert second["prompt_from"] == first["id"]
    assert compaction["prompt_from"] == first["id"]
    assert "prompt_from" not in after  # restarted from the summary: a new tree
    assert "SUB SUMMARY" in " ".join(m["content"] or "" for m in after["content"]["prompt"])
    check_cli(ledger)


SPAWN_WAIT = {
    "when": "agent_id",
    "capture": '"agent_id":"(?P<agent>[^"]+)"',
    "reply": {
        "tool_calls": [
            {"name": "wait_agent", "arguments": {"targets": ["{agent}"], "timeout_ms": 30000}}
        ]
    },
    "times": 1,
}


def exec_command(command: str) -> dict:
    return {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": command}}]}


def spawn(message: str, fork: bool) -> dict:
    return {
        "tool_calls": [
            {"name": "spawn_agent", "arguments": {"message": message, "fork_context": fork}}
        ]
    }


@pytest.mark.parametrize("fork", [False, True], ids=["fresh", "fork"])
def test_codex_subagent_fresh_and_forked(tmp_path, fork):
    rules = [
        {"when": "CHILD-TASK", "reply": "child says 9"},
        {"when": "START-CODEX", "reply": spawn("CHILD-TASK: answer", fork)},
        SPAWN_WAIT,
        {"when": "child says 9", "reply": "leader done after child", "times": 1},
    ]
    with gateway_for(tmp_path, rules, "leader waiting") as (gateway, ledger):
        run = run_harness(
            "codex",
            "START-CODEX please",
            gateway,
            "cx-sub",
            tmp_path / "runs",
            cli=cli("codex"),
            timeout=90,
        )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "leader done after child" in run.stdout
    leader, child = run.record["agents"]
    assert (leader["start"], len(leader["calls"])) == ("root", 3)
    assert (child["start"], child["parent"], len(child["calls"])) == (
        "fork" if fork else "fresh",
        leader["id"],
        1,
    )
    assert [c.get("prompt_from") for c in leader["calls"]] == [
        None,
        leader["calls"][0]["id"],
        leader["calls"][1]["id"],
    ]
    check_cli(ledger)


def test_codex_background_subagent_never_waited_for(tmp_path):
    """Codex runs every `spawn_agent` child next to its parent; a child the leader never waits
    for is a background subagent. The leader spawns, goes on with a command (8 s) that outlasts
    the child's work (a 2 s command between two calls), and ends its turn without `wait_agent`:
    the child's calls are recorded under the leader, and its answer reaches the leader only as
    Codex's `<subagent_notification>`, in the call after the leader's command."""
    rules = [
        {"when": "BG-TASK", "reply": exec_command("sleep 2; echo child-work"), "times": 1},
        {"when": "child-work", "reply": "background child says 5", "times": 1},
        {"when": "START-CODEX", "reply": spawn("BG-TASK: work quietly", False)},
        {
            "when": "agent_id",
            "reply": exec_command("sleep 8; echo leader-work"),
            "times": 1,
        },
        {"when": "leader-work", "reply": "leader done without waiting", "times": 1},
    ]
    run, ledger = scripted_run(
        tmp_path, rules, "idle", "codex", "START-CODEX please", "cx-background", timeout=90
    )
    assert "leader done without waiting" in run.stdout
    leader, child = run.record["agents"]
    assert (leader["start"], len(leader["calls"])) == ("root", 3)
    # Codex's requests do not say whether the parent will wait, so the child is recorded as a
    # fresh start (its own context), with the leader as its parent.
    assert (child["start"], child["parent"], len(child["calls"])) == ("fresh", leader["id"], 2)
    assert child["calls"][1]["prompt_from"] == child["calls"][0]["id"]
    assert child["calls"][1]["content"]["response"]["content"] == "background child says 5"
    calls = leader["calls"]
    assert [c.get("prompt_from") for c in calls] == [None, calls[0]["id"], calls[1]["id"]]
    tools_called = [
        t["function"]["name"]
        for c in calls
        for t in c["content"]["response"].get("tool_calls") or []
    ]
    assert tools_called == ["spawn_agent", "exec_command"]  # never wait_agent
    # The child's answer arrives while the leader's command runs: in its last prompt.
    notified = [json.dumps(c["content"]["prompt"]) for c in calls]
    assert "background child says 5" not in notified[0] + notified[1]
    assert "subagent_notification" in notified[2] and "background child says 5" in notified[2]
    check_cli(ledger)


def test_codex_nested_subagent(tmp_path):
    """A subagent that starts a subagent of its own (`agents.max_depth = 2`; the default depth
    of 1 does not offer a subagent the spawn tools)."""
    rules = [
        {"when": "GRAND-TASK", "reply": "grand says 4"},
        {"when": "CHILD-TASK", "reply": spawn("GRAND-TASK: answer", False), "times": 1},
        {**SPAWN_WAIT, "times": 2},
        {"when": "grand says 4", "reply": "child says 9", "times": 1},
        {"when": "START-CODEX", "reply": spawn("CHILD-TASK: ask a helper", False)},
        {"when": "child says 9", "reply": "leader done after child", "times": 1},
    ]
    run, ledger = scripted_run(
        tmp_path,
        rules,
        "waiting",
        "codex",
        "START-CODEX please",
        "cx-nested",
        timeout=120,
        extra_args=["-c", "agents.max_depth=2"],
    )
    assert "leader done after child" in run.stdout
    leader, child, grandchild = run.record["agents"]
    assert (leader["start"], leader["parent"], len(leader["calls"])) == ("root", None, 3)
    assert (child["start"], child["parent"], len(child["calls"])) == ("fresh", leader["id"], 3)
    assert (grandchild["start"], grandchild["parent"], len(grandchild["calls"])) == (
        "fresh",
        child["id"],
        1,
    )
    for each in (leader, child):  # spawn, wait, answer: each call continues the one before
        calls = each["calls"]
        assert "prompt_from" not in calls[0]
        assert [c["prompt_from"] for c in calls[1:]] == [calls[0]["id"], calls[1]["id"]]
    check_cli(ledger)


def test_codex_compaction(tmp_path):
    rules = [
        {
            "when": "START-CODEX",
            "reply": {
                "tool_calls": [
                    {"name": "exec_command", "arguments": {"cmd": "echo step-one-output"}}
                ]
            },
            "times": 1,
        },
        {"when": "step-one-output", "reply": "summary of step one", "times": 1},
    ]
    run, ledger = scripted_run(
        tmp_path,
        rules,
        "leader done",
        "codex",
        "START-CODEX please",
        "cx-compact",
        timeout=90,
        extra_args=["-c", "model_auto_compact_token_limit=30000"],
    )
    (leader,) = run.record["agents"]
    calls = leader["calls"]
    assert [c["purpose"] for c in calls] == ["turn", "compaction", "turn"]
    assert calls[1]["prompt_from"] == calls[0]["id"]
    assert "prompt_from" not in calls[2]
    check_cli(ledger)


def test_codex_subagent_compaction(tmp_path):
    """A subagent whose tool output passes the compaction limit compacts and goes on from the
    summary, while its leader (whose context stays under the limit) does not."""
    step = {
        "tool_calls": [
            {
                "name": "exec_command",
                "arguments": {"cmd": "python3 -c \"print('z' * 9000)\"; echo child-step-output"},
            }
        ]
    }
    rules = [
        {"when": "seamlessly continue the work", "reply": "CHILD-SUMMARY of the steps"},
        {"when": "CHILD-TASK", "reply": step, "times": 1},
        {"when": "child-step-output", "reply": step, "times": 3},
        {"when": "START-CODEX", "reply": spawn("CHILD-TASK: do steps", False), "times": 1},
        SPAWN_WAIT,
        {"when": "child says 9", "reply": "leader done after child", "times": 1},
    ]
    run, ledger = scripted_run(
        tmp_path,
        rules,
        "child says 9",
        "codex",
        "START-CODEX please",
        "cx-subcompact",
        timeout=150,
        extra_args=["-c", "model_auto_compact_token_limit=45000"],
    )
    assert "leader done after child" in run.stdout
    leader, child = run.record["agents"]
    assert [c["purpose"] for c in leader["calls"]] == ["turn"] * 3
    assert (child["start"], child["parent"]) == ("fresh", leader["id"])
    calls = child["calls"]
    assert [c["purpose"] for c in calls] == ["turn"] * 3 + ["compaction", "turn"]
    # Each step continues the one before; the compaction continues the last step; the call
    # after it starts from the summary, a new tree.
    assert [c["prompt_from"] for c in calls[1:4]] == [c["id"] for c in calls[:3]]
    assert "prompt_from" not in calls[0] and "prompt_from" not in calls[4]
    assert "CHILD-SUMMARY" in " ".join(m["content"] or "" for m in calls[4]["content"]["prompt"])
    check_cli(ledger)


def test_claude_code_fork(tmp_path):
    rules = [
        {"when": "FORK-DIRECTIVE", "reply": "fork result 3"},
        {"when": "fork result 3", "reply": "Leader done after fork.", "times": 1},
        {
            "when": "START-FORK",
            "reply": {
                "text": "Forking.",
                "tool_calls": [
                    {
                        "name": "Agent",
                        "arguments": {
                            "description": "f",
                            "prompt": "FORK-DIRECTIVE: compute",
                            "subagent_type": "fork",
                            "run_in_background": False,
                        },
                    }
                ],
            },
        },
    ]
    with gateway_for(tmp_path, rules, "Leader waiting.") as (gateway, ledger):
        run = run_harness(
            "claude-code",
            "START-FORK please",
            gateway,
            "cc-fork",
            tmp_path / "runs",
            cli=cli("claude"),
            timeout=90,
        )
    assert run.returncode == 0, run.stderr[-2000:]
    leader, fork = run.record["agents"]
    assert (leader["start"], len(leader["calls"])) == ("root", 2)
    assert (fork["start"], fork["parent"], len(fork["calls"])) == ("fork", leader["id"], 1)
    # The fork resends the leader's history without the leader's text, so it is not an exact
    # extension: it starts a tree of its own, and the leader's history is context in its row.
    assert "prompt_from" not in fork["calls"][0]
    assert leader["calls"][1]["prompt_from"] == leader["calls"][0]["id"]
    check_cli(ledger)


def callgrove_train(config: Path, timeout: float) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from callgrove.cli import main; main()", "train", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def test_a_harness_is_an_orchestrator_environment(tmp_path):
    from callgrove.episode import Episode
    from callgrove.orchestrator import Environment, run_episode
    from callgrove.orchestrator.envs.harness import HarnessEnvironment
    from callgrove.policy import SamplingParams

    rules = [{"when": "START-CODEX", "reply": "codex leader done"}]
    with gateway_for(tmp_path, rules, "ok") as (gateway, ledger):
        env = HarnessEnvironment(
            "codex",
            [{"prompt": "START-CODEX please", "check": "true"}],
            gateway,
            tmp_path / "runs",
            timeout=90,
            cli=cli("codex"),
        )
        assert isinstance(env, Environment)
        # The harness calls the gateway's upstream, never the loop's in-process policy; the
        # policy being trained has the gateway's vocabulary (all the environment asks of it).
        trained = SimpleNamespace(vocab_size=BuiltinFormat().vocab_size)
        episode = asyncio.run(
            run_episode(
                env,
                env.eval_tasks()[0],
                None,
                trained,
                SamplingParams(),
                Episode(id="env-1"),
                timeout=120,
            )
        )
    assert episode.ok, episode.errors
    assert episode.rewards == {"check": 1.0}
    (leader,) = episode.agents
    assert leader.start == "root" and len(leader.calls) == 1
    assert leader.calls[0].logprobs is not None
    check_cli(ledger)


def test_callgrove_train_runs_a_harness_environment(tmp_path):
    """`callgrove train` with a real harness as its environment, to the learner's door.

    The episodes run Codex through the gateway and are scored and recorded; the reference
    decoder being trained has the built-in environments' character vocabulary (49 ids), not
    the gateway's byte chat format, so every episode is refused with an error naming its call
    instead of reaching the learner with ids it cannot embed."""
    rules = [{"when": "START-CODEX", "reply": "codex leader done"}]
    with gateway_for(tmp_path, rules, "ok") as (gateway, ledger):
        config = tmp_path / "train.toml"
        config.write_text(
            f"""
[run]
steps = 1
out = "{tmp_path / "out"}"
[env]
name = "callgrove.orchestrator.envs.harness:HarnessEnvironment"
[env.options]
harness = "codex"
tasks = [{{prompt = "START-CODEX please", check = "true"}}]
gateway = "{gateway}"
folder = "{tmp_path / "runs"}"
timeout = 90
cli = "{cli("codex")}"
[dispatch]
group_size = 2
groups_per_step = 1
max_in_flight = 2
[monitor]
live = false
plot = false
"""
        )
        callgrove_train(config, timeout=600)
    traces = [
        json.loads(line)
        for path in (tmp_path / "out").rglob("traces.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert traces and all(not t["ok"] for t in traces)
    # Episodes still in flight when the last step is taken are stopped (`Cancelled`).
    refused = [t for t in traces if t["errors"][0]["type"] != "Cancelled"]
    assert len(refused) >= 2  # a whole group
    for trace in refused:
        (error,) = trace["errors"]
        assert f"episode {trace['id']}, agent " in error["message"]
        assert "outside the vocabulary of the policy being trained (49 ids)" in error["message"]
    closed = [json.loads(line) for line in (ledger / EPISODES_FILE).read_text().splitlines()]
    assert {t["id"] for t in refused} <= {e["id"] for e in closed}
    assert all(len(e["agents"][0]["calls"]) == 1 for e in closed)
    check_cli(ledger)


@pytest.fixture(scope="module")
def smollm2_vocabulary_llama(tmp_path_factory) -> Path:
    """A randomly initialised small Llama over SmolLM2's tokenizer and chat template (read from
    the packaged GGUF without its weights), saved as a Hugging Face checkpoint folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from callgrove.networks.hf import resolve_model

    source = resolve_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(source.folder, gguf_file=source.gguf_file)
    folder = tmp_path_factory.mktemp("smollm2-vocabulary-llama")
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=65536,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_callgrove_train_trains_on_a_harness_environment(tmp_path, smollm2_vocabulary_llama):
    """`callgrove train` over real Codex: the environment's in-process gateway renders Codex's
    requests with the trained model's tokenizer and chat template and samples them from the
    loop's own policy, so the step trains on the harness's calls and the weights change."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    folder = smollm2_vocabulary_llama
    runs, out = tmp_path / "runs", tmp_path / "out"
    # Episode ids are GROUP-NUMBER-LAUNCH and the work folder RUNS/EPISODE/work: the group's
    # first episode scores 1, the second 0, so the group has an advantage to learn from.
    check = 'case "$(basename "$(dirname "$PWD")")" in *-0-????????) exit 0;; esac; exit 1'
    config = tmp_path / "train.toml"
    config.write_text(
        f"""
[run]
steps = 1
out = "{out}"
[env]
name = "callgrove.orchestrator.envs.harness:HarnessEnvironment"
[env.options]
harness = "codex"
tasks = [{{prompt = "START-CODEX please", check = {json.dumps(check)}}}]
folder = "{runs}"
timeout = 240
cli = "{cli("codex")}"
[model]
name = "hf:{folder}"
[sampling]
max_tokens = 8
[dispatch]
group_size = 2
groups_per_step = 1
max_in_flight = 2
[algorithm]
name = "grpo"
[train]
learning_rate = 0.01
[degeneracy]
drop = []  # an untrained random model samples gibberish, which would otherwise be dropped
[monitor]
live = false
plot = false
"""
    )
    callgrove_train(config, timeout=900)
    traces = [
        json.loads(line) for line in (out / "step_1/train/traces.jsonl").read_text().splitlines()
    ]
    assert len(traces) == 2 and all(t["ok"] for t in traces), traces
    assert sorted(t["rewards"]["check"] for t in traces) == [0.0, 1.0]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    completion_tokens = 0
    for trace in traces:
        (leader,) = trace["agents"]
        (call,) = leader["calls"]
        # The trained call is Codex's request in the model's own chat format, sampled by the
        # loop's policy (version 0, before the step).
        prompt = tokenizer.decode(call["prompt_ids"])
        assert prompt.startswith("<|im_start|>system") and "START-CODEX please" in prompt
        assert call["policy_version"] == 0 and len(call["logprobs"]) == len(call["completion_ids"])
        completion_tokens += len(call["completion_ids"])
    # The same calls are in the in-process gateway's ledger, closed into its episodes.jsonl.
    closed = {
        json.loads(line)["id"]
        for line in (runs / "ledger" / EPISODES_FILE).read_text().splitlines()
    }
    assert {t["id"] for t in traces} <= closed
    (metrics,) = [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if '"final"' not in line
    ]
    assert metrics["train/samples"] == 2 and metrics["train/loss_tokens"] == completion_tokens
    assert metrics["train/row_tokens"] > 4000  # Codex's whole request in each row
    trained = torch.load(out / "checkpoint.pt", weights_only=False)["learner"]["weights"]
    initial = load_file(folder / "model.safetensors")
    changed = [n for n, w in trained.items() if not torch.equal(w, initial[n])]
    assert "model.embed_tokens.weight" in changed and len(changed) == len(initial), changed
    check_cli(runs / "ledger")


# The faults real runs showed (issue: capture under real harnesses), one test each where the
# harness itself can show it.


def test_claude_code_fork_session_trains_each_response_once(tmp_path):
    """`claude --continue --fork-session` starts a new session whose file repeats the first
    session's responses. The gateway records each call once (the forked session's call extends
    the first session's last one), and importing the project folder gives the same calls:
    the copies are history in the forked session, calls of the session that made them."""
    step = {
        "text": "Running.",
        "tool_calls": [
            {"name": "Bash", "arguments": {"command": "echo tool-out", "description": "x"}}
        ],
    }
    rules = [
        {"when": "SECOND-ASK", "reply": "second answer"},
        {"when": "FIRST-ASK", "reply": step, "times": 1},
        {"when": "tool-out", "reply": "first answer", "times": 1},
    ]
    with gateway_for(tmp_path, rules, "default") as (gateway, ledger):
        runs = tmp_path / "runs"
        common = {"cli": cli("claude"), "timeout": 90}
        skip = ["--dangerously-skip-permissions"]
        first = run_harness(
            "claude-code",
            "FIRST-ASK go",
            gateway,
            "cc-fs",
            runs,
            close=False,
            extra_args=skip,
            **common,
        )
        forked = run_harness(
            "claude-code",
            "SECOND-ASK go",
            gateway,
            "cc-fs",
            runs,
            extra_args=["--continue", "--fork-session", *skip],
            **common,
        )
    assert [first.returncode, forked.returncode] == [0, 0], forked.stderr[-2000:]
    calls = [c for a in forked.record["agents"] for c in a["calls"]]
    answers = [c["content"]["response"]["content"] for c in calls]
    assert answers == ["Running.", "first answer", "second answer"]
    assert calls[2]["prompt_from"] == calls[1]["id"]
    check_cli(ledger)

    report = ImportReport()
    (project,) = (runs / "cc-fs" / "home" / ".claude" / "projects").iterdir()
    transcripts = import_claude_code(project, report)
    assert len(transcripts) == 2  # two session files
    imported = [c.response.text for t in transcripts for a in t.agents for c in a.calls]
    assert sorted(imported) == sorted(answers)  # each response trains once
    (copies,) = [p.message for p in report.diagnostics.problems]
    assert copies.startswith("2 response(s) repeat those of session ")


def test_codex_subagents_are_named_as_the_importer_names_them(tmp_path):
    """Codex 0.169 (multi-agent v1) sends `agent_name: /root` for the leader and every
    subagent; the gateway names them as the importer of Codex's own session files does: the
    role a `spawn_agent` call asked for, else the nickname Codex gave the new thread."""
    spawns = {
        "tool_calls": [
            {
                "name": "spawn_agent",
                "arguments": {"message": "CHILD-TASK one", "fork_context": False},
            },
            {
                "name": "spawn_agent",
                "arguments": {
                    "message": "CHILD-TASK two",
                    "fork_context": False,
                    "agent_type": "explorer",
                },
            },
        ]
    }
    rules = [
        {"when": "CHILD-TASK", "reply": "child says 9"},
        {"when": "START-CODEX", "reply": spawns, "times": 1},
        SPAWN_WAIT,
        {"when": "child says 9", "reply": "leader done after child", "times": 1},
    ]
    run, ledger = scripted_run(
        tmp_path, rules, "leader waiting", "codex", "START-CODEX please", "cx-names", timeout=90
    )
    names = {a["id"]: a["name"] for a in run.record["agents"]}
    transcripts = import_codex(tmp_path / "runs" / "cx-names" / "home" / ".codex" / "sessions")
    imported = {a.id: a.name for t in transcripts for a in t.agents}
    assert names == imported
    leader, *children = run.record["agents"]
    assert leader["name"] == "leader" and len(children) == 2
    nicknames = [
        json.loads(m["content"])["nickname"]
        for c in leader["calls"]
        for m in c["content"]["prompt"]
        if m["role"] == "tool" and '"nickname"' in (m["content"] or "")
    ]
    assert sorted(a["name"] for a in children) == sorted([nicknames[0], "explorer"])
    check_cli(ledger)


def test_claude_code_two_subagents_with_one_prompt(tmp_path):
    """One foreground and one background subagent started with the same prompt in one
    response: each gets its own start, as the tool results the leader reads name them."""
    same = "SAME-TASK: look around"
    rules = [
        {"when": "SAME-TASK", "reply": "looked around"},
        {
            "when": "START-TWO",
            "reply": {
                "text": "Two helpers.",
                "tool_calls": [agent(same, False), agent(same, True)],
            },
            "times": 1,
        },
    ]
    run, ledger = scripted_run(
        tmp_path, rules, "Leader done.", "claude-code", "START-TWO please", "cc-same", timeout=120
    )
    agents = {a["id"]: a for a in run.record["agents"]}
    leader = next(a for a in agents.values() if a["start"] == "root")
    spawn_call = next(c for c in leader["calls"] if c["content"]["response"].get("tool_calls"))
    asked = {
        t["id"]: t["function"]["arguments"]["run_in_background"]
        for t in spawn_call["content"]["response"]["tool_calls"]
    }
    started = {}  # tool call id -> the agent it started, as the tool results say
    for call in leader["calls"]:
        for m in call["content"]["prompt"]:
            found = re.search(r"agentId: ([A-Za-z0-9_-]+)", m["content"] or "")
            if m["role"] == "tool" and m.get("tool_call_id") in asked and found:
                started[m["tool_call_id"]] = found[1]
    assert len(started) == 2
    for use_id, background in asked.items():
        sub = agents[started[use_id]]
        assert (sub["parent"], sub["start"]) == (
            leader["id"],
            "background" if background else "fresh",
        )
    check_cli(ledger)


def test_claude_code_prompt_asking_for_a_summary_is_a_turn(tmp_path):
    """A user's own prompt that asks for a "summary of the conversation" is an ordinary turn:
    only Claude Code's full compaction instruction makes a compaction."""
    rules = [{"when": "summary of the conversation", "reply": "Here is a summary."}]
    run, ledger = scripted_run(
        tmp_path,
        rules,
        "default",
        "claude-code",
        "Please write a summary of the conversation so far.",
        "cc-summary",
        timeout=90,
    )
    (leader,) = run.record["agents"]
    assert [c["purpose"] for c in leader["calls"]] == ["turn"]
    assert leader["calls"][0]["content"]["response"]["content"] == "Here is a summary."
    check_cli(ledger)


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_a_closed_episode_stops_the_harness_at_once(tmp_path, harness):
    """A call to a closed episode is answered so that the harness gives up at once (Claude
    Code retries a 409 for minutes): a second run on the closed episode ends within seconds,
    records nothing, and the closed record stays as it was."""
    rules = [{"when": "HELLO", "reply": "hello back"}]
    with gateway_for(tmp_path, rules, "ok") as (gateway, ledger):
        common = {"cli": cli("claude" if harness == "claude-code" else "codex"), "timeout": 90}
        first = run_harness(
            harness, "HELLO there", gateway, "closed-ep", tmp_path / "runs", **common
        )
        again = run_harness(
            harness, "HELLO again", gateway, "closed-ep", tmp_path / "runs", close=False, **common
        )
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.reward is None and first.record["rewards"] == {}  # no check: no reward
    assert again.returncode != 0
    assert again.seconds < 30, again.seconds
    assert "closed" in again.stdout + again.stderr
    closed = [json.loads(line) for line in (ledger / EPISODES_FILE).read_text().splitlines()]
    assert [e["id"] for e in closed] == ["closed-ep"]
    check_cli(ledger)


def test_claude_code_background_fork_is_background_to_the_gateway_and_the_importer(tmp_path):
    """A fork that runs in the background: one start rule (`SpawnArguments.start`) makes it
    `background` in the gateway's record and in the import of the CLI's own session files."""
    fork = {
        "name": "Agent",
        "arguments": {
            "description": "f",
            "prompt": "FORK-DIRECTIVE: compute",
            "subagent_type": "fork",
            "run_in_background": True,
        },
    }
    rules = [
        {"when": "FORK-DIRECTIVE", "reply": "fork result 3"},
        {"when": "fork result 3", "reply": "Leader done after fork.", "times": 1},
        {"when": "START-FORK", "reply": {"text": "Forking.", "tool_calls": [fork]}, "times": 1},
    ]
    run, ledger = scripted_run(
        tmp_path,
        rules,
        "Leader waiting.",
        "claude-code",
        "START-FORK please",
        "cc-bgfork",
        timeout=120,
    )
    leader, sub = run.record["agents"]
    assert (sub["parent"], sub["start"]) == (leader["id"], "background")
    (project,) = (tmp_path / "runs" / "cc-bgfork" / "home" / ".claude" / "projects").iterdir()
    (transcript,) = import_claude_code(project)
    starts = {a.id: a.start for a in transcript.agents}
    assert starts == {"main": "root", f"agent-{sub['id']}": "background"}
    check_cli(ledger)
