"""Policies that sample: one small interface (`PolicyClient`) that every backend implements.

The orchestrator's environments, the capture gateway and `serve-policy` talk to a policy only
through it, so the embedded reference decoder, a Hugging Face model and an HTTP inference server
are interchangeable. A sampler whose weights a learner moves is a `TrainableSampler`; the
reference decoder's is `callgrove.policy.batching.LocalSampler`. `callgrove.models` opens a model's
sampler beside its learner. A sample carries exactly what the episode record needs of a policy call:
the sampled token ids, their sampling log-probabilities and the policy version that sampled them.
"""

from callgrove.policy.client import (
    Completion,
    FinishReason,
    PolicyClient,
    SamplingParams,
    TrainableSampler,
)

__all__ = [
    "Completion",
    "FinishReason",
    "PolicyClient",
    "SamplingParams",
    "TrainableSampler",
]
