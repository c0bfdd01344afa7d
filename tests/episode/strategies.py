"""Hypothesis strategies for whole episodes, every field of the record exercised, and the
comparison used by the round-trip tests."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
from hypothesis import strategies as st

from callgrove.episode import AGENT_STARTS, PURPOSES, Agent, Call, Episode, episode_to_wire
from callgrove.episode.provenance import gap_from_json
from callgrove.formats.wire import WireEnv, WireError, WirePolicy, WireRun

names = st.text(min_size=1, max_size=6)
maybe_names = st.none() | names
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
json_objects = st.dictionaries(st.text(max_size=4), json_values, max_size=3)
finite = st.floats(-1e6, 1e6, allow_nan=False)
gap_objects = st.builds(
    lambda kind, reason, detail: {"kind": kind, **({"reason": reason} if reason else {}), **detail},
    st.text(min_size=1, max_size=6),
    st.text(max_size=6),
    st.dictionaries(
        st.text(min_size=5, max_size=6).map(lambda k: "x" + k), json_values, max_size=2
    ),
)
reward_maps = st.dictionaries(st.text(max_size=5), finite, max_size=3)
token_lists = st.lists(st.integers(0, 2**31 - 1), max_size=6)


# A call's `sampling`: valid settings, sometimes with keys of a source's own.
samplings = st.fixed_dictionaries(
    {
        "temperature": st.floats(0, 4),
        "top_p": st.floats(1e-6, 1),
        "top_k": st.none() | st.integers(1, 1 << 40),
    },
    optional={"min_p": st.floats(0, 1), "engine": json_objects},
)


@st.composite
def calls_in_seq_order(draw: st.DrawFn, count: int) -> list[Call]:
    """`count` calls with distinct seqs, each prompt full or compact over an earlier call."""
    seqs = sorted(draw(st.sets(st.integers(0, 10_000), min_size=count, max_size=count)))
    calls: list[Call] = []
    for number, seq in enumerate(seqs):
        completion = draw(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=6))
        size = len(completion)
        call = Call.make(
            f"C{number}",
            seq,
            draw(token_lists),
            completion,
            logprobs=draw(st.none() | st.lists(st.floats(-30, 0), min_size=size, max_size=size)),
            policy_version=draw(st.none() | st.integers(0, 1000)),
            purpose=draw(st.sampled_from(PURPOSES)),
            kept=draw(st.booleans()),
            advantages=draw(
                st.none() | finite | st.lists(finite, min_size=size, max_size=size).map(np.asarray)
            ),
            content=draw(st.none() | json_objects),
            sampling=draw(st.none() | samplings),
        )
        if calls and draw(st.booleans()):
            source = draw(st.sampled_from(calls))
            call.prompt_from = source.id
            call.prompt_from_len = draw(st.integers(1, source.full_len))
        calls.append(call)
    return calls


@st.composite
def episodes(draw: st.DrawFn, index: int | None = None) -> Episode:
    agent_count = draw(st.integers(0, 3))
    agents: list[Agent] = []
    for number in range(agent_count):
        agents.append(
            Agent(
                id=f"A{number}",
                name=draw(st.sampled_from(["leader", "solver", "explore"])),
                parent=draw(st.none() | st.sampled_from([a.id for a in agents] or [None])),
                start=draw(st.sampled_from(AGENT_STARTS)),
                trainable=draw(st.booleans()),
                rewards=draw(st.none() | reward_maps),
                meta=draw(st.none() | json_objects),
            )
        )
    calls = draw(calls_in_seq_order(draw(st.integers(0, 6)) if agents else 0))
    for call in draw(st.permutations(calls)):
        draw(st.sampled_from(agents)).add(call)
    policy = draw(
        st.none()
        | st.tuples(st.integers(0, 50), st.integers(0, 5)).map(
            lambda p: WirePolicy(start=p[0], end=p[0] + p[1])
        )
    )
    return Episode(
        id=draw(names) if index is None else f"ep-{index}",
        agents=agents,
        group=draw(maybe_names),
        env=draw(st.none() | st.builds(WireEnv, id=maybe_names, name=maybe_names)),
        task=draw(json_values),
        run=draw(
            st.none()
            | st.builds(
                WireRun,
                id=maybe_names,
                type=st.sampled_from(["train", "eval"]),
                step=st.none() | st.integers(0, 100),
                policy=st.just(policy),
            )
        ),
        ok=draw(st.booleans()),
        errors=draw(
            st.lists(
                st.builds(
                    WireError,
                    type=names,
                    message=st.text(max_size=8),
                    agent=st.just(msgspec.UNSET) | names,
                    call=st.just(msgspec.UNSET) | names,
                ),
                max_size=2,
            )
        ),
        rewards=draw(reward_maps),
        objective=draw(st.none() | st.sampled_from(["rl", "supervised"])),
        gaps=draw(st.none() | st.lists(gap_objects.map(gap_from_json), max_size=2)),
        meta=draw(st.none() | json_objects),
    )


episode_lists = st.integers(0, 4).flatmap(
    lambda n: st.tuples(*(episodes(index=i) for i in range(n))).map(list)
)


def _float32(values: list[float]) -> list[float]:
    return np.asarray(values, dtype=np.float32).astype(np.float64).tolist()


PROMPT_FORMS = ("prompt_ids", "prompt_from", "prompt_from_len", "prompt_suffix_ids")


def as_plain(episode: Episode, float32: bool = False) -> dict[str, Any]:
    """Every field of the episode as plain data, each prompt resolved to its token ids (a
    reader may share memory with an earlier call where the file spelled the prompt out);
    with `float32`, per-token floats rounded as the binary form stores them."""
    plain = msgspec.to_builtins(episode_to_wire(episode))
    records = {call.id: call for call in episode.calls()}
    for agent in plain["agents"]:
        for call in agent["calls"]:
            for key in PROMPT_FORMS:
                call.pop(key, None)
            call["prompt_ids"] = episode.prompt_ids(records[call["id"]]).tolist()
            for key in ("logprobs", "advantages"):
                if float32 and isinstance(call.get(key), list):
                    call[key] = _float32(call[key])
    return plain
