"""What a chat format is: messages to tokens one message at a time, and a completion back.

Every message is rendered once, to the tokens it has in any history that holds it, so a history
only ever grows: the prompt of an agent's next call is its previous call's full sequence, the
tokens the template puts after an assistant turn (`trailing`), the new messages, and the opening
of an assistant turn (`generation_prompt`). An assistant message's tokens are always
`generation_prompt + completion + trailing`, with what the model sampled in the middle. The RL
environments, the transcript importer, the gateway and `serve-policy` all render through one
`ChatFormat`, so one conversation is one token sequence wherever it is rendered.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from callgrove.chat.message import Message
from callgrove.chat.parse import PARSERS
from callgrove.episode import TOKEN_DTYPE
from callgrove.errors import InvalidValue

EMPTY = np.zeros(0, dtype=TOKEN_DTYPE)


class ChatFormat(ABC):
    """A tokenizer and a turn template, rendered message by message."""

    name: str
    """Recorded in an imported episode's `meta.renderer`: which format made its tokens."""

    def __init__(self, parser: str = "hermes", stop_token_ids: Sequence[int] = ()):
        if parser not in PARSERS:
            raise InvalidValue(f"unknown tool-call parser {parser!r}; known: {sorted(PARSERS)}")
        self.parser = parser
        self._stops = tuple(int(t) for t in stop_token_ids)

    # -- the tokenizer -------------------------------------------------------------------------

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """How many token ids the tokenizer has (special tokens included)."""

    @property
    @abstractmethod
    def special_ids(self) -> frozenset[int]:
        """The template's special tokens (turn markers): never part of a message's text."""

    @abstractmethod
    def encode(self, text: str) -> np.ndarray:
        """Plain text as tokens (int32), no special tokens added."""

    @abstractmethod
    def decode(self, ids: np.ndarray) -> str:
        """Tokens as text, special tokens written out."""

    # -- the template --------------------------------------------------------------------------

    @abstractmethod
    def segment(self, message: Message, previous: Message | None) -> np.ndarray:
        """One whole message, following `previous` (None: the history starts with it)."""

    @abstractmethod
    def generation_prompt(self) -> np.ndarray:
        """The opening of an assistant turn: what the model continues from."""

    @abstractmethod
    def completion(self, message: Message, previous: Message | None) -> np.ndarray:
        """An assistant message's tokens as the model samples them, its end marker included."""

    @abstractmethod
    def trailing(self, message: Message, previous: Message | None) -> np.ndarray:
        """What the template writes after an assistant message's end marker."""

    # -- written once for every format ---------------------------------------------------------

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Tokens that end a sampled assistant turn (kept as the completion's last token):
        given, or else the end marker of a rendered assistant message."""
        if not self._stops:
            ending = self.completion(Message("assistant", "x"), Message("user", "."))
            self._stops = (int(ending[-1]),) if len(ending) else ()
        return self._stops

    def render(self, messages: Sequence[Message], previous: Message | None = None) -> np.ndarray:
        """The tokens of `messages` following `previous`, then the opening of an assistant turn."""
        parts = []
        for message in messages:
            parts.append(self.segment(message, previous))
            previous = message
        parts.append(self.generation_prompt())
        return np.concatenate(parts).astype(TOKEN_DTYPE, copy=False)

    def is_special(self, token: int) -> bool:
        return token in self.special_ids

    def text_of(self, completion_ids: np.ndarray) -> str:
        """A completion's text without the special tokens that end it."""
        ids = np.asarray(completion_ids)
        end = len(ids)
        while end and int(ids[end - 1]) in self.special_ids:
            end -= 1
        return self.decode(ids[:end])

    def parse(self, completion_ids: np.ndarray) -> Message:
        """A completion as an assistant message: text, reasoning and tool calls."""
        return PARSERS[self.parser](self.text_of(completion_ids))

    def show(self, token_ids: np.ndarray) -> str:
        """Any tokens as readable text, markers included (sample tables, displays)."""
        return self.decode(token_ids)
