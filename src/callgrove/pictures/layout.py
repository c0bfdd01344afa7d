"""Where everything of an episode's picture goes: bands of lanes, call boxes, routed links, key.

Calls take columns by cause, not by clock: a call sits right of the call before it on its own
agent, of its parent, of the call that started its agent and of the subagent answer it read.
Agents that ran side by side share columns, so width follows the longest chain of causes,
and a chain longer than a band wraps onto the next band (each band repeats the lanes of the
agents it shows), so the picture keeps one width however many calls an episode has.

Links are routed through the free space of the grid: vertical runs in the gaps between
columns, horizontal runs in the channel strip above each lane's boxes, so no line crosses a
box, and each label sits in a channel or beside the box it names. A link to a later band is
drawn as a stub out of its source and a stub into its target, each naming the other end.

Every coordinate is an integer, so the drawings made from a layout are byte-stable.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from callgrove.episode import Agent, Call, Episode
from callgrove.pictures.text import clip_middle, fit, text_width
from callgrove.rows import EpisodeRows, Row

# Geometry, in pixels.
MARGIN = 16
TITLE_HEIGHT = 44
NOTE_HEIGHT = 16
LABEL_WIDTH = 172
COLUMN_WIDTH = 152
BOX_WIDTH = 128
GAP = COLUMN_WIDTH - BOX_WIDTH  # the vertical routing channel between two columns
BOX_HEIGHT = 54
CHANNEL = 22  # the horizontal routing strip above a lane's boxes (labels go here too)
MARKS = 30  # under a box: its row squares, then its leaf mark
LANE_HEIGHT = CHANNEL + BOX_HEIGHT + MARKS
BAND_GAP = 22  # between bands; the band's heading sits in it
COLUMNS_PER_BAND = 10
MARKER_SIZE = 8
KEY_LINE = 18
RIGHT_ROOM = 124  # right of the last column: stubs to the next band, "never read" labels
BOX_PADDING = 7
FONT = 10  # box text; the first line is bold and one size up
LINK_FONT = 10

# Okabe-Ito colours first (told apart with most colour vision); past them, hues stepped by
# the golden angle, so no two rows share a colour however many rows an episode has.
ROW_COLOURS = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#8C6D1F",
    "#6A3D9A",
)
GOLDEN_ANGLE = 137.50776405

# How each kind of start reads on its lane: what the agent is, then how its context begins.
START_TEXT = {
    "root": ("the leader", "starts the task"),
    "fresh": ("fresh subagent", "starts empty"),
    "fork": ("fork subagent", "starts from {parent}'s history"),
    "background": ("background subagent", "its answer may never be read"),
}


def row_colour(index: int) -> str:
    if index < len(ROW_COLOURS):
        return ROW_COLOURS[index]
    hue = ((index - len(ROW_COLOURS)) * GOLDEN_ANGLE + 17.0) % 360.0 / 360.0
    lightness = (0.38, 0.50, 0.44)[index % 3]
    red, green, blue = colorsys.hls_to_rgb(hue, lightness, 0.70)
    return f"#{round(red * 255):02X}{round(green * 255):02X}{round(blue * 255):02X}"


@dataclass(frozen=True, slots=True)
class RowMark:
    row: int
    trains: bool


@dataclass(slots=True)
class Lane:
    """One agent's strip in one band."""

    agent: Agent
    index: int  # the agent's place in ledger order (the same in every band)
    band: int
    top: int
    parent_index: int | None  # the lane index of the agent that started it, when recorded

    @property
    def channel_y(self) -> int:
        return self.top + CHANNEL // 2 + 2

    @property
    def bottom(self) -> int:
        return self.top + LANE_HEIGHT

    @property
    def is_gap(self) -> bool:
        """A subagent whose starting agent was not recorded."""
        return self.parent_index is None and self.agent.start != "root"


@dataclass(slots=True)
class Box:
    call: Call
    episode: Episode  # what the call's prompt reference is read through
    lane: Lane
    column: int  # over the whole episode; the band is column // COLUMNS_PER_BAND
    x: int
    y: int
    turn: int  # 1-based place among its agent's calls
    title: str = ""
    action: str = ""
    counts: str = ""
    parent: Call | None = None
    new_tokens: int = 0
    owner: int | None = None  # the row that trains it; None for a call that is not kept
    loss: bool = False  # its completion carries loss in its owner row
    rows: list[RowMark] = field(default_factory=list)
    leaf_of: int | None = None

    @property
    def right(self) -> int:
        return self.x + BOX_WIDTH

    @property
    def bottom(self) -> int:
        return self.y + BOX_HEIGHT

    @property
    def centre_y(self) -> int:
        return self.y + BOX_HEIGHT // 2

    @property
    def band(self) -> int:
        return self.lane.band


@dataclass(frozen=True, slots=True)
class Label:
    text: str
    x: int
    y: int  # the baseline
    css_class: str
    anchor: tuple[str, int] | None = None  # ("over" | "after", box column and lane): one place


@dataclass(frozen=True, slots=True)
class Link:
    """A routed line between two boxes (or a stub of one that crosses into a later band).

    `kind`: "parent" (the child resends these exact tokens), "hand-over" (an agent starts;
    only text passes), "hand-back" (a subagent's answer read by a later call), "never-read"
    (a background answer nobody read), "hand-over-unknown" (the starting call is not
    recorded: from the parent's lane).
    """

    kind: str
    source: Box | None
    target: Box | None
    points: tuple[tuple[int, int], ...]
    label: Label | None = None
    stub: str | None = None  # "out" or "in" for the two halves of a link between bands


@dataclass(frozen=True, slots=True)
class RowKey:
    row: Row
    colour: str

    @property
    def number(self) -> int:
        return self.row.index


@dataclass(slots=True)
class Band:
    index: int
    top: int
    lanes: list[Lane]

    @property
    def bottom(self) -> int:
        return self.lanes[-1].bottom if self.lanes else self.top


@dataclass(slots=True)
class Picture:
    result: EpisodeRows
    bands: list[Band]
    boxes: list[Box]
    links: list[Link]
    keys: list[RowKey]
    notes: list[str]
    width: int
    key_top: int
    height: int

    @property
    def episode(self):
        return self.result.episode

    @property
    def lanes(self) -> list[Lane]:
        return [lane for band in self.bands for lane in band.lanes]


# What the symbol part of the key explains, in drawing order.
KEY_SYMBOLS = (
    ("parent", "parent: the child resends these exact tokens and adds more"),
    ("hand-over", "hand-over: an agent starts (dashed; only text is passed)"),
    ("hand-back", "hand-back: a subagent's answer, read by a later call of its parent"),
    ("never-read", "never read: a background answer no later call read"),
    ("hand-over-unknown", "hand-over from the parent's lane: the starting call is not recorded"),
    ("compaction", "compaction: the call writes a summary; the agent's next call is a root"),
    ("membership", "row squares: filled = trained in that row, hollow = context only"),
    ("unkept", "not kept (a retry or abandoned attempt): outside the forest"),
)


def layout(result: EpisodeRows) -> Picture:
    """The picture of one episode's forest and rows."""
    episode = result.episode
    notes = _notes(result)
    agents = _ledger_order(episode.agents)
    lane_of_agent = {agent.index: i for i, agent in enumerate(agents)}
    calls = sorted((c for agent in agents for c in agent.calls), key=lambda c: c.seq)
    forest = result.forest
    parent_of = {c.index: forest.parent_of(c) for c in calls if c.kept}
    spawner = _spawners(agents, calls)
    readers = hand_backs(episode)
    columns = _columns(calls, parent_of, spawner, readers)
    bands = _bands(agents, calls, columns, MARGIN + TITLE_HEIGHT + NOTE_HEIGHT * len(notes))
    lane_at = {(lane.band, lane.index): lane for band in bands for lane in band.lanes}
    boxes = _boxes(result, calls, columns, lane_at, lane_of_agent)
    by_call = {box.call.index: box for box in boxes}
    links = _parent_links(boxes, by_call)
    links += _hand_overs(agents, bands, by_call, spawner, lane_of_agent)
    links += _hand_back_links(agents, by_call, readers)
    links = _merge_labels(links)
    keys = [RowKey(row, row_colour(row.index)) for row in result.rows]
    used = min(max(columns.values(), default=0) + 1, COLUMNS_PER_BAND)
    width = MARGIN * 2 + LABEL_WIDTH + max(used, 3) * COLUMN_WIDTH + RIGHT_ROOM
    key_top = (bands[-1].bottom if bands else MARGIN + TITLE_HEIGHT) + MARGIN
    height = key_top + KEY_LINE * (1 + len(keys) + 1 + len(KEY_SYMBOLS)) + MARGIN
    return Picture(
        result=result,
        bands=bands,
        boxes=boxes,
        links=links,
        keys=keys,
        notes=notes,
        width=width,
        key_top=key_top,
        height=height,
    )


def _notes(result: EpisodeRows) -> list[str]:
    """Lines under the title: the episode's recorded gaps and errors, none left out."""
    episode = result.episode
    notes = []
    for gap in episode.gaps or ():
        where = f" (agent {gap.agent})" if isinstance(gap.agent, str) and gap.agent else ""
        notes.append(f"gap: {gap.kind}{where}")
    for error in episode.errors:
        notes.append(f"error: {error.type}: {error.message}")
    if not episode.ok and not episode.errors:
        notes.append("error: the episode did not complete")
    return notes


def _ledger_order(agents: list[Agent]) -> list[Agent]:
    def position(item: tuple[int, Agent]) -> tuple[int, int]:
        number, agent = item
        if agent.calls:
            return (0, min(c.seq for c in agent.calls))
        return (1, number)  # agents that made no call go last, in file order

    return [agent for _, agent in sorted(enumerate(agents), key=position)]


def spawned_by(agent: Agent) -> str | None:
    """The id of the call that started `agent`, when the episode recorded it."""
    return agent.spawn.call if agent.spawn is not None else None


def _spawners(agents: list[Agent], calls: list[Call]) -> dict[int, Call]:
    """Each agent's starting call (by the agent's index), where recorded and drawn."""
    by_id = {c.id: c for c in calls}
    found = {}
    for agent in agents:
        call_id = spawned_by(agent)
        if call_id is not None and call_id in by_id:
            found[agent.index] = by_id[call_id]
    return found


def hand_backs(episode: Episode) -> dict[int, Call | None]:
    """Per subagent (by its index), the parent-agent call that read its answer, or None when none
    did. An agent's `meta.answer_read_by` says it (a call id, or null for never read); else
    the first later call of the parent agent whose new prompt tokens hold the answer (the
    subagent's last completion, its first and last tokens left out for template seams)."""
    by_agent_id = {agent.id: agent for agent in episode.agents}
    found: dict[int, Call | None] = {}
    for agent in episode.agents:
        parent = by_agent_id.get(agent.parent) if agent.parent is not None else None
        if parent is None or not agent.calls:
            continue
        meta = agent.meta or {}
        if "answer_read_by" in meta:
            wanted = meta["answer_read_by"]
            found[agent.index] = next((c for c in parent.calls if c.id == wanted), None)
            continue
        answer = max((c for c in agent.calls if c.kept), key=lambda c: c.seq, default=None)
        if answer is None:
            continue
        found[agent.index] = _reader(answer, parent, episode)
    return found


def _reader(answer: Call, parent: Agent, episode: Episode) -> Call | None:
    tokens = answer.completion_ids
    core = tokens[1:-1] if len(tokens) > 3 else tokens
    if not len(core):
        return None
    needle = np.ascontiguousarray(core).tobytes()
    for call in sorted((c for c in parent.calls if c.seq > answer.seq), key=lambda c: c.seq):
        start = max(call.prompt_from_len - len(core), 0)
        added = np.concatenate(episode.segments(call, call.prompt_len, start) or [tokens[:0]])
        haystack = np.ascontiguousarray(added).tobytes()
        place = haystack.find(needle)
        while place >= 0 and place % tokens.itemsize:
            place = haystack.find(needle, place + 1)
        if place >= 0:
            return call
    return None


def _columns(
    calls: list[Call],
    parent_of: dict[int, Call | None],
    spawner: dict[int, Call],
    readers: dict[int, Call | None],
) -> dict[int, int]:
    """Each call's column: right of everything it follows from (calls are in seq order, and
    every cause has a lower seq, so one pass settles it)."""
    last_kept: dict[int, Call] = {}
    for call in calls:
        if call.kept:
            last_kept[call.agent_index] = call  # seq order: the last one wins
    answers_read_by: dict[int, list[Call]] = {}
    for agent_key, reader in readers.items():
        if reader is not None and agent_key in last_kept:
            answers_read_by.setdefault(reader.index, []).append(last_kept[agent_key])
    column: dict[int, int] = {}
    previous: dict[int, Call] = {}
    for call in calls:
        agent_key = call.agent_index
        causes = [previous.get(agent_key) or spawner.get(agent_key), parent_of.get(call.index)]
        causes += answers_read_by.get(call.index, [])
        column[call.index] = max(
            (column[c.index] + 1 for c in causes if c is not None and c.index in column), default=0
        )
        previous[agent_key] = call
    return column


def _bands(agents: list[Agent], calls: list[Call], columns: dict[int, int], top: int) -> list[Band]:
    """A band per COLUMNS_PER_BAND columns, holding the lanes of the agents with a call in it
    (the first band also holds agents that made no call, so every agent is shown)."""
    in_band: dict[int, set[int]] = {}
    for call in calls:
        in_band.setdefault(columns[call.index] // COLUMNS_PER_BAND, set()).add(call.agent_index)
    lane_index = {agent.index: i for i, agent in enumerate(agents)}
    lane_of_id: dict[str, int] = {}
    for i, agent in enumerate(agents):
        lane_of_id.setdefault(agent.id, i)
    parent_index = {agent.id: lane_of_id.get(agent.parent or "") for agent in agents}
    bands = []
    count = max(in_band, default=0) + 1
    for number in range(count):
        members = [a for a in agents if a.index in in_band.get(number, set())]
        if number == 0:
            members += [a for a in agents if not a.calls]
        band = Band(number, top, [])
        for place, agent in enumerate(members):
            band.lanes.append(
                Lane(
                    agent=agent,
                    index=lane_index[agent.index],
                    band=number,
                    top=top + place * LANE_HEIGHT,
                    parent_index=parent_index[agent.id] if agent.parent is not None else None,
                )
            )
        bands.append(band)
        top = band.bottom + BAND_GAP
    return bands


def column_x(column: int) -> int:
    """The left edge of a column's boxes within its band."""
    return MARGIN + LABEL_WIDTH + (column % COLUMNS_PER_BAND) * COLUMN_WIDTH + GAP // 2


def _boxes(
    result: EpisodeRows,
    calls: list[Call],
    columns: dict[int, int],
    lane_at: dict[tuple[int, int], Lane],
    lane_of_agent: dict[int, int],
) -> list[Box]:
    forest = result.forest
    owner = {c.index: row.index for row in result.rows for c in row.trains}
    lossy = {c.index for row in result.rows for c in result.loss_calls(row)}
    marks: dict[int, list[RowMark]] = {}
    for row in result.rows:
        trained = {c.index for c in row.trains}
        for call in row.path:
            marks.setdefault(call.index, []).append(RowMark(row.index, call.index in trained))
    leaf_of = {row.leaf.index: row.index for row in result.rows}
    new_tokens = forest.new_tokens().length
    turns: dict[int, int] = {}
    boxes = []
    for call in calls:
        agent_index = call.agent_index
        column = columns[call.index]
        lane = lane_at[(column // COLUMNS_PER_BAND, lane_of_agent[agent_index])]
        turns[agent_index] = turns.get(agent_index, 0) + 1
        box = Box(
            call=call,
            episode=result.episode,
            lane=lane,
            column=column,
            x=column_x(column),
            y=lane.top + CHANNEL,
            turn=turns[agent_index],
            new_tokens=call.full_len,
        )
        if call.kept:
            index = forest.index_of(call)
            box.parent = forest.parent_of(call)
            box.new_tokens = int(new_tokens[index])
            box.owner = owner[call.index]
            box.loss = call.index in lossy
            box.rows = marks[call.index]
            box.leaf_of = leaf_of.get(call.index)
        _words(box)
        boxes.append(box)
    return boxes


# Room for one line of text inside a box.
TEXT_ROOM = BOX_WIDTH - 2 * BOX_PADDING


def _words(box: Box) -> None:
    """The three lines of a box: which turn, what the call did, its token counts."""
    call = box.call
    name = f"{call.id} · turn {box.turn}"
    box.title = name if text_width(name, FONT + 1, bold=True) <= TEXT_ROOM else f"turn {box.turn}"
    did = "not kept" if not call.kept else call_action(call.content)
    if call.purpose == "compaction":
        did = "compaction" + (f": {did}" if did else "")
    box.action = fit([did or f"{len(call.completion_ids):,} tokens out"], FONT, TEXT_ROOM)
    prompt = call.prompt_len - (box.parent.full_len if box.parent is not None else 0)
    out = len(call.completion_ids)
    if not call.kept:
        prompt = call.prompt_len
    box.counts = fit(
        [
            f"prompt +{prompt:,} · completion {out:,}",
            f"prompt +{prompt:,} · compl. {out:,}",
            f"+{prompt:,} prompt · {out:,} out",
            f"+{prompt:,} · {out:,} out",
        ],
        FONT,
        TEXT_ROOM,
    )


def call_action(content: Any) -> str:
    """What a call did, in a few words: the tools it called, else the first words it wrote."""
    response = content.get("response") if isinstance(content, dict) else content
    messages = response if isinstance(response, list) else [response]
    tools: list[str] = []
    words = ""
    for message in messages:
        if isinstance(message, str):
            words = words or message
            continue
        if not isinstance(message, dict):
            continue
        for tool_call in message.get("tool_calls") or ():
            function = tool_call.get("function", tool_call) if isinstance(tool_call, dict) else {}
            name = function.get("name") if isinstance(function, dict) else None
            if isinstance(name, str):
                arguments = function.get("arguments")
                first = _first_argument(arguments)
                tools.append(f"{name} {first}".strip())
        body = message.get("content")
        if isinstance(body, str) and not words:
            words = body
        elif isinstance(body, list):
            for part in body:
                if isinstance(part, dict) and part.get("type") == "tool_use":
                    tools.append(str(part.get("name", "?")))
                elif isinstance(part, dict) and isinstance(part.get("text"), str) and not words:
                    words = part["text"]
    if tools:
        return "→ " + ", ".join(tools)
    return " ".join(words.split())


def _first_argument(arguments: Any) -> str:
    if isinstance(arguments, dict) and arguments:
        value = next(iter(arguments.values()))
        return value if isinstance(value, str) else ""
    return arguments if isinstance(arguments, str) else ""


def _gap_x(column: int, offset: int) -> int:
    """The middle of the gap right of `column` (within its band)."""
    return column_x(column) + BOX_WIDTH + GAP // 2 + offset


def route(source: Box, target: Box, offset: int = 0) -> tuple[tuple[int, int], ...]:
    """Points from `source`'s right side to `target`'s left side through the grid's free
    space (both in one band, the target in a later column)."""
    start = (source.right, source.centre_y + offset)
    end = (target.x, target.centre_y + offset)
    if target.lane is source.lane and target.column == source.column + 1:
        return (start, end)
    turn_out = _gap_x(source.column, offset)
    turn_in = _gap_x(target.column - 1, offset)
    if turn_out == turn_in:  # the next column, another lane: down (or up) the gap between
        return (start, (turn_out, start[1]), (turn_out, end[1]), end)
    channel = target.lane.channel_y + offset // 2
    return (
        start,
        (turn_out, start[1]),
        (turn_out, channel),
        (turn_in, channel),
        (turn_in, end[1]),
        end,
    )


# Each kind of link runs a little apart from the others, so lines that share a gap or a
# channel stay told apart.
OFFSETS = {"parent": 0, "hand-over": -8, "hand-back": 8, "hand-over-unknown": -8}


def _link(kind: str, source: Box, target: Box, label: str | None = None) -> list[Link]:
    """The link, or its two stubs when the target is in a later band: one out of the source
    naming the target, one into the target naming the source."""
    offset = OFFSETS[kind]
    if source.band == target.band:
        points = route(source, target, offset)
        placed = None if label is None else channel_label(label, target, kind)
        return [Link(kind, source, target, points, placed)]
    out_y = source.centre_y + offset
    edge = MARGIN + LABEL_WIDTH + COLUMNS_PER_BAND * COLUMN_WIDTH
    out_label = Label(
        fit([f"to {box_name(target)}"], LINK_FONT, RIGHT_ROOM - 20),
        edge + 14,
        source.centre_y + 4,
        f"{kind}-label stub-label",
        ("after", source.call.index),
    )
    in_x = target.x - GAP // 2 - 4
    in_y = target.centre_y + offset
    came_from = f"from {box_name(source)}"
    in_label = channel_label(
        f"{label} · {came_from}" if label else came_from, target, kind, "stub-label"
    )
    return [
        Link(kind, source, target, ((source.right, out_y), (edge + 10, out_y)), out_label, "out"),
        Link(kind, source, target, ((in_x, in_y), (target.x, in_y)), in_label, "in"),
    ]


def channel_label(text: str, target: Box, kind: str, extra: str = "") -> Label:
    """A link's label in the channel above its target box, within the box's width."""
    return Label(
        fit([text], LINK_FONT, BOX_WIDTH - 4),
        target.x + 2,
        target.lane.top + CHANNEL // 2 + 1,
        f"{kind}-label {extra}".strip(),
        ("over", target.call.index),
    )


def box_name(box: Box) -> str:
    """A call as a link label names it: its id when short, else its agent and turn."""
    if len(box.call.id) <= 10:
        return box.call.id
    return f"{clip_middle(box.lane.agent.id, 14)} turn {box.turn}"


def _merge_labels(links: list[Link]) -> list[Link]:
    """Labels meant for one place (over one box, or right of one box) become one label."""
    texts: dict[tuple[str, int], list[str]] = {}
    for link in links:
        if link.label is not None and link.label.anchor is not None:
            texts.setdefault(link.label.anchor, []).append(link.label.text)
    merged, done = [], set()
    for link in links:
        label = link.label
        if label is None or label.anchor is None or len(texts[label.anchor]) == 1:
            merged.append(link)
            continue
        if label.anchor in done:
            merged.append(replace(link, label=None))
            continue
        done.add(label.anchor)
        room = BOX_WIDTH - 4 if label.anchor[0] == "over" else RIGHT_ROOM - 20
        joined = " · ".join(dict.fromkeys(texts[label.anchor]))
        merged.append(replace(link, label=replace(label, text=fit([joined], LINK_FONT, room))))
    return merged


def _parent_links(boxes: list[Box], by_call: dict[int, Box]) -> list[Link]:
    links = []
    for box in boxes:
        if box.parent is not None:
            links += _link("parent", by_call[box.parent.index], box)
    return links


def _hand_overs(
    agents: list[Agent],
    bands: list[Band],
    by_call: dict[int, Box],
    spawner: dict[int, Call],
    lane_of_agent: dict[int, int],
) -> list[Link]:
    """Into each subagent's first call: from the call that started it, or (unrecorded)
    a marker on the parent's lane in the same column band."""
    links = []
    for agent in agents:
        if agent.parent is None or agent.start == "root":
            continue
        first = min(agent.calls, key=lambda c: c.seq, default=None)
        text = f"starts {agent.id} ({agent.start})"
        source_call = spawner.get(agent.index)
        if first is None:
            continue
        target = by_call[first.index]
        if source_call is not None:
            links += _link("hand-over", by_call[source_call.index], target, text)
            continue
        parent_lane = next(
            (lane for lane in bands[target.band].lanes if lane.agent.id == agent.parent),
            None,
        )
        if parent_lane is None:
            continue  # the parent has no lane in this band (or was not recorded): a gap
        x = target.x - GAP // 2 - 2
        y = parent_lane.top + CHANNEL + BOX_HEIGHT // 2
        points = ((x, y), (x, target.centre_y - 8), (target.x, target.centre_y - 8))
        label = channel_label(text, target, "hand-over-unknown")
        links.append(Link("hand-over-unknown", None, target, points, label))
    return links


def _hand_back_links(
    agents: list[Agent], by_call: dict[int, Box], readers: dict[int, Call | None]
) -> list[Link]:
    links = []
    for agent in agents:
        if agent.index not in readers:
            continue
        answer = max((c for c in agent.calls if c.kept), key=lambda c: c.seq)
        source = by_call[answer.index]
        reader = readers[agent.index]
        if reader is not None:
            links += _link("hand-back", source, by_call[reader.index])
        elif agent.start == "background":  # a reader not found for others may be missed
            y = source.centre_y + OFFSETS["hand-back"]
            points = ((source.right, y), (source.right + GAP + 10, y))
            label = Label("answer never read", source.right + GAP + 14, y + 4, "never-read-label")
            links.append(Link("never-read", source, None, points, label))
    return links


def start_text(lane: Lane) -> list[str]:
    """The lines under an agent's name: its kind of start and how its context begins."""
    agent = lane.agent
    kind, context = START_TEXT.get(agent.start, (agent.start, ""))
    lines = [kind, context.format(parent=agent.parent or "its parent")]
    if lane.is_gap:
        lines.append("started by: not recorded (a gap)")
    if not agent.trainable:
        lines.append("not trainable: context only")
    return [line for line in lines if line]


def lane_heading(agent: Agent) -> tuple[str, str]:
    """The agent's name (whole when it fits) and its id (clipped in the middle)."""
    return (
        fit([agent.name], 13, LABEL_WIDTH - 12, bold=True),
        clip_middle(agent.id, 26) if agent.id != agent.name else "",
    )
