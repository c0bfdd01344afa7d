"""The importance ratio is exact at any temperature and top-p: every call records the
distribution it was sampled from, and before any update the learner scores each trained token
under that same distribution, tree-packed or packed, for the reference decoder and a Hugging
Face model alike. Also: the recorded logprobs against a plain numpy reference of tempering and
the nucleus, unknown sampling filled from the run, and the mismatch corrections' effect."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest
import torch

from callgrove.batch import build_samples, fill_unknown_sampling
from callgrove.chat import CharFormat
from callgrove.episode import Episode, sampling_record
from callgrove.models import TinyModel, open_model
from callgrove.networks.tiny import VarlenLayout
from callgrove.orchestrator import run_episode
from callgrove.policy import SamplingParams
from callgrove.rows import build_rows
from callgrove.train import ModelBatch
from callgrove.train.learner import ModelLearner
from callgrove.train.loss import policy_terms
from callgrove.train.settings import LearnerSettings, LossSettings

from .helpers import tiny_llama

CASES = [(t, p) for t in (0.5, 0.7, 1.0) for p in (0.9, 1.0)]
TOLERANCE = 1e-4


class Relay:
    """A leader with a background checker, a fresh helper, a fork and a compaction: rows that
    share histories, so tree packing shares their tokens."""

    name = "relay-test"

    async def run(self, episode, task):
        leader = episode.leader
        leader.background("checker", lambda agent: agent.ask(f"copy {task}"))
        helper = leader.spawn("helper")
        first = await helper.ask(f"first {task}")
        await leader.ask(f"task {task}")
        await leader.fork("fork").ask("last")
        await leader.compact("sum")
        await leader.ask(f"join {first}")
        return 1.0


def sample_episode(sampler, chat, temperature: float, top_p: float, seed: int = 0) -> Episode:
    params = SamplingParams(
        max_tokens=6,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop_token_ids=chat.stop_token_ids,
    )
    episode = Episode(id=f"e{seed}", group="g")
    asyncio.run(run_episode(Relay(), "302", sampler, chat, params, episode))
    assert episode.ok, episode.errors
    return episode


def train_on(episode: Episode, learner: ModelLearner):
    """One step on the episode's rows (every call given an advantage); its report."""
    rng = np.random.default_rng(0)
    for call in episode.calls():
        call.advantages = float(rng.normal())
    return learner.train_step(build_samples([build_rows(episode)]))


def assert_scored_as_sampled(episode: Episode, learner: ModelLearner, temperature, top_p):
    """Every call says how it was sampled; the learner's step measured no mismatch."""
    for call in episode.calls():
        assert call.sampling == sampling_record(temperature, top_p)
    report = train_on(episode, learner)
    assert report.loss_tokens > 0
    assert report.mismatch["all/max_abs"] < TOLERANCE, report.mismatch
    assert report.mismatch["all/k3"] < 1e-6
    seats = {key.split("/")[0] for key in report.mismatch} - {"all"}
    assert {"leader", "helper", "fork", "checker"} <= seats


def tiny_policy(batching: str):
    settings = TinyModel(d_model=32, n_heads=2, d_ff=64)
    return open_model(settings, learner=LearnerSettings(batching=batching))


@pytest.mark.parametrize("batching", ["tree", "packed"])
@pytest.mark.parametrize(("temperature", "top_p"), CASES)
def test_the_tiny_learner_scores_what_the_sampler_drew_from(batching, temperature, top_p):
    policy = tiny_policy(batching)
    episode = sample_episode(policy.sampler, policy.chat, temperature, top_p)
    assert_scored_as_sampled(episode, policy.learner, temperature, top_p)


def hf_policy(batching: str):
    """A small random Llama over the character vocabulary, sampled and trained float32."""
    from callgrove.policy.hf import HFSampler
    from callgrove.train.hf_trainer import HFLearner

    chat = CharFormat()

    class Characters:
        pad_token_id = 0

        def decode(self, ids, skip_special_tokens=False):
            return chat.text_of(ids)

    def model():
        return tiny_llama(torch.float32, "sdpa", vocab=chat.vocab_size).model

    sampler = HFSampler(model(), Characters())
    learner = HFLearner(model(), LearnerSettings(batching=batching))
    return sampler, learner, chat


@pytest.mark.parametrize("batching", ["tree", "packed"])
@pytest.mark.parametrize(("temperature", "top_p"), CASES)
def test_the_hf_learner_scores_what_the_hf_sampler_drew_from(batching, temperature, top_p):
    sampler, learner, chat = hf_policy(batching)
    episode = sample_episode(sampler, chat, temperature, top_p)
    assert_scored_as_sampled(episode, learner, temperature, top_p)


@pytest.mark.parametrize(("temperature", "top_p"), [(0.5, 0.9), (0.7, 1.0), (1.3, 0.6)])
def test_recorded_logprobs_are_those_of_a_plain_reference(temperature, top_p):
    """Tempering and the nucleus written out in numpy over a full forward without a cache."""
    policy = tiny_policy("tree")
    episode = sample_episode(policy.sampler, policy.chat, temperature, top_p, seed=3)
    model = policy.learner.model.double()
    checked = 0
    for call in episode.calls():
        tokens = episode.full_ids(call).astype(np.int64)
        with torch.no_grad():
            logits = model(
                torch.from_numpy(tokens),
                torch.arange(len(tokens)),
                VarlenLayout([0, len(tokens)]),
            ).numpy()
        for offset, token in enumerate(call.completion_ids):
            position = call.prompt_len + offset
            want = _reference_logprob(logits[position - 1], int(token), temperature, top_p)
            assert abs(call.logprobs[offset] - want) < 1e-6
            checked += 1
    assert checked > 20


def _reference_logprob(logits: np.ndarray, token: int, temperature: float, top_p: float):
    scaled = logits / temperature
    probabilities = np.exp(scaled - scaled.max())
    probabilities /= probabilities.sum()
    order = np.argsort(-probabilities, kind="stable")
    before = np.cumsum(probabilities[order]) - probabilities[order]
    nucleus = order[before < top_p - 1e-12]
    assert token in nucleus
    return float(np.log(probabilities[token] / probabilities[nucleus].sum()))


def test_calls_without_sampling_are_scored_with_the_run_settings_and_counted():
    from callgrove.credit import GRPO
    from callgrove.orchestrator.degeneracy import DegeneracySettings
    from callgrove.orchestrator.step import prepare_step

    policy = tiny_policy("tree")
    episodes = [sample_episode(policy.sampler, policy.chat, 0.5, 0.9, seed=s) for s in range(2)]
    forgotten = [c for c in episodes[0].calls()][:3]
    for call in forgotten:
        call.sampling = None  # as an environment's own client that could not tell would leave it
    for episode in episodes:
        episode.rewards = {"r": float(episode.id == "e0")}
    unknown = prepare_step([episodes], GRPO(), DegeneracySettings())
    assert unknown.unknown_sampling_calls == 3
    with pytest.raises(ValueError, match="sampling distribution is unknown"):
        policy.learner.train_step(unknown.samples)
    run = SamplingParams(temperature=0.5, top_p=0.9)
    prepared = prepare_step([episodes], GRPO(), DegeneracySettings(), run)
    assert prepared.unknown_sampling_calls == 3
    report = policy.learner.train_step(prepared.samples)
    assert report.mismatch["all/max_abs"] < TOLERANCE
    assert fill_unknown_sampling(prepared.samples, 0.5, 0.9) == 0  # nothing left unknown


def test_a_wrongly_recorded_temperature_shows_as_mismatch():
    """Scoring at the wrong temperature (what the learners did before calls recorded theirs)
    is what the metric exists to catch."""
    policy = tiny_policy("tree")
    episode = sample_episode(policy.sampler, policy.chat, 0.5, 1.0)
    for call in episode.calls():
        call.sampling = sampling_record(1.0, 1.0)
    report = train_on(episode, policy.learner)
    assert report.mismatch["all/mean_abs"] > 0.05


def _skewed_batch(shift: np.ndarray) -> tuple[torch.nn.Module, ModelBatch]:
    """A tiny model and one row whose recorded logprobs are the model's own plus `shift`."""
    from callgrove.train import packed_model_batch, row_logprobs

    policy = tiny_policy("packed")
    model = policy.learner.model
    tokens = np.arange(1, 2 + len(shift), dtype=np.int32) % 20
    mask = np.r_[0, np.ones(len(shift), np.uint8)].astype(np.uint8)
    plain = packed_model_batch(tokens, np.array([0, len(tokens)]), mask)
    with torch.no_grad():
        (own,) = row_logprobs(model, plain)
    values = {
        "logprobs": np.r_[0.0, own[1:].numpy() - shift].astype(np.float32),
        "advantages": mask.astype(np.float32),
    }
    return model, packed_model_batch(tokens, np.array([0, len(tokens)]), mask, None, values)


def test_mismatch_corrections_cap_and_mask_the_tokens_they_should():
    # log m per token: the learner's logprob minus the recorded one
    shift = np.array([0.0, np.log(3.0), -np.log(3.0), np.log(1.5), 0.0])
    model, batch = _skewed_batch(shift)
    m = np.exp(shift)

    def weights(**settings):
        terms = policy_terms(model, batch, LossSettings(**settings))
        return terms.weights.numpy()

    plain = policy_terms(model, batch, LossSettings())
    assert plain.weights is None  # off by default: the ratio against the sampler, as it is
    np.testing.assert_allclose(weights(mismatch_cap=2.0), np.minimum(m, 2.0), rtol=1e-5)
    np.testing.assert_allclose(
        weights(mismatch_mask="token"), np.where((m < 0.5) | (m > 2.0), 0, m), rtol=1e-5
    )
    # the row's geometric mean is 1.5 ** (1/5): inside the bounds, so nothing is masked ...
    np.testing.assert_allclose(weights(mismatch_mask="row"), m, rtol=1e-5)
    # ... until the bounds are narrowed below it
    narrow = weights(mismatch_mask="row", mismatch_bounds=(0.5, 1.01))
    assert (narrow == 0).all()

    # The corrected gradient is the plain one with each advantage weighted: a masked token
    # takes no part, the others count m times.
    def gradient(loss):
        model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    corrected = gradient(policy_terms(model, batch, LossSettings(mismatch_mask="token")).loss)
    on_policy = dict(batch.target_values)
    on_policy["logprobs"] = plain.logprobs.float()  # the learner's own: a ratio of 1
    on_policy["advantages"] = batch.target_values["advantages"] * torch.from_numpy(
        weights(mismatch_mask="token").astype(np.float32)
    )
    reference = gradient(policy_terms(model, replace(batch, target_values=on_policy)).loss)
    torch.testing.assert_close(corrected, reference, rtol=1e-4, atol=1e-6)
    assert float(corrected.abs().sum()) > 0


def test_a_training_step_at_half_temperature_records_and_scores_it(tmp_path):
    """`callgrove train examples/train.toml --steps 1` at temperature 0.5 and top-p 0.9."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from callgrove.cli import app
    from callgrove.episode import load

    config = Path(__file__).resolve().parents[2] / "examples" / "train.toml"
    out = tmp_path / "run"
    arguments = ["train", str(config), "--steps", "1", "--out", str(out), "--quiet"]
    arguments += ["--set", "sampling.temperature=0.5", "--set", "sampling.top_p=0.9"]
    arguments += ["--set", "dispatch.groups_per_step=2", "--set", "monitor.plot=false"]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    calls = [c for e in load(out / "step_1" / "train" / "traces.jsonl") for c in e.calls()]
    assert calls and all(c.sampling == sampling_record(0.5, 0.9) for c in calls)
    (metrics,) = [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if '"step"' in line and '"final"' not in line
    ]
    assert 0 <= metrics["train/mismatch/all/max_abs"] < 1e-3
    assert metrics["train/unknown_sampling_calls"] == 0


def test_tokens_an_older_version_sampled_are_told_apart():
    """`on_policy` holds the tokens the trained weights sampled: there only the two sides'
    computation differs; `all` also holds the policy's change since an older version."""
    policy = tiny_policy("tree")
    train_on(sample_episode(policy.sampler, policy.chat, 0.7, 1.0), policy.learner)
    stale = sample_episode(policy.sampler, policy.chat, 0.7, 1.0, seed=1)  # version 0
    report = train_on(stale, policy.learner)  # trains version 1
    assert "on_policy/max_abs" not in report.mismatch
    assert report.mismatch["all/max_abs"] > 1e-3
    learner = policy.learner
    asyncio.run(policy.sampler.load_weights(learner.weights(), learner.version))
    fresh = sample_episode(policy.sampler, policy.chat, 0.7, 1.0, seed=2)
    report = train_on(fresh, learner)
    assert report.mismatch["on_policy/max_abs"] < TOLERANCE
