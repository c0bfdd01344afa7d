"""Rollout routing replay: a mixture of experts' calls record the experts the sampler routed
each token through, and the learner forced through them computes the sampler's
log-probabilities (float64, within 1e-6) on episodes with a fork, a background agent and a
compaction, on every learner path; routing by its own top-k, it does not.

The sampler here routes as an inference engine's kernels may: a token whose two best experts
nearly tie can go to either (`noisy_routers`), so its experts are not always the learner's own
top-k, while its gate weights come from the same router logits."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from callgrove.batch import build_samples, read_samples, write_samples
from callgrove.bench.moe import learner_mismatch, noisy_routers, sampled_episode
from callgrove.episode import Episode, load, save
from callgrove.episode.record import NO_ROUTE
from callgrove.networks.hf import load_model
from callgrove.networks.sizes import LoraSettings
from callgrove.rows import build_rows
from callgrove.train.hf_trainer import HFLearner, HFOptions
from callgrove.train.settings import LearnerSettings

pytestmark = pytest.mark.hf
TOLERANCE = 1e-6
NEAR_TIE = 0.01  # gate probabilities this close may swap in the sampler


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """The built-in `tiny-moe` in float64 (its folder made in a temporary cache)."""
    with pytest.MonkeyPatch.context() as patch:  # kept for the module: ranks load it too
        patch.setenv("CALLGROVE_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield load_model("tiny-moe", torch.float64)


def mismatch(model, episode: Episode, settings: LearnerSettings) -> dict[str, float]:
    return learner_mismatch(model, [episode], settings)


@pytest.fixture(scope="module", params=[1.0, 0.7], ids=["T=1", "T=0.7"])
def episode(moe, request):
    model, tokenizer = moe
    sampler = copy.deepcopy(model)
    noisy_routers(sampler, NEAR_TIE)
    return sampled_episode(sampler, tokenizer, request.param)


@pytest.mark.parametrize("batching", ["tree", "packed"])
def test_replayed_routes_give_the_samplers_logprobs(moe, episode, batching):
    model, _ = moe
    replayed = mismatch(model, episode, LearnerSettings(batching=batching))
    assert replayed["all/max_abs"] < TOLERANCE
    assert replayed["routes/tree_fallbacks"] == 0  # a tree's rows agree on the routes they share
    own = mismatch(model, episode, LearnerSettings(batching=batching, route_replay=False))
    assert own["all/max_abs"] > 100 * TOLERANCE  # tokens whose sampler took other experts
    # the learner's own top-k is not the sampler's on some tokens, replayed or not
    assert 0 < replayed["routes/topk_differs"] < 0.5 and own["routes/topk_differs"] > 0
    assert replayed["routes/recorded_share"] > 0.9  # all but each row's last token


@pytest.mark.parametrize(
    "options",
    [HFOptions(lora=LoraSettings(rank=4)), HFOptions(gradient_checkpointing=True)],
    ids=["lora", "checkpointing"],
)
def test_replay_holds_with_lora_and_checkpointing(moe, episode, options):
    model, _ = moe
    replayed = learner_mismatch(model, [episode], LearnerSettings(), options)
    assert replayed["all/max_abs"] < TOLERANCE
    own = learner_mismatch(model, [episode], LearnerSettings(route_replay=False), options)
    assert own["all/max_abs"] > 100 * TOLERANCE


def test_every_call_records_a_route_per_forwarded_token(episode):
    for call in episode.calls():
        assert episode.routes(call).shape == (call.full_len - 1, 2, 2)
    assert episode.agent("L").calls[-1].routes_from == 0  # from a summary: a root, routes whole


def test_routes_survive_the_file_and_compact_prompts(episode, tmp_path):
    save(tmp_path / "moe.jsonl", [episode])
    [back] = load(tmp_path / "moe.jsonl")
    for call in episode.calls():
        assert np.array_equal(back.routes(back.call(call.id)), episode.routes(call))
    assert any(c.routes_from for c in back.calls())  # held as their prompt base's where equal


def test_a_call_whose_prefix_was_routed_otherwise_starts_a_new_tree(episode):
    changed = episode.filter(lambda call: True)
    fork_call = changed.agent("F").calls[0]
    routes = changed.routes(fork_call).copy()
    routes[0, 0] = (routes[0, 0] + 1) % 8  # its forward routed the first token otherwise
    fork_call.routes, fork_call.routes_from = routes, 0
    result = build_rows(changed)
    forest = result.forest
    assert forest.parent_of(fork_call) is None
    assert [forest.calls[i].id for i in forest.route_breaks] == [fork_call.id]
    [row] = [r for r in result.rows if r.path[-1].id == "F1"]
    assert [c.id for c in row.path] == ["F0", "F1"]  # the leader's turns only its prompt now


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".jsonl"])
def test_samples_carry_routes_through_every_samples_file(episode, tmp_path, suffix):
    samples = build_samples(build_rows(episode))
    dense = copy.copy(samples[0])
    dense.routes = None  # a dense model's sample beside them
    path = tmp_path / f"samples{suffix}"
    write_samples(path, [*samples, dense])
    back = read_samples(path)
    for sample, read in zip(samples, back, strict=False):
        assert read.routes.dtype == sample.routes.dtype
        assert np.array_equal(read.routes, sample.routes)
        assert read.routes[-1, 0, 0] == NO_ROUTE  # a row's last token was never forwarded
    assert back[-1].routes is None


@pytest.mark.processes
def test_replay_holds_on_two_ranks(moe, episode):
    from functools import partial

    from callgrove.networks.hf import resolve_model
    from callgrove.train.ranks import RankedLearner

    from .ranked_builds import moe

    build = partial(moe, str(resolve_model("tiny-moe").folder))

    samples = build_samples(build_rows(episode))
    found = {}
    for replay in (True, False):
        settings = LearnerSettings(world_size=2, route_replay=replay)
        learner = RankedLearner(
            build, settings, timeout_s=120, preload=["transformers.modeling_utils"]
        )
        try:
            found[replay] = learner.train_step(samples).mismatch["all/max_abs"]
        finally:
            learner.close()
    assert found[True] < TOLERANCE < 100 * TOLERANCE < found[False]


def routed_samples(episode):
    samples = [s for s in build_samples(build_rows(episode)) if s.num_loss_tokens]
    return samples


def test_prime_rl_samples_carry_routes_as_its_trainer_reads_them(episode, tmp_path):
    import msgspec

    from callgrove.interop.prime_rl import TrainingSample, write_prime_rl

    samples = routed_samples(episode)
    write_prime_rl(tmp_path / "s.msgpack", samples, "moe")
    decoded = msgspec.msgpack.decode(
        (tmp_path / "s.msgpack").read_bytes(), type=list[TrainingSample]
    )
    for sample, record in zip(samples, decoded, strict=True):
        routed = record.routed_experts
        routes = np.frombuffer(routed.data, dtype=routed.dtype).reshape(routed.shape)
        assert routes.shape[0] == len(record.token_ids) == sample.num_tokens
        assert np.array_equal(routes[:-1], sample.routes[:-1])
        assert np.array_equal(routes[-1], routes[-2])  # the last token: its predecessor's


def test_verl_and_nemo_rl_batches_put_routes_on_their_token_positions(episode):
    from callgrove.interop.nemo_rl import nemo_rl_arrays
    from callgrove.interop.verl import verl_arrays

    samples = routed_samples(episode)
    tensors, _, _ = verl_arrays(samples, 0)
    batch, _ = nemo_rl_arrays(samples)
    for index, sample in enumerate(samples):
        real = tensors["attention_mask"][index] == 1
        ids, routes = tensors["input_ids"][index][real], tensors["routed_experts"][index][real]
        assert np.array_equal(ids, sample.token_ids[: len(ids)])
        known = sample.routes[: len(ids)]
        assert np.array_equal(routes, np.where(known < 0, 0, known))
        nemo = batch["routed_experts"][index][: sample.num_tokens]
        assert np.array_equal(nemo, sample.routes)  # the last token's -1: NeMo RL routes it


@pytest.mark.parametrize("adapter", ["trl", "openrlhf"])
def test_trainers_without_a_route_field_refuse_routed_samples(episode, adapter):
    from callgrove.formats.problems import InputError

    samples = routed_samples(episode)
    if adapter == "trl":
        from callgrove.interop.trl import trl_batch as build
    else:
        from callgrove.interop.openrlhf import openrlhf_arrays as build
    temperature = {"temperature": samples[0].temperatures[-1]} if adapter == "trl" else {}
    with pytest.raises(InputError, match="has no field to replay"):
        build(samples, 0, **temperature)
    for sample in samples:
        sample.routes = None
    build(samples, 0, **temperature)  # without them: trained by its own routing


def test_rows_that_route_a_shared_token_otherwise_are_not_merged_and_rows_without_are_counted(
    moe, episode
):
    other = episode.filter(lambda call: True)  # a copy
    other.id = "rerouted"
    for call in other.calls():
        if call.routes is not None and call.routes_from == 0:
            call.routes = call.routes.copy()
            call.routes[0] = (call.routes[0] + 1) % 8  # the first token routed otherwise
    model, _ = moe
    samples = build_samples([build_rows(episode), build_rows(other)])
    learner = HFLearner(copy.deepcopy(model), LearnerSettings(tree_scope="step"))
    batches = learner.batches_with_samples(samples)
    assert all(batch.routes is not None for batch, _ in batches)
    assert learner.routes.tree_fallbacks == 1  # one trie would have held both first tokens
    samples[0].routes = None
    learner.batches_with_samples(samples)
    assert learner.routes.rows_without == 1
