"""`[model]` as a tagged union: `kind` picks the struct, each kind takes only its own settings,
older spellings still load (converted, with a note), and the one door opens the same chat format
for every command."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import msgspec
import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import callgrove
from callgrove.cli.app import app
from callgrove.cli.model_options import chat_template
from callgrove.models import HfModel, TinyModel, VllmModel
from callgrove.models.settings import OLD_FORMS_END
from callgrove.networks.sizes import LoraSettings, TinyConfig
from callgrove.orchestrator.config import (
    ConfigError,
    check_resume,
    config_from_dict,
    load_config,
    to_toml,
)


def model(raw: dict):
    return config_from_dict({"model": raw}).model


def test_kind_picks_the_struct_and_is_read_from_the_name_where_left_out():
    assert model({}) == TinyModel()
    assert model({"name": "tiny"}) == TinyModel()
    assert model({"kind": "hf", "name": "smollm2-135m"}) == HfModel(name="smollm2-135m")
    assert model({"name": "hf:/m"}) == HfModel(name="hf:/m")
    assert isinstance(model({"name": "smollm2-135m", "vllm": {}}), VllmModel)
    assert model({"kind": "vllm", "name": "smollm2-135m"}).kind == "vllm"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kind": "tiny", "lora_rank": 4}, "model.lora_rank: not a setting of model kind 'tiny'"),
        ({"kind": "hf", "name": "x", "d_model": 8}, "not a setting of model kind 'hf'"),
        ({"kind": "hf", "name": "x", "vllm": {}}, "model.vllm: not a setting of model kind 'hf'"),
        ({"kind": "hf"}, "name"),
        ({"kind": "gpt"}, "kind"),
        ({"kind": "hf", "name": "x", "lora_rank": -1}, "lora_rank"),
        ({"kind": "hf", "name": "x", "tool_parser": "nope"}, "tool_parser"),
        ({"name": "tiny", "vllm": {}}, "vLLM serves Hugging Face checkpoints"),
        ({"name": "x", "options": {"rank": 4}}, r"model.options: unknown \['rank'\]"),
    ],
)
def test_a_setting_of_another_kind_is_an_error_naming_it(raw, message):
    with pytest.raises(ConfigError, match=message):
        model(raw)


def test_the_options_table_of_older_configs_loads_with_a_note():
    with pytest.warns(UserWarning, match=r"model.options is no more: read as \[model\] lora_rank"):
        old = load_config(None, {"model.name": "smollm2-135m", "model.options": {"lora_rank": 16}})
    assert old.model == HfModel(name="smollm2-135m", lora_rank=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the written config is the new spelling
        assert config_from_dict(tomllib.loads(to_toml(old))).model == old.model


def test_a_run_saved_before_kind_resumes_with_the_same_model():
    """A checkpoint's config as runs wrote it before (`name`, an empty `options`, `vllm` null)
    is the same model, so `check_resume` finds nothing changed."""
    saved = {"name": "tiny", "d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128}
    saved |= {"max_batch": 512, "options": {}, "vllm": None}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model(dict(saved)) == TinyModel()
        hf = {**saved, "name": "smollm2-135m", "options": {"lora_rank": 16}}
        for key in ("d_model", "n_heads", "n_layers", "d_ff"):
            del hf[key]
    with pytest.warns(UserWarning, match="model.options is no more"):
        assert model(hf) == HfModel(name="smollm2-135m", lora_rank=16)
    config = config_from_dict({})
    check_resume(msgspec.to_builtins(config) | {"model": dict(saved)}, config, "run")


def test_a_name_set_alone_picks_its_kind_over_the_files(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nkind = "tiny"\nd_model = 32\nn_heads = 2\n')
    with pytest.warns(UserWarning, match=r"model.d_model, model.n_heads: the reference decoder"):
        model = load_config(path, {"model.name": "smollm2-135m"}).model
    assert model == HfModel(name="smollm2-135m")
    with pytest.raises(ConfigError, match=r"model\.name: not a setting of model kind 'tiny'"):
        load_config(path, {"model.name": "smollm2-135m", "model.kind": "tiny"})


def test_each_default_is_written_once():
    assert TinyModel().size(TinyConfig().vocab_size) == TinyConfig()
    assert HfModel(name="x").lora() is None  # rank 0: every weight trains
    assert HfModel(name="x", lora_rank=8).lora() == LoraSettings(rank=8)


@given(
    st.one_of(
        st.builds(
            TinyModel,
            n_heads=st.sampled_from([1, 2, 4]),
            n_layers=st.integers(1, 4),
            d_ff=st.integers(1, 256),
            max_batch=st.integers(1, 1024),
        ),
        st.builds(
            HfModel,
            name=st.sampled_from(["smollm2-135m", "hf:/models/a", "hf:m.gguf"]),
            lora_rank=st.integers(0, 64),
            lora_alpha=st.floats(0.5, 64),
            gradient_checkpointing=st.booleans(),
            dtype=st.sampled_from(["float32", "bfloat16"]),
        ),
    )
)
def test_every_model_round_trips_through_the_written_config(settings):
    written = to_toml(config_from_dict({"model": msgspec.to_builtins(settings)}))
    assert config_from_dict(tomllib.loads(written)).model == settings


def test_the_old_template_spelling_is_a_hidden_alias():
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name in ("serve-policy", "gateway", "import"):
        command = commands[name]
        if name == "import":
            command = command.commands["claude-code"]
        options = {opt: param.hidden for param in command.params for opt in param.opts}
        assert options["--chat-template"] is False and options["--model"] is False
        assert options.get("--template", True) is True  # hidden where it is still taken
    both = CliRunner().invoke(
        app, ["serve-policy", "--script", "s.json", "--template", "a", "--chat-template", "b"]
    )
    assert both.exit_code == 2 and "--template is --chat-template" in both.output


@pytest.mark.hf
def test_every_command_opens_one_chat_format_for_a_model_name():
    """`gateway --model` and `import --model` render as the model's folder does, and as the
    trainer's own sampler renders."""
    from callgrove.chat import Message
    from callgrove.cli.model_options import open_chat
    from callgrove.models import chat_from_files, open_model
    from callgrove.networks.hf import checkpoint_folder, resolve_model

    messages = [Message("system", "Be brief."), Message("user", "Say hi")]
    named = open_chat("smollm2-135m", None, None).render(messages).tolist()
    folder = checkpoint_folder(resolve_model("smollm2-135m"))
    assert chat_from_files(folder, None).render(messages).tolist() == named
    opened = open_model(HfModel(name="smollm2-135m"), sample=False)
    assert opened.sampler is None and opened.learner is None
    assert opened.chat.render(messages).tolist() == named


def test_the_old_spellings_are_read_with_a_note_only_until_their_release():
    """Releasing `OLD_FORMS_END` fails here until `model_table`'s old forms and `--template`
    are removed."""
    release = tuple(int(part) for part in callgrove.__version__.split("."))
    assert release < tuple(int(part) for part in OLD_FORMS_END.split("."))
    with pytest.warns(UserWarning, match=rf"read so until callgrove {OLD_FORMS_END}"):
        config_from_dict({"model": {"options": {"lora_rank": 2}, "name": "smollm2-135m"}})
    with pytest.warns(FutureWarning, match=rf"read until callgrove {OLD_FORMS_END}"):
        assert chat_template(None, Path("t.jinja")) == Path("t.jinja")
