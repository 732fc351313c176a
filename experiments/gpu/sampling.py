"""GPU use sampled with ``nvidia-smi`` while a run goes on: busy share and memory per process.

``nvidia-smi --query-gpu=utilization.gpu`` is the percentage of the last
sample period (1/6 s to 1 s, by GPU) in which a kernel ran, i.e. the share of
time the GPU was busy. :class:`GpuSampler` polls it, and the memory of every
process on the GPU, from a thread, stamping each sample with Unix time so that
samples can be cut to the windows of a run's training exchanges (the ``train``
rows of ``timing.csv``, whose ``ended`` column is Unix time).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from statistics import mean
from typing import Self

GPU_QUERY = ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
APPS_QUERY = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


@dataclasses.dataclass(frozen=True)
class GpuSample:
    """One GPU at one time: busy percentage and memory used (MiB)."""

    time: float
    gpu: int
    busy_percent: float
    memory_mib: float


@dataclasses.dataclass(frozen=True)
class ProcessSample:
    """One process on a GPU at one time: its GPU memory (MiB)."""

    time: float
    pid: int
    memory_mib: float


def _numbers(line: str) -> list[str]:
    return [field.strip() for field in line.split(",")]


def parse_gpu_lines(text: str, stamp: float) -> list[GpuSample]:
    """Samples from ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used`` (csv, no header, no units).

    A field ``nvidia-smi`` cannot read (``[N/A]``) drops that line.
    """
    samples = []
    for line in text.strip().splitlines():
        fields = _numbers(line)
        try:
            samples.append(GpuSample(stamp, int(fields[0]), float(fields[1]), float(fields[2])))
        except (ValueError, IndexError):
            continue
    return samples


def parse_process_lines(text: str, stamp: float) -> list[ProcessSample]:
    """Samples from ``nvidia-smi --query-compute-apps=pid,used_memory`` (csv, no header, no units)."""
    samples = []
    for line in text.strip().splitlines():
        fields = _numbers(line)
        try:
            samples.append(ProcessSample(stamp, int(fields[0]), float(fields[1])))
        except (ValueError, IndexError):
            continue
    return samples


def busy_share(samples: Iterable[GpuSample], windows: Iterable[tuple[float, float]]) -> dict[int, float]:
    """Mean busy share (0..1) of each GPU over the samples that fall inside any ``(start, end)`` window.

    GPUs with no sample inside a window are left out.
    """
    spans = list(windows)
    inside: dict[int, list[float]] = {}
    for sample in samples:
        if any(start <= sample.time <= end for start, end in spans):
            inside.setdefault(sample.gpu, []).append(sample.busy_percent / 100.0)
    return {gpu: mean(values) for gpu, values in sorted(inside.items())}


def peak_memory_per_process(samples: Iterable[ProcessSample]) -> dict[int, float]:
    """The largest GPU memory (MiB) seen for each process id."""
    peaks: dict[int, float] = {}
    for sample in samples:
        peaks[sample.pid] = max(peaks.get(sample.pid, 0.0), sample.memory_mib)
    return dict(sorted(peaks.items()))


def process_name(pid: int) -> str:
    """The command line of ``pid`` (Ray names its workers ``ray::<Actor>``), or ``?`` when gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:80] or "?"


class GpuSampler:
    """Polls ``nvidia-smi`` every ``interval`` seconds in a thread, while used as a context manager.

    Attributes
    ----------
    gpus : list of GpuSample
    processes : list of ProcessSample
    names : dict
        Command line of each process seen, read while it ran.
    """

    def __init__(self, interval: float = 0.25) -> None:
        if shutil.which("nvidia-smi") is None:
            raise RuntimeError("nvidia-smi is not on PATH: GPU use cannot be sampled")
        self.interval = interval
        self.gpus: list[GpuSample] = []
        self.processes: list[ProcessSample] = []
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)

    def _query(self, command: list[str]) -> tuple[str, float]:
        began = time.time()
        result = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
        return result.stdout, (began + time.time()) / 2  # stamp the middle of the call

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                text, stamp = self._query(GPU_QUERY)
                self.gpus += parse_gpu_lines(text, stamp)
                text, stamp = self._query(APPS_QUERY)
                for sample in parse_process_lines(text, stamp):
                    self.processes.append(sample)
                    if sample.pid not in self.names:
                        self.names[sample.pid] = process_name(sample.pid)
            except (OSError, subprocess.TimeoutExpired):
                pass  # one missed sample; the next poll tries again
            self._stop.wait(self.interval)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
