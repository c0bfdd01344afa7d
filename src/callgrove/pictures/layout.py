"""Where everything of an episode's picture goes: lanes, call boxes, arrows, links and the key.

One lane per agent in ledger order (by its first `seq`), one column per call in `seq` order, so
a call's column is its place in the ledger and interleaved agents read left to right as they
ran. Every coordinate is an integer, so the drawings made from a layout are byte-stable.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from callgrove.episode import Agent, Call
from callgrove.rows import EpisodeRows, Row

# Geometry, in pixels.
MARGIN = 16
TITLE_HEIGHT = 44
NOTE_HEIGHT = 16
LABEL_WIDTH = 208
COLUMN_WIDTH = 124
BOX_WIDTH = 108
BOX_HEIGHT = 48
LANE_HEIGHT = 96
BOX_TOP = 10  # from the lane's top edge
MARKER_SIZE = 8
KEY_LINE = 18
LINK_LABEL_ROOM = 112  # right of the last column, for a hand-over's label

# Okabe-Ito colours (told apart with most colour vision), then two more; rows beyond cycle.
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

# How each kind of start reads on its lane: what the agent is, then how its context begins.
START_TEXT = {
    "root": ("the leader", "starts the task"),
    "fresh": ("fresh subagent", "starts empty"),
    "fork": ("fork subagent", "starts from {parent}'s history"),
    "background": ("background subagent", "its answer may never be read"),
}


@dataclass(frozen=True, slots=True)
class Lane:
    agent: Agent
    index: int
    top: int
    parent_lane: int | None  # None: the leader, or a start that was not recorded

    @property
    def middle(self) -> int:
        return self.top + LANE_HEIGHT // 2

    @property
    def is_gap(self) -> bool:
        """A subagent whose starting agent was not recorded."""
        return self.parent_lane is None and self.agent.start != "root"


@dataclass(frozen=True, slots=True)
class RowMark:
    row: int
    trains: bool


@dataclass(slots=True)
class Box:
    call: Call
    lane: Lane
    column: int
    x: int
    y: int
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
    def centre_x(self) -> int:
        return self.x + BOX_WIDTH // 2

    @property
    def centre_y(self) -> int:
        return self.y + BOX_HEIGHT // 2


@dataclass(frozen=True, slots=True)
class ParentArrow:
    parent: Box
    child: Box
    arc: bool  # same lane with the lane's other boxes in between: drawn over the top


@dataclass(frozen=True, slots=True)
class HandOver:
    """An agent start: from the call that started it, or from its parent's lane when unknown."""

    lane: Lane
    source: Box | None
    from_x: int
    from_y: int
    to_x: int
    to_y: int


@dataclass(frozen=True, slots=True)
class RowKey:
    row: Row
    colour: str

    @property
    def number(self) -> int:
        return self.row.index + 1


@dataclass(slots=True)
class Picture:
    result: EpisodeRows
    lanes: list[Lane]
    boxes: list[Box]
    arrows: list[ParentArrow]
    hand_overs: list[HandOver]
    keys: list[RowKey]
    notes: list[str]
    width: int
    lanes_top: int
    key_top: int
    height: int

    @property
    def episode(self):
        return self.result.episode


def row_colour(index: int) -> str:
    return ROW_COLOURS[index % len(ROW_COLOURS)]


def layout(result: EpisodeRows) -> Picture:
    """The picture of one episode's forest and rows."""
    episode = result.episode
    notes = _notes(result)
    lanes_top = MARGIN + TITLE_HEIGHT + NOTE_HEIGHT * len(notes)
    lanes = _lanes(episode.agents, lanes_top)
    boxes = _boxes(result, lanes)
    by_call = {id(box.call): box for box in boxes}
    arrows = _arrows(boxes, by_call)
    boxes_of_lane: dict[int, list[Box]] = {lane.index: [] for lane in lanes}
    for box in boxes:
        boxes_of_lane[box.lane.index].append(box)
    hand_overs = [
        link for lane in lanes if (link := _hand_over(lane, lanes, boxes_of_lane)) is not None
    ]
    keys = [RowKey(row, row_colour(row.index)) for row in result.rows]
    columns = len(boxes)
    width = MARGIN * 2 + LABEL_WIDTH + max(columns, 4) * COLUMN_WIDTH + LINK_LABEL_ROOM
    key_top = lanes_top + len(lanes) * LANE_HEIGHT + MARGIN
    height = key_top + KEY_LINE * (1 + len(keys) + 1 + len(KEY_SYMBOLS)) + MARGIN
    return Picture(
        result=result,
        lanes=lanes,
        boxes=boxes,
        arrows=arrows,
        hand_overs=hand_overs,
        keys=keys,
        notes=notes,
        width=width,
        lanes_top=lanes_top,
        key_top=key_top,
        height=height,
    )


# What the symbol part of the key explains, in drawing order.
KEY_SYMBOLS = (
    ("parent", "parent: the child resends these exact tokens and adds more"),
    ("hand-over", "hand-over: an agent starts (dashed; only text is passed)"),
    ("hand-over-unknown", "hand-over from the parent's lane: the starting call is not recorded"),
    ("compaction", "compaction: the call writes a summary; the agent's next call is a root"),
    ("leaf", "leaf: no kept call continues it, so it ends a row"),
    ("membership", "row squares: filled = trained in that row, hollow = context only"),
    ("unkept", "not kept (a retry or abandoned attempt): outside the forest"),
)


def _notes(result: EpisodeRows) -> list[str]:
    """Lines under the title: the episode's recorded gaps and errors, none left out."""
    episode = result.episode
    notes = []
    for gap in episode.gaps or ():
        where = f" (agent {gap.agent})" if gap.agent else ""
        notes.append(f"gap: {gap.kind}{where}")
    for error in episode.errors:
        notes.append(f"error: {error.type}: {error.message}")
    if not episode.ok and not episode.errors:
        notes.append("error: the episode did not complete")
    return notes


def _lanes(agents: list[Agent], top: int) -> list[Lane]:
    def ledger_position(item: tuple[int, Agent]) -> tuple[int, int]:
        position, agent = item
        if agent.calls:
            return (0, min(c.seq for c in agent.calls))
        return (1, position)  # agents that made no call go last, in file order

    ordered = [agent for _, agent in sorted(enumerate(agents), key=ledger_position)]
    lane_of = {agent.id: i for i, agent in enumerate(ordered)}
    return [
        Lane(
            agent=agent,
            index=i,
            top=top + i * LANE_HEIGHT,
            parent_lane=lane_of.get(agent.parent) if agent.parent is not None else None,
        )
        for i, agent in enumerate(ordered)
    ]


def _boxes(result: EpisodeRows, lanes: list[Lane]) -> list[Box]:
    forest = result.forest
    lane_of = {id(lane.agent): lane for lane in lanes}
    calls = sorted((c for lane in lanes for c in lane.agent.calls), key=lambda c: c.seq)
    owner = {id(c): row.index for row in result.rows for c in row.trains}
    lossy = {id(c) for row in result.rows for c in row.loss_calls}
    marks: dict[int, list[RowMark]] = {}
    for row in result.rows:
        trained = {id(c) for c in row.trains}
        for call in row.path:
            marks.setdefault(id(call), []).append(RowMark(row.index, id(call) in trained))
    leaf_of = {id(row.leaf): row.index for row in result.rows}
    new_tokens = forest.new_tokens().tokens
    boxes = []
    for column, call in enumerate(calls):
        lane = lane_of[id(call.agent)]
        box = Box(
            call=call,
            lane=lane,
            column=column,
            x=MARGIN + LABEL_WIDTH + column * COLUMN_WIDTH + (COLUMN_WIDTH - BOX_WIDTH) // 2,
            y=lane.top + BOX_TOP,
            new_tokens=call.full_len,
        )
        if call.kept:
            index = forest.index_of(call)
            box.parent = forest.parent_of(call)
            box.new_tokens = len(new_tokens[index])
            box.owner = owner[id(call)]
            box.loss = id(call) in lossy
            box.rows = marks[id(call)]
            box.leaf_of = leaf_of.get(id(call))
        boxes.append(box)
    return boxes


def _arrows(boxes: list[Box], by_call: dict[int, Box]) -> list[ParentArrow]:
    columns_of_lane: dict[int, list[int]] = {}
    for box in boxes:  # boxes are in column order, so each list is sorted
        columns_of_lane.setdefault(box.lane.index, []).append(box.column)
    arrows = []
    for box in boxes:
        if box.parent is None:
            continue
        parent = by_call[id(box.parent)]
        arc = False
        if parent.lane is box.lane:
            columns = columns_of_lane[box.lane.index]
            arc = bisect_left(columns, box.column) - bisect_right(columns, parent.column) > 0
        arrows.append(ParentArrow(parent=parent, child=box, arc=arc))
    return arrows


def _hand_over(
    lane: Lane, lanes: list[Lane], boxes_of_lane: dict[int, list[Box]]
) -> HandOver | None:
    """The link into a subagent's lane; None for the leader and for an unrecorded start."""
    if lane.parent_lane is None:
        return None
    parent_lane = lanes[lane.parent_lane]
    own = boxes_of_lane[lane.index]
    first = own[0] if own else None
    spawned_by = lane.agent.spawn.call if lane.agent.spawn else None
    source = next((b for b in boxes_of_lane[parent_lane.index] if b.call.id == spawned_by), None)
    going_down = lane.index > parent_lane.index
    if first is not None:
        to_x, to_y = first.centre_x, first.y if going_down else first.bottom
    else:  # an agent with no calls: its lane's start
        to_x, to_y = MARGIN + LABEL_WIDTH, lane.middle
    if source is not None:
        from_x, from_y = source.centre_x, source.bottom if going_down else source.y
    else:
        from_x, from_y = to_x, parent_lane.middle
    return HandOver(lane=lane, source=source, from_x=from_x, from_y=from_y, to_x=to_x, to_y=to_y)


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
