"""FedBN: normalization layers stay local, chosen by module type."""

from __future__ import annotations

import numpy as np
import torch.nn as nn

from fedsm_core.algorithms.baselines.fedbn import fedbn_aggregate, local_entries, merge_local, shared_part
from fedsm_core.models.weights import get_weights


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 1)
        self.bn = nn.BatchNorm2d(2)
        self.gn = nn.GroupNorm(1, 2)
        self.bn_like = nn.Linear(2, 2)  # a name that looks like batch norm but is not


def test_local_entries_are_the_normalization_modules_by_type_not_by_name():
    local = local_entries(_Net())
    assert local == {"bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked",
                     "gn.weight", "gn.bias"}
    assert not any(key.startswith("bn_like") for key in local)


def test_shared_entries_are_averaged_and_normalization_entries_never_are():
    net = _Net()
    local = local_entries(net)
    base = get_weights(net)
    a = {k: np.full_like(v, 1.0) for k, v in base.items()}
    b = {k: np.full_like(v, 4.0) for k, v in base.items()}

    out = fedbn_aggregate({"a": a, "b": b}, {"a": 1.0, "b": 2.0}, local)

    for key in base:
        if key in local:
            np.testing.assert_array_equal(out["a"][key], a[key])
            np.testing.assert_array_equal(out["b"][key], b[key])
        else:
            # (1 * 1 + 2 * 4) / 3 = 3
            np.testing.assert_allclose(out["a"][key], 3.0)
            np.testing.assert_allclose(out["b"][key], 3.0)


def test_shared_part_and_merge_local_split_and_rebuild_a_site_model():
    net = _Net()
    local = local_entries(net)
    weights = get_weights(net)
    shared = shared_part(weights, local)
    assert set(shared) == set(weights) - local
    rebuilt = merge_local(shared, weights, local)
    assert set(rebuilt) == set(weights)
