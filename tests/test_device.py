"""Device choice: CUDA requested where none is visible, pinned GPUs, copies; GPU-only checks are marked ``gpu``."""

from __future__ import annotations

import pytest
import torch

from fedsm_core.device import allow_tf32, configure_backends, describe_device, select_device, tf32_switches, to_device
from fedsm_core.training.local_update import Learner, train_local
from fedsm_core.training.precision import resolve_precision

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def restored_backends():
    """Put torch's backend flags back as they were, by plain assignment.

    ``monkeypatch.setattr`` is not used for them: its undo may delete the
    attribute (pytest 9.2), which torch's backend modules refuse.
    """
    switches = [(torch.backends.cudnn, "benchmark"), (torch.backends.cudnn, "deterministic"), *tf32_switches()]
    saved = [(module, name, getattr(module, name)) for module, name in switches]
    yield
    for module, name, value in saved:
        setattr(module, name, value)


def tf32_allowed() -> list[bool]:
    """Whether each TF32 flag of this torch allows TF32 math."""
    return [getattr(module, name) in (True, "tf32") for module, name in tf32_switches()]


def _no_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_a_visible_gpu_names_the_setting_that_gives_one(monkeypatch, name):
    # Prepare: a Ray worker that requested no GPU (Ray set CUDA_VISIBLE_DEVICES to "")
    _no_gpu(monkeypatch)

    # Execute / Assert
    with pytest.raises(ValueError, match=rf"device = '{name}' but this process sees no CUDA GPU "
                                         r"\(CUDA_VISIBLE_DEVICES=''\)") as error:
        select_device(name)
    assert "client-resources-num-gpus" in str(error.value) and "CLIENT_GPUS" in str(error.value)


def test_auto_without_a_gpu_is_the_cpu(monkeypatch):
    _no_gpu(monkeypatch)
    assert select_device("auto") == torch.device("cpu")
    assert select_device("cpu") == torch.device("cpu")


def test_pinned_gpu_index_must_exist(monkeypatch):
    # Prepare: two visible GPUs (mocked)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

    # Execute / Assert
    assert select_device("cuda:1") == torch.device("cuda", 1)
    assert select_device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match=r"device = 'cuda:2' but this process sees 2 GPU\(s\) \(cuda:0..cuda:1\)"):
        select_device("cuda:2")


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cuda1", ""])
def test_unknown_device_names_the_choices(name):
    with pytest.raises(ValueError, match=r"is not one of \['auto', 'cpu', 'cuda'\] or 'cuda:N'"):
        select_device(name)


def test_cpu_copies_and_backends_are_left_alone():
    # Prepare
    tensor = torch.ones(2)
    before = torch.backends.cudnn.benchmark

    # Execute
    moved = to_device(tensor, "cpu")
    configure_backends(torch.device("cpu"), deterministic=True, precision="fp32")

    # Assert
    assert moved is tensor
    assert torch.backends.cudnn.benchmark == before
    assert describe_device(torch.device("cpu"), "fp32").startswith("cpu (")


@pytest.mark.parametrize(("device", "selected"), [("cuda", []), ("cuda:1", [torch.device("cuda", 1)])])
def test_cuda_backend_switches_and_the_pinned_gpu(monkeypatch, restored_backends, device, selected):
    # Prepare: no GPU needed, the switches are plain flags (restored_backends puts them back)
    allow_tf32(True)
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)

    # Execute
    configure_backends(torch.device(device), deterministic=False, precision="fp32")

    # Assert
    assert torch.backends.cudnn.benchmark is True and torch.backends.cudnn.deterministic is False
    assert tf32_allowed() == [False] * len(tf32_switches())
    assert calls == selected  # plain "cuda" keeps the current GPU (set_device would reject it)


@pytest.mark.gpu
@needs_cuda
def test_gpu_copy_is_pinned_and_lands_on_the_gpu():
    moved = to_device(torch.arange(4.0), torch.device("cuda"))
    assert moved.is_cuda and torch.equal(moved.cpu(), torch.arange(4.0))
    assert select_device("auto").type == "cuda" and select_device("cuda:0") == torch.device("cuda", 0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("deterministic", [False, True])
def test_gpu_backends_follow_the_deterministic_switch(restored_backends, deterministic):
    configure_backends(torch.device("cuda"), deterministic, "fp32")
    assert torch.backends.cudnn.benchmark is (not deterministic)
    assert torch.backends.cudnn.deterministic is deterministic
    assert not any(tf32_allowed())  # fp32 means float32 on the GPU too
    configure_backends(torch.device("cuda"), False, "bf16")
    assert all(tf32_allowed())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["auto", "fp16", "fp32"])
def test_gpu_training_keeps_float32_weights(precision):
    # Prepare
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 1, 1)).cuda()
    learner = Learner("m", model, torch.optim.Adam(model.parameters(), lr=1e-3),
                      lambda out, target: ((out - target) ** 2).mean())
    batches = [(torch.rand(4, 3, 16, 16), torch.rand(4, 1, 16, 16)) for _ in range(3)]

    # Execute
    metrics = train_local([learner], lambda: batches, epochs=2, device=torch.device("cuda"), precision=precision)

    # Assert
    assert metrics["steps"] == 6.0 and torch.isfinite(torch.tensor(metrics["loss-m"]))
    assert all(p.dtype == torch.float32 and p.is_cuda for p in model.parameters())
    assert resolve_precision("auto", "cuda") == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")


def test_tf32_uses_one_torch_api_so_the_flags_stay_readable(restored_backends):
    # Execute: forbid, then allow, as two runs of different precision would
    allow_tf32(False)
    forbidden = tf32_allowed()
    allow_tf32(True)

    # Assert: every flag followed, and none raised on reading (mixing torch's two TF32 APIs makes reads raise)
    assert forbidden == [False] * len(tf32_switches())
    assert tf32_allowed() == [True] * len(tf32_switches())
