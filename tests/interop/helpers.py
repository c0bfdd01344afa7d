"""Verifiers episodes built with verifiers' own classes, as its harness would record them."""

from __future__ import annotations

from pathlib import Path

import verifiers.v1 as vf
from verifiers.v1.configs.agent import WireAgentConfig
from verifiers.v1.state import State
from verifiers.v1.task import WireTaskData
from verifiers.v1.utils.trace_store import TRACES_FILE, read_episodes, write_episode

from callgrove.episode import Episode
from callgrove.rows import build_rows

TASK = vf.TraceTask[WireTaskData](type="LoginBug", data=WireTaskData(prompt="fix the login bug"))
SCAFFOLD = [50, 51]  # the generation prompt the template puts before each completion
WIRE_TRACE = vf.Trace[WireTaskData, State, WireAgentConfig]


class TraceBuilder:
    """Appends message nodes the way verifiers commits turns: input nodes, then a sampled node
    holding the generation scaffold followed by the completion (mask False then True)."""

    def __init__(self, name: str, trainable: bool = True):
        self.name = name
        self.trainable = trainable
        self.nodes: list[vf.MessageNode] = []
        self.calls: list[vf.ModelCall] = []

    def prompt(self, parent: int | None, tokens: list[int], role: str = "user") -> int:
        message = (
            vf.UserMessage(content="u")
            if role == "user"
            else vf.ToolMessage(tool_call_id="t", content="r")
        )
        self.nodes.append(
            vf.MessageNode(
                parent=parent, message=message, token_ids=tokens, mask=[False] * len(tokens)
            )
        )
        return len(self.nodes) - 1

    def sample(
        self,
        parent: int | None,
        completion: list[int],
        scaffold: list[int] = SCAFFOLD,
        links: tuple[tuple[int, str], ...] = (),
    ) -> int:
        tokens = [*scaffold, *completion]
        self.nodes.append(
            vf.MessageNode(
                parent=parent,
                message=vf.AssistantMessage(content="a"),
                sampled=True,
                token_ids=tokens,
                mask=[False] * len(scaffold) + [True] * len(completion),
                logprobs=[-0.125 * (i + 1) for i in range(len(completion))],
                semantic_parents=[vf.ParentLink(node=n, type=t) for n, t in links],
            )
        )
        index = len(self.nodes) - 1
        self.calls.append(vf.ModelCall(node=index))
        return index

    def link(self, target: int, source: int, kind: str) -> None:
        self.nodes[target].semantic_parents.append(vf.ParentLink(node=source, type=kind))

    def trace(self, rewards: dict[str, float] | None = None) -> vf.Trace:
        return WIRE_TRACE(
            task=TASK,
            agent=vf.AgentInfo(config=WireAgentConfig(), name=self.name, trainable=self.trainable),
            nodes=self.nodes,
            calls=self.calls,
            rewards={k: vf.Reward(score=v) for k, v in (rewards or {}).items()},
            is_completed=True,
            ok=True,
        )


def leader_trace() -> tuple[vf.Trace, dict[str, int]]:
    """A leader that forks a subagent inside its own trace and compacts twice (one attempt
    discarded, one resumed from). Returns the trace and its sampled nodes by name."""
    b = TraceBuilder("leader")
    at: dict[str, int] = {}
    root = b.prompt(None, [1, 100, 101, 102, 103])
    at["C1"] = b.sample(root, [60, 61, 62])
    tool = b.prompt(at["C1"], [70, 71, 72], role="tool")
    at["C2"] = b.sample(tool, [80, 81])
    tool = b.prompt(at["C2"], [90, 91], role="tool")
    at["C3"] = b.sample(tool, [82, 83, 84])
    fork = b.prompt(at["C3"], [110, 111, 112])  # the fork's task, after the leader's history
    at["F1"] = b.sample(fork, [113, 114])
    tool = b.prompt(at["F1"], [115], role="tool")
    at["F2"] = b.sample(tool, [116, 117, 118])
    tool = b.prompt(at["C3"], [120, 121], role="tool")
    at["C4"] = b.sample(tool, [122, 123])
    ask = b.prompt(at["C4"], [130, 131])  # "summarise": an attempt the harness discarded
    at["K1"] = b.sample(ask, [132, 133], links=((at["C4"], "compaction_attempt"),))
    ask = b.prompt(at["C4"], [130, 134])  # the retried summary, resumed from
    at["K2"] = b.sample(ask, [135, 136, 137], links=((at["C4"], "compaction_attempt"),))
    summary = b.prompt(None, [1, 140, 135, 136, 137])  # a fresh history starting from the summary
    at["C5"] = b.sample(summary, [141, 142], links=((at["K2"], "compaction"),))
    tool = b.prompt(at["C5"], [143], role="tool")
    at["C6"] = b.sample(tool, [144, 145])
    return b.trace({"tests_pass": 1.0}), at


def solver_trace() -> vf.Trace:
    b = TraceBuilder("solver")
    first = b.sample(b.prompt(None, [2, 200, 201]), [202, 203, 204])
    b.sample(b.prompt(first, [205], role="tool"), [206])
    return b.trace({"tests_pass": 1.0, "style": 0.5})


def judge_trace() -> vf.Trace:
    b = TraceBuilder("judge", trainable=False)
    b.sample(b.prompt(None, [3, 300, 301]), [302])
    return b.trace()


def multi_agent_episode(index: int = 0) -> vf.WireEpisode:
    leader, _ = leader_trace()
    return vf.WireEpisode(
        id=f"ep-{index}",
        env=vf.EnvInfo(id="login-bug", name="login"),
        task=TASK,
        group=vf.GroupInfo(id="grp-17"),
        run=vf.TrainRunInfo(
            id="run-a", work=vf.TrainWorkInfo(step=6, policy=vf.PolicySpan(start=2, end=4))
        ),
        ok=True,
        traces=[leader, solver_trace(), judge_trace()],
    )


def write_with_verifiers(folder: Path, episodes: list[vf.WireEpisode]) -> Path:
    """verifiers' own writer, appending one episode per line to `folder/traces.jsonl`."""
    for episode in episodes:
        write_episode(folder, episode)
    return folder / TRACES_FILE


def read_with_verifiers(folder: Path) -> list[vf.WireEpisode]:
    return read_episodes(folder, WIRE_TRACE)


def row_tokens(episode: Episode) -> list[list[int]]:
    """The token ids of each of the episode's rows."""
    result = build_rows(episode)
    return [result.token_ids(row).tolist() for row in result.rows]
