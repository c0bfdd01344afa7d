"""Every trainer adapter refuses, naming the trainer, episode, row and call, a sample it could
not train as it was sampled: nothing reaches a trainer as zeros or under another distribution."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgrove.batch import build_samples
from callgrove.episode import sampling_record
from callgrove.formats.problems import InputError
from callgrove.interop.nemo_rl import nemo_rl_arrays
from callgrove.interop.openrlhf import openrlhf_arrays
from callgrove.interop.prime_rl import prime_rl_samples
from callgrove.interop.trl import trl_batch
from callgrove.interop.verl import verl_arrays
from train.helpers import episode_rows_of, episodes

from .trainer_samples import TEMPERATURE, credited_rows

ADAPTERS = {
    "TRL": lambda samples: trl_batch(samples, 0, TEMPERATURE),
    "verl": lambda samples: verl_arrays(samples, 0),
    "prime-rl": lambda samples: prime_rl_samples(samples, "login"),
    "NeMo RL": lambda samples: nemo_rl_arrays(samples),
    "OpenRLHF": lambda samples: openrlhf_arrays(samples, 0),
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


@settings(max_examples=40, deadline=None)
@given(episodes(), st.integers(0, 2**16))
def test_every_trained_token_keeps_its_values_in_each_batch(episode, seed):
    (episode_rows,) = episode_rows_of(episode, max_identical=2)
    rng = np.random.default_rng(seed)
    for call in episode_rows.forest.calls:
        call.advantages = rng.normal(size=len(call.completion_ids))
        call.sampling = sampling_record(TEMPERATURE, 1.0)
    samples = [s for s in build_samples(episode_rows) if s.num_loss_tokens]
    assert samples  # the leader trains its calls
    trl = trl_batch(samples, 0, TEMPERATURE)
    verl, _, _ = verl_arrays(samples, 0)
    nemo, _ = nemo_rl_arrays(samples)
    prime = prime_rl_samples(samples, "random")
    openrlhf, _ = openrlhf_arrays(samples, 0)
    for index, sample in enumerate(samples):
        trained = sample.loss_mask == 1
        want = {"advantages": sample.advantages[trained], "logprobs": sample.logprobs[trained]}
        in_trl = (trl["completion_mask"][index] * trl["tool_mask"][index]).bool().numpy()
        in_verl = verl["response_mask"][index] == 1
        in_nemo = nemo["token_mask"][index] == 1
        in_openrlhf = openrlhf["action_mask"][index] == 1  # entry t is token t + 1's
        got = {
            "TRL": (
                trl["advantages"][index].numpy()[in_trl],
                trl["old_per_token_logps"][index].numpy()[in_trl],
            ),
            "verl": (verl["advantages"][index][in_verl], verl["rollout_log_probs"][index][in_verl]),
            "NeMo RL": (
                nemo["advantages"][index][in_nemo],
                nemo["generation_logprobs"][index][in_nemo],
            ),
            "OpenRLHF": (
                openrlhf["advantages"][index][in_openrlhf],
                openrlhf["action_log_probs"][index][in_openrlhf],
            ),
            "prime-rl": (
                np.asarray(prime[index].advantages, np.float32)[np.asarray(prime[index].mask)],
                np.asarray(prime[index].logprobs, np.float32)[np.asarray(prime[index].mask)],
            ),
        }
        for trainer, (advantages, logprobs) in got.items():
            assert np.array_equal(advantages, want["advantages"]), trainer
            assert np.array_equal(logprobs, want["logprobs"]), trainer
        # Every real token up to the last trained one is attended to, holes included.
        last = int(np.flatnonzero(trained)[-1]) + 1
        real = np.concatenate([trl["prompt_mask"][index], trl["completion_mask"][index]]) == 1
        assert (
            np.concatenate([trl["prompt_ids"][index], trl["completion_ids"][index]])[real].tolist()
            == sample.token_ids[:last].tolist()
        )


@pytest.mark.parametrize("trainer", sorted(ADAPTERS))
def test_an_adapter_given_no_samples_says_so(trainer):
    with pytest.raises(ValueError, match=f"{trainer}: no samples"):
        ADAPTERS[trainer]([])
