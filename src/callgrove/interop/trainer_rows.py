"""What every trainer adapter needs of a sample, checked once: the span of the row it trains,
its sampling logprobs and advantages, and the distribution its trained tokens were sampled from.

A sample with no trained token, a supervised one (no advantages), one whose calls recorded no
logprobs, or one whose trained tokens have an unknown sampling distribution is refused with an
`InputError` naming the trainer, episode, row and leaf call: a trainer fed such a row would
train on zeros or score under a distribution it was not sampled from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from callgrove.batch.samples import NO_TOP_K, Sample
from callgrove.episode.record import NO_ROUTE
from callgrove.errors import InvalidValue
from callgrove.formats.problems import InputError, Problem


@dataclass(frozen=True, slots=True)
class TrainedSpan:
    """Where a sample's trained tokens lie: `start` is its first trained token, `end` one past
    its last. Tokens before `start` are the prompt a trainer conditions on; holes between
    them (tool results, context-only calls) are completion tokens with no loss."""

    start: int
    end: int


def refuse(sample: Sample, trainer: str, reason: str) -> InputError:
    message = f"{trainer}: row {sample.row} {reason}"
    return InputError(Problem(message, episode=sample.episode, call=sample.leaf))


def refuse_routes(samples: Sequence[Sample], trainer: str) -> None:
    """Refuse samples carrying a mixture of experts' routes for a trainer that has no field
    to replay them in: its learner would route by its own top-k."""
    for sample in samples:
        if sample.routes is not None:
            raise refuse(
                sample,
                trainer,
                f"carries routes (a mixture of experts), which {trainer} has no field to replay: "
                "its learner would route every token by its own top-k. Set the samples' routes "
                "to None to train without replay",
            )


def filled_routes(routes: np.ndarray, previous: bool = False) -> np.ndarray:
    """Routes with each token that has none (`NO_ROUTE`, a row's last token) given one: the
    previous token's (`previous`, as prime-rl fills it) or experts 0..k-1."""
    missing = routes[:, 0, 0] == NO_ROUTE
    if not missing.any():
        return routes
    filled = routes.copy()
    for index in np.flatnonzero(missing):
        if previous and index > 0:
            filled[index] = filled[index - 1]
        else:
            filled[index] = np.arange(routes.shape[2], dtype=routes.dtype)
    return filled


def trained_span(sample: Sample, trainer: str) -> TrainedSpan:
    """The span of `sample`'s trained tokens, after checking it can train by policy gradient."""
    trained = np.flatnonzero(sample.loss_mask)
    if not len(trained):
        raise refuse(sample, trainer, "trains no token (leave such rows out of a trainer batch)")
    if sample.advantages is None:
        raise refuse(sample, trainer, "has no advantages (a supervised row: train it by SFT)")
    if sample.logprobs is None:
        raise refuse(sample, trainer, "has no sampling logprobs (a call it trains recorded none)")
    check_known_sampling(sample, trainer)
    if trained[0] == 0:
        raise refuse(sample, trainer, "trains its first token, which nothing predicts")
    return TrainedSpan(int(trained[0]), int(trained[-1]) + 1)


def check_known_sampling(sample: Sample, trainer: str) -> None:
    """Refuse trained tokens whose sampling distribution is unknown (NaN temperature): no
    trainer setting can score them as they were sampled."""
    if np.isnan(sample.temperatures[sample.loss_mask.astype(bool)]).any():
        raise refuse(
            sample,
            trainer,
            "has trained tokens whose sampling is unknown (their call recorded none): "
            "fill them with the run's settings first (fill_unknown_sampling)",
        )


def check_uncut(samples: Sequence[Sample], trainer: str) -> None:
    """Refuse trained tokens sampled with a top-p or top-k cut: `trainer` scores a token under
    the temperature-scaled distribution alone, so a cut one would get another probability."""
    for sample in samples:
        trained = sample.loss_mask.astype(bool)
        if (sample.top_p[trained] < 1).any() or (sample.top_k[trained] != NO_TOP_K).any():
            raise refuse(
                sample,
                trainer,
                "has trained tokens sampled with a top-p or top-k cut, which "
                f"{trainer} does not score under (sample with top_p 1 and no top-k)",
            )


def shared_temperature(samples: Sequence[Sample], trainer: str) -> float:
    """The one temperature every trained token of `samples` was sampled at: `trainer` takes a
    single temperature for a whole run, so samples at several are refused."""
    check_uncut(samples, trainer)
    first: float | None = None
    for sample in samples:
        check_known_sampling(sample, trainer)  # NaN would read as a temperature of its own
        # Samples hold float32: the shortest decimal of each is the temperature its call recorded.
        values = np.unique(sample.temperatures[sample.loss_mask.astype(bool)])
        for value in (float(str(v)) for v in values):
            if first is None:
                first = value
            elif value != first:
                raise refuse(
                    sample,
                    trainer,
                    f"was sampled at temperature {value:g}, another row at {first:g}: "
                    f"{trainer} scores every token at one temperature",
                )
    if first is None:
        raise InvalidValue(f"{trainer}: no samples")
    return first


@dataclass(frozen=True, slots=True)
class PromptCompletion:
    """Samples as a trainer's prompt / completion batch (int64 ids, float32 values): the
    prompt (everything before the first trained token) left-padded, the completion (from there
    to the last trained token, holes included) right-padded."""

    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    completion_ids: np.ndarray
    completion_mask: np.ndarray
    """1 on every completion token (the attention mask), 0 on padding."""
    loss_mask: np.ndarray
    """1 on trained completion tokens, 0 on holes and padding."""
    advantages: np.ndarray
    logprobs: np.ndarray
    """Sampling logprobs of the completion tokens (0.0 on padding)."""
    widths: np.ndarray
    """Each row's completion length."""


def prompt_completion(
    samples: Sequence[Sample], pad_token_id: int, trainer: str
) -> PromptCompletion:
    """The split every prompt / completion trainer takes, each sample checked (`trained_span`)."""
    if not samples:
        raise InvalidValue(f"{trainer}: no samples to batch")
    spans = [trained_span(sample, trainer) for sample in samples]
    prompt_width = max(span.start for span in spans)
    completion_width = max(span.end - span.start for span in spans)
    rows = len(samples)
    batch = PromptCompletion(
        prompt_ids=np.full((rows, prompt_width), pad_token_id, dtype=np.int64),
        prompt_mask=np.zeros((rows, prompt_width), dtype=np.int64),
        completion_ids=np.full((rows, completion_width), pad_token_id, dtype=np.int64),
        completion_mask=np.zeros((rows, completion_width), dtype=np.int64),
        loss_mask=np.zeros((rows, completion_width), dtype=np.int64),
        advantages=np.zeros((rows, completion_width), dtype=np.float32),
        logprobs=np.zeros((rows, completion_width), dtype=np.float32),
        widths=np.array([span.end - span.start for span in spans], dtype=np.int64),
    )
    for index, (sample, span) in enumerate(zip(samples, spans, strict=True)):
        width = span.end - span.start
        batch.prompt_ids[index, prompt_width - span.start :] = sample.token_ids[: span.start]
        batch.prompt_mask[index, prompt_width - span.start :] = 1
        completion = slice(span.start, span.end)
        batch.completion_ids[index, :width] = sample.token_ids[completion]
        batch.completion_mask[index, :width] = 1
        batch.loss_mask[index, :width] = sample.loss_mask[completion]
        batch.advantages[index, :width] = sample.advantages[completion]
        batch.logprobs[index, :width] = sample.logprobs[completion]
    return batch


def check_vocabulary(samples: Sequence[Sample], vocab_size: int, trainer: str) -> None:
    """Refuse token ids the model has no embedding for (a trainer would fail on them with a
    bare index error, or a GPU kernel with a device assert)."""
    for sample in samples:
        outside = np.flatnonzero((sample.token_ids >= vocab_size) | (sample.token_ids < 0))
        if len(outside):
            at = int(outside[0])
            raise refuse(
                sample,
                trainer,
                f"holds token id {int(sample.token_ids[at])} at position {at}, outside the "
                f"model's vocabulary of {vocab_size} (samples of another tokenizer?)",
            )
