"""NeMo Gym records for tests: token entries made and stored by Gym's own classes, and agent
invocation records as plain dicts of exactly `nemo_gym.rollout_observability`'s shapes (that
module needs Gym's server stack, so its models are read from the source, not imported)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_gym.token_id_capture import (
    ParentResolutionStatus,
    TokenCaptureStore,
    TokenEntry,
    stamp_lineage,
)

ROLLOUT = "r0"
POLICY = {"type": "responses_api_models", "name": "policy"}


class Capture:
    """Calls of one rollout as the capture middleware records them, in ledger order."""

    def __init__(self, store: TokenCaptureStore, rollout: str = ROLLOUT):
        self.store = store
        self.rollout = rollout
        self.full: dict[str, list[int]] = {}
        self.clock = 0.0

    def call(
        self,
        name: str,
        prompt: list[int],
        generation: list[int],
        parent: str | None = None,
        delta: bool = False,
    ) -> TokenEntry:
        """`prompt` is the whole prompt; with `delta` only what follows the parent is stored."""
        self.clock += 1.0
        stored = prompt[len(self.full[parent]) :] if delta and parent else prompt
        entry = TokenEntry(
            rollout_id=self.rollout,
            model_call_id=name,
            prompt_token_ids=stored,
            generation_token_ids=generation,
            generation_log_probs=[-0.5] * len(generation),
            response_id=f"resp-{name}",
            created_at=self.clock,
            prompt_is_delta=delta,
            parent_call_id=parent,
            parent_resolution=ParentResolutionStatus.RESOLVED
            if parent
            else ParentResolutionStatus.ROOT,
        )
        full = prompt + generation
        stamp_lineage(entry, parent, parent_resolution=entry.parent_resolution, cumulative=full)
        self.store.append(entry)
        self.full[name] = full
        return entry

    def after(self, name: str, *added: int) -> list[int]:
        """The full sequence of call `name` followed by `added`: the next call's prompt."""
        return [*self.full[name], *added]


def seed_capture(store: TokenCaptureStore) -> Capture:
    """The 12 calls of the call-forest design (C<n> has seq n), plus a dropped retry of C12 and a
    call that generated nothing. L leads; B runs in the background; A starts fresh; F forks L."""
    c = Capture(store)
    c.call("C1", [1, 10, 11], [12])  # L: Agent(B, background)
    c.call("C2", [2, 30], [31])  # B: curl /login
    c.call("C3", c.after("C1", 13), [14], parent="C1", delta=True)  # L: Agent(A, find the bug)
    c.call("C4", c.after("C2", 32), [33], parent="C2", delta=True)  # B: "Signed in."
    c.call("C5", [3, 40], [41])  # A: grep login
    c.call("C6", c.after("C5", 42), [43], parent="C5")  # A: "auth.py:12"
    c.call("C7", c.after("C3", 15), [16], parent="C3", delta=True)  # L: Agent(F, fork)
    c.call("C8", c.after("C7", 50), [51], parent="C7", delta=True)  # F: edit auth.py
    c.call("C9", c.after("C8", 52), [53], parent="C8", delta=True)  # F: "Fixed."
    c.call("C10", c.after("C7", 17), [18, 19], parent="C7")  # L: the summary of C1-C9
    c.call("C11", [1, 20, 18, 19], [21])  # L: pytest, from the summary
    c.call("C12", c.after("C11", 22), [23], parent="C11", delta=True)  # L: "Done."
    c.call("R12", c.after("C11", 22), [24], parent="C11", delta=True)  # a retry L dropped
    c.call("E", [1, 10, 11, 99], [])  # generated nothing
    return c


def ref(call: str, by_response: bool = False) -> dict[str, Any]:
    """A `ModelCallRef`."""
    if by_response:
        return {"model_call_id": None, "model_ref": POLICY, "response_id": f"resp-{call}"}
    return {"model_call_id": call, "model_ref": None, "response_id": None}


def invocation(
    invocation_id: str,
    calls: list[dict[str, Any]],
    parent: str | None = None,
    spawned_by: str | None = None,
    status: str = "completed",
    error_type: str | None = None,
) -> dict[str, Any]:
    """An `AgentInvocation`."""
    return {
        "kind": "agent_invocation",
        "invocation_id": invocation_id,
        "parent_invocation_id": parent,
        "spawned_by_tool_call_id": spawned_by,
        "status": status,
        "duration_ms": 1200.0,
        "error_type": error_type,
        "model_calls": calls,
        "conversation": [],
    }


def compaction(invocation_id: str, call: str, before: str, after: str) -> dict[str, Any]:
    """A `ContextCompactionObservation` whose summary call was matched."""
    return {
        "kind": "context_compaction",
        "invocation_id": invocation_id,
        "observed_at": 1.5,
        "trigger": "auto",
        "tokens_before": 9,
        "tokens_after": 4,
        "outcome": "completed",
        "summary": "the bug is in auth.py; fixed",
        "first_kept_item_id": None,
        "before_model_call": ref(before),
        "model_calls": [ref(call)],
        "after_model_call": ref(after),
    }


def gap(code: str, invocation_id: str | None = None, detail: str | None = None) -> dict[str, Any]:
    """An `ObservationGap`."""
    return {"code": code, "invocation_id": invocation_id, "detail": detail}


def seed_invocations() -> list[dict[str, Any]]:
    return [
        invocation("L", [ref(c) for c in ("C1", "C3", "C7", "C10", "C11", "C12")]),
        invocation("B", [ref("C2"), ref("C4")], status="unknown"),  # its start was not linked
        invocation("A", [ref("C5"), ref("C6", by_response=True)], parent="L", spawned_by="tu-A"),
        invocation("F", [ref("C8"), ref("C9")], parent="L", spawned_by="tu-F"),
    ]


def trajectory(invocations: list[dict[str, Any]], gaps: list[dict[str, Any]]) -> dict[str, Any]:
    """A `TrajectoryRecord`."""
    return {
        "schema_version": "1.0",
        "task_id": "login-bug",
        "rollout_id": ROLLOUT,
        "invocations": invocations,
        "turns": [],
        "model_calls": [],
        "tool_calls": [],
        "gaps": gaps,
    }


def seed_rollout_row() -> dict[str, Any]:
    """A Gym rollout result row as rollout collection writes it."""
    invocations = seed_invocations()
    gaps = [gap("subagent_parent_unavailable", "B")]
    return {
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "reward": 1.0,
        "ng_trajectory": trajectory(invocations, gaps),
        "ng_agent_observations": {
            "source": "claude_code",
            "records": [*invocations, compaction("L", "C10", before="C7", after="C11")],
            "gaps": gaps,
        },
    }


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
