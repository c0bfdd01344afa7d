"""Pictures checked in headless Chromium at 12 calls and at about 200: no text of a call box
leaves its box, no other label lies over any box or over another label, and no link runs
through a box other than the two it joins.

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
  var wrong = [], texts = 0, links = 0;
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
    var labels = [];
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
      labels.forEach(function (other) {
        if (meet(own, other[1])) {
          wrong.push(["over a label", episode, other[0], text.textContent]);
        }
      });
      labels.push([text.textContent, own]);
    });
  });
  // Every link, segment by segment (orthogonal: M and L only), against every call box but
  // the ones it leaves and reaches: a line may run beside a box, never through it.
  document.querySelectorAll("svg[data-episode]").forEach(function (svg) {
    var episode = svg.getAttribute("data-episode"), boxes = [];
    svg.querySelectorAll("g.call").forEach(function (call) {
      boxes.push([call.getAttribute("data-call"), area(call.querySelector("rect.box"))]);
    });
    svg.querySelectorAll("path.link").forEach(function (path) {
      links += 1;
      var ends = [path.getAttribute("data-from"), path.getAttribute("data-to")];
      var matrix = path.getScreenCTM(), points = [];
      var numbers = path.getAttribute("d").match(/-?[0-9.]+/g).map(Number);
      for (var i = 0; i + 1 < numbers.length; i += 2) {
        var point = svg.createSVGPoint();
        point.x = numbers[i];
        point.y = numbers[i + 1];
        point = point.matrixTransform(matrix);
        points.push([point.x, point.y]);
      }
      for (var j = 0; j + 1 < points.length; j += 1) {
        var a = points[j], b = points[j + 1];
        var segment = [Math.min(a[0], b[0]), Math.min(a[1], b[1]),
                       Math.max(a[0], b[0]), Math.max(a[1], b[1])];
        boxes.forEach(function (box) {
          if (ends.indexOf(box[0]) >= 0) {
            return;
          }
          var b2 = box[1];
          if (segment[0] < b2[2] - 1 && b2[0] + 1 < segment[2] + 0.01 &&
              segment[1] < b2[3] - 1 && b2[1] + 1 < segment[3] + 0.01) {
            wrong.push(["line through a box", episode, box[0], ends.join(" -> ")]);
          }
        });
      }
    });
  });
  var out = document.createElement("pre");
  out.id = "overlap-probe";
  out.textContent = JSON.stringify({texts: texts, links: links, wrong: wrong});
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
    assert found["links"] >= 12 * len(episodes) // 2
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
    assert found["links"] >= 200  # every link was followed, segment by segment
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
            writer.leaf("text", text="another", x=box.x + 200, y=box.y - 20)
            writer.leaf("text", text="another", x=box.x + 204, y=box.y - 18)
            middle = box.y + 20
            writer.leaf("path", d=f"M {box.x - 30} {middle} L {box.x + 300} {middle}",
                        class_="link parent", data_from="C1", data_to="C12")  # fmt: skip

    monkeypatch.setattr(svg, "_row_squares", crowded)
    found = probe(tmp_path, list(load(LOGIN_BUG)), "crowded")
    kinds = sorted({(kind, call) for kind, _, call, _ in found["wrong"]})
    assert ("outside its box", "C3") in kinds and ("over a box", "C3") in kinds
    assert ("line through a box", "C3") in kinds and ("over a label", "another") in kinds
    assert {kind for kind, _ in kinds} == {
        "outside its box", "over a box", "line through a box", "over a label",
    }  # fmt: skip
