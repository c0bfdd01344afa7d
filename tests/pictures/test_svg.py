"""The SVG picture: a golden file for the login_bug example, and what every picture must show."""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from callgrove.episode import Agent, Call, Episode
from callgrove.pictures import layout, render_svg
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


def test_every_call_is_drawn_once_in_seq_order(seed_root):
    boxes = elements(seed_root, "g", "call")
    assert [b.get("data-call") for b in boxes] == [f"C{n}" for n in range(1, 13)]
    xs = [int(b.find(SVG + "rect").get("x")) for b in boxes]
    assert xs == sorted(xs) and len(set(xs)) == 12


def test_one_lane_per_agent_in_ledger_order(seed_root):
    lanes = elements(seed_root, "g", "lane")
    assert [lane.get("data-agent") for lane in lanes] == ["L", "B", "A", "F"]
    tops = [int(lane.find(SVG + "rect").get("y")) for lane in lanes]
    agent_of_box = {
        b.get("data-call"): b.get("data-agent") for b in elements(seed_root, "g", "call")
    }
    for box in elements(seed_root, "g", "call"):
        lane = ["L", "B", "A", "F"].index(agent_of_box[box.get("data-call")])
        y = int(box.find(SVG + "rect").get("y"))
        assert tops[lane] < y < tops[lane] + 96


def test_five_rows_five_colours_each_on_the_calls_it_trains(seed_root):
    swatches = elements(seed_root, "rect", "row-swatch")
    colour_of_row = {int(s.get("data-row")): s.get("fill") for s in swatches}
    assert sorted(colour_of_row) == [1, 2, 3, 4, 5]
    assert len(set(colour_of_row.values())) == 5
    owners = {"C2": 1, "C4": 1, "C5": 2, "C6": 2, "C8": 3, "C9": 3, "C1": 4, "C3": 4}
    owners |= {"C7": 4, "C10": 4, "C11": 5, "C12": 5}
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
    assert {c: r for c, r in context_rows.items() if r} == {"C1": [3], "C3": [3], "C7": [3]}


def test_parent_arrows_are_the_forest_links(seed_root):
    arrows = elements(seed_root, "path", "parent-arrow")
    pairs = sorted((a.get("data-from"), a.get("data-to")) for a in arrows)
    assert len(arrows) == 8  # one per call that is not a root
    assert pairs == sorted(
        [
            ("C1", "C3"),
            ("C3", "C7"),
            ("C7", "C8"),
            ("C8", "C9"),
            ("C7", "C10"),
            ("C2", "C4"),
            ("C5", "C6"),
            ("C11", "C12"),
        ]
    )
    assert all(a.get("stroke-dasharray") is None for a in arrows)


def test_hand_overs_for_each_subagent_drawn_dashed(seed_root):
    links = elements(seed_root, "path", "hand-over")
    assert sorted(link.get("data-agent") for link in links) == ["A", "B", "F"]
    arrow_stroke = elements(seed_root, "path", "parent-arrow")[0].get("stroke")
    for link in links:
        assert link.get("stroke-dasharray")
        assert link.get("stroke") != arrow_stroke
        assert link.get("data-from-agent") == "L"
        assert "from-lane" not in classes(link)
    # The example records the leader call that started each subagent, as the login_bug story tells it.
    assert {link.get("data-agent"): link.get("data-from") for link in links} == {
        "B": "C1",
        "A": "C3",
        "F": "C7",
    }
    labels = [t.text for t in elements(seed_root, "text", "hand-over-label")]
    assert labels == ["starts B (background)", "starts A (fresh)", "starts F (fork)"]


def test_compaction_leaves_and_background_are_marked(seed_root):
    boxes = {b.get("data-call"): b for b in elements(seed_root, "g", "call")}
    assert [c for c, b in boxes.items() if "compaction" in classes(b)] == ["C10"]
    assert len(elements(seed_root, "line", "compaction-cut")) == 1
    assert len(elements(boxes["C10"], "rect", "compaction-mark")) == 1
    leaves = {c: elements(b, "text", "leaf-mark") for c, b in boxes.items() if "leaf" in classes(b)}
    assert {c: marks[0].text for c, marks in leaves.items()} == {
        "C4": "leaf → row 1",
        "C6": "leaf → row 2",
        "C9": "leaf → row 3",
        "C10": "leaf → row 4",
        "C12": "leaf → row 5",
    }
    assert sorted(c for c, b in boxes.items() if "root" in classes(b)) == ["C1", "C11", "C2", "C5"]
    background = [
        lane for lane in elements(seed_root, "g", "lane") if "background" in classes(lane)
    ]
    assert [lane.get("data-agent") for lane in background] == ["B"]
    assert len(elements(background[0], "text", "background-mark")) == 1


def test_unusual_marks_known_start_gap_retry_frozen_and_idle_agent():
    result = build_rows(unusual_episode())
    root = ET.fromstring(render_svg(layout(result), id_prefix="u-"))
    boxes = {b.get("data-call"): b for b in elements(root, "g", "call")}
    assert list(boxes) == ["S1", "S2", "S3", "S4", "R5", "S6"]
    lanes = {lane.get("data-agent"): lane for lane in elements(root, "g", "lane")}
    assert list(lanes) == ["L", "W", "G", "N", "Z"]  # no calls: last
    links = {link.get("data-agent"): link for link in elements(root, "path", "hand-over")}
    assert sorted(links) == ["N", "W", "Z"]  # G's start was not recorded
    assert links["W"].get("data-from") == "S1" and "from-lane" not in classes(links["W"])
    assert "from-lane" in classes(links["N"])
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
    for path in elements(root, "path", "parent-arrow"):
        assert path.get("marker-end") == "url(#u-arrow)"


def test_arrow_over_a_sibling_on_the_same_lane_arcs_above_it():
    """X3 and X2 both continue X1; the straight line X1 -> X3 would cross X2's box."""
    x1 = Call.make("X1", 1, [1, 2], [3])
    x2 = Call.make("X2", 2, [1, 2, 3, 4], [5])
    x3 = Call.make("X3", 3, [1, 2, 3, 6], [7])
    episode = Episode("siblings", agents=[Agent("L", "leader", calls=[x1, x2, x3])])
    root = ET.fromstring(render_svg(layout(build_rows(episode))))
    arrows = {a.get("data-to"): a.get("d") for a in elements(root, "path", "parent-arrow")}
    boxes = {b.get("data-call"): b.find(SVG + "rect") for b in elements(root, "g", "call")}
    top = int(boxes["X1"].get("y"))
    _, y, _, rise_1, _, rise_2, *_ = map(int, re.findall(r"-?\d+", arrows["X3"]))
    assert y == top and rise_1 < top and rise_2 < top  # X1 -> X3 leaves the top and rises
    assert arrows["X2"].startswith(f"M {int(boxes['X1'].get('x')) + 108} ")  # X1 -> X2 straight
