"""The model options `serve-policy`, `gateway` and `import` share: one spelling each, and one
function that opens the chat format they name (`callgrove.models`)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from callgrove.chat import ChatFormat, JinjaFormat
from callgrove.errors import InvalidValue
from callgrove.models.settings import OLD_FORMS_END

MODEL_NAMES = "tiny (the reference decoder), hf:PATH (a checkpoint folder or .gguf file) or a packaged name (smollm2-135m)"

ModelOption = Annotated[str | None, typer.Option("--model", help=f"The model: {MODEL_NAMES}.")]
TokenizerOption = Annotated[
    Path | None,
    typer.Option(
        "--tokenizer",
        help="Without --model: a model folder (tokenizer.json with the chat template of "
        "tokenizer_config.json or chat_template.jinja), or a tokenizer.json (then give "
        "--chat-template). Neither: built-in bytes.",
    ),
]
ChatTemplateOption = Annotated[
    Path | None,
    typer.Option(
        "--chat-template", help="A Jinja chat template, or a tokenizer_config.json holding one."
    ),
]
OldTemplateOption = Annotated[
    Path | None, typer.Option("--template", hidden=True, help="Old spelling of --chat-template.")
]
ParserOption = Annotated[
    str, typer.Option("--tool-parser", help="How tool calls are read back from completions.")
]


def chat_template(given: Path | None, old_spelling: Path | None) -> Path | None:
    """`--chat-template`, or its old spelling `--template` (an `InvalidValue` for both)."""
    if old_spelling is None:
        return given
    if given is not None:
        raise InvalidValue("--template is --chat-template: give it once")
    warnings.warn(
        f"--template is the old spelling of --chat-template, read until callgrove {OLD_FORMS_END}",
        FutureWarning,
        stacklevel=2,
    )
    return old_spelling


def open_chat(
    model: str | None,
    tokenizer: Path | None,
    template: Path | None,
    parser: str = "hermes",
    variables: dict[str, Any] | None = None,
    allow_dropped: bool = False,
) -> ChatFormat:
    """The chat format `--model` names (its own tokenizer and template; the weights are not
    loaded), or `--tokenizer`/`--chat-template`, or the built-in bytes. An `InvalidValue` for
    options that do not go together."""
    from callgrove.models import chat_from_files, model_from_name, open_model

    if model is not None and (tokenizer or template):
        raise InvalidValue("give --model or --tokenizer/--chat-template, not both")
    if model is None:
        return chat_from_files(
            tokenizer, template, variables, parser=parser, allow_dropped=allow_dropped
        )
    chat = open_model(model_from_name(model, tool_parser=parser), sample=False).chat
    if isinstance(chat, JinjaFormat):
        chat.allow_dropped = allow_dropped
    return chat
