"""A site's final fine-tuning (``fine-tune-passes``) and its cross-fitted validation (``fine-tune-gamma``).

After FedSM's last round the server asks every site to fine-tune the final
global model (:mod:`fedsm_core.algorithms.fedsm.final_fine_tuning`); the site
replies with the pass best on its validation split, which becomes its
personalized model. Under ``fine-tune-gamma = "cross-fit"`` the same training
run also keeps the passes best on each half of that split and the site stores
them in its state files, with a fingerprint of the model it replied with. The
last validation round then scores the site's own images of each half with
the other half's model for the gamma sweeps
(:func:`fedsm_core.evaluation.cross_fit.cross_fitted_metrics`), but only while
the super model it is sent holds exactly that replied model: a resumed run, a
rejected reply or an older round's state is scored as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import INFO

import numpy as np
import torch
from flwr.common import log

from client_app.site_state import load_site_state, save_site_state
from fedsm_core.algorithms.fedsm.final_fine_tuning import FineTuned, fine_tune_on_splits
from fedsm_core.algorithms.fedsm.super_model import SuperModel
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SiteSplits
from fedsm_core.evaluation.cross_fit import can_cross_fit, fingerprint, halve_by_case, with_cross_fitted_sweeps
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import Weights

HALVES_STATE = "fine-tuned-halves"  # the site-state file of the passes best on each validation half
FINGERPRINT = "fingerprint"


def fine_tune(config: RunConfig, spec: ModelSpec, global_weights: Weights, site: SiteSplits,
              settings: RoundSettings, device: torch.device, state_key: str) -> FineTuned:
    """The site's fine-tuned model (pass best on its validation split); under cross-fit, its halves kept too."""
    cross_fit = config.fine_tune_gamma == "cross-fit" and can_cross_fit(site.val)
    choosers = [site.val, *halve_by_case(site.val)] if cross_fit else [site.val]
    tuned = fine_tune_on_splits(spec, global_weights, site.train, choosers, config.fine_tune_passes, settings,
                                device)
    if cross_fit:
        arrays = {f"{half}/{name}": value for half, result in enumerate(tuned[1:])
                  for name, value in result.weights.items()}
        arrays[FINGERPRINT] = np.array(fingerprint(tuned[0].weights))
        save_site_state(state_key, site.name, HALVES_STATE, arrays)
    return tuned[0]


def kept_halves(state_key: str, site: str, own_model: Weights | None) -> list[Weights] | None:
    """The site's models of the passes best on validation halves 0 and 1, if ``own_model`` is the one they go with."""
    stored = load_site_state(state_key, site, HALVES_STATE)
    if stored is None or own_model is None or str(stored.pop(FINGERPRINT)) != fingerprint(own_model):
        return None
    halves: list[Weights] = [{}, {}]
    for key, value in stored.items():
        half, name = key.split("/", 1)
        halves[int(half)][name] = value
    return halves


def cross_fit_sweeps(metrics: dict, super_model: SuperModel, spec: ModelSpec, site: SiteSplits, site_index: int,
                     halves: Sequence[Weights], batch_size: int, device: torch.device, gammas: Sequence[float],
                     route_by: str) -> dict:
    """``metrics`` (the site's validation metrics) with its gamma sweeps cross-fitted; the other metrics unchanged."""
    models = [spec.load_segmentation(weights, f"{site.name}'s fine-tuned model (half {half})")
              for half, weights in enumerate(halves)]
    log(INFO, "site %s: validation sweeps cross-fitted on its validation halves (fine-tune-gamma)", site.name)
    return with_cross_fitted_sweeps(metrics, super_model, site_index, site.val, models, batch_size, device, gammas,
                                    route_by)
