"""FedBN keeps batch-norm statistics local: ``segmentation-norm = auto`` and its refusal of group norm."""

from __future__ import annotations

import pytest
import torch.nn as nn

from fedsm_core.algorithms.baselines.fedbn import local_entries
from fedsm_core.config import RunConfig


@pytest.mark.parametrize(("strategy", "norm", "expected"), [
    ("fedbn", "auto", "batch"),      # FedBN's point: batch-norm statistics stay at the site
    ("fedavg", "auto", "group"),
    ("fedsm", "auto", "group"),
    ("fedavg", "batch", "batch"),
    ("fedsm", "instance", "instance"),
    ("fedbn", "batch", "batch"),
])
def test_auto_norm_is_batch_for_fedbn_and_group_otherwise(strategy, norm, expected):
    assert RunConfig(strategy=strategy, segmentation_norm=norm).model_norm == expected


def test_the_default_config_gives_fedbn_a_batch_norm_unet_whose_running_statistics_stay_local():
    # Prepare
    config = RunConfig.from_mapping({"strategy": "fedbn"})

    # Execute
    model = config.model_spec(2, 3).build_segmentation()

    # Assert
    kinds = {type(m) for m in model.modules()}
    assert nn.BatchNorm2d in kinds and nn.GroupNorm not in kinds
    local = local_entries(model)
    assert any(key.endswith("running_mean") for key in local)
    assert any(key.endswith("running_var") for key in local)


@pytest.mark.parametrize("norm", ["group", "instance"])
def test_norms_without_running_statistics_are_refused_with_fedbn_naming_both_keys(norm):
    with pytest.raises(ValueError, match=rf"segmentation-norm = '{norm}' with strategy = 'fedbn'.*not FedBN"):
        RunConfig.from_mapping({"strategy": "fedbn", "segmentation-norm": norm})
