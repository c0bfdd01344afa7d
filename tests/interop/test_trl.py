"""TRL 1.16's own GRPO loss on `trl_batch` is callgrove's reference loss on the same samples
(float64, within 1e-6, value and every gradient), and `SamplesGRPOTrainer` trains on samples.

TRL's fused LM head accumulates the log-softmax in float32 whatever the model's dtype, so the
two agree to float32 rounding of the log-probabilities (3e-8 to 7.8e-7 relative on the loss,
at most 7.5e-7 on a parameter's gradient here), not to float64's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from callgrove.batch import build_samples
from callgrove.episode import sampling_record
from callgrove.formats.problems import InputError
from callgrove.interop.trl import SamplesGRPOTrainer, trl_batch
from callgrove.train import LossSettings
from callgrove.train.loss import policy_terms, row_logprobs
from train.helpers import VOCAB, row_batch

from .trainer_samples import (
    TEMPERATURE,
    first_loss_call,
    plain_copy,
    reference_model,
    trainer_samples,
)

TOLERANCE = 1e-6
PAD = 0
# TRL's loss types and the normalisation of callgrove's loss each one is.
NORMALISATION = {"dapo": "token", "bnpo": "token", "grpo": "sequence"}


def word_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocabulary = {f"t{i}": i for i in range(VOCAB)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocabulary, unk_token="t0")),
        pad_token="t0",
        eos_token="t1",
    )


def grpo_config(tmp_path, loss_type: str, **more):
    from trl import GRPOConfig

    settings = {
        "output_dir": str(tmp_path / "trl"),
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "loss_type": loss_type,
        "beta": 0.0,
        "temperature": TEMPERATURE,
        "epsilon": 0.2,
        "report_to": "none",
        "use_cpu": True,
        "save_strategy": "no",
        "logging_steps": 1,
        "bf16": False,
    }
    return GRPOConfig(**(settings | more))


@pytest.mark.parametrize(
    ("loss_type", "temperature"),
    [(t, TEMPERATURE) for t in sorted(NORMALISATION)] + [("dapo", 0.7)],
)
def test_trl_loss_and_gradients_are_callgroves(tmp_path, loss_type, temperature):
    reference = reference_model(torch.float64)
    episode_rows, samples = trainer_samples(reference, seed=3, temperature=temperature)
    settings = LossSettings(normalisation=NORMALISATION[loss_type])
    want = policy_terms(reference, row_batch(episode_rows), settings).loss
    want.backward()
    # Some ratios are clipped, some are not: clipping is compared, not only the plain ratio.
    terms = policy_terms(reference, row_batch(episode_rows), settings)
    ratio = torch.exp(terms.logprobs - terms.sampler_logprobs)
    assert ((ratio - 1).abs() > 0.2).any() and ((ratio - 1).abs() < 0.2).any()

    model = plain_copy(reference)
    trainer = SamplesGRPOTrainer(
        model,
        train_dataset=samples,
        args=grpo_config(tmp_path, loss_type, temperature=temperature),
        processing_class=word_tokenizer(),
    )
    trainer.model.eval()  # no gradient-accumulation scale outside a training loop
    got = trainer.compute_loss(trainer.model, trl_batch(samples, PAD, temperature))
    got.backward()

    assert abs(got.item() - want.item()) <= TOLERANCE * abs(want.item())
    wanted = {name: p.grad for name, p in reference.model.named_parameters()}
    whole = torch.cat([g.flatten() for g in wanted.values()]).norm()
    for name, parameter in trainer.model.named_parameters():
        error = (parameter.grad - wanted[name]).norm()
        # As in tests/train/test_equivalence: one backward pass rounds relative to the whole.
        assert error <= TOLERANCE * max(wanted[name].norm(), whole), name


def test_the_batch_splits_rows_and_keeps_holes_out_of_the_loss_not_out_of_attention():
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference)
    batch = trl_batch(samples, PAD, TEMPERATURE)
    for index, sample in enumerate(samples):
        trained = np.flatnonzero(sample.loss_mask)
        start, end = trained[0], trained[-1] + 1
        prompt = batch["prompt_ids"][index][batch["prompt_mask"][index] == 1]
        assert prompt.tolist() == sample.token_ids[:start].tolist()
        attended = batch["completion_mask"][index] == 1
        assert (
            batch["completion_ids"][index][attended].tolist()
            == sample.token_ids[start:end].tolist()
        )
        loss = (batch["completion_mask"][index] * batch["tool_mask"][index]).bool()
        assert loss[attended].tolist() == sample.loss_mask[start:end].astype(bool).tolist()
        assert np.array_equal(batch["advantages"][index][loss].numpy(), sample.advantages[trained])
        assert np.array_equal(
            batch["old_per_token_logps"][index][loss].numpy(), sample.logprobs[trained]
        )
    assert int(batch["num_items_in_batch"]) == sum(s.num_loss_tokens for s in samples)


def test_samples_trl_cannot_score_are_refused():
    reference = reference_model(torch.float64)
    episode_rows, samples = trainer_samples(reference)
    with pytest.raises(ValueError, match=r"GRPOConfig\(temperature=1\)"):
        trl_batch(samples, PAD, temperature=0.7)
    call = first_loss_call(episode_rows)
    for sampling, reason in (
        (sampling_record(1.0, 0.9), "top-p or top-k cut"),
        (None, "sampling is unknown"),
        (sampling_record(0.5, 1.0), "at temperature .* TRL scores every token at one"),
    ):
        call.sampling = sampling
        with pytest.raises(InputError, match=reason) as refused:
            trl_batch(build_samples(episode_rows), PAD, TEMPERATURE)
        assert refused.value.problem.episode == episode_rows[0].episode.id


def test_a_grpo_trainer_step_from_samples_changes_the_weights(tmp_path):
    reference = reference_model(torch.float32)
    _, samples = trainer_samples(reference)
    model = plain_copy(reference)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = SamplesGRPOTrainer(
        model,
        train_dataset=samples,
        args=grpo_config(tmp_path, "dapo", max_steps=1, learning_rate=1e-2),
        processing_class=word_tokenizer(),
    )
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)
    (logged,) = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert np.isfinite(logged["loss"])


def completion_logprobs(model, batch, completion_mask) -> torch.Tensor:
    """Each completion token's log-probability, forwarded as TRL forwards the batch."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], completion_mask], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    width = batch["completion_ids"].shape[1]
    predicting = torch.log_softmax(logits[:, -width - 1 : -1], dim=-1)
    return predicting.gather(-1, batch["completion_ids"][..., None])[..., 0]


def test_holes_go_in_tool_mask_because_the_completion_mask_is_attention():
    reference = reference_model(torch.float64)
    episode_rows, samples = trainer_samples(reference)
    model = plain_copy(reference)
    batch = trl_batch(samples, PAD, TEMPERATURE)
    trained = (batch["completion_mask"] * batch["tool_mask"]).bool()
    with torch.no_grad():
        want = torch.cat(row_logprobs(reference, row_batch(episode_rows)))
        right = completion_logprobs(model, batch, batch["completion_mask"])
        # Holes put in the completion mask instead hide tool results from the later tokens.
        holed = completion_logprobs(model, batch, batch["completion_mask"] * batch["tool_mask"])
    want = want[torch.from_numpy(np.concatenate([s.loss_mask for s in samples]).astype(bool))]
    # TRL passes no position ids: a left-padded row's positions start at its padding. Rotary
    # attention sees only differences, which the HF Llama computes in float32 (hence 1e-6).
    assert torch.allclose(right[trained], want, rtol=0, atol=TOLERANCE)
    assert ((holed[trained] - want).abs() > 1e-3).sum() > 0


@pytest.mark.parametrize("taken", ["reward_funcs", "eval_dataset"])
def test_the_samples_trainer_refuses_what_it_would_not_use(tmp_path, taken):
    reference = reference_model(torch.float32)
    _, samples = trainer_samples(reference)
    with pytest.raises(TypeError, match=f"takes no {taken}"):
        SamplesGRPOTrainer(
            plain_copy(reference),
            train_dataset=samples,
            args=grpo_config(tmp_path, "dapo"),
            processing_class=word_tokenizer(),
            **{taken: samples},
        )
