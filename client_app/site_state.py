"""Per-site client state kept between rounds (SCAFFOLD's c_k, APFL's v_k and alpha_k), on local disk.

Flower keeps a ``context.state`` per *node*. A simulated node may serve
several sites, and the simulation runs messages for one node in parallel
workers, each with its own copy of that node's context; the copy written
back last wins, so state kept there for one site could be lost when another
site's message finished later. Each site's state therefore lives in its own
file, written atomically: ``<root>/run-<run key>/<site>/<key>.npz``, where the
run key is the one the server's messages name (the first run's, also after a
resume, so the state continues) or else the run id, and the
root is ``$FEDSM_SITE_STATE`` or ``<temp dir>/fedsm-site-state``. Only one
message per site and round exists, so no two writers share a file. In
deployment the file stays on the site's machine, as ``context.state`` did.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import numpy as np

from app_protocol import records
from fedsm_core.algorithms.fedsm.site_round import OPTIMIZER, PERSONAL, SELECTOR_MOMENTS

ROOT_VARIABLE = "FEDSM_SITE_STATE"


def state_file(run_id: int | str, site: str, key: str) -> Path:
    """Where ``key`` of ``site`` in run ``run_id`` (a run id or a run key) is kept."""
    root = Path(os.environ.get(ROOT_VARIABLE) or Path(tempfile.gettempdir()) / "fedsm-site-state")
    return root / f"run-{run_id}" / site / f"{key}.npz"


def load_site_state(run_id: int | str, site: str, key: str) -> dict[str, np.ndarray] | None:
    """The arrays saved under ``key`` for ``site``, or ``None`` before the first save."""
    path = state_file(run_id, site, key)
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as stored:
        return {name: stored[name] for name in stored.files}


def save_site_state(run_id: int | str, site: str, key: str, arrays: dict[str, np.ndarray]) -> Path:
    """Save ``arrays`` under ``key`` for ``site`` (temporary file, then rename: never half written)."""
    path = state_file(run_id, site, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    with os.fdopen(handle, "wb") as out:
        np.savez(out, **arrays)
    os.replace(temporary, path)
    return path


# The file each kind of FedSM site state is kept in (the names runs before the shared site round used)
FEDSM_STATE_FILES = {PERSONAL: records.PERSONAL_STATE, SELECTOR_MOMENTS: records.SELECTOR_MOMENTS_STATE,
                     OPTIMIZER: records.OPTIMIZER_STATE}


@dataclasses.dataclass(frozen=True)
class SiteFiles:
    """A site's FedSM state in its files (:class:`fedsm_core.algorithms.fedsm.site_round.SiteMemory`)."""

    run_key: str
    site: str

    def load(self, kind: str) -> dict[str, np.ndarray] | None:
        """The arrays kept under ``kind``, or ``None`` before the first save."""
        return load_site_state(self.run_key, self.site, FEDSM_STATE_FILES[kind])

    def save(self, kind: str, arrays: dict[str, np.ndarray]) -> None:
        """Keep ``arrays`` under ``kind`` for the next round."""
        save_site_state(self.run_key, self.site, FEDSM_STATE_FILES[kind], arrays)
