"""The call fields every form copies as they are come from one place (`WireCall` and `Call`):
the JSON codec and the binary schema, writer and reader all take them from there."""

from __future__ import annotations

from pathlib import Path

import pytest

import callgrove as cg
from callgrove.episode.binary.schema import CALL_TYPE, JSON_CALL_FIELDS
from callgrove.episode.codec import PLAIN_CALL_FIELDS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_plain_fields_are_those_no_form_spells_its_own_way():
    assert [f.name for f in PLAIN_CALL_FIELDS] == [
        "policy_version",
        "purpose",
        "kept",
        "content",
        "sampling",
    ]
    assert {f.name for f in PLAIN_CALL_FIELDS} <= set(CALL_TYPE.names)
    assert {"content", "sampling"} == JSON_CALL_FIELDS
    assert not CALL_TYPE.field("purpose").nullable
    assert CALL_TYPE.field("policy_version").nullable


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".arrow"])
def test_every_plain_field_survives_every_form(tmp_path: Path, suffix: str):
    (episode,) = cg.load(EXAMPLES / "login_bug.jsonl")
    call = episode.call("C5")
    call.policy_version, call.kept, call.content = None, False, {"role": "user", "text": "é"}
    episode.call("C11").purpose = "compaction"
    cg.save(tmp_path / f"e{suffix}", [episode])
    (back,) = cg.load(tmp_path / f"e{suffix}")
    for info in PLAIN_CALL_FIELDS:
        assert [getattr(c, info.name) for c in back.calls()] == [
            getattr(c, info.name) for c in episode.calls()
        ], info.name
