"""glibc's malloc told to keep the memory a process frees, for the rest of the process.

A training step allocates its row-sized arrays again every step (samples, packed and
tree-packed batches: tens to hundreds of MB). By default glibc maps a block over 32 MiB on its
own and unmaps it when freed, and gives a free heap top over 64 MiB back to the kernel, so each
step faults those arrays in again on fresh pages that the kernel zeroes. In
`benchmarks/step_allocator.py` (a step's credit, rows, samples, tree packing and packing) that
was 13 to 39% of a step's CPU time, and keeping freed memory made steps 1.1x (200 episodes at
4k) to 1.6x (800 at 4k, 200 at 16k) faster at the same peak resident memory
(docs/performance-bench.md). The price: memory freed is never given back, so the process stays at
its high-water mark.
"""

from __future__ import annotations

import ctypes

# glibc's mallopt parameters, and its largest value (an int): in effect never.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
NEVER = 2**31 - 1


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse: no block is mapped on its own (below
    2 GiB) and the heap is never trimmed. False where malloc is not glibc's."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, NEVER)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER))
