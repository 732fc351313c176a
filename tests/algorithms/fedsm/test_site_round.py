"""A site's FedSM round keeps what it must between rounds, and sends none of it."""

from __future__ import annotations

import numpy as np
import torch

from fedsm_core.algorithms.fedsm.client import train_fedsm_client
from fedsm_core.algorithms.fedsm.fedsm import FedSMPayload
from fedsm_core.algorithms.fedsm.site_round import (
    OPTIMIZER,
    PERSONAL,
    SELECTOR_MOMENTS,
    DictMemory,
    fedsm_site_round,
)
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SegArrays
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights

SETTINGS = RoundSettings(batch_size=4, local_epochs=1, max_local_steps=0, lr=1e-3, selector_lr=1e-3, seed=3,
                         augmentation="none")


def _start():
    spec = ModelSpec("mobilenet_v2", num_structures=1, num_sites=3, selector_width=4)
    torch.manual_seed(0)
    segmentation, selector = get_weights(spec.build_segmentation()), get_weights(spec.build_selector())
    rng = np.random.default_rng(0)
    data = SegArrays(rng.random((6, 3, 32, 32), dtype=np.float32),
                     (rng.random((6, 1, 32, 32)) > 0.5).astype(np.float32), tuple(f"x/{i}" for i in range(6)))
    return spec, FedSMPayload(segmentation, segmentation, selector, {}), data


def _round(payload, memory, config, seed):
    spec, _, data = _start()
    torch.manual_seed(seed)
    return fedsm_site_round(payload, 1, data, spec, SETTINGS, torch.device("cpu"), config.kept_state,
                            memory)


def test_local_state_is_kept_in_memory_and_not_sent_and_round_two_starts_from_it():
    # Prepare
    torch.set_num_threads(1)
    config = RunConfig.from_mapping({"selector-moments": "local", "optimizer-state": "local"})
    spec, payload, data = _start()
    memory = DictMemory()

    # Execute: two rounds through the site round, and round two by hand from what round one kept
    first, _ = _round(payload, memory, config, seed=1)
    kept_after_first = dict(memory.kept)
    second_payload = FedSMPayload(first.global_weights, first.personal_weights, first.selector_weights, {})
    second, _ = _round(second_payload, memory, config, seed=2)
    torch.manual_seed(2)
    by_hand, _ = train_fedsm_client(
        FedSMPayload(first.global_weights, first.personal_weights, first.selector_weights,
                     kept_after_first[SELECTOR_MOMENTS]),
        1, data, spec, SETTINGS, torch.device("cpu"), kept_after_first.get(PERSONAL, {}), kept_after_first[OPTIMIZER])

    # Assert: the moments stay at the site; round two is Algorithm 1 from the kept state, bit for bit
    assert first.selector_optimizer == {} and set(kept_after_first) >= {SELECTOR_MOMENTS, OPTIMIZER}
    for key, value in by_hand.global_weights.items():
        np.testing.assert_array_equal(second.global_weights[key], value, err_msg=key)
    for key, value in by_hand.selector_optimizer.items():
        np.testing.assert_array_equal(memory.kept[SELECTOR_MOMENTS][key], value, err_msg=key)


def test_under_the_papers_settings_nothing_is_kept_but_the_moments_travel():
    # Prepare: the server averages the selector's moments; every round starts fresh Adams
    config = RunConfig.from_mapping({"selector-moments": "averaged", "optimizer-state": "reset"})
    _, payload, _ = _start()
    memory = DictMemory()

    # Execute
    update, _ = _round(payload, memory, config, seed=1)

    # Assert
    assert memory.kept == {} and update.selector_optimizer != {}
