"""The ClientApp side of the attack simulator: only simulated nodes attack, and what each attack changes."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import RecordDict

from app_protocol import records
from client_app.attacks import attacked_reply, site_attacks, with_flipped_labels
from fedsm_core.algorithms.attacks import INFLATION, AttackSettings
from fedsm_core.data.arrays import SegArrays, SiteSplits

SETTINGS = AttackSettings("site-6:sign-flip,site-6:inflate-count")


def test_a_named_site_attacks_only_as_a_simulated_node():
    assert site_attacks(SETTINGS, "site-6", {"partition-id": 5, "num-partitions": 6}) == ("sign-flip",
                                                                                         "inflate-count")
    assert site_attacks(SETTINGS, "site-1", {"site-name": "site-1"}) == ()
    with pytest.raises(RuntimeError, match="deployment SuperNode: the attack simulator runs only in the simulation"):
        site_attacks(SETTINGS, "site-6", {"site-name": "site-6"})


def test_label_flip_inverts_the_training_masks_only():
    split = SegArrays(np.zeros((1, 3, 2, 2), np.float32), np.array([[[[1.0, 0.0], [0.0, 1.0]]]], np.float32),
                      ("site-6/0",))
    site = SiteSplits("site-6", split, split, split)
    flipped = with_flipped_labels(site)
    np.testing.assert_array_equal(flipped.train.masks, [[[[0.0, 1.0], [1.0, 0.0]]]])
    np.testing.assert_array_equal(flipped.test.masks, split.masks)


def test_the_reply_carries_the_flipped_model_and_the_inflated_count():
    # Prepare: the server sent w = [1, 1]; the site trained [2, 3] on 12 images
    sent = {records.GLOBAL: {"w": np.array([1.0, 1.0])}}
    content = RecordDict({records.GLOBAL: records.to_record({"w": np.array([2.0, 3.0])}),
                          records.METRICS: records.to_metrics({"num-examples": 12, "loss": 0.5})})

    # Execute
    attacked = attacked_reply(content, sent, SETTINGS.of("site-6"), 1.0, seed=0)

    # Assert: w - (w_k - w) = [0, -1]; 100 x 12 images claimed
    np.testing.assert_array_equal(records.from_record(attacked[records.GLOBAL])["w"], [0.0, -1.0])
    assert attacked[records.METRICS]["num-examples"] == 12 * INFLATION


def test_a_poisoned_fine_tuned_model_is_flipped_about_the_global_model_it_started_from():
    # Prepare: a fine-tuning request carries only the global model w = [1, 1]; the site fine-tuned it to [2, 3]
    sent = {records.GLOBAL: {"w": np.array([1.0, 1.0])}}
    content = RecordDict({records.PERSONAL: records.to_record({"w": np.array([2.0, 3.0])}),
                          records.METRICS: records.to_metrics({"num-examples": 12})})

    # Execute
    attacked = attacked_reply(content, sent, ("poison-personalized",), 1.0, seed=0)

    # Assert: w - 1 * (v - w) = [1 - 1, 1 - 2]
    np.testing.assert_array_equal(records.from_record(attacked[records.PERSONAL])["w"], [0.0, -1.0])
