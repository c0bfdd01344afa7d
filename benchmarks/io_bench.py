"""Episode file speed and size, side by side in one run: callgrove vs verifiers 0.4.0.

The same multi-agent episodes (a leader growing to a 16k-token context, fresh subagents to 4k)
are built twice: as callgrove records and, with verifiers' own classes, as verifiers episodes
(one trace per agent, a message node per message holding its token delta, mask and compact
logprobs; message text at --chars-per-token, as a real record carries it). Each side is
written and read with its own functions; the orjson parse of callgrove's file is the floor a
JSON reader cannot beat. Then `callgrove stats` streams a large JSON Lines file in a
subprocess whose peak memory is measured.

    .venv/bin/python benchmarks/io_bench.py                  # full run (2 GB stats file)
    .venv/bin/python benchmarks/io_bench.py --stats-gb 0.2   # quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from callgrove.episode import (
    Agent,
    Call,
    Episode,
    encode_episode,
    load,
    save,
    write_binary_episodes,
)
from callgrove.formats.wire import WireEnv, WirePolicy, WireRun

TARGETS = {"jsonl": 3.0, "binary": 20.0}
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "or",
    "at",
    "from",
]


def _spans(rng: np.random.Generator, context: int) -> list[tuple[int, int]]:
    """(new prompt tokens, completion tokens) per call of one agent, up to `context` tokens."""
    spans, total = [], 0
    first = True
    while True:
        prompt = int(rng.integers(600, 1400)) if first else int(rng.integers(150, 700))
        completion = int(rng.integers(40, 320))
        if total + prompt + completion > context and not first:
            return spans
        spans.append((prompt, completion))
        total += prompt + completion
        first = False


def make_agents(rng: np.random.Generator, subagents: int) -> list[tuple[str, list[tuple]]]:
    """Per agent: (name, [(suffix tokens, completion tokens, logprobs)]) shared by both sides."""
    plans = [("leader", _spans(rng, 16_384))] + [
        ("solver", _spans(rng, 4_096)) for _ in range(subagents)
    ]
    agents = []
    for name, spans in plans:
        calls = []
        for prompt, completion in spans:
            calls.append(
                (
                    rng.integers(0, 151_000, prompt, dtype=np.int32),
                    rng.integers(0, 151_000, completion, dtype=np.int32),
                    -rng.exponential(0.4, completion),
                )
            )
        agents.append((name, calls))
    return agents


def callgrove_episode(index: int, agents: list[tuple[str, list[tuple]]]) -> Episode:
    episode = Episode(
        id=f"ep-{index}",
        group=f"grp-{index // 8}",
        env=WireEnv(id="bench-env", name="bench"),
        run=WireRun(id="run-a", type="train", step=6, policy=WirePolicy(start=2, end=4)),
        rewards={"score": 1.0},
    )
    seq = 0
    for number, (name, calls) in enumerate(agents):
        agent = Agent(
            id=f"A{number}",
            name=name,
            parent=None if number == 0 else "A0",
            start="root" if number == 0 else "fresh",
        )
        previous: Call | None = None
        for suffix, completion, logprobs in calls:
            seq += 1
            call = Call(
                id=f"C{seq}",
                seq=seq,
                completion_ids=completion,
                prompt_suffix=suffix,
                prompt_from=None if previous is None else previous.id,
                prompt_from_len=0 if previous is None else previous.full_len,
                logprobs=logprobs,
                policy_version=2 + seq % 3,
            )
            previous = agent.add(call)
        episode.agents.append(agent)
    return episode


def _text(rng: np.random.Generator, tokens: int, chars_per_token: float) -> str:
    words = rng.choice(WORDS, max(1, int(tokens * chars_per_token / 4)))
    return " ".join(words.tolist())


def verifiers_episode(
    index: int, agents: list[tuple[str, list[tuple]]], rng: np.random.Generator, cpt: float
) -> Any:
    from verifiers.v1.configs.agent import WireAgentConfig
    from verifiers.v1.episode import (
        EnvInfo,
        GroupInfo,
        PolicySpan,
        TrainRunInfo,
        TrainWorkInfo,
        WireEpisode,
    )
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.task import WireTaskData
    from verifiers.v1.trace import AgentInfo, ModelCall, Reward, Trace, TraceTask, VersionInfo
    from verifiers.v1.types import AssistantMessage, ToolMessage, Usage, UserMessage

    task = TraceTask[WireTaskData](type="BenchTask", data=WireTaskData(idx=index))
    traces = []
    for name, calls in agents:
        nodes: list[MessageNode] = []
        model_calls: list[ModelCall] = []
        context = 0
        for turn, (suffix, completion, logprobs) in enumerate(calls):
            text = _text(rng, len(suffix), cpt)
            message = (
                UserMessage(content=text)
                if turn == 0
                else ToolMessage(tool_call_id=f"t{turn}", content=text)
            )
            nodes.append(
                MessageNode(
                    parent=len(nodes) - 1 if nodes else None,
                    message=message,
                    token_ids=suffix.tolist(),
                    mask=[False] * len(suffix),
                )
            )
            nodes.append(
                MessageNode(
                    parent=len(nodes) - 1,
                    message=AssistantMessage(content=_text(rng, len(completion), cpt)),
                    sampled=True,
                    token_ids=completion.tolist(),
                    mask=[True] * len(completion),
                    logprobs=logprobs.tolist(),
                )
            )
            context += len(suffix)
            model_calls.append(
                ModelCall(
                    node=len(nodes) - 1,
                    usage=Usage(prompt_tokens=context, completion_tokens=len(completion)),
                )
            )
            context += len(completion)
        traces.append(
            Trace(
                verifiers=VersionInfo(version="0.4.0"),
                task=task,
                agent=AgentInfo(config=WireAgentConfig(), name=name),
                nodes=nodes,
                calls=model_calls,
                rewards={"score": Reward(score=1.0)},
                is_completed=True,
                ok=True,
            )
        )
    return WireEpisode(
        id=f"ep-{index}",
        env=EnvInfo(id="bench-env", name="bench"),
        task=task,
        group=GroupInfo(id=f"grp-{index // 8}"),
        run=TrainRunInfo(id="run-a", work=TrainWorkInfo(step=6, policy=PolicySpan(start=2, end=4))),
        ok=True,
        traces=traces,
    )


def race(
    actions: dict[str, Callable[[], Any]], rounds: int
) -> tuple[dict[str, float], dict[str, Any]]:
    """Best wall time of each action over `rounds` rounds, every action run once a round, so
    that load from elsewhere on a shared machine falls on all of them alike."""
    best = dict.fromkeys(actions, float("inf"))
    results: dict[str, Any] = {}
    for _ in range(rounds):
        for name, action in actions.items():
            start = time.perf_counter()
            results[name] = action()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, results


def _mb(path: Path) -> float:
    return path.stat().st_size / 1e6


def run_io(args: argparse.Namespace, work: Path) -> bool:
    from verifiers.v1.configs.agent import WireAgentConfig
    from verifiers.v1.state import State
    from verifiers.v1.task import WireTaskData
    from verifiers.v1.trace import Trace
    from verifiers.v1.utils.trace_store import TRACES_FILE, read_episodes, write_episode

    rng = np.random.default_rng(7)
    plans = [make_agents(rng, args.subagents) for _ in range(args.episodes)]
    ours = [callgrove_episode(i, plan) for i, plan in enumerate(plans)]
    theirs = [verifiers_episode(i, plan, rng, args.chars_per_token) for i, plan in enumerate(plans)]
    calls = sum(1 for e in ours for _ in e.calls())
    tokens = sum(len(c.prompt_suffix) + len(c.completion_ids) for e in ours for c in e.calls())
    print(
        f"{len(ours)} episodes, {calls} calls, {tokens / 1e6:.2f}M distinct tokens "
        f"(leader to 16k, {args.subagents} subagents to 4k; verifiers text "
        f"{args.chars_per_token} chars/token)"
    )

    vf_dir = work / "vf"
    vf_dir.mkdir()
    vf_file = vf_dir / TRACES_FILE

    def vf_write() -> None:
        vf_file.unlink(missing_ok=True)
        for episode in theirs:
            write_episode(vf_dir, episode)

    trace_type = Trace[WireTaskData, State, WireAgentConfig]
    jsonl, parquet, arrow = work / "ours.jsonl", work / "ours.parquet", work / "ours.arrow"
    zstd = work / "ours-zstd.parquet"
    writers = {
        "vf write": vf_write,
        "write": lambda: save(jsonl, ours),
        "pq write": lambda: save(parquet, ours),
        "pz write": lambda: write_binary_episodes(zstd, ours, compression="zstd"),
        "ar write": lambda: save(arrow, ours),
    }
    readers = {
        "vf read": lambda: read_episodes(vf_dir, trace_type),
        "vf floor": lambda: [orjson.loads(line) for line in vf_file.open("rb")],
        "read": lambda: list(load(jsonl)),
        "floor": lambda: [orjson.loads(line) for line in jsonl.open("rb")],
        "pq read": lambda: list(load(parquet)),
        "pz read": lambda: list(load(zstd)),
        "ar read": lambda: list(load(arrow)),
    }
    t, results = race(writers, args.repeat)
    t2, results = race(readers, args.repeat)
    t.update(t2)
    assert {len(results[k]) for k in ("vf read", "read", "pq read", "ar read")} == {len(ours)}
    assert all(
        np.array_equal(x.full_ids(a), y.full_ids(b))
        for x, y in zip(ours, results["pq read"], strict=True)
        for a, b in zip(x.calls(), y.calls(), strict=True)
    )
    t_vf_write, t_write, t_pq_write = t["vf write"], t["write"], t["pq write"]
    t_pz_write, t_ar_write = t["pz write"], t["ar write"]
    t_vf_read, t_vf_floor, t_read, t_floor = t["vf read"], t["vf floor"], t["read"], t["floor"]
    t_pq_read, t_pz_read, t_ar_read = t["pq read"], t["pz read"], t["ar read"]

    print(f"\n{'':34}{'seconds':>9}{'MB':>9}{'vs verifiers':>14}")

    def line(name: str, seconds: float, baseline: float, size: float | None = None) -> float:
        ratio = baseline / seconds
        mb = f"{size:9.1f}" if size is not None else " " * 9
        print(f"{name:34}{seconds:9.3f}{mb}{ratio:13.1f}x")
        return ratio

    line("verifiers write_episode", t_vf_write, t_vf_write, _mb(vf_file))
    line("callgrove JSONL write", t_write, t_vf_write, _mb(jsonl))
    line("callgrove Parquet write", t_pq_write, t_vf_write, _mb(parquet))
    line("callgrove Parquet write, zstd", t_pz_write, t_vf_write, _mb(zstd))
    line("callgrove Arrow IPC write", t_ar_write, t_vf_write, _mb(arrow))
    print()
    line("verifiers read_episodes", t_vf_read, t_vf_read)
    line("orjson parse of verifiers file", t_vf_floor, t_vf_read)
    jsonl_read = line("callgrove JSONL read", t_read, t_vf_read)
    line("orjson parse of callgrove file", t_floor, t_vf_read)
    parquet_read = line("callgrove Parquet read", t_pq_read, t_vf_read)
    line("callgrove Parquet read, zstd", t_pz_read, t_vf_read)
    arrow_read = line("callgrove Arrow IPC read", t_ar_read, t_vf_read)
    checks = {
        "JSONL read >= 3x": jsonl_read >= TARGETS["jsonl"],
        "JSONL write >= 3x": t_vf_write / t_write >= TARGETS["jsonl"],
        "Parquet read >= 20x": parquet_read >= TARGETS["binary"],
        "Arrow IPC read >= 20x": arrow_read >= TARGETS["binary"],
        "Parquet no larger than traces.jsonl": _mb(parquet) <= _mb(vf_file),
        "Arrow IPC no larger than traces.jsonl": _mb(arrow) <= _mb(vf_file),
    }
    print()
    for name, ok in checks.items():
        print(f"  {'met   ' if ok else 'MISSED'} {name}")
    return all(checks.values())


def run_stats(args: argparse.Namespace, work: Path) -> bool:
    """Write a JSON Lines file of about --stats-gb and stream `callgrove stats` over it."""
    rng = np.random.default_rng(11)
    path = work / "big.jsonl"
    pool = [callgrove_episode(i, make_agents(rng, args.subagents)) for i in range(16)]
    lines = [encode_episode(e) for e in pool]
    target = int(args.stats_gb * 1e9)
    written = count = 0
    with path.open("wb") as out:
        while written < target:
            data = lines[count % len(lines)].replace(b'"id":"ep-', b'"id":"ep-%d-' % count, 1)
            out.write(data)
            written += len(data)
            count += 1
    ok = _stats_child(path, f"{written / 1e9:.2f} GB JSON Lines ({count} episodes)")
    if args.stats_binary:
        binary = work / "big.parquet"
        save(binary, load(path))
        path.unlink()
        ok = (
            _stats_child(binary, f"the same as {binary.stat().st_size / 1e9:.2f} GB Parquet") and ok
        )
    return ok


def _stats_child(path: Path, what: str) -> bool:
    start = time.perf_counter()
    child = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    peak_mb = int(child.stderr.split()[-1]) / 1024
    ok = child.returncode == 0 and peak_mb < 300
    print(
        f"\ncallgrove stats over {what}: {seconds:.1f} s, "
        f"peak RSS {peak_mb:.0f} MB (limit 300), exit {child.returncode}"
    )
    if child.returncode != 0:
        print(child.stdout[-2000:], child.stderr[-2000:])
    print(f"  {'met   ' if ok else 'MISSED'} stats peak memory < 300 MB")
    return ok


# The measured child: the real CLI entry point on the big file; it reports its own peak RSS
# on its last stderr line. VmHWM (KiB), not ru_maxrss: ru_maxrss keeps the high-water mark of
# the forked copy of this (large) process from before exec.
_PROBE = """
import atexit, sys
def peak():
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    print(status.split()[0], file=sys.stderr)
atexit.register(peak)
from callgrove.cli import main
sys.argv = ["callgrove", "stats", sys.argv[1]]
main()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=80)
    parser.add_argument("--subagents", type=int, default=4)
    parser.add_argument("--chars-per-token", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=5, help="best of N interleaved rounds")
    parser.add_argument("--stats-gb", type=float, default=2.0, help="0 skips the stats run")
    parser.add_argument(
        "--stats-binary",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also convert the stats file to Parquet and measure stats over that",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where to put the files")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="callgrove-io-", dir=args.dir))
    try:
        ok = run_io(args, work)
        if args.stats_gb > 0:
            ok = run_stats(args, work) and ok
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "120")
    sys.exit(main())
