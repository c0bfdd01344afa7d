"""Every trainer adapter refuses, naming the trainer, episode, row and call, a sample it could
not train as it was sampled: nothing reaches a trainer as zeros or under another distribution."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from callgrove.batch import build_samples
from callgrove.formats.problems import InputError
from callgrove.interop.nemo_rl import nemo_rl_arrays
from callgrove.interop.prime_rl import prime_rl_samples
from callgrove.interop.trl import trl_batch
from callgrove.interop.verl import verl_arrays

from .trainer_samples import TEMPERATURE, credited_rows

ADAPTERS = {
    "TRL": lambda samples: trl_batch(samples, 0, TEMPERATURE),
    "verl": lambda samples: verl_arrays(samples, 0),
    "prime-rl": lambda samples: prime_rl_samples(samples, "login"),
    "NeMo RL": lambda samples: nemo_rl_arrays(samples),
}


def with_values(sample, name, value):
    array = getattr(sample, name).copy()
    array[sample.loss_mask == 1] = value
    return replace(sample, **{name: array})


def first_token_trained(sample):
    mask = sample.loss_mask.copy()
    mask[0] = 1
    return replace(sample, loss_mask=mask)


BROKEN = {
    "trains no token": lambda s: replace(s, loss_mask=np.zeros_like(s.loss_mask)),
    "no advantages": lambda s: replace(s, advantages=None),
    "no sampling logprobs": lambda s: replace(s, logprobs=None),
    "sampling is unknown": lambda s: with_values(s, "temperatures", np.nan),
    "top-p or top-k cut": lambda s: with_values(s, "top_p", 0.9),
    "top-k cut": lambda s: with_values(s, "top_k", 20),
    "trains its first token": first_token_trained,
}


@pytest.mark.parametrize("trainer", sorted(ADAPTERS))
@pytest.mark.parametrize("defect", sorted(BROKEN))
def test_an_adapter_refuses_a_sample_it_cannot_train(trainer, defect):
    samples = build_samples(credited_rows())
    ADAPTERS[trainer](samples)  # the samples as they are go through
    broken = BROKEN[defect](samples[3])
    with pytest.raises(InputError, match=defect) as refused:
        ADAPTERS[trainer]([*samples[:3], broken, *samples[4:]])
    problem = refused.value.problem
    assert (problem.episode, problem.call) == (broken.episode, broken.leaf)
    assert problem.message.startswith(f"{trainer}: row {broken.row} ")
