"""Every rule of `episode/checks.py` and `episode/codec.py`, broken one at a time in the middle
of a file: the problem names the file, the line (the row of a binary file), the episode and the
call, and the episodes around it are still read. `save` refuses each one before writing."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import pytest

from callgrove.episode import (
    Episode,
    episode_to_wire,
    is_binary,
    load,
    save,
    write_binary_episodes,
    write_episodes,
)
from callgrove.formats import Diagnostics, InputError
from callgrove.formats.wire import WirePolicy

from .helpers import healthy

Break = Callable[[Episode], None]


def _call(episode: Episode, call_id: str):
    return episode.call(call_id)


def _set(call_id: str, **fields: object) -> Break:
    def apply(episode: Episode) -> None:
        call = _call(episode, call_id)
        for name, value in fields.items():
            setattr(call, name, value)

    return apply


def _agent(agent_id: str, **fields: object) -> Break:
    def apply(episode: Episode) -> None:
        agent = episode.agent(agent_id)
        for name, value in fields.items():
            setattr(agent, name, value)

    return apply


def _later_reference(episode: Episode) -> None:
    first, last = _call(episode, "C1"), _call(episode, "C3")
    first.prompt_from, first.prompt_from_len = last.id, 1


def _run(**fields: object) -> Break:
    def apply(episode: Episode) -> None:
        for name, value in fields.items():
            setattr(episode.run, name, value)

    return apply


def _reward(episode: Episode) -> None:
    episode.rewards["tests_pass"] = float("inf")


# (what is broken, how, the message it must give, the call it must name)
RULES: list[tuple[str, Break, str, str | None]] = [
    (
        "negative token",
        _set("C2", completion_ids=np.array([-1, 7], np.int32)),
        "negative token id",
        "C2",
    ),
    (
        "empty completion",
        _set("C2", completion_ids=np.zeros(0, np.int32), logprobs=None),
        "completion_ids is empty",
        "C2",
    ),
    ("logprobs length", _set("C2", logprobs=np.array([-0.5])), "logprobs has 1 values", "C2"),
    (
        "advantages length",
        _set("C2", advantages=np.array([0.5, 0.5, 0.5])),
        "advantages has 3 values",
        "C2",
    ),
    ("purpose", _set("C2", purpose="think"), "purpose is 'think'", "C2"),
    ("duplicate call id", _set("C2", id="C1"), "call id 'C1' appears twice", "C1"),
    ("duplicate seq", _set("C2", seq=1), "seq 1 is used by both", None),
    ("later reference", _later_reference, "not an earlier call", "C1"),
    ("reference too long", _set("C3", prompt_from_len=99), "prompt_from_len 99 is outside", "C3"),
    ("agent start", _agent("S", start="spawned"), "has start 'spawned'", None),
    ("duplicate agent", _agent("S", id="L", parent=None), "agent id 'L' appears twice", None),
    ("missing parent", _agent("S", parent="X"), "names parent agent 'X'", None),
    ("own parent", _agent("S", parent="S"), "names itself as its parent", None),
    ("run type", _run(type="rollout"), "run.type is 'rollout'", None),
    ("policy span", _run(policy=WirePolicy(start=5, end=4)), r"run\.policy\.end \(4\)", None),
    # JSON has no infinity: the JSON writer writes null, which the reader rejects as such
    ("reward", _reward, "reward 'tests_pass' is not a finite number|got `null`", None),
]
FORMS = [".jsonl", ".jsonl.gz", ".parquet", ".arrow"]


def _file_with_broken_middle(path: Path, rule: Break) -> None:
    """Written as they are, with the unchecked writers: `save` refuses the broken one."""
    broken = healthy("bad")
    rule(broken)
    episodes = [healthy("ok-0"), broken, healthy("ok-2")]
    if is_binary(path):
        write_binary_episodes(path, episodes)
    else:
        write_episodes(path, episodes)


@pytest.mark.parametrize("suffix", FORMS)
@pytest.mark.parametrize(("name", "rule", "message", "call"), RULES, ids=[r[0] for r in RULES])
def test_save_refuses_what_load_would_refuse(
    tmp_path: Path, suffix: str, name: str, rule: Break, message: str, call: str | None
) -> None:
    broken = healthy("bad")
    rule(broken)
    with pytest.raises(InputError) as raised:
        save(tmp_path / f"episodes{suffix}", [healthy("ok-0"), broken])
    problem = raised.value.problem
    assert problem.episode == "bad", name
    if call is not None:
        assert problem.call == call
    # the reward rule's other spelling is the JSON reader's; the record rule is the first one
    assert re.search(message.split("|")[0], problem.message)


@pytest.mark.parametrize("suffix", FORMS)
@pytest.mark.parametrize(("name", "rule", "message", "call"), RULES, ids=[r[0] for r in RULES])
def test_each_rule_is_reported_where_it_is_broken(
    tmp_path: Path, suffix: str, name: str, rule: Break, message: str, call: str | None
) -> None:
    path = tmp_path / f"episodes{suffix}"
    _file_with_broken_middle(path, rule)
    diagnostics = Diagnostics()
    kept = list(load(path, diagnostics))
    assert [e.id for e in kept] == ["ok-0", "ok-2"], name
    (problem,) = diagnostics.problems
    assert re.search(message, problem.message)
    assert (problem.file, problem.line, problem.episode) == (str(path), 2, "bad")
    if call is not None:
        assert problem.call == call
    assert problem.severity == "error"

    read_before_error = []
    with pytest.raises(InputError) as raised:
        for episode in load(path):
            read_before_error.append(episode.id)
    assert read_before_error == ["ok-0"]
    assert raised.value.problem == problem


@pytest.mark.parametrize("suffix", FORMS)
@pytest.mark.parametrize("field", ["completion_ids", "prompt_suffix"])
def test_a_token_id_past_32_bits_is_refused_not_wrapped(
    tmp_path: Path, suffix: str, field: str
) -> None:
    """An int64 array can hold an id no form stores: `save` refuses it by name, and so does
    the unchecked binary writer, whose cast to int32 would wrap it into another id."""
    broken = healthy("bad")
    _set("C2", **{field: np.array([2**31, 7], np.int64)})(broken)
    stored = "prompt_suffix_ids" if field == "prompt_suffix" else field
    message = f"{stored} holds a value that is not a token id in [0, 2147483647]"
    path = tmp_path / f"episodes{suffix}"
    for writer in (save, write_binary_episodes) if is_binary(path) else (save,):
        with pytest.raises(InputError) as raised:
            writer(path, [healthy("ok-0"), broken])
        problem = raised.value.problem
        assert (problem.message, problem.episode, problem.call) == (message, "bad", "C2")


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "logprobs",
            np.array([-0.5, np.nan]),
            "logprobs holds a value that is not a finite number",
        ),
        (
            "advantages",
            np.array([0.5, np.inf]),
            "advantages holds a value that is not a finite number",
        ),
        ("advantages", float("inf"), "advantages is not a finite number"),
    ],
)
def test_binary_rejects_non_finite_values(
    tmp_path: Path, suffix: str, field: str, value: object, message: str
) -> None:
    """Binary files can hold NaN and infinity, which JSON cannot: the same rules apply."""
    path = tmp_path / f"episodes{suffix}"
    _file_with_broken_middle(path, _set("C2", **{field: value}))
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["ok-0", "ok-2"]
    (problem,) = diagnostics.problems
    assert (problem.message, problem.line, problem.episode, problem.call) == (
        message,
        2,
        "bad",
        "C2",
    )


def _wire_dict(episode: Episode) -> dict:
    """The episode exactly as the JSON writer spells it (compact prompts included)."""
    return msgspec.to_builtins(episode_to_wire(episode))


def _jsonl_with_middle(path: Path, middle: dict) -> None:
    lines = [_wire_dict(healthy("ok-0")), middle, _wire_dict(healthy("ok-2"))]
    text = b"".join(msgspec.json.encode(line) + b"\n" for line in lines)
    # msgspec writes infinities as null; put back the literal a careless writer would emit
    path.write_bytes(text.replace(b"12345.5", b"1e999"))


def _wire_call(plain: dict, call_id: str) -> dict:
    return next(c for a in plain["agents"] for c in a["calls"] if c["id"] == call_id)


def _both_prompt_forms(plain: dict) -> None:
    _wire_call(plain, "C3")["prompt_ids"] = [1]


def _half_compact(plain: dict) -> None:
    del _wire_call(plain, "C3")["prompt_from_len"]


def _unknown_reference(plain: dict) -> None:
    _wire_call(plain, "C3")["prompt_from"] = "C9"


def _wrong_format(plain: dict) -> None:
    plain["format"] = "callgrove.episode/0"


def _token_too_big(plain: dict) -> None:
    _wire_call(plain, "C2")["completion_ids"] = [2**31, 1]


def _logprob_infinite(plain: dict) -> None:
    _wire_call(plain, "C2")["logprobs"] = [-0.5, 12345.5]


def _reward_infinite(plain: dict) -> None:
    plain["rewards"]["tests_pass"] = 12345.5


def _wrong_type(plain: dict) -> None:
    _wire_call(plain, "C2")["seq"] = "two"


@pytest.mark.parametrize(
    ("change", "message", "call"),
    [
        (_both_prompt_forms, "both prompt_ids and prompt_from", "C3"),
        (_half_compact, "lacks prompt_from_len", "C3"),
        (_unknown_reference, "prompt_from names 'C9'", "C3"),
        (_wrong_format, "format is 'callgrove.episode/0'", None),
        (_token_too_big, "not a token id", "C2"),
        # a number beyond float64 is refused by the JSON decoder itself
        (_logprob_infinite, "Number out of range", "C2"),
        (_reward_infinite, "Number out of range", None),
        (_wrong_type, "Expected `int`", "C2"),
    ],
)
def test_json_only_rules_name_line_episode_and_call(
    tmp_path: Path, change: Callable[[dict], None], message: str, call: str | None
) -> None:
    plain = _wire_dict(healthy("bad"))
    change(plain)
    path = tmp_path / "episodes.jsonl"
    _jsonl_with_middle(path, plain)
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["ok-0", "ok-2"]
    (problem,) = diagnostics.problems
    assert message in problem.message
    assert (problem.file, problem.line) == (str(path), 2)
    if "out of range" not in message:  # such a line cannot be decoded to find its ids
        assert (problem.episode, problem.call) == ("bad", call)
