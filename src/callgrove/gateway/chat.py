"""A model's chat format as the gateway and `serve-policy` use it: render, stop, parse back.

Conversations are rendered with the project's renderer (`callgrove.transcripts.render`), one
message at a time, so a prompt rendered in pieces equals the prompt rendered whole. A completion
is parsed back into text, reasoning and tool calls by the parser of its template family: the
built-in format and Hermes-style templates (Qwen, Hermes, many others) both write
`<think>...</think>` and `<tool_call>{json}</tool_call>`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from callgrove.episode import TOKEN_DTYPE
from callgrove.transcripts import BuiltinFormat, ByteTokenizer, JinjaFormat, Message, ToolCall
from callgrove.transcripts.render import ChatFormat

_THINK = re.compile(r"<think>\s*(.*?)\s*</think>", re.S)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_call_ids = itertools.count(1)


def parse_hermes(text: str) -> Message:
    """`<think>` reasoning, `<tool_call>{"name", "arguments"[, "id"]}</tool_call>` calls, the rest text."""
    thinking = "\n".join(m.group(1) for m in _THINK.finditer(text))
    calls: list[ToolCall] = []
    for match in _TOOL_CALL.finditer(text):
        try:
            payload = orjson.loads(match.group(1))
        except orjson.JSONDecodeError:
            continue  # not a call: it stays in the text, where the harness can see it
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            continue
        arguments = payload.get("arguments", payload.get("parameters", {}))
        if isinstance(arguments, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                arguments = orjson.loads(arguments)
        call_id = payload.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{next(_call_ids):08d}"
        calls.append(ToolCall(call_id, payload["name"], arguments))
        text = text.replace(match.group(0), "", 1)
    text = _THINK.sub("", text)
    return Message("assistant", text.strip(), thinking.strip(), tuple(calls))


PARSERS = {"builtin": parse_hermes, "hermes": parse_hermes}


def tools_message(tools: Sequence[dict[str, Any]]) -> Message | None:
    """The tools a request offers, as a system message the model reads (None without tools)."""
    if not tools:
        return None
    lines = "\n".join(orjson.dumps(tool, option=orjson.OPT_SORT_KEYS).decode() for tool in tools)
    return Message(
        "system",
        "# Tools\nCall a tool by writing <tool_call>"
        '{"name": NAME, "arguments": {...}}</tool_call>.\n' + lines,
    )


@dataclass
class Chat:
    """A chat format with its stop tokens and completion parser."""

    format: ChatFormat
    stop_token_ids: tuple[int, ...]
    parser: str = "hermes"
    _specials: set[int] = field(default_factory=set)

    @classmethod
    def builtin(cls) -> Chat:
        return cls(BuiltinFormat(), (ByteTokenizer.END,), "builtin", {256, 257})

    @classmethod
    def jinja(
        cls,
        tokenizer: str | os.PathLike[str],
        template: str | os.PathLike[str],
        parser: str = "hermes",
        stop_token_ids: Sequence[int] = (),
    ) -> Chat:
        chat_format = JinjaFormat(tokenizer, template)
        stops = tuple(stop_token_ids)
        if not stops:  # the special token that ends an assistant turn in this template
            ending = chat_format.completion(Message("assistant", "x"), Message("user", "."))
            stops = (int(ending[-1]),) if len(ending) else ()
        return cls(chat_format, stops, parser, set(chat_format.special_ids))

    def __post_init__(self) -> None:
        if self.parser not in PARSERS:
            raise ValueError(f"unknown tool-call parser {self.parser!r}; known: {sorted(PARSERS)}")

    @property
    def vocab_size(self) -> int:
        """How many token ids the format's tokenizer has."""
        tokenizer = self.format.tokenizer  # type: ignore[attr-defined]
        if hasattr(tokenizer, "get_vocab_size"):  # a `tokenizers.Tokenizer`, added tokens too
            return int(tokenizer.get_vocab_size())
        size = tokenizer.vocab_size
        return int(size() if callable(size) else size)

    def encode(self, text: str) -> np.ndarray:
        tokenizer = self.format.tokenizer  # type: ignore[attr-defined]
        if isinstance(tokenizer, ByteTokenizer):
            return tokenizer.encode(text)
        return np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=TOKEN_DTYPE)

    def decode(self, ids: np.ndarray) -> str:
        return self.format.decode(ids)

    def text_of(self, completion_ids: np.ndarray) -> str:
        """The completion's text without the turn-ending special tokens."""
        ids = np.asarray(completion_ids)
        while len(ids) and int(ids[-1]) in self._specials:
            ids = ids[:-1]
        return self.format.decode(ids)

    def parse(self, completion_ids: np.ndarray) -> Message:
        return PARSERS[self.parser](self.text_of(completion_ids))

    def render(self, messages: Sequence[Message], previous: Message | None = None) -> np.ndarray:
        """The tokens of `messages` following `previous`, then the opening of an assistant turn."""
        parts = []
        for message in messages:
            parts.append(self.format.segment(message, previous))
            previous = message
        parts.append(self.format.generation_prompt())
        return np.concatenate(parts).astype(TOKEN_DTYPE, copy=False)

    def completion(self, message: Message, previous: Message | None) -> np.ndarray:
        """The tokens an assistant message is sampled as (what a scripted policy answers)."""
        return self.format.completion(message, previous)

    def trailing(self, message: Message, previous: Message | None) -> np.ndarray:
        return self.format.trailing(message, previous)

    def is_special(self, token: int) -> bool:
        return token in self._specials


class PlainText:
    """The text of a completion being streamed that may go to the client before it ends: up to
    anything that could start markup (`<`: reasoning, a tool call), without leading or trailing
    whitespace (the parse strips both) or a character still being decoded. What it hands out is
    therefore always a prefix of the parsed reply's text."""

    def __init__(self, chat: Chat):
        self.chat = chat
        self.ids: list[np.ndarray] = []
        self.sent = ""
        self.held = False  # markup began: nothing more goes out early

    def add(self, token_ids: np.ndarray) -> str:
        """Take the next tokens; returns the text that may go out now."""
        self.ids.append(token_ids)
        if self.held:
            return ""
        text = self.chat.text_of(np.concatenate(self.ids)).lstrip()
        cut = text.find("<")
        if cut >= 0:
            self.held = True
            text = text[:cut]
        text = text.rstrip().rstrip("\ufffd").rstrip()
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta
