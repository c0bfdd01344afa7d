"""The call forest: parents by exact token prefix, roots, leaves and trees (docs/episode-format.md, section 2)."""

from callgrove.forest.build import Forest, build_forest, compact_prompts
from callgrove.forest.tokens import TokenPool

__all__ = ["Forest", "TokenPool", "build_forest", "compact_prompts"]
