"""Joining a transcript with a capture of the same calls.

A transcript knows the agent structure (who started whom) but has no tokens; a capture (an
episode file written by a gateway or a rollout engine) has the exact token ids and sampling
logprobs but may not know the structure. The join matches calls by content and gives each
transcript agent the capture's calls: their tokens, logprobs and ledger `seq` are kept as
captured, so the forest is the one the tokens really make.

A transcript call matches a capture call when every piece of its answer (its text, else its
tool calls' names and string arguments, else its reasoning), whitespace collapsed, appears
(as written or JSON-escaped) in the capture call's answer (its `content.response` when recorded, else its decoded completion).
Ties go to the capture call whose prompt ends with the transcript call's last prompt message,
then to the earliest. Unmatched calls on either side are reported; unmatched capture calls
are kept, in an agent of their own, so no captured sample is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from callgrove.chat.message import normal_text, strings_in, text_forms
from callgrove.episode import Agent, Call, Episode, Gap

UNMATCHED_AGENT = "capture-unmatched"


@dataclass
class JoinResult:
    episode: Episode
    matched: list[tuple[str, str]] = field(default_factory=list)  # (transcript, capture) ids
    unmatched_transcript: list[str] = field(default_factory=list)
    unmatched_capture: list[str] = field(default_factory=list)


def answer_pieces(response: dict[str, Any]) -> list[tuple[str, ...]]:
    """What a capture's answer must contain to be this transcript answer: each piece in any
    of its forms (as written, or JSON-escaped as tool arguments usually are rendered)."""
    text = str(response.get("content") or "")
    raw = [text] if text.strip() else []
    if not raw:
        for tool in response.get("tool_calls") or []:
            function = tool.get("function") or {}
            raw += [str(function.get("name") or ""), *strings_in(function.get("arguments"))]
    if not any(r.strip() for r in raw):
        raw = [str(response.get("reasoning_content") or "")]
    return [text_forms(r) for r in raw if r.strip()]


def join_capture(
    transcript: Episode, capture: Episode, decode: Callable[[np.ndarray], str]
) -> JoinResult:
    """The transcript's agents holding the capture's calls. Consumes `capture`'s call objects."""
    captured = sorted(capture.calls(), key=lambda c: c.seq)
    answers = [_capture_answer(c, decode) for c in captured]
    free = set(range(len(captured)))
    result = JoinResult(transcript)
    agents = {
        a.id: Agent(
            a.id,
            a.name,
            a.parent,
            a.start,
            a.trainable,
            rewards=a.rewards,
            meta=a.meta,
            spawn=a.spawn,
        )
        for a in transcript.agents
    }
    for call in sorted(transcript.calls(), key=lambda c: c.seq):
        content = call.content if isinstance(call.content, dict) else {}
        pieces = answer_pieces(content.get("response") or {})
        candidates = [
            i
            for i in sorted(free)
            if pieces and all(any(f in answers[i] for f in forms) for forms in pieces)
        ]
        if not candidates:
            result.unmatched_transcript.append(call.id)
            continue
        chosen = _prefer_prompt(candidates, capture, captured, content, decode)
        free.discard(chosen)
        taken = captured[chosen]
        taken.content = {**content, **(taken.content or {}), "transcript_call": call.id}
        agents[transcript.agent_of(call).id].add(taken)
        result.matched.append((call.id, taken.id))
    leftover = [captured[i] for i in sorted(free)]
    result.unmatched_capture = [c.id for c in leftover]
    extra: list[Agent] = []
    if leftover:
        extra.append(Agent(UNMATCHED_AGENT, "unmatched", calls=leftover))
    for agent in agents.values():
        agent.calls.sort(key=lambda c: c.seq)
    all_calls = [c for a in [*agents.values(), *extra] for c in a.calls if c.kept]
    gaps = list(transcript.gaps or [])
    if leftover:
        gaps.append(
            Gap(
                kind="capture_calls_unattributed",
                agent=UNMATCHED_AGENT,
                calls=result.unmatched_capture,
                reason="no transcript call has these answers",
            )
        )
    meta = dict(transcript.meta or {})
    meta["join"] = {
        "capture": capture.id,
        "matched": len(result.matched),
        "unmatched_transcript": result.unmatched_transcript,
        "unmatched_capture": result.unmatched_capture,
    }
    result.episode = Episode(
        id=transcript.id,
        agents=[*agents.values(), *extra],
        group=capture.group,
        env=capture.env,
        task=transcript.task if transcript.task is not None else capture.task,
        run=capture.run,
        ok=capture.ok,
        errors=list(capture.errors),
        rewards=dict(capture.rewards),
        objective="rl" if all(c.logprobs is not None for c in all_calls) else "supervised",
        gaps=gaps or None,
        meta=meta,
    )
    return result


def _capture_answer(call: Call, decode: Callable[[np.ndarray], str]) -> str:
    content = call.content if isinstance(call.content, dict) else {}
    response = content.get("response")
    if isinstance(response, dict):
        return normal_text(" ".join([str(response.get("content") or ""), *strings_in(response)]))
    return normal_text(decode(call.completion_ids))


def _prefer_prompt(
    candidates: list[int],
    capture: Episode,
    captured: list[Call],
    content: dict[str, Any],
    decode: Callable[[np.ndarray], str],
) -> int:
    if len(candidates) == 1:
        return candidates[0]
    prompt = content.get("prompt") or []
    last = normal_text(str(prompt[-1].get("content") or "")) if prompt else ""
    if last:
        for i in candidates:
            tail = capture.prompt_ids(captured[i])[-4 * len(last) - 64 :]
            if last in normal_text(decode(tail)):
                return i
    return candidates[0]
