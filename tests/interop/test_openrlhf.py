"""OpenRLHF 0.11.2's actor loss on the adapter's `Experience` is the reference loss on the same
samples, with its dual clip in reach (value and every gradient within 1e-5).

The experience goes the way the actor takes it: the replay buffer's split into samples and
padding strip (`split_experience_batch`, `remove_padding_in_sequences`; `NaiveReplayBuffer`
itself asks for a CUDA device), its micro-batches (`make_experience_batch`, its collate
function), the optimizer step's global token count (`iter_grad_accum_global_norm`), the
actor's log-probabilities and OpenRLHF's own `PolicyLoss` built as `ActorPPOTrainer` builds
it, backward per micro-batch scaled by 1 / the accumulation steps as DeepSpeed scales it.
`openrlhf.models` cannot be imported here: its package root imports the actor, whose ring
attention imports flash-attn (CUDA only). So its `loss.py` and `utils.py` are loaded by path
under a private package name, as OpenRLHF's own tests/test_loss_aggregation.py does, and the
actor's forward (`Actor.forward`, openrlhf/models/actor.py:243-298 at 0.11.2, the unpacked
path) is written out around its own `log_probs_from_logits`.

The actor casts its logits to float32 (actor.py:267) whatever the model's dtype, so the two
agree to float32 rounding, not float64's. Measured: 2e-9 to 5e-8 relative on the loss, at most
2e-7 on a parameter's gradient.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import re
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from callgrove.batch.samples import Sample
from callgrove.formats.problems import InputError
from callgrove.interop.openrlhf import (
    ARGUMENTS,
    PER_ACTION,
    check_openrlhf_args,
    openrlhf_arrays,
    to_experience,
)
from callgrove.interop.settings_check import SettingsRefused

from .dual_clip import Case, assert_agrees, clip_shares, far_stale
from .reference_loss import Agreement, Clip, agreement, reference_loss
from .trainer_samples import SOURCES, plain_copy, reference_model, trainer_samples

PAD = 0
SEED = 5
MICRO_TRAIN_BATCH_SIZE = 4  # --train.micro_batch_size: several micro-batches per step
NORMALISATION = {"token-mean": "token", "seq-mean-token-mean": "sequence"}
PRIVATE_PACKAGE = "_callgrove_openrlhf_models"


@functools.cache
def openrlhf_models() -> SimpleNamespace:
    """OpenRLHF's models/utils.py and models/loss.py, loaded by path without the package root
    (which imports the actor, hence flash-attn)."""
    import openrlhf

    folder = Path(openrlhf.__file__).parent / "models"
    package = types.ModuleType(PRIVATE_PACKAGE)
    package.__path__ = [str(folder)]
    sys.modules[PRIVATE_PACKAGE] = package
    modules = {}
    for name in ("utils", "loss"):
        spec = importlib.util.spec_from_file_location(
            f"{PRIVATE_PACKAGE}.{name}", folder / f"{name}.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        modules[name] = module
    return SimpleNamespace(**modules)


def train_ppo_ray_args(
    temperature: float, loss_agg_mode: str = "token-mean", **more
) -> SimpleNamespace:
    """The arguments `ActorPPOTrainer` and the actor read, as `train_ppo_ray`'s parser and
    `hierarchize` give them (its defaults; dual clip 3, the value verl defaults to)."""
    args = SimpleNamespace(
        actor=SimpleNamespace(
            eps_clip_low_high=(0.2, 0.2),
            dual_clip=3.0,
            loss_agg_mode=loss_agg_mode,
            policy_loss_type="ppo",
            entropy_coef=None,
            aux_loss_coef=0.0,
        ),
        rollout=SimpleNamespace(temperature=temperature, top_p=1.0),
        algo=SimpleNamespace(
            kl=SimpleNamespace(use_loss=False, init_coef=0.01),
            advantage=SimpleNamespace(
                is_correction_level="off",
                is_correction_mode="mask",
                is_correction_gating="ratio",
                is_correction_threshold=[0.5, 5.0],
            ),
        ),
    )
    for dotted, value in more.items():
        *path, name = dotted.split("__")
        section = functools.reduce(getattr, path, args)
        setattr(section, name, value)
    return args


def policy_loss(args):
    """`PolicyLoss` as `ActorPPOTrainer.__init__` builds it (openrlhf/trainer/ray/ppo_actor.py:
    76-86)."""
    return openrlhf_models().loss.PolicyLoss(
        clip_eps_low=args.actor.eps_clip_low_high[0],
        clip_eps_high=args.actor.eps_clip_low_high[1],
        dual_clip=args.actor.dual_clip,
        token_level_loss=args.actor.loss_agg_mode == "token-mean",
        policy_loss_type=args.actor.policy_loss_type,
        is_correction_level=args.algo.advantage.is_correction_level,
        is_correction_mode=args.algo.advantage.is_correction_mode,
        is_correction_gating=args.algo.advantage.is_correction_gating,
        is_correction_threshold=args.algo.advantage.is_correction_threshold,
    )


def action_log_probs(model: torch.nn.Module, experience, temperature: float) -> torch.Tensor:
    """`Actor.forward(sequences, action_mask, attention_mask)` on the unpacked path
    (openrlhf/models/actor.py:243-298), with OpenRLHF's own `log_probs_from_logits`."""
    sequences, attention_mask = experience.sequences, experience.attention_mask
    action_mask = experience.action_mask
    rolled_sequences = torch.roll(sequences, shifts=-1, dims=1)
    position_ids = attention_mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(attention_mask == 0, 1)
    output = model(sequences, attention_mask=attention_mask, position_ids=position_ids)
    logits = output["logits"].to(torch.float32)
    if temperature != 1.0:
        logits.div_(temperature)
    log_probs = openrlhf_models().utils.log_probs_from_logits(logits, rolled_sequences)
    log_probs = log_probs[:, :-1]
    return log_probs[:, -action_mask.shape[1] :] * action_mask.float()


def train_step(model: torch.nn.Module, experience, args) -> tuple[torch.Tensor, int]:
    """One optimizer step of the actor on `experience` (gradients left on `model`): the loss
    DeepSpeed backpropagates, summed over the micro-batches, and how many there were."""
    from openrlhf.trainer.ppo_utils.experience import (
        make_experience_batch,
        remove_padding_in_sequences,
        split_experience_batch,
    )
    from openrlhf.utils.loss_utils import iter_grad_accum_global_norm

    # NaiveReplayBuffer.append, then its collate function over micro-batches in order
    items = remove_padding_in_sequences(split_experience_batch(experience))
    micro_batches = [
        make_experience_batch(items[start : start + MICRO_TRAIN_BATCH_SIZE])
        for start in range(0, len(items), MICRO_TRAIN_BATCH_SIZE)
    ]
    steps = len(micro_batches)  # every micro-batch accumulates into one optimizer step
    loss_function = policy_loss(args)
    total = torch.zeros((), dtype=torch.float64)
    for micro_batch, loss_batch_info in iter_grad_accum_global_norm(
        micro_batches, None, steps, lambda e: e.action_mask
    ):
        # ActorPPOTrainer.training_step (ppo_actor.py:259-296)
        log_probs = action_log_probs(model, micro_batch, args.rollout.temperature)
        loss, *_ = loss_function(
            log_probs,
            micro_batch.action_log_probs,
            micro_batch.advantages,
            action_mask=micro_batch.action_mask,
            rollout_log_probs=micro_batch.rollout_log_probs,
            **loss_batch_info,
        )
        scaled = loss / steps  # DeepSpeed's engine divides each micro-batch's loss by them
        scaled.backward()
        total = total + scaled.detach()
    return total, steps


def run_case(
    source: str, temperature: float, loss_agg_mode: str = "token-mean", **settings
) -> Case:
    reference = reference_model(torch.float64)
    _, samples = trainer_samples(reference, seed=SEED, temperature=temperature, source=source)
    samples = far_stale(samples)
    args = train_ppo_ray_args(temperature, loss_agg_mode, **settings)
    check_openrlhf_args(args, samples)
    clip = Clip(
        clip_low=args.actor.eps_clip_low_high[0],
        clip_high=args.actor.eps_clip_low_high[1],
        dual_clip=args.actor.dual_clip,
        normalisation=NORMALISATION[loss_agg_mode],
    )
    want = reference_loss(reference.model, samples, clip)
    want.backward()
    model = plain_copy(reference)
    got, micro_batches = train_step(model, to_experience(samples, PAD), args)
    return Case(
        agreement=agreement(got, want, model, reference.model),
        shares=clip_shares(reference.model, samples, clip),
        micro_batches=micro_batches,
    )


def measure(source: str, temperature: float) -> Agreement:
    """OpenRLHF's actor loss against the reference on `source`'s samples at `temperature`:
    token-mean, dual clip 3, no train / rollout correction."""
    return run_case(source, temperature).agreement


@pytest.mark.hf
@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("source", SOURCES)
def test_openrlhfs_actor_loss_on_the_experience_is_the_reference_loss(source, temperature):
    assert_agrees(run_case(source, temperature))


@pytest.mark.hf
def test_the_sequence_mean_and_a_token_correction_leave_it_the_reference_loss():
    # The train / rollout correction sees identical logprobs on these experiences: weight 1.
    case = run_case(
        "login",
        0.7,
        "seq-mean-token-mean",
        algo__advantage__is_correction_level="token",
        algo__advantage__is_correction_mode="clip",
    )
    assert_agrees(case)


@functools.cache
def login_samples() -> list[Sample]:
    """The login samples at temperature 1 (the checks below read them, never change them)."""
    return trainer_samples(reference_model(torch.float64), seed=SEED)[1]


def test_the_experience_holds_what_the_actor_reads_token_aligned_with_the_samples():
    samples = login_samples()
    arrays, temperature = openrlhf_arrays(samples, PAD)
    experience = to_experience(samples, PAD)
    assert temperature == 1.0
    rows, width = len(samples), experience.sequences.shape[1]
    assert experience.attention_mask.shape == (rows, width)
    for name in PER_ACTION:
        assert getattr(experience, name).shape == (rows, width - 1), name
    assert experience.info["reward"].tolist() == pytest.approx([s.reward for s in samples])
    for index, sample in enumerate(samples):
        trained = np.flatnonzero(sample.loss_mask)
        length = int(experience.attention_mask[index].sum())
        assert length == trained[-1] + 1 == arrays["total_length"][index]
        assert experience.sequences[index, :length].tolist() == sample.token_ids[:length].tolist()
        assert (experience.sequences[index, length:] == PAD).all()
        # entry t is token t + 1's: the trained tokens, shifted by one
        actions = experience.action_mask[index].bool()
        assert np.array_equal(np.flatnonzero(actions.numpy()) + 1, trained)
        for name in ("action_log_probs", "rollout_log_probs"):
            values = getattr(experience, name)[index][actions].numpy()
            assert np.array_equal(values, sample.logprobs[trained]), name
        assert np.array_equal(
            experience.advantages[index][actions].numpy(), sample.advantages[trained]
        )
        assert arrays["response_length"][index] == trained[-1] - trained[0] + 1


def test_openrlhfs_replay_buffer_takes_the_experience_apart_and_back():
    from openrlhf.trainer.ppo_utils.experience import (
        make_experience_batch,
        remove_padding_in_sequences,
        split_experience_batch,
    )

    samples = login_samples()
    items = remove_padding_in_sequences(split_experience_batch(to_experience(samples, PAD)))
    assert [int(item.attention_mask.sum()) for item in items] == [
        int(np.flatnonzero(s.loss_mask)[-1]) + 1 for s in samples
    ]
    for item in items:  # every per-action field one shorter than its sequence
        assert all(
            getattr(item, name).shape[-1] == item.sequences.shape[-1] - 1 for name in PER_ACTION
        )
    again = make_experience_batch(items)
    assert int(again.action_mask.sum()) == sum(s.num_loss_tokens for s in samples)


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"rollout__temperature": 0.7}, "rollout.temperature is 0.7 but the samples were"),
        ({"actor__policy_loss_type": "gspo"}, "policy_loss_type is 'gspo'"),
        ({"actor__entropy_coef": 0.01}, "entropy_coef"),
        ({"actor__aux_loss_coef": 0.01}, "aux_loss_coef"),
        ({"algo__kl__use_loss": True}, "KL loss"),
        (
            {
                "algo__advantage__is_correction_level": "token",
                "algo__advantage__is_correction_threshold": [1.5, 5.0],
            },
            r"is_correction_threshold \[1\.5, 5\] leaves out 1",
        ),
    ],
)
def test_settings_that_change_the_actors_loss_are_refused(settings, refusal):
    with pytest.raises(ValueError, match=refusal):
        check_openrlhf_args(train_ppo_ray_args(1.0, **settings), login_samples())


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"actor__entropy_coef": 0.0, "actor__dual_clip": None},
        {"actor__loss_agg_mode": "seq-mean-token-mean"},
        {"algo__kl__use_loss": True, "algo__kl__init_coef": 0.0},
        {"algo__advantage__is_correction_level": "seq"},
        {
            "algo__advantage__is_correction_level": "token",
            "algo__advantage__is_correction_gating": "binary_kl",
            "algo__advantage__is_correction_threshold": [0.0, 0.01],
        },
    ],
)
def test_settings_that_leave_the_loss_alone_pass(settings):
    check_openrlhf_args(train_ppo_ray_args(1.0, **settings), login_samples())
    as_mapping = {"rollout": {"temperature": 1.0}, "actor": {"policy_loss_type": "ppo"}}
    check_openrlhf_args(as_mapping, login_samples())


def parse_args_form(args: SimpleNamespace, prefix: str = "") -> dict:
    """`args` flat, as `train_ppo_ray`'s `parse_args()` holds them before `hierarchize`."""
    flat = {}
    for name, value in vars(args).items():
        if isinstance(value, SimpleNamespace):
            flat |= parse_args_form(value, f"{prefix}{name}.")
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def test_the_flat_parse_args_form_is_read_as_the_nested_one():
    flat = parse_args_form(train_ppo_ray_args(1.0))
    assert "rollout.temperature" in flat and "algo.kl.use_loss" in flat
    check_openrlhf_args(flat, login_samples())
    check_openrlhf_args(argparse.Namespace(**flat), login_samples())
    for refused in (
        {"rollout.temperature": 0.7, "actor.policy_loss_type": "gspo"},
        argparse.Namespace(
            **{**flat, "rollout.temperature": 0.7, "actor.policy_loss_type": "gspo"}
        ),
    ):
        with pytest.raises(SettingsRefused, match=r"rollout\.temperature is 0\.7.*'gspo'"):
            check_openrlhf_args(refused, login_samples())


def test_a_single_correction_threshold_is_an_upper_bound_as_train_ppo_ray_reads_it():
    flat = {"algo.advantage.is_correction_level": "token"}
    check_openrlhf_args({**flat, "algo.advantage.is_correction_threshold": [2.0]}, login_samples())
    with pytest.raises(SettingsRefused, match=r"threshold \[0, 0\.9\] leaves out 1"):
        check_openrlhf_args(
            {**flat, "algo.advantage.is_correction_threshold": [0.9]}, login_samples()
        )


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (
            {"rollout": {"temprature": 0.7}},
            "rollout.temprature (did you mean rollout.temperature?)",
        ),
        ({"actor.entropy_coeff": 0.01}, "actor.entropy_coeff (did you mean actor.entropy_coef?)"),
        ({"algo": {"kl": {"use_los": True}}}, "algo.kl.use_los (did you mean algo.kl.use_loss?)"),
        ({"rolout.temperature": 1.0}, "rolout.temperature (did you mean rollout.temperature?)"),
    ],
)
def test_a_misspelt_argument_is_refused_with_the_one_it_resembles(args, suggestion):
    with pytest.raises(SettingsRefused, match=re.escape(f"unknown setting {suggestion}")):
        check_openrlhf_args(args, login_samples())


def test_every_bad_setting_is_named_in_one_error():
    args = train_ppo_ray_args(
        0.7,
        actor__policy_loss_type="gspo",
        actor__entropy_coef=0.01,
        algo__kl__use_loss=True,
        rollout__temprature=1.0,
    )
    with pytest.raises(SettingsRefused) as refused:
        check_openrlhf_args(args, login_samples())
    message = str(refused.value)
    for named in ("temprature", "rollout.temperature is 0.7", "gspo", "entropy_coef", "KL loss"):
        assert named in message, (named, message)
    with pytest.raises(SettingsRefused, match=r"rollout\.temperature is given twice"):
        check_openrlhf_args(
            {"rollout": {"temperature": 1.0}, "rollout.temperature": 1.0}, login_samples()
        )


def test_the_known_arguments_are_train_ppo_ray_s():
    """`ARGUMENTS` is every dest of the installed OpenRLHF's `train_ppo_ray` parser (read from
    its source: the module imports ray, which the venv leaves out)."""
    import openrlhf

    source = Path(openrlhf.__file__).parent / "cli" / "train_ppo_ray.py"
    dests = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        named = {keyword.arg: keyword.value for keyword in node.keywords}
        dest = named.get("dest", node.args[0])
        for prefix in ("actor", "critic"):  # its optimizer options, added per model
            text = "".join(
                prefix if isinstance(part, ast.FormattedValue) else part.value
                for part in (dest.values if isinstance(dest, ast.JoinedStr) else [dest])
            )
            dests.add(text.removeprefix("--"))
    assert dests == ARGUMENTS


def test_token_ids_outside_the_vocabulary_are_refused():
    samples = login_samples()
    openrlhf_arrays(samples, PAD, vocab_size=max(int(s.token_ids.max()) for s in samples) + 1)
    with pytest.raises(InputError, match=r"OpenRLHF: row .* outside the model's vocabulary of 10"):
        openrlhf_arrays(samples, PAD, vocab_size=10)
