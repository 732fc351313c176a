"""The ServerApp: discover sites, run the chosen strategy, evaluate, write the run folder."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from logging import INFO, WARNING
from pathlib import Path

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from app_protocol.evaluate_messages import ask_for_overlays
from fedsm_core.command_line.preflight import require_valid_run
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import training_dataset
from fedsm_core.methods import METHODS
from fedsm_core.report.run_data import OVERLAY_FOLDER
from fedsm_core.report.run_report import write_report
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, check_resumable, load_checkpoint, save_checkpoint
from fedsm_core.run_files.run_outputs import write_summary
from fedsm_core.training.stopping_rule import stops_after, validation_curve
from server_app.discovery import discover_sites
from server_app.round_clock import RoundClock
from server_app.run_folder import SUMMARY_FILE, ProgressReporter, create_run_folder
from server_app.strategies.builder import Setup, build_strategy
from server_app.strategies.site_strategy import SiteStrategy

app = ServerApp()


def read_resume_state(config: RunConfig, sites: tuple[str, ...]) -> dict | None:
    """``resume-from``'s checkpoint, checked against this run's settings; None for a fresh run.

    Read before any node is asked, so an unreadable or mismatched checkpoint
    stops the run at once, not after every site has loaded its data.
    """
    if not config.resume_from:
        return None
    state = load_checkpoint(config.resume_from)
    check_resumable(state, config.to_mapping(), sites, config.total_rounds, config.resume_from)
    return state


def resume(strategy: SiteStrategy, state: dict | None, config: RunConfig, reporter: ProgressReporter) -> int:
    """Load a checked checkpoint into ``strategy`` and the metrics log; return the first round to run (1: fresh)."""
    if state is None:
        return 1
    strategy.load_state_dict(state["state"])
    reporter.metrics.extend(state["metrics"])
    log(INFO, "Resuming from %s after round %d", config.resume_from, state["round"])
    return int(state["round"]) + 1


def stopping_check(config: RunConfig, reporter: ProgressReporter) -> Callable[[int], bool]:
    """Whether the run's stopping rule (the ``stop-*`` keys) ends training after a round; never without one."""
    rule = config.stopping_rule
    score = METHODS[config.strategy].score
    if rule is None:
        return lambda server_round: False
    return lambda server_round: stops_after(validation_curve(reporter.metrics.rows, score), server_round, rule)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the strategy of ``[tool.flwr.app.config]`` and write metrics, summary and model."""
    started = time.monotonic()
    config = RunConfig.from_mapping(context.run_config)
    require_valid_run(config)  # before a run folder exists or any node is asked
    info = training_dataset(config.dataset, config.held_out_site)
    resumed = read_resume_state(config, info.site_names)
    folder = create_run_folder(config)
    log(INFO, "Run folder: %s", folder)
    nodes = discover_sites(grid, info.site_names, timeout=min(config.round_timeout, 600.0),
                           simulation_only=f"attack = '{config.attack}'" if config.attack else "")
    hint = config.training_settings.short_round_hint({node.site_name: node.num_train for node in nodes})
    if hint:
        log(INFO, "Hint: %s", hint)
    spec = config.model_spec(len(info.structures), info.num_sites)
    reporter = ProgressReporter(folder, config.total_rounds)
    # The sites keep per-site state under this key; a resumed run takes its original run's key instead. The
    # random part keeps apart runs started in the same second under other output folders (same folder name).
    state_key = f"{folder.name}-{uuid.uuid4().hex[:8]}"
    strategy, save_model = build_strategy(Setup(config, info, spec, nodes, reporter, state_key=state_key))
    first_round = resume(strategy, resumed, config, reporter)
    checkpoint = folder / CHECKPOINT_FILE
    clock = RoundClock(first_round, strategy.num_rounds)

    stopped = stopping_check(config, reporter)
    if first_round > 1 and stopped(first_round - 1):  # the checkpoint is from the round the rule ended training at
        strategy.num_rounds = first_round - 1

    def after_round(server_round: int) -> bool:
        save_checkpoint(checkpoint, server_round, config.to_mapping(), info.site_names, strategy.name,
                        strategy.state_dict(), reporter.metrics.rows)
        log(INFO, "%s", clock.line(server_round))
        return stopped(server_round)

    if first_round > strategy.num_rounds:  # a checkpoint of the last round: only the end of the run is left
        log(INFO, "No round left to train: finishing the checkpoint's round %d", first_round - 1)
        save_checkpoint(checkpoint, first_round - 1, config.to_mapping(), info.site_names, strategy.name,
                        strategy.state_dict(), reporter.metrics.rows)

    strategy.traffic.add_time(0, "setup", time.monotonic() - started)
    strategy.run(grid, first_round, config.round_timeout, after_round)
    validation_notes = run_test(grid, strategy, config, folder)
    saved = save_model(folder)
    wall = time.monotonic() - started
    strategy.traffic.add_time(0, "server-app", wall)
    strategy.traffic.write(folder)
    write_outcome(folder, config, strategy, reporter, [f"wall time {wall:.1f} s", f"model: {saved.name}",
                                                       *validation_notes])
    log(INFO, "%s finished in %.1f s; results in %s", strategy.name, wall, folder)


def run_test(grid: Grid, strategy: SiteStrategy, config: RunConfig, folder: Path) -> list[str]:
    """Settle what validation chooses (FedSM's gamma), then evaluate the test split; returns the validation notes."""
    validation_notes = strategy.finish_validation()
    strategy.prepare_evaluation(grid, strategy.num_rounds, config.round_timeout, "test")
    test_messages = strategy.evaluation_messages("test")
    for message in test_messages:  # the sites draw the report's test images (simulation: into the run folder)
        ask_for_overlays(message.content, str(folder / OVERLAY_FOLDER))
    test_replies = strategy.exchange(grid, test_messages, config.round_timeout, strategy.num_rounds, stage="test")
    strategy.collect_evaluation(strategy.num_rounds, "test", test_replies)
    return validation_notes


def left_out_notes(left_out: list[tuple[int, str, str]]) -> list[str]:
    """One summary line per site and model the filtered mean left out, with the rounds."""
    rounds: dict[tuple[str, str], list[int]] = {}
    for server_round, site, model in left_out:
        rounds.setdefault((site, model), []).append(server_round)
    return [f"filtered mean: {site}'s {model} left out in {len(found)} round(s): {describe_rounds(found)}"
            for (site, model), found in rounds.items()]


def describe_rounds(rounds: list[int]) -> str:
    """Sorted rounds with runs collapsed: ``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    spans: list[list[int]] = []
    for server_round in sorted(set(rounds)):
        if spans and server_round == spans[-1][1] + 1:
            spans[-1][1] = server_round
        else:
            spans.append([server_round, server_round])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def write_outcome(folder: Path, config: RunConfig, strategy: SiteStrategy, reporter: ProgressReporter,
                  notes: list[str]) -> None:
    """``summary.md`` (with every missed round and missing test result) and ``report.html``."""
    for server_round, site, why in strategy.missed:
        log(WARNING, "round %d: %s missed (%s)", server_round, site, why)
        notes.append(f"round {server_round}: {site} missed ({why})")
    for site, kind in config.attack_settings.items():
        notes.append(f"simulated attack: {site} is malicious ({kind}, attack-scale {config.attack_scale:g}); "
                     f"aggregation = {config.aggregation}")
    for server_round, site, claimed, reported in strategy.capped:
        notes.append(f"round {server_round}: {site} claimed {claimed} training images, counted as the {reported} "
                     "it reported at discovery")
    notes += left_out_notes(strategy.left_out)
    for site, why in strategy.evaluation_gaps.get("test", {}).items():
        log(WARNING, "%s has no test result (%s)", site, why)
        notes.append(f"no test result for {site}: {why}")
    write_summary(
        folder / SUMMARY_FILE,
        f"{strategy.name} on {config.dataset}, {strategy.num_rounds} rounds",
        config.to_mapping(),
        [(f"Test ({strategy.num_rounds} rounds)", reporter.latest.get("test", {})),
         ("Validation (last evaluated round)", reporter.latest.get("val", {}))],
        notes,
    )
    write_run_report(folder)


def write_run_report(folder: Path) -> None:
    """``report.html``; a report that cannot be drawn is logged, the run's results stand without it."""
    try:
        log(INFO, "Report: %s", write_report(folder))
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        log(WARNING, "report.html not written (%s: %s); rebuild it with: fedsm report %s",
            type(error).__name__, error, folder)
