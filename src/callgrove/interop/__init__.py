"""Other frameworks' rollout records as callgrove episodes, and callgrove's credit back to them.

- `callgrove.interop.verifiers`: verifiers `traces.jsonl` (0.4.0 episode rows and older
  bare-trace rows), advantages written back onto its message nodes, episodes written as it.
- `callgrove.interop.atif`: ATIF trajectories (Harbor's interchange format, v1.0-v1.8), read
  with their subagent trajectories and written back with them.
- `callgrove.interop.gym`: NeMo Gym token capture (`TokenEntry`) joined with its agent
  invocation records, so every subagent's and compaction's calls are kept.

Trainer adapters, imported by name only (each needs its trainer where it builds the trainer's
objects; docs/trainers.md): `callgrove.interop.trl` (TRL's GRPO batch and a `GRPOTrainer` on
samples), `.verl` (a `DataProto`), `.prime_rl` (its `TrainingSample`s), `.nemo_rl` (its
GRPO train data) and `.openrlhf` (the `Experience` its actor trains on).

Importing the package registers them as episode formats (`verifiers`, `gym`, `atif`) for `load`,
`save` and `convert`.
"""

from callgrove.interop.formats import ATIF, GYM, VERIFIERS

__all__ = ["ATIF", "GYM", "VERIFIERS"]
