"""kNN-Per's local datastore of (pixel embedding, pixel label) pairs.

kNN-Per (Marfoq et al., ICML 2022) keeps, on each client, the pairs
``(phi(x_i), y_i)`` of its own training data under the global model's
embedding ``phi``. Here a pair is one pixel: its last decoder feature vector
and its S-vector of {0, 1} structure labels. The datastore holds client data
and never leaves the client: nothing in this module is ever sent to the server
or written into a message or a shared checkpoint.

Pixels are sampled per image and stratified (background, each structure and
boundary pixels get an equal share), because the rare classes and the edges
are where the model errs and a uniform sample would hold almost none of them.
"""

from __future__ import annotations

import numpy as np

REPLACEMENTS: tuple[str, ...] = ("fifo", "random")


def boundary_pixels(mask: np.ndarray) -> np.ndarray:
    """Pixels whose 3x3 neighbourhood holds a different label vector.

    Parameters
    ----------
    mask : np.ndarray
        {0, 1} labels ``[S, H, W]``.

    Returns
    -------
    np.ndarray
        bool ``[H, W]``.
    """
    height, width = mask.shape[1:]
    # Edge padding: the image border is not a label change.
    padded = np.pad(mask, ((0, 0), (1, 1), (1, 1)), mode="edge")
    boundary = np.zeros((height, width), dtype=bool)
    for dy in range(3):
        for dx in range(3):
            boundary |= (padded[:, dy : dy + height, dx : dx + width] != mask).any(axis=0)
    return boundary


def pixel_strata(mask: np.ndarray) -> list[np.ndarray]:
    """Flat pixel indices of background, of each structure and of the boundary.

    Parameters
    ----------
    mask : np.ndarray
        {0, 1} labels ``[S, H, W]``. Structures may overlap (the cup lies inside
        the disc), so a pixel may belong to several strata.

    Returns
    -------
    list of np.ndarray
        ``S + 2`` int arrays: background, structures ``0..S-1``, boundary.
    """
    foreground = mask.reshape(len(mask), -1) > 0.5
    strata = [np.flatnonzero(~foreground.any(axis=0))]
    strata += [np.flatnonzero(structure) for structure in foreground]
    strata.append(np.flatnonzero(boundary_pixels(mask).reshape(-1)))
    return strata


def stratified_pixel_indices(mask: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Choose ``count`` distinct pixels, an equal share from every non-empty stratum.

    A stratum smaller than its share is taken whole; the pixels it leaves
    unused are drawn uniformly from the pixels not yet chosen.

    Parameters
    ----------
    mask : np.ndarray
        {0, 1} labels ``[S, H, W]``.
    count : int
        Pixels to choose; all ``H * W`` when larger.
    rng : np.random.Generator
        Source of the draws, for reproducible datastores.

    Returns
    -------
    np.ndarray
        Sorted distinct flat indices into ``H * W``, ``min(count, H * W)`` of them.
    """
    total = mask.shape[1] * mask.shape[2]
    if count >= total:
        return np.arange(total)
    strata = [s for s in pixel_strata(mask) if len(s)]
    share = max(1, count // len(strata))
    chosen = np.unique(np.concatenate([rng.choice(s, size=min(share, len(s)), replace=False) for s in strata]))
    if len(chosen) > count:
        chosen = np.sort(rng.choice(chosen, size=count, replace=False))
    rest = np.setdiff1d(np.arange(total), chosen, assume_unique=True)
    fill = rng.choice(rest, size=count - len(chosen), replace=False)
    return np.sort(np.concatenate([chosen, fill]))


class KNNDatastore:
    """Bounded store of float32 embeddings ``[M, D]`` and labels ``[M, S]``.

    When full, ``"fifo"`` overwrites the oldest entries and ``"random"``
    overwrites uniformly drawn ones (seeded). The row order of
    :attr:`embeddings` is unspecified; kNN search does not depend on it.
    Client data: never send it off the client.

    Parameters
    ----------
    capacity : int
        Largest number of entries, ``>= 1``.
    replacement : {"fifo", "random"}
    seed : int
        Seeds pixel sampling and random replacement.
    """

    def __init__(self, capacity: int, replacement: str = "fifo", seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"knn-capacity = {capacity} must be >= 1")
        if replacement not in REPLACEMENTS:
            raise ValueError(f"knn-replacement = '{replacement}' is not one of {list(REPLACEMENTS)}")
        self.capacity = int(capacity)
        self.replacement = replacement
        self.rng = np.random.default_rng(seed)
        self._embeddings: np.ndarray | None = None
        self._labels: np.ndarray | None = None
        self._size = 0
        self._next = 0  # FIFO: the slot of the oldest entry once full

    def __len__(self) -> int:
        return self._size

    @property
    def embeddings(self) -> np.ndarray:
        """float32 ``[len, D]``; an empty ``[0, 0]`` array before the first :meth:`add`."""
        return np.zeros((0, 0), np.float32) if self._embeddings is None else self._embeddings[: self._size]

    @property
    def labels(self) -> np.ndarray:
        """float32 {0, 1} ``[len, S]``, row-aligned with :attr:`embeddings`."""
        return np.zeros((0, 0), np.float32) if self._labels is None else self._labels[: self._size]

    def add(self, embeddings: np.ndarray, labels: np.ndarray) -> None:
        """Store pairs ``embeddings [n, D]`` and ``labels [n, S]``, replacing when full."""
        if embeddings.ndim != 2 or labels.ndim != 2 or len(embeddings) != len(labels):
            raise ValueError(f"KNNDatastore.add: need [n, D] and [n, S], got {embeddings.shape} and {labels.shape}")
        self._allocate(embeddings.shape[1], labels.shape[1])
        slots = self._slots(len(embeddings))
        keep = slice(len(embeddings) - len(slots), None)
        self._embeddings[slots] = embeddings[keep]
        self._labels[slots] = labels[keep]

    def add_images(self, embeddings: np.ndarray, masks: np.ndarray, pixels_per_image: int) -> None:
        """Sample pixels of each image (:func:`stratified_pixel_indices`) and store them.

        Parameters
        ----------
        embeddings : np.ndarray
            Pixel embeddings ``[B, D, H, W]``.
        masks : np.ndarray
            {0, 1} labels ``[B, S, H, W]``.
        pixels_per_image : int
            Pixels sampled from each image.
        """
        if embeddings.shape[0] != masks.shape[0] or embeddings.shape[2:] != masks.shape[2:]:
            raise ValueError(f"KNNDatastore.add_images: embeddings {embeddings.shape} do not match masks {masks.shape}")
        for features, mask in zip(embeddings, masks, strict=True):
            pixels = stratified_pixel_indices(mask, pixels_per_image, self.rng)
            self.add(features.reshape(len(features), -1)[:, pixels].T, mask.reshape(len(mask), -1)[:, pixels].T)

    def _allocate(self, dim: int, structures: int) -> None:
        if self._embeddings is None:
            self._embeddings = np.zeros((self.capacity, dim), dtype=np.float32)
            self._labels = np.zeros((self.capacity, structures), dtype=np.float32)
        elif (dim, structures) != (self._embeddings.shape[1], self._labels.shape[1]):
            raise ValueError(
                f"KNNDatastore.add: entries of dim {dim} with {structures} structures, but the store holds "
                f"dim {self._embeddings.shape[1]} with {self._labels.shape[1]} structures"
            )

    def _slots(self, count: int) -> np.ndarray:
        """Slots for the last ``min(count, ...)`` of ``count`` new entries, in arrival order."""
        free = min(count, self.capacity - self._size)
        slots = np.arange(self._size, self._size + free)
        self._size += free
        overflow = count - free
        if overflow == 0:
            return slots
        if self.replacement == "random":
            return np.concatenate([slots, self.rng.integers(0, self.capacity, size=overflow)])
        # FIFO: of a batch larger than the store only its newest `capacity` entries survive.
        overflow = min(overflow, self.capacity)
        replaced = (self._next + np.arange(overflow)) % self.capacity
        self._next = int((self._next + overflow) % self.capacity)
        return np.concatenate([slots, replaced])[-self.capacity :]
