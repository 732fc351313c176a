"""Tests of the FedSM server state and its per-round aggregation (Algorithm 1)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedsm_core.algorithms.aggregation import weighted_average
from fedsm_core.algorithms.fedsm.fedsm import FedSM, FedSMUpdate
from fedsm_core.algorithms.fedsm.softpull import soft_pull
from fedsm_core.algorithms.server_optimizer import ServerOptimizerSettings

SITES = ("a", "b", "c")


def _server(lam: float = 0.5, selector_weighting: str = "size") -> FedSM:
    global_weights = {"w": np.array([0.0, 0.0]), "count": np.array(0, dtype=np.int64)}
    selector_weights = {"fc": np.array([0.0])}
    return FedSM(SITES, global_weights, selector_weights, lam, selector_weighting)


def _update(glob, personal, selector, optimizer, n, count=1) -> FedSMUpdate:
    return FedSMUpdate(
        global_weights={"w": np.array(glob), "count": np.array(count, dtype=np.int64)},
        personal_weights={"w": np.array(personal), "count": np.array(count, dtype=np.int64)},
        selector_weights={"fc": np.array(selector)},
        selector_optimizer=optimizer,
        num_examples=n,
    )


def _round_updates() -> dict[str, FedSMUpdate]:
    return {
        "a": _update([4.0, 0.0], [4.0, 8.0], [2.0], {"fc/exp_avg": np.array([1.0]), "fc/step": np.array(2.0)}, 1),
        "b": _update([0.0, 4.0], [2.0, 0.0], [6.0], {"fc/exp_avg": np.array([5.0]), "fc/step": np.array(2.0)}, 3),
    }


def test_initial_state_and_payload():
    # Prepare
    server = _server()

    # Execute
    payload = server.payload_for("b")

    # Assert
    np.testing.assert_array_equal(payload.global_weights["w"], [0.0, 0.0])
    np.testing.assert_array_equal(payload.personal_weights["w"], [0.0, 0.0])
    np.testing.assert_array_equal(payload.selector_weights["fc"], [0.0])
    assert payload.selector_optimizer == {}
    assert set(server.personalized) == set(SITES)


def test_personalized_models_start_as_independent_copies():
    # Prepare
    global_weights = {"w": np.array([1.0, 2.0])}
    server = FedSM(SITES, global_weights, {"fc": np.zeros(1)}, 0.5)

    # Execute
    global_weights["w"][0] = 99.0
    server.personalized["a"]["w"][1] = -5.0

    # Assert
    np.testing.assert_array_equal(server.global_weights["w"], [1.0, 2.0])
    np.testing.assert_array_equal(server.personalized["b"]["w"], [1.0, 2.0])


def test_aggregate_global_and_selector_are_weighted_averages():
    # Prepare
    server = _server()
    updates = _round_updates()

    # Execute
    server.aggregate(updates)

    # Assert
    # n = 1 + 3 = 4:  global w = 0.25 * [4, 0] + 0.75 * [0, 4] = [1, 3];  selector = 0.25 * 2 + 0.75 * 6 = 5
    np.testing.assert_array_equal(server.global_weights["w"], [1.0, 3.0])
    np.testing.assert_array_equal(server.selector_weights["fc"], [5.0])
    replies = list(updates.values())
    expected_global = weighted_average([u.global_weights for u in replies], [1, 3])
    expected_selector = weighted_average([u.selector_weights for u in replies], [1, 3])
    for key, value in expected_global.items():
        np.testing.assert_array_equal(server.global_weights[key], value)
    for key, value in expected_selector.items():
        np.testing.assert_array_equal(server.selector_weights[key], value)


def test_aggregate_averages_selector_optimizer_moments():
    # Prepare
    server = _server()

    # Execute
    server.aggregate(_round_updates())

    # Assert
    # exp_avg = 0.25 * 1 + 0.75 * 5 = 4;  step = 0.25 * 2 + 0.75 * 2 = 2
    np.testing.assert_array_equal(server.selector_optimizer["fc/exp_avg"], [4.0])
    assert float(server.selector_optimizer["fc/step"]) == 2.0
    assert server.payload_for("c").selector_optimizer is server.selector_optimizer


def test_empty_optimizer_reply_keeps_previous_moments():
    # Prepare
    server = _server()
    server.aggregate(_round_updates())
    previous = dict(server.selector_optimizer)
    updates = {
        "a": _update([0.0, 0.0], [0.0, 0.0], [0.0], {}, 1),
        "b": _update([0.0, 0.0], [0.0, 0.0], [0.0], {"fc/exp_avg": np.array([9.0]), "fc/step": np.array(3.0)}, 1),
    }

    # Execute
    server.aggregate(updates)

    # Assert
    assert server.selector_optimizer.keys() == previous.keys()
    np.testing.assert_array_equal(server.selector_optimizer["fc/exp_avg"], [4.0])


def test_aggregate_personalized_when_all_sites_reply_is_soft_pull_of_replies():
    # Prepare
    server = _server(lam=0.6)
    updates = {
        "a": _update([0.0, 0.0], [1.0, 2.0], [0.0], {}, 2),
        "b": _update([0.0, 0.0], [3.0, 4.0], [0.0], {}, 5),
        "c": _update([0.0, 0.0], [5.0, 6.0], [0.0], {}, 1),
    }

    # Execute
    server.aggregate(updates)

    # Assert
    # K = 3, lam = 0.6, others weigh 0.2:  a = 0.6 * [1, 2] + 0.2 * ([3, 4] + [5, 6]) = [2.2, 3.2]
    np.testing.assert_allclose(server.personalized["a"]["w"], [2.2, 3.2], rtol=1e-14)
    expected = soft_pull({site: u.personal_weights for site, u in updates.items()}, 0.6)
    for site in SITES:
        for key, value in expected[site].items():
            np.testing.assert_array_equal(server.personalized[site][key], value)
        assert server.personalized[site]["count"].dtype == np.int64


def test_site_that_did_not_reply_keeps_its_model_and_it_is_the_others_softpull_input():
    # Prepare
    server = _server(lam=0.5)

    # Execute
    server.aggregate(_round_updates())  # "c" does not reply

    # Assert
    # SoftPull inputs: a = [4, 8], b = [2, 0], c = previous model [0, 0]; K = 3, lam = 0.5, others weigh 0.25
    #   a: 0.5 * [4, 8] + 0.25 * ([2, 0] + [0, 0]) = [2.0, 4.0] + [0.5, 0.0] = [2.5, 4.0]
    #   b: 0.5 * [2, 0] + 0.25 * ([4, 8] + [0, 0]) = [1.0, 0.0] + [1.0, 2.0] = [2.0, 2.0]
    #   c did not train this round: its model stays [0, 0]
    np.testing.assert_array_equal(server.personalized["a"]["w"], [2.5, 4.0])
    np.testing.assert_array_equal(server.personalized["b"]["w"], [2.0, 2.0])
    np.testing.assert_array_equal(server.personalized["c"]["w"], [0.0, 0.0])
    assert int(server.personalized["c"]["count"]) == 0  # integer buffers kept per site
    assert int(server.personalized["a"]["count"]) == 1


def test_silent_site_over_two_rounds_matches_soft_pull_by_hand():
    # Prepare
    server = _server(lam=0.5)
    server.aggregate(_round_updates())
    previous_c = {k: v.copy() for k, v in server.personalized["c"].items()}
    second = {
        "a": _update([0.0, 0.0], [8.0, 0.0], [0.0], {}, 1),
        "c": _update([0.0, 0.0], [0.0, 8.0], [0.0], {}, 1),
    }
    previous_b = {k: v.copy() for k, v in server.personalized["b"].items()}

    # Execute
    server.aggregate(second)  # now "b" is silent

    # Assert
    expected = soft_pull(
        {"a": second["a"].personal_weights, "b": previous_b, "c": second["c"].personal_weights}, 0.5
    )
    for site in ("a", "c"):
        np.testing.assert_array_equal(server.personalized[site]["w"], expected[site]["w"])
    # b is silent: unchanged, but its model enters a's and c's SoftPull
    np.testing.assert_array_equal(server.personalized["b"]["w"], previous_b["w"])
    assert not np.array_equal(previous_c["w"], server.personalized["c"]["w"])


def test_payload_for_returns_the_sites_own_personalized_model():
    # Prepare
    server = _server(lam=0.5)
    server.aggregate(_round_updates())

    # Execute
    payloads = {site: server.payload_for(site) for site in SITES}

    # Assert
    for site in SITES:
        np.testing.assert_array_equal(payloads[site].personal_weights["w"], server.personalized[site]["w"])
        np.testing.assert_array_equal(payloads[site].global_weights["w"], [1.0, 3.0])
    np.testing.assert_array_equal(payloads["a"].personal_weights["w"], [2.5, 4.0])
    np.testing.assert_array_equal(payloads["c"].personal_weights["w"], [0.0, 0.0])


def test_payload_for_unknown_site_raises():
    # Prepare
    server = _server()

    # Execute / Assert
    with pytest.raises(KeyError, match="unknown site 'z'"):
        server.payload_for("z")


def test_aggregate_unknown_site_raises():
    # Prepare
    server = _server()
    updates = {"z": _update([0.0, 0.0], [0.0, 0.0], [0.0], {}, 1)}

    # Execute / Assert
    with pytest.raises(KeyError, match=r"unknown sites \['z'\]"):
        server.aggregate(updates)


def test_aggregate_without_updates_raises():
    # Prepare
    server = _server()

    # Execute / Assert
    with pytest.raises(ValueError, match="no client updates"):
        server.aggregate({})


@pytest.mark.parametrize(
    ("sites", "lam", "match"),
    [(("a", "a"), 0.5, "distinct"), ((), 1.0, "distinct"), (("a", "b", "c"), 0.2, "softpull-lambda")],
)
def test_constructor_rejects_bad_arguments(sites, lam, match):
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match=match):
        FedSM(sites, {"w": np.zeros(1)}, {"fc": np.zeros(1)}, lam)


def test_a_reply_with_a_foreign_layout_is_rejected_and_leaves_the_state_intact():
    # Prepare
    server = FedSM(["a", "b"], {"w": np.zeros(2)}, {"fc": np.zeros(1)}, 0.5)
    foreign = FedSMUpdate({"w": np.zeros(3)}, {"w": np.zeros(3)}, {"fc": np.zeros(1)}, {}, 1)

    # Execute / Assert
    with pytest.raises(ValueError, match=r"global model from a: 'w' has shape \(3,\), expected \(2,\)"):
        server.aggregate({"a": foreign, "b": foreign})
    assert server.global_weights["w"].shape == (2,)
    assert server.personalized["a"]["w"].shape == (2,)


def test_equal_selector_weighting_averages_selector_and_moments_per_site():
    # Prepare
    server = _server(selector_weighting="equal")

    # Execute
    server.aggregate(_round_updates())

    # Assert
    # global still by size: 0.25 * [4, 0] + 0.75 * [0, 4] = [1, 3]
    np.testing.assert_array_equal(server.global_weights["w"], [1.0, 3.0])
    # selector per site: 0.5 * 2 + 0.5 * 6 = 4;  exp_avg = 0.5 * 1 + 0.5 * 5 = 3
    np.testing.assert_array_equal(server.selector_weights["fc"], [4.0])
    np.testing.assert_array_equal(server.selector_optimizer["fc/exp_avg"], [3.0])


def test_unknown_selector_weighting_is_rejected():
    with pytest.raises(ValueError, match="selector-weighting = 'median'"):
        FedSM(["a"], {"w": np.zeros(1)}, {"fc": np.zeros(1)}, 1.0, "median")


def test_the_global_model_takes_the_server_optimizers_step_and_fednovas_average():
    # Prepare: FedAvgM (lr 0.5) over FedNova's average; site a (n = 1) took 2 steps, site b (n = 3) 6 steps
    server = FedSM(SITES, {"w": np.array([0.0, 0.0])}, {"fc": np.array([0.0])}, 0.5, "size",
                   server_optimizer=ServerOptimizerSettings("momentum", lr=0.5, step_normalization="fednova"))
    updates = {site: dataclasses.replace(update, global_weights={"w": update.global_weights["w"]},
                                         personal_weights={"w": update.personal_weights["w"]}, steps=steps)
               for (site, update), steps in zip(_round_updates().items(), (2.0, 6.0), strict=True)}

    # Execute
    server.aggregate(updates, server_round=1)

    # Assert, by hand: p = (1/4, 3/4), tau_eff = 5; per-step updates (2, 0) and (0, 2/3);
    # FedNova's average 5 * (1/4 * (2, 0) + 3/4 * (0, 2/3)) = (2.5, 2.5); half a step toward it: (1.25, 1.25)
    np.testing.assert_allclose(server.global_weights["w"], [1.25, 1.25], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(server.selector_weights["fc"], [5.0])  # the selector is averaged as before
