"""The server's strategies, one per file, as Flower's own ``flwr/serverapp/strategy/``."""
