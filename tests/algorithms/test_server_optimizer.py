"""Server optimizers: hand-computed float64 steps, the reduction to FedAvg, and agreement with Flower's own."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvgM, FedYogi

from fedsm_core.algorithms.aggregation import weighted_average
from fedsm_core.algorithms.robust_aggregation import AggregationSettings
from fedsm_core.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerSettings

SIZES = [3, 1, 2]


def _sites(round_index: int, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    return [{"w": rng.normal(size=(2, 3)) + round_index, "b": rng.normal(size=4)} for _ in SIZES]


def test_momentum_with_lr_1_and_no_momentum_is_fedavg():
    rng = np.random.default_rng(0)
    current = {"w": rng.normal(size=(2, 3)).astype(np.float32), "count": np.array(7)}
    sites = [{"w": rng.normal(size=(2, 3)).astype(np.float32), "count": np.array(c)} for c in (8, 10, 9)]
    averaged = weighted_average(sites, SIZES)

    stepped = ServerOptimizer(ServerOptimizerSettings("momentum", lr=1.0, momentum=0.0)).step(current, averaged, 1)

    np.testing.assert_array_equal(stepped["w"], averaged["w"])
    assert stepped["w"].dtype == np.float32 and stepped["count"] == averaged["count"]  # counts are averaged only
    assert ServerOptimizer(ServerOptimizerSettings()).step(current, averaged, 1) == averaged


def test_two_hand_computed_steps_of_each_optimizer():
    # Prepare: one scalar parameter at 1.0; the sites average to 2.0, then to 2.5
    w0, avg1, avg2 = {"p": np.array([1.0])}, {"p": np.array([2.0])}, {"p": np.array([2.5])}
    momentum = ServerOptimizer(ServerOptimizerSettings("momentum", lr=0.5, momentum=0.9))
    adam = ServerOptimizer(ServerOptimizerSettings("adam", lr=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3))
    yogi = ServerOptimizer(ServerOptimizerSettings("yogi", lr=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3))

    # Execute and assert, by hand:
    # FedAvgM: g1 = 1 - 2 = -1, m = -1, w1 = 1 + 0.5 = 1.5; g2 = 1.5 - 2.5 = -1, m = -0.9 - 1 = -1.9, w2 = 2.45
    w1 = momentum.step(w0, avg1, 1)
    assert w1["p"][0] == pytest.approx(1.5, abs=1e-15)
    assert momentum.step(w1, avg2, 2)["p"][0] == pytest.approx(2.45, abs=1e-15)
    # FedAdam round 1: d = 1, m = 0.1, v = 0.01, eta_1 = 0.1 sqrt(1 - 0.99^2) / (1 - 0.9^2)
    eta = 0.1 * np.sqrt(1 - 0.99**2) / (1 - 0.9**2)
    assert adam.step(w0, avg1, 1)["p"][0] == pytest.approx(1.0 + eta * 0.1 / (0.1 + 1e-3), abs=1e-15)
    # FedYogi round 1: v = 0 - 0.01 * 1 * sign(0 - 1) = 0.01, w = 1 + 0.1 * 0.1 / (0.1 + 1e-3)
    assert yogi.step(w0, avg1, 1)["p"][0] == pytest.approx(1.0 + 0.1 * 0.1 / (0.1 + 1e-3), abs=1e-15)


def _replies(sites: list[dict[str, np.ndarray]]) -> list[Message]:
    return [Message(RecordDict({"arrays": ArrayRecord({k: Array(v.copy()) for k, v in site.items()}),
                                "metrics": MetricRecord({"num-examples": n})}), dst_node_id=index + 1,
                    message_type=MessageType.TRAIN) for index, (site, n) in enumerate(zip(sites, SIZES, strict=True))]


@pytest.mark.parametrize(("settings", "flower"), [
    (ServerOptimizerSettings("momentum", lr=0.7, momentum=0.9), lambda: FedAvgM(server_learning_rate=0.7,
                                                                                server_momentum=0.9)),
    (ServerOptimizerSettings("adam", lr=0.05, beta_1=0.9, beta_2=0.99, tau=1e-3),
     lambda: FedAdam(eta=0.05, beta_1=0.9, beta_2=0.99, tau=1e-3)),
    (ServerOptimizerSettings("yogi", lr=0.02, beta_1=0.8, beta_2=0.95, tau=1e-2),
     lambda: FedYogi(eta=0.02, beta_1=0.8, beta_2=0.95, tau=1e-2)),
], ids=["fedavgm", "fedadam", "fedyogi"])
def test_three_rounds_agree_with_flowers_strategy_on_the_same_replies(server_process, settings, flower):
    # Prepare
    rng = np.random.default_rng(1)
    start = {"w": rng.normal(size=(2, 3)), "b": rng.normal(size=4)}
    ours, theirs = ServerOptimizer(settings), flower()
    mine, current = dict(start), ArrayRecord({k: Array(v.copy()) for k, v in start.items()})
    theirs.current_arrays = current if isinstance(theirs, FedAvgM) else None

    for server_round in (1, 2, 3):
        sites = _sites(server_round, rng)
        # Execute: ours on our weighted average; Flower's on the reply messages (its configure_train keeps w_t)
        mine = ours.step(mine, weighted_average(sites, SIZES), server_round)
        if not isinstance(theirs, FedAvgM):
            theirs.current_arrays = {k: a.numpy() for k, a in current.items()}
        current, _ = theirs.aggregate_train(server_round, _replies(sites))

        # Assert
        for key in start:
            np.testing.assert_allclose(mine[key], current[key].numpy(), rtol=1e-12, atol=1e-12, err_msg=key)


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="server-optimizer = 'sgd' is not one of"):
        ServerOptimizerSettings("sgd")
    with pytest.raises(ValueError, match=r"server-beta2 = 1.5 is outside"):
        ServerOptimizerSettings("adam", beta_2=1.5)
    with pytest.raises(ValueError, match="site-weighting = 'count' is not one of"):
        ServerOptimizerSettings(site_weighting="count")


@pytest.mark.parametrize("normalization", ["none", "fednova"])
def test_equal_site_weighting_counts_every_site_once(normalization):
    # Prepare: sites of 1 and 3 images move the model from 0 to 2 and to 6, in 1 and 3 local steps
    current, sites = {"p": np.array([0.0])}, [{"p": np.array([2.0])}, {"p": np.array([6.0])}]

    def aggregate(weighting: str, sizes: list[float]) -> float:
        settings = ServerOptimizerSettings(step_normalization=normalization, site_weighting=weighting)
        optimizer = ServerOptimizer(settings, AggregationSettings("mean"))
        return float(optimizer.aggregate(current, sites, sizes, [1.0, 3.0], 1)["p"][0])

    # Execute / Assert: by size (1 * 2 + 3 * 6) / 4 = 5; equal (2 + 6) / 2 = 4.
    # FedNova: d_k = Delta_k / tau_k = 2 and 2; tau_eff = sum p_k tau_k = 2.5 (size) or 2 (equal): 5 and 4 again.
    assert aggregate("size", [1.0, 3.0]) == pytest.approx(5.0, abs=1e-12)
    assert aggregate("equal", [1.0, 3.0]) == pytest.approx(4.0, abs=1e-12)
    assert aggregate("equal", [5.0, 5.0]) == aggregate("size", [5.0, 5.0])  # equal sizes: the same average
