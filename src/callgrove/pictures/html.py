"""Episode pictures as one self-contained HTML page: inline SVG, CSS and script, no network.

Hovering (or focusing) a call shows its text and token counts; clicking it pins the tip so a
long text can be scrolled (Escape or a click elsewhere lets it go); hovering a row in the key
dims every call outside that row. Episodes of one group stand side by side under a table of
their rewards and advantages per seat. The page's Content-Security-Policy forbids every
fetch, so it cannot reach the network even by accident. A hidden status element records how
many calls the browser drew and any script errors, for the headless-browser test.
"""

from __future__ import annotations

from html import escape
from importlib.resources import files
from typing import Any

import numpy as np
import orjson

from callgrove.pictures.layout import Box, Picture
from callgrove.pictures.svg import picture_summary, render_svg

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
        f"<p>{len(pictures)} episode(s). Hover or focus a call for its text and token counts "
        "(click to pin it and scroll); hover a row in a key to see only that row.</p>",
        _contents(pictures),
        "</header>",
    ]
    numbered = list(enumerate(pictures))
    for group, members in _by_group(numbered):
        if len(members) < 2:
            parts += [_section(number, picture) for number, picture in members]
            continue
        parts += [
            f'<section class="group" data-group="{escape(group)}">',
            f"<h2>group {escape(group)}: {len(members)} episodes</h2>",
            _group_table([picture for _, picture in members]),
            '<div class="side-by-side">',
            *(_section(number, picture) for number, picture in members),
            "</div>",
            "</section>",
        ]
    parts += [
        '<div id="callgrove-tip" class="tip" role="tooltip" hidden></div>',
        '<output id="callgrove-status" data-state="loading" hidden>loading</output>',
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
            '<div class="picture">',
            render_svg(picture, id_prefix=f"e{number}-").rstrip("\n"),
            "</div>",
            f'<script type="application/json" class="call-data">{_script_json(details)}</script>',
            "</section>",
        ]
    )


def _by_group(numbered: list[tuple[int, Picture]]) -> list[tuple[str, list[tuple[int, Picture]]]]:
    """Episodes in page order, those of one group gathered where its first one appears."""
    groups: dict[str, list[tuple[int, Picture]]] = {}
    order: list[tuple[str, list[tuple[int, Picture]]]] = []
    for number, picture in numbered:
        group = picture.episode.group
        if group is None:
            order.append(("", [(number, picture)]))
        elif group in groups:
            groups[group].append((number, picture))
        else:
            groups[group] = [(number, picture)]
            order.append((group, groups[group]))
    return order


def _group_table(pictures: list[Picture]) -> str:
    """One column per episode: its reward, then each seat's reward and mean advantage."""
    seats = sorted({agent.name for p in pictures for agent in p.episode.agents})
    head = "".join(f"<th>{escape(p.episode.id)}</th>" for p in pictures)
    lines = [f"<tr><th></th>{head}</tr>"]
    lines.append(
        "<tr><th>episode</th>"
        + "".join(f"<td>{escape(picture_summary(p))}</td>" for p in pictures)
        + "</tr>"
    )
    for seat in seats:
        cells = "".join(f"<td>{escape(_seat_cell(p, seat))}</td>" for p in pictures)
        lines.append(f"<tr><th>seat {escape(seat)}</th>{cells}</tr>")
    return '<table class="group-table">' + "".join(lines) + "</table>"


def _seat_cell(picture: Picture, seat: str) -> str:
    episode = picture.episode
    agents = [agent for agent in episode.agents if agent.name == seat]
    if not agents:
        return "-"
    rewards = sorted({episode.reward_of(agent) for agent in agents})
    reward = " / ".join(f"{r:g}" for r in rewards) if episode.scored else "no reward"
    values = [
        float(np.mean(call.advantages))
        for agent in agents
        for call in agent.calls
        if call.advantages is not None
    ]
    advantage = f"advantage {np.mean(values):+.3g}" if values else "no advantage"
    return f"reward {reward} · {advantage}"


def call_details(box: Box) -> dict[str, Any]:
    """What hovering a call shows: who made it, its token counts, its rows and its text."""
    call = box.call
    agent = box.lane.agent
    if call.content is not None:
        text, source = _content_text(call.content), "content"
    else:
        text, source = _token_text(box), "token ids"
    rows = [f"{'trains' if m.trains else 'context'} in row {m.row}" for m in box.rows]
    return {
        "id": call.id,
        "seq": call.seq,
        "agent": f"{agent.id} · {agent.name} ({agent.start})",
        "purpose": call.purpose,
        "kept": call.kept,
        "parent": None if box.parent is None else box.parent.id,
        "prompt": call.prompt_len,
        "completion": len(call.completion_ids),
        "prompt_added": call.prompt_len - (box.parent.full_len if box.parent is not None else 0),
        "rows": rows,
        "loss": box.loss,
        "text_source": source,
        "text": text,
    }


def _content_text(content: Any) -> str:
    """Chat messages read as a transcript (the response first); anything else as JSON."""
    if isinstance(content, str):
        text = content
    elif _is_messages(content):
        text = "\n".join(_message_lines(content))
    elif isinstance(content, dict) and any(_is_messages(content.get(k)) for k in MESSAGE_KEYS):
        parts = []
        for key, heading in MESSAGE_KEYS.items():
            messages = content.get(key)
            if _is_messages(messages):
                parts += [f"── {heading} ──", *_message_lines(messages)]
        rest = {k: v for k, v in content.items() if k not in MESSAGE_KEYS}
        if rest:
            parts += ["── details ──", _json(rest)]
        text = "\n".join(parts)
    else:
        text = _json(content)
    if len(text) > MAX_TEXT_CHARS:
        return f"{text[:MAX_TEXT_CHARS]}\n… ({len(text) - MAX_TEXT_CHARS} more characters)"
    return text


# Content keys holding chat messages, in the order shown: what the call produced comes first.
MESSAGE_KEYS = {"response": "response", "prompt": "new prompt messages"}


def _is_messages(value: Any) -> bool:
    """A chat message (a dict with a `role`) or a list of them."""
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(isinstance(m, dict) and "role" in m for m in items)


def _message_lines(messages: dict[str, Any] | list[dict[str, Any]]) -> list[str]:
    lines = []
    for message in messages if isinstance(messages, list) else [messages]:
        head = f"[{message['role']}"
        if message.get("tool_call_id"):
            head += f" ← {message['tool_call_id']}"
        if message.get("is_error"):
            head += ", error"
        body = message.get("content")
        lines.append(f"{head}] {body if isinstance(body, str) else _json(body)}".rstrip())
        if message.get("reasoning_content"):
            lines.append(f"  thinking: {message['reasoning_content']}")
        for tool_call in message.get("tool_calls") or ():
            function = tool_call.get("function", tool_call) if isinstance(tool_call, dict) else {}
            arguments = function.get("arguments")
            shown = arguments if isinstance(arguments, str) else _json(arguments, indent=False)
            lines.append(f"  → {function.get('name', '?')} {shown}")
    return lines


def _json(value: Any, indent: bool = True) -> str:
    option = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(value, option=option, default=str).decode()


def _token_text(box: Box) -> str:
    """The call's own tokens: the prompt tokens it adds to its parent's sequence, its completion."""
    call = box.call
    start = box.parent.full_len if box.parent is not None else 0
    pieces = box.episode.segments(call, call.prompt_len, start)  # views: no copy of the history
    added = np.concatenate(pieces) if pieces else call.completion_ids[:0]
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
