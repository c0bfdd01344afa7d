"""A model's own chat format: its Hugging Face tokenizer and its Jinja chat template.

Built from files (`tokenizer.json` and a template, or a model folder) or from a tokenizer held
in memory (`JinjaFormat.from_tokenizer`), so the RL loop, the transcript importer, the gateway
and `serve-policy` render one model's conversations to the same tokens.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from callgrove.chat.format import ChatFormat
from callgrove.chat.message import Message, content_pieces, normal_text
from callgrove.episode import TOKEN_DTYPE
from callgrove.errors import InvalidValue
from callgrove.formats.problems import InputError, Problem

if TYPE_CHECKING:
    from tokenizers import Tokenizer


_ANCHOR = {"role": "user", "content": "."}
_PLACEHOLDER_CALL = {"id": "call", "type": "function", "function": {"name": "f", "arguments": {}}}
_CONTEXTS: dict[str | None, list[dict[str, Any]]] = {
    None: [],
    "user": [_ANCHOR],
    "system": [{"role": "system", "content": "."}],
    "assistant": [_ANCHOR, {"role": "assistant", "content": "."}],
    "tool": [
        _ANCHOR,
        {"role": "assistant", "content": "", "tool_calls": [_PLACEHOLDER_CALL]},
        {"role": "tool", "content": ".", "tool_call_id": "call"},
    ],
}
_TEMPLATE_ROLES = {"developer": "system"}
_ASSISTANT_CACHE = 65_536  # assistant renderings kept: a transcript's replies recur, a run's don't


class JinjaFormat(ChatFormat):
    """Each message rendered by the template after a fixed stand-in for the message before it.

    The text a message adds is `render(context + [message]) - render(context)`, where the
    context is a placeholder history ending in a message of the previous message's role. A
    template that rewrites earlier messages once later ones arrive (dropping old reasoning,
    say) is thus rendered as it renders each message when it is the newest: histories are never
    rewritten, which is what makes every prompt extend its parent's tokens.
    """

    name = "jinja"

    def __init__(
        self,
        tokenizer: Tokenizer | str | os.PathLike[str],
        template: ChatTemplate | str | os.PathLike[str],
        variables: dict[str, Any] | None = None,
        *,
        allow_dropped: bool = False,
        parser: str = "hermes",
        stop_token_ids: Sequence[int] = (),
    ):
        """`tokenizer`: a `tokenizers.Tokenizer` or its `tokenizer.json`; `template`: its text
        (`ChatTemplate`), a Jinja file, or a `tokenizer_config.json` holding `chat_template`.

        Content a template leaves out of a message's tokens is an `InputError`; with
        `allow_dropped` it is counted in `dropped` instead.
        """
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        super().__init__(parser, stop_token_ids)
        self.tokenizer = (
            tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)
        )
        self._special_ids = frozenset(
            index
            for index, token in self.tokenizer.get_added_tokens_decoder().items()
            if token.special
        )
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_template_error
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        source = template if isinstance(template, ChatTemplate) else _template_file(template)
        self.template_path = source.origin
        self._source = source
        self.template = _compiled(environment, source)
        self.variables = dict(variables or {})
        self.allow_dropped = allow_dropped
        self.dropped: Counter[str] = Counter()  # "ROLE message: WHAT" -> messages
        self.rewrites: set[tuple[str | None, str]] = (
            set()
        )  # (previous role, role) not prefix-stable
        self._generation_text = self._delta(_CONTEXTS["user"], None, generation=True)
        self._generation = self._encode(self._generation_text)
        self._assistant: dict[tuple[Any, str | None], tuple[np.ndarray, np.ndarray]] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuilt from what made it (a compiled Jinja template does not pickle), so a format
        can go to a Ray actor; its counts of dropped content start afresh there."""
        return (
            _rebuilt,
            (
                self.tokenizer,
                self._source,
                self.variables,
                self.allow_dropped,
                self.parser,
                self.stop_token_ids,
            ),
        )

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, parser: str = "hermes") -> JinjaFormat:
        """A Hugging Face tokenizer held in memory (a fast one): its `tokenizers` backend, its
        chat template, its special tokens as template variables and its end-of-sequence token
        among the stops."""
        template = getattr(tokenizer, "chat_template", None)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if not isinstance(template, str) or not template:
            raise InvalidValue("the model's tokenizer has no chat template")
        if backend is None:
            raise InvalidValue("the model's tokenizer is not a fast (tokenizers-backed) one")
        specials = {
            k: v
            for k, v in getattr(tokenizer, "special_tokens_map", {}).items()
            if isinstance(v, str)
        }
        chat = cls(
            backend, ChatTemplate(template, "the model's chat template"), specials, parser=parser
        )
        eos = getattr(tokenizer, "eos_token_id", None)
        if isinstance(eos, int) and eos >= 0 and eos not in chat.stop_token_ids:
            chat._stops = (*chat.stop_token_ids, eos)
        return chat

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    def encode(self, text: str) -> np.ndarray:
        return self._encode(text)

    def _render(self, messages: list[dict[str, Any]], generation: bool = False) -> str:
        try:
            return self.template.render(
                messages=messages, add_generation_prompt=generation, **self.variables
            )
        except Exception as error:  # template errors of any kind, with the template named
            raise InputError(
                Problem(f"chat template failed: {error}", file=self.template_path, kind="template")
            ) from None

    def _delta(
        self, context: list[dict[str, Any]], message: Message | None, generation: bool = False
    ) -> str:
        before = self._render(context)
        after = self._render(
            context + ([_template_message(message)] if message is not None else []), generation
        )
        if after.startswith(before):
            return after[len(before) :]
        common = _common_prefix(before, after)
        self.rewrites.add(
            (context[-1]["role"] if context else None, message.role if message else "")
        )
        return after[len(common) :]

    def _encode(self, text: str) -> np.ndarray:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return np.asarray(ids, dtype=TOKEN_DTYPE)

    def _context(self, previous: Message | None) -> list[dict[str, Any]]:
        role = None if previous is None else _TEMPLATE_ROLES.get(previous.role, previous.role)
        return _CONTEXTS.get(role, _CONTEXTS["user"])

    @classmethod
    def from_folder(
        cls,
        folder: str | os.PathLike[str],
        variables: dict[str, Any] | None = None,
        *,
        allow_dropped: bool = False,
        parser: str = "hermes",
    ) -> JinjaFormat:
        """A model folder: `tokenizer.json`, and the chat template from `chat_template.jinja`
        or else `tokenizer_config.json` (whose special tokens become template variables)."""
        root = Path(folder)
        config_path = root / "tokenizer_config.json"
        config = _json_object(config_path) if config_path.is_file() else {}
        template = root / "chat_template.jinja"
        if not template.is_file():
            if "chat_template" not in config:
                raise InputError(
                    Problem(
                        "no chat template: neither chat_template.jinja nor a chat_template in "
                        "tokenizer_config.json",
                        file=str(root),
                        kind="template",
                    )
                )
            template = config_path
        if not (root / "tokenizer.json").is_file():
            raise InputError(Problem("no tokenizer.json in the folder", file=str(root)))
        found = {k: _token_text(v) for k, v in config.items() if k.endswith("_token")}
        found = {k: v for k, v in found.items() if v is not None}
        return cls(
            root / "tokenizer.json",
            template,
            {**found, **(variables or {})},
            allow_dropped=allow_dropped,
            parser=parser,
        )

    def segment(self, message: Message, previous: Message | None) -> np.ndarray:
        if message.role == "assistant":
            completion, trailing = self._assistant_parts(message, previous)
            return np.concatenate([self._generation, completion, trailing])
        tokens = self._encode(self._delta(self._context(previous), message))
        self._check_content(message, tokens)
        return tokens

    def _check_content(self, message: Message, tokens: np.ndarray) -> None:
        """Every piece of the message's content is in its tokens, else an error (or counted)."""
        rendered = normal_text(self.decode(tokens))
        for what, forms in content_pieces(message):
            if any(form in rendered for form in forms):
                continue
            if self.allow_dropped:
                self.dropped[f"{message.role} message: {what}"] += 1
                continue
            excerpt = forms[0] if len(forms[0]) <= 60 else forms[0][:57] + "..."
            raise InputError(
                Problem(
                    f"chat template drops the {what} of {_article(message.role)} {message.role} "
                    "message "
                    f"({excerpt!r} is not in its tokens); use a template that renders it, or "
                    "allow dropped content (--allow-dropped-content) to import with a warning",
                    file=self.template_path,
                    kind="template",
                )
            )

    def generation_prompt(self) -> np.ndarray:
        return self._generation

    def completion(self, message: Message, previous: Message | None) -> np.ndarray:
        return self._assistant_parts(message, previous)[0]

    def trailing(self, message: Message, previous: Message | None) -> np.ndarray:
        return self._assistant_parts(message, previous)[1]

    def _assistant_parts(
        self, message: Message, previous: Message | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Completion up to and including the last special token (end of turn); the rest trails."""
        key = (message.key(), None if previous is None else previous.role)
        hit = self._assistant.get(key)
        if hit is None:
            text = self._delta(self._context(previous), message)
            if text.startswith(self._generation_text):
                text = text[len(self._generation_text) :]
            else:
                self.rewrites.add(("generation prompt", "assistant"))
            body = self._encode(text)
            if not body.size:
                raise InputError(
                    Problem(
                        "chat template renders nothing for an assistant turn: its calls would "
                        "have no completion",
                        file=self.template_path,
                        kind="template",
                    )
                )
            self._check_content(message, body)
            special = np.flatnonzero(np.isin(body, list(self.special_ids)))
            cut = int(special[-1]) + 1 if special.size else len(body)
            if len(self._assistant) >= _ASSISTANT_CACHE:  # an RL run renders every reply once
                self._assistant.clear()
            hit = self._assistant[key] = (body[:cut], body[cut:])
        return hit

    def decode(self, ids: np.ndarray) -> str:
        return self.tokenizer.decode(np.asarray(ids).tolist(), skip_special_tokens=False)


def _rebuilt(tokenizer, source, variables, allow_dropped, parser, stops) -> JinjaFormat:
    return JinjaFormat(
        tokenizer,
        source,
        variables,
        allow_dropped=allow_dropped,
        parser=parser,
        stop_token_ids=stops,
    )


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A chat template's Jinja text, and where it came from (named in its errors)."""

    text: str
    origin: str


def _template_file(path: str | os.PathLike[str]) -> ChatTemplate:
    """A chat template from a Jinja file, or from the `chat_template` of a tokenizer config
    (a string, or a list of named templates of which `default` is used)."""
    if str(path).endswith(".json"):
        value = _json_object(Path(path)).get("chat_template")
        if isinstance(value, list):
            named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
            value = named.get("default")
        if not isinstance(value, str):
            raise InputError(
                Problem(
                    "no usable chat_template (a string, or a list with a `default`)",
                    file=str(path),
                    kind="template",
                )
            )
        return ChatTemplate(value, str(path))
    try:
        return ChatTemplate(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(
            Problem(f"cannot read the chat template: {error}", file=str(path))
        ) from None


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """The `tokenizers.Tokenizer` of a `tokenizer.json`; an `InputError` naming the file for
    one that cannot be read or is not a tokenizer.json (`tokenizers` raises a bare `Exception`
    for an empty file, another JSON document or binary bytes alike)."""
    from tokenizers import Tokenizer

    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise InputError(Problem(f"cannot read the tokenizer: {error}", file=str(path))) from None
    try:
        return Tokenizer.from_str(data.decode("utf-8"))
    except Exception as error:  # binary bytes (UnicodeDecodeError), or what `tokenizers` says
        raise InputError(
            Problem(
                f"not a tokenizer.json (a Hugging Face `tokenizers` file): {error}",
                file=str(path),
            )
        ) from None


def _compiled(environment: Any, source: ChatTemplate) -> Any:
    """The template compiled; an `InputError` naming its file when it is not Jinja."""
    from jinja2 import TemplateSyntaxError

    try:
        return environment.from_string(source.text)
    except TemplateSyntaxError as error:
        raise InputError(
            Problem(
                f"not a Jinja chat template: line {error.lineno}: {error.message}",
                file=source.origin,
                kind="template",
            )
        ) from None


def _json_object(path: Path) -> dict[str, Any]:
    try:
        value = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as error:
        raise InputError(Problem(f"cannot read: {error}", file=str(path))) from None
    if not isinstance(value, dict):
        raise InputError(Problem("expected a JSON object", file=str(path)))
    return value


def _token_text(value: Any) -> str | None:
    """A special token of a tokenizer config: a string, or an object with its `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _article(word: str) -> str:
    return "an" if word[:1] in ("a", "e", "i", "o", "u") else "a"


def _common_prefix(a: str, b: str) -> str:
    n = 0
    limit = min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return a[:n]


def _template_message(message: Message) -> dict[str, Any]:
    out = message.as_dict()
    out["role"] = _TEMPLATE_ROLES.get(message.role, message.role)
    return out


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise_template_error(message: str) -> None:
    raise InvalidValue(message)
