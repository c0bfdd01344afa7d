"""The flat top-level API: every listed name resolves, and torch loads only when a trainer
name is asked for."""

from __future__ import annotations

import subprocess
import sys

import callgrove as cg


def test_every_public_name_resolves():
    missing = [name for name in cg.__all__ if not hasattr(cg, name)]
    assert not missing
    assert sorted(dir(cg)) == sorted(cg.__all__)


def test_unknown_names_raise_attribute_error():
    assert not hasattr(cg, "no_such_name")


def test_import_does_not_load_torch_until_a_trainer_name_is_used():
    code = (
        "import sys, callgrove as cg; assert 'torch' not in sys.modules; "
        "cg.TinyDecoder; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_config_is_checked_in_full_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None  # as if torch were not installed\n"
        "import msgspec, callgrove.chat, callgrove.models\n"
        "from callgrove.orchestrator.config import TrainConfig\n"
        "TrainConfig()\n"
        "try:\n"
        "    msgspec.convert({'train': {'learning_rate': -1}}, TrainConfig)\n"
        "except msgspec.ValidationError as error:\n"
        "    assert 'learning_rate' in str(error), error\n"
        "else:\n"
        "    raise AssertionError('a bad learning rate passed')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_episode_is_built_from_top_level_names_alone():
    leader = cg.Agent(id="L", name="leader")
    leader.add(cg.Call.make("C1", 1, [1, 2], [3], [-0.5], policy_version=0))
    episode = cg.Episode(
        id="e",
        agents=[leader],
        env=cg.EnvInfo(id="env", name="env"),
        run=cg.Run(type="train", step=2, policy=cg.PolicySpan(start=0, end=1)),
        errors=[cg.EpisodeError(type="timeout", message="slow")],
        rewards={"r": 1.0},
    )
    assert cg.off_policy_steps(episode, 2).total == 1
    assert cg.check_rows(cg.build_rows(episode)).ok
