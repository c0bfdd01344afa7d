"""Rendering transcripts to tokens, incrementally and prefix-stably.

Every message is rendered once, to the tokens it has in any history that holds it, and a
call's prompt is its base call's full sequence followed by the tokens of the messages added
since, then the opening of an assistant turn. So whenever a call's messages continue another
call's messages, its prompt continues that call's tokens exactly, and the forest built from
tokens has the shape the messages have. An assistant message's tokens are always
`generation_prompt + completion + trailing`: what the model sampled sits in the middle.

Two chat formats: `BuiltinFormat` (a byte-level tokenizer and a plain turn template, nothing to
download) and `JinjaFormat` (a Hugging Face `tokenizer.json` and a Jinja chat template). See
`docs/transcripts.md` for the exact text each message kind renders to.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import orjson

from callgrove.episode import TOKEN_DTYPE, Agent, Call, Episode
from callgrove.formats.problems import Diagnostics, InputError, Problem
from callgrove.transcripts.accounting import collector_paused
from callgrove.transcripts.model import (
    Message,
    Transcript,
    TranscriptCall,
    content_pieces,
    normal_text,
)

EMPTY = np.zeros(0, dtype=TOKEN_DTYPE)


class ChatFormat(Protocol):
    """How messages become tokens; assistant segments are `generation + completion + trailing`."""

    name: str

    def segment(self, message: Message, previous: Message | None) -> np.ndarray: ...

    def generation_prompt(self) -> np.ndarray: ...

    def completion(self, message: Message, previous: Message | None) -> np.ndarray: ...

    def trailing(self, message: Message, previous: Message | None) -> np.ndarray: ...

    def decode(self, ids: np.ndarray) -> str: ...


# ---------------------------------------------------------------------------------------------
# Built-in: bytes plus two turn markers


class ByteTokenizer:
    """One token per UTF-8 byte (ids 0-255) and two special tokens that frame turns."""

    START = 256
    END = 257
    vocab_size = 258
    specials: ClassVar[dict[int, str]] = {START: "<|start|>", END: "<|end|>"}

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(TOKEN_DTYPE)

    def decode(self, ids: np.ndarray) -> str:
        ids = np.asarray(ids)
        parts: list[str] = []
        start = 0
        for index in np.flatnonzero(ids > 255):  # only the few turn markers are visited
            parts.append(ids[start:index].astype(np.uint8).tobytes().decode("utf-8", "replace"))
            parts.append(self.specials.get(int(ids[index]), f"<|{int(ids[index])}|>"))
            start = index + 1
        parts.append(ids[start:].astype(np.uint8).tobytes().decode("utf-8", "replace"))
        return "".join(parts)


def message_body(message: Message) -> str:
    """The text inside a turn of the built-in format."""
    if message.role == "tool":
        error = ' error="true"' if message.is_error else ""
        return f'<tool_result id="{message.tool_call_id}"{error}>\n{message.text}\n</tool_result>'
    parts: list[str] = []
    if message.thinking:
        parts.append(f"<think>\n{message.thinking}\n</think>")
    if message.text:
        parts.append(message.text)
    for call in message.tool_calls:
        payload = {"id": call.id, "name": call.name, "arguments": call.arguments}
        parts.append(f"<tool_call>\n{orjson.dumps(payload).decode()}\n</tool_call>")
    return "\n".join(parts)


class BuiltinFormat:
    """`<|start|>ROLE\\nBODY<|end|>` per message over the byte tokenizer."""

    name = "builtin"

    def __init__(self) -> None:
        self.tokenizer = ByteTokenizer()
        self._start = np.array([ByteTokenizer.START], dtype=TOKEN_DTYPE)
        self._end = np.array([ByteTokenizer.END], dtype=TOKEN_DTYPE)
        self._generation = np.concatenate([self._start, self.tokenizer.encode("assistant\n")])

    def segment(self, message: Message, previous: Message | None) -> np.ndarray:
        if message.role == "assistant":
            return np.concatenate([self._generation, self.completion(message, previous)])
        head = self.tokenizer.encode(f"{message.role}\n{message_body(message)}")
        return np.concatenate([self._start, head, self._end])

    def generation_prompt(self) -> np.ndarray:
        return self._generation

    def completion(self, message: Message, previous: Message | None) -> np.ndarray:
        return np.concatenate([self.tokenizer.encode(message_body(message)), self._end])

    def trailing(self, message: Message, previous: Message | None) -> np.ndarray:
        return EMPTY

    def decode(self, ids: np.ndarray) -> str:
        return self.tokenizer.decode(ids)


# ---------------------------------------------------------------------------------------------
# Hugging Face tokenizer.json + Jinja chat template

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


class JinjaFormat:
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
        tokenizer_path: str | os.PathLike[str],
        template_path: str | os.PathLike[str],
        variables: dict[str, Any] | None = None,
        *,
        allow_dropped: bool = False,
    ):
        """`template_path`: a Jinja file, or a `tokenizer_config.json` holding `chat_template`.

        Content a template leaves out of a message's tokens is an `InputError`; with
        `allow_dropped` it is counted in `dropped` instead.
        """
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.special_ids = {
            index
            for index, token in self.tokenizer.get_added_tokens_decoder().items()
            if token.special
        }
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_template_error
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.template_path = str(template_path)
        self.template = environment.from_string(_template_text(template_path))
        self.variables = dict(variables or {})
        self.allow_dropped = allow_dropped
        self.dropped: Counter[str] = Counter()  # "ROLE message: WHAT" -> messages
        self.rewrites: set[tuple[str | None, str]] = (
            set()
        )  # (previous role, role) not prefix-stable
        self._generation_text = self._delta(_CONTEXTS["user"], None, generation=True)
        self._generation = self._encode(self._generation_text)
        self._assistant: dict[tuple[Any, str | None], tuple[np.ndarray, np.ndarray]] = {}

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
            hit = self._assistant[key] = (body[:cut], body[cut:])
        return hit

    def decode(self, ids: np.ndarray) -> str:
        return self.tokenizer.decode(np.asarray(ids).tolist(), skip_special_tokens=False)


def _template_text(path: str | os.PathLike[str]) -> str:
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
        return value
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(
            Problem(f"cannot read the chat template: {error}", file=str(path))
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
    raise ValueError(message)


# ---------------------------------------------------------------------------------------------
# Transcript -> Episode


class TranscriptRenderer:
    """Renders transcripts to episodes; caches each message's tokens for the transcript."""

    def __init__(self, chat_format: ChatFormat | None = None):
        self.format = chat_format if chat_format is not None else BuiltinFormat()

    def episode(self, transcript: Transcript) -> Episode:
        with collector_paused():
            return self._episode(transcript)

    def episodes(self, transcripts: list[Transcript], diagnostics: Diagnostics) -> list[Episode]:
        """Each transcript rendered; one that cannot be is an error in `diagnostics` naming
        its episode, and the rest are still rendered."""
        episodes = []
        for transcript in transcripts:
            try:
                episodes.append(self.episode(transcript))
            except InputError as error:
                diagnostics.add(error.located(episode=transcript.id).problem)
        return episodes

    def _episode(self, transcript: Transcript) -> Episode:
        agents: dict[str, Agent] = {}  # agent id -> its episode agent
        for a in transcript.agents:
            if a.id in agents:
                raise InputError(Problem(f"agent id {a.id!r} appears twice in the transcript"))
            agents[a.id] = Agent(
                id=a.id,
                name=a.name,
                parent=a.parent,
                start=a.start,
                meta=a.meta or None,
                spawn=a.spawn,
            )
        segment = _cached(self.format.segment)
        rendered: dict[str, Call] = {}  # call id -> its rendering
        for seq, call in enumerate(ledger_order(transcript), start=1):
            base = call.base_call()
            new = call.context.messages_since(base.answer if base else None) if call.context else []
            previous = base.response if base else None
            parts = (
                [self.format.trailing(base.response, base.context and base.context.message)]
                if base
                else []
            )
            for message in new:
                parts.append(segment(message, previous))
                previous = message
            parts.append(self.format.generation_prompt())
            base_call = rendered[base.id] if base else None
            result = Call(
                id=call.id,
                seq=seq,
                completion_ids=self.format.completion(call.response, previous),
                prompt_suffix=np.concatenate(parts),
                prompt_from=base_call.id if base_call else None,
                prompt_from_len=base_call.full_len if base_call else 0,
                logprobs=None,
                purpose=call.purpose,
                kept=call.kept,
                content={
                    **call.content.as_dict(),
                    "prompt": [m.as_dict() for m in new],
                    "response": call.response.as_dict(),
                },
            )
            rendered[call.id] = result
            agents[call.agent.id].add(result)
        meta = dict(transcript.meta)
        meta["renderer"] = self.format.name
        return Episode(
            id=transcript.id,
            agents=list(agents.values()),
            task=transcript.task,
            objective="supervised",
            gaps=transcript.gaps or None,
            meta=meta,
        )


def _cached(
    function: Callable[[Message, Message | None], np.ndarray],
) -> Callable[[Message, Message | None], np.ndarray]:
    """Memoise a segment function on (message content, previous role): histories share
    messages, and a message's tokens depend on nothing else."""
    cache: dict[tuple[Any, str | None], np.ndarray] = {}

    def cached(message: Message, previous: Message | None) -> np.ndarray:
        key = (message.key(), None if previous is None else previous.role)
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = function(message, previous)
        return hit

    return cached


def ledger_order(transcript: Transcript) -> list[TranscriptCall]:
    """Calls by their ledger key, each after the call its history continues (its base).
    Call ids are unique in a transcript; one that repeats is an error naming it."""
    ordered: list[TranscriptCall] = []
    placed: set[str] = set()
    seen_ids: set[str] = set()
    for call in sorted(transcript.calls(), key=lambda c: c.order):
        if call.id in seen_ids:
            raise InputError(
                Problem(f"call id {call.id!r} appears twice in the transcript", call=call.id)
            )
        seen_ids.add(call.id)
        chain: list[TranscriptCall] = []
        current: TranscriptCall | None = call
        while current is not None and current.id not in placed:
            chain.append(current)
            current = current.base_call()
        for pending in reversed(chain):
            placed.add(pending.id)
            ordered.append(pending)
    return ordered
