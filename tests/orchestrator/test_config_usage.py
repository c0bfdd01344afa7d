"""`callgrove train`'s usage errors: too many learner ranks for the machine, the example config
and switching its algorithm, no run folder left by a refused run, and typos answered with the
name they are closest to."""

from __future__ import annotations

import ast
import asyncio
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import callgrove.errors
from callgrove.chat import CharFormat
from callgrove.cli import app
from callgrove.credit import GRPO, EMABaseline, HierarchicalGRPO
from callgrove.episode import Episode
from callgrove.errors import UsageError, did_you_mean
from callgrove.orchestrator import run_episode
from callgrove.orchestrator.config import ConfigError, config_from_dict, load_config
from callgrove.orchestrator.envs import make_env
from callgrove.policy import Completion, SamplingParams
from callgrove.train import settings
from callgrove.train.settings import check_world_size, usable_cpus

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.toml"
runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, ["train", *(str(a) for a in args)])


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(settings.os, "sched_getaffinity", lambda _: {0, 1}, raising=False)


# -- world_size -------------------------------------------------------------------------------


def test_more_ranks_than_usable_cores_are_refused_at_load_saying_what_to_set(two_cores):
    with pytest.raises(
        ConfigError,
        match=r"defaults: train\.world_size 64: this machine has 2 usable CPU cores .*; set "
        r"train\.world_size to at most 2$",
    ):
        load_config(None, {"train.world_size": 64})
    assert load_config(None, {"train.world_size": 2}).train.world_size == 2
    assert load_config(None, {"train.world_size": 1}).train.world_size == 1


def test_on_one_core_only_the_learner_in_this_process_is_left(monkeypatch):
    monkeypatch.setattr(settings.os, "sched_getaffinity", lambda _: {3}, raising=False)
    with pytest.raises(UsageError, match=r"1 usable CPU core .*to 1 \(the learner in this"):
        check_world_size(2)


def test_the_limit_is_the_process_affinity_not_the_machine():
    assert usable_cpus() >= 1
    check_world_size(usable_cpus())
    with pytest.raises(UsageError, match=f"has {usable_cpus()} usable CPU core"):
        check_world_size(usable_cpus() + 1)


def test_gpus_count_on_cuda(monkeypatch, two_cores):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    check_world_size(4, "cuda")  # more than the cores: each rank has a GPU of its own
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UsageError, match=r"world_size 4: 1 GPU is present .*to 1"):
        check_world_size(4, "cuda")


def test_a_checkpoint_config_of_more_ranks_still_loads(two_cores):
    """A run started on a larger machine continues here with fewer ranks (the saved config is
    read by `config_from_dict`, which does not count cores)."""
    assert config_from_dict({"train": {"world_size": 64}}).train.world_size == 64


def test_the_ranked_learner_refuses_before_starting_a_process(monkeypatch):
    pytest.importorskip("torch")
    import multiprocessing

    from callgrove.train.ranks import RankedLearner
    from callgrove.train.settings import LearnerSettings

    monkeypatch.setattr(settings.os, "sched_getaffinity", lambda _: {0}, raising=False)
    before = set(multiprocessing.active_children())
    with pytest.raises(UsageError, match="world_size 3"):
        RankedLearner(lambda _: None, LearnerSettings(world_size=3))  # type: ignore[arg-type]
    assert set(multiprocessing.active_children()) == before


def test_the_command_refuses_too_many_ranks_and_leaves_no_folder(tmp_path, two_cores):
    result = run(EXAMPLE, "-o", tmp_path / "runs" / "x", "--set", "train.world_size=64")
    assert result.exit_code == 2, result.output
    assert error_lines(result.stderr) == [
        f"error: {EXAMPLE}: train.world_size 64: this machine has 2 usable CPU cores for its "
        "ranks (each a process of its own); set train.world_size to at most 2"
    ]
    assert not (tmp_path / "runs").exists()


# -- the example and switching the algorithm ---------------------------------------------------

CHAT = CharFormat()
PARAMS = SamplingParams(max_tokens=4, stop_token_ids=CHAT.stop_token_ids)


class RandomPolicy:
    version = 0

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    async def sample(self, prompt_ids: np.ndarray, params: SamplingParams) -> Completion:
        text = str(self.rng.integers(0, 100))
        reply = np.concatenate([CHAT.encode(text), [CHAT.END]]).astype(np.int32)
        return Completion(reply, np.full(len(reply), -0.5), 0, "stop")


def group(env_name: str, size: int = 8) -> list[Episode]:
    env = make_env(env_name)
    task = env.task(np.random.default_rng(1))
    policy = RandomPolicy(0)

    async def go() -> list[Episode]:
        return [
            await run_episode(env, task, policy, CHAT, PARAMS, Episode(id=f"e{i}", group="g"))
            for i in range(size)
        ]

    return asyncio.run(go())


def helper_advantages(algorithm: HierarchicalGRPO, env_name: str) -> list[float]:
    return [c.advantage for c in algorithm.score_group(group(env_name)) if c.trace.seat == "helper"]


def test_the_examples_local_seat_repeats_in_its_environment():
    """The example's `local_seats = ["helper"]` on `relay` (two helpers an episode, each scored
    on its own part): the helpers are baselined against each other, not zeroed. On `handoff`
    (one helper an episode, scored by the episode's reward) the same setting gives the helper
    0.0 on every call, but under `shared_reward_credit = "seat_normalised"` (which compares
    such a helper across the group, a local seat's too)."""
    config = load_config(EXAMPLE)
    assert config.env.name == "relay"
    assert isinstance(config.algorithm, HierarchicalGRPO)
    assert config.algorithm.local_seats == frozenset({"helper"})
    relay = helper_advantages(config.algorithm, "relay")
    assert len(relay) == 16 and any(relay)
    for credit, zeroed in (("pool", True), ("leave_one_out", True), ("seat_normalised", False)):
        options = HierarchicalGRPO(local_seats=frozenset({"helper"}), shared_reward_credit=credit)
        handoff = helper_advantages(options, "handoff")
        assert len(handoff) == 8 and (set(handoff) == {0.0}) is zeroed, credit


def test_switching_the_examples_algorithm_leaves_out_its_keys_with_a_warning():
    with pytest.warns(UserWarning) as caught:
        config = load_config(EXAMPLE, {"algorithm.name": "grpo"})
    assert config.algorithm == GRPO()
    assert [str(w.message) for w in caught] == [
        f"{EXAMPLE}: algorithm.local_seats: not a setting of algorithm 'grpo' (--set "
        "algorithm.name), left out (the file sets it for 'hierarchical_grpo')"
    ]


def test_switching_keeps_the_keys_both_take_and_warns_of_nothing_else(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[algorithm]\nname = "hierarchical_grpo"\nscale_by_std = true\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = load_config(path, {"algorithm.name": "grpo"})
        assert config.algorithm == GRPO(scale_by_std=True)
        same = load_config(path, {"algorithm.name": "hierarchical_grpo"})
        assert same.algorithm == HierarchicalGRPO(scale_by_std=True)
    path.write_text('[algorithm]\nscope = "episode"\n')  # grpo by default
    with pytest.warns(UserWarning, match=r"algorithm\.scope: .* for 'grpo'"):
        assert isinstance(load_config(path, {"algorithm.name": "ema"}).algorithm, EMABaseline)


def test_a_key_the_switched_algorithm_does_not_take_given_with_set_is_an_error():
    with pytest.raises(ConfigError, match=r"algorithm\.local_seats: not a setting of algorithm"):
        load_config(EXAMPLE, {"algorithm.name": "grpo", "algorithm.local_seats": ["helper"]})


def test_a_file_that_names_an_algorithm_and_another_ones_key_is_still_an_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[algorithm]\nname = "grpo"\nlocal_seats = ["helper"]\n')
    with pytest.raises(ConfigError, match=r"algorithm\.local_seats: not a setting of algorithm"):
        load_config(path)


# -- no folder left by a refused run -----------------------------------------------------------


@pytest.mark.parametrize(
    "setting",
    ["bogus.key=1", "env.name=nope", "model.name=no-such-model", "train.world_size=100000"],
)
def test_a_refused_run_leaves_no_folder_it_made(tmp_path, setting):
    out = tmp_path / "new" / "run"
    result = run(EXAMPLE, "-o", out, "--set", setting, "--quiet")
    assert result.exit_code == 2, result.output
    assert len(error_lines(result.stderr)) == 1
    assert list(tmp_path.iterdir()) == []  # `new` was made for the run too


def test_a_refused_run_leaves_a_folder_that_was_there_alone(tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    result = run(EXAMPLE, "-o", kept / "run", "--set", "env.name=nope", "--quiet")
    assert result.exit_code == 2, result.output
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]
    existing = tmp_path / "existing"
    existing.mkdir()
    result = run(EXAMPLE, "-o", existing, "--set", "env.name=nope", "--quiet")
    assert result.exit_code == 2, result.output
    assert existing.is_dir()


# -- did you mean ------------------------------------------------------------------------------


def test_did_you_mean_names_the_closest_choice_or_nothing():
    assert did_you_mean("trian", ["run", "train"]) == " (did you mean 'train'?)"
    assert did_you_mean("zzz", ["run", "train"]) == ""
    assert did_you_mean("x", []) == ""
    source = Path(callgrove.errors.__file__).read_text()
    imported = [
        node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)
    ]
    assert not [name for name in imported if name and name.startswith("callgrove")]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"trian.lr": 1}, "trian: unknown key (did you mean 'train'?)"),
        ({"train.learnig_rate": 1}, "train.learnig_rate: unknown key (did you mean 'learning_rate'?)"),
        ({"dispatch.group_sise": 4}, "dispatch.group_sise: unknown key (did you mean 'group_size'?)"),
        ({"train.zzz": 1}, "train.zzz: unknown key"),  # nothing close: no guess
        ({"model.kind": "vlm"}, "model.kind must be one of ('tiny', 'hf', 'vllm'), not 'vlm' "
         "(did you mean 'vllm'?)"),
        ({"algorithm.name": "grpoo"}, "algorithm: name must be one of ('grpo', "
         "'hierarchical_grpo', 'ema'), not 'grpoo' (did you mean 'grpo'?)"),
        ({"rows.scheme": "exactly_one"}, "not 'exactly_one' (did you mean 'exactly_once'?)"),
        ({"run.executor": "rai"}, "run: executor must be one of ('local', 'ray'), not 'rai' "
         "(did you mean 'ray'?)"),
        ({"degeneracy.drop": ["gibbrish"]}, "not 'gibbrish' (did you mean 'gibberish'?)"),
        ({"algorithm.name": "hierarchical_grpo", "algorithm.local_seat": []},
         "algorithm.local_seat: not a setting of algorithm 'hierarchical_grpo' (did you mean "
         "'local_seats'?) (its settings: "),
        ({"model.name": "smollm2-135m", "model.lora_rnk": 4},
         "model.lora_rnk: not a setting of model kind 'hf' (did you mean 'lora_rank'?)"),
    ],
)  # fmt: skip
def test_a_mistyped_name_is_answered_with_the_closest(overrides, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a model name's note
        with pytest.raises(ConfigError) as refused:
            load_config(None, overrides)
    assert message in str(refused.value)
    assert str(refused.value).count("did you mean") <= 1


def test_typos_in_the_file_are_answered_too_nested_tables_included(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[trian]\nlearning_rate = 1e-3\n")
    with pytest.raises(
        ConfigError, match=r"c\.toml: trian: unknown key \(did you mean 'train'\?\)"
    ):
        load_config(path)
    path.write_text("[sampling]\ntemprature = 0.5\n")
    with pytest.raises(ConfigError, match=r"sampling\.temprature: .*'temperature'"):
        load_config(path)
    path.write_text('[model]\nkind = "vllm"\nname = "smollm2-135m"\n[model.vllm]\nsever = 2\n')
    with pytest.raises(
        ConfigError, match=r"model\.vllm\.sever: unknown key \(did you mean 'servers'\?\)$"
    ):
        load_config(path)
    path.write_text("[data]\npathz = []\n")
    with pytest.raises(ConfigError, match=r"data\.pathz: unknown key \(did you mean 'paths'\?\)"):
        load_config(path)


def test_the_command_line_says_it_in_one_line(tmp_path):
    result = run(EXAMPLE, "-o", tmp_path / "x", "--set", "trian.learning_rate=1")
    assert result.exit_code == 2, result.output
    assert error_lines(result.stderr) == [
        f"error: {EXAMPLE}: trian: unknown key (did you mean 'train'?)"
    ]
    assert not (tmp_path / "x").exists()
