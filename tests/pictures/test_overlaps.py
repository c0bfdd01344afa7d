"""Pictures checked in headless Chromium at 12 calls and at about 200: no text of a call box
leaves its box, and no other label lies over any box.

The pages are the ones `callgrove show --html` writes, for the bundled example, for real
sessions imported from `tests/data/real/`, and for a synthetic episode of 280 calls. A probe
script measures every text where the browser drew it (its font, its wrapping, its
transforms) and reports each one out of place.
"""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import load
from callgrove.pictures import layout, render_html
from callgrove.rows import build_rows
from callgrove.synth.workload import Shape, synth_episode

from .episodes import LOGIN_BUG, LOGIN_GROUP, unusual_episode
from .test_browser import dump_dom

REAL = Path(__file__).parents[1] / "data" / "real"
SESSIONS = {
    "claude-code": [
        REAL / "d-kimuson__claude-code-viewer/mock-global-claude-dir/projects/sample-project",
        REAL / "iansherr__claude-code-log/test/test_data/real_projects/-src-experiments-claude_p",
        REAL / "iansherr__claude-code-log/test/test_data/real_projects/"
        "-Users-dain-workspace-coderabbit-review-helper",
    ],
    "codex": [
        REAL / "jazzyalex__agent-sessions/Resources/Fixtures/stage0/agents/codex/small.jsonl"
    ],
}

# Appended to the page: measures every text against the call boxes and prints what is wrong.
OVERLAP_PROBE = """<script>
document.addEventListener("DOMContentLoaded", function () {
  var wrong = [], texts = 0;
  function area(element) {
    var b = element.getBoundingClientRect();
    return [b.left, b.top, b.right, b.bottom];
  }
  function inside(a, b) {
    return a[0] >= b[0] - 0.5 && a[1] >= b[1] - 0.5 && a[2] <= b[2] + 0.5 && a[3] <= b[3] + 0.5;
  }
  function meet(a, b) {
    return a[0] < b[2] - 0.5 && b[0] < a[2] - 0.5 && a[1] < b[3] - 0.5 && b[1] < a[3] - 0.5;
  }
  document.querySelectorAll("svg[data-episode]").forEach(function (svg) {
    var episode = svg.getAttribute("data-episode"), boxes = [];
    svg.querySelectorAll("g.call").forEach(function (call) {
      var box = area(call.querySelector("rect.box"));
      boxes.push([call.getAttribute("data-call"), box]);
      call.querySelectorAll("text.box-text").forEach(function (text) {
        texts += 1;
        if (!inside(area(text), box)) {
          wrong.push(["outside its box", episode, call.getAttribute("data-call"), text.textContent]);
        }
      });
    });
    svg.querySelectorAll("text").forEach(function (text) {
      if (text.classList.contains("box-text") || !text.textContent) {
        return;
      }
      texts += 1;
      var own = area(text);
      boxes.forEach(function (box) {
        if (meet(own, box[1])) {
          wrong.push(["over a box", episode, box[0], text.textContent]);
        }
      });
    });
  });
  var out = document.createElement("pre");
  out.id = "overlap-probe";
  out.textContent = JSON.stringify({texts: texts, wrong: wrong});
  document.body.appendChild(out);
});
</script>
"""


def probe(tmp_path: Path, episodes: list, name: str) -> dict:
    pictures = [layout(build_rows(episode)) for episode in episodes]
    page = tmp_path / f"{name}.html"
    page.write_text(
        render_html(pictures, name).replace("</body>", OVERLAP_PROBE + "</body>"),
        encoding="utf-8",
    )
    text, _ = dump_dom(page, tmp_path / f"profile-{name}")
    found = re.search(r'<pre id="overlap-probe">(.*?)</pre>', text, re.S)
    assert found, "the probe did not run"
    return json.loads(unescape(found.group(1)))


def imported_sessions(tmp_path: Path) -> list:
    runner = CliRunner()
    episodes = []
    for harness, paths in SESSIONS.items():
        for number, path in enumerate(paths):
            out = tmp_path / f"{harness}-{number}.jsonl"
            result = runner.invoke(app, ["import", harness, str(path), "-o", str(out)])
            assert result.exit_code == 0, result.output
            episodes += list(load(out))
    return episodes


def test_the_example_and_the_group_at_12_calls(tmp_path):
    episodes = [*load(LOGIN_BUG), *load(LOGIN_GROUP), unusual_episode()]
    found = probe(tmp_path, episodes, "examples")
    assert found["texts"] > 12 * 3 * len(episodes) // 2  # the probe measured the pictures
    assert found["wrong"] == []


def test_real_sessions(tmp_path):
    episodes = imported_sessions(tmp_path)
    calls = sorted(sum(1 for _ in episode.calls()) for episode in episodes)
    assert calls[-1] >= 80 and calls[0] <= 12  # a long real session and short ones
    found = probe(tmp_path, episodes, "real")
    assert found["wrong"] == []


@pytest.fixture(scope="module")
def big_episode():
    shape = Shape(
        leader_calls=40, subagent_calls=8, fresh=6, forks=10, fork_depth=2, background=3,
        twins=1, compactions=2, context=2048,
    )  # fmt: skip
    return synth_episode(shape, seed=0)


def test_about_200_calls(tmp_path, big_episode):
    assert 200 <= sum(1 for _ in big_episode.calls()) <= 300
    found = probe(tmp_path, [big_episode], "big")
    assert found["wrong"] == []


def test_width_stays_bounded_however_many_calls(big_episode):
    [example] = load(LOGIN_BUG)
    small, big = layout(build_rows(example)), layout(build_rows(big_episode))
    assert big.width == small.width <= 1900
    assert len(big.bands) > 1  # long chains wrap onto further bands


def test_the_probe_sees_text_out_of_place(tmp_path, monkeypatch):
    """The same probe on a picture with a box text too long for its box and a label drawn
    over another box reports both, so the checks above can fail."""
    import callgrove.pictures.svg as svg

    real_squares = svg._row_squares  # drawn inside the call's group

    def crowded(writer, box):
        real_squares(writer, box)
        if box.call.id == "C3":
            writer.leaf("text", text="a box text far, far too long to fit in any box", x=box.x + 7, y=box.y + 31,
                        class_="box-text")  # fmt: skip
            writer.leaf("text", text="a label", x=box.x + 20, y=box.y + 30)

    monkeypatch.setattr(svg, "_row_squares", crowded)
    found = probe(tmp_path, list(load(LOGIN_BUG)), "crowded")
    kinds = sorted({(kind, call) for kind, _, call, _ in found["wrong"]})
    assert kinds == [("outside its box", "C3"), ("over a box", "C3")]
