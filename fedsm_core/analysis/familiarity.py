"""Does an image look like the site the selector picks? A gate for images of hospitals outside the federation.

The selector's softmax is relative: an image far from every training site is
still assigned, often with high confidence, to whichever site's side of the
linear head it falls on (a fitted LDA head extrapolates linearly). Its
confidence therefore cannot tell an unseen hospital's image from a familiar
one. Distances in the selector's embedding can:

    d_k(x) = (e(x) - mu_k)^T  Sigma^-1  (e(x) - mu_k),

with ``mu_k`` the mean embedding of site ``k``'s training images and
``Sigma`` their pooled within-site covariance (shrunk toward its mean
variance, as the selector head's fit). An image is *familiar* to site ``k``
when ``d_k(x)`` is at most the radius, the largest distance of any training
site's own validation image to its own site (held out from the means, so the
radius is not measured in-sample). Algorithm 2 then routes an image to the
personalized model of its most likely site only when it is confident and
familiar to that site, and to the global model otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_SHRINKAGE = 0.1


@dataclass(frozen=True)
class SiteRegions:
    """Each site's mean embedding, the pooled precision and the familiarity radius.

    Attributes
    ----------
    means : np.ndarray
        ``[K, D]`` float64, site ``k``'s mean training embedding in row ``k``.
    precision : np.ndarray
        ``[D, D]`` inverse of the shrunk pooled within-site covariance.
    radius : float
        Largest own-site distance of the training sites' validation images.
    """

    means: np.ndarray
    precision: np.ndarray
    radius: float

    def distances(self, features: np.ndarray) -> np.ndarray:
        """``[N, K]`` squared Mahalanobis distance of every embedding to every site's mean."""
        centred = np.asarray(features, dtype=np.float64)[:, None, :] - self.means[None]
        return np.einsum("nkd,de,nke->nk", centred, self.precision, centred)

    def familiar(self, features: np.ndarray, sites: np.ndarray) -> np.ndarray:
        """Whether each embedding lies within the radius of its site in ``sites`` (-1: never)."""
        sites = np.asarray(sites)
        chosen = np.clip(sites, 0, None)
        near = self.distances(features)[np.arange(len(sites)), chosen] <= self.radius
        return near & (sites >= 0)


def fit_site_regions(train: Mapping[str, np.ndarray], val: Mapping[str, np.ndarray], site_names: Sequence[str],
                     shrinkage: float = DEFAULT_SHRINKAGE) -> SiteRegions:
    """Site means and pooled covariance from training embeddings; radius from validation embeddings.

    Parameters
    ----------
    train, val : mapping
        Site name -> ``[N, D]`` selector embeddings of its training / validation images.
    site_names : sequence of str
        The selector's sites, in output order; each needs training and validation embeddings.
    shrinkage : float
        ``Sigma = (1 - s) Sigma_w + s (tr(Sigma_w) / D) I``, which keeps ``Sigma`` invertible.
    """
    missing = [n for n in site_names if n not in train or n not in val or len(train[n]) == 0 or len(val[n]) == 0]
    if missing:
        raise ValueError(f"site regions need training and validation embeddings of every site; missing {missing}")
    if not 0.0 <= shrinkage <= 1.0:
        raise ValueError(f"shrinkage = {shrinkage} is outside [0, 1]")
    arrays = [np.asarray(train[n], dtype=np.float64) for n in site_names]
    means = np.stack([x.mean(axis=0) for x in arrays])
    scatter = sum((x - m).T @ (x - m) for x, m in zip(arrays, means, strict=True))
    covariance = scatter / sum(len(x) for x in arrays)
    dim = covariance.shape[0]
    covariance = (1.0 - shrinkage) * covariance + shrinkage * np.trace(covariance) / dim * np.eye(dim)
    regions = SiteRegions(means, np.linalg.inv(covariance), np.inf)
    own = [regions.distances(val[n])[:, k] for k, n in enumerate(site_names)]
    return SiteRegions(means, regions.precision, float(np.concatenate(own).max()))
