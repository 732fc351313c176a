"""The deployment tests start real Flower servers; the marker is registered in pyproject.toml."""

import pytest
from support.deploy_harness import Deployment, require_tools


@pytest.fixture
def deployment(tmp_path):
    """A deployment folder whose every started process is stopped by PID afterwards."""
    require_tools("openssl", "ssh-keygen", "nginx")
    deployment = Deployment(tmp_path)
    try:
        yield deployment
    finally:
        deployment.stop_all()
