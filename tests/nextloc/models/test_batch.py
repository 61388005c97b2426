"""A split's samples as tensors: padded when first read (a routine kind reads a training split's ids and
targets only)."""

from __future__ import annotations

import numpy as np
import torch


def test_a_split_is_padded_when_its_batches_are_first_read(make_samples) -> None:
    data = make_samples(users=[1, 2, 1], histories=[[2, 3], [4], [5, 6, 7]], targets=[3, 4, 2])
    assert data.target_np.tolist() == [3, 4, 2]
    assert data.lengths_np.tolist() == [2, 1, 3]
    assert "_all" not in vars(data)
    assert "history_np" not in vars(data)
    batch = data.batch(torch.tensor([2, 0]))
    np.testing.assert_array_equal(batch.loc.numpy(), [[5, 6, 7], [2, 3, 0]])
    np.testing.assert_array_equal(data.history_np, [[2, 3, 0], [4, 0, 0], [5, 6, 7]])
