"""Episode pictures as one self-contained HTML page: inline SVG, CSS and script, no network.

Hovering (or focusing) a call shows its text and token counts; hovering a row in the key dims
every call outside that row. The page's Content-Security-Policy forbids every fetch, so it
cannot reach the network even by accident. A status element reports how many calls the
browser drew and any script errors, for people and for the headless-browser test alike.
"""

from __future__ import annotations

from html import escape
from importlib.resources import files
from typing import Any

import numpy as np
import orjson

from callgrove.pictures.layout import Box, Picture
from callgrove.pictures.svg import render_svg

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
)
MAX_TEXT_CHARS = 8000
TOKENS_HEAD, TOKENS_TAIL = 16, 6


def render_html(pictures: list[Picture], title: str) -> str:
    """One page with a section per episode, in the order given."""
    assets = files("callgrove.pictures")
    css = assets.joinpath("page.css").read_text(encoding="utf-8")
    script = assets.joinpath("page.js").read_text(encoding="utf-8")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title>",
        f"<style>\n{css}</style>",
        "</head>",
        "<body>",
        "<header>",
        f"<h1>{escape(title)}</h1>",
        f"<p>{len(pictures)} episode(s). Hover or focus a call for its text and token counts; "
        "hover a row in a key to see only that row.</p>",
        _contents(pictures),
        "</header>",
    ]
    for number, picture in enumerate(pictures):
        parts.append(_section(number, picture))
    parts += [
        '<div id="callgrove-tip" class="tip" role="tooltip" hidden></div>',
        '<footer><output id="callgrove-status" data-state="loading">loading</output></footer>',
        f"<script>\n{script}</script>",
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


def _contents(pictures: list[Picture]) -> str:
    if len(pictures) < 2:
        return ""
    links = "".join(
        f'<li><a href="#episode-{n}">{escape(p.episode.id)}</a></li>'
        for n, p in enumerate(pictures)
    )
    return f'<nav><ol class="contents">{links}</ol></nav>'


def _section(number: int, picture: Picture) -> str:
    details = {box.call.id: call_details(box) for box in picture.boxes}
    return "\n".join(
        [
            f'<section class="episode" id="episode-{number}" '
            f'data-episode="{escape(picture.episode.id)}" data-calls="{len(picture.boxes)}">',
            f"<h2>{escape(picture.episode.id)}</h2>",
            '<div class="picture">',
            render_svg(picture, id_prefix=f"e{number}-").rstrip("\n"),
            "</div>",
            f'<script type="application/json" class="call-data">{_script_json(details)}</script>',
            "</section>",
        ]
    )


def call_details(box: Box) -> dict[str, Any]:
    """What hovering a call shows: who made it, its token counts, its rows and its text."""
    call = box.call
    agent = box.lane.agent
    if call.content is not None:
        text, source = _content_text(call.content), "content"
    else:
        text, source = _token_text(box), "token ids"
    rows = [f"{'trains' if m.trains else 'context'} in row {m.row + 1}" for m in box.rows]
    return {
        "id": call.id,
        "seq": call.seq,
        "agent": f"{agent.id} · {agent.name} ({agent.start})",
        "purpose": call.purpose,
        "kept": call.kept,
        "parent": None if box.parent is None else box.parent.id,
        "prompt": call.prompt_len,
        "completion": len(call.completion_ids),
        "new": box.new_tokens,
        "rows": rows,
        "loss": box.loss,
        "text_source": source,
        "text": text,
    }


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        text = content
    else:
        text = orjson.dumps(content, option=orjson.OPT_INDENT_2, default=str).decode()
    if len(text) > MAX_TEXT_CHARS:
        return f"{text[:MAX_TEXT_CHARS]}\n… ({len(text) - MAX_TEXT_CHARS} more characters)"
    return text


def _token_text(box: Box) -> str:
    """The call's own tokens: the prompt tokens it adds to its parent's sequence, its completion."""
    call = box.call
    start = box.parent.full_len if box.parent is not None else 0
    added = call.prompt_ids()[start:]
    label = "new prompt tokens" if box.parent is not None else "prompt tokens"
    return (
        f"{label} ({len(added)}): {_abbreviated(added)}\n"
        f"completion tokens ({len(call.completion_ids)}): {_abbreviated(call.completion_ids)}"
    )


def _abbreviated(tokens: np.ndarray) -> str:
    values = tokens.tolist()
    if len(values) <= TOKENS_HEAD + TOKENS_TAIL:
        return "[" + " ".join(map(str, values)) + "]"
    head = " ".join(map(str, values[:TOKENS_HEAD]))
    tail = " ".join(map(str, values[-TOKENS_TAIL:]))
    return f"[{head} … {tail}]"


def _script_json(value: Any) -> str:
    """JSON that cannot end its <script> element early, whatever the call text holds."""
    text = orjson.dumps(value, default=str).decode()
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


__all__ = ["call_details", "render_html"]
