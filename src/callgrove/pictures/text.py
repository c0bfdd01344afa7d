"""Shortening text to a given room, for pictures and terminal views alike."""

from __future__ import annotations


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def clip_middle(text: str, limit: int) -> str:
    """Ids often share a long prefix and differ at the end, so keep both ends."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return f"{text[:head]}…{text[len(text) - (limit - 1 - head) :]}"
