"""Helpers shared by the foreign-format readers."""

from __future__ import annotations

from typing import Any


def gap(kind: str, call: str, reason: str) -> dict[str, Any]:
    """An episode gap (`Episode.gaps`): a part of the source that could not become a call."""
    return {"kind": kind, "call": call, "reason": reason}
