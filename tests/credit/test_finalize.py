import numpy as np
import pytest

from callgrove.credit import GRPO, Credit, Trace, finalize_group

from .helpers import agent, episode


class LaterTokensCountMore(GRPO):
    """Spreads a trace's advantage over each completion, growing along the tokens."""

    def call_advantages(self, credit: Credit):
        for call in credit.trace.calls():
            yield call, credit.advantage * np.arange(1, len(call.completion_ids) + 1)


def test_per_token_advantages_land_on_the_calls():
    group = [episode("a", agent("L", "leader"), reward=1.0), episode("b", agent("L", "leader"))]
    finalize_group(LaterTokensCountMore(), group)
    np.testing.assert_array_equal(group[0].agents[0].calls[0].advantages, [0.5, 1.0])
    np.testing.assert_array_equal(group[1].agents[0].calls[0].advantages, [-0.5, -1.0])


class WrongLength(GRPO):
    def call_advantages(self, credit: Credit):
        for call in credit.trace.calls():
            yield call, np.zeros(len(call.completion_ids) + 1)


def test_per_token_advantages_must_match_the_completion():
    with pytest.raises(ValueError, match=r"call L\.0: 3 advantages for 2 completion tokens"):
        finalize_group(WrongLength(), [episode("a", agent("L", "leader"))])


class CreditsEverything(GRPO):
    def score_episode(self, ep):
        return [Trace(ep, tuple(ep.agents), None, ep.reward)]


def test_credit_for_untrainable_agents_or_errored_episodes_is_refused():
    with pytest.raises(ValueError, match="agent U is not trainable"):
        finalize_group(CreditsEverything(), [episode("a", agent("U", "u", trainable=False))])
    with pytest.raises(ValueError, match="episode a did not complete"):
        finalize_group(CreditsEverything(), [episode("a", agent("L", "l"), ok=False)])


class CreditsTwice(GRPO):
    def score_episode(self, ep):
        return super().score_episode(ep) * 2


def test_a_call_credited_twice_is_an_error():
    with pytest.raises(ValueError, match=r"call L\.0 was credited twice"):
        finalize_group(CreditsTwice(), [episode("a", agent("L", "leader"))])


def test_credit_is_laid_out_per_episode_in_ledger_order():
    group = [
        episode("a", agent("L", "leader", calls=2), agent("U", "u", trainable=False), reward=1.0),
        episode("b", agent("L", "leader", calls=2)),
    ]
    report = finalize_group(GRPO(), group)
    for ep, values in zip(group, report.advantages, strict=True):
        assert values == [call.advantages for call in ep.ledger()]
    assert report.advantages[0] == [0.5, 0.5, None]


def test_a_refused_group_leaves_every_call_as_it_was():
    group = [episode("a", agent("L", "leader"), reward=1.0), episode("b", agent("L", "leader"))]
    finalize_group(GRPO(), group)
    before = [call.advantages for ep in group for call in ep.calls()]
    with pytest.raises(ValueError, match="credited twice"):
        finalize_group(CreditsTwice(), group)
    assert [call.advantages for ep in group for call in ep.calls()] == before
