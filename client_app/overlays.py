"""The site's side of the run report: its test images with contours, written where images may go.

Images never leave a site in a deployment: a deployed SuperNode writes its
overlays into a folder on its own machine, a simulated node (same machine as
the ServerApp) into the run folder the server names
(:func:`fedsm_core.report.overlays.overlay_folder`).
"""

from __future__ import annotations

from logging import INFO, WARNING

import torch
from flwr.app import Context
from flwr.common import log

from fedsm_core.data.arrays import SegArrays
from fedsm_core.report.overlays import Predictor, overlay_folder, write_site_overlays


def write_test_overlays(predict: Predictor, data: SegArrays, site: str, sent_folder: str, context: Context,
                        device: torch.device) -> None:
    """Draw the site's overlay PNG; a failure is logged, never fails the test evaluation it belongs to."""
    folder, simulated = overlay_folder(dict(context.node_config), sent_folder, context.run_id)
    if folder is None:  # the server asked for none
        return
    try:
        path = write_site_overlays(predict, data, site, folder, device)
    except (OSError, ValueError, RuntimeError) as error:
        log(WARNING, "site %s: test overlays not written to %s (%s)", site, folder, error)
        return
    if path is not None:
        log(INFO, "site %s: test overlays written to %s (%s)", site, path,
            "run folder, simulation" if simulated else "this site's machine")
