"""FedSM's final fine-tuning over the grid: every site's personalized model becomes its fine-tuned global model.

With ``fine-tune-passes = E > 0``, after FedSM's last round and before its
last validation (which chooses gamma), the server sends each site the final
global model; the site fine-tunes it for up to ``E`` passes and keeps the pass
best on its validation split
(:func:`~fedsm_core.algorithms.fedsm.final_fine_tuning.fine_tune_on_validation`).
The reply replaces that site's personalized model. A site whose reply is
missing or rejected keeps the personalized model the rounds trained, and the
summary says so.

Each site's reply changes only its own personalized model: no average is
taken, so the robust aggregations have nothing to act on. A malicious site can
still send a bad model; the selector then routes to it only the images it
takes for that site's, as with SoftPull's models.
"""

from __future__ import annotations

import dataclasses
from logging import INFO, WARNING

from flwr.app import MessageType
from flwr.common import log
from flwr.serverapp import Grid

from app_protocol import records
from app_protocol.train_messages import encode_fine_tune
from fedsm_core.algorithms.fedsm.fedsm import FedSM
from server_app.strategies.site_strategy import SiteStrategy


@dataclasses.dataclass(frozen=True)
class SiteFineTuning:
    """What one site reported of its fine-tuning."""

    site: str
    passes: int
    val_dice_before: float
    val_dice: float

    def describe(self, max_passes: int) -> str:
        """One summary phrase."""
        return (f"{self.site} pass {self.passes} of {max_passes} (validation Dice {self.val_dice_before:.4f} -> "
                f"{self.val_dice:.4f})")


def fine_tune_sites(strategy: SiteStrategy, fedsm: FedSM, max_passes: int, grid: Grid, server_round: int,
                    timeout: float) -> list[SiteFineTuning]:
    """Ask every site to fine-tune ``fedsm``'s global model; put each accepted reply in as its personalized model.

    The request carries round ``server_round + 1``, so the sites' batch order is
    seeded apart from the last round's. Returns the sites that did, in site order.
    """
    content = encode_fine_tune(fedsm.global_weights, server_round + 1)
    messages = strategy.messages({node.site_name: content for node in strategy.nodes}, MessageType.TRAIN)
    done: list[SiteFineTuning] = []
    for reply in strategy.exchange(grid, messages, timeout, server_round, stage="fine-tune"):
        site = strategy.site_of(reply)
        decoded = strategy.decode_weights(server_round, site, reply, {records.PERSONAL: fedsm.global_weights})
        if decoded is None or site not in fedsm.personalized:
            continue
        metrics = reply.content[records.METRICS] if records.METRICS in reply.content else {}
        fedsm.personalized[site] = decoded[records.PERSONAL]
        done.append(SiteFineTuning(site, int(metrics.get("fine-tune-passes", -1)),
                                   float(metrics.get("fine-tune-val-dice-before", float("nan"))),
                                   float(metrics.get("fine-tune-val-dice", float("nan")))))
        log(INFO, "round %d: fine-tuned the global model into a personalized model: %s", server_round,
            done[-1].describe(max_passes))
    kept = sorted(set(fedsm.site_names) - {entry.site for entry in done})
    if kept:
        log(WARNING, "round %d: %s sent no fine-tuned model and keep(s) the personalized model the rounds trained",
            server_round, ", ".join(kept))
    return done


def fine_tuning_notes(done: list[SiteFineTuning], site_names: list[str], max_passes: int) -> list[str]:
    """The summary's lines on the final fine-tuning."""
    if not max_passes:
        return []
    tuned = {entry.site for entry in done}
    notes = ["personalized models fine-tuned from the final global model after the last round (fine-tune-passes = "
             f"{max_passes}): " + "; ".join(entry.describe(max_passes) for entry in done)]
    kept = [site for site in site_names if site not in tuned]
    if kept:
        notes.append(f"not fine-tuned (no accepted reply), SoftPull's personalized model kept: {', '.join(kept)}")
    return notes


def fine_tune_after_stop(strategy: SiteStrategy, grid: Grid, timeout: float) -> None:
    """A run the stopping rule ended: fine-tune now, then validate its last round again.

    The rule reads a round's validation, so that validation came before the
    sites could fine-tune. ``strategy.num_rounds`` is now that round, so
    ``prepare_evaluation`` fine-tunes; the new validation replaces the round's
    rows in ``metrics.csv`` and is the one gamma is chosen on.
    """
    server_round = strategy.num_rounds
    log(INFO, "round %d: training stopped; the sites fine-tune and this round is validated again", server_round)
    strategy.prepare_evaluation(grid, server_round, timeout, "val")
    messages = strategy.evaluation_messages("val")
    strategy.aggregate_evaluate(server_round, strategy.exchange(grid, messages, timeout, server_round))
