"""Rendering is incremental and prefix-stable, for the built-in format and a Jinja template."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from callgrove.chat import BuiltinFormat, ByteTokenizer, JinjaFormat, Message, ToolCall
from callgrove.cli import app
from callgrove.episode import load
from callgrove.formats.problems import InputError
from callgrove.transcripts import (
    Transcript,
    TranscriptAgent,
    TranscriptCall,
    TranscriptRenderer,
    import_claude_code,
)
from callgrove.transcripts.turns import CallRecord, Source, Turn, extend

from .helpers import KIMUSON, assert_prefix_stable

texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12
) | st.sampled_from(["<|end|>", "<|start|>assistant\n", "</tool_result>", ""])
tool_calls = st.builds(
    ToolCall,
    st.text(max_size=4),
    st.sampled_from(["Bash", "Read"]),
    st.dictionaries(st.text(max_size=3), texts, max_size=2),
)
answers = st.builds(
    lambda text, thinking, calls: Message("assistant", text, thinking, tuple(calls)),
    texts,
    texts,
    st.lists(tool_calls, max_size=2),
)
inputs = st.lists(
    st.one_of(
        st.builds(lambda t: Message("user", t), texts),
        st.builds(
            lambda t, i, e: Message("tool", t, tool_call_id=i, is_error=e),
            texts,
            st.text(max_size=4),
            st.booleans(),
        ),
    ),
    max_size=3,
)


@st.composite
def transcripts(draw) -> Transcript:
    """Agents whose calls branch off earlier calls (rewinds, forks) or start fresh."""
    agents = [TranscriptAgent(f"a{i}", "agent") for i in range(draw(st.integers(1, 3)))]
    tips: list[Turn | None] = [None]
    for n in range(draw(st.integers(1, 12))):
        tip = draw(st.sampled_from(tips))
        context = extend(tip, draw(inputs) or [Message("user", "go")])
        agent = draw(st.sampled_from(agents))
        call = TranscriptCall(
            f"c{n}", agent, context, draw(answers), (n,), CallRecord(source=Source("drawn", [n]))
        )
        agent.calls.append(call)
        tips.append(call.answer)
    return Transcript("t", agents)


def from_scratch(call: TranscriptCall, chat_format) -> np.ndarray:
    """The prompt rendered from the whole message history, with no incremental reuse."""
    messages = call.context.messages_since(None)
    parts, previous = [], None
    for message in messages:
        parts.append(chat_format.segment(message, previous))
        previous = message
    return np.concatenate([*parts, chat_format.generation_prompt()])


@settings(max_examples=60, deadline=None)
@given(transcripts())
def test_incremental_prompts_equal_rendering_from_scratch(transcript):
    chat_format = BuiltinFormat()
    episode = TranscriptRenderer(chat_format).episode(transcript)
    for call in transcript.calls():
        rendered = episode.call(call.id)
        assert episode.prompt_ids(rendered).tolist() == from_scratch(call, chat_format).tolist()
        # Literal marker text in messages stays bytes: only real turn frames are special.
        full = episode.full_ids(rendered)
        assert (full == ByteTokenizer.END).sum() == len(call.context.messages_since(None)) + 1
    assert_prefix_stable(episode)


def test_builtin_rendering_of_each_message_kind():
    chat_format = BuiltinFormat()
    answer = Message(
        "assistant", "Listing.", "Need files.", (ToolCall("t1", "Bash", {"command": "ls"}),)
    )
    result = Message("tool", "a.txt", tool_call_id="t1", is_error=True)
    decode = chat_format.decode
    assert decode(chat_format.segment(answer, None)) == (
        "<|start|>assistant\n<think>\nNeed files.\n</think>\nListing.\n"
        '<tool_call>\n{"id":"t1","name":"Bash","arguments":{"command":"ls"}}\n</tool_call><|end|>'
    )
    assert decode(chat_format.segment(result, answer)) == (
        '<|start|>tool\n<tool_result id="t1" error="true">\na.txt\n</tool_result><|end|>'
    )
    assert decode(chat_format.completion(Message("assistant", "hé"), None)) == "hé<|end|>"
    assert decode(chat_format.generation_prompt()) == "<|start|>assistant\n"


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message.get('reasoning_content') %}<think>{{ message['reasoning_content'] }}</think>"
    "{% endif %}{{ message['content'] }}{% for call in message.get('tool_calls') or [] %}"
    "<tool_call>{{ call['function'] | tojson }}</tool_call>{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([KIMUSON.read_text()[:200_000]], trainer)
    folder = tmp_path_factory.mktemp("chatml")
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "template.jinja").write_text(CHATML)
    return JinjaFormat(folder / "tokenizer.json", folder / "template.jinja")


def test_jinja_template_renders_a_real_session_prefix_stably(chatml):
    (transcript,) = import_claude_code(KIMUSON)
    episode = TranscriptRenderer(chatml).episode(transcript)
    assert_prefix_stable(episode)
    assert chatml.rewrites == set()  # ChatML never rewrites earlier messages
    im_end = chatml.tokenizer.token_to_id("<|im_end|>")
    for call in transcript.calls():
        rendered = episode.call(call.id)
        assert rendered.completion_ids[-1] == im_end  # the model samples the end of its turn
        history = [m for m in call.context.messages_since(None)]
        expected = chatml._render([m.as_dict() for m in history], generation=True) + chatml.decode(
            rendered.completion_ids
        )
        assert chatml.decode(episode.full_ids(rendered)) == expected


def test_template_that_rewrites_history_is_rendered_newest_first(tmp_path, chatml):
    """A template that drops reasoning of older turns: each message keeps its newest form."""
    template = CHATML.replace(
        "message.get('reasoning_content')", "message.get('reasoning_content') and loop.last"
    )
    path = tmp_path / "t.jinja"
    path.write_text(template)
    folder = tmp_path
    chatml.tokenizer.save(str(folder / "tokenizer.json"))
    fmt = JinjaFormat(folder / "tokenizer.json", path)
    agent = TranscriptAgent("a", "agent")
    first = TranscriptCall(
        "c1",
        agent,
        Turn(Message("user", "hi"), None),
        Message("assistant", "yo", "think"),
        (1,),
        CallRecord(source=Source("made", [1])),
    )
    second = TranscriptCall(
        "c2",
        agent,
        extend(first.answer, [Message("user", "more")]),
        Message("assistant", "ok"),
        (2,),
        CallRecord(source=Source("made", [2])),
    )
    agent.calls += [first, second]
    episode = TranscriptRenderer(fmt).episode(Transcript("t", [agent]))
    assert_prefix_stable(episode)
    assert "<think>think</think>" in fmt.decode(episode.prompt_ids(episode.call("c2")))


def test_cli_renders_with_a_tokenizer_and_template(tmp_path, chatml):
    from typer.testing import CliRunner

    from callgrove.cli import app
    from callgrove.episode import load

    chatml.tokenizer.save(str(tmp_path / "tokenizer.json"))
    out = tmp_path / "episodes.jsonl"
    arguments = ["import", "claude-code", str(KIMUSON), "--out", str(out)]
    arguments += ["--tokenizer", str(tmp_path / "tokenizer.json")]
    arguments += ["--chat-template", chatml.template_path]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    (episode,) = load(out)
    assert episode.meta["renderer"] == "jinja"
    im_start = chatml.tokenizer.token_to_id("<|im_start|>")
    assert all(episode.full_ids(c)[0] == im_start for c in episode.calls())
    assert_prefix_stable(episode)


def test_cli_names_a_template_that_fails(tmp_path, chatml):
    from typer.testing import CliRunner

    from callgrove.cli import app

    chatml.tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "bad.jinja").write_text('{{ raise_exception("roles must alternate") }}')
    arguments = [
        "import",
        "claude-code",
        str(KIMUSON),
        "--tokenizer",
        str(tmp_path / "tokenizer.json"),
    ]
    arguments += ["--chat-template", str(tmp_path / "bad.jinja")]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2
    assert f"{tmp_path / 'bad.jinja'}: chat template failed: roles must alternate" in result.output


WITHOUT_TOOL_CALLS = CHATML.replace(
    "{% for call in message.get('tool_calls') or [] %}"
    "<tool_call>{{ call['function'] | tojson }}</tool_call>{% endfor %}",
    "",
)


def _template(tmp_path, chatml, text: str, name: str = "t.jinja"):
    chatml.tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / name).write_text(text)
    return tmp_path / "tokenizer.json", tmp_path / name


def test_a_template_that_drops_tool_calls_is_an_error_naming_it(tmp_path, chatml):
    tokenizer, template = _template(tmp_path, chatml, WITHOUT_TOOL_CALLS)
    (transcript,) = import_claude_code(KIMUSON)
    with pytest.raises(InputError) as raised:
        TranscriptRenderer(JinjaFormat(tokenizer, template)).episode(transcript)
    problem = raised.value.problem
    assert problem.file == str(template)
    assert "drops the tool call" in problem.message and "an assistant message" in problem.message


def test_dropped_content_allowed_is_counted(tmp_path, chatml):
    tokenizer, template = _template(tmp_path, chatml, WITHOUT_TOOL_CALLS)
    (transcript,) = import_claude_code(KIMUSON)
    fmt = JinjaFormat(tokenizer, template, allow_dropped=True)
    TranscriptRenderer(fmt).episode(transcript)
    with_tools = {c.id for c in transcript.calls() if c.response.tool_calls and c.kept}
    dropped = {w: n for w, n in fmt.dropped.items() if w.startswith("assistant message: tool call")}
    assert dropped and max(dropped.values()) >= 1
    assert sum(n for w, n in dropped.items() if "arguments" not in w) >= len(with_tools) > 0


def test_cli_reports_dropped_content_as_error_or_counted_warning(tmp_path, chatml):
    tokenizer, template = _template(tmp_path, chatml, WITHOUT_TOOL_CALLS)
    base = ["import", "claude-code", str(KIMUSON), "--out", str(tmp_path / "o.jsonl")]
    base += ["--tokenizer", str(tokenizer), "--chat-template", str(template)]
    result = CliRunner().invoke(app, base)
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert f"error: {template}:" in text
    assert "chat template drops the tool call 'TodoWrite' of an assistant message" in text
    result = CliRunner().invoke(app, [*base, "--allow-dropped-content"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "warning" in text and "chat template drops content (assistant message: tool call" in text
    assert len(list(load(tmp_path / "o.jsonl"))) == 1


def test_a_template_that_renders_nothing_for_a_turn_is_a_clear_error(tmp_path, chatml):
    silent = CHATML.replace(
        "{% for message in messages %}",
        "{% for message in messages if message['role'] != 'assistant' %}",
    )
    tokenizer, template = _template(tmp_path, chatml, silent)
    (transcript,) = import_claude_code(KIMUSON)
    with pytest.raises(InputError) as raised:
        TranscriptRenderer(JinjaFormat(tokenizer, template)).episode(transcript)
    assert raised.value.problem.file == str(template)
    assert "renders nothing for an assistant turn" in raised.value.problem.message


@pytest.mark.parametrize("layout", ["tokenizer_config", "chat_template.jinja"])
def test_tokenizer_accepts_a_model_folder(tmp_path, chatml, layout):
    folder = tmp_path / "model"
    folder.mkdir()
    chatml.tokenizer.save(str(folder / "tokenizer.json"))
    config = {"eos_token": {"content": "<|im_end|>"}, "bos_token": None}
    if layout == "tokenizer_config":
        config["chat_template"] = CHATML
    else:
        (folder / "chat_template.jinja").write_text(CHATML)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    fmt = JinjaFormat.from_folder(folder)
    assert fmt.variables == {"eos_token": "<|im_end|>"}
    out = tmp_path / "o.jsonl"
    result = CliRunner().invoke(
        app, ["import", "claude-code", str(KIMUSON), "--out", str(out), "--tokenizer", str(folder)]
    )
    assert result.exit_code == 0, result.output
    (episode,) = load(out)
    (transcript,) = import_claude_code(KIMUSON)
    reference = TranscriptRenderer(chatml).episode(transcript)
    assert [episode.full_ids(c).tolist() for c in sorted(episode.calls(), key=lambda c: c.seq)] == [
        reference.full_ids(c).tolist() for c in sorted(reference.calls(), key=lambda c: c.seq)
    ]


def test_a_model_folder_without_a_template_is_an_error(tmp_path, chatml):
    chatml.tokenizer.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(InputError, match="no chat template"):
        JinjaFormat.from_folder(tmp_path)
    result = CliRunner().invoke(
        app, ["import", "codex", str(KIMUSON), "--tokenizer", str(tmp_path)]
    )
    assert result.exit_code == 2 and "no chat template" in result.output


def test_a_call_id_or_agent_id_that_repeats_is_an_error_naming_it():
    def transcript(agent_ids: list[str], call_ids: list[str]) -> Transcript:
        agents = [TranscriptAgent(a, "agent") for a in agent_ids]
        for n, call_id in enumerate(call_ids):
            agent = agents[n % len(agents)]
            context = extend(None, [Message("user", f"go {n}")])
            answer = Message("assistant", f"done {n}")
            record = CallRecord(source=Source("made", [n]))
            agent.calls.append(TranscriptCall(call_id, agent, context, answer, (n,), record))
        return Transcript("t", agents)

    with pytest.raises(InputError, match="call id 'c1' appears twice") as raised:
        TranscriptRenderer().episode(transcript(["a"], ["c1", "c2", "c1"]))
    assert raised.value.problem.call == "c1"
    with pytest.raises(InputError, match="agent id 'a' appears twice"):
        TranscriptRenderer().episode(transcript(["a", "a"], ["c1", "c2"]))
    episode = TranscriptRenderer().episode(transcript(["a", "b"], ["c1", "c2"]))
    assert [c.id for agent in episode.agents for c in agent.calls] == ["c1", "c2"]
