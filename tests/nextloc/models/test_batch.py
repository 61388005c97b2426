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


def test_a_routine_kinds_training_split_is_read_without_its_histories(make_samples, tmp_path) -> None:
    """A routine kind reads train's ids and targets only (its histories are most of a split's memory);
    every other kind, and a routine kind's validation and test, read every column."""
    import pyarrow.parquet as pq

    from nextloc.training.fit_kind import load_splits

    data = make_samples(users=[1, 2, 1], histories=[[2, 3], [4], [5, 6, 7]], targets=[3, 4, 2])
    table = data.table
    paths = {split: tmp_path / f"{split}.parquet" for split in ("train", "val", "test")}
    for path in paths.values():
        pq.write_table(table, path)
    routine, neural = (
        load_splits(paths, torch.device("cpu"), "ranker"),
        load_splits(paths, torch.device("cpu")),
    )
    assert "loc_hist" not in routine["train"].table.column_names
    assert (
        routine["train"].table.column("staypoint_id").to_pylist() == table.column("staypoint_id").to_pylist()
    )
    assert routine["train"].target_np.tolist() == [3, 4, 2]
    for split in ("val", "test"):
        assert routine[split].table.column_names == table.column_names
    assert neural["train"].table.column_names == table.column_names
