"""Build-time check of llama-cpp-python: decode a few tokens of SmolLM2's GGUF in a child process.

A llama.cpp built for another CPU (or with a kernel the CPU mishandles) crashes only once a prompt
longer than one token is evaluated, long after the build; `make setup` runs this right after the
build so such a build fails there, with what to do, instead of in one gateway test.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
from llama_cpp import Llama
from callgrove.networks.hf import resolve_model
gguf = resolve_model("smollm2-135m").path
model = Llama(model_path=str(gguf), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
tokens = model.tokenize(b"The quick brown fox jumps over the lazy dog")
model.eval(tokens)
assert len(tokens) > 1
"""


def main() -> int:
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    if probe.returncode == 0:
        return 0
    how = f"signal {-probe.returncode}" if probe.returncode < 0 else f"exit {probe.returncode}"
    print(
        f"llama-cpp-python was built but cannot evaluate a prompt on this CPU ({how}):\n"
        f"{probe.stderr[-2000:]}\n"
        "Rebuild it with the portable flags of the Makefile's LLAMA_CMAKE_ARGS "
        "(pip install --no-cache-dir --force-reinstall), or set them for this CPU.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
