"""Episodes, advantages and the three ways of batching them that must agree: tree-packed,
row-wise (varlen micro-batch) and one sequence per trained call with its prompt as context."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch
from hypothesis import strategies as st

from callgrove.batch import PackSettings, build_samples, pack
from callgrove.batch.samples import FIELD_DTYPES, SAMPLING_FIELDS, UNSAMPLED, VALUE_DTYPE
from callgrove.batch.tree import TreeSettings, pack_samples
from callgrove.episode import Agent, Call, Episode, load, sampling_record
from callgrove.networks.sizes import TinyConfig
from callgrove.networks.tiny import TinyDecoder
from callgrove.rows import EpisodeRows, RowSettings, build_rows
from callgrove.train import (
    ModelBatch,
    micro_batch_model_batch,
    packed_model_batch,
    tree_model_batch,
)
from callgrove.train.loss import predictions

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VOCAB = 80  # the bundled examples use ids below 80
CONFIG = TinyConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2, d_ff=32)


def tiny_model(dtype: torch.dtype, seed: int = 0) -> TinyDecoder:
    torch.manual_seed(seed)
    return TinyDecoder(CONFIG).to(dtype)


def seed_episode_rows() -> list[EpisodeRows]:
    (episode,) = load(EXAMPLES / "login_bug.jsonl")
    return [build_rows(episode)]


# The distributions calls are sampled from here: every layout must score each trained token
# under its own call's (temperature, top-p), whatever rows it shares with other calls.
SAMPLINGS = [sampling_record(t, p) for t, p in ((1.0, 1.0), (0.7, 1.0), (0.5, 0.9), (1.3, 0.8))]


def give_advantages(episode_rows: list[EpisodeRows], seed: int = 0) -> None:
    """A scalar advantage on some calls and one per completion token on the others, and each
    call sampled at one of `SAMPLINGS`."""
    rng = np.random.default_rng(seed)
    distributions = np.random.default_rng(seed + 1000)
    for er in episode_rows:
        for call in er.forest.calls:
            per_token = rng.random() < 0.5
            values = rng.normal(size=len(call.completion_ids))
            call.advantages = values if per_token else float(values[0])
            call.sampling = SAMPLINGS[int(distributions.integers(len(SAMPLINGS)))]


def tree_batch(episode_rows: list[EpisodeRows], scope: str = "episode") -> ModelBatch:
    samples = [s for er in episode_rows for s in build_samples(er)]
    return tree_model_batch(pack_samples(samples, TreeSettings(scope=scope)))


def row_batch(episode_rows: list[EpisodeRows]) -> ModelBatch:
    """All rows in one varlen micro-batch, through the packer."""
    samples = [s for er in episode_rows for s in build_samples(er)]
    packed = pack(samples, PackSettings(seq_len=sum(s.num_tokens for s in samples)))
    (micro_batch,) = packed.micro_batches
    assert np.array_equal(micro_batch.samples, np.arange(len(samples)))
    return micro_batch_model_batch(micro_batch)


def trained_calls(episode_rows: list[EpisodeRows]) -> list[Call]:
    """Every call with loss tokens, in row order (each sits in exactly one row's loss)."""
    return [call for er in episode_rows for row in er.rows for call in er.loss_calls(row)]


def per_call_batch(episode_rows: list[EpisodeRows]) -> ModelBatch:
    """Each trained call on its own: its prompt as context, loss on its completion."""
    tokens, masks, logprobs, advantages = [], [], [], []
    sampling: dict[str, list[np.ndarray]] = {name: [] for name in SAMPLING_FIELDS}
    for er in episode_rows:
        for call in (call for row in er.rows for call in er.loss_calls(row)):
            mask = np.zeros(call.full_len, dtype=np.uint8)
            mask[call.prompt_len :] = 1
            tokens.append(er.episode.full_ids(call))
            masks.append(mask)
            # Samples carry float32 values; the reference reads the same numbers.
            per_token = np.zeros(call.full_len, dtype=VALUE_DTYPE)
            per_token[call.prompt_len :] = call.logprobs
            logprobs.append(per_token)
            per_token = np.zeros(call.full_len, dtype=VALUE_DTYPE)
            per_token[call.prompt_len :] = call.advantages
            advantages.append(per_token)
            for name, key in SAMPLING_FIELDS.items():
                per_token = np.full(call.full_len, UNSAMPLED[name], dtype=FIELD_DTYPES[name])
                value = (call.sampling or {}).get(key)
                per_token[call.prompt_len :] = UNSAMPLED[name] if value is None else value
                sampling[name].append(per_token)
    cu_seqlens = np.concatenate([[0], np.cumsum([len(t) for t in tokens])])
    values = {"logprobs": np.concatenate(logprobs), "advantages": np.concatenate(advantages)}
    values |= {name: np.concatenate(parts) for name, parts in sampling.items()}
    return packed_model_batch(
        np.concatenate(tokens), cu_seqlens, np.concatenate(masks), None, values
    )


def sample_near_the_model(model: TinyDecoder, episode_rows: list[EpisodeRows], seed: int) -> None:
    """Sampling logprobs within +-0.3 of the model's own, so that some importance ratios are
    clipped and some are not (far-off logprobs would clip nearly everything)."""
    calls = trained_calls(episode_rows)
    if not calls:
        return
    batch = per_call_batch(episode_rows)
    with torch.no_grad():  # under each call's own distribution
        own = predictions(model, batch, batch.target_index, scored=True).logprobs()
    rng = np.random.default_rng(seed)
    ends = np.cumsum([len(call.completion_ids) for call in calls])
    for call, completion in zip(calls, np.split(own.double().numpy(), ends[:-1]), strict=True):
        call.logprobs = completion + rng.uniform(-0.3, 0.3, size=len(completion))


@st.composite
def episodes(draw) -> Episode:
    """A leader with fresh, forked and background subagents, compactions and twin rows; a small
    alphabet makes shared prefixes across trees common."""
    token = itertools.count(1)
    seq = itertools.count(1)
    alphabet = st.integers(1, draw(st.integers(2, VOCAB - 1)))
    words = st.lists(alphabet, min_size=1, max_size=4)

    def call(agent: Agent, history: Call | None, twin_of: Call | None = None) -> Call:
        # every prompt is given whole here: a call's tokens are its prompt and completion
        before = [] if history is None else [*history.prompt_suffix, *history.completion_ids]
        prompt = before + draw(words) if twin_of is None else twin_of.prompt_suffix.tolist()
        completion = draw(words) if twin_of is None else twin_of.completion_ids.tolist()
        logprobs = [-0.1 * (1 + next(token) % 9) for _ in completion]
        number = next(seq)
        return agent.add(Call.make(f"C{number}", number, prompt, completion, logprobs))

    leader = Agent("L", "leader")
    agents, last = [leader], {"L": call(leader, None)}
    for step in range(draw(st.integers(1, 10))):
        action = draw(st.sampled_from(["turn", "turn", "fork", "fresh", "compact", "twin"]))
        agent = draw(st.sampled_from(agents))
        calls = [c for a in agents for c in a.calls]
        if action in ("fork", "fresh"):
            agent = Agent(f"A{step}", "sub", "L", action, trainable=draw(st.booleans()))
            agents.append(agent)
            history = draw(st.sampled_from(calls)) if action == "fork" else None
            last[agent.id] = call(agent, history)
        elif action == "twin":
            call(agent, None, twin_of=draw(st.sampled_from(calls)))
        elif action == "compact":
            call(agent, last[agent.id])
            last[agent.id] = call(agent, None)
        else:
            last[agent.id] = call(agent, last[agent.id])
    return Episode("random", agents, group="g", rewards={"r": 1.0})


def episode_rows_of(episode: Episode, max_identical: int) -> list[EpisodeRows]:
    return [build_rows(episode, RowSettings(max_identical_trained=max_identical))]


def tiny_llama(dtype: torch.dtype, attention: str = "sdpa", seed: int = 0, vocab: int = VOCAB):
    """A randomly initialised small `LlamaForCausalLM` (grouped-query attention, no weight
    tying) with blockwise attention over `attention`, behind the reference interface."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from callgrove.networks.hf import HFPolicyModel
    from callgrove.networks.hf_attention import register_blockwise

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = LlamaForCausalLM(config).to(dtype)
    model.set_attn_implementation(register_blockwise(attention))
    return HFPolicyModel(model)
