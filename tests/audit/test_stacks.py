"""Other stacks' row builders on the hard cases, refereed: what each is known to do by its
source (docs/audit.md), seen through the audit. NeMo Gym's builders and verifiers' graph run as
installed; prime-rl's, rLLM's and verl's rules are written out in `callgrove.audit.stacks`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from callgrove.audit import audit
from callgrove.audit.stacks import STACKS
from callgrove.synth.cases import HARD_CASES

ROOT = Path(__file__).resolve().parents[2]


def refereed(stack: str, case: str):
    episode = HARD_CASES[case](0)
    return audit([episode], STACKS[stack].rows(episode))


@pytest.mark.parametrize("stack", list(STACKS))
def test_no_stack_trains_a_token_out_of_its_context_or_one_never_sampled(stack):
    for case in HARD_CASES:
        report = refereed(stack, case)
        assert report.wrong_context == 0 and report.unsampled_tokens == 0, case


@pytest.mark.parametrize("case", list(HARD_CASES))
def test_callgrove_trains_every_sampled_token_once_but_a_twins_copy(case):
    report = refereed("callgrove", case)
    assert report.exact and report.trained_not_to_train == 0
    assert report.untrained == report.twin_untrained


def test_before_first_branch_ownership_prime_rl_trained_a_forks_history_twice():
    """#2975: a sampled node shared by the leader's branch and the fork's trains in the first."""
    for case, shared in (("fork", 24), ("fork of a fork", 48)):
        assert refereed("prime-rl-before-2975", case).twice_or_more == shared
        assert refereed("prime-rl", case).twice_or_more == 0


def test_prime_rl_trains_a_rejected_compaction_until_3478():
    rejected = 12  # the attempt's completion
    assert refereed("prime-rl", "rejected compaction").trained_not_to_train == rejected
    assert refereed("prime-rl-3478", "rejected compaction").trained_not_to_train == 0


def test_a_first_branch_can_belong_to_the_fork():
    """prime-rl orders branches by their leaf's creation: the fork's leaf comes first, so the
    leader's turns before the fork train in the fork's row."""
    report = refereed("prime-rl", "fork")
    first_turn = next(c for c in report.calls if c.call == "L.0")
    [training] = first_turn.trainings
    assert (training.row_agent, training.row_seat) == ("F", "fork")
    assert refereed("callgrove", "fork").calls[0].trainings[0].row_agent == "L"


def test_nemo_gym_delivers_one_chain_and_its_other_chains_repeat_the_shared_history():
    delivered = refereed("nemo-gym", "fork")
    assert delivered.rows == 1 and delivered.twice_or_more == 0 and delivered.untrained > 0
    chains = refereed("nemo-gym-chains", "fork")
    assert chains.twice_or_more == 24  # the leader's turns before the fork, in both chains


def test_rllm_overwrites_a_twins_first_call_with_its_replay():
    report = refereed("rllm", "twins")
    assert report.untrained == report.twin_untrained == 12


def test_one_history_per_session_trains_each_call_once_and_twins_both():
    for case in HARD_CASES:
        report = refereed("session", case)
        assert report.untrained == 0 and report.twice_or_more == 0, case


def test_the_docs_table_is_the_one_the_benchmark_builds():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import audit_stacks

    assert audit_stacks.table() in (ROOT / "docs" / "audit.md").read_text()
