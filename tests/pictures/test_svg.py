"""The SVG picture: a golden file for the login_bug example, and what every picture must show."""

from __future__ import annotations

import itertools
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from callgrove.episode import Agent, Call, Episode
from callgrove.pictures import layout, render_svg
from callgrove.pictures.layout import LANE_HEIGHT, ROW_COLOURS, row_colour
from callgrove.rows import build_rows

from .episodes import login_bug, unusual_episode

GOLDEN = Path(__file__).parent / "golden" / "login_bug.svg"
UPDATE_ENV = "CALLGROVE_UPDATE_GOLDEN"
SVG = "{http://www.w3.org/2000/svg}"


def classes(element: ET.Element) -> set[str]:
    return set(element.get("class", "").split())


def elements(root: ET.Element, tag: str, css_class: str) -> list[ET.Element]:
    return [e for e in root.iter(SVG + tag) if css_class in classes(e)]


def texts(element: ET.Element) -> list[str]:
    return [t.text or "" for t in element.iter(SVG + "text")]


@pytest.fixture(scope="module")
def login_bug_svg() -> str:
    return render_svg(layout(login_bug()))


@pytest.fixture(scope="module")
def seed_root(login_bug_svg) -> ET.Element:
    return ET.fromstring(login_bug_svg)


def test_login_bug_matches_the_golden_file(login_bug_svg):
    """Set CALLGROVE_UPDATE_GOLDEN=1 to rewrite the golden file after an intended change."""
    if os.environ.get(UPDATE_ENV):
        GOLDEN.write_text(login_bug_svg, encoding="utf-8")
    assert login_bug_svg == GOLDEN.read_text(encoding="utf-8")


def test_drawing_is_deterministic(login_bug_svg):
    assert render_svg(layout(login_bug())) == login_bug_svg
    coordinates = re.findall(
        r' (?:x|y|x1|y1|x2|y2|cx|cy|r|width|height|d)="([^"]*)"', login_bug_svg
    )
    assert coordinates and not any("." in value for value in coordinates)


def link_pairs(root: ET.Element, kind: str) -> list[tuple[str | None, str | None]]:
    return sorted((a.get("data-from"), a.get("data-to")) for a in elements(root, "path", kind))


def test_every_call_is_drawn_once_in_seq_order(seed_root):
    boxes = elements(seed_root, "g", "call")
    assert [b.get("data-call") for b in boxes] == [f"C{n}" for n in range(1, 13)]


def test_columns_follow_causes_not_the_clock(seed_root):
    """A call sits right of its agent's previous call, its parent, the call that started its
    agent and the answer it read; agents that ran side by side share columns."""
    column = {
        b.get("data-call"): int(b.get("data-column")) for b in elements(seed_root, "g", "call")
    }
    assert column == {
        "C1": 0, "C2": 1, "C3": 1, "C4": 2, "C5": 2, "C6": 3, "C7": 4, "C8": 5, "C9": 6,
        "C10": 7, "C11": 8, "C12": 9,
    }  # fmt: skip
    assert max(column.values()) + 1 < 12  # narrower than a column per call


def test_one_lane_per_agent_in_ledger_order(seed_root):
    lanes = elements(seed_root, "g", "lane")
    assert [lane.get("data-agent") for lane in lanes] == ["L", "B", "A", "F"]
    tops = {lane.get("data-agent"): int(lane.find(SVG + "rect").get("y")) for lane in lanes}
    for box in elements(seed_root, "g", "call"):
        y = int(box.find(SVG + "rect").get("y"))
        assert tops[box.get("data-agent")] < y < tops[box.get("data-agent")] + LANE_HEIGHT


def test_boxes_say_the_turn_and_what_the_call_did(seed_root):
    boxes = {b.get("data-call"): texts(b) for b in elements(seed_root, "g", "call")}
    assert boxes["C1"][:2] == [
        "C1 · turn 1",
        "→ Agent B background sign in"[: len(boxes["C1"][1]) - 1] + "…",
    ]
    assert boxes["C5"][:3] == ["C5 · turn 1", "→ grep login", "prompt +11 · compl. 4"]
    assert boxes["C9"][1] == "Fixed."
    assert boxes["C10"][1].startswith("compaction: summary")
    assert boxes["C12"][0] == "C12 · turn 6"  # the leader's sixth call


def test_five_rows_five_colours_each_on_the_calls_it_trains(seed_root):
    swatches = elements(seed_root, "rect", "row-swatch")
    colour_of_row = {int(s.get("data-row")): s.get("fill") for s in swatches}
    assert sorted(colour_of_row) == [0, 1, 2, 3, 4]  # numbered from 0, as in the JSON rows
    assert len(set(colour_of_row.values())) == 5
    owners = {"C2": 0, "C4": 0, "C5": 1, "C6": 1, "C8": 2, "C9": 2, "C1": 3, "C3": 3}
    owners |= {"C7": 3, "C10": 3, "C11": 4, "C12": 4}
    for box in elements(seed_root, "g", "call"):
        row = owners[box.get("data-call")]
        assert int(box.get("data-owner")) == row
        assert box.find(SVG + "rect").get("stroke") == colour_of_row[row]
        trained_marks = elements(box, "rect", "trains")
        assert [int(m.get("data-row")) for m in trained_marks] == [row]
    context_rows = {
        b.get("data-call"): [int(m.get("data-row")) for m in elements(b, "rect", "context")]
        for b in elements(seed_root, "g", "call")
    }
    assert {c: r for c, r in context_rows.items() if r} == {"C1": [2], "C3": [2], "C7": [2]}


def test_row_colours_never_repeat():
    colours = [row_colour(n) for n in range(400)]
    assert len(set(colours)) == len(colours)
    assert colours[:8] == list(ROW_COLOURS)


def test_parent_arrows_are_the_forest_links(seed_root):
    assert link_pairs(seed_root, "parent") == sorted(
        [
            ("C1", "C3"), ("C3", "C7"), ("C7", "C8"), ("C8", "C9"), ("C7", "C10"),
            ("C2", "C4"), ("C5", "C6"), ("C11", "C12"),
        ]
    )  # fmt: skip
    assert all(a.get("stroke-dasharray") is None for a in elements(seed_root, "path", "parent"))


def test_links_run_through_the_gaps_and_channels_never_across_a_box(seed_root):
    boxes = [
        tuple(int(r.get(k)) for k in ("x", "y", "width", "height"))
        for r in elements(seed_root, "rect", "box")
    ]
    for path in elements(seed_root, "path", "link"):
        points = [tuple(map(int, p.split())) for p in re.findall(r"-?\d+ -?\d+", path.get("d"))]
        for (x1, y1), (x2, y2) in itertools.pairwise(points):
            assert x1 == x2 or y1 == y2  # straight runs only
            for x, y, w, h in boxes:  # a run may touch a box's edge (where it starts or ends)
                inside_x = min(x1, x2) < x + w - 1 and max(x1, x2) > x + 1
                inside_y = min(y1, y2) < y + h - 1 and max(y1, y2) > y + 1
                assert not (inside_x and inside_y), (path.get("data-from"), path.get("data-to"))


def test_hand_overs_for_each_subagent_drawn_dashed(seed_root):
    links = elements(seed_root, "path", "hand-over")
    assert sorted(link.get("data-agent") for link in links) == ["A", "B", "F"]
    for link in links:
        assert link.get("stroke-dasharray")
        assert link.get("stroke") != elements(seed_root, "path", "parent")[0].get("stroke")
    assert {link.get("data-agent"): link.get("data-from") for link in links} == {
        "B": "C1",
        "A": "C3",
        "F": "C7",
    }
    labels = [t.text for t in elements(seed_root, "text", "hand-over-label")]
    assert labels == ["starts B (background)", "starts A (fresh)", "starts F (fork)"]


def test_answers_flow_back_and_an_unread_one_says_so(seed_root):
    """A's answer is read by C7, F's by C10; B runs in the background and nobody reads it."""
    assert link_pairs(seed_root, "hand-back") == [("C6", "C7"), ("C9", "C10")]
    [never] = elements(seed_root, "path", "never-read")
    assert never.get("data-from") == "C4" and never.get("data-agent") == "B"
    assert [t.text for t in elements(seed_root, "text", "never-read-label")] == [
        "answer never read"
    ]


def test_a_recorded_reader_wins_over_the_tokens():
    result = login_bug()
    result.episode.agent("A").meta = {"spawned_by": "C3", "answer_read_by": "C11"}
    result.episode.agent("F").meta = {"spawned_by": "C7", "answer_read_by": None}
    root = ET.fromstring(render_svg(layout(result)))
    assert link_pairs(root, "hand-back") == [("C6", "C11")]
    assert [p.get("data-agent") for p in elements(root, "path", "never-read")] == ["B"]


def test_compaction_leaves_and_background_are_marked(seed_root):
    boxes = {b.get("data-call"): b for b in elements(seed_root, "g", "call")}
    assert [c for c, b in boxes.items() if "compaction" in classes(b)] == ["C10"]
    assert len(elements(boxes["C10"], "rect", "compaction-mark")) == 1
    leaves = {c: elements(b, "text", "leaf-mark") for c, b in boxes.items() if "leaf" in classes(b)}
    assert {c: marks[0].text for c, marks in leaves.items()} == {
        "C4": "leaf of row 0",
        "C6": "leaf of row 1",
        "C9": "leaf of row 2",
        "C10": "leaf of row 3",
        "C12": "leaf of row 4",
    }
    assert sorted(c for c, b in boxes.items() if "root" in classes(b)) == ["C1", "C11", "C2", "C5"]
    background = [
        lane for lane in elements(seed_root, "g", "lane") if "background" in classes(lane)
    ]
    assert [lane.get("data-agent") for lane in background] == ["B"]


def test_the_title_is_drawn_once(seed_root, login_bug_svg):
    assert [t.text for t in elements(seed_root, "text", "episode-title")] == [
        "episode login-bug-0001"
    ]
    assert "<title>login-bug-0001" not in login_bug_svg  # no second title for the whole picture


def test_unusual_marks_known_start_gap_retry_frozen_and_idle_agent():
    result = build_rows(unusual_episode())
    root = ET.fromstring(render_svg(layout(result), id_prefix="u-"))
    boxes = {b.get("data-call"): b for b in elements(root, "g", "call")}
    assert list(boxes) == ["S1", "S2", "S3", "S4", "R5", "S6"]
    lanes = {lane.get("data-agent"): lane for lane in elements(root, "g", "lane")}
    assert list(lanes) == ["L", "W", "G", "N", "Z"]  # no calls: last
    starts = {link.get("data-agent"): link for link in elements(root, "path", "link")
              if "hand-over" in classes(link) or "hand-over-unknown" in classes(link)}  # fmt: skip
    assert sorted(starts) == ["N", "W"]  # G's start was not recorded; Z made no call
    assert starts["W"].get("data-from") == "S1" and "hand-over" in classes(starts["W"])
    assert "hand-over-unknown" in classes(starts["N"])
    assert "gap" in classes(lanes["G"])
    assert any("not recorded" in t for t in texts(lanes["G"]))
    assert [t.text for t in elements(root, "text", "note")] == [
        "gap: subagent_parent_unavailable (agent G)"
    ]
    assert "unkept" in classes(boxes["R5"]) and boxes["R5"].get("data-owner") is None
    assert not elements(boxes["R5"], "rect", "row-mark")
    assert "frozen" in classes(lanes["N"]) and "no-loss" in classes(boxes["S6"])
    assert "no-loss" not in classes(boxes["S3"])
    for marker in root.iter(SVG + "marker"):
        assert marker.get("id").startswith("u-")
    for path in elements(root, "path", "parent"):
        assert path.get("marker-end") == "url(#u-head-parent)"


def test_a_long_chain_wraps_onto_bands_with_stubs_naming_both_ends():
    agent = Agent("L", "leader")
    prompt = [1]
    for seq in range(1, 26):
        agent.add(Call.make(f"X{seq}", seq, list(prompt), [seq + 100]))
        prompt += [seq + 100, seq + 200]
    picture = layout(build_rows(Episode("chain", agents=[agent])))
    assert len(picture.bands) == 3
    root = ET.fromstring(render_svg(picture))
    outs = [t.text for t in elements(root, "text", "stub-label") if t.text.startswith("to ")]
    ins = [t.text for t in elements(root, "text", "stub-label") if t.text.startswith("from ")]
    assert outs == ["to X11", "to X21"] and ins == ["from X10", "from X20"]
    headings = [t.text for t in elements(root, "text", "band-heading")]
    assert headings == ["continued: columns 11–20", "continued: columns 21–30"]
