"""Renderers: chat messages to token ids, one message at a time, so histories only ever grow.

An agent's history is a token array. A turn appends the rendered new messages and the
assistant's generation prompt to it, and the sampled completion after that; the next turn's
prompt therefore extends the previous call's full sequence exactly, with no re-tokenisation of
the history (whose tokens might come out differently the second time). A backend with its own
chat template (a Hugging Face tokenizer) implements the same three methods.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from callgrove.episode import TOKEN_DTYPE

ROLES = ("system", "user", "assistant")


@runtime_checkable
class Renderer(Protocol):
    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Tokens that end an assistant message (kept as the completion's last token)."""
        ...

    def render(self, role: str, text: str) -> np.ndarray:
        """One whole message, header to end marker (int32)."""
        ...

    def generation_prompt(self) -> np.ndarray:
        """The assistant's header: what the model continues from."""
        ...

    def parse(self, completion_ids: np.ndarray) -> str:
        """The text of a completion, its end marker left out."""
        ...

    def show(self, token_ids: np.ndarray) -> str:
        """Any tokens as readable text, markers included (for sample tables and displays)."""
        ...


class CharRenderer:
    """One token per character of a small alphabet, plus a header token per role and an end token.

    The vocabulary of the reference decoder's built-in environments: ids 0-2 are the role
    headers (`system`, `user`, `assistant`), 3 ends a message, and the alphabet follows.
    """

    END = 3

    def __init__(self, alphabet: str = "0123456789abcdefghijklmnopqrstuvwxyz :=,.?+->"):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("the alphabet repeats a character")
        self.alphabet = alphabet
        self._ids = {ch: i + 4 for i, ch in enumerate(alphabet)}
        # A header sampled inside a completion reads as "?", so replies can be quoted back.
        self._text = np.array(["?", "?", "?", "", *alphabet], dtype=object)
        self._shown = np.array(
            ["\n[system] ", "\n[user] ", "\n[assistant] ", "⏎", *alphabet], dtype=object
        )
        self._generation_prompt = np.array([ROLES.index("assistant")], dtype=TOKEN_DTYPE)
        self._generation_prompt.flags.writeable = False  # handed out shared, never copied

    @property
    def vocab_size(self) -> int:
        return 4 + len(self.alphabet)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return (self.END,)

    def encode(self, text: str) -> np.ndarray:
        try:
            return np.fromiter((self._ids[ch] for ch in text), TOKEN_DTYPE, len(text))
        except KeyError as error:
            raise ValueError(
                f"{error.args[0]!r} is not in the alphabet {self.alphabet!r}"
            ) from None

    def render(self, role: str, text: str) -> np.ndarray:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        body = self.encode(text)
        out = np.empty(len(body) + 2, dtype=TOKEN_DTYPE)
        out[0], out[1:-1], out[-1] = ROLES.index(role), body, self.END
        return out

    def generation_prompt(self) -> np.ndarray:
        return self._generation_prompt

    def parse(self, completion_ids: np.ndarray) -> str:
        """The completion's characters; an end token before the last reads as nothing, a
        role header as "?"."""
        ids = np.asarray(completion_ids)
        if len(ids) and ids[-1] == self.END:
            ids = ids[:-1]
        return "".join(self._text[ids])

    def show(self, token_ids: np.ndarray) -> str:
        return "".join(self._shown[np.asarray(token_ids)]).lstrip("\n")
