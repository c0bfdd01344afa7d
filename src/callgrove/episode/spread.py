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
    laid_out: Sequence[int] | None = None,
) -> np.ndarray:
    """Each call's `name` value over its completion tokens, calls end to end.

    A scalar is repeated on every completion token, an array is taken as it is, None gives 0.0
    (callers that must tell "none" from zero ask the call). An array whose length is not the
    completion's is an `InputError` naming the call (and its episode, from `episodes`).
    `laid_out` (places in `calls`) lays out only those calls, in that order; every call's
    value is checked all the same.
    """
    values = _values(calls, name)
    lengths = np.fromiter((len(call.completion_ids) for call in calls), np.int64, len(calls))
    arrays = [i for i, value in enumerate(values) if isinstance(value, np.ndarray)]
    sizes = np.fromiter((values[i].size for i in arrays), np.int64, len(arrays))
    wrong = np.flatnonzero(sizes != lengths[arrays])
    if wrong.size:
        i = arrays[int(wrong[0])]
        message = f"{name} has {values[i].size} values for {lengths[i]} completion tokens"
        episode = None if episodes is None else episodes[i]
        raise InputError(Problem(message, episode=episode, call=calls[i].id))
    if laid_out is not None:
        values, lengths = [values[i] for i in laid_out], lengths[laid_out]
        arrays = [i for i, value in enumerate(values) if isinstance(value, np.ndarray)]
    if len(arrays) == len(values):  # every call has an array (logprobs, per-token credit)
        return np.concatenate(values).astype(dtype, copy=False) if values else np.zeros(0, dtype)
    spread = np.repeat(_scalars(values, dtype), lengths)
    if arrays:
        starts = np.cumsum(lengths) - lengths
        for i in arrays:
            spread[starts[i] : starts[i] + lengths[i]] = values[i]
    return spread


def per_call_scalars(
    calls: Sequence[Call], name: str, dtype: type = np.float64
) -> np.ndarray | None:
    """Each call's `name` as one value per call (None as 0.0) when no call holds a per-token
    array, the value every completion token of the call gets; None when some call holds one
    (then `spread_over_completions` lays the values out token by token)."""
    values = _values(calls, name)
    if any(isinstance(value, np.ndarray) for value in values):
        return None
    return _scalars(values, dtype)


def _values(calls: Sequence[Call], name: str) -> list:
    if name not in PER_TOKEN_VALUES:
        raise ValueError(f"spread_over_completions: {name!r} is not one of {PER_TOKEN_VALUES}")
    return [getattr(call, name) for call in calls]


def _scalars(values: list, dtype: type) -> np.ndarray:
    """One value per call: a scalar as it is, None as 0.0 (an array's place is filled later)."""
    return np.fromiter(
        (0.0 if v is None or isinstance(v, np.ndarray) else float(v) for v in values),
        np.float64,
        len(values),
    ).astype(dtype, copy=False)
