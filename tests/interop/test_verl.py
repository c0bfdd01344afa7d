"""verl 0.9.1's vanilla policy loss (`core_algos.compute_policy_loss_vanilla`, which imports on
CPU) on a `DataProto` made by the adapter, with log-probabilities of a random Llama forwarded
on its `input_ids` / `attention_mask` / `position_ids`, is callgrove's reference loss on the
same samples (float64, within 1e-6, value and every gradient)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from callgrove.interop.verl import to_data_proto
from callgrove.train import LossSettings
from callgrove.train.loss import policy_terms
from train.helpers import row_batch

from .trainer_samples import TEMPERATURE, plain_copy, reference_model, trainer_samples

TOLERANCE = 1e-6
PAD = 0
NORMALISATION = {"token-mean": "token", "seq-mean-token-mean": "sequence"}


def response_logprobs(model, batch) -> torch.Tensor:
    """Each response token's log-probability, as verl's actor reads it from the logits."""
    responses = batch.batch["responses"]
    logits = model(
        input_ids=batch.batch["input_ids"],
        attention_mask=batch.batch["attention_mask"],
        position_ids=batch.batch["position_ids"],
    ).logits
    width = responses.shape[1]
    predicting = logits[:, -width - 1 : -1] / batch.meta_info["temperature"]
    return torch.log_softmax(predicting, dim=-1).gather(-1, responses[..., None])[..., 0]


@pytest.mark.parametrize(
    ("loss_agg_mode", "temperature"),
    [(m, TEMPERATURE) for m in sorted(NORMALISATION)] + [("token-mean", 0.7)],
)
def test_verl_policy_loss_and_gradients_are_callgroves(loss_agg_mode, temperature):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    reference = reference_model(torch.float64)
    episode_rows, samples = trainer_samples(reference, seed=5, temperature=temperature)
    settings = LossSettings(normalisation=NORMALISATION[loss_agg_mode])
    want = policy_terms(reference, row_batch(episode_rows), settings).loss
    want.backward()

    model = plain_copy(reference)
    batch = to_data_proto(samples, PAD)
    config = OmegaConf.create(
        {
            "clip_ratio": settings.clip_low,
            "clip_ratio_low": settings.clip_low,
            "clip_ratio_high": settings.clip_high,
            "clip_ratio_c": 1e9,  # no dual clip: callgrove's loss has none
            "global_batch_info": {},
        }
    )
    got, _ = get_policy_loss_fn("vanilla")(
        old_log_prob=batch.batch["old_log_probs"],
        log_prob=response_logprobs(model, batch),
        advantages=batch.batch["advantages"],
        response_mask=batch.batch["response_mask"],
        loss_agg_mode=loss_agg_mode,
        config=config,
    )
    got.backward()

    assert batch.meta_info["temperature"] == pytest.approx(temperature)
    assert abs(got.item() - want.item()) <= TOLERANCE * abs(want.item())
    wanted = {name: p.grad for name, p in reference.model.named_parameters()}
    whole = torch.cat([g.flatten() for g in wanted.values()]).norm()
    for name, parameter in model.named_parameters():
        error = (parameter.grad - wanted[name]).norm()
        assert error <= TOLERANCE * max(wanted[name].norm(), whole), name


def test_the_data_proto_has_the_keys_verls_actor_reads_with_the_samples_values():
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference)
    batch = to_data_proto(samples, PAD)
    rows = len(samples)
    prompt_width, response_width = (
        batch.batch["prompts"].shape[1],
        batch.batch["responses"].shape[1],
    )
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert batch.batch[key].shape == (rows, prompt_width + response_width)
    for key in ("response_mask", "advantages", "rollout_log_probs", "token_level_scores"):
        assert batch.batch[key].shape == (rows, response_width)
    assert list(batch.non_tensor_batch["uid"]) == [s.group for s in samples]
    for index, sample in enumerate(samples):
        trained = np.flatnonzero(sample.loss_mask)
        real = batch.batch["attention_mask"][index].bool()
        assert (
            batch.batch["input_ids"][index][real].tolist()
            == sample.token_ids[: trained[-1] + 1].tolist()
        )
        assert batch.batch["position_ids"][index][real].tolist() == list(range(int(real.sum())))
        mask = batch.batch["response_mask"][index].bool()
        assert np.array_equal(
            batch.batch["advantages"][index][mask].numpy(), sample.advantages[trained]
        )
        assert np.array_equal(
            batch.batch["rollout_log_probs"][index][mask].numpy(), sample.logprobs[trained]
        )
        scores = batch.batch["token_level_scores"][index]
        last = int(
            batch.batch["responses"].shape[1]
            - 1
            - (batch.batch["attention_mask"][index].flip(0).argmax())
        )
        assert scores[last].item() == pytest.approx(sample.reward) and scores.count_nonzero() <= 1
