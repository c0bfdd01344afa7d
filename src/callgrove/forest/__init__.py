"""The call forest: parents by exact token prefix, roots, leaves and trees (docs/episode-format.md, section 2)."""

from callgrove.forest.build import Forest, build_forest, compact_prompts
from callgrove.forest.compactions import abandoned_compactions
from callgrove.forest.tokens import TokenPool, prefix_hashes

__all__ = [
    "Forest",
    "TokenPool",
    "abandoned_compactions",
    "build_forest",
    "compact_prompts",
    "prefix_hashes",
]
