"""kNN-Per on the model FedSM's super model routes each image to.

The super model sends an image to the global model or to one site's
personalized model (Algorithm 2). At a site, kNN-Per (Marfoq et al., ICML
2022) then mixes the routed model's prediction with a kNN estimate from that
model's pixel embeddings of the site's own training images:

``p(x) = lam * p_knn^{m(x)}(x) + (1 - lam) * sigmoid(f_{m(x)}(x))``   (Marfoq et al., eq. 4)

where ``m(x)`` is the routed model. Each model an image is routed to gets its
own datastore (embeddings differ between models), built when first needed;
one ``lam`` per site is chosen on its validation split, as plain kNN-Per does.
With ``lam = 0`` this is the super model itself.
"""

from __future__ import annotations

import torch

from fedsm_core.algorithms.fedsm.super_model import GLOBAL_ROUTE, SuperModel
from fedsm_core.algorithms.knn_per.knn_per import KNNPer, MaskSink, score_knn_per
from fedsm_core.algorithms.knn_per.settings import KNNPerSettings
from fedsm_core.data.arrays import SegArrays


class RoutedKNNPer(KNNPer):
    """A site's kNN-Per over the super model: one datastore per model its images are routed to.

    Parameters
    ----------
    super_model : SuperModel
        Routes each image (per image, at the super model's gamma); not trained here.
    settings : KNNPerSettings
    device : torch.device or str, optional

    Attributes
    ----------
    per_model : dict[int, KNNPer]
        Route (``-1`` = global, ``k`` = site ``k``'s personalized model) ->
        kNN-Per over that model with this site's training pixels; client data.
    """

    def __init__(self, super_model: SuperModel, settings: KNNPerSettings | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__(super_model, settings, device)
        self.super_model = super_model
        self.per_model: dict[int, KNNPer] = {}
        self._train: SegArrays | None = None

    def build(self, train_data: SegArrays) -> RoutedKNNPer:
        """Keep the site's training split; each route's datastore is built from it when first needed."""
        self._train = train_data
        self.per_model = {}
        return self

    def model_of(self, route: int) -> KNNPer:
        """kNN-Per over the model of ``route``, its datastore built on first use."""
        if self._train is None:
            raise ValueError("RoutedKNNPer: no training split; call build(train_data) first")
        if route not in self.per_model:
            model = (self.super_model.global_model if route == GLOBAL_ROUTE
                     else self.super_model.personalized[route])
            self.per_model[route] = KNNPer(model, self.settings, self.device).build(self._train)
        return self.per_model[route]

    @torch.no_grad()
    def probabilities(self, images) -> tuple[torch.Tensor, torch.Tensor]:
        """``p_knn`` and ``p_model`` of every pixel from each image's routed model, both ``[B, S, H, W]``."""
        images = torch.as_tensor(images).to(self.device)
        routes = self.super_model.routes(torch.softmax(self.super_model.selector(images), dim=1))
        p_knn: torch.Tensor | None = None
        p_model: torch.Tensor | None = None
        for route in routes.unique().tolist():
            chosen = routes == route
            knn_part, model_part = self.model_of(int(route)).probabilities(images[chosen])
            if p_knn is None or p_model is None:
                p_knn = knn_part.new_zeros((len(images), *knn_part.shape[1:]))
                p_model = model_part.new_zeros((len(images), *model_part.shape[1:]))
            p_knn[chosen], p_model[chosen] = knn_part, model_part
        assert p_knn is not None and p_model is not None  # routes covers every image of a non-empty batch
        return p_knn, p_model

    def stored_pixels(self) -> int:
        """Pixels in all routes' datastores built so far."""
        return sum(self.datastore_sizes().values())

    def datastore_sizes(self) -> dict[int, int]:
        """Route -> pixels in its datastore, for the routes built so far."""
        return {route: len(knn.datastore) for route, knn in sorted(self.per_model.items())}


# Keys of a FedSM site's test reply for the super model with kNN-Per (beside plain kNN-Per's on the global model)
ROUTED_DICE = "dice-super-knn"
ROUTED_SUFFIX = "-super"


def evaluate_routed_knn_per(super_model: SuperModel, train: SegArrays, val: SegArrays, test: SegArrays,
                            settings: KNNPerSettings, device: torch.device | str,
                            on_masks: MaskSink | None = None) -> dict[str, float]:
    """A site's kNN-Per on the routed models after FedSM's training, with its cost.

    Returns ``dice-super-knn`` (and ``empty-fp-super-knn``, ``num-empty``) and
    ``knn-lambda-super``, ``knn-datastore-size-super`` (all routes' datastores),
    ``knn-build-seconds-super``, ``knn-seconds-per-image-super``, as
    :func:`~fedsm_core.algorithms.knn_per.knn_per.score_knn_per` computes them.
    Each route's datastore is built when an image is first routed to it, so
    its build time falls in the ``lam`` choice (or the test) rather than in
    ``knn-build-seconds-super``.
    """
    return score_knn_per(RoutedKNNPer(super_model, settings, device), train, val, test, ROUTED_DICE, ROUTED_SUFFIX,
                         on_masks)
