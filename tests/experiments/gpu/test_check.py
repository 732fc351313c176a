"""The GPU check's simulation part with a fake sampler and run, its verdict, and its skip without CUDA."""

from __future__ import annotations

import torch
from support.gpu_results import FAKE

from experiments.gpu import check as gpu_check
from experiments.gpu.check import failed
from experiments.gpu.report import format_report
from experiments.gpu.sampling import GpuSample, ProcessSample


class FakeSampler:
    """Stands in for nvidia-smi: GPU 0 busy 90 % inside the training exchange, idle outside."""

    def __init__(self, interval: float) -> None:
        self.gpus = [GpuSample(t, 0, busy, 0.0) for t, busy in [(995.0, 0.0), (1002.0, 90.0), (1008.0, 90.0),
                                                                (1015.0, 0.0)]]
        self.processes = [ProcessSample(1001.0, 77, 2000.0), ProcessSample(1003.0, 77, 2500.0)]
        self.names = {77: "ray::ClientAppActor"}

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None


def test_simulation_part_cuts_gpu_samples_to_the_training_exchanges(monkeypatch, tmp_path):
    # Prepare: one round whose training exchange ran from 1000 to 1010 (Unix time)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "timing.csv").write_text("round,part,seconds,ended\n1,train,10.0,1010.0\n1,round,12.0,1012.0\n")
    monkeypatch.setattr(gpu_check, "launch_run", lambda settings, runs, label, env: folder)
    monkeypatch.setattr(gpu_check, "GpuSampler", FakeSampler)
    monkeypatch.setattr(gpu_check, "visible_gpu_count", lambda: (1, ""))
    monkeypatch.setattr(gpu_check, "train_images_per_round", lambda settings: 250)
    monkeypatch.setenv("RAY_CPUS", "16")

    # Execute
    result = gpu_check.simulation_part(tmp_path)

    # Assert
    assert result["busy-share"] == {0: 0.9}  # only the two samples inside [1000, 1010]
    assert result["peak-memory-mib"] == {"77 ray::ClientAppActor": 2500.0}
    assert result["client-gpu-share"] == 0.1666  # 6 clients on one GPU
    assert result["round-seconds"] == [12.0] and result["train-seconds"] == [10.0]
    assert "images per second in the training exchange: 25.0" in format_report({**FAKE, "simulation": result})


def test_failed_parts_tests_and_disagreement_set_the_exit_status():
    assert failed(FAKE) == ["CPU and GPU rounds disagree"]
    results = {**FAKE, "agreement": {"error": "RuntimeError: boom"}, "tests": {"status": 1, "summary": "1 failed"}}
    assert failed(results) == ["gpu tests failed", "agreement failed"]
    assert failed({"tests": {"status": 0}, "simulation": {}, "agreement": {"models": []}}) == []


def test_without_cuda_the_check_is_skipped(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == "skipped: no CUDA device"
    assert not (tmp_path / "out").exists()
