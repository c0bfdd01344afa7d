"""`[rows]` of a training config reaches the step: the scheme, a background agent's reward and
whether compaction calls train; and the `handoff` environment, where subagents decide the
reward."""

from __future__ import annotations

import asyncio

import pytest

from callgrove.chat import CharFormat
from callgrove.credit import GRPO, finalize_group
from callgrove.episode import Episode
from callgrove.orchestrator import run_episode
from callgrove.orchestrator.config import ConfigError, config_from_dict, to_toml
from callgrove.orchestrator.degeneracy import DegeneracySettings
from callgrove.orchestrator.envs import make_env
from callgrove.orchestrator.envs.digits import HANDOFF_WORDINGS, score
from callgrove.orchestrator.step import prepare_step
from callgrove.rows import RowSettings

from .helpers import PARAMS, ScriptedPolicy, run

KEEP_ALL = DegeneracySettings(drop=())


def relay_group(replies=("3", "72")):
    episodes = []
    for number, reply in enumerate(replies):
        episode = run(make_env("relay"), "372", ScriptedPolicy(reply))
        episode.id = f"e{number}"
        episodes.append(episode)
    return [episodes]


def test_rows_section_defaults_to_exactly_once_and_refuses_what_it_does_not_know():
    config = config_from_dict({})
    assert config.rows == RowSettings()
    chosen = config_from_dict({"rows": {"scheme": "per_agent", "train_compaction": False}})
    assert chosen.rows == RowSettings(scheme="per_agent", train_compaction=False)
    assert "[rows]" in to_toml(chosen) and 'scheme = "per_agent"' in to_toml(chosen)
    with pytest.raises(ConfigError, match=r"rows: scheme must be one of"):
        config_from_dict({"rows": {"scheme": "twice"}})
    with pytest.raises(ConfigError, match=r"rows: background_reward must be one of"):
        config_from_dict({"rows": {"background_reward": "half"}})
    with pytest.raises(ConfigError, match=r"rows\.schema: unknown key"):
        config_from_dict({"rows": {"schema": "per_agent"}})


def test_the_step_trains_what_the_scheme_says():
    seats = {}
    for scheme in ("exactly_once", "leader_only", "drop_subagents", "per_agent"):
        step = prepare_step(relay_group(), GRPO(), KEEP_ALL, rows=RowSettings(scheme=scheme))
        seats[scheme] = {s.seat for s in step.samples if s.num_loss_tokens}
    assert seats["exactly_once"] == seats["per_agent"] == {"leader", "helper", "fork", "checker"}
    assert seats["leader_only"] == seats["drop_subagents"] == {"leader"}


def test_background_reward_and_compaction_settings_reach_the_step():
    plain = prepare_step(relay_group(), GRPO(), KEEP_ALL)
    untrained = prepare_step(
        relay_group(),
        GRPO(),
        KEEP_ALL,
        rows=RowSettings(background_reward="none", train_compaction=False),
    )
    trained_purposes = {
        call.purpose for rows in untrained.episode_rows for row in rows.rows for call in row.trains
    }
    assert "compaction" in {
        call.purpose for rows in plain.episode_rows for row in rows.rows for call in row.trains
    }
    assert trained_purposes == {"turn"}
    assert not [s for s in untrained.samples if s.seat == "checker" and s.num_loss_tokens]

    groups = relay_group()
    step = prepare_step(groups, GRPO(), KEEP_ALL, rows=RowSettings(background_reward="episode"))
    episodes = groups[0]
    mean = sum(e.reward for e in episodes) / len(episodes)
    for episode in episodes:  # the checker is credited with its episode's reward
        checker = next(a for a in episode.agents if a.start == "background")
        assert checker.rewards is not None  # its own score stays on the record
        assert checker.calls[0].advantages == pytest.approx(episode.reward - mean)
    own = relay_group()
    finalize_group(GRPO(), own[0])
    checker_rewards = [next(a for a in e.agents if a.start == "background") for e in own[0]]
    own_mean = sum(sum(a.rewards.values()) for a in checker_rewards) / 2
    assert checker_rewards[0].calls[0].advantages == pytest.approx(
        sum(checker_rewards[0].rewards.values()) - own_mean
    )
    assert step.samples


def test_handoff_scores_only_the_final_answer_and_records_every_seat():
    episode = run(make_env("handoff"), "302", ScriptedPolicy("3"))
    assert episode.ok, episode.errors
    starts = {agent.id: agent.start for agent in episode.agents}
    assert starts == {"leader": "root", "helper-1": "fresh", "fork-2": "fork"}
    purposes = [c.purpose for c in episode.agent("leader").calls]
    assert purposes == ["turn", "compaction", "turn"]
    seats = episode.meta["seats"]
    assert set(seats) == {"copy", "helper", "fork", "summary", "final"}
    assert seats["final"] == score("3", "0320")
    assert episode.rewards == {"score": seats["final"]}
    assert all(agent.rewards is None for agent in episode.agents)


def test_handoff_worded_for_an_instruct_model_asks_in_sentences_for_the_same_targets():
    asked = "".join(HANDOFF_WORDINGS["instruct"].values())
    chat = CharFormat("0123456789" + "".join(sorted(set(asked) - set("0123456789"))))
    policy = ScriptedPolicy("3")  # its reply's ids are the digits' in both alphabets

    async def go() -> Episode:
        env = make_env("handoff", {"wording": "instruct"})
        return await run_episode(env, "302", policy, chat, PARAMS, Episode(id="e0"), None)

    episode = asyncio.run(go())
    assert episode.ok, episode.errors
    prompts = [chat.show(prompt) for prompt in policy.prompts]
    assert "Repeat these digits exactly: 302. Reply with the digits only." in prompts[0]
    assert "Write these two digits in reverse order: 30." in prompts[1]
    assert "What is the last of the digits you were given?" in prompts[2]
    assert "You were given the digits 3." in prompts[4]  # the leader restarted from its summary
    assert "Write 3, then 3, then the first of the digits" in prompts[4]
    assert (
        episode.meta["seats"] == run(make_env("handoff"), "302", ScriptedPolicy("3")).meta["seats"]
    )
    with pytest.raises(ValueError, match=r"wording: one of terse, instruct, not 'chatty'"):
        make_env("handoff", {"wording": "chatty"})
    assert make_env("handoff", {"wording": "instruct", "length": 4}).length == 4  # still reach it
    with pytest.raises(ValueError, match=r"'handoff'.*unexpected keyword argument 'lenght'"):
        make_env("handoff", {"wording": "instruct", "lenght": 4})


def test_relay_records_every_answers_score():
    episode = run(make_env("relay"), "372", ScriptedPolicy("3"))
    seats = episode.meta["seats"]
    assert seats["final"] == score("3", "333")  # the join of three answers "3"
    assert episode.rewards["score"] == pytest.approx(sum(seats.values()) / len(seats))
