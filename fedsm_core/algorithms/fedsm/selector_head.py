"""The selector's head fitted from site statistics: a K-way classifier that one-label sites can train.

Why. In FedSM every site shows the selector only its own label. The trunk's
features separate the sites well (a linear classifier fitted on them with all
sites' data at hand reaches 100 % site accuracy on the generated data, even on
a randomly initialised trunk), but a linear head trained by federated averaging
does not: each site's local optimum is "every image is mine", and the average of
six such heads is a poor compromise that swings with the last round's steps.

What. Each site reports three sums of the selector's embeddings ``z``
(:meth:`~fedsm_core.models.selector.Selector.embed`) over its training images:
the count ``n_k``, ``s_k = sum z`` and ``G_k = sum z z^T``. The server fits the
head of linear discriminant analysis with equal site priors (the same
within-site covariance for every site, shrunk towards a multiple of the
identity, since 326 dimensions meet a few dozen images):

    mu_k = s_k / n_k
    S    = (1 / n) sum_k (G_k - n_k mu_k mu_k^T)                 n = sum_k n_k
    S_a  = (1 - a) S + a (tr(S) / D) I                            a = shrinkage
    W_k  = S_a^{-1} mu_k,   b_k = -1/2 mu_k^T S_a^{-1} mu_k

so ``logit_k(z) = W_k . z + b_k``. It is the calibration step of CCVR (Luo et
al., NeurIPS 2021: "classifier calibration with virtual representations",
which refits the head from per-class feature means and covariances) in closed
form. Only these sums leave a site: no image and no single embedding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from fedsm_core.data.arrays import SegArrays
from fedsm_core.models.selector import Selector
from fedsm_core.models.weights import Weights
from fedsm_core.training.batches import iterate_batches

STATISTICS_KEYS = ("count", "sum", "gram")
# The logit of a closed route: softmax gives it exp(-1e4) = 0 beside any fitted logit, and it stays finite in float32
CLOSED_BIAS = -1.0e4
# The selector's linear head in its state dict (Selector.classifier).
HEAD_WEIGHT, HEAD_BIAS = "classifier.weight", "classifier.bias"


@dataclasses.dataclass(frozen=True)
class SelectorStatistics:
    """Sums of one site's selector embeddings: ``n_k``, ``s_k = sum z`` ``[D]`` and ``G_k = sum z z^T`` ``[D, D]``."""

    count: float
    total: np.ndarray
    gram: np.ndarray

    def __post_init__(self) -> None:
        dim = self.total.shape[0]
        if self.total.ndim != 1 or self.gram.shape != (dim, dim):
            raise ValueError(f"selector statistics: sum has shape {self.total.shape} and gram {self.gram.shape}; "
                             "expected [D] and [D, D]")
        if not self.count >= 1 or not (np.all(np.isfinite(self.total)) and np.all(np.isfinite(self.gram))):
            raise ValueError(f"selector statistics: count = {self.count} (must be >= 1) or non-finite sums")
        # Sums of real embeddings have a symmetric Gram matrix and a positive semi-definite scatter
        # G - s s^T / n; fabricated ones that would tilt the fitted head often do not.
        scale = max(1.0, float(np.trace(self.gram)))
        if not np.allclose(self.gram, self.gram.T, rtol=1e-9, atol=1e-9 * scale):
            raise ValueError("selector statistics: the Gram matrix is not symmetric")
        lowest = float(np.linalg.eigvalsh(self.gram - np.outer(self.total, self.total) / self.count)[0])
        if lowest < -1e-7 * scale:
            raise ValueError(f"selector statistics: the scatter G - s s^T / n has eigenvalue {lowest:.3g} < 0; "
                             "sums of real embeddings cannot")

    def check_count(self, expected: float) -> None:
        """``ValueError`` unless ``count`` is ``expected``: the site's reported training images times the views."""
        if self.count != expected:
            raise ValueError(f"selector statistics count {self.count:g} embeddings, expected {expected:g} (the "
                             "training images the site reported at discovery times the views of each)")

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The three sums as arrays, keyed by :data:`STATISTICS_KEYS`."""
        return {"count": np.array([self.count]), "sum": self.total, "gram": self.gram}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> SelectorStatistics:
        """Inverse of :meth:`to_arrays`; raises ``ValueError`` naming a missing key."""
        missing = [key for key in STATISTICS_KEYS if key not in arrays]
        if missing:
            raise ValueError(f"selector statistics lack {missing}; expected keys {list(STATISTICS_KEYS)}")
        count = np.asarray(arrays["count"], dtype=np.float64).reshape(-1)
        if count.shape != (1,):
            raise ValueError(f"selector statistics: 'count' must hold one value, got shape {count.shape}")
        return cls(float(count[0]), np.asarray(arrays["sum"], dtype=np.float64),
                   np.asarray(arrays["gram"], dtype=np.float64))


def views_per_image(flips: bool) -> int:
    """Embeddings :func:`selector_statistics` sums per training image: 4 flips, or the image alone."""
    return 4 if flips else 1


def _views(images: torch.Tensor, flips: bool) -> list[torch.Tensor]:
    """The images and, with ``flips``, their horizontal, vertical and double flips (the training augmentation)."""
    if not flips:
        return [images]
    return [images, images.flip(-1), images.flip(-2), images.flip(-1, -2)]


@torch.no_grad()
def selector_statistics(selector: Selector, data: SegArrays, flips: bool = True, batch_size: int = 32,
                        device: torch.device | str = "cpu") -> SelectorStatistics:
    """Sum, Gram matrix and count of the selector's embeddings of ``data`` (float64).

    Parameters
    ----------
    selector : Selector
        The selector whose head is to be fitted (its trunk gives the embeddings).
    data : SegArrays
        The site's training split.
    flips : bool
        Also embed the flipped images, as the ``flip`` augmentation shows them
        in training: four views per image, which steadies the covariance of
        small sites.
    """
    if len(data.images) == 0:
        raise ValueError("selector_statistics: the training split holds no images")
    selector.eval().to(device)
    count, total, gram = 0.0, None, None
    for images, _ in iterate_batches(data, batch_size, shuffle=False):
        for view in _views(images.to(device), flips):
            z = selector.embed(view).double().cpu().numpy()
            total = z.sum(axis=0) if total is None else total + z.sum(axis=0)
            gram = z.T @ z if gram is None else gram + z.T @ z
            count += len(z)
    return SelectorStatistics(count, total, gram)


def fit_selector_head(statistics: Sequence[SelectorStatistics], shrinkage: float) -> tuple[np.ndarray, np.ndarray]:
    """LDA head ``(W [K, D], b [K])`` from the sites' statistics, in selector-output order (module docstring).

    Parameters
    ----------
    statistics : sequence of SelectorStatistics
        One entry per site, site ``k`` at index ``k``.
    shrinkage : float
        ``a`` in ``[0, 1]``: weight of the scaled identity in the covariance.
        0 is plain LDA (singular when ``D`` exceeds the number of embeddings).
    """
    if not 0.0 <= shrinkage <= 1.0:
        raise ValueError(f"selector-shrinkage = {shrinkage} must lie in [0, 1]")
    if len(statistics) < 2:
        raise ValueError(f"fitting the selector head needs statistics of >= 2 sites, got {len(statistics)}")
    dims = {s.total.shape[0] for s in statistics}
    if len(dims) != 1:
        raise ValueError(f"selector statistics of different embedding sizes {sorted(dims)}")
    means = np.stack([s.total / s.count for s in statistics])
    count = sum(s.count for s in statistics)
    within = sum(s.gram - s.count * np.outer(m, m) for s, m in zip(statistics, means, strict=True)) / count
    dim = within.shape[0]
    scale = max(float(np.trace(within)) / dim, 1e-12)  # all-identical embeddings still give a solvable system
    shrunk = (1.0 - shrinkage) * within + shrinkage * scale * np.eye(dim)
    weight = np.linalg.solve(shrunk, means.T).T
    bias = -0.5 * np.einsum("kd,kd->k", weight, means)
    return weight, bias


def with_fitted_head(selector_weights: Weights, statistics: Sequence[SelectorStatistics | None],
                     shrinkage: float) -> Weights:
    """A copy of ``selector_weights`` whose linear head is :func:`fit_selector_head`'s (float32).

    A site whose entry is ``None`` (no statistics, or statistics the server
    rejected) is left out of the fit and its route is closed: a zero weight row
    and the bias ``CLOSED_BIAS``, so no image is routed to its personalized
    model and the other sites still get the fitted head (one site's bad
    statistics must not undo the head for everyone).
    """
    present = [index for index, entry in enumerate(statistics) if entry is not None]
    fitted_weight, fitted_bias = fit_selector_head([statistics[index] for index in present], shrinkage)
    weight = np.zeros((len(statistics), fitted_weight.shape[1]))
    bias = np.full(len(statistics), CLOSED_BIAS)
    weight[present], bias[present] = fitted_weight, fitted_bias
    expected = tuple(np.shape(selector_weights.get(HEAD_WEIGHT, ())))
    if weight.shape != expected:
        raise ValueError(f"fitted selector head has shape {weight.shape}, the selector's '{HEAD_WEIGHT}' {expected}: "
                         "the statistics come from another selector (selector-width or number of sites differ)")
    return {**selector_weights, HEAD_WEIGHT: weight.astype(np.float32), HEAD_BIAS: bias.astype(np.float32)}
