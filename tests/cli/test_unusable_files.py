"""A file handed to a server's option that is not what the option reads (a tokenizer.json, a
chat template, a script, the reference decoder's weights): one line naming the file and what
was expected, exit 2, no traceback and nothing served; a crafted pickle is refused unrun."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.serving import web

NOT_A_TOKENIZER = {
    "empty": b"",
    "other JSON": b'{"model": "gpt", "vocab": [1, 2]}',
    "a JSON list": b"[1, 2, 3]",
    "binary": bytes(range(256)) * 4,
}


def run(monkeypatch, *args: object):
    """`callgrove ARGS`, with nothing served should the options be taken."""
    served = []
    monkeypatch.setattr(web, "serve", lambda app, host, port, ready: served.append(app))
    monkeypatch.delenv("CALLGROVE_TOKEN", raising=False)
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert served == [], "started serving on a file it cannot use"
    return result


def one_error_line(result, file: Path) -> str:
    """The one line of a usage error naming `file`; no traceback anywhere."""
    output = result.output  # stdout and stderr as a terminal shows them
    assert result.exit_code == 2, output
    assert result.exception is None or isinstance(result.exception, SystemExit), output
    assert "Traceback" not in output, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert str(file) in lines[0], lines
    return lines[0]


def script(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(data))
    return path


def good_tokenizer(tmp_path: Path) -> Path:
    path = tmp_path / "good-tokenizer.json"
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(path))
    return path


def template(tmp_path: Path, text: str = "{{ messages }}") -> Path:
    path = tmp_path / "chat.jinja"
    path.write_text(text)
    return path


# --tokenizer: gateway, serve-policy and import read it through one loader


def tokenizer_commands(tmp_path: Path, tokenizer: Path) -> dict[str, list[object]]:
    chat = template(tmp_path)
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text("")
    return {
        "gateway": [
            "gateway",
            *("--upstream", "http://127.0.0.1:1", "--ledger", tmp_path / "ledger"),
            *("--tokenizer", tokenizer, "--chat-template", chat),
        ],
        "serve-policy": [
            "serve-policy",
            *("--script", script(tmp_path, {"rules": []})),
            *("--tokenizer", tokenizer, "--chat-template", chat),
        ],
        "import": [
            *("import", "claude-code", tmp_path, "-o", tmp_path / "out.jsonl"),
            *("--tokenizer", tokenizer, "--chat-template", chat),
        ],
        "import join": [
            *("import", "join", episodes, episodes, "-o", tmp_path / "joined.jsonl"),
            *("--tokenizer", tokenizer),
        ],
    }


@pytest.mark.parametrize("command", ["gateway", "serve-policy", "import", "import join"])
@pytest.mark.parametrize("kind", sorted(NOT_A_TOKENIZER))
def test_a_tokenizer_that_is_not_a_tokenizer_json_is_one_line(tmp_path, monkeypatch, command, kind):
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_bytes(NOT_A_TOKENIZER[kind])
    result = run(monkeypatch, *tokenizer_commands(tmp_path, tokenizer)[command])
    assert "not a tokenizer.json" in one_error_line(result, tokenizer)


def test_a_model_folder_whose_tokenizer_json_is_not_one_is_named(tmp_path, monkeypatch):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    upstream = ("--upstream", "http://127.0.0.1:1", "--ledger", tmp_path / "ledger")
    result = run(monkeypatch, "gateway", *upstream, "--tokenizer", folder)
    assert "not a tokenizer.json" in one_error_line(result, folder / "tokenizer.json")


def test_a_chat_template_that_is_not_jinja_is_one_line(tmp_path, monkeypatch):
    chat = template(tmp_path, "{% if %}")
    upstream = ("--upstream", "http://127.0.0.1:1", "--ledger", tmp_path / "ledger")
    tokenizer = good_tokenizer(tmp_path)
    result = run(
        monkeypatch, "gateway", *upstream, "--tokenizer", tokenizer, "--chat-template", chat
    )
    assert "not a Jinja chat template: line 1" in one_error_line(result, chat)


# --script: every field typed, a wrong type named by its rule and field

RULE = {"when": "hello", "reply": "Hi!"}


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"rules": [{**RULE, "when": 5}]}, "rules[0].when"),
        ({"rules": [RULE, {**RULE, "when": [1]}]}, "rules[1].when[0]"),
        ({"rules": [{**RULE, "when": None}]}, "rules[0].when"),
        ({"rules": [{**RULE, "when": {"text": "hello"}}]}, "rules[0].when"),
        ({"rules": [{**RULE, "times": "1"}]}, "rules[0].times"),
        ({"rules": [{**RULE, "times": True}]}, "rules[0].times"),
        ({"rules": [{**RULE, "times": 0}]}, "rules[0].times"),
        ({"rules": [{**RULE, "in": "everywhere"}]}, "rules[0].in"),
        ({"rules": [{**RULE, "capture": 5}]}, "rules[0].capture"),
        ({"rules": [{**RULE, "capture": "("}]}, "rules[0].capture"),
        ({"rules": [{"when": "hello"}]}, "rules[0]: Object missing required field `reply`"),
        ({"rules": [{**RULE, "reply": None}]}, "rules[0].reply"),
        ({"rules": [{**RULE, "reply": {"text": 5}}]}, "rules[0].reply.text"),
        ({"rules": [{**RULE, "reply": {"tool_calls": [{"name": 5}]}}]}, "tool_calls[0].name"),
        ({"rules": [{**RULE, "reply": {"tool_calls": "f"}}]}, "rules[0].reply.tool_calls"),
        ({"rules": [5]}, "rules[0]"),
        ({"rules": {"0": RULE}}, "rules"),
        ({"rules": [], "default": None}, "default"),
        ([RULE], "a script is a JSON object"),
    ],
    ids=lambda v: json.dumps(v)[:50] if not isinstance(v, str) else v,
)
def test_a_script_of_a_wrong_type_is_one_line_naming_the_field(tmp_path, monkeypatch, data, named):
    path = script(tmp_path, data)
    result = run(monkeypatch, "serve-policy", "--script", path)
    line = one_error_line(result, path)
    assert "bad script" in line and named in line, line


def test_a_script_that_is_not_json_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "script.json"
    path.write_bytes(b'{"rules": [')
    assert "cannot read script" in one_error_line(
        run(monkeypatch, "serve-policy", "--script", path), path
    )


# --weights: read as data only, through the one loader of torch files


class RunsCode:
    """Unpickled, it would create `marker`: what a crafted weights file could do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (self.marker.touch, ())


def torch_saved(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def weights_files(marker: Path) -> dict[str, bytes]:
    tensors = torch_saved({"embed.weight": torch.zeros(4, 4)})
    return {
        "a crafted pickle": pickle.dumps(RunsCode(marker)),
        "a crafted torch.save": torch_saved({"embed.weight": RunsCode(marker)}),
        "cut short": tensors[: len(tensors) // 2],
        "random bytes": bytes(range(256)) * 4,
        "plain JSON": b'{"embed.weight": [[0.0]]}',
        "empty": b"",
    }


@pytest.mark.parametrize(
    "kind",
    [
        "a crafted pickle",
        "a crafted torch.save",
        "cut short",
        "random bytes",
        "plain JSON",
        "empty",
    ],
)
def test_weights_that_cannot_be_loaded_safely_are_one_line(tmp_path, monkeypatch, kind):
    marker = tmp_path / "ran"
    path = tmp_path / "w.pt"
    path.write_bytes(weights_files(marker)[kind])
    result = run(monkeypatch, "serve-policy", "--model", "tiny", "--weights", path)
    assert "not a weights file callgrove can load safely" in one_error_line(result, path)
    assert not marker.exists(), "the file's code ran"


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ([torch.zeros(2)], "not a state dict"),
        (torch.zeros(2), "not a state dict"),
        ({"embed.weight": torch.zeros(3)}, "not the reference decoder's weights"),
        ({"nothing": 1}, "not the reference decoder's weights"),
    ],
    ids=["a list", "a tensor", "a wrong shape", "other keys"],
)
def test_weights_that_are_not_the_reference_decoders_are_one_line(
    tmp_path, monkeypatch, value, said
):
    path = tmp_path / "w.pt"
    path.write_bytes(torch_saved(value))
    result = run(monkeypatch, "serve-policy", "--model", "tiny", "--weights", path)
    assert said in one_error_line(result, path)
