"""Under the deployment protocol a sample's inputs are a live answer's: the history a validation or test
sample holds equals, field by field, what :func:`nextloc.predict.histories.encode_visits` makes of the
same visits (the user's staypoints of the split before the target, their coordinates, their times) at
the same now (the end of the last one), on the real GeoLife sample."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nextloc.bundle import ModelBundle, match_radius
from nextloc.config import PreprocessConfig
from nextloc.io.visits import validate_visits
from nextloc.models.packed import PACKED_FEATURES
from nextloc.predict.histories import encode_visits, sample_histories
from nextloc.preprocessing.dataset import build_dataset, locate_staypoints
from nextloc.preprocessing.vocabulary import location_vocabulary, user_vocabulary

DEPLOYMENT = PreprocessConfig(protocol="deployment")


@pytest.fixture(scope="module")
def deployment(sample_staypoints):
    located = locate_staypoints(*sample_staypoints, DEPLOYMENT).staypoints
    dataset = build_dataset(located, DEPLOYMENT)
    bundle = ModelBundle(
        "markov",
        None,
        DEPLOYMENT,
        None,
        location_vocabulary(located, dataset.staypoints),
        user_vocabulary(dataset.staypoints),
        match_radius(DEPLOYMENT),
    )
    return dataset, bundle


def sample_visits(staypoints: pd.DataFrame, staypoint_id: int, split: str) -> pd.DataFrame:
    """The visits a live answer would be given for this target: the user's staypoints of the split that
    come before it, as a visits frame."""
    sp = staypoints.set_index("id")
    user = sp.loc[staypoint_id, "user_id"]
    rows = sp[(sp["user_id"] == user) & (sp["split"] == split) & (sp.index < staypoint_id)]
    return validate_visits(rows[["user_id", "started_at", "finished_at", "latitude", "longitude"]])


@pytest.mark.parametrize("split", ["val", "test"])
def test_a_samples_inputs_are_predicts_encoding_of_the_same_visits_at_now(deployment, split):
    dataset, bundle = deployment
    table = dataset.samples[split]
    from_samples = sample_histories(table).packed
    assert table.num_rows > 20
    for i, staypoint_id in enumerate(table.column("staypoint_id").to_numpy()):
        visits = sample_visits(dataset.staypoints, int(staypoint_id), split)
        live = encode_visits(visits, bundle)  # now: the end of the last visit
        assert live.at.iloc[0] == visits["finished_at"].max()
        length = int(table.column("hist_len")[i].as_py())
        assert live.packed.shape[1] == length, f"{split} sample {i}: window length"
        for k, name in enumerate(PACKED_FEATURES):
            expected = from_samples[i, :length, k]
            assert np.array_equal(live.packed[0, :, k], expected), f"{split} sample {i}: {name}"


def test_the_reference_samples_count_from_the_targets_day_instead(sample_staypoints):
    """The check sees the difference: the reference protocol's ``diff_hist`` of the same kind of question
    differs from a live answer's wherever the target starts on a later day than now."""
    config = PreprocessConfig()
    located = locate_staypoints(*sample_staypoints, config).staypoints
    dataset = build_dataset(located, config)
    table = dataset.samples["test"]
    sp = dataset.staypoints.set_index("id")
    ids = table.column("staypoint_id").to_numpy()
    prior = np.array([sp.index[sp.index.get_loc(i) - 1] for i in ids])
    later_day = sp.loc[ids, "start_day"].to_numpy() > sp.loc[prior, "end_day"].to_numpy()
    assert later_day.any()
    diff = sample_histories(table).packed[:, :, PACKED_FEATURES.index("diff_days")]
    lengths = table.column("hist_len").to_numpy()
    last = diff[np.arange(len(ids)), lengths - 1]
    assert (last[later_day] > 0).all()
