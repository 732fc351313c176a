"""Helpers the test packages share: fake sites and runs, the in-process grid, the flwr run wrapper."""
