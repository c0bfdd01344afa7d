"""Routes on the wire, as vLLM returns them (`routed_experts` on a completion's choice): the
base64 of a `.npy` file holding (tokens - 1, layers, k) unsigned integers, for the prompt from
`routed_experts_prompt_start` on and the completion but its last token."""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np

from callgrove.errors import InvalidValue

ROUTED_EXPERTS = "routed_experts"
PROMPT_START = "routed_experts_prompt_start"


def encode_routed_experts(routes: np.ndarray) -> str:
    """`routes` as vLLM writes them: the smallest unsigned type that holds every expert."""
    top = int(routes.max(initial=0))
    dtype = np.uint8 if top < 2**8 else np.uint16 if top < 2**16 else np.int32
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(routes, dtype=dtype), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_routed_experts(text: object, field: str = ROUTED_EXPERTS) -> np.ndarray:
    """The (tokens, layers, k) array of a `routed_experts` string; an `InvalidValue` naming
    `field` for anything else."""
    try:
        array = np.load(io.BytesIO(base64.b64decode(str(text), validate=True)), allow_pickle=False)
    except (binascii.Error, ValueError, OSError) as error:
        raise InvalidValue(f"{field} is not a base64 .npy array: {error}") from None
    if array.ndim != 3 or array.dtype.kind not in "iu":
        raise InvalidValue(
            f"{field} holds a {array.dtype} array of shape {list(array.shape)}: expected integers "
            "of shape [tokens, layers, experts per token]"
        )
    return array
