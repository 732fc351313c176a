"""Time kNN-Per's exact neighbour search on each backend at realistic sizes.

Usage::

    python -m experiments.bench.knn_search_bench --threads 1

A query batch is one image's pixels (64x64 = 4096 or 128x128 = 16384); the
datastore holds 50k or 200k pixel embeddings of dimension 16 (random normal,
which is the worst case for any pruning but both backends are brute force).
Each cell is the median wall time of ``--repeats`` searches after one warm-up;
the index is built once per datastore, as :class:`KNNPer` does. ``agree`` is
the share of neighbour indices the backends return identically.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from fedsm_core.algorithms.knn_per.search import NeighbourIndex, faiss_available
from fedsm_core.device import set_cpu_threads


def _median_seconds(index: NeighbourIndex, queries: torch.Tensor, k: int, repeats: int) -> tuple[float, torch.Tensor]:
    index.search(queries, k)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _, found = index.search(queries, k)
        if queries.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), found


def _set_faiss_threads(threads: int) -> None:
    if faiss_available():
        import faiss

        faiss.omp_set_num_threads(threads)


def main() -> None:
    """Print one table row per (datastore size, query pixels)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[50_000, 200_000])
    parser.add_argument("--pixels", type=int, nargs="+", default=[64 * 64, 128 * 128])
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch and faiss CPU threads")
    parser.add_argument("--device", default="cpu", help="device of the torch backend (cpu or cuda)")
    args = parser.parse_args()
    set_cpu_threads(args.threads)
    _set_faiss_threads(args.threads)
    rng = np.random.default_rng(0)
    backends = ["faiss", "torch"] if faiss_available() else ["torch"]
    print(f"dim {args.dim}, k {args.k}, {args.threads} CPU thread(s), torch on {args.device}; median seconds")
    print("| datastore | query pixels | " + " | ".join(f"{b} s" for b in backends) + " | agree |")
    print("|---|---|" + "---|" * len(backends) + "---|")
    for size in args.sizes:
        keys = rng.standard_normal((size, args.dim), dtype=np.float32)
        indices = {b: NeighbourIndex(keys, b, "cpu" if b == "faiss" else args.device) for b in backends}
        for pixels in args.pixels:
            queries = torch.from_numpy(rng.standard_normal((pixels, args.dim), dtype=np.float32))
            cells, found = [], {}
            for backend, index in indices.items():
                seconds, found[backend] = _median_seconds(index, queries.to(index.device), args.k, args.repeats)
                cells.append(f"{seconds:.3f}")
            agree = (found["faiss"].cpu() == found["torch"].cpu()).double().mean().item() if len(found) == 2 else 1.0
            print(f"| {size} | {pixels} | " + " | ".join(cells) + f" | {agree:.4f} |")


if __name__ == "__main__":
    main()
