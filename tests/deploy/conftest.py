"""The deployment tests start real Flower servers; the marker is registered in pyproject.toml."""
