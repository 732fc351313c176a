"""The registry of personalization methods and FedSM's server update for methods that keep models local."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.algorithms.fedsm.fedsm import FedSM, FedSMUpdate
from fedsm_core.algorithms.personalization.registry import METHODS, keep_replies, personalization
from fedsm_core.algorithms.personalization.settings import PERSONALIZATIONS
from fedsm_core.algorithms.robust_aggregation import robust_soft_pull

SITES = ("a", "b", "c")


def _update(personal: list[float], n: int = 1) -> FedSMUpdate:
    return FedSMUpdate({"w": np.zeros(2)}, {"w": np.array(personal)}, {"fc": np.zeros(1)}, {}, n)


def test_registry_names_are_the_run_config_choices():
    assert tuple(METHODS) == PERSONALIZATIONS
    assert personalization("softpull").server_update is robust_soft_pull  # SoftPull under "mean"
    assert all(METHODS[name].server_update is keep_replies for name in PERSONALIZATIONS if name != "softpull")


def test_unknown_method_lists_the_valid_names():
    with pytest.raises(ValueError, match=r"personalization = 'bogus' is not one of \['softpull', 'ft'"):
        personalization("bogus")


@pytest.mark.parametrize("method", [name for name in PERSONALIZATIONS if name != "softpull"])
def test_local_methods_store_each_reply_unchanged(method):
    # Prepare: lam = 0.5 would mix the replies under SoftPull
    server = FedSM(SITES, {"w": np.zeros(2)}, {"fc": np.zeros(1)}, 0.5, personalization=method)
    server.personalized["c"] = {"w": np.array([9.0, 9.0])}

    # Execute
    server.aggregate({"a": _update([4.0, 8.0]), "b": _update([2.0, 0.0], 3)})

    # Assert: replies kept as sent; c did not reply and keeps its model
    np.testing.assert_array_equal(server.personalized["a"]["w"], [4.0, 8.0])
    np.testing.assert_array_equal(server.personalized["b"]["w"], [2.0, 0.0])
    np.testing.assert_array_equal(server.personalized["c"]["w"], [9.0, 9.0])
    np.testing.assert_array_equal(server.global_weights["w"], [0.0, 0.0])


def test_softpull_still_mixes_the_replies():
    # Prepare
    server = FedSM(SITES, {"w": np.zeros(2)}, {"fc": np.zeros(1)}, 0.5)

    # Execute
    server.aggregate({"a": _update([4.0, 8.0]), "b": _update([2.0, 0.0])})

    # Assert: a <- 0.5 [4, 8] + 0.25 ([2, 0] + [0, 0]) = [2.5, 4]
    np.testing.assert_allclose(server.personalized["a"]["w"], [2.5, 4.0])


def test_fedsm_rejects_an_unknown_method():
    with pytest.raises(ValueError, match="personalization = 'bogus'"):
        FedSM(SITES, {"w": np.zeros(2)}, {"fc": np.zeros(1)}, 0.5, personalization="bogus")
