import pytest

from callgrove.credit import EMABaseline, finalize_group

from .helpers import agent, episode


def run(algorithm, rewards):
    values = []
    for step, reward in enumerate(rewards):
        ep = episode(f"e{step}", agent("L", "leader"), reward=reward, group=None)
        finalize_group(algorithm, [ep])
        values.append(ep.agents[0].calls[0].advantages)
    return values


def test_first_group_sets_the_baseline_when_no_initial_value_is_given():
    ema = EMABaseline(decay=0.5)
    # baselines before each group: 1, 1, 0.5
    assert run(ema, [1.0, 0.0, 1.0]) == [0.0, -1.0, 0.5]
    assert ema.baselines == {"leader": 0.75}


def test_initial_value_and_separate_seats():
    ema = EMABaseline(decay=0.5, initial=0.0)
    assert run(ema, [1.0, 1.0]) == [1.0, 0.5]
    ep = episode("s", agent("X", "explore"), reward=2.0, group=None)
    finalize_group(ema, [ep])
    assert ep.agents[0].calls[0].advantages == 2.0
    assert ema.baselines == {"leader": 0.75, "explore": 1.0}


def test_errored_episodes_neither_take_credit_nor_move_the_baseline():
    ema = EMABaseline(decay=0.5)
    run(ema, [1.0])
    bad = episode("bad", agent("L", "leader"), reward=-50.0, group=None, ok=False)
    finalize_group(ema, [bad])
    assert bad.agents[0].calls[0].advantages is None
    assert ema.baselines == {"leader": 1.0}


def test_decay_must_be_below_one():
    with pytest.raises(ValueError, match="decay"):
        EMABaseline(decay=1.0)
