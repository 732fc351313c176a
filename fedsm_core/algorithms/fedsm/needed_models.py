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
"""

from __future__ import annotations

import torch
import torch.nn as nn

from fedsm_core.data.arrays import SegArrays
from fedsm_core.device import to_device
from fedsm_core.training.batches import iterate_batches


def candidate_models(selector_probs: torch.Tensor, selector_includes_global: bool = False) -> torch.Tensor:
    """Per image, the personalized model Algorithm 2 may route it to (-1: only the global model)."""
    choice = selector_probs.argmax(dim=1)
    return choice - 1 if selector_includes_global else choice


@torch.no_grad()
def needed_models(selector: nn.Module, data: SegArrays, site_index: int | None, selector_includes_global: bool,
                  batch_size: int, device: torch.device | str = "cpu") -> list[int]:
    """Sorted indices of the personalized models an evaluation of ``data`` at site ``site_index`` uses.

    Parameters
    ----------
    selector : nn.Module
        The selector that will route the images (its head as it will be evaluated).
    site_index : int or None
        The site's own model, always needed for ``dice-personal``; ``None`` for
        a site outside the federation.
    """
    selector = selector.eval().to(device)
    needed = set() if site_index is None else {int(site_index)}
    for images, _ in iterate_batches(data, batch_size, shuffle=False):
        probs = torch.softmax(selector(to_device(images, device)), dim=1)
        needed.update(int(k) for k in candidate_models(probs, selector_includes_global).unique().tolist() if k >= 0)
    return sorted(needed)


class MissingModel(nn.Module):
    """Stands for a personalized model that was not sent; using it is a protocol error, said plainly."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Refuse: an image was routed to a model this site was not sent."""
        raise RuntimeError(f"personalized model {self.index} was not sent to this site, but an image was routed "
                           "to it; the server sends the models the site's route query named")
