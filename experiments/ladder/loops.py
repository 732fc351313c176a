"""The cells of the generalization-gap ladder: centralized, FedAvg and FedSM loops in this process.

They compose the functions the apps call (:func:`train_global_client` and
:func:`~fedsm_core.algorithms.aggregation.weighted_average` for FedAvg; the
in-process FedSM rounds of :mod:`experiments.in_process`;
:func:`~fedsm_core.analysis.pooled.train_on_arrays` for centralized), with the
same per-(round, site) seeds as the app, and add what a study needs on top: a
different training partition, a checkpoint after every evaluated round, and
scores of every cell on the real sites' validation and test splits.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from pathlib import Path

import numpy as np
import torch

from experiments import in_process
from fedsm_core.algorithms.baselines.global_client import GlobalClientOptions, train_global_client
from fedsm_core.algorithms.baselines.scaffold import update_server_control, zero_controls
from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID, choose_gamma, pool_sweeps
from fedsm_core.algorithms.fedsm.site_round import DictMemory
from fedsm_core.algorithms.server_optimizer import ServerOptimizer
from fedsm_core.analysis.pooled import centralized_settings, concat_arrays, pass_lr_factor, train_on_arrays
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.registry import training_dataset
from fedsm_core.data.repartition import repartition
from fedsm_core.data.statistics import channel_statistics
from fedsm_core.device import select_device, set_cpu_threads
from fedsm_core.evaluation.super_model_evaluation import evaluate_model
from fedsm_core.methods import method
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import Weights, get_weights, set_weights
from fedsm_core.run_files.run_outputs import pool_site_metrics
from fedsm_core.training.optimizer_state import fresh_adam_state

POOLED = "pooled"


@dataclasses.dataclass
class CellResult:
    """What one cell measured: validation curves and test Dice per deployed-model candidate.

    ``curves[model]`` is ``[(round, pooled validation Dice)]``; ``tests[model]``
    maps each real site and ``pooled`` to test Dice. ``model`` is ``global``
    (FedAvg's model, FedSM's global model, the centralized model) or ``super``.
    """

    curves: dict[str, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)
    tests: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def rows(self) -> list[tuple[str, int, str, float]]:
        """``(kind, round, site, value)``: ``val``/``test`` for the global model, ``-super`` for the super model."""
        last = max((r for curve in self.curves.values() for r, _ in curve), default=0)
        suffix = {"global": "", "super": "-super"}
        rows = [(f"val{suffix[m]}", r, POOLED, d) for m, curve in self.curves.items() for r, d in curve]
        rows += [(f"test{suffix[m]}", last, site, d) for m, test in self.tests.items() for site, d in test.items()]
        return [*rows, ("seconds", last, "", self.seconds)]

    def client_average(self) -> float:
        """Mean test Dice over the real sites of the deployed model (the super model where there is one)."""
        test = self.tests.get("super", self.tests["global"])
        return float(np.mean([d for site, d in test.items() if site != POOLED]))


def report(config: RunConfig, server_round: int, dice: float) -> None:
    """One progress line per evaluated round: a cell of 100 rounds takes minutes to an hour on a CPU."""
    print(f"[ladder]   round {server_round}/{config.num_server_rounds}: pooled validation Dice {dice:.4f}", flush=True)


def load_sites(config: RunConfig) -> list[SiteSplits]:
    """Every real site of the run's dataset, as the ClientApps load them."""
    info = training_dataset(config.dataset, config.held_out_site)
    return [info.load_site(i, config.image_size, config.data_scale, config.data_seed) for i in range(info.num_sites)]


def score(model: torch.nn.Module, sites: list[SiteSplits], split: str, device: torch.device) -> dict[str, float]:
    """Dice of ``model`` on ``split`` of each real site, and pooled over them."""
    per_site = {s.name: evaluate_model(model, getattr(s, split), device=device) for s in sites}
    return {**{name: m["dice-global"] for name, m in per_site.items()},
            POOLED: pool_site_metrics(per_site)["dice-global"]}


def centralized_cell(config: RunConfig, folder: Path) -> CellResult:
    """One Adam over ``num-server-rounds * local-epochs`` passes of the pooled training images."""
    sites, device = load_sites(config), select_device(config.device)
    spec = config.model_spec(sites[0].train.masks.shape[1], len(sites))
    settings = centralized_settings(config, config.seed)
    curve: list[tuple[int, float]] = []
    validation = {s.name: s.val for s in sites}

    def on_epoch(epoch: int, dice: float) -> None:
        if epoch % config.eval_every == 0 or epoch == config.num_server_rounds:
            curve.append((epoch, dice))
            report(config, epoch, dice)

    model = train_on_arrays(spec, concat_arrays([s.train for s in sites]), settings,
                            config.num_server_rounds * config.local_epochs, validation, device, on_epoch,
                            pass_lr_factor(config), restart_every=0)  # the ladder's reference: one Adam throughout
    return CellResult({"global": curve}, {"global": score(model, sites, "test", device)})


def read_cell_checkpoint(folder: Path) -> dict | None:
    """A cell's last saved state (``<folder>/checkpoint.pt``), or None before its first save."""
    path = folder / "checkpoint.pt"
    return torch.load(path, weights_only=False) if path.exists() else None


def save_cell_checkpoint(folder: Path, state: dict) -> None:
    """Write a cell's state to ``<folder>/checkpoint.pt`` (read back by :func:`read_cell_checkpoint`)."""
    folder.mkdir(parents=True, exist_ok=True)
    # Protocol 5 pickles the NumPy arrays as raw buffers: torch.save's default (2) takes about five times as
    # long and a half more disk for a cell's weights and Adam states.
    torch.save(state, folder / "checkpoint.tmp", pickle_protocol=pickle.HIGHEST_PROTOCOL)
    (folder / "checkpoint.tmp").replace(folder / "checkpoint.pt")  # a crash mid-write keeps the previous one


def round_state(spec: ModelSpec) -> dict:
    """What a single-model cell keeps between rounds besides the weights, before round 1."""
    model = spec.build_segmentation()
    return {"server-optimizer": {}, "optimizer-states": {}, "client-controls": {},
            "server-control": zero_controls(model), "averaged-optimizer": fresh_adam_state(model)}


def _site_options(config: RunConfig, site: str, state: dict) -> GlobalClientOptions:
    """What a site trains with this round: FedProx's ``mu``, SCAFFOLD's ``c`` and ``c_k``, its kept Adam state."""
    row = method(config.strategy)
    if row.adds("control-variates") and site not in state["client-controls"]:  # c_k starts at zero, as on a node
        state["client-controls"][site] = {k: np.zeros_like(v) for k, v in state["server-control"].items()}
    return GlobalClientOptions(
        proximal_mu=config.proximal_mu if row.adds("proximal") else 0.0,
        server_control=state["server-control"] if row.adds("control-variates") else None,
        client_control=state["client-controls"][site] if row.adds("control-variates") else None,
        optimizer_state={"local": state["optimizer-states"].get(site, {}), "averaged": state["averaged-optimizer"]}.get(
            config.optimizer_state))


def fedavg_round(weights: Weights, train_sites: list[SiteSplits], spec: ModelSpec, config: RunConfig,
                 server_round: int, device: torch.device, optimizer: ServerOptimizer, state: dict) -> Weights:
    """One round of a single-model strategy as the app runs it (FedAvg, FedProx or SCAFFOLD).

    Each site trains from ``weights``; the server averages them (``step-normalization``) and takes its optimizer's
    step (``server-optimizer``; ``none`` keeps the average).

    ``state`` holds what outlives a round: each site's Adam state (``optimizer-state = local``) and
    SCAFFOLD's ``c`` and ``c_k``, read and updated here; under ``optimizer-state = averaged`` the
    sites' Adam states are averaged, as the model is, into the one they all start the next round from.
    """
    updates, steps, deltas = [], [], []
    for index, site in enumerate(train_sites):
        options = _site_options(config, site.name, state)
        update, metrics = train_global_client(weights, site.train, spec, config.round_settings(server_round, index),
                                              options, device)
        if config.optimizer_state == "local":
            state["optimizer-states"][site.name] = update.optimizer_state
        if update.client_control is not None:
            deltas.append({k: update.client_control[k] - options.client_control[k] for k in update.client_control})
            state["client-controls"][site.name] = update.client_control
        updates.append(update)
        steps.append(metrics["steps"])
    if deltas:  # the app's ScaffoldStrategy.after_aggregation
        state["server-control"] = update_server_control(state["server-control"], deltas, len(train_sites),
                                                        config.aggregation_settings)
    if config.optimizer_state == "averaged":
        state["averaged-optimizer"] = optimizer.average([u.optimizer_state for u in updates],
                                                        [u.num_examples for u in updates])
    return optimizer.aggregate(weights, [u.weights for u in updates], [u.num_examples for u in updates], steps,
                               server_round, [site.name for site in train_sites])


def fedavg_cell(config: RunConfig, rung: str, folder: Path) -> CellResult:
    """FedAvg, FedProx or SCAFFOLD (``strategy``) on the ``rung`` partition, scored on the real sites."""
    sites, device = load_sites(config), select_device(config.device)
    train_sites = repartition(sites, rung, config.data_seed)
    spec = config.model_spec(sites[0].train.masks.shape[1], len(train_sites))
    model = spec.build_segmentation()
    state = read_cell_checkpoint(folder)
    if state is None:
        torch.manual_seed(config.seed)  # the app's initial model (server_app.strategies.builder)
        state = {"round": 0, "weights": get_weights(spec.build_segmentation()), "curve": [], "seconds": 0.0}
    state = {**round_state(spec), **state}  # the ladder's first checkpoints lack some of it
    optimizer = ServerOptimizer(config.server_settings, config.aggregation_settings)
    optimizer.load_state_dict(state["server-optimizer"])
    while state["round"] < config.num_server_rounds:
        began, server_round = time.monotonic(), state["round"] + 1
        state["weights"] = fedavg_round(state["weights"], train_sites, spec, config, server_round, device, optimizer,
                                        state)
        state["round"], state["server-optimizer"] = server_round, optimizer.state_dict()
        if server_round % config.eval_every == 0 or server_round == config.num_server_rounds:
            set_weights(model, state["weights"], "global model")
            state["curve"].append((server_round, score(model.to(device), sites, "val", device)[POOLED]))
            report(config, server_round, state["curve"][-1][1])
        state["seconds"] += time.monotonic() - began
        if server_round % config.eval_every == 0:
            save_cell_checkpoint(folder, state)
    set_weights(model, state["weights"], "global model")
    return CellResult({"global": state["curve"]}, {"global": score(model.to(device), sites, "test", device)},
                      state["seconds"])


def fedsm_federation(config: RunConfig, train_sites: list[SiteSplits], device: torch.device) -> in_process.Federation:
    """The in-process FedSM federation over ``train_sites``, from the app's start state."""
    spec = config.model_spec(train_sites[0].train.masks.shape[1], len(train_sites))
    fedsm, _ = config.start_fedsm(spec, [s.name for s in train_sites],
                             [channel_statistics(s.train.images) for s in train_sites])
    return in_process.Federation(config, train_sites, spec, fedsm, device)


def _super_validation(federation: in_process.Federation) -> tuple[dict, float]:
    """Per-site validation metrics with the gamma sweep, and the pooled super-model Dice at the gamma it chooses.

    The gamma is the run's rule (``gamma-selection``); with one gamma per
    personalized model the curve shows the best single gamma instead.
    """
    in_process.fit_selector_head(federation)
    validation = in_process.evaluate(federation, "val", federation.config.gamma)
    sweeps = {site: (m["dice-super-sweep"], float(m["num-images"]) - float(m.get("num-empty", 0.0)))
              for site, m in validation.items()}
    pooled = pool_sweeps(sweeps, GAMMA_GRID)
    gamma = in_process.chosen_gamma(federation.config, validation)
    if isinstance(gamma, tuple):
        gamma = choose_gamma(pooled, GAMMA_GRID)
    return validation, pooled[GAMMA_GRID.index(gamma)]


def fedsm_cell(config: RunConfig, rung: str, folder: Path) -> CellResult:
    """FedSM on the ``rung`` partition: its global model always, its super model where the rung has K sites.

    With ``one-site`` there is one personalized model and nothing to route, so
    only the global model is scored.
    """
    sites, device = load_sites(config), select_device(config.device)
    federation = fedsm_federation(config, repartition(sites, rung, config.data_seed), device)
    routed = len(federation.sites) == len(sites)
    fresh = {"round": 0, "curves": {"global": [], "super": []} if routed else {"global": []},
             "validation": {}, "seconds": 0.0}
    state = read_cell_checkpoint(folder) or fresh
    if state["round"]:
        federation.fedsm, kept = state["federation"]
        federation.memories = {site: DictMemory(dict(arrays)) for site, arrays in kept.items()}
    model = federation.spec.build_segmentation()
    while state["round"] < config.num_server_rounds:
        began, server_round = time.monotonic(), state["round"] + 1
        in_process.train_round(federation, server_round)
        state["round"] = server_round
        if server_round % config.eval_every == 0 or server_round == config.num_server_rounds:
            set_weights(model, federation.fedsm.global_weights, "global model")
            state["curves"]["global"].append((server_round, score(model.to(device), sites, "val", device)[POOLED]))
            report(config, server_round, state["curves"]["global"][-1][1])
            if routed:
                state["validation"], dice = _super_validation(federation)
                state["curves"]["super"].append((server_round, dice))
        state["seconds"] += time.monotonic() - began
        state["federation"] = (federation.fedsm, {site: m.kept for site, m in federation.memories.items()})
        if server_round % config.eval_every == 0:
            save_cell_checkpoint(folder, state)
    set_weights(model, federation.fedsm.global_weights, "global model")
    tests = {"global": score(model.to(device), sites, "test", device)}
    if routed:
        gamma = in_process.chosen_gamma(config, state["validation"])
        test = in_process.evaluate(federation, "test", gamma)
        tests["super"] = {**{name: float(m["dice-super"]) for name, m in test.items()},
                          POOLED: pool_site_metrics({n: {k: v for k, v in m.items() if not isinstance(v, list)}
                                                     for n, m in test.items()})["dice-super"]}
    return CellResult(state["curves"], tests, state["seconds"])


def run_cell(config: RunConfig, method: str, rung: str, folder: Path) -> CellResult:
    """Train and score one cell (``method`` ``centralized``, ``fedsm`` or a single-model strategy) in ``folder``."""
    set_cpu_threads(config.torch_threads)
    started = time.monotonic()
    if method == "centralized":
        result = centralized_cell(config, folder)
        result.seconds = time.monotonic() - started
        return result
    return fedsm_cell(config, rung, folder) if method == "fedsm" else fedavg_cell(config, rung, folder)
