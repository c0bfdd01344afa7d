"""Other frameworks' rollout records as callgrove episodes, and callgrove's credit back to them.

- `callgrove.interop.verifiers`: verifiers `traces.jsonl` (0.4.0 episode rows and older
  bare-trace rows), advantages written back onto its message nodes, episodes written as it.
- `callgrove.interop.gym`: NeMo Gym token capture (`TokenEntry`) joined with its agent
  invocation records, so every subagent's and compaction's calls are kept.

Importing the package registers both as episode formats (`verifiers`, `gym`) for `load`,
`save` and `convert`.
"""

from callgrove.interop.formats import GYM, VERIFIERS

__all__ = ["GYM", "VERIFIERS"]
