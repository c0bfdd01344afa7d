"""Tree-packed, row-wise and per-call training are the same computation: per-token logprobs, the
loss and every parameter's gradient agree (float64 within 1e-9 relative, float32 within 1e-5).

Errors are norm-wise. In float64 they are relative to the compared quantity itself. In float32 a
loss or gradient that is a sum of terms of both signs can cancel to far below its terms (a
first-layer query gradient of a 4-token batch is 200 times smaller than its terms), and rounding
is relative to the terms, so the scale is the larger of the quantity and the same quantity with
every advantage made positive.

A gradient is also allowed an absolute error of the tolerance times the norm of the whole
gradient (every parameter): all parameters' gradients come out of one backward pass whose
rounding is relative to the values flowing through it, so one parameter whose gradient cancels to
near zero (reached only by tokens whose terms nearly cancel) carries rounding of the size of the
whole, not of itself.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgrove.batch import PackSettings, build_samples, pack
from callgrove.batch.tree import TreeSettings, pack_micro_batches, pack_samples
from callgrove.episode import Agent, Call, Episode, load, sampling_record
from callgrove.rows import build_rows
from callgrove.train import (
    NORMALISATIONS,
    LossSettings,
    ModelBatch,
    micro_batch_model_batch,
    policy_loss,
    row_logprobs,
    tree_model_batch,
)
from callgrove.train.loss import predictions

from .helpers import (
    EXAMPLES,
    episode_rows_of,
    episodes,
    give_advantages,
    per_call_batch,
    row_batch,
    sample_near_the_model,
    seed_episode_rows,
    tiny_model,
    trained_calls,
    tree_batch,
)

TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5}
LOSS_SETTINGS = [
    LossSettings(normalisation=normalisation, entropy_coef=entropy_coef)
    for normalisation in NORMALISATIONS
    for entropy_coef in (0.0, 0.1)  # 0.1: an entropy bonus on every trained token
]


def loss_and_gradients(model, batch: ModelBatch, loss_settings: LossSettings):
    model.zero_grad()
    loss = policy_loss(model, batch, loss_settings)
    loss.backward()
    return loss.detach(), {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def unsigned_loss_and_gradients(model, batch: ModelBatch, loss_settings: LossSettings):
    """The loss and gradients with every advantage positive: the size of the terms summed."""
    values = {**batch.target_values, "advantages": batch.target_values["advantages"].abs()}
    return loss_and_gradients(model, replace(batch, target_values=values), loss_settings)


def whole_norm(grads: dict[str, torch.Tensor]) -> float:
    """The norm of a gradient over every parameter."""
    return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()])).item()


def assert_close(
    got: torch.Tensor,
    want: torch.Tensor,
    tolerance: float,
    what: str,
    terms=None,
    whole: float = 0.0,
) -> None:
    """Norm-wise: |got - want| <= tolerance * (scale + whole), the scale being `want` (or its
    unsigned `terms` when larger) and `whole` an absolute floor (see the module docstring)."""
    scale = torch.linalg.vector_norm(want).item()
    if terms is not None:
        scale = max(scale, torch.linalg.vector_norm(terms).item())
    error = torch.linalg.vector_norm(got - want).item()
    allowed = tolerance * (scale + whole)
    if allowed == 0:  # nothing to scale by: the tolerance is absolute
        allowed = tolerance
    assert error <= allowed, (
        f"{what}: error {error:.3g} over {allowed:.3g} "
        f"(tolerance {tolerance:g} x (scale {scale:.3g} + whole gradient {whole:.3g}))"
    )


def assert_same_training(
    episode_rows,
    dtype: torch.dtype,
    scope: str,
    seed: int = 0,
    expect_gradient: bool = True,
    model=None,
    tolerance: float | None = None,
) -> None:
    """`expect_gradient`: some ratio is unclipped, so some parameter gets a gradient (a random
    episode may train a single token whose ratio is clipped, or nothing at all). `model`
    (default: the tiny reference decoder) takes token ids, position ids and a layout."""
    tolerance = tolerance or TOLERANCE[dtype]
    model = model or tiny_model(dtype)
    sample_near_the_model(model, episode_rows, seed)
    tree, rows = tree_batch(episode_rows, scope), row_batch(episode_rows)
    assert tree.num_tokens <= rows.num_tokens
    if not trained_calls(episode_rows):  # every trained call sits in a duplicate row
        assert len(tree.target_index) == len(rows.target_index) == 0
        assert policy_loss(model, tree).item() == 0.0
        return
    calls = per_call_batch(episode_rows)

    with torch.no_grad():
        tree_logprobs = row_logprobs(model, tree)
        rowwise_logprobs = row_logprobs(model, rows)
        call_logprobs = row_logprobs(model, calls)
    assert len(tree_logprobs) == len(rowwise_logprobs)
    for r, (got, want) in enumerate(zip(tree_logprobs, rowwise_logprobs, strict=True)):
        assert_close(got, want, tolerance, f"logprobs of row {r}")
    # Each trained call alone, with its prompt as context, gives its row's logprobs.
    call_rows = [
        (row_number, call)
        for row_number, (er, row) in enumerate(all_rows(episode_rows))
        for call in er.loss_calls(row)
    ]
    for (row_number, call), alone in zip(call_rows, call_logprobs, strict=True):
        in_row = rowwise_logprobs[row_number][call.prompt_len : call.full_len]
        assert_close(alone[call.prompt_len :], in_row, tolerance, f"logprobs of call {call.id}")

    for loss_settings in LOSS_SETTINGS:
        normalisation = f"{loss_settings.normalisation} (entropy {loss_settings.entropy_coef})"
        tree_loss, tree_grads = loss_and_gradients(model, tree, loss_settings)
        row_loss, row_grads = loss_and_gradients(model, rows, loss_settings)
        references = [("row-wise", row_loss, row_grads)]
        # a row's own mean differs from its calls' own means
        if loss_settings.normalisation == "token":
            references.append(("per-call", *loss_and_gradients(model, calls, loss_settings)))
        terms_loss, terms_grads = (
            unsigned_loss_and_gradients(model, rows, loss_settings)
            if dtype == torch.float32
            else (None, {})
        )
        for name, loss, grads in references:
            assert_close(tree_loss, loss, tolerance, f"{normalisation} loss vs {name}", terms_loss)
            if expect_gradient:
                assert any(grad.abs().max() > 0 for grad in grads.values())
            whole = whole_norm(terms_grads or grads)
            for param, grad in grads.items():
                what = f"{normalisation} grad {param} vs {name}"
                assert_close(
                    tree_grads[param], grad, tolerance, what, terms_grads.get(param), whole
                )


def all_rows(episode_rows):
    """(its episode's rows, the row) for every row."""
    return [(er, row) for er in episode_rows for row in er.rows]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_login_bug_trains_the_same_tree_packed_row_wise_and_per_call(dtype):
    episode_rows = seed_episode_rows()
    give_advantages(episode_rows)
    assert_same_training(episode_rows, dtype, scope="episode")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_group_packed_as_one_trie_trains_the_same(dtype):
    episode_rows = [build_rows(e) for e in load(EXAMPLES / "login_group.jsonl")]
    give_advantages(episode_rows, seed=1)
    assert_same_training(episode_rows, dtype, scope="group")


def test_siblings_in_a_trie_are_each_scored_under_their_own_cut():
    """Two completions of one prompt, sampled at top-p 0.8: in a trie both tokens are predicted
    by the prompt's last node. The likeliest token is in the nucleus, the least likely far
    outside it (kept in only because it is scored); neither may keep the other in, or the
    tree would score them differently from the rows that hold them apart."""
    model = tiny_model(torch.float64)

    def episode_rows_completing(prompt: list[int], tokens: list[int]):
        leader = Agent("L", "leader")
        for number, token in enumerate(tokens, start=1):
            leader.add(Call.make(f"C{number}", number, prompt, [token], [-1.0]))
        return [build_rows(Episode("siblings", [leader], group="g", rewards={"r": 1.0}))]

    probing = episode_rows_completing([5, 9, 13], [1])
    give_advantages(probing)
    probe = row_batch(probing)
    with torch.no_grad():
        (after_prompt,) = predictions(model, probe, probe.target_index).log_distribution
    likeliest, least = int(after_prompt.argmax()), int(after_prompt.argmin())
    episode_rows = episode_rows_completing([5, 9, 13], [likeliest, least])
    give_advantages(episode_rows)
    for call in episode_rows[0].forest.calls:
        call.sampling = sampling_record(1.3, 0.8)
    tree, rows = tree_batch(episode_rows), row_batch(episode_rows)
    assert tree.num_tokens < rows.num_tokens  # the prompt is shared
    with torch.no_grad():
        scored_in_tree = predictions(model, tree, tree.target_index, scored=True).logprobs()
        scored_in_rows = predictions(model, rows, rows.target_index, scored=True).logprobs()
    torch.testing.assert_close(scored_in_tree, scored_in_rows, rtol=0, atol=1e-10)
    assert_same_training(episode_rows, torch.float64, "episode")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes(), st.integers(1, 2), st.integers(0, 2**16))
def test_random_forests_train_the_same_tree_packed_row_wise_and_per_call(
    episode, max_identical, seed
):
    episode_rows = episode_rows_of(episode, max_identical)
    give_advantages(episode_rows, seed)
    for dtype in TOLERANCE:
        assert_same_training(episode_rows, dtype, "episode", seed, expect_gradient=False)


@pytest.mark.parametrize("entropy_coef", [0.0, 0.1])
@pytest.mark.parametrize("normalisation", NORMALISATIONS)
def test_micro_batches_with_the_step_denominator_add_up_to_the_tree_loss(
    normalisation, entropy_coef
):
    episode_rows = [build_rows(e) for e in load(EXAMPLES / "login_group.jsonl")]
    give_advantages(episode_rows, seed=2)
    model = tiny_model(torch.float64)
    sample_near_the_model(model, episode_rows, seed=2)
    samples = build_samples(episode_rows)
    micro_batches = pack(samples, PackSettings(seq_len=80)).micro_batches
    assert len(micro_batches) > 1
    if normalisation == "token":
        denominator = sum(s.num_loss_tokens for s in samples)
    else:
        denominator = sum(1 for s in samples if s.num_loss_tokens)
    loss_settings = LossSettings(normalisation=normalisation, entropy_coef=entropy_coef)
    model.zero_grad()
    for micro_batch in micro_batches:
        batch = micro_batch_model_batch(micro_batch)
        policy_loss(model, batch, loss_settings, denominator).backward()
    summed = {name: p.grad.clone() for name, p in model.named_parameters()}
    tree_loss, tree_grads = loss_and_gradients(
        model, tree_batch(episode_rows, "group"), loss_settings
    )
    with torch.no_grad():
        parts = [
            policy_loss(model, micro_batch_model_batch(mb), loss_settings, denominator)
            for mb in micro_batches
        ]
    assert_close(sum(parts), tree_loss, 1e-9, "summed micro-batch loss")
    for name, grad in summed.items():
        assert_close(grad, tree_grads[name], 1e-9, f"summed micro-batch grad {name}")


def step_scope_loss_and_gradients(model, episode_rows, loss_settings: LossSettings, budget: int):
    """Tree scope `step`: the rows dealt into tries of at most `budget` nodes, each micro-batch's
    loss over the step's denominator, gradients accumulated; (loss, grads, micro-batches)."""
    samples = [s for er in episode_rows for s in build_samples(er)]
    dealt = pack_micro_batches(samples, TreeSettings(scope="step"), budget)
    if loss_settings.normalisation == "token":
        denominator = max(sum(s.num_loss_tokens for s in samples), 1)
    else:
        denominator = max(sum(1 for s in samples if s.num_loss_tokens), 1)
    model.zero_grad()
    total = torch.zeros((), dtype=torch.float64)
    for tree, _ in dealt:
        loss = policy_loss(model, tree_model_batch(tree), loss_settings, denominator)
        if loss.requires_grad:
            loss.backward()
        total = total + loss.detach().double()
    grads = {
        name: torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
        for name, p in model.named_parameters()
    }
    return total, grads, dealt


def assert_step_scope_trains_the_same(episode_rows, dtype, budget: int, seed: int = 0) -> int:
    """Step-scope micro-batches give the row-wise loss and gradients; returns their number."""
    tolerance = TOLERANCE[dtype]
    model = tiny_model(dtype)
    sample_near_the_model(model, episode_rows, seed)
    rows = row_batch(episode_rows)
    dealt = []
    for loss_settings in LOSS_SETTINGS:
        want_loss, want_grads = loss_and_gradients(model, rows, loss_settings)
        got_loss, got_grads, dealt = step_scope_loss_and_gradients(
            model, episode_rows, loss_settings, budget
        )
        what = f"step scope {loss_settings.normalisation} (entropy {loss_settings.entropy_coef})"
        terms_loss, terms_grads = (
            unsigned_loss_and_gradients(model, rows, loss_settings)
            if dtype == torch.float32
            else (None, {})
        )
        assert_close(got_loss.to(want_loss.dtype), want_loss, tolerance, f"{what} loss", terms_loss)
        whole = whole_norm(terms_grads or want_grads)
        for param, grad in want_grads.items():
            assert_close(
                got_grads[param],
                grad,
                tolerance,
                f"{what} grad {param}",
                terms_grads.get(param),
                whole,
            )
    return len(dealt)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_step_scope_shares_across_groups_and_trains_the_same(dtype):
    """The login group's episodes, each its own group: group scope cannot share their task
    prompt, step scope forwards it once per micro-batch; the same loss and gradients either way,
    also dealt into several micro-batches."""
    episodes = list(load(EXAMPLES / "login_group.jsonl"))
    for number, episode in enumerate(episodes):
        episode.group = f"own-{number}"
    episode_rows = [build_rows(e) for e in episodes]
    give_advantages(episode_rows, seed=3)
    samples = [s for er in episode_rows for s in build_samples(er)]
    whole = sum(s.num_tokens for s in samples)
    ((step, _),) = pack_micro_batches(samples, TreeSettings(scope="step"), whole)
    assert step.num_tokens < pack_samples(samples, TreeSettings(scope="group")).num_tokens
    assert assert_step_scope_trains_the_same(episode_rows, dtype, budget=whole) == 1
    assert assert_step_scope_trains_the_same(episode_rows, dtype, budget=step.num_tokens // 2) > 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(episodes(), min_size=2, max_size=3), st.integers(1, 64), st.integers(0, 2**16))
def test_random_groups_train_the_same_in_step_scope_micro_batches(drawn, budget, seed):
    for number, episode in enumerate(drawn):
        episode.id, episode.group = f"e{number}", f"g{number % 2}"
    episode_rows = [er for episode in drawn for er in episode_rows_of(episode, 2)]
    give_advantages(episode_rows, seed)
    if not trained_calls(episode_rows):
        return
    for dtype in TOLERANCE:
        assert_step_scope_trains_the_same(episode_rows, dtype, budget, seed)
