"""verl 0.9.1's actor data path on the adapter's `DataProto` is the reference loss on the same
samples, with verl's dual clip in reach (float64; value and every gradient within 1e-5).

The batch goes the way `RayPPOTrainer._update_actor` sends it to the actor: the config's
rollout temperature into `meta_info`, `DataProto.to_tensordict`, `left_right_2_no_padding`
(the unpadded, nested `input_ids` / `position_ids`), the worker's mini-batches
(`tensordict_utils.make_iterator`), the engine's token count over the mini-batch and its
micro-batches (`prepare_micro_batches`, balanced by `seqlen_balancing` under dynamic batch
sizes), the FSDP LM-head engine's own `prepare_model_inputs` / `prepare_model_outputs` (the
packed forward with position ids, the temperature, `logprobs_from_logits`) and `ppo_loss`
with the actor's config, backward per micro-batch. What does not run here is written out
from verl's source, file and line named: `_update_actor` (its module imports torchdata and
cachetools, which the venv leaves out), and the engine's `forward_backward_batch` /
`forward_step` (a data-parallel all-reduce and a move to the accelerator).

Measured: 1e-9 to 6e-9 relative on the loss, at most 3.5e-8 on a parameter's gradient. That
is the floor of two attention implementations, not verl's: the HF Llama computes its RMS
norms in float32 whatever the model's dtype, so the same reference loss computed with the
trainer's sdpa copy, one sample at a time, is 8e-10 / 1.9e-8 from the reference's.
"""

from __future__ import annotations

import copy
import functools
import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from callgrove.batch.samples import Sample
from callgrove.formats.problems import InputError
from callgrove.interop.settings_check import SettingsRefused
from callgrove.interop.verl import KNOWN_KEYS, check_verl_config, to_data_proto

from .dual_clip import Case, assert_agrees, clip_shares, far_stale
from .reference_loss import Agreement, Clip, agreement, reference_loss
from .trainer_samples import SOURCES, plain_copy, reference_model, trainer_samples

PAD = 0
SEED = 5
NORMALISATION = {"token-mean": "token", "seq-mean-token-mean": "sequence"}
# Small enough that every batch splits into several micro-batches (the loss is normalised
# over the mini-batch, not per micro-batch), large enough for the longest sample.
MAX_TOKENS_PER_MICRO_BATCH = 256


@functools.cache
def default_trainer_config():
    import verl
    from omegaconf import OmegaConf

    return OmegaConf.load(
        Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    )


def trainer_config(
    temperature: float, batch_size: int, loss_agg_mode: str = "token-mean", unpadded: bool = True
):
    """verl's own default trainer config (its generated ppo_trainer.yaml), with the rollout
    temperature the samples were sampled at and one mini-batch of `batch_size` rows split into
    micro-batches by token count."""
    config = copy.deepcopy(default_trainer_config())
    section = config.actor_rollout_ref
    section.rollout.temperature = temperature
    section.model.use_remove_padding = unpadded
    section.actor.ppo_mini_batch_size = batch_size
    section.actor.use_dynamic_bsz = True
    section.actor.ppo_max_token_len_per_gpu = MAX_TOKENS_PER_MICRO_BATCH
    section.actor.loss_agg_mode = loss_agg_mode
    return config


def actor_config(config):
    """The actor's `FSDPActorConfig` from the config's actor section. verl builds it with
    hydra's `instantiate` (not installed): the fields its loss and engine read, one by one."""
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    actor = config.actor_rollout_ref.actor
    return FSDPActorConfig(
        strategy=actor.strategy,
        rollout_n=config.actor_rollout_ref.rollout.n,
        ppo_mini_batch_size=actor.ppo_mini_batch_size,
        use_dynamic_bsz=actor.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=actor.ppo_max_token_len_per_gpu,
        clip_ratio=actor.clip_ratio,
        clip_ratio_low=actor.clip_ratio_low,
        clip_ratio_high=actor.clip_ratio_high,
        clip_ratio_c=actor.clip_ratio_c,
        loss_agg_mode=actor.loss_agg_mode,
        loss_scale_factor=actor.loss_scale_factor,
        entropy_coeff=actor.entropy_coeff,
        calculate_entropy=actor.calculate_entropy,
        use_kl_loss=actor.use_kl_loss,
        policy_loss=PolicyLossConfig(loss_mode=actor.policy_loss.loss_mode),
        use_remove_padding=config.actor_rollout_ref.model.use_remove_padding,
    )


def lm_head_engine(model: torch.nn.Module, actor):
    """verl's FSDP engine for a model with an LM head, holding `model` itself. Its `__init__`
    builds torch.distributed device meshes and shards the model (not on a CPU), so the
    instance gets the attributes its forward methods read, set from the same engine config
    as `__init__` sets them (verl/workers/engine/fsdp/transformer_impl.py:189-190, 244, 252)."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    engine = object.__new__(FSDPEngineWithLMHead)
    engine.engine_config = actor.fsdp_config
    engine.module = model
    engine.pad_to_length = engine.engine_config.pad_to_length
    engine.pad_to_length_bucket = engine.engine_config.pad_to_length_bucket
    engine.ulysses_sequence_parallel_size = engine.engine_config.ulysses_sequence_parallel_size
    engine.use_ulysses_sp = engine.ulysses_sequence_parallel_size > 1
    return engine


def forward_backward(engine, data, loss_function) -> tuple[torch.Tensor, int]:
    """One mini-batch through the engine (`FSDPEngine.forward_backward_batch`,
    transformer_impl.py:724-770, on one data-parallel rank: no all-reduce): the token count it
    normalises by, its micro-batches, and per micro-batch `FSDPEngineWithLMHead.forward_step`
    (:1549-1591, less the move to the accelerator and bf16 autocast) and the backward. The
    loss summed over the micro-batches, and how many there were."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    tu.assign_non_tensor(data, sp_size=engine.ulysses_sequence_parallel_size)
    tu.assign_non_tensor(data, batch_num_tokens=data["loss_mask"].sum().item(), dp_size=1)
    micro_batches, _ = prepare_micro_batches(data=data, dp_group=None, same_micro_num_in_dp=True)
    total = torch.zeros((), dtype=torch.float64)
    for micro_batch in micro_batches:
        inputs, output_args = engine.prepare_model_inputs(micro_batch=micro_batch)
        output = engine.module(**inputs, use_cache=False)
        model_output = engine.prepare_model_outputs(
            output=output,
            output_args=output_args,
            micro_batch=micro_batch,
            logits_processor_func=loss_function,
        )
        loss, _ = loss_function(model_output=model_output, data=micro_batch, dp_group=None)
        loss.backward()
        total = total + loss.detach()
    return total, len(micro_batches)


def update_actor(model: torch.nn.Module, batch, config) -> tuple[torch.Tensor, int]:
    """The actor update's loss on `batch` (gradients left on `model`), and its micro-batch
    count: `RayPPOTrainer._update_actor` (verl/trainer/ppo/ray_trainer.py:1327-1369), then the
    actor worker's `train_mini_batch` and `train_batch` (verl/workers/engine_workers.py:243-396;
    the engine settings as `init_model` fills them in, :616-629) and the engine."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    rollout, actor = config.actor_rollout_ref.rollout, config.actor_rollout_ref.actor
    batch.meta_info["temperature"] = rollout.temperature  # over whatever the batch carried
    data = left_right_2_no_padding(batch.to_tensordict())
    mini_batch_size = actor.ppo_mini_batch_size * rollout.n
    tu.assign_non_tensor(
        data,
        calculate_entropy=actor.calculate_entropy or actor.entropy_coeff != 0.0,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=mini_batch_size,
        mini_batch_size=mini_batch_size,
        epochs=actor.ppo_epochs,
        seed=actor.data_loader_seed,
        dataloader_kwargs={"shuffle": actor.shuffle},
        compute_loss=True,
    )
    # the worker's mini-batches, one data-parallel rank
    mini_batches = list(
        tu.make_iterator(
            data,
            mini_batch_size=tu.pop(data, key="mini_batch_size"),
            epochs=tu.pop(data, key="epochs"),
            seed=tu.pop(data, key="seed"),
            dataloader_kwargs=tu.pop(data, key="dataloader_kwargs"),
        )
    )
    assert len(mini_batches) == 1, "one optimizer step's gradient is compared"
    mini_batch = mini_batches[0]
    settings = actor_config(config)
    tu.assign_non_tensor(
        mini_batch,
        use_remove_padding=settings.use_remove_padding,
        use_dynamic_bsz=actor.use_dynamic_bsz,
        max_token_len_per_gpu=actor.ppo_max_token_len_per_gpu,
        micro_batch_size_per_gpu=actor.ppo_micro_batch_size_per_gpu,
        use_fused_kernels=actor.use_fused_kernels,
    )
    engine = lm_head_engine(model, settings)
    return forward_backward(engine, mini_batch, partial(ppo_loss, config=settings))


def run_case(
    source: str, temperature: float, loss_agg_mode: str = "token-mean", unpadded: bool = True
) -> Case:
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference, seed=SEED, temperature=temperature, source=source)
    samples = far_stale(samples)
    config = trainer_config(temperature, len(samples), loss_agg_mode, unpadded)
    check_verl_config(config, samples)
    actor = config.actor_rollout_ref.actor
    clip = Clip(
        clip_low=actor.clip_ratio_low,
        clip_high=actor.clip_ratio_high,
        dual_clip=actor.clip_ratio_c,
        normalisation=NORMALISATION[loss_agg_mode],
    )
    want = reference_loss(reference.model, samples, clip)
    want.backward()
    model = plain_copy(reference)
    got, micro_batches = update_actor(model, to_data_proto(samples, PAD), config)
    return Case(
        agreement=agreement(got, want, model, reference.model),
        shares=clip_shares(reference.model, samples, clip),
        micro_batches=micro_batches,
    )


def measure(source: str, temperature: float) -> Agreement:
    """verl's actor loss against the reference on `source`'s samples at `temperature`: verl's
    default config (token-mean, dual clip 3), unpadded micro-batches."""
    return run_case(source, temperature).agreement


@pytest.mark.hf
@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("source", SOURCES)
def test_verls_actor_update_on_the_data_proto_is_the_reference_loss(source, temperature):
    assert_agrees(run_case(source, temperature))


@pytest.mark.hf
def test_padded_micro_batches_and_the_sequence_mean_are_the_reference_loss_too():
    assert_agrees(run_case("login", 0.7, "seq-mean-token-mean", unpadded=False))


@functools.cache
def login_samples() -> list[Sample]:
    """The login samples at temperature 1 (the checks below read them, never change them)."""
    return trainer_samples(reference_model(torch.float64), seed=SEED)[1]


def config_and_samples(temperature: float = 1.0):
    samples = login_samples()
    return trainer_config(temperature, len(samples)), samples


def test_the_default_config_at_the_samples_temperature_passes_whole_or_as_its_section():
    config, samples = config_and_samples()
    check_verl_config(config, samples)
    check_verl_config(config.actor_rollout_ref, samples)
    plain = {"rollout": {"temperature": 1.0}, "actor": {"loss_agg_mode": "seq-mean-token-mean"}}
    check_verl_config(plain, samples)
    bypass = config.actor_rollout_ref
    bypass.actor.policy_loss.loss_mode = "bypass_mode"
    bypass.actor.policy_loss.rollout_correction = {"loss_type": "ppo_clip", "rollout_rs": None}
    check_verl_config(bypass, samples)


@pytest.mark.parametrize(
    ("setting", "value", "refusal"),
    [
        ("rollout.temperature", 0.7, "rollout.temperature is 0.7 but the samples were"),
        ("actor.policy_loss.loss_mode", "gspo", "loss_mode is 'gspo'"),
        ("actor.loss_agg_mode", "token-sum", "loss_agg_mode is 'token-sum'"),
        ("actor.loss_agg_mode", "seq-mean-token-sum-norm", "loss_agg_mode is"),
        ("actor.entropy_coeff", 0.01, "entropy_coeff"),
        ("actor.use_kl_loss", True, "use_kl_loss"),
        (
            "actor.policy_loss.rollout_correction",
            {"loss_type": "reinforce"},
            "loss_type 'reinforce'",
        ),
        (
            "actor.policy_loss.rollout_correction",
            {"rollout_rs": "token_k1", "rollout_rs_threshold": 2.0},
            "rejection sampling",
        ),
    ],
)
def test_settings_that_change_the_actors_loss_are_refused(setting, value, refusal):
    from omegaconf import OmegaConf

    config, samples = config_and_samples()
    section = config.actor_rollout_ref
    if setting.startswith("actor.policy_loss.rollout_correction"):
        section.actor.policy_loss.loss_mode = "bypass_mode"
    OmegaConf.update(section, setting, value, force_add=True)
    with pytest.raises(ValueError, match=refusal):
        check_verl_config(config, samples)


def test_distillation_is_refused_in_a_whole_config():
    config, samples = config_and_samples()
    config.distillation.enabled = True
    with pytest.raises(ValueError, match="distillation"):
        check_verl_config(config, samples)


def test_every_refusal_is_named_at_once():
    config, samples = config_and_samples(temperature=0.5)
    config.actor_rollout_ref.actor.entropy_coeff = 0.1
    config.actor_rollout_ref.actor.use_kl_loss = True
    with pytest.raises(ValueError, match=r"temperature is 0\.5.*entropy_coeff.*use_kl_loss"):
        check_verl_config(config, samples)


def test_a_misspelt_key_is_refused_with_the_key_it_resembles():
    from omegaconf import OmegaConf

    config, samples = config_and_samples()
    # verl's own config would keep entropy_coeff at its default under a misspelt key.
    OmegaConf.update(config, "actor_rollout_ref.actor.entropy_coef", 0.01, force_add=True)
    with pytest.raises(
        SettingsRefused,
        match=re.escape("unknown setting actor.entropy_coef (did you mean actor.entropy_coeff?)"),
    ):
        check_verl_config(config, samples)
    for plain, suggestion in (
        ({"rollout": {"temprature": 1.0}}, "rollout.temprature (did you mean rollout.temperature"),
        (
            {"actor": {"policy_loss": {"loss_mod": "gspo"}}},
            "did you mean actor.policy_loss.loss_mode",
        ),
        ({"actor_rollout_reff": {}}, "actor_rollout_reff (did you mean actor_rollout_ref?)"),
    ):
        with pytest.raises(SettingsRefused, match=re.escape(suggestion)):
            check_verl_config(plain, samples)


def test_a_misspelt_key_is_named_with_every_other_refusal():
    samples = login_samples()
    plain = {
        "actor_rollout_ref": {
            "rollout": {"temperature": 0.5},
            "actor": {"use_kl_loss": True, "entropy_coef": 0.1},
        },
        "distillation": {"enable": True},
    }
    with pytest.raises(SettingsRefused) as refused:
        check_verl_config(plain, samples)
    message = str(refused.value)
    for named in ("actor.entropy_coef", "distillation.enable", "temperature is 0.5", "use_kl_loss"):
        assert named in message, (named, message)


@pytest.mark.parametrize("strategy", ["", "_megatron", "_torchtitan", "_veomni"])
def test_every_key_of_verls_generated_configs_is_known(strategy):
    import verl
    from omegaconf import OmegaConf

    folder = Path(verl.__file__).parent / "trainer" / "config"
    config = OmegaConf.load(folder / f"_generated_ppo{strategy}_trainer.yaml")
    config.actor_rollout_ref.rollout.temperature = 1.0
    check_verl_config(config, login_samples())


def test_the_known_keys_are_verls_config_fields():
    from dataclasses import fields

    from verl.trainer.config import RolloutCorrectionConfig
    from verl.workers import config as workers

    for prefix, classes in (
        (
            "actor.",
            [
                workers.FSDPActorConfig,
                workers.McoreActorConfig,
                workers.VeOmniActorConfig,
                workers.TorchTitanActorConfig,
            ],
        ),
        ("actor.policy_loss.", [workers.PolicyLossConfig]),
        ("actor.policy_loss.rollout_correction.", [RolloutCorrectionConfig]),
        ("rollout.", [workers.RolloutConfig]),
        ("distillation.", [workers.DistillationConfig]),
    ):
        names = {field.name for cls in classes for field in fields(cls)}
        assert names | {"_target_"} == KNOWN_KEYS[prefix], prefix


def test_token_ids_outside_the_vocabulary_are_refused():
    samples = login_samples()
    to_data_proto(samples, PAD, vocab_size=max(int(s.token_ids.max()) for s in samples) + 1)
    with pytest.raises(InputError, match="outside the model's vocabulary of 10"):
        to_data_proto(samples, PAD, vocab_size=10)


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
