"""Padding token lists into tensors and cutting a generated row at its EOS, by hand."""

import torch

from grpokit.core import pad_left, pad_right, trim_at_eos


def test_pad_left_and_right_by_hand():
    ids, mask = pad_left([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = pad_right([[5, 6, 7], [8], []], pad_id=9)
    assert ids.tolist() == [[5, 6, 7], [8, 9, 9], [9, 9, 9]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long


def test_all_empty_rows_keep_one_column():
    ids, mask = pad_right([[], []], pad_id=3)  # a batch of empty completions still has a width
    assert ids.tolist() == [[3], [3]] and mask.sum() == 0


def test_trim_at_the_first_eos():
    assert trim_at_eos([4, 5, 2, 7, 2], eos_ids=(2,)) == ([4, 5, 2], False)  # EOS kept, the rest dropped
    assert trim_at_eos([4, 5, 6], eos_ids=(2, 3)) == ([4, 5, 6], True)  # no EOS: cut by the length limit
    assert trim_at_eos([3], eos_ids=[2, 3]) == ([3], False)
