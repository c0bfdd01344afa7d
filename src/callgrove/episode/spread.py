"""How a call's value reaches its completion tokens: the one spreading rule.

A call holds `advantages` as a scalar (one value for every completion token), a per-token array
(one value per completion token) or None (unassigned), and `logprobs` as a per-token array or
None. Rows, samples, tree packing and the verifiers writer all lay such values out per token
through `spread_over_completions`, so the rule lives here alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from callgrove.episode.record import Call
from callgrove.formats.problems import InputError, Problem

PER_TOKEN_VALUES = ("advantages", "logprobs")


def spread_over_completions(
    calls: Sequence[Call],
    name: str,
    dtype: type = np.float64,
    episodes: Sequence[str | None] | None = None,
) -> np.ndarray:
    """Each call's `name` value over its completion tokens, calls end to end.

    A scalar is repeated on every completion token, an array is taken as it is, None gives 0.0
    (callers that must tell "none" from zero ask the call). An array whose length is not the
    completion's is an `InputError` naming the call (and its episode, from `episodes`).
    """
    if name not in PER_TOKEN_VALUES:
        raise ValueError(f"spread_over_completions: {name!r} is not one of {PER_TOKEN_VALUES}")
    values = [getattr(call, name) for call in calls]
    lengths = np.fromiter((len(call.completion_ids) for call in calls), np.int64, len(calls))
    arrays = [i for i, value in enumerate(values) if isinstance(value, np.ndarray)]
    sizes = np.fromiter((values[i].size for i in arrays), np.int64, len(arrays))
    wrong = np.flatnonzero(sizes != lengths[arrays])
    if wrong.size:
        i = arrays[int(wrong[0])]
        message = f"{name} has {values[i].size} values for {lengths[i]} completion tokens"
        episode = None if episodes is None else episodes[i]
        raise InputError(Problem(message, episode=episode, call=calls[i].id))
    if len(arrays) == len(values):  # every call has an array (logprobs, per-token credit)
        return np.concatenate(values).astype(dtype, copy=False) if values else np.zeros(0, dtype)
    scalars = np.fromiter(
        (0.0 if v is None or isinstance(v, np.ndarray) else float(v) for v in values),
        np.float64,
        len(values),
    )
    spread = np.repeat(scalars.astype(dtype), lengths)
    if arrays:
        starts = np.cumsum(lengths) - lengths
        for i in arrays:
            spread[starts[i] : starts[i] + lengths[i]] = values[i]
    return spread
