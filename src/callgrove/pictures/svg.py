"""An episode picture as hand-written SVG: same layout in, same bytes out.

Attributes are written in a fixed order, every number is an integer, and elements follow the
layout's order (lanes, then calls by `seq`, then links, then the key), so a golden file can be
compared byte for byte. Colours are presentation attributes, so the file looks the same in any
viewer; classes and `data-*` attributes name what each element is, for pages and tests.
"""

from __future__ import annotations

from html import escape

from callgrove.pictures.layout import (
    BOX_HEIGHT,
    BOX_WIDTH,
    COLUMN_WIDTH,
    KEY_LINE,
    KEY_SYMBOLS,
    LABEL_WIDTH,
    LANE_HEIGHT,
    MARGIN,
    MARKER_SIZE,
    NOTE_HEIGHT,
    TITLE_HEIGHT,
    Box,
    HandOver,
    Lane,
    ParentArrow,
    Picture,
    row_colour,
    start_text,
)
from callgrove.pictures.text import clip, clip_middle

INK = "#222222"
MUTED = "#777777"
PARENT_INK = "#333333"
HAND_OVER_INK = "#8A5A9B"
LANE_FILLS = ("#F7F7F7", "#FFFFFF")
TINT = "0.16"
SANS = "Helvetica, Arial, sans-serif"
MONO = "Menlo, Consolas, monospace"
MAX_BOX_CHARS = 14
MAX_SQUARES = 8


def render_svg(picture: Picture, id_prefix: str = "") -> str:
    """The picture as a standalone SVG document (no XML declaration, so it also inlines in HTML).

    `id_prefix` keeps the ids of markers and patterns unique when several pictures share a page.
    """
    writer = _Writer(id_prefix)
    episode = picture.episode
    summary = _summary(picture)
    writer.open(
        "svg",
        xmlns="http://www.w3.org/2000/svg",
        width=picture.width,
        height=picture.height,
        viewBox=f"0 0 {picture.width} {picture.height}",
        role="img",
        **{"font-family": SANS, "font-size": 11, "data-episode": episode.id},
    )
    writer.leaf("title", text=f"{episode.id}: {summary}")
    _defs(writer)
    writer.leaf("rect", width=picture.width, height=picture.height, fill="#FFFFFF")
    _title(writer, picture, summary)
    for lane in picture.lanes:
        _lane(writer, lane, picture.width)
    for box in picture.boxes:
        _box(writer, box)
    for arrow in picture.arrows:
        _parent_arrow(writer, arrow)
    for hand_over in picture.hand_overs:
        _hand_over(writer, hand_over)
    _key(writer, picture)
    writer.close("svg")
    return writer.text()


class _Writer:
    """Elements as text, attributes in the order given."""

    def __init__(self, id_prefix: str):
        self.prefix = id_prefix
        self.lines: list[str] = []
        self.depth = 0

    def ref(self, name: str) -> str:
        return f"url(#{self.prefix}{name})"

    def open(self, tag: str, **attributes: object) -> None:
        self.lines.append(f"{'  ' * self.depth}<{tag}{_attributes(attributes)}>")
        self.depth += 1

    def close(self, tag: str) -> None:
        self.depth -= 1
        self.lines.append(f"{'  ' * self.depth}</{tag}>")

    def leaf(self, tag: str, text: str | None = None, **attributes: object) -> None:
        indent = "  " * self.depth
        if text is None:
            self.lines.append(f"{indent}<{tag}{_attributes(attributes)}/>")
        else:
            self.lines.append(f"{indent}<{tag}{_attributes(attributes)}>{escape(text)}</{tag}>")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _attributes(attributes: dict[str, object]) -> str:
    parts = []
    for name, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, float):  # layouts are integer; a float here is a bug, not a style
            raise TypeError(f"non-integer SVG attribute {name}={value!r}")
        parts.append(f' {name.rstrip("_").replace("_", "-")}="{escape(str(value))}"')
    return "".join(parts)


def _summary(picture: Picture) -> str:
    result = picture.result
    episode = result.episode
    calls = len(picture.boxes)
    return (
        f"reward {episode.reward:g} · {len(picture.lanes)} agents · {calls} calls · "
        f"{len(result.forest.roots)} trees · {len(result.forest.leaves)} leaves · "
        f"{len(result.rows)} rows"
    )


def _defs(writer: _Writer) -> None:
    writer.open("defs")
    for name, colour in (("arrow", PARENT_INK), ("hand-over-head", HAND_OVER_INK)):
        writer.open(
            "marker",
            id=f"{writer.prefix}{name}",
            viewBox="0 0 10 10",
            refX=9,
            refY=5,
            markerWidth=7,
            markerHeight=7,
            orient="auto-start-reverse",
        )
        writer.leaf("path", d="M 0 0 L 10 5 L 0 10 z", fill=colour)
        writer.close("marker")
    writer.open(
        "pattern",
        id=f"{writer.prefix}background-stripes",
        width=8,
        height=8,
        patternUnits="userSpaceOnUse",
        patternTransform="rotate(45)",
    )
    writer.leaf("rect", width=8, height=8, fill="#FBF6EC")
    writer.leaf("line", x1=0, y1=0, x2=0, y2=8, stroke="#EFE2C4", stroke_width=4)
    writer.close("pattern")
    writer.close("defs")


def _title(writer: _Writer, picture: Picture, summary: str) -> None:
    baseline = MARGIN + 16
    writer.leaf(
        "text",
        text=f"episode {picture.episode.id}",
        x=MARGIN,
        y=baseline,
        font_size=15,
        font_weight="bold",
        fill=INK,
        class_="episode-title",
    )
    writer.leaf("text", text=summary, x=MARGIN, y=baseline + 18, fill=MUTED)
    for number, note in enumerate(picture.notes):
        writer.leaf(
            "text",
            text=note,
            x=MARGIN,
            y=MARGIN + TITLE_HEIGHT + number * NOTE_HEIGHT + 10,
            fill="#B00020",
            class_="note",
        )


def _lane(writer: _Writer, lane: Lane, width: int) -> None:
    agent = lane.agent
    classes = ["lane", agent.start]
    if lane.is_gap:
        classes.append("gap")
    if not agent.trainable:
        classes.append("frozen")
    writer.open("g", class_=" ".join(classes), data_agent=agent.id)
    band = writer.ref("background-stripes") if agent.start == "background" else None
    writer.leaf(
        "rect",
        x=MARGIN,
        y=lane.top,
        width=width - 2 * MARGIN,
        height=LANE_HEIGHT,
        fill=band or LANE_FILLS[lane.index % 2],
    )
    axis_start = MARGIN + LABEL_WIDTH
    writer.leaf(
        "line",
        x1=axis_start,
        y1=lane.middle,
        x2=width - MARGIN,
        y2=lane.middle,
        stroke="#D0D0D0",
        stroke_width=1,
    )
    writer.leaf(
        "text",
        text=clip(f"{agent.id} · {agent.name}", 24),
        x=MARGIN + 8,
        y=lane.top + 22,
        font_size=13,
        font_weight="bold",
        fill=INK,
    )
    for number, line in enumerate(start_text(lane)):
        writer.leaf(
            "text", text=clip(line, 34), x=MARGIN + 8, y=lane.top + 38 + 13 * number, fill=MUTED
        )
    if agent.start == "background":
        writer.leaf(
            "text",
            text="BACKGROUND",
            x=MARGIN + 8,
            y=lane.top + LANE_HEIGHT - 6,
            font_size=9,
            font_weight="bold",
            fill="#A0700A",
            class_="background-mark",
        )
    writer.close("g")


def _box(writer: _Writer, box: Box) -> None:
    call = box.call
    classes = ["call"]
    if not call.kept:
        classes.append("unkept")
    else:
        classes.append("root" if box.parent is None else "child")
        if call.purpose == "compaction":
            classes.append("compaction")
        if box.leaf_of is not None:
            classes.append("leaf")
        if not box.loss:
            classes.append("no-loss")
    writer.open(
        "g",
        class_=" ".join(classes),
        data_call=call.id,
        data_agent=box.lane.agent.id,
        data_seq=call.seq,
        data_rows=" ".join(str(m.row + 1) for m in box.rows) or None,
        data_owner=None if box.owner is None else box.owner + 1,
    )
    writer.leaf("title", text=_hover_title(box))
    if box.owner is None:
        stroke, fill, dash = "#999999", "#FFFFFF", "2 2"
    else:
        stroke, fill = row_colour(box.owner), row_colour(box.owner)
        dash = None if box.loss else "4 2"
    writer.leaf(
        "rect",
        x=box.x,
        y=box.y,
        width=BOX_WIDTH,
        height=BOX_HEIGHT,
        rx=4,
        fill=fill,
        fill_opacity=None if box.owner is None else TINT,
        stroke=stroke,
        stroke_width=2,
        stroke_dasharray=dash,
    )
    if call.purpose == "compaction":
        writer.leaf(
            "rect",
            x=box.x + 3,
            y=box.y + 3,
            width=BOX_WIDTH - 6,
            height=BOX_HEIGHT - 6,
            rx=2,
            fill="none",
            stroke=stroke,
            stroke_width=1,
            class_="compaction-mark",
        )
        writer.leaf(
            "text",
            text="COMPACTION",
            x=box.x + 2,
            y=box.y - 2,
            font_size=8,
            font_weight="bold",
            fill=INK,
            class_="compaction-label",
        )
        _compaction_cut(writer, box)
    ink = INK if call.kept else MUTED
    left = box.x + 8
    writer.leaf(
        "text",
        text=clip_middle(call.id, MAX_BOX_CHARS),
        x=left,
        y=box.y + 16,
        font_family=MONO,
        font_weight="bold",
        fill=ink,
    )
    writer.leaf("text", text=_link_line(box), x=left, y=box.y + 30, font_size=10, fill=ink)
    writer.leaf("text", text=_count_line(box), x=left, y=box.y + 42, font_size=10, fill=MUTED)
    _row_squares(writer, box)
    if box.leaf_of is not None:
        writer.leaf(
            "text",
            text=f"leaf → row {box.leaf_of + 1}",
            x=box.x,
            y=box.bottom + 4 + MARKER_SIZE + 13,
            font_size=10,
            font_weight="bold",
            fill=row_colour(box.leaf_of),
            class_="leaf-mark",
        )
    writer.close("g")


def _compaction_cut(writer: _Writer, box: Box) -> None:
    """A dotted cut on the lane just after the compaction: the agent's history restarts here."""
    x = box.right + (COLUMN_WIDTH - BOX_WIDTH) // 2
    writer.leaf(
        "line",
        x1=x,
        y1=box.lane.top + 4,
        x2=x,
        y2=box.lane.top + LANE_HEIGHT - 4,
        stroke=INK,
        stroke_width=2,
        stroke_dasharray="2 3",
        class_="compaction-cut",
    )


def _link_line(box: Box) -> str:
    call = box.call
    if not call.kept:
        return "not kept"
    return "root" if box.parent is None else f"← {clip_middle(box.parent.id, MAX_BOX_CHARS)}"


def _count_line(box: Box) -> str:
    completion = len(box.call.completion_ids)
    if not box.call.kept:
        return f"{box.call.full_len} tok · {completion} out"
    return f"+{box.new_tokens} new · {completion} out"


def _hover_title(box: Box) -> str:
    call = box.call
    agent = box.lane.agent
    lines = [
        f"{call.id} (seq {call.seq}) · {agent.id} {agent.name} · {call.purpose}",
        f"prompt {call.prompt_len} · completion {len(call.completion_ids)} · new {box.new_tokens}",
    ]
    if not call.kept:
        lines.append("not kept: outside the forest")
    else:
        lines.append("root" if box.parent is None else f"parent {box.parent.id}")
        lines.append(f"trained in row {box.owner + 1}" + ("" if box.loss else " (no loss)"))
    return "\n".join(lines)


def _row_squares(writer: _Writer, box: Box) -> None:
    top = box.bottom + 4
    shown = box.rows[:MAX_SQUARES]
    for number, mark in enumerate(shown):
        colour = row_colour(mark.row)
        writer.leaf(
            "rect",
            x=box.x + number * (MARKER_SIZE + 3),
            y=top,
            width=MARKER_SIZE,
            height=MARKER_SIZE,
            fill=colour if mark.trains else "#FFFFFF",
            stroke=colour,
            stroke_width=1,
            class_="row-mark trains" if mark.trains else "row-mark context",
            data_row=mark.row + 1,
        )
    hidden = len(box.rows) - len(shown)
    if hidden:
        writer.leaf(
            "text",
            text=f"+{hidden}",
            x=box.x + len(shown) * (MARKER_SIZE + 3),
            y=top + MARKER_SIZE,
            font_size=9,
            fill=MUTED,
        )


def _parent_arrow(writer: _Writer, arrow: ParentArrow) -> None:
    parent, child = arrow.parent, arrow.child
    if arrow.arc:  # over the tops of the lane's boxes in between
        lift = parent.y - 26
        d = (
            f"M {parent.centre_x} {parent.y} C {parent.centre_x} {lift}, "
            f"{child.centre_x} {lift}, {child.centre_x} {child.y}"
        )
    else:
        x1, y1, x2, y2 = parent.right, parent.centre_y, child.x, child.centre_y
        bend = (x2 - x1) // 2
        d = f"M {x1} {y1} C {x1 + bend} {y1}, {x2 - bend} {y2}, {x2} {y2}"
    writer.leaf(
        "path",
        d=d,
        fill="none",
        stroke=PARENT_INK,
        stroke_width=2,
        marker_end=writer.ref("arrow"),
        class_="parent-arrow",
        data_from=parent.call.id,
        data_to=child.call.id,
    )


def _hand_over(writer: _Writer, link: HandOver) -> None:
    agent = link.lane.agent
    x1, y1, x2, y2 = link.from_x, link.from_y, link.to_x, link.to_y
    middle_y = (y1 + y2) // 2
    d = f"M {x1} {y1} C {x1} {middle_y}, {x2} {middle_y}, {x2} {y2}"
    known = link.source is not None
    writer.leaf(
        "path",
        d=d,
        fill="none",
        stroke=HAND_OVER_INK,
        stroke_width=2,
        stroke_dasharray="6 4" if known else "2 4",
        marker_end=writer.ref("hand-over-head"),
        class_="hand-over" if known else "hand-over from-lane",
        data_agent=agent.id,
        data_from=link.source.call.id if known else None,
        data_from_agent=agent.parent,
    )
    if not known:  # the parent's lane, not a call, is where the start is known to come from
        writer.leaf("circle", cx=x1, cy=y1, r=4, fill="#FFFFFF", stroke=HAND_OVER_INK)
    writer.leaf(
        "text",
        text=f"starts {agent.id} ({agent.start})",
        x=(x1 + x2) // 2 + 6,
        y=middle_y + 4,
        font_size=10,
        fill=HAND_OVER_INK,
        class_="hand-over-label",
    )


def _key(writer: _Writer, picture: Picture) -> None:
    top = picture.key_top
    writer.open("g", class_="key")
    writer.leaf(
        "text",
        text="rows: one per leaf, each kept call trained in exactly one",
        x=MARGIN,
        y=top + 12,
        font_weight="bold",
        fill=INK,
    )
    for number, key in enumerate(picture.keys, start=1):
        y = top + number * KEY_LINE
        row = key.row
        writer.open("g", class_="row-key", data_row=key.number)
        writer.leaf(
            "rect",
            x=MARGIN,
            y=y + 2,
            width=24,
            height=12,
            fill=key.colour,
            class_="row-swatch",
            data_row=key.number,
        )
        writer.leaf("text", text=_row_text(key.number, row), x=MARGIN + 32, y=y + 12, fill=INK)
        writer.close("g")
    symbols_top = top + (len(picture.keys) + 1) * KEY_LINE
    for number, (symbol, text) in enumerate(KEY_SYMBOLS):
        y = symbols_top + number * KEY_LINE
        _key_symbol(writer, symbol, MARGIN, y + 8)
        writer.leaf("text", text=text, x=MARGIN + 64, y=y + 12, fill=MUTED)
    writer.close("g")


def _row_text(number: int, row) -> str:
    trains = _id_list([c.id for c in row.trains])
    context = _id_list([c.id for c in row.context]) or "none"
    text = f"row {number} · leaf {row.leaf.id} · trains {trains} · context {context}"
    if row.duplicate_of is not None:
        text += f" · duplicate of row {row.duplicate_of + 1}, no loss"
    elif row.num_loss_tokens == 0:
        text += " · no loss (agent not trainable)"
    return text


def _id_list(ids: list[str], limit: int = 10) -> str:
    shown = " ".join(clip_middle(i, MAX_BOX_CHARS) for i in ids[:limit])
    return shown + (f" … (+{len(ids) - limit})" if len(ids) > limit else "")


def _key_symbol(writer: _Writer, symbol: str, x: int, y: int) -> None:
    """A small sample of each mark, drawn as in the picture."""
    if symbol == "parent":
        writer.leaf(
            "line",
            x1=x,
            y1=y,
            x2=x + 48,
            y2=y,
            stroke=PARENT_INK,
            stroke_width=2,
            marker_end=writer.ref("arrow"),
        )
    elif symbol.startswith("hand-over"):
        known = symbol == "hand-over"
        writer.leaf(
            "line",
            x1=x + 4,
            y1=y,
            x2=x + 48,
            y2=y,
            stroke=HAND_OVER_INK,
            stroke_width=2,
            stroke_dasharray="6 4" if known else "2 4",
            marker_end=writer.ref("hand-over-head"),
        )
        if not known:
            writer.leaf("circle", cx=x + 4, cy=y, r=4, fill="#FFFFFF", stroke=HAND_OVER_INK)
    elif symbol == "compaction":
        writer.leaf("rect", x=x, y=y - 7, width=40, height=14, rx=2, fill="none", stroke=INK)
        writer.leaf("rect", x=x + 2, y=y - 5, width=36, height=10, fill="none", stroke=INK)
        writer.leaf(
            "line",
            x1=x + 46,
            y1=y - 8,
            x2=x + 46,
            y2=y + 8,
            stroke=INK,
            stroke_width=2,
            stroke_dasharray="2 3",
        )
    elif symbol == "leaf":
        writer.leaf("text", text="leaf → row", x=x, y=y + 4, font_size=10, font_weight="bold")
    elif symbol == "membership":
        writer.leaf("rect", x=x, y=y - 4, width=8, height=8, fill=INK, stroke=INK)
        writer.leaf("rect", x=x + 11, y=y - 4, width=8, height=8, fill="#FFFFFF", stroke=INK)
    elif symbol == "unkept":
        writer.leaf(
            "rect",
            x=x,
            y=y - 7,
            width=40,
            height=14,
            rx=2,
            fill="#FFFFFF",
            stroke="#999999",
            stroke_dasharray="2 2",
        )


__all__ = ["render_svg"]
