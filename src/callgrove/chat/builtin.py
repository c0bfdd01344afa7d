"""The built-in chat format: UTF-8 bytes and two turn markers, nothing to download.

`<|start|>ROLE\\nBODY<|end|>` per message; `docs/transcripts.md` gives the body each message
kind renders to.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import orjson

from callgrove.chat.format import EMPTY, ChatFormat
from callgrove.chat.message import Message
from callgrove.episode import TOKEN_DTYPE


class ByteTokenizer:
    """One token per UTF-8 byte (ids 0-255) and two special tokens that frame turns."""

    START = 256
    END = 257
    vocab_size = 258
    specials: ClassVar[dict[int, str]] = {START: "<|start|>", END: "<|end|>"}

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(TOKEN_DTYPE)

    def decode(self, ids: np.ndarray) -> str:
        ids = np.asarray(ids)
        parts: list[str] = []
        start = 0
        for index in np.flatnonzero(ids > 255):  # only the few turn markers are visited
            parts.append(ids[start:index].astype(np.uint8).tobytes().decode("utf-8", "replace"))
            parts.append(self.specials.get(int(ids[index]), f"<|{int(ids[index])}|>"))
            start = index + 1
        parts.append(ids[start:].astype(np.uint8).tobytes().decode("utf-8", "replace"))
        return "".join(parts)


def message_body(message: Message) -> str:
    """The text inside a turn of the built-in format."""
    if message.role == "tool":
        error = ' error="true"' if message.is_error else ""
        return f'<tool_result id="{message.tool_call_id}"{error}>\n{message.text}\n</tool_result>'
    parts: list[str] = []
    if message.thinking:
        parts.append(f"<think>\n{message.thinking}\n</think>")
    if message.text:
        parts.append(message.text)
    for call in message.tool_calls:
        payload = {"id": call.id, "name": call.name, "arguments": call.arguments}
        parts.append(f"<tool_call>\n{orjson.dumps(payload).decode()}\n</tool_call>")
    return "\n".join(parts)


class BuiltinFormat(ChatFormat):
    """`<|start|>ROLE\\nBODY<|end|>` per message over the byte tokenizer."""

    name = "builtin"
    _SPECIALS = frozenset(ByteTokenizer.specials)

    def __init__(self) -> None:
        super().__init__("builtin", (ByteTokenizer.END,))
        self.tokenizer = ByteTokenizer()
        self._start = np.array([ByteTokenizer.START], dtype=TOKEN_DTYPE)
        self._end = np.array([ByteTokenizer.END], dtype=TOKEN_DTYPE)
        self._generation = np.concatenate([self._start, self.tokenizer.encode("assistant\n")])

    @property
    def vocab_size(self) -> int:
        return ByteTokenizer.vocab_size

    @property
    def special_ids(self) -> frozenset[int]:
        return self._SPECIALS

    def encode(self, text: str) -> np.ndarray:
        return self.tokenizer.encode(text)

    def decode(self, ids: np.ndarray) -> str:
        return self.tokenizer.decode(ids)

    def segment(self, message: Message, previous: Message | None) -> np.ndarray:
        if message.role == "assistant":
            return np.concatenate([self._generation, self.completion(message, previous)])
        head = self.tokenizer.encode(f"{message.role}\n{message_body(message)}")
        return np.concatenate([self._start, head, self._end])

    def generation_prompt(self) -> np.ndarray:
        return self._generation

    def completion(self, message: Message, previous: Message | None) -> np.ndarray:
        return np.concatenate([self.tokenizer.encode(message_body(message)), self._end])

    def trailing(self, message: Message, previous: Message | None) -> np.ndarray:
        return EMPTY
