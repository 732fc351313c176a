"""FedSM core: models, losses, metrics, data and federated algorithms.

Plain PyTorch/NumPy. This package never imports ``flwr``: the Flower adapters in
``server_app`` and ``client_app`` decode messages and call into it, so every
algorithm here runs (and is tested) without a federation.
"""

__version__ = "0.1.0"
