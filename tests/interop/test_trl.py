"""TRL 1.16's own GRPO loss (`GRPOTrainer.compute_loss`) on `trl_batch` is the reference loss
(tests/interop/reference_loss.py) on the same samples, value and every gradient, and
`SamplesGRPOTrainer` refuses what it could not train as sampled.

TRL's fused LM head accumulates the log-softmax in float32 whatever the model's dtype, so on a
float64 model the two agree to float32 rounding of the log-probabilities, not to float64's
(docs/trainers-trl.md has the figures): hence 1e-5."""

from __future__ import annotations

import functools
import tempfile
from dataclasses import replace

import numpy as np
import pytest
import torch

from callgrove.batch import Sample, build_samples
from callgrove.episode import sampling_record
from callgrove.formats.problems import InputError
from callgrove.interop.settings_check import SettingsRefused
from callgrove.interop.trl import SamplesGRPOTrainer, check_temperature, trl_batch
from train.helpers import row_batch

from .reference_loss import Agreement, Clip, agreement, clipped_share, reference_loss, token_terms
from .trainer_samples import (
    SOURCES,
    TEMPERATURE,
    first_loss_call,
    plain_copy,
    reference_model,
    trainer_samples,
)
from .trl_ranks import grpo_config, login_samples, word_tokenizer

pytestmark = pytest.mark.hf

TOLERANCE = 1e-5
PAD = 0
EPSILON, EPSILON_HIGH = 0.2, 0.25  # trl_ranks.grpo_config's clip range
MAX_COMPLETION_LENGTH = 512  # GRPOConfig's default, `dr_grpo`'s constant


def reference(model, samples, loss_type: str, delta: float | None) -> torch.Tensor:
    """The reference loss under each TRL loss type's normalisation (TRL 1.16 `_compute_loss`):
    `dapo` and `bnpo` (one micro-batch) average over trained tokens, `grpo` within each sample
    and then over samples, `dr_grpo` divides the sum by rows x max_completion_length, `luspo`
    averages each sample's sum."""
    clip = Clip(EPSILON, EPSILON_HIGH, dual_clip=delta)
    if loss_type in ("dapo", "bnpo"):
        return reference_loss(model, samples, replace(clip, normalisation="token"))
    if loss_type == "grpo":
        return reference_loss(model, samples, replace(clip, normalisation="sequence"))
    sums = torch.stack([token_terms(model, sample, clip).sum() for sample in samples])
    if loss_type == "dr_grpo":
        return sums.sum() / (len(samples) * MAX_COMPLETION_LENGTH)
    if loss_type == "luspo":
        return sums.mean()
    raise ValueError(f"no reference for loss_type {loss_type!r}")


@functools.cache
def stale_samples(source: str, temperature: float) -> tuple[torch.nn.Module, list[Sample]]:
    """The float64 model and samples of `source` sampled at `temperature` near its own
    logprobs (the same for every loss type: built once)."""
    model = reference_model(torch.float64)
    _, samples = trainer_samples(model, seed=3, temperature=temperature, source=source)
    return model, samples


@functools.cache
def check_some_ratios_clip(source: str, temperature: float, delta: float | None) -> None:
    model, samples = stale_samples(source, temperature)
    clip = Clip(EPSILON, EPSILON_HIGH, dual_clip=delta)
    share = clipped_share(plain_copy(model), samples, clip)
    if not 0 < share < 1:
        raise AssertionError(f"{share:.0%} of the ratios clip: clipping is not compared")


def measure(
    source: str, temperature: float, loss_type: str, delta: float | None = None
) -> Agreement:
    """TRL's own loss and gradient on a float64 Llama against the reference's, on stale samples
    of `source` sampled at `temperature`, under `loss_type` (and `delta`, TRL's dual clip)."""
    model, samples = stale_samples(source, temperature)
    check_some_ratios_clip(source, temperature, delta)
    want_model = plain_copy(model)
    want = reference(want_model, samples, loss_type, delta)
    want.backward()

    got_model = plain_copy(model)
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = SamplesGRPOTrainer(
            got_model,
            train_dataset=samples,
            # One generation batch of every sample, so that no remainder is refused.
            args=grpo_config(
                output_dir,
                loss_type,
                per_device_train_batch_size=len(samples),
                temperature=temperature,
                delta=delta,
            ),
            processing_class=word_tokenizer(),
        )
    trainer.model.eval()  # no gradient-accumulation scale outside a training loop
    got = trainer.compute_loss(trainer.model, trl_batch(samples, PAD, temperature))
    got.backward()
    return agreement(got, want, got_model, want_model)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo"])
def test_trl_loss_and_gradients_are_the_reference(source, temperature, loss_type):
    measured = measure(source, temperature, loss_type)
    assert measured.loss <= TOLERANCE and measured.gradient <= TOLERANCE, measured


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("loss_type", ["dr_grpo", "luspo"])
def test_trl_normalisations_by_rows_are_the_reference(source, loss_type):
    measured = measure(source, TEMPERATURE, loss_type)
    assert measured.loss <= TOLERANCE and measured.gradient <= TOLERANCE, measured


def test_trl_delta_is_the_dual_clip():
    # exp(+-0.3) bounds the stale ratios: 1.3 binds on some negative advantages, not all.
    sampled_by, samples = stale_samples("login", TEMPERATURE)
    model = plain_copy(sampled_by)
    with torch.no_grad():
        plain = reference_loss(model, samples, Clip(EPSILON, EPSILON_HIGH))
        dual = reference_loss(model, samples, Clip(EPSILON, EPSILON_HIGH, dual_clip=1.3))
    assert plain != dual
    measured = measure("login", TEMPERATURE, "dapo", delta=1.3)
    assert measured.loss <= TOLERANCE and measured.gradient <= TOLERANCE, measured


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


def completion_logprobs(model, batch, completion_mask) -> torch.Tensor:
    """Each completion token's log-probability, forwarded as TRL forwards the batch."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], completion_mask], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    width = batch["completion_ids"].shape[1]
    predicting = torch.log_softmax(logits[:, -width - 1 : -1], dim=-1)
    return predicting.gather(-1, batch["completion_ids"][..., None])[..., 0]


def test_holes_go_in_tool_mask_because_the_completion_mask_is_attention():
    from callgrove.train.loss import row_logprobs

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
    assert torch.allclose(right[trained], want, rtol=0, atol=1e-6)
    assert ((holed[trained] - want).abs() > 1e-3).sum() > 0


def samples_trainer(tmp_path, samples=None, loss_type: str = "dapo", model=None, **settings):
    samples = login_samples(20) if samples is None else samples
    return SamplesGRPOTrainer(
        plain_copy(reference_model(torch.float32)) if model is None else model,
        train_dataset=samples,
        args=grpo_config(tmp_path / "trl", loss_type, **settings),
        processing_class=word_tokenizer(),
    )


@pytest.mark.parametrize("taken", ["reward_funcs", "eval_dataset"])
def test_the_samples_trainer_refuses_what_it_would_not_use(tmp_path, taken):
    with pytest.raises(TypeError, match=f"takes no {taken}"):
        SamplesGRPOTrainer(
            plain_copy(reference_model(torch.float32)),
            train_dataset=login_samples(20),
            args=grpo_config(tmp_path, "dapo"),
            processing_class=word_tokenizer(),
            **{taken: login_samples(20)},
        )


@pytest.mark.parametrize(
    ("settings", "refused"),
    [
        ({"loss_type": "cispo"}, "loss_type: 'cispo' does not weight each token by the clipped"),
        ({"loss_type": "sapo"}, "loss_type: 'sapo'"),
        ({"loss_type": "vespo"}, "loss_type: 'vespo'"),
        ({"beta": 0.04}, "beta: adds a KL term"),
        ({"use_vllm": True}, "use_vllm: starts a generation engine"),
        ({"importance_sampling_level": "sequence"}, "importance_sampling_level: 'sequence'"),
        ({"top_entropy_quantile": 0.2}, "top_entropy_quantile: drops"),
        ({"off_policy_mask_threshold": 0.5}, "off_policy_mask_threshold: drops"),
        ({"entropy_coef": 0.01}, "entropy_coef: adds an entropy bonus"),
        ({"use_adaptive_entropy": True}, "entropy_coef: adds an entropy bonus"),
        ({"delta": 1.25}, r"delta: at or below 1 \+ epsilon_high \(1.25\)"),
        ({"remove_unused_columns": True}, "remove_unused_columns: would remove"),
        ({"temperature": 0.7}, r"sampled at temperature 1, the trainer scores at 0.7"),
    ],
)
def test_settings_under_which_trl_loss_is_not_the_recorded_ratio_are_refused(
    tmp_path, settings, refused
):
    loss_type = settings.pop("loss_type", "dapo")
    with pytest.raises(ValueError, match=refused):
        samples_trainer(tmp_path, loss_type=loss_type, **settings)


def test_every_bad_setting_is_named_in_one_error(tmp_path):
    with pytest.raises(SettingsRefused) as refused:
        samples_trainer(
            tmp_path, loss_type="cispo", beta=0.04, top_entropy_quantile=0.2, temperature=0.7
        )
    message = str(refused.value)
    for named in (
        "GRPOConfig loss_type: 'cispo'",
        "GRPOConfig beta: adds a KL term",
        "GRPOConfig top_entropy_quantile: drops",
        "GRPOConfig temperature: the samples were sampled at temperature 1, the trainer scores",
    ):
        assert named in message, (named, message)
    assert refused.value.exit_code == 2  # a usage error: nothing was trained


def test_unknown_sampling_is_refused_as_every_adapter_refuses_it(tmp_path):
    """Not as samples "sampled at temperature nan": the run's settings must be filled in."""
    episode_rows, _ = trainer_samples(reference_model(torch.float64))
    first_loss_call(episode_rows).sampling = None
    samples = [sample for sample in build_samples(episode_rows) if sample.num_loss_tokens]
    for refuse in (
        lambda: check_temperature(samples, TEMPERATURE),
        lambda: samples_trainer(tmp_path, samples),
        lambda: trl_batch(samples, PAD, TEMPERATURE),
    ):
        with pytest.raises(
            InputError, match=r"sampling is unknown.*\(fill_unknown_sampling\)"
        ) as refused:
            refuse()
        assert "nan" not in str(refused.value)
        assert refused.value.problem.episode == episode_rows[0].episode.id


def test_a_remainder_the_loss_type_cannot_train_exactly_is_refused_with_a_batch_that_fits(
    tmp_path,
):
    # 20 samples in generation batches of 8: 4 would not train; 10 is the nearest that fits.
    with pytest.raises(ValueError, match=r"4 samples would not train.*batch_size=10 does"):
        samples_trainer(tmp_path, loss_type="grpo", per_device_train_batch_size=8)
    with pytest.raises(ValueError, match=r"3 samples would not train.*no per_device_train_batch"):
        samples_trainer(tmp_path, login_samples(19), "bnpo", per_device_train_batch_size=4)


def test_a_pass_gives_each_sample_once_and_fills_only_the_last_generation_batch(tmp_path):
    samples = login_samples(20)
    # Generation batches of 8 (4 per step x 2 steps), each read 2 x 2 times: 8, 8, 4 + 4 fillers.
    trainer = samples_trainer(tmp_path, samples, steps_per_generation=2, num_iterations=2, seed=11)
    loaded = [batch for batch in trainer.get_train_dataloader()]
    assert all(len(batch) == 8 for batch in loaded)
    repeats = trainer.num_iterations * trainer.args.steps_per_generation
    generations = loaded[::repeats]
    for start, generation in enumerate(generations):
        assert all(batch == generation for batch in loaded[start * repeats : (start + 1) * repeats])
    fills = [[row["fills_the_generation_batch"] for row in batch] for batch in generations]
    assert [sum(batch) for batch in fills] == [0, 0, 4]
    seen = sorted(
        (row["episode"], row["row"])
        for batch in generations
        for row in batch
        if not row["fills_the_generation_batch"]
    )
    assert seen == sorted((sample.episode, sample.row) for sample in samples)


def test_token_ids_outside_the_model_vocabulary_are_refused(tmp_path):
    samples = login_samples(20)
    outside = samples[5]
    token_ids = outside.token_ids.copy()
    token_ids[3] = 80  # the tiny Llama's vocabulary is 0..79
    samples[5] = replace(outside, token_ids=token_ids)
    with pytest.raises(
        InputError, match="token id 80 at position 3, outside the model's"
    ) as refused:
        samples_trainer(tmp_path, samples)
    assert refused.value.problem.episode == outside.episode


def test_a_router_load_balancing_loss_is_refused(tmp_path):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=80,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=2,
        num_experts_per_tok=1,
        router_aux_loss_coef=0.01,
    )
    with pytest.raises(ValueError, match=r"router_aux_loss_coef=0.0"):
        samples_trainer(tmp_path, model=MixtralForCausalLM(config))
    # Without it the loss is the policy loss alone: the trainer builds.
    samples_trainer(tmp_path, model=MixtralForCausalLM(config), router_aux_loss_coef=0.0)
