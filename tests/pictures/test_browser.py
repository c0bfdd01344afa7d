"""The HTML page in headless Chromium: it loads with no console errors and draws every call.

`make test` installs Debian's chromium when /usr/bin/chromium is missing. The page reports
what the browser drew in a status element (calls found, calls with a visible box, script
errors caught); the test reads it from the DOM Chromium dumps after loading, and reads the
browser's console log from stderr.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from callgrove.episode import load
from callgrove.pictures import call_details, layout, render_html, render_svg
from callgrove.rows import build_rows

from .episodes import HOSTILE_TEXT, LOGIN_BUG, LOGIN_GROUP, unusual_episode

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_SECONDS = 20


class DumpedDom(HTMLParser):
    """Call boxes per episode section, the status element, and the scripts in the page."""

    def __init__(self):
        super().__init__()
        self.sections: dict[str, list[str]] = {}
        self.status: dict[str, str | None] = {}
        self.scripts = 0
        self._section: str | None = None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "section" and "episode" in (attributes.get("class") or "").split():
            self._section = attributes["data-episode"]
            self.sections[self._section] = []
        elif tag == "g" and "call" in (attributes.get("class") or "").split():
            self.sections[self._section].append(attributes["data-call"])
        elif tag == "output" and attributes.get("id") == "callgrove-status":
            self.status = attributes
        elif tag == "script":
            self.scripts += 1


def page_episodes():
    return [*load(LOGIN_BUG), *load(LOGIN_GROUP), unusual_episode()]


def dump_dom(page: Path, profile: Path) -> tuple[str, str]:
    """The page's DOM after loading, and the browser's log (console messages included)."""
    assert Path(CHROMIUM).exists(), (
        "chromium is missing: `make test` installs it (apt-get update && apt-get install -y "
        "chromium)"
    )
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--dump-dom",
        page.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_SECONDS)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


@pytest.fixture(scope="module")
def pictures():
    return [layout(build_rows(e)) for e in page_episodes()]


@pytest.fixture(scope="module")
def browser_run(tmp_path_factory, pictures):
    folder = tmp_path_factory.mktemp("browser")
    page = folder / "episodes.html"
    page.write_text(render_html(pictures, "test page"), encoding="utf-8")
    text, log = dump_dom(page, folder / "profile")
    dom = DumpedDom()
    dom.feed(text)
    return [p.episode for p in pictures], dom, log


def test_page_loads_without_console_errors(browser_run):
    _, dom, log = browser_run
    console = [line for line in log.splitlines() if ":CONSOLE" in line]
    assert console == []  # the page logs nothing; an error or a blocked fetch would show here
    assert dom.status["data-state"] == "ready", dom.status
    assert dom.status["data-errors"] == "0"


def test_page_shows_every_call(browser_run):
    episodes, dom, _ = browser_run
    assert dom.sections == {e.id: sorted((c.id for c in e.calls()), key=_seq(e)) for e in episodes}
    total = sum(len(calls) for calls in dom.sections.values())
    assert dom.status["data-calls"] == str(total)
    assert dom.status["data-visible"] == str(total)  # each has a box with an area on screen


def test_call_text_cannot_break_out_of_the_page(browser_run):
    episodes, dom, _ = browser_run
    assert dom.scripts == len(episodes) + 1  # one data block per section, and the page script


def _seq(episode):
    seq = {c.id: c.seq for c in episode.calls()}
    return lambda call_id: seq[call_id]


# Appended to a copy of the page: hovers every call box, as a mouse would, and records what
# the tip showed, then leaves it and records whether the tip hid again.
HOVER_PROBE = """<script>
document.addEventListener("DOMContentLoaded", function () {
  var tip = document.getElementById("callgrove-tip"), seen = {};
  document.querySelectorAll("g.call").forEach(function (box) {
    var area = box.getBoundingClientRect();
    var at = {clientX: area.left + 4, clientY: area.top + 4};
    box.dispatchEvent(new MouseEvent("mouseenter", at));
    var shown = tip.hidden ? null : tip.textContent;
    box.dispatchEvent(new MouseEvent("mouseleave", at));
    seen[box.closest("section").id + " " + box.getAttribute("data-call")] =
      {shown: shown, hidden_after: tip.hidden};
  });
  var out = document.createElement("pre");
  out.id = "hover-probe";
  out.textContent = JSON.stringify(seen);
  document.body.appendChild(out);
});
</script>
"""


def test_hovering_a_call_shows_its_text_and_token_counts(tmp_path, pictures):
    page = tmp_path / "probe.html"
    page.write_text(
        render_html(pictures, "probe").replace("</body>", HOVER_PROBE + "</body>"),
        encoding="utf-8",
    )
    text, _ = dump_dom(page, tmp_path / "profile")
    probe = re.search(r'<pre id="hover-probe">(.*?)</pre>', text, re.S)
    assert probe, "the probe did not run"
    seen = json.loads(unescape(probe.group(1)))
    expected = {
        f"episode-{n} {box.call.id}": call_details(box)
        for n, picture in enumerate(pictures)
        for box in picture.boxes
    }
    assert sorted(seen) == sorted(expected)
    for key, details in expected.items():
        shown = seen[key]["shown"]
        assert shown is not None and seen[key]["hidden_after"], key
        counts = (
            f"prompt {details['prompt']} (+{details['prompt_added']}) · "
            f"completion {details['completion']} tokens"
        )
        assert details["id"] in shown and counts in shown, (key, shown)
        assert details["text"] in shown, (key, shown)
    hostile = next(v["shown"] for k, v in seen.items() if k.endswith(" S1"))
    assert HOSTILE_TEXT in hostile  # shown as text, not run as markup


def test_page_fetches_nothing_and_escapes_call_text():
    """Everything is inline and the page's policy forbids fetching, so it works offline."""
    text = render_html([layout(build_rows(unusual_episode()))], "offline")
    assert "Content-Security-Policy\" content=\"default-src 'none';" in text
    assert not re.search(r'\b(?:src|href)="(?!#)', text)
    assert HOSTILE_TEXT not in text
    assert "\\u003c/script\\u003e" in text


# Appended to a page: clicks a call with a long text, scrolls the tip, leaves the box, then
# presses Escape; records what the tip and the status element look like at each step.
PIN_PROBE = """<script>
document.addEventListener("DOMContentLoaded", function () {
  var tip = document.getElementById("callgrove-tip");
  var status = document.getElementById("callgrove-status");
  var box = document.querySelector('g.call[data-call="C2"]');
  var area = box.getBoundingClientRect();
  var at = {clientX: area.left + 4, clientY: area.top + 4, bubbles: true};
  box.dispatchEvent(new MouseEvent("mouseenter", at));
  box.dispatchEvent(new MouseEvent("click", at));
  var style = getComputedStyle(tip);
  var seen = {pinned: tip.classList.contains("pinned"), pointer: style.pointerEvents,
              overflow: style.overflowY, scrollable: tip.scrollHeight > tip.clientHeight + 50};
  tip.scrollTop = 200;
  seen.scrolled = tip.scrollTop;
  box.dispatchEvent(new MouseEvent("mouseleave", at));
  seen.shown_after_leaving = !tip.hidden;
  document.dispatchEvent(new KeyboardEvent("keydown", {key: "Escape"}));
  seen.hidden_after_escape = tip.hidden;
  var place = status.getBoundingClientRect();
  seen.status_display = getComputedStyle(status).display;
  seen.status_area = place.width * place.height;
  var out = document.createElement("pre");
  out.id = "pin-probe";
  out.textContent = JSON.stringify(seen);
  document.body.appendChild(out);
});
</script>
"""


def test_a_clicked_tip_stays_and_scrolls_and_the_status_is_not_shown(tmp_path):
    from callgrove.episode import Agent, Call, Episode

    long_text = "\n".join(f"line {n} of a long answer" for n in range(300))
    agent = Agent(id="L", name="leader")
    agent.add(Call.make("C1", 1, [1, 2], [3], content="short"))
    agent.add(Call.make("C2", 2, [1, 2, 3, 4], [5, 6], content=long_text))
    picture = layout(build_rows(Episode("long-text", agents=[agent], rewards={"r": 1.0})))
    page = tmp_path / "pin.html"
    page.write_text(
        render_html([picture], "pin").replace("</body>", PIN_PROBE + "</body>"), encoding="utf-8"
    )
    text, _ = dump_dom(page, tmp_path / "profile")
    found = re.search(r'<pre id="pin-probe">(.*?)</pre>', text, re.S)
    assert found, "the probe did not run"
    seen = json.loads(unescape(found.group(1)))
    assert seen["pinned"] and seen["pointer"] == "auto" and seen["overflow"] == "auto", seen
    assert seen["scrollable"] and seen["scrolled"] == 200, seen  # the long text scrolls
    assert seen["shown_after_leaving"] and seen["hidden_after_escape"], seen
    assert seen["status_display"] == "none" and seen["status_area"] == 0, seen


# Inlines a picture in a column of a given width and records the width the browser drew it at.
WIDTH_PAGE = """<!doctype html><html><body style="margin:0">
<div id="column" style="width:{column}px">{svg}</div>
<script>
document.body.setAttribute("data-drawn", String(
  Math.round(document.querySelector("svg").getBoundingClientRect().width)));
</script></body></html>"""


@pytest.mark.parametrize("column", [600, 4000])
def test_the_svg_fits_its_column_and_is_never_drawn_wider(tmp_path, column):
    """The picture's width follows the window or column it is shown in (a 600 px column takes
    it at 600 px), and a wide one never stretches it past the width it was drawn at."""
    picture = layout(build_rows(next(iter(load(LOGIN_BUG)))))
    page = tmp_path / "width.html"
    page.write_text(WIDTH_PAGE.format(column=column, svg=render_svg(picture)), encoding="utf-8")
    text, _ = dump_dom(page, tmp_path / "profile")
    drawn = int(re.search(r'data-drawn="(\d+)"', text).group(1))
    assert drawn == min(column, picture.width)
