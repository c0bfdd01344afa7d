"""Other stacks' row builders, fed an episode through the form each stack reads, giving the rows
its trainer would be fed: what `callgrove audit` referees on the hard cases
(benchmarks/audit_stacks.py, docs/audit.md).

NeMo Gym's builders run as installed (`nemo-gym` 0.7.0, the `interop` extra): the episode goes
in as Gym's own token capture records, written with Gym's `TokenEntry` and `stamp_lineage`. The
stacks whose code cannot run here (not on PyPI, or not on CPU Python 3.11) are written out from
their source at a pinned commit, each step naming its file and line.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from callgrove.audit.referee import TrainedRow
from callgrove.episode import Call, Episode
from callgrove.forest import TokenPool, prefix_hashes
from callgrove.rows import build_rows

RowBuilder = Callable[[Episode], list[TrainedRow]]


@dataclass(frozen=True)
class Stack:
    """A stack's row builder, its name (as tables show it) and where its code comes from;
    `STACKS` holds it by a key a command line takes."""

    name: str
    source: str
    rows: RowBuilder


def _row(tokens: np.ndarray, loss: np.ndarray, where: str) -> TrainedRow:
    return TrainedRow(np.asarray(tokens, np.int64), np.asarray(loss, bool), None, where)


def callgrove_rows(episode: Episode) -> list[TrainedRow]:
    """callgrove's own rows (`callgrove.rows`): one per leaf, each call trained in one."""
    result = build_rows(episode)
    return [
        _row(result.token_ids(row), result.loss_mask(row), f"{episode.id} row {number}")
        for number, row in enumerate(result.rows)
    ]


# -- NeMo Gym 0.7.0, as installed ---------------------------------------------------------------


def leader_answer(episode: Episode) -> Call:
    """The call whose answer is the episode's: the last kept call of a root agent (the leader,
    or the session it was resumed as)."""
    roots = [c for a in episode.agents if a.start == "root" for c in a.calls if c.kept]
    return max(roots, key=lambda call: call.seq)


def gym_entries(episode: Episode) -> list:
    """Every call (Gym records every call it serves, kept or not) as Gym's `TokenEntry`, with
    the lineage its request-time resolver records (token_id_capture/sink.py:184): a prompt
    resending the whole sequence of an earlier call is `resolved` to it; a fork's first call
    that resends none (its history rewritten) is `unresolved`; any other is a `root` (a fresh
    agent, a turn from a summary)."""
    from nemo_gym.token_id_capture import ParentResolutionStatus, TokenEntry, stamp_lineage

    entries = []
    parents = resent_calls(episode)
    for call in episode.ledger():
        completion = call.completion_ids.tolist()
        logprobs = [0.0] * len(completion) if call.logprobs is None else call.logprobs.tolist()
        entry = TokenEntry(
            rollout_id=episode.id,
            model_call_id=call.id,
            prompt_token_ids=episode.prompt_ids(call).tolist(),
            generation_token_ids=completion,
            generation_log_probs=logprobs,
            response_id=f"resp-{call.id}",
            created_at=float(call.seq),
        )
        parent = parents[call.id]
        if parent is not None:
            stamp_lineage(entry, parent.id, parent_resolution=ParentResolutionStatus.RESOLVED)
        elif _rewritten_history(episode, call):
            stamp_lineage(entry, None, parent_resolution=ParentResolutionStatus.UNRESOLVED)
        else:
            stamp_lineage(entry, None, parent_resolution=ParentResolutionStatus.ROOT)
        entries.append(entry)
    return entries


def resent_calls(episode: Episode) -> dict[str, Call | None]:
    """For each call, the earlier call (kept or not) with the longest full sequence its prompt
    starts with, or None: found by prefix hash over the pool, confirmed exactly."""
    ledger = episode.ledger()
    pool = TokenPool.build(ledger)
    ending: dict[int, list[Call]] = {}
    for index, call in enumerate(ledger):
        ending.setdefault(pool.full_hash(index), []).append(call)
    ends = np.fromiter(ending, np.uint32, len(ending))
    found: dict[str, Call | None] = {}
    for call in ledger:
        prompt = episode.prompt_ids(call)
        found[call.id] = None
        hashes = prefix_hashes(prompt)
        for position in np.flatnonzero(np.isin(hashes, ends))[::-1].tolist():
            resent = [
                other
                for other in ending[int(hashes[position])]
                if other.seq < call.seq
                and other.full_len == position + 1
                and np.array_equal(episode.full_ids(other), prompt[: position + 1])
            ]
            if resent:
                found[call.id] = resent[0]
                break
    return found


def _rewritten_history(episode: Episode, call: Call) -> bool:
    """A fork's first call that resends no earlier call whole: a history rewritten."""
    agent = episode.agent_of(call)
    return agent.start == "fork" and agent.calls[0] is call


def gym_chains(episode: Episode) -> list[TrainedRow]:
    """Every chain NeMo Gym's `prefix_merging` builder builds (token_id_capture/builder.py:278,
    one per leaf of its call tree, every generation on a chain loss-on): what a trainer taking
    all of them would be fed. Gym itself delivers only the main one (`gym_delivered`)."""
    from nemo_gym.token_id_capture import run_builder

    built = run_builder(gym_entries(episode), "prefix_merging", leader_answer(episode).id)
    rows = []
    for chain in built.chains:
        tokens, loss = list(chain.root_prompt), [False] * len(chain.root_prompt)
        for link in chain.links:
            generated = link.entry.generation_token_ids
            tokens += [*link.interstitial, *generated]
            loss += [False] * len(link.interstitial) + [True] * len(generated)
        rows.append(_row(tokens, loss, f"{episode.id} chain {chain.chain_id}"))
    return rows


def gym_delivered(episode: Episode) -> list[TrainedRow]:
    """The row NeMo Gym's consumer delivers for the rollout (token_id_capture/consumer.py:206,
    `trajectories_for_rollout`, the leader's last call named as the answer): the main chain's
    generations loss-on, nothing when it masks the rollout (`mask_sample`)."""
    from nemo_gym.token_id_capture import TokenCaptureStore, trajectories_for_rollout

    logging.getLogger("nemo_gym").setLevel(logging.ERROR)  # a warning per masked rollout
    with tempfile.TemporaryDirectory(prefix="callgrove-gym-") as folder:
        store = TokenCaptureStore(Path(folder))
        for entry in gym_entries(episode):
            store.append(entry)
        built = trajectories_for_rollout(
            episode.id, [Path(folder)], explicit_terminal_call_id=leader_answer(episode).id
        )
    response = built.get("rebuilt_response")
    if response is None:
        return []
    items = [item for item in response["output"] if item.get("generation_token_ids")]
    last = items[-1]
    tokens = [*last["prompt_token_ids"], *last["generation_token_ids"]]
    loss = np.zeros(len(tokens), bool)
    if not built.get("mask_sample"):
        for item in items:
            start = len(item["prompt_token_ids"])
            loss[start : start + len(item["generation_token_ids"])] = True
    return [_row(tokens, loss, f"{episode.id} delivered")]


# -- prime-rl: verifiers 0.4.0's branches (installed), prime-rl's rule written out ----------------

PRIME_RL_COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"


def _text(tokens: np.ndarray) -> str:
    """A message's content standing for its tokens: equal tokens, equal message."""
    return " ".join(map(str, tokens.tolist()))


def _messages(
    episode: Episode,
    call: Call,
    parents: dict[str, Call | None],
    memo: dict[str, tuple[list, list]],
) -> tuple[list, list]:
    """The call's prompt as a harness's messages with their token spans: the messages of the
    call its prompt resends whole, that call's answer, then one message of what follows; a
    prompt resending no call whole is one message."""
    from verifiers.v1.types import AssistantMessage, UserMessage

    if call.id in memo:
        return memo[call.id]
    prompt = episode.prompt_ids(call)
    parent = parents[call.id]
    if parent is None:
        messages, spans = [UserMessage(content=_text(prompt))], [(0, len(prompt))]
    else:
        before, before_spans = _messages(episode, parent, parents, memo)
        answer = AssistantMessage(content=_text(parent.completion_ids))
        messages = [*before, answer, UserMessage(content=_text(prompt[parent.full_len :]))]
        spans = [
            *before_spans,
            (parent.prompt_len, parent.full_len),
            (parent.full_len, len(prompt)),
        ]
    memo[call.id] = messages, spans
    return messages, spans


def verifiers_trace(episode: Episode):
    """The episode's calls committed, in the order they were made, to one verifiers 0.4.0
    trace by verifiers' own graph builder (`graph.prepare_turn(...).commit(response)`, what its
    interception server runs per call): a message node is reused where the message and its
    tokens are the same, each answer is a new sampled node. A compaction is linked to the
    history it summarises (`compaction_attempt`), and the turn starting from its summary to it
    (`compaction`), as a harness's metadata links them."""
    from verifiers.v1 import Trace, graph
    from verifiers.v1.semantic import ParentLink
    from verifiers.v1.types import AssistantMessage, Response, TurnTokens

    trace = Trace.model_construct(nodes=[], calls=[], mm_token_type_id_map={})
    memo: dict[str, tuple[list, list]] = {}
    node_of: dict[str, int] = {}
    parents = resent_calls(episode)
    for call in episode.ledger():
        messages, spans = _messages(episode, call, parents, memo)
        completion = call.completion_ids.tolist()
        logprobs = [0.0] * len(completion) if call.logprobs is None else call.logprobs.tolist()
        tokens = TurnTokens(
            prompt_ids=episode.prompt_ids(call).tolist(),
            completion_ids=completion,
            completion_logprobs=logprobs,
            message_spans=spans,
        )
        response = Response(
            id=call.id,
            created=call.seq,
            model="policy",
            message=AssistantMessage(content=_text(call.completion_ids)),
            finish_reason="stop",
            tokens=tokens,
        )
        node_of[call.id] = graph.prepare_turn(trace, messages).commit(response)
        links = trace.nodes[node_of[call.id]].semantic_parents
        parent = parents[call.id]
        if call.purpose == "compaction" and parent is not None:
            links.append(ParentLink(node=node_of[parent.id], type="compaction_attempt"))
        summary = None if parent is not None else _summary_read(episode, call)
        if summary is not None:
            links.append(ParentLink(node=node_of[summary.id], type="compaction"))
    return trace


def _summary_read(episode: Episode, call: Call) -> Call | None:
    """The compaction whose summary this call's prompt, a new history, holds."""
    prompt = episode.prompt_ids(call)
    for other in episode.ledger():
        summary = other.completion_ids
        if (
            other.seq < call.seq
            and other.purpose == "compaction"
            and other.kept
            and len(summary) <= len(prompt)
            and (np.lib.stride_tricks.sliding_window_view(prompt, len(summary)) == summary)
            .all(axis=1)
            .any()
        ):
            return other
    return None


def prime_rl_rows(
    episode: Episode, *, first_branch_owns: bool = True, skip_untrainable: bool = False
) -> list[TrainedRow]:
    """prime-rl's samples of the episode (src/prime_rl/orchestrator/trajectories.py at
    `PRIME_RL_COMMIT`, `iter_trainable_branches`, lines 69-89): one per branch of the trace
    verifiers builds (`verifiers_trace`), in verifiers' order (by leaf), its sampled nodes' completion tokens loss-on, a sampled node another
    branch already trained masked (`first_branch_owns`, #2975; before it, every branch trained
    every sampled node it holds), and branches verifiers marks untrainable (rejected compaction
    attempts) skipped first (`skip_untrainable`, #3478, merged after that commit)."""
    rows = []
    trained: set[int] = set()
    for branch in verifiers_trace(episode).branches:
        if skip_untrainable and not branch.trainable:
            continue
        mask: list[bool] = []
        for node in branch.nodes:
            sampled = node.sampled and any(node.mask)
            if sampled and first_branch_owns and id(node) in trained:
                mask += [False] * len(node.mask)
                continue
            if sampled:
                trained.add(id(node))
            mask += node.mask
        if any(mask):
            rows.append(_row(branch.token_ids, mask, f"{episode.id} branch {branch.index}"))
    return rows


# -- one running history: verl's gateway (#6299), rLLM's lineages (#774) ------------------------


@dataclass
class _Segment:
    """A row being built: the last call's full sequence and the completion spans trained."""

    tokens: np.ndarray
    loss: list[tuple[int, int]]

    def row(self, where: str) -> TrainedRow:
        mask = np.zeros(len(self.tokens), bool)
        for start, stop in self.loss:
            mask[start:stop] = True
        return _row(self.tokens, mask, where)


def running_rows(episode: Episode, calls: list[Call], where: str) -> list[TrainedRow]:
    """Calls in order, each extending the row being built when its prompt starts with that
    row's tokens (the rest of its prompt loss-off, its completion loss-on), else closing it and
    opening a new one with its whole prompt loss-off; a closed row is never reopened."""
    rows, segment = [], None
    for call in calls:
        prompt, full = episode.prompt_ids(call), episode.full_ids(call)
        extends = (
            segment is not None
            and np.array_equal(prompt[: len(segment.tokens)], segment.tokens)
            and len(prompt) >= len(segment.tokens)
        )
        if not extends:
            if segment is not None:
                rows.append(segment.row(f"{where} row {len(rows)}"))
            segment = _Segment(full, [])
        segment.tokens = full
        segment.loss.append((len(prompt), len(full)))
    if segment is not None:
        rows.append(segment.row(f"{where} row {len(rows)}"))
    return rows


def session_rows(episode: Episode) -> list[TrainedRow]:
    """One history per session (verl PR #6299 at f6bb7a33, unmerged, `verl/agent/gateway/
    gateway.py:522-648`, `_handle_chat_completions`: a call extends the session's buffer when
    the previous call's messages and reply are a prefix of its own (190-203), else the buffer
    becomes a row; rLLM's default, one lineage per session, is the same rule): every call the
    gateway served, in the order it served them."""
    return running_rows(episode, episode.ledger(), f"{episode.id} session")


def rllm_lineage_rows(episode: Episode) -> list[TrainedRow]:
    """rLLM's rows with lineages (#774 at 737e721d, branch terminal-rl, `cumulative_token_mode`):
    the gateway gives a call the lineage whose last request its own request extends, the
    longest (rllm-model-gateway token_accumulator.py:211-229, `SessionSlots.select` 466-484),
    or a new one; a request equal to a lineage's last one replays it and overwrites that
    call's trace (proxy.py:477-503); the trainer merges each lineage's calls by a running token
    prefix (rllm/trainer/verl/transform.py:394-426, `_merge_lineage`)."""
    lineages: list[list[Call]] = []
    for call in episode.ledger():
        prompt = episode.prompt_ids(call)
        same = [calls for calls in lineages if _same(episode.prompt_ids(calls[-1]), prompt)]
        if same:
            same[0][-1] = call  # replayed: the earlier call's trace is overwritten
            continue
        extended = [
            calls
            for calls in lineages
            if len(episode.prompt_ids(calls[-1])) < len(prompt)
            and _same(episode.prompt_ids(calls[-1]), prompt[: calls[-1].prompt_len])
        ]
        if extended:
            max(extended, key=lambda calls: calls[-1].prompt_len).append(call)
        else:
            lineages.append([call])
    rows = []
    for number, calls in enumerate(lineages):
        rows += running_rows(episode, calls, f"{episode.id} lineage {number}")
    return rows


def _same(left: np.ndarray, right: np.ndarray) -> bool:
    return len(left) == len(right) and np.array_equal(left, right)


STACKS: dict[str, Stack] = {
    "callgrove": Stack("callgrove", "callgrove.rows", callgrove_rows),
    "prime-rl": Stack(
        "prime-rl",
        f"trajectories.py:69-89 at {PRIME_RL_COMMIT[:7]}, on verifiers 0.4.0's branches",
        prime_rl_rows,
    ),
    "prime-rl-3478": Stack(
        "prime-rl + #3478",
        "the same, untrainable branches skipped first (#3478)",
        partial(prime_rl_rows, skip_untrainable=True),
    ),
    "prime-rl-before-2975": Stack(
        "prime-rl before #2975",
        "the same, without first-branch ownership (before b453f40d8)",
        partial(prime_rl_rows, first_branch_owns=False),
    ),
    "nemo-gym": Stack("NeMo Gym (delivered)", "nemo-gym 0.7.0, installed", gym_delivered),
    "nemo-gym-chains": Stack("NeMo Gym (every chain)", "nemo-gym 0.7.0, installed", gym_chains),
    "rllm": Stack(
        "rLLM lineages", "#774 at 737e721d (terminal-rl), written out", rllm_lineage_rows
    ),
    "session": Stack(
        "one history per session",
        "verl #6299 at f6bb7a33 (unmerged) and rLLM's default, written out",
        session_rows,
    ),
}
