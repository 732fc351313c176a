"""Nearest-neighbour search and kernel estimate of kNN-Per (Marfoq et al., ICML 2022).

Two exact (brute-force L2) backends return the same neighbours: faiss'
``IndexFlatL2`` (CPU, optional dependency) and ``torch.cdist`` + ``topk``, which
runs on the model's device. ``"auto"`` takes faiss for a CPU model when it is
importable and torch otherwise: faiss-cpu would copy CUDA queries to the host.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import torch

BACKENDS: tuple[str, ...] = ("auto", "faiss", "torch")

# Distance-matrix entries per torch chunk: 2**24 float32 = 64 MiB, whatever the datastore size.
CHUNK_ELEMENTS = 2**24


def faiss_available() -> bool:
    """Whether the ``faiss`` module (package ``faiss-cpu``) can be imported."""
    return importlib.util.find_spec("faiss") is not None


def resolve_backend(name: str, device: torch.device | str = "cpu") -> str:
    """The concrete backend, ``"faiss"`` or ``"torch"``, for a setting and a device.

    Raises
    ------
    ValueError
        An unknown name, or ``"faiss"`` without faiss installed.
    """
    if name not in BACKENDS:
        raise ValueError(f"knn-backend = '{name}' is not one of {list(BACKENDS)}")
    if name == "faiss" and not faiss_available():
        raise ValueError("knn-backend = 'faiss' but faiss is not installed; run `pip install faiss-cpu` or use 'torch'")
    if name == "auto":
        return "faiss" if faiss_available() and torch.device(device).type == "cpu" else "torch"
    return name


def search_torch(
    keys: torch.Tensor, queries: torch.Tensor, k: int, chunk_elements: int = CHUNK_ELEMENTS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k nearest neighbours with ``torch.cdist``, chunked over queries.

    Parameters
    ----------
    keys : torch.Tensor
        Stored embeddings ``[M, D]``.
    queries : torch.Tensor
        Query embeddings ``[Q, D]`` on the same device.
    k : int
        Neighbours per query, ``1 <= k <= M``.
    chunk_elements : int
        Largest ``rows * M`` distance block held at once, which bounds memory.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        Squared distances ``[Q, k]`` (ascending) and indices into ``keys`` ``[Q, k]``.
    """
    rows = max(1, chunk_elements // max(1, len(keys)))
    distances, indices = [], []
    for start in range(0, len(queries), rows):
        block = torch.cdist(queries[start : start + rows], keys)
        nearest = block.topk(k, dim=1, largest=False, sorted=True)
        distances.append(nearest.values.square())
        indices.append(nearest.indices)
    if not distances:
        return queries.new_zeros((0, k)), torch.zeros((0, k), dtype=torch.long, device=queries.device)
    return torch.cat(distances), torch.cat(indices)


class FaissIndex:
    """An ``IndexFlatL2`` over fixed keys, built once and searched many times."""

    def __init__(self, keys: np.ndarray) -> None:
        import faiss  # optional: imported only when this backend is chosen

        # Its OpenMP pool would otherwise take every core; follow torch's thread setting (torch-threads).
        faiss.omp_set_num_threads(torch.get_num_threads())
        self.index = faiss.IndexFlatL2(int(keys.shape[1]))
        self.index.add(np.ascontiguousarray(keys, dtype=np.float32))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Squared distances and indices ``[Q, k]`` of the ``k`` nearest keys."""
        return self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)


class NeighbourIndex:
    """Searchable copy of a datastore's keys on one backend.

    Parameters
    ----------
    keys : np.ndarray
        float32 embeddings ``[M, D]``.
    backend : {"auto", "faiss", "torch"}
    device : torch.device or str
        Where queries come from and results go; torch searches there.
    """

    def __init__(self, keys: np.ndarray, backend: str = "auto", device: torch.device | str = "cpu") -> None:
        if keys.ndim != 2 or len(keys) == 0:
            raise ValueError(f"NeighbourIndex: keys must be a non-empty [M, D] array, got shape {keys.shape}")
        self.device = torch.device(device)
        self.backend = resolve_backend(backend, self.device)
        self.size = int(len(keys))
        if self.backend == "faiss":
            self._faiss = FaissIndex(keys)
        else:
            self._keys = torch.from_numpy(np.ascontiguousarray(keys, dtype=np.float32)).to(self.device)

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Squared distances and indices ``[Q, min(k, M)]`` of queries ``[Q, D]``, on ``device``."""
        k = min(k, self.size)
        if self.backend == "faiss":
            distances, indices = self._faiss.search(queries.detach().float().cpu().numpy(), k)
            return torch.from_numpy(distances).to(self.device), torch.from_numpy(indices).to(self.device)
        return search_torch(self._keys, queries.detach().float().to(self.device), k)


def gaussian_kernel(squared_distances: torch.Tensor, dim: int, scale: float = 1.0) -> torch.Tensor:
    """Kernel weights ``w = exp(-d^2 / (dim * scale))``, elementwise (any shape).

    Dividing by the embedding dimension ``dim`` keeps one ``scale`` meaningful
    for embeddings of any width, as squared distances grow with ``dim``.
    """
    return torch.exp(-squared_distances / (dim * scale))


def knn_probabilities(
    squared_distances: torch.Tensor, indices: torch.Tensor, labels: torch.Tensor, dim: int, scale: float = 1.0
) -> torch.Tensor:
    """Kernel-weighted label mean of each query's neighbours, kNN-Per's ``p_knn``.

    ``p_knn(x)_s = sum_j w_j y_{j,s} / sum_j w_j`` over the k neighbours ``j``,
    with ``w_j`` from :func:`gaussian_kernel`.

    Parameters
    ----------
    squared_distances, indices : torch.Tensor
        ``[Q, k]`` from a search.
    labels : torch.Tensor
        Stored {0, 1} labels ``[M, S]``.
    dim : int
        Embedding dimension ``D``.
    scale : float
        Kernel scale, ``> 0``.

    Returns
    -------
    torch.Tensor
        ``[Q, S]`` in ``[0, 1]``, dtype of ``labels``.
    """
    # Shifting by the nearest distance cancels in the ratio but stops every weight
    # underflowing to 0 (a 0/0) for queries far from the whole datastore.
    shifted = squared_distances - squared_distances[:, :1]
    weights = gaussian_kernel(shifted, dim, scale).to(labels.dtype)
    weights = weights / weights.sum(dim=1, keepdim=True)
    return torch.einsum("qk,qks->qs", weights, labels[indices])
