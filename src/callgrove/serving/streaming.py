"""A completion's text streamed to a client while it is still being sampled."""

from __future__ import annotations

import numpy as np

from callgrove.chat import ChatFormat


class PlainText:
    """The text of a completion being streamed that may go to the client before it ends: up to
    anything that could start markup (`<`: reasoning, a tool call), without leading or trailing
    whitespace (the parse strips both) or a character still being decoded. What it hands out is
    therefore always a prefix of the parsed reply's text."""

    def __init__(self, chat: ChatFormat):
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
