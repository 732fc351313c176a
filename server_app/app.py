"""The FedSM ServerApp: discover sites, run the rounds, evaluate, write the run folder."""

from __future__ import annotations

import time
from logging import INFO, WARNING

import torch
from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from client_app import records
from fedsm_core.algorithms.fedsm import FedSM
from fedsm_core.bundle import BundleInfo, save_bundle
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import dataset_info
from fedsm_core.data.statistics import pool_channel_statistics
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from fedsm_core.reporting import write_summary
from server_app.discovery import discover_sites
from server_app.run_folder import BUNDLE_FILE, SUMMARY_FILE, ProgressReporter, create_run_folder
from server_app.strategy import FedSMStrategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run FedSM with the settings of ``[tool.flwr.app.config]``."""
    started = time.monotonic()
    config = RunConfig.from_mapping(context.run_config)
    info = dataset_info(config.dataset)
    folder = create_run_folder(config)
    log(INFO, "FedSM run folder: %s", folder)
    nodes = discover_sites(grid, info.site_names, timeout=min(config.round_timeout, 600.0))
    spec = ModelSpec(config.encoder, len(info.structures), info.num_sites, config.selector_width, norm=config.segmentation_norm)
    torch.manual_seed(config.seed)
    selector = spec.build_selector()
    pixels = pool_channel_statistics([node.pixels for node in nodes])
    selector.set_input_statistics(pixels.mean, pixels.std)
    fedsm = FedSM(info.site_names, get_weights(spec.build_segmentation()), get_weights(selector),
                  config.softpull_lambda, config.selector_weighting)
    reporter = ProgressReporter(folder, config.num_server_rounds)
    strategy = FedSMStrategy(fedsm, nodes, config.gamma, config.eval_every, config.num_server_rounds, reporter)
    strategy.start(
        grid=grid,
        initial_arrays=records.to_record(fedsm.global_weights),
        num_rounds=config.num_server_rounds,
        timeout=config.round_timeout,
    )
    test_replies = grid.send_and_receive(strategy.evaluation_messages("test"), timeout=config.round_timeout)
    strategy.collect_evaluation(config.num_server_rounds, "test", test_replies)
    bundle = save_bundle(
        folder / BUNDLE_FILE,
        BundleInfo(spec, info.site_names, info.structures, config.gamma, config.image_size,
                   {"dataset": config.dataset, "rounds": config.num_server_rounds, "softpull-lambda": config.softpull_lambda}),
        fedsm.global_weights,
        [fedsm.personalized[name] for name in info.site_names],
        fedsm.selector_weights,
    )
    wall = time.monotonic() - started
    notes = [f"wall time {wall:.1f} s", f"super model: {bundle.name}"]
    notes += [f"round {r}: {site} missed ({why})" for r, site, why in strategy.missed]
    for r, site, why in strategy.missed:
        log(WARNING, "round %d: %s missed (%s)", r, site, why)
    write_summary(
        folder / SUMMARY_FILE,
        f"FedSM on {config.dataset}, {config.num_server_rounds} rounds",
        config.to_mapping(),
        [(f"Test ({config.num_server_rounds} rounds)", reporter.latest.get("test", {})),
         ("Validation (last evaluated round)", reporter.latest.get("val", {}))],
        notes,
    )
    log(INFO, "FedSM finished in %.1f s; results in %s", wall, folder)
