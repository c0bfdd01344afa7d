"""An episode picture as hand-written SVG: same layout in, same bytes out.

Attributes are written in a fixed order, every number is an integer, and elements follow the
layout's order (bands and their lanes, then calls by `seq`, then links, then the key), so a
golden file can be compared byte for byte. Colours are presentation attributes, so the file
looks the same in any viewer; classes and `data-*` attributes name what each element is, for
pages and tests (`box-text` on every text that must stay inside its call's box).
"""

from __future__ import annotations

from html import escape

from callgrove.formats.text import printable
from callgrove.pictures.layout import (
    BAND_GAP,
    BOX_HEIGHT,
    BOX_PADDING,
    BOX_WIDTH,
    COLUMNS_PER_BAND,
    FONT,
    KEY_LINE,
    KEY_SYMBOLS,
    LABEL_WIDTH,
    LANE_HEIGHT,
    LINK_FONT,
    MARGIN,
    MARKER_SIZE,
    NOTE_HEIGHT,
    TITLE_HEIGHT,
    Band,
    Box,
    Lane,
    Link,
    Picture,
    lane_heading,
    row_colour,
    start_text,
)
from callgrove.pictures.text import clip_middle, fit
from callgrove.rows import EpisodeRows, Row

INK = "#222222"
MUTED = "#666666"
LINK_INK = {
    "parent": "#333333",
    "hand-over": "#8A5A9B",
    "hand-over-unknown": "#8A5A9B",
    "hand-back": "#00838F",
    "never-read": "#B5651D",
}
DASHES = {"hand-over": "6 4", "hand-over-unknown": "2 4", "hand-back": "1 3", "never-read": "4 3"}
LANE_FILLS = ("#F7F7F7", "#FFFFFF")
TINT = "0.16"
SANS = "Helvetica, Arial, 'Liberation Sans', sans-serif"
SQUARE_STEP = MARKER_SIZE + 3
MAX_SQUARES = (BOX_WIDTH - 24) // SQUARE_STEP


def render_svg(picture: Picture, id_prefix: str = "") -> str:
    """The picture as a standalone SVG document (no XML declaration, so it also inlines in HTML).

    `id_prefix` keeps the ids of markers and patterns unique when several pictures share a page.
    """
    writer = _Writer(id_prefix)
    episode = picture.episode
    summary = picture_summary(picture)
    writer.open(
        "svg",
        xmlns="http://www.w3.org/2000/svg",
        # As wide as the window or column it is shown in, never wider than drawn: the
        # viewBox scales it, keeping its proportions.
        width="100%",
        viewBox=f"0 0 {picture.width} {picture.height}",
        style=f"max-width: {picture.width}px; height: auto",
        role="img",
        aria_label=f"episode {episode.id}: {summary}",
        **{"font-family": SANS, "font-size": FONT, "data-episode": episode.id},
    )
    _defs(writer)
    writer.leaf("rect", width=picture.width, height=picture.height, fill="#FFFFFF")
    _title(writer, picture, summary)
    for band in picture.bands:
        _band(writer, band, picture.width)
    for box in picture.boxes:
        _box(writer, box)
    for link in picture.links:
        _link(writer, link)
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
            self.lines.append(f"{indent}<{tag}{_attributes(attributes)}>{_xml(text)}</{tag}>")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _xml(text: str) -> str:
    """Text for XML: markup escaped, control characters (which XML forbids) as escapes."""
    return escape(printable(text, lines=True))


def _attributes(attributes: dict[str, object]) -> str:
    parts = []
    for name, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, float):  # layouts are integer; a float here is a bug, not a style
            raise TypeError(f"non-integer SVG attribute {name}={value!r}")
        parts.append(f' {name.rstrip("_").replace("_", "-")}="{_xml(str(value))}"')
    return "".join(parts)


def picture_summary(picture: Picture) -> str:
    result = picture.result
    episode = result.episode
    reward = f"reward {episode.reward:g}" if episode.scored else "no reward"
    return (
        f"{reward} · {len(episode.agents)} agents · {len(picture.boxes)} calls · "
        f"{len(result.forest.roots)} trees · {len(result.forest.leaves)} leaves · "
        f"{len(result.rows)} rows"
    )


def _defs(writer: _Writer) -> None:
    writer.open("defs")
    for kind, colour in LINK_INK.items():
        writer.open(
            "marker",
            id=f"{writer.prefix}head-{kind}",
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
    room = picture.width - 2 * MARGIN
    writer.leaf(
        "text",
        text=fit([f"episode {picture.episode.id}"], 15, room, bold=True),
        x=MARGIN,
        y=baseline,
        font_size=15,
        font_weight="bold",
        fill=INK,
        class_="episode-title",
    )
    writer.leaf("text", text=summary, x=MARGIN, y=baseline + 18, fill=MUTED, font_size=11)
    for number, note in enumerate(picture.notes):
        writer.leaf(
            "text",
            text=fit([note], 11, room),
            x=MARGIN,
            y=MARGIN + TITLE_HEIGHT + number * NOTE_HEIGHT + 10,
            fill="#B00020",
            font_size=11,
            class_="note",
        )


def _band(writer: _Writer, band: Band, width: int) -> None:
    writer.open("g", class_="band", data_band=band.index)
    if band.index:
        first = band.index * COLUMNS_PER_BAND
        writer.leaf(
            "text",
            text=f"continued: columns {first + 1}–{first + COLUMNS_PER_BAND}",
            x=MARGIN,
            y=band.top - BAND_GAP // 2 + 4,
            fill=MUTED,
            class_="band-heading",
        )
    for lane in band.lanes:
        _lane(writer, lane, width)
    writer.close("g")


def _lane(writer: _Writer, lane: Lane, width: int) -> None:
    agent = lane.agent
    classes = ["lane", agent.start]
    if lane.is_gap:
        classes.append("gap")
    if not agent.trainable:
        classes.append("frozen")
    writer.open("g", class_=" ".join(classes), data_agent=agent.id, data_band=lane.band)
    band = writer.ref("background-stripes") if agent.start == "background" else None
    writer.leaf(
        "rect",
        x=MARGIN,
        y=lane.top,
        width=width - 2 * MARGIN,
        height=LANE_HEIGHT,
        fill=band or LANE_FILLS[lane.index % 2],
        class_="lane-band",
    )
    name, agent_id = lane_heading(agent)
    left = MARGIN + 8
    room = LABEL_WIDTH - 12
    writer.leaf(
        "text", text=name, x=left, y=lane.top + 20, font_size=13, font_weight="bold", fill=INK
    )
    lines = ([agent_id] if agent_id else []) + start_text(lane)
    for number, line in enumerate(lines[:5]):
        writer.leaf(
            "text",
            text=fit([line], FONT, room),
            x=left,
            y=lane.top + 35 + 13 * number,
            fill=MUTED,
            class_="lane-text",
        )
    writer.close("g")


def _box(writer: _Writer, box: Box) -> None:
    call = box.call
    writer.open(
        "g",
        class_=_box_classes(box),
        data_call=call.id,
        data_agent=box.lane.agent.id,
        data_seq=call.seq,
        data_column=box.column,
        data_rows=" ".join(str(m.row) for m in box.rows) or None,
        data_owner=box.owner,
    )
    writer.leaf("title", text=hover_title(box))
    _box_outline(writer, box)
    _box_text(writer, box)
    _row_squares(writer, box)
    if box.leaf_of is not None:
        writer.leaf(
            "text",
            text=f"leaf of row {box.leaf_of}",
            x=box.x,
            y=box.bottom + 4 + MARKER_SIZE + 13,
            font_weight="bold",
            fill=row_colour(box.leaf_of),
            class_="leaf-mark",
        )
    writer.close("g")


def _box_classes(box: Box) -> str:
    """What a call's group is, for pages and tests: a call outside the forest is only
    `unkept`."""
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
    return " ".join(classes)


def _box_outline(writer: _Writer, box: Box) -> None:
    """The box in its owner row's colour (dashed when it carries no loss; grey on white,
    finely dashed, when no row trains it), with an inner frame for a compaction."""
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
        class_="box",
    )
    if box.call.purpose == "compaction":
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


def _box_text(writer: _Writer, box: Box) -> None:
    """The box's three lines: title, action and counts (muted for a call not kept)."""
    ink = INK if box.call.kept else MUTED
    left = box.x + BOX_PADDING
    writer.leaf(
        "text",
        text=box.title,
        x=left,
        y=box.y + 16,
        font_size=FONT + 1,
        font_weight="bold",
        fill=ink,
        class_="box-text",
    )
    writer.leaf("text", text=box.action, x=left, y=box.y + 31, fill=ink, class_="box-text")
    writer.leaf("text", text=box.counts, x=left, y=box.y + 45, fill=MUTED, class_="box-text")


def hover_title(box: Box) -> str:
    call = box.call
    agent = box.lane.agent
    prompt_added = call.prompt_len - (box.parent.full_len if box.parent is not None else 0)
    lines = [
        f"{call.id} (seq {call.seq}, turn {box.turn} of {agent.id}) · {agent.name} · "
        f"{call.purpose}",
        f"prompt {call.prompt_len:,} (+{prompt_added:,}) · completion {len(call.completion_ids):,}",
    ]
    if not call.kept:
        lines.append("not kept: outside the forest")
    else:
        lines.append("root" if box.parent is None else f"parent {box.parent.id}")
        lines.append(f"trained in row {box.owner}" + ("" if box.loss else " (no loss)"))
    return "\n".join(lines)


def _row_squares(writer: _Writer, box: Box) -> None:
    top = box.bottom + 4
    shown = box.rows[:MAX_SQUARES]
    for number, mark in enumerate(shown):
        colour = row_colour(mark.row)
        writer.leaf(
            "rect",
            x=box.x + number * SQUARE_STEP,
            y=top,
            width=MARKER_SIZE,
            height=MARKER_SIZE,
            fill=colour if mark.trains else "#FFFFFF",
            stroke=colour,
            stroke_width=1,
            class_="row-mark trains" if mark.trains else "row-mark context",
            data_row=mark.row,
        )
    hidden = len(box.rows) - len(shown)
    if hidden:
        writer.leaf(
            "text",
            text=f"+{hidden}",
            x=box.x + len(shown) * SQUARE_STEP,
            y=top + MARKER_SIZE,
            font_size=9,
            fill=MUTED,
        )


def _link(writer: _Writer, link: Link) -> None:
    kind = link.kind
    if len(link.points) >= 2:
        d = "M " + " L ".join(f"{x} {y}" for x, y in link.points)
        ends_in_box = link.stub != "out" and kind != "never-read"
        writer.leaf(
            "path",
            d=d,
            fill="none",
            stroke=LINK_INK[kind],
            stroke_width=2,
            stroke_dasharray=DASHES.get(kind),
            stroke_linejoin="round",
            marker_end=writer.ref(f"head-{kind}") if ends_in_box else None,
            class_=f"link {kind}" + (f" stub-{link.stub}" if link.stub else ""),
            data_from=link.source.call.id if link.source is not None else None,
            data_to=link.target.call.id if link.target is not None else None,
            data_agent=_link_agent(link),
        )
        if kind == "hand-over-unknown":
            x, y = link.points[0]
            writer.leaf("circle", cx=x, cy=y, r=4, fill="#FFFFFF", stroke=LINK_INK[kind])
    if link.label is not None:
        writer.leaf(
            "text",
            text=link.label.text,
            x=link.label.x,
            y=link.label.y,
            font_size=LINK_FONT,
            fill=LINK_INK[kind],
            class_=f"link-label {link.label.css_class}",
        )


def _link_agent(link: Link) -> str | None:
    """The agent a hand-over starts, or whose answer a hand-back carries."""
    if link.kind in ("hand-over", "hand-over-unknown") and link.target is not None:
        return link.target.lane.agent.id
    if link.kind in ("hand-back", "never-read") and link.source is not None:
        return link.source.lane.agent.id
    return None


def _key(writer: _Writer, picture: Picture) -> None:
    top = picture.key_top
    room = picture.width - 2 * MARGIN - 32
    writer.open("g", class_="key")
    writer.leaf(
        "text",
        text="rows: one per leaf, each kept call trained in exactly one",
        x=MARGIN,
        y=top + 12,
        font_weight="bold",
        fill=INK,
        font_size=11,
    )
    for number, key in enumerate(picture.keys, start=1):
        y = top + number * KEY_LINE
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
        writer.leaf(
            "text", text=fit([row_text(picture.result, key.row)], 11, room), x=MARGIN + 32, y=y + 12,
            fill=INK, font_size=11,
        )  # fmt: skip
        writer.close("g")
    symbols_top = top + (len(picture.keys) + 1) * KEY_LINE
    for number, (symbol, text) in enumerate(KEY_SYMBOLS):
        y = symbols_top + number * KEY_LINE
        _key_symbol(writer, symbol, MARGIN, y + 8)
        writer.leaf("text", text=text, x=MARGIN + 64, y=y + 12, fill=MUTED, font_size=11)
    writer.close("g")


def row_text(result: EpisodeRows, row: Row) -> str:
    trains = _id_list([c.id for c in row.trains])
    context = _id_list([c.id for c in row.context]) or "none"
    reward = f"reward {row.reward:g}" if row.episode.scored else "no reward"
    text = f"row {row.index} · leaf {row.leaf.id} · trains {trains} · context {context} · {reward}"
    if row.duplicate_of is not None:
        text += f" · duplicate of row {row.duplicate_of}, no loss"
    elif result.num_loss_tokens(row) == 0:
        text += " · no loss (agent not trainable)"
    return text


def _id_list(ids: list[str], limit: int = 8) -> str:
    shown = " ".join(clip_middle(i, 16) for i in ids[:limit])
    return shown + (f" … (+{len(ids) - limit})" if len(ids) > limit else "")


def _key_symbol(writer: _Writer, symbol: str, x: int, y: int) -> None:
    """A small sample of each mark, drawn as in the picture."""
    if symbol in LINK_INK:
        writer.leaf(
            "line",
            x1=x + 4,
            y1=y,
            x2=x + 48,
            y2=y,
            stroke=LINK_INK[symbol],
            stroke_width=2,
            stroke_dasharray=DASHES.get(symbol),
            marker_end=None if symbol == "never-read" else writer.ref(f"head-{symbol}"),
        )
        if symbol == "hand-over-unknown":
            writer.leaf("circle", cx=x + 4, cy=y, r=4, fill="#FFFFFF", stroke=LINK_INK[symbol])
    elif symbol == "compaction":
        writer.leaf("rect", x=x, y=y - 7, width=40, height=14, rx=2, fill="none", stroke=INK)
        writer.leaf("rect", x=x + 2, y=y - 5, width=36, height=10, fill="none", stroke=INK)
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


__all__ = ["render_svg", "row_text"]
