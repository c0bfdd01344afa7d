"""Paths of the real transcripts under tests/data/real and checks every import must pass."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from callgrove.episode import Episode
from callgrove.forest import build_forest
from callgrove.rows import build_rows, check_rows
from callgrove.transcripts import ImportReport, Transcript

REAL = Path(__file__).resolve().parent.parent / "data" / "real"
KIMUSON = REAL / (
    "d-kimuson__claude-code-viewer/mock-global-claude-dir/projects/sample-project/"
    "5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"
)
PROJECTS = REAL / "iansherr__claude-code-log/test/test_data/real_projects"
FLAT_DIR = PROJECTS / "-Users-dain-workspace-coderabbit-review-helper"
FLAT = FLAT_DIR / "cb2e607c-c758-415a-8b45-c49e4631906a.jsonl"
NESTED = PROJECTS / "-src-experiments-claude_p/29ccd257-68b1-427f-ae5f-6524b7cb6f20.jsonl"
DAG = REAL / "daaain__claude-code-log/test/test_data"
STAGE0 = REAL / "jazzyalex__agent-sessions/Resources/Fixtures/stage0/agents"
STAGE0_SMALL = STAGE0 / "claude/small.jsonl"
STAGE0_SUBAGENT = STAGE0 / "claude/subagent/0a1b2c3d-4e5f-4061-8071-2a3b4c5d6e7f.jsonl"
CODEX_SMALL = STAGE0 / "codex/small.jsonl"
CODEX_SAMPLE = REAL / "simonw__claude-code-transcripts/tests/sample_codex_session.jsonl"


DATA = Path(__file__).resolve().parent.parent / "data"


class Generated:
    """Sessions a real harness CLI wrote against a scripted server (`tests/data/<harness>/`):
    one folder per scenario, with `sessions/` and the server's `requests.jsonl`."""

    def __init__(self, harness: str, importer: Callable[..., list[Transcript]]):
        self.folder = DATA / harness
        self.importer = importer
        self.scenarios = sorted(
            p.name for p in self.folder.iterdir() if (p / "requests.jsonl").is_file()
        )

    def requests(self, scenario: str) -> list[dict]:
        lines = (self.folder / scenario / "requests.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def imported(self, scenario: str) -> tuple[Transcript, ImportReport]:
        report = ImportReport()
        (transcript,) = self.importer(self.folder / scenario / "sessions", report)
        return transcript, report


def assert_every_line_accounted(report: ImportReport) -> None:
    """Each non-blank line of each file read is used, skipped with a reason, or a problem."""
    assert report.lines_read
    for file, count in report.lines_read.items():
        numbers = {
            n for n, line in enumerate(Path(file).read_bytes().split(b"\n"), 1) if line.strip()
        }
        assert len(numbers) == count, file
        assert report.accounted(file) == numbers, file


def assert_prefix_stable(episode: Episode) -> None:
    """A call whose messages continue a kept call's has that call as its forest parent (or a
    twin with the very same tokens); one continuing a call that was not kept continues that
    call's own base. Rows check clean."""
    forest = build_forest(episode)
    for call in forest.calls:
        base = episode.base_of(call)
        while base is not None and not base.kept:
            base = episode.base_of(base)
        parent = forest.parent_of(call)
        if base is None or parent is base:
            continue
        assert parent is not None, f"{call.id} continues {base.id} but is a root"
        assert episode.full_ids(parent).tolist() == episode.full_ids(base).tolist(), call.id
    summary = check_rows(build_rows(episode))
    assert summary.violations == [], [str(v) for v in summary.violations]
