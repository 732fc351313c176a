"""Made-up results of experiments.gpu.check, shared by its tests (no GPU involved)."""

FAKE = {
    "environment": {"gpus": ["Fake GPU 80GB"], "torch": "2.x", "cuda": "12.x", "cudnn": 90000},
    "command": "python -m experiments.gpu.check --out x",
    "tests": {"status": 0, "summary": "7 passed in 3.0s"},
    "simulation": {
        "overrides": "image-size=256", "client-gpu-share": 0.1666, "round-seconds": [20.0, 10.0, 12.5],
        "train-seconds": [8.0, 5.0, 4.0], "train-images-per-round": 400, "busy-share": {0: 0.72},
        "samples": 120, "wall-seconds": 70.0, "peak-memory-mib": {"4242 ray::ClientAppActor": 3100.0},
    },
    "agreement": {"tolerance": 0.01, "floor": 2e-3, "settings": {"image-size": 64}, "models": [
        {"model": "global", "update-norm": 0.5, "relative": 2e-6, "max-abs": 1e-7, "agrees": True},
        {"model": "selector", "update-norm": 0.2, "relative": 0.3, "max-abs": 1e-2, "agrees": False},
    ]},
}
