"""Token lists as other writers spell them: the JSON reader parses an episode's lists into one
buffer, and any list that path cannot take is read call by call with the same record or the
same message as before."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

from callgrove.episode import encode_episode, episode_from_wire, token_array
from callgrove.formats.jsonl import decode_episode_line
from callgrove.formats.problems import InputError

from .helpers import healthy
from .strategies import as_plain, episodes


def _read(line: bytes):
    return episode_from_wire(decode_episode_line(line))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes())
def test_spaced_lists_read_as_compact_ones(episode) -> None:
    line = encode_episode(episode)
    spaced = json.dumps(json.loads(line)).encode()  # ", " between items, as json.dumps writes
    assert as_plain(_read(spaced)) == as_plain(_read(line)) == as_plain(episode)


def test_calls_share_one_token_buffer() -> None:
    read = _read(encode_episode(healthy()))
    calls = list(read.calls())
    buffers = {id(c.completion_ids.base) for c in calls} | {id(c.prompt_suffix.base) for c in calls}
    assert len(buffers) == 1 and all(c.completion_ids.base is not None for c in calls)


def _with_completion(text: str) -> bytes:
    plain = json.loads(encode_episode(healthy()))
    line = json.dumps(plain).replace('"completion_ids": [6, 7]', f'"completion_ids": {text}')
    assert text in line
    return line.encode()


@pytest.mark.parametrize(
    "text",
    ["[-1, 7]", "[6, 7.0]", "[6, 2147483648]", "[6, 99999999999999999999]", "[[6], 7]", '["6"]'],
)
def test_a_list_the_buffer_refuses_gets_the_call_by_call_message(text: str) -> None:
    with pytest.raises(InputError) as raised:
        _read(_with_completion(text))
    with pytest.raises(InputError) as expected:
        token_array(msgspec.Raw(text.encode()), "ok-1", "C2", "completion_ids")
    assert raised.value.problem.message == expected.value.problem.message
    assert (raised.value.problem.episode, raised.value.problem.call) == ("ok-1", "C2")


@pytest.mark.parametrize(("text", "tokens"), [("[ 6 ,7 ]", [6, 7]), ("[ 0]", [0])])
def test_blanks_inside_a_list_are_read(text: str, tokens: list[int]) -> None:
    # logprobs must match the length: the healthy call C2 has two
    line = _with_completion(text)
    if len(tokens) == 1:
        line = line.replace(b"[-0.5, -0.6]", b"[-0.5]")
    read = _read(line)
    assert read.call("C2").completion_ids.tolist() == tokens


def test_a_blank_list_is_empty_not_a_zero() -> None:
    plain = json.loads(encode_episode(healthy()))
    line = json.dumps(plain).replace('"prompt_suffix_ids": []', '"prompt_suffix_ids": [ ]')
    assert "[ ]" in line
    assert _read(line.encode()).call("C3").prompt_suffix.tolist() == []
