"""The reference decoder's chat format: one token per character of a small alphabet.

Ids 0-2 are the role headers (`system`, `user`, `assistant`), 3 ends a message, and the
alphabet follows: the vocabulary of the built-in RL environments, small enough for the tiny
decoder to learn on a laptop CPU.
"""

from __future__ import annotations

import numpy as np

from callgrove.chat.format import EMPTY, ChatFormat
from callgrove.chat.message import Message
from callgrove.episode import TOKEN_DTYPE
from callgrove.errors import InvalidValue

HEADERS = ("system", "user", "assistant")


class CharFormat(ChatFormat):
    """`HEADER TEXT END` per message, a token per character."""

    name = "chars"
    END = 3

    def __init__(self, alphabet: str = "0123456789abcdefghijklmnopqrstuvwxyz :=,.?+->"):
        if len(set(alphabet)) != len(alphabet):
            raise InvalidValue("the alphabet repeats a character")
        super().__init__("hermes", (self.END,))
        self.alphabet = alphabet
        self._ids = {ch: i + 4 for i, ch in enumerate(alphabet)}
        # A header sampled inside a completion reads as "?", so replies can be quoted back.
        self._text = np.array(["?", "?", "?", "", *alphabet], dtype=object)
        self._shown = np.array(
            ["\n[system] ", "\n[user] ", "\n[assistant] ", "⏎", *alphabet], dtype=object
        )
        self._generation = np.array([HEADERS.index("assistant")], dtype=TOKEN_DTYPE)
        self._generation.flags.writeable = False  # handed out shared, never copied

    @property
    def vocab_size(self) -> int:
        return 4 + len(self.alphabet)

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset((self.END,))

    def encode(self, text: str) -> np.ndarray:
        try:
            return np.fromiter((self._ids[ch] for ch in text), TOKEN_DTYPE, len(text))
        except KeyError as error:
            raise InvalidValue(
                f"{error.args[0]!r} is not in the alphabet {self.alphabet!r}"
            ) from None

    def decode(self, ids: np.ndarray) -> str:
        """The characters; an end token reads as nothing, a role header as "?"."""
        return "".join(self._text[np.asarray(ids)])

    def segment(self, message: Message, previous: Message | None) -> np.ndarray:
        if message.role not in HEADERS:
            raise InvalidValue(f"unknown role {message.role!r}; expected one of {HEADERS}")
        body = self.encode(message.text)
        out = np.empty(len(body) + 2, dtype=TOKEN_DTYPE)
        out[0], out[1:-1], out[-1] = HEADERS.index(message.role), body, self.END
        return out

    def generation_prompt(self) -> np.ndarray:
        return self._generation

    def completion(self, message: Message, previous: Message | None) -> np.ndarray:
        return self.segment(message, previous)[1:]

    def trailing(self, message: Message, previous: Message | None) -> np.ndarray:
        return EMPTY

    def show(self, token_ids: np.ndarray) -> str:
        return "".join(self._shown[np.asarray(token_ids)]).lstrip("\n")
