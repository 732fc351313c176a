"""kNN-Per's neighbour search: hand-placed neighbours, faiss against torch, chunking, the backend choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsm_core.algorithms.knn_per import search as knn_search
from fedsm_core.algorithms.knn_per.search import NeighbourIndex, faiss_available, resolve_backend, search_torch

BACKENDS = ["torch", *(["faiss"] if faiss_available() else [])]
needs_faiss = pytest.mark.skipif(not faiss_available(), reason="faiss-cpu is not installed")


@pytest.mark.parametrize("backend", BACKENDS)
def test_search_finds_hand_placed_neighbours(backend):
    # Prepare: keys at (0, 0), (3, 0), (0, 2); query at (0, 0.5)
    keys = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 2.0]], np.float32)
    index = NeighbourIndex(keys, backend)

    # Execute
    squared, indices = index.search(torch.tensor([[0.0, 0.5]]), k=5)

    # Assert: k is capped at 3 entries; d^2 = 0.25, 1.5^2 = 2.25, 3^2 + 0.5^2 = 9.25
    assert indices.tolist() == [[0, 2, 1]]
    np.testing.assert_allclose(squared.numpy(), [[0.25, 2.25, 9.25]], rtol=1e-6)


@needs_faiss
def test_faiss_and_torch_backends_agree_on_random_data():
    # Prepare
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((3000, 16), dtype=np.float32)
    queries = torch.from_numpy(rng.standard_normal((500, 16), dtype=np.float32))

    # Execute
    faiss_squared, faiss_indices = NeighbourIndex(keys, "faiss").search(queries, 10)
    torch_squared, torch_indices = NeighbourIndex(keys, "torch").search(queries, 10)

    # Assert
    assert torch.equal(faiss_indices, torch_indices)
    np.testing.assert_allclose(faiss_squared.numpy(), torch_squared.numpy(), rtol=1e-4, atol=1e-4)


def test_torch_search_gives_the_same_result_in_small_chunks():
    # Prepare
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(200, 8, generator=generator)
    queries = torch.randn(50, 8, generator=generator)

    # Execute: 7 query rows per chunk (1400 // 200) versus all at once
    chunked = search_torch(keys, queries, 4, chunk_elements=1400)
    whole = search_torch(keys, queries, 4)

    # Assert: cdist may switch between its direct and matrix-product forms with the block size
    assert torch.equal(chunked[1], whole[1])
    torch.testing.assert_close(chunked[0], whole[0], rtol=1e-5, atol=1e-5)


def test_auto_backend_prefers_faiss_on_cpu_only(monkeypatch):
    # Prepare / Execute / Assert
    if faiss_available():
        assert resolve_backend("auto", "cpu") == "faiss"
    assert resolve_backend("auto", "cuda") == "torch"
    monkeypatch.setattr(knn_search, "faiss_available", lambda: False)
    assert resolve_backend("auto", "cpu") == "torch"
    with pytest.raises(ValueError, match="pip install faiss-cpu"):
        resolve_backend("faiss")
