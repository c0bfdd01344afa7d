"""A policy that answers from a script: reproducible harness runs without a trained model.

A script is a JSON file:

    {"rules": [{"when": "SPAWN", "reply": {"text": "...", "tool_calls": [...]}, "times": 1},
               ...],
     "default": {"text": "done"}}

For each prompt the first rule whose `when` strings all occur in the prompt's newest messages
(everything after the last assistant turn; `"in": "prompt"` searches the whole prompt) and that
has fired fewer than `times` times (unlimited without it) gives the reply; `default` otherwise.
A rule's `capture` is a regular expression searched in the same text; its named groups fill
`{name}` in the reply's strings (an id the harness returned, to pass back to it), and the rule
matches only when the expression does.
A reply is an assistant message (`text`, `thinking`, `tool_calls` of `{"name", "arguments"}`
with an optional `id`), rendered to the completion tokens of the chat format, each token given
a fixed sampling log-probability so the ledger has real numbers to carry; the script answers
under whatever distribution a call asks for, and says so (the call's `sampling`), so that a
client that must know it (a gateway in front of `serve-policy --script`) can record the call.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from callgrove.chat import ChatFormat, Message, ToolCall
from callgrove.episode import LOGPROB_DTYPE
from callgrove.errors import InvalidValue
from callgrove.formats.problems import InputError, Problem
from callgrove.policy import Completion, SamplingParams

SCRIPT_LOGPROB = -0.25
"""The log-probability each scripted token is given."""


@dataclass
class Rule:
    when: tuple[str, ...]
    reply: Message
    times: int | None = None
    whole_prompt: bool = False
    capture: re.Pattern[str] | None = None
    fired: int = 0

    def answer(self, newest: str, prompt: str) -> Message | None:
        """The reply when the rule matches (captures filled in), else None."""
        if self.times is not None and self.fired >= self.times:
            return None
        haystack = prompt if self.whole_prompt else newest
        if not all(needle in haystack for needle in self.when):
            return None
        if self.capture is None:
            return self.reply
        found = self.capture.search(haystack)
        if found is None:
            return None
        values = {k: v for k, v in found.groupdict().items() if v is not None}
        return _filled(self.reply, values)


def _fill(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, text in values.items():
            value = value.replace("{" + name + "}", text)
        return value
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    return value


def _filled(message: Message, values: dict[str, str]) -> Message:
    calls = tuple(ToolCall(c.id, c.name, _fill(c.arguments, values)) for c in message.tool_calls)
    return Message("assistant", _fill(message.text, values), _fill(message.thinking, values), calls)


class _ToolCallSpec(msgspec.Struct):
    name: str
    arguments: dict[str, Any] | str = msgspec.field(default_factory=dict)
    id: str | None = None  # absent or empty: one is made up (`toolu_script_0001`)


class _ReplySpec(msgspec.Struct):
    text: str = ""
    thinking: str = ""
    tool_calls: list[_ToolCallSpec] | None = None


class _RuleSpec(msgspec.Struct):
    reply: str | _ReplySpec
    when: str | list[str] = msgspec.field(default_factory=list)
    times: Annotated[int, msgspec.Meta(ge=1)] | None = None
    where: Literal["newest", "prompt"] = msgspec.field(default="newest", name="in")
    capture: str | None = None


class _ScriptSpec(msgspec.Struct):
    """A script file as written, every field typed: a value of the wrong type (a `when` that is
    a number, a `reply` that is null) is refused at the edge, naming the rule and the field."""

    rules: list[_RuleSpec] = msgspec.field(default_factory=list)
    default: str | _ReplySpec = "done"


def _reply(spec: str | _ReplySpec, ids: itertools.count) -> Message:
    if isinstance(spec, str):
        return Message("assistant", spec)
    calls = tuple(
        ToolCall(call.id or f"toolu_script_{next(ids):04d}", call.name, call.arguments)
        for call in spec.tool_calls or []
    )
    return Message("assistant", spec.text, spec.thinking, calls)


def _rule(spec: _RuleSpec, where: str, ids: itertools.count) -> Rule:
    try:
        capture = re.compile(spec.capture) if spec.capture else None
    except re.error as error:
        raise InvalidValue(f"{where}.capture: bad expression: {error}") from None
    when = (spec.when,) if isinstance(spec.when, str) else tuple(spec.when)
    return Rule(when, _reply(spec.reply, ids), spec.times, spec.where == "prompt", capture)


def _invalid(error: msgspec.ValidationError) -> str:
    """msgspec's `Expected `str`, got `int` - at `$.rules[0].when`` as
    `rules[0].when: Expected `str`, got `int``: the rule's index and the field first."""
    typed = re.match(r"(.*) - at `\$\.?([^`]*)`", str(error))
    if typed is None:  # the file as a whole
        return f"a script is a JSON object with `rules` and `default`: {error}"
    return f"{typed.group(2)}: {typed.group(1)}"


@dataclass
class Script:
    rules: list[Rule]
    default: Message
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Script:
        file = str(path)
        try:
            spec = msgspec.json.decode(Path(path).read_bytes(), type=_ScriptSpec)
        except msgspec.ValidationError as error:
            raise InputError(Problem(f"bad script: {_invalid(error)}", file=file)) from None
        except (OSError, msgspec.DecodeError) as error:
            raise InputError(Problem(f"cannot read script: {error}", file=file)) from None
        ids = itertools.count(1)
        try:
            rules = [_rule(rule, f"rules[{i}]", ids) for i, rule in enumerate(spec.rules)]
        except ValueError as error:
            raise InputError(Problem(f"bad script: {error}", file=file)) from None
        default = _reply(spec.default, ids)
        return cls(rules, default, ids)

    def answer(self, newest: str, prompt: str) -> Message:
        for rule in self.rules:
            reply = rule.answer(newest, prompt)
            if reply is not None:
                rule.fired += 1
                return reply
        return self.default


def newest_messages(chat: ChatFormat, prompt_ids: np.ndarray) -> np.ndarray:
    """The prompt's tokens after its last assistant turn (all of it when there is none).

    An assistant turn is the generation prompt followed by a completion that ends at its first
    special token; the prompt's own closing generation prompt is left out.
    """
    opening = np.asarray(chat.generation_prompt())
    ids = np.asarray(prompt_ids)
    body = ids[: len(ids) - len(opening)] if _ends_with(ids, opening) else ids
    width = len(opening)
    if width == 0 or len(body) < width:
        return body
    windows = np.lib.stride_tricks.sliding_window_view(body, width)
    starts = np.flatnonzero((windows == opening).all(axis=1))
    if not starts.size:
        return body
    after = int(starts[-1]) + width
    for position in range(after, len(body)):
        if chat.is_special(int(body[position])):
            return body[position + 1 :]
    return body[after:]


def _ends_with(ids: np.ndarray, tail: np.ndarray) -> bool:
    return len(ids) >= len(tail) and bool((ids[len(ids) - len(tail) :] == tail).all())


class ScriptedPolicy:
    """`PolicyClient` that answers each prompt from a `Script`, in the chat format's tokens."""

    def __init__(self, script: Script, chat: ChatFormat, version: int = 0):
        self.script = script
        self.chat = chat
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    def _text(self, ids: np.ndarray) -> str:
        """Decoded text without special tokens: rules match what was said, not the markup."""
        ids = np.asarray(ids)
        keep = [not self.chat.is_special(int(t)) for t in ids]
        return self.chat.decode(ids[np.asarray(keep, dtype=bool)]) if len(ids) else ""

    def _cut_at_stops(self, completion: np.ndarray, params: SamplingParams) -> np.ndarray:
        """The reply up to and with the first token that is a stop token or whose text completes
        a stop string, as a sampler would have ended it."""
        stop_ids = np.isin(completion, np.asarray(params.stop_token_ids, dtype=completion.dtype))
        end = int(np.argmax(stop_ids)) + 1 if stop_ids.any() else len(completion)
        if params.stop:
            for length in range(1, end + 1):
                if any(stop in self.chat.text_of(completion[:length]) for stop in params.stop):
                    return completion[:length]
        return completion[:end]

    async def sample(self, prompt_ids: np.ndarray, params: SamplingParams) -> Completion:
        newest = self._text(newest_messages(self.chat, prompt_ids))
        reply = self.script.answer(newest, self._text(prompt_ids))
        completion = self._cut_at_stops(self.chat.completion(reply, None), params)
        finish = "stop"
        if len(completion) > params.max_tokens:
            completion, finish = completion[: params.max_tokens], "length"
        return Completion(
            completion_ids=completion,
            logprobs=np.full(len(completion), SCRIPT_LOGPROB, dtype=LOGPROB_DTYPE),
            policy_version=self._version,
            finish_reason=finish,
            sampling=params.record(),
        )
