"""kNN-Per (Marfoq et al., ICML 2022) for segmentation: per-pixel kNN mixed with the global model.

A client personalizes the global model without training: it stores the
model's pixel embeddings of its own training images with their labels
(:class:`~fedsm_core.algorithms.knn_per.datastore.KNNDatastore`) and predicts

``p(x) = lam * p_knn(x) + (1 - lam) * p_model(x)``   (Marfoq et al., eq. 4)

for every pixel, with ``p_model = sigmoid(logits)`` and ``p_knn`` the
kernel-weighted label mean of the k nearest stored pixels. ``lam`` is chosen
on the client's validation split. The datastore never leaves the client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fedsm_core.algorithms.knn_per.datastore import KNNDatastore
from fedsm_core.algorithms.knn_per.search import NeighbourIndex, knn_probabilities
from fedsm_core.algorithms.knn_per.settings import KNNPerSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.metrics import ImageScores, dice_per_structure, empty_fp_key, has_foreground
from fedsm_core.training.batches import iterate_batches

HEAD_NAME = "segmentation_head"
MaskSink = Callable[[torch.Tensor], None]  # takes a batch of predicted binary masks


def find_segmentation_head(model: nn.Module) -> nn.Module:
    """The one submodule whose name ends in ``segmentation_head`` (smp's last layer).

    Matching the name suffix finds ``model.segmentation_head`` of a plain smp
    U-Net and e.g. ``model.net.segmentation_head`` of a wrapped one.
    """
    found = [(name, m) for name, m in model.named_modules() if name == HEAD_NAME or name.endswith("." + HEAD_NAME)]
    if len(found) != 1:
        names = [name for name, _ in found]
        raise ValueError(
            f"kNN-Per needs exactly one submodule named '*{HEAD_NAME}' (its input is the pixel embedding); "
            f"found {len(found)}: {names}"
        )
    return found[0][1]


@torch.no_grad()
def embed_pixels(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel embeddings ``phi(x)`` and logits of one forward pass.

    The embedding is the input of the segmentation head (the last decoder
    features), captured with a forward pre-hook.

    Parameters
    ----------
    model : nn.Module
        A segmentation model with one submodule named ``*segmentation_head``.
    images : torch.Tensor
        ``[B, C, H, W]`` on the model's device.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        Embeddings ``[B, D, H, W]`` and logits ``[B, S, H, W]``.
    """
    captured: list[torch.Tensor] = []
    handle = find_segmentation_head(model).register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    try:
        logits = model(images)
    finally:
        handle.remove()
    features = captured[0]
    if features.shape[-2:] != logits.shape[-2:]:
        # A head that upsamples sees coarser features; every output pixel needs one embedding.
        features = F.interpolate(features, size=logits.shape[-2:], mode="bilinear", align_corners=False)
    return features, logits


def mix_probabilities(p_knn: torch.Tensor, p_model: torch.Tensor, lam: float) -> torch.Tensor:
    """``p = lam * p_knn + (1 - lam) * p_model`` (eq. 4), in ``p_model``'s dtype, any shape."""
    return lam * p_knn.to(p_model.dtype) + (1.0 - lam) * p_model


def dice_per_lambda(
    p_knn: torch.Tensor, p_model: torch.Tensor, masks: torch.Tensor, grid: Sequence[float], threshold: float = 0.5
) -> torch.Tensor:
    """Per-image Dice (mean over structures) of the mixed prediction at each ``lam``.

    Parameters
    ----------
    p_knn, p_model, masks : torch.Tensor
        ``[B, S, H, W]``; a pixel is foreground when the mixed ``p > threshold``,
        as :func:`fedsm_core.metrics.dice_per_image` thresholds the model.
    grid : sequence of float
        The ``L`` values of ``lam``.
    threshold : float
        Foreground cut-off of the mixed probability.

    Returns
    -------
    torch.Tensor
        Float64 ``[B, L]``.
    """
    columns = [
        dice_per_structure(mix_probabilities(p_knn, p_model, lam) > threshold, masks).mean(dim=1) for lam in grid
    ]
    return torch.stack(columns, dim=1)


def choose_lambda(dice: Sequence[float], grid: Sequence[float]) -> float:
    """The ``lam`` of highest mean validation Dice; ties go to the smallest ``lam``.

    The smallest tied ``lam`` stays closest to the global model.
    """
    if len(dice) != len(grid) or not grid:
        raise ValueError(f"choose_lambda: {len(dice)} Dice values for {len(grid)} lambdas")
    best = max(dice)
    return float(min(lam for lam, value in zip(grid, dice, strict=True) if value == best))


class KNNPer:
    """A client's kNN-Per predictor: the global model, its local datastore and ``lam``.

    Parameters
    ----------
    model : nn.Module
        The global segmentation model, logits ``[B, S, H, W]``, with a
        submodule named ``*segmentation_head``; it is not trained here.
    settings : KNNPerSettings
    device : torch.device or str, optional
        Where to run; defaults to the device of the model's parameters.

    Attributes
    ----------
    datastore : KNNDatastore
        Embeddings and labels of this client's training pixels; client data,
        never send it off the client.
    lam : float
        Current mixing weight of eq. 4.
    """

    def __init__(
        self, model: nn.Module, settings: KNNPerSettings | None = None, device: torch.device | str | None = None
    ) -> None:
        self.settings = settings if settings is not None else KNNPerSettings()
        if device is None:
            first = next(model.parameters(), None)
            device = first.device if first is not None else "cpu"
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.datastore = KNNDatastore(self.settings.capacity, self.settings.replacement, self.settings.seed)
        self.lam = self.settings.lam
        self._index: NeighbourIndex | None = None
        self._labels: torch.Tensor | None = None

    def build(self, train_data: SegArrays) -> KNNPer:
        """Add sampled pixels of every training image to the datastore and index it.

        Returns ``self``, so ``KNNPer(model).build(train)`` reads as one step.
        """
        for images, masks in iterate_batches(train_data, self.settings.batch_size, shuffle=False):
            embeddings, _ = embed_pixels(self.model.eval(), images.to(self.device))
            self.datastore.add_images(embeddings.float().cpu().numpy(), masks.numpy(), self.settings.pixels_per_image)
        self._index = NeighbourIndex(self.datastore.embeddings, self.settings.backend, self.device)
        self._labels = torch.from_numpy(self.datastore.labels.copy()).to(self.device)
        return self

    @torch.no_grad()
    def probabilities(self, images: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``p_knn`` and ``p_model`` of every pixel, both ``[B, S, H, W]``.

        Parameters
        ----------
        images : torch.Tensor or np.ndarray
            ``[B, C, H, W]``.
        """
        if self._index is None or self._labels is None:
            raise ValueError("KNNPer: the datastore is not built; call build(train_data) first")
        embeddings, logits = embed_pixels(self.model.eval(), torch.as_tensor(images).to(self.device))
        batch, dim, height, width = embeddings.shape
        queries = embeddings.permute(0, 2, 3, 1).reshape(-1, dim)
        distances, indices = self._index.search(queries, self.settings.k)
        p_knn = knn_probabilities(distances, indices, self._labels, dim, self.settings.kernel_scale)
        p_knn = p_knn.reshape(batch, height, width, -1).permute(0, 3, 1, 2)
        return p_knn, torch.sigmoid(logits)

    def choose_lambda(self, val_data: SegArrays) -> float:
        """Set :attr:`lam` to the grid value of highest mean per-image validation Dice.

        Returns
        -------
        float
            The chosen ``lam``, one of ``settings.lambda_grid``.
        """
        grid = self.settings.lambda_grid
        parts = []
        for images, masks in iterate_batches(val_data, self.settings.batch_size, shuffle=False):
            p_knn, p_model = self.probabilities(images)
            parts.append(dice_per_lambda(p_knn, p_model, masks.to(self.device), grid).cpu())
        curve = torch.cat(parts).mean(dim=0).tolist()
        self.lam = choose_lambda(curve, grid)
        return self.lam

    def stored_pixels(self) -> int:
        """Pixels in the datastore (what the site holds for kNN-Per)."""
        return len(self.datastore)

    def evaluate(self, test_data: SegArrays, name: str = "dice-knn-per",
                 on_masks: MaskSink | None = None) -> dict[str, float]:
        """Mean per-image Dice of kNN-Per at :attr:`lam` and of the global model alone.

        Parameters
        ----------
        on_masks : callable, optional
            Receives kNN-Per's binary masks ``[B, S, H, W]`` batch by batch in
            ``test_data``'s order (the evaluation layer stacks them into cases).

        Returns
        -------
        dict[str, float]
            ``{name: Dice, "dice-global": Dice, "knn-lambda": lam, "num-images": N}``,
            Dice as in :func:`fedsm_core.evaluation.super_model_evaluation.evaluate_model` (over images with
            foreground; ``num-empty`` and ``empty-fp-*`` for the others).
        """
        personal, plain = ImageScores(), ImageScores()
        for images, masks in iterate_batches(test_data, self.settings.batch_size, shuffle=False):
            p_knn, p_model = self.probabilities(images)
            masks = masks.to(self.device)
            dice = dice_per_lambda(p_knn, p_model, masks, (self.lam, 0.0))
            foreground = has_foreground(masks)
            for scores, column, lam in ((personal, 0, self.lam), (plain, 1, 0.0)):
                predicted = mix_probabilities(p_knn, p_model, lam) > 0.5
                scores.add_scores(dice[:, column], predicted.flatten(1).any(dim=1), foreground)
                if on_masks is not None and column == 0:
                    on_masks(predicted)
        return {
            **plain.result("dice-global"),
            **personal.result(name),
            "knn-lambda": self.lam,
            "num-images": float(len(test_data)),
        }


def evaluate_knn_per(model: nn.Module, train: SegArrays, val: SegArrays, test: SegArrays,
                     settings: KNNPerSettings, device: torch.device | str,
                     on_masks: MaskSink | None = None) -> dict[str, float]:
    """A client's whole kNN-Per step on ``model`` after federated training, with its cost.

    See :func:`score_knn_per`; the keys are ``dice-knn-per``, ``empty-fp-knn-per``,
    ``num-empty``, ``knn-lambda``, ``knn-datastore-size``, ``knn-build-seconds``
    and ``knn-seconds-per-image``.
    """
    return score_knn_per(KNNPer(model, settings, device), train, val, test, on_masks=on_masks)


def score_knn_per(knn: KNNPer, train: SegArrays, val: SegArrays, test: SegArrays,
                  name: str = "dice-knn-per", suffix: str = "", on_masks: MaskSink | None = None) -> dict[str, float]:
    """Build the datastore from ``train``, choose ``lam`` on ``val``, score ``test``.

    Parameters
    ----------
    knn : KNNPer
        Not built yet (a :class:`~fedsm_core.algorithms.fedsm.routed_knn_per.RoutedKNNPer` too).
    name : str
        The Dice key (its false-positive rate is ``empty-fp-`` + the rest).
    suffix : str
        Appended to the ``knn-*`` keys, so that two predictors' numbers share a reply.
    on_masks : callable, optional
        Receives the test masks, as in :meth:`KNNPer.evaluate`.

    Returns
    -------
    dict[str, float]
        ``name``, its ``empty-fp-*``, ``num-empty``, ``knn-lambda``, the
        datastore size in pixels, the seconds to build it and the seconds per
        test image (datastore search and mixing, the model's forward pass included).
    """
    started = time.perf_counter()
    knn.build(train)
    built = time.perf_counter()
    knn.choose_lambda(val)
    chosen = time.perf_counter()
    scores = knn.evaluate(test, name, on_masks)
    tested = time.perf_counter()
    empty_fp = empty_fp_key(name)
    return {
        name: scores[name],
        **{key: value for key, value in scores.items() if key in ("num-empty", empty_fp)},
        f"knn-lambda{suffix}": knn.lam,
        f"knn-datastore-size{suffix}": float(knn.stored_pixels()),
        f"knn-build-seconds{suffix}": built - started,
        f"knn-seconds-per-image{suffix}": (tested - chosen) / max(len(test), 1),
    }
