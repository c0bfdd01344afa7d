import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgrove.batch import NO_VERSION, TOKEN_FIELDS, PackSettings, Sample, pack
from callgrove.batch.packing import _first_fit


def make_samples(lengths: list[int], loss_every: int = 2) -> list[Sample]:
    """Samples whose token ids count up across all of them, so each token is identifiable."""
    samples, first = [], 0
    for index, length in enumerate(lengths):
        mask = (np.arange(length) % loss_every == 0).astype(np.uint8)
        samples.append(
            Sample(
                token_ids=np.arange(first, first + length, dtype=np.int32),
                loss_mask=mask,
                logprobs=-0.5 * mask.astype(np.float32),
                advantages=1.5 * mask.astype(np.float32),
                position_ids=np.arange(length, dtype=np.int32),
                policy_versions=np.where(mask == 1, 4, NO_VERSION).astype(np.int32),
                temperatures=np.where(mask == 1, 0.7, 1.0).astype(np.float32),
                top_p=np.where(mask == 1, 0.9, 1.0).astype(np.float32),
                top_k=np.zeros(length, dtype=np.int32),
                episode=f"e{index // 3}",
                group="g",
                agent="L",
                seat="leader",
                row=index % 3,
                leaf=f"C{index}",
                root="C0",
                reward=1.0,
            )
        )
        first += length
    return samples


lengths_strategy = st.lists(st.integers(1, 120), max_size=40)


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_strategy, seq_len=st.integers(1, 160), ranks=st.integers(1, 4))
def test_every_token_once_in_order_within_seq_len_and_balanced(lengths, seq_len, ranks):
    samples = make_samples(lengths)
    packed = pack(samples, PackSettings(seq_len, overlong="truncate", ranks=ranks))
    kept = [min(n, seq_len) for n in lengths]
    seen = []
    for micro_batch in packed.micro_batches:
        assert micro_batch.num_tokens <= seq_len
        bounds = micro_batch.cu_seqlens
        assert bounds[0] == 0 and (np.diff(bounds) > 0).all()
        for i, index in enumerate(micro_batch.samples.tolist()):
            segment = slice(bounds[i], bounds[i + 1])
            for name in TOKEN_FIELDS:
                expected = getattr(samples[index], name)[: kept[index]]
                np.testing.assert_array_equal(micro_batch.arrays[name][segment], expected)
            seen.append(index)
    assert sorted(seen) == list(range(len(samples)))
    assert packed.num_tokens == sum(kept)

    rank_tokens = packed.rank_tokens()
    assert max(rank_tokens) - min(rank_tokens) <= max(kept, default=0)
    assert len({len(rank) for rank in packed.ranks}) == 1


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_strategy, seq_len=st.integers(120, 300))
def test_first_fit_leaves_no_two_micro_batches_that_would_fit_in_one(lengths, seq_len):
    packed = pack(make_samples(lengths), PackSettings(seq_len))
    loads = sorted(mb.num_tokens for mb in packed.micro_batches)
    assert len(loads) < 2 or loads[0] + loads[1] > seq_len
    assert packed.padding_fraction == pytest.approx(
        1 - sum(lengths) / (seq_len * len(loads)) if loads else 0.0
    )


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 50), max_size=60), seq_len=st.integers(50, 80))
def test_first_fit_takes_the_first_micro_batch_with_room(lengths, seq_len):
    """Against a plain scan of every micro-batch for every sample."""
    lengths = np.array(lengths, dtype=np.int64)
    longest_first = np.argsort(-lengths, kind="stable").tolist()
    rooms: list[int] = []
    expected: list[list[int]] = []
    for index in longest_first:
        first = next((b for b, room in enumerate(rooms) if room >= lengths[index]), len(rooms))
        if first == len(rooms):
            rooms.append(seq_len)
            expected.append([])
        rooms[first] -= int(lengths[index])
        expected[first].append(index)
    packed = _first_fit(longest_first, lengths, seq_len)
    assert [b.tolist() for b in packed] == [sorted(b) for b in expected]


def test_hand_packed_example():
    packed = pack(make_samples([5, 3, 6, 2, 4]), PackSettings(seq_len=8))
    # longest first: 6 -> mb0, 5 -> mb1, 4 -> mb2, 3 -> mb1, 2 -> mb0; input order inside
    assert [mb.samples.tolist() for mb in packed.micro_batches] == [[2, 3], [0, 1], [4]]
    assert [mb.cu_seqlens.tolist() for mb in packed.micro_batches] == [[0, 6, 8], [0, 5, 8], [0, 4]]
    assert packed.micro_batches[1].arrays["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert packed.padding_fraction == pytest.approx(4 / 24)
    assert [mb.max_seqlen for mb in packed.micro_batches] == [6, 5, 4]


def test_ranks_are_balanced_and_run_the_same_number_of_steps():
    packed = pack(make_samples([8, 8, 3, 3, 2, 8]), PackSettings(seq_len=8, ranks=3))
    # longest first to the lightest rank (ties: lowest): 8 8 8 to r0 r1 r2, then 3 r0, 3 r1, 2 r2
    assert packed.rank_tokens() == [11, 11, 10]
    assert [[mb.samples.tolist() for mb in rank] for rank in packed.ranks] == [
        [[0], [2]],
        [[1], [3]],
        [[5], [4]],
    ]
    packed = pack(make_samples([8, 8, 8, 8]), PackSettings(seq_len=8, ranks=3))
    assert packed.rank_tokens() == [16, 8, 8]
    assert [len(rank) for rank in packed.ranks] == [2, 2, 2]
    assert packed.ranks[1][1].num_tokens == 0  # an empty step keeps the ranks in lockstep
    assert packed.capacity == 48


def test_overlong_samples_are_an_error_by_default():
    with pytest.raises(ValueError, match=r"episode e0 row 1 \(9 tokens\).*overlong='truncate'"):
        pack(make_samples([4, 9]), PackSettings(seq_len=8))


def test_truncation_cuts_the_sample_and_reports_the_lost_loss():
    samples = make_samples([4, 11])
    packed = pack(samples, PackSettings(seq_len=8, overlong="truncate"))
    (cut,) = packed.truncations
    # the sample's loss tokens sit at even positions: 8 and 10 are past the cut
    assert (cut.sample, cut.episode, cut.row, cut.cut_tokens, cut.cut_loss_tokens) == (
        1,
        "e0",
        1,
        3,
        2,
    )
    lone = next(mb for mb in packed.micro_batches if mb.samples.tolist() == [1])
    np.testing.assert_array_equal(lone.arrays["token_ids"], samples[1].token_ids[:8])


def test_missing_logprobs_leave_the_micro_batch_without_logprobs():
    samples = make_samples([3, 3])
    samples[1].logprobs = None
    (micro_batch,) = pack(samples, PackSettings(seq_len=8)).micro_batches
    assert micro_batch.arrays["logprobs"] is None
    assert micro_batch.arrays["advantages"] is not None


def test_padded_torch_layout_ends_with_one_padding_segment():
    torch = pytest.importorskip("torch")
    (micro_batch,) = pack(make_samples([3, 2]), PackSettings(seq_len=8)).micro_batches
    tensors = micro_batch.to_torch(pad=True, pad_token_id=99)
    assert tensors["cu_seqlens"].tolist() == [0, 3, 5, 8]
    assert tensors["cu_seqlens"].dtype == torch.int32
    assert tensors["max_seqlen"] == 3
    assert tensors["token_ids"][5:].tolist() == [99, 99, 99]
    assert tensors["position_ids"].tolist() == [0, 1, 2, 0, 1, 0, 1, 2]
    assert tensors["loss_mask"][5:].sum() == 0
    assert tensors["policy_versions"][5:].tolist() == [NO_VERSION] * 3
    unpadded = micro_batch.to_torch()
    assert unpadded["cu_seqlens"].tolist() == [0, 3, 5] and len(unpadded["token_ids"]) == 5


def test_settings_are_checked():
    with pytest.raises(ValueError, match="seq_len"):
        PackSettings(0)
    with pytest.raises(ValueError, match="overlong"):
        PackSettings(8, overlong="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ranks"):
        PackSettings(8, ranks=0)
