"""One FedSM round at one site, with what the site keeps between rounds.

Algorithm 1 itself is :func:`~fedsm_core.algorithms.fedsm.client.train_fedsm_client`.
Around it, a site keeps state of its own from one round to the next, never sent:

- the personalization method's state (APFL's ``v_k`` and ``alpha_k``, ...);
- the selector's Adam moments under ``selector-moments = local`` (the server's
  averaged moments are used otherwise);
- the Adam states of its global copy and personalized model under
  ``optimizer-state = local``.

Where that state lives is the caller's: the ClientApp keeps it in files on the
site's disk (``client_app/site_state.py``), the in-process loop of the
experiments in a dictionary per site. Both call :func:`fedsm_site_round`, so the
two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from fedsm_core.algorithms.fedsm.client import train_fedsm_client
from fedsm_core.algorithms.fedsm.fedsm import FedSMPayload, FedSMUpdate
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import Weights

# What a site keeps between rounds
PERSONAL = "personal"  # the personalization method's state
SELECTOR_MOMENTS = "selector-moments"  # the selector's Adam moments (selector-moments = local)
OPTIMIZER = "optimizer"  # the Adam states of the global copy and personalized model (optimizer-state = local)
KINDS = (PERSONAL, SELECTOR_MOMENTS, OPTIMIZER)


class SiteMemory(Protocol):
    """Where one site keeps its state between rounds."""

    def load(self, kind: str) -> Weights | None:
        """The arrays kept under ``kind`` (one of :data:`KINDS`), or ``None`` before the first save."""

    def save(self, kind: str, arrays: Weights) -> None:
        """Keep ``arrays`` under ``kind`` for the next round."""


@dataclasses.dataclass(frozen=True)
class KeptState:
    """What a site keeps between rounds besides the personalization state.

    Attributes
    ----------
    selector_moments : bool
        The selector's Adam moments stay at the site (``selector-moments = local``).
    optimizer_state : bool
        The Adam states of the global copy and personalized model stay at the
        site (``optimizer-state = local``).
    """

    selector_moments: bool = True
    optimizer_state: bool = False


@dataclasses.dataclass
class DictMemory:
    """A site's state in a dictionary (the in-process loop, tests)."""

    kept: dict[str, Weights] = dataclasses.field(default_factory=dict)

    def load(self, kind: str) -> Weights | None:
        """See :class:`SiteMemory`."""
        return self.kept.get(kind)

    def save(self, kind: str, arrays: Weights) -> None:
        """See :class:`SiteMemory`."""
        self.kept[kind] = arrays


def fedsm_site_round(payload: FedSMPayload, site_index: int, data: SegArrays, spec: ModelSpec,
                     settings: RoundSettings, device: torch.device, keeps: KeptState,
                     memory: SiteMemory) -> tuple[FedSMUpdate, dict[str, float]]:
    """Algorithm 1 at site ``site_index`` from the server's ``payload`` and what ``memory`` kept.

    Returns the update to send, with the selector moments left out when
    ``keeps.selector_moments`` (they stay in ``memory``), and the round's
    training metrics.
    """
    local_moments = keeps.selector_moments
    if local_moments:  # this site's own moments from its previous round, never sent
        payload = dataclasses.replace(payload, selector_optimizer=memory.load(SELECTOR_MOMENTS) or {})
    kept = (memory.load(OPTIMIZER) or {}) if keeps.optimizer_state else None
    update, metrics = train_fedsm_client(payload, site_index, data, spec, settings, device,
                                         memory.load(PERSONAL) or {}, kept)
    if update.client_state:
        memory.save(PERSONAL, update.client_state)
    if update.optimizer_state is not None:
        memory.save(OPTIMIZER, update.optimizer_state)
    if local_moments:
        memory.save(SELECTOR_MOMENTS, update.selector_optimizer)
        update = dataclasses.replace(update, selector_optimizer={})
    return update, metrics
