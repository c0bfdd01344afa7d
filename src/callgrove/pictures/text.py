"""Shortening text to a given room, for pictures and terminal views alike."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from callgrove.episode import Agent


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def clip_middle(text: str, limit: int) -> str:
    """Ids often share a long prefix and differ at the end, so keep both ends."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return f"{text[:head]}…{text[len(text) - (limit - 1 - head) :]}"


# Advance widths of Helvetica (and the metric-compatible Arial and Liberation Sans the
# pictures name as fallbacks), in thousandths of the font size, for printable ASCII from ' '.
_WIDTHS = (
    "278 278 355 556 556 889 667 191 333 333 389 584 278 333 278 278 "
    "556 556 556 556 556 556 556 556 556 556 278 278 584 584 584 556 "
    "1015 667 667 722 722 667 611 778 722 278 500 667 556 833 722 778 "
    "667 778 722 667 611 722 667 944 667 667 611 278 278 278 469 556 "
    "333 556 556 500 556 556 278 556 556 222 222 500 222 833 556 556 "
    "556 556 333 500 278 556 500 722 500 500 500 334 260 334 584"
)
ASCII_WIDTHS = tuple(int(w) for w in _WIDTHS.split())
BOLD_FACTOR = 1.08  # bold Helvetica runs about this much wider
WIDE_FROM = 0x2E80  # CJK and wider scripts: about one em each
SAFETY = 1.04  # a little room for rounding and hinting in the browser


def text_width(text: str, size: float, bold: bool = False) -> int:
    """About how many pixels `text` takes in the pictures' sans font at `size` pixels."""
    total = 0
    for char in text:
        code = ord(char)
        if 32 <= code < 127:
            total += ASCII_WIDTHS[code - 32]
        elif char in "·":
            total += 278
        elif code >= WIDE_FROM:
            total += 1000
        else:
            total += 1000 if char in "…→←↳" else 620
    factor = (BOLD_FACTOR if bold else 1.0) * SAFETY
    return int(total * size * factor / 1000 + 0.999)


def fit(variants: list[str], size: float, room: int, bold: bool = False) -> str:
    """The first of `variants` that fits in `room` pixels, else the last one cut to fit."""
    for text in variants:
        if text_width(text, size, bold) <= room:
            return text
    text = variants[-1]
    low, high = 0, len(text)
    while low < high:  # the longest cut that fits
        middle = (low + high + 1) // 2
        if text_width(clip(text, middle), size, bold) <= room:
            low = middle
        else:
            high = middle - 1
    return clip(text, low) if low else ""


# An id that is a hash or a UUID (an imported harness's agent ids): views name the agent instead.
_HASHED = re.compile(r"[A-Za-z]{0,12}[-_]?[0-9a-fA-F]{4,}(-?[0-9a-fA-F]{4,}){1,}|[0-9a-fA-F]{12,}")


def agent_labels(agents: Iterable[Agent]) -> dict[str, str]:
    """What views call each agent: its id, but for an id that is a hash or a UUID its name
    (`explore`), numbered in ledger order where several share one (`explore#2`)."""
    agents = list(agents)
    named = [a for a in agents if _HASHED.fullmatch(a.id) and a.name]
    counts = Counter(a.name for a in named)
    taken = {a.id for a in agents if a not in named}
    labels, seen = {}, Counter()
    for agent in agents:
        if agent not in named:
            labels[agent.id] = agent.id
            continue
        seen[agent.name] += 1
        label = agent.name if counts[agent.name] == 1 else f"{agent.name}#{seen[agent.name]}"
        labels[agent.id] = label if label not in taken else agent.id
    return labels
