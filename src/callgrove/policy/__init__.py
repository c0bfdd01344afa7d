"""Policies that sample: one small interface (`PolicyClient`) that every backend implements.

The orchestrator's environments, the capture gateway and `serve-policy` talk to a policy only
through it, so the embedded reference decoder, a Hugging Face model and an HTTP inference server
are interchangeable. A backend that trains adds a `Learner` and makes its sampler a
`TrainableSampler` (`callgrove.policy.learner` states the contract); the reference decoder's
sampler is `callgrove.policy.local.LocalSampler`. A sample carries exactly what the episode record needs of a policy call:
the sampled token ids, their sampling log-probabilities and the policy version that sampled them.
"""

from callgrove.policy.client import Completion, FinishReason, PolicyClient, SamplingParams
from callgrove.policy.learner import Learner, TrainableSampler

__all__ = [
    "Completion",
    "FinishReason",
    "Learner",
    "PolicyClient",
    "SamplingParams",
    "TrainableSampler",
]
