"""Transcripts to episodes: each call's prompt its base call's full sequence and the new messages.

Messages are rendered through the chat layer (`callgrove.chat`), once each, so whenever a
call's messages continue another call's messages, its prompt continues that call's tokens
exactly, and the forest built from tokens has the shape the messages have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from callgrove.chat import BuiltinFormat, ChatFormat, Message
from callgrove.episode import Agent, Call, Episode
from callgrove.formats.problems import Diagnostics, InputError, Problem
from callgrove.transcripts.accounting import collector_paused
from callgrove.transcripts.turns import Transcript, TranscriptCall


class TranscriptRenderer:
    """Renders transcripts to episodes; caches each message's tokens for the transcript."""

    def __init__(self, chat: ChatFormat | None = None):
        self.chat = chat if chat is not None else BuiltinFormat()

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
        segment = _cached(self.chat.segment)
        rendered: dict[str, Call] = {}  # call id -> its rendering
        for seq, call in enumerate(ledger_order(transcript), start=1):
            base = call.base_call()
            new = call.context.messages_since(base.answer if base else None) if call.context else []
            previous = base.response if base else None
            parts = (
                [self.chat.trailing(base.response, base.context and base.context.message)]
                if base
                else []
            )
            for message in new:
                parts.append(segment(message, previous))
                previous = message
            parts.append(self.chat.generation_prompt())
            base_call = rendered[base.id] if base else None
            result = Call(
                id=call.id,
                seq=seq,
                completion_ids=self.chat.completion(call.response, previous),
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
        meta["renderer"] = self.chat.name
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
