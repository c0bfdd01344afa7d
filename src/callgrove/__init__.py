"""callgrove: multi-agent LLM rollouts (subagents, forks, compactions) as exactly-once RL rows.

The whole pipeline from one import::

    import callgrove as cg

    episodes = list(cg.load("traces.jsonl"))
    cg.finalize_group(cg.GRPO(), episodes)          # advantages for one group
    rows = [cg.build_rows(e) for e in episodes]     # one row per leaf, each call trained once
    batch = cg.pack(cg.build_samples(rows), cg.PackSettings(seq_len=4096))

The torch-backed trainer names (`TinyDecoder`, `policy_loss`, `SampleDataset`, ...) are loaded
on first use, so `import callgrove` never imports torch.
"""

from __future__ import annotations

from callgrove.batch import (
    MicroBatch,
    PackedBatch,
    PackSettings,
    Sample,
    build_samples,
    pack,
    read_samples,
    write_samples,
)
from callgrove.batch.tree import (
    TreeBatch,
    TreeSettings,
    pack_episode_rows,
    pack_samples,
    pack_tree,
)
from callgrove.credit import (
    GRPO,
    Algorithm,
    Credit,
    EMABaseline,
    GroupCredit,
    HierarchicalGRPO,
    Trace,
    finalize_group,
)
from callgrove.episode import (
    Agent,
    Call,
    EnvInfo,
    Episode,
    EpisodeError,
    OffPolicySteps,
    PolicySpan,
    Run,
    Stats,
    convert,
    load,
    load_located,
    off_policy_steps,
    open_writer,
    register,
    save,
)
from callgrove.episode.files import EpisodeFormat, format_for
from callgrove.errors import CallgroveError, RunFailed, UsageError
from callgrove.forest import Forest, build_forest, compact_prompts
from callgrove.formats import Diagnostics, InputError, Problem
from callgrove.interop import ATIF, GYM, VERIFIERS  # registers the foreign formats
from callgrove.lazy import lazy_names
from callgrove.rows import (
    CheckSummary,
    EpisodeRows,
    Row,
    RowSettings,
    Violation,
    build_rows,
    check_rows,
)
from callgrove.rows.table import row_record, rows_table

__version__ = "0.1.0"

# Names of the torch-backed rooms, imported when first asked for: the networks and the losses
# (`callgrove.networks`, `callgrove.train`) and writing and trying an environment
# (`callgrove.orchestrator`).
_LAZY_NAMES = {
    **dict.fromkeys(("TinyConfig", "TinyDecoder"), "callgrove.networks"),
    **dict.fromkeys(
        (
            "LossSettings",
            "ModelBatch",
            "PackedCollate",
            "SampleDataset",
            "TreeCollate",
            "micro_batch_model_batch",
            "packed_model_batch",
            "policy_loss",
            "token_logprobs",
            "tree_model_batch",
        ),
        "callgrove.train",
    ),
    **dict.fromkeys(
        ("AgentHandle", "Environment", "EpisodeRun", "sample_episode"), "callgrove.orchestrator"
    ),
}


__getattr__ = lazy_names(__name__, _LAZY_NAMES)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ATIF",
    "GRPO",
    "GYM",
    "VERIFIERS",
    "Agent",
    "Algorithm",
    "Call",
    "CallgroveError",
    "CheckSummary",
    "Credit",
    "Diagnostics",
    "EMABaseline",
    "EnvInfo",
    "Episode",
    "EpisodeError",
    "EpisodeFormat",
    "EpisodeRows",
    "Forest",
    "GroupCredit",
    "HierarchicalGRPO",
    "InputError",
    "MicroBatch",
    "OffPolicySteps",
    "PackSettings",
    "PackedBatch",
    "PolicySpan",
    "Problem",
    "Row",
    "RowSettings",
    "Run",
    "RunFailed",
    "Sample",
    "Stats",
    "Trace",
    "TreeBatch",
    "TreeSettings",
    "UsageError",
    "Violation",
    "__version__",
    "build_forest",
    "build_rows",
    "build_samples",
    "check_rows",
    "compact_prompts",
    "convert",
    "finalize_group",
    "format_for",
    "load",
    "load_located",
    "off_policy_steps",
    "open_writer",
    "pack",
    "pack_episode_rows",
    "pack_samples",
    "pack_tree",
    "read_samples",
    "register",
    "row_record",
    "rows_table",
    "save",
    "write_samples",
    *_LAZY_NAMES,
]
