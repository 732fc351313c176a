"""The ClientApp side of the attack simulator: a simulated site named by ``attack`` turns malicious.

What each attack does is in :mod:`fedsm_core.algorithms.attacks`; here the
site's training data (``label-flip``) and its reply (the rest) are changed.
Only a simulated node attacks: a deployment SuperNode (its node config names
its site) refuses the key, whatever the ServerApp let through.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
from flwr.app import RecordDict

from app_protocol import records
from fedsm_core.algorithms.attacks import INFLATION, AttackSettings, noised, sign_flipped
from fedsm_core.data.arrays import SiteSplits
from fedsm_core.models.weights import Weights


def site_attacks(settings: AttackSettings, site: str, node_config: Mapping[str, object]) -> tuple[str, ...]:
    """The attacks ``site`` makes; ``RuntimeError`` if it is named but this node is not simulated."""
    attacks = settings.of(site)
    if attacks and "partition-id" not in node_config:
        raise RuntimeError(f"attack = '{settings.plan}' names site '{site}', but this node is a deployment SuperNode: "
                           "the attack simulator runs only in the simulation; remove the attack key")
    return attacks


def with_flipped_labels(site: SiteSplits) -> SiteSplits:
    """``label-flip``: the site's training masks inverted (``1 - y``); images and other splits unchanged."""
    train = dataclasses.replace(site.train, masks=1.0 - site.train.masks)
    return dataclasses.replace(site, train=train)


def attacked_reply(content: RecordDict, received: Mapping[str, Weights], attacks: tuple[str, ...],
                   scale: float, seed: int) -> RecordDict:
    """The reply with the model-level attacks applied.

    These are ``sign-flip``, ``noise``, ``poison-personalized`` and ``inflate-count``.

    Parameters
    ----------
    received : mapping
        The weights the server sent, by record key: the update is measured from them.
    seed : int
        Seeds ``noise`` (the round's and site's seed, so a rerun attacks alike).
    """
    if ("sign-flip" in attacks or "noise" in attacks) and records.GLOBAL in content:
        trained = records.from_record(content[records.GLOBAL])
        sent = received[records.GLOBAL]
        bad = sign_flipped(sent, trained, scale) if "sign-flip" in attacks else \
            noised(sent, trained, scale, np.random.default_rng(seed))
        content[records.GLOBAL] = records.to_record(bad)
    if "poison-personalized" in attacks and records.PERSONAL in content:
        trained = records.from_record(content[records.PERSONAL])
        # a fine-tuning reply's personalized model started from the global model it was sent
        start = received[records.PERSONAL] if records.PERSONAL in received else received[records.GLOBAL]
        content[records.PERSONAL] = records.to_record(sign_flipped(start, trained, scale))
    if "inflate-count" in attacks:
        metrics = content[records.METRICS]
        metrics["num-examples"] = int(metrics["num-examples"]) * INFLATION
    return content
