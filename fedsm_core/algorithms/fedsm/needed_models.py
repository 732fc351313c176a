"""Which personalized models one site's evaluation uses, so only those travel to it.

Algorithm 2 sends an image to the personalized model ``argmax(y_s)`` when the
selector is confident enough, and to the global model otherwise. Whatever
gamma is, the only personalized models an image can reach are its argmax
candidate (``argmax - 1`` for FedSM-extra's ``K + 1`` selector, where -1 is the
global model). A site's evaluation also scores its own personalized model
(``dice-personal``). So the site needs

    {k} ∪ {argmax_j f_s(x)_j : x in the split}

and nothing else, which with a selector that knows the sites is one U-Net.
The global model and the selector always travel. Routing first costs one
selector per site; it saves every U-Net no image is routed to.

With ``route-by = "case"`` the candidate of a slice is its case's argmax
(:func:`~fedsm_core.algorithms.fedsm.super_model.case_probabilities`), which
need not be the argmax of any single slice, so the candidates come from the
same probabilities the evaluation routes with (:func:`routing_probabilities`).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from fedsm_core.algorithms.fedsm.super_model import selector_probabilities
from fedsm_core.data.arrays import SegArrays
from fedsm_core.data.cases import named_case
from fedsm_core.device import to_device
from fedsm_core.training.batches import iterate_batches


def candidate_models(selector_probs: torch.Tensor, selector_includes_global: bool = False) -> torch.Tensor:
    """Per image, the personalized model Algorithm 2 may route it to (-1: only the global model)."""
    choice = selector_probs.argmax(dim=1)
    return choice - 1 if selector_includes_global else choice


@torch.no_grad()
def routing_probabilities(selector: nn.Module, data: SegArrays, batch_size: int, device: torch.device | str = "cpu",
                          route_by: str = "image") -> torch.Tensor:
    """``[N, K]`` probabilities the super model routes ``data`` with: per image, or per case (``route-by``).

    Runs ``selector`` over the whole split first, since a case's decision
    needs all its slices (:func:`~fedsm_core.algorithms.fedsm.super_model.selector_probabilities`;
    the cases come from the ids, :func:`~fedsm_core.data.cases.named_case`).
    Returned on the CPU.
    """
    selector = selector.eval().to(device)
    logits = [selector(to_device(images, device)).cpu() for images, _ in iterate_batches(data, batch_size,
                                                                                           shuffle=False)]
    if not logits:
        return torch.zeros((0, 0))
    cases = [named_case(example) for example in data.ids] if route_by == "case" else None
    return selector_probabilities(torch.cat(logits), cases, route_by)


@torch.no_grad()
def needed_models(selector: nn.Module, data: SegArrays, site_index: int | None, selector_includes_global: bool,
                  batch_size: int, device: torch.device | str = "cpu", route_by: str = "image") -> list[int]:
    """Sorted indices of the personalized models an evaluation of ``data`` at site ``site_index`` uses.

    Parameters
    ----------
    selector : nn.Module
        The selector that will route the images (its head as it will be evaluated).
    site_index : int or None
        The site's own model, always needed for ``dice-personal``; ``None`` for
        a site outside the federation.
    route_by : {"image", "case"}
        How the evaluation routes (``route-by``): candidates per image or per case.
    """
    needed = set() if site_index is None else {int(site_index)}
    probs = routing_probabilities(selector, data, batch_size, device, route_by)
    if len(probs):
        needed.update(int(k) for k in candidate_models(probs, selector_includes_global).unique().tolist() if k >= 0)
    return sorted(needed)
