"""The report of a tiny real run, opened in headless Chromium: every image loads, the routing table is there.

Chromium comes from the distribution (``apt-get install chromium``); without
it the test skips. The run itself is two FedSM rounds of the README's run
script on tiny images, as in ``test_end_to_end.py`` (own ports). The test
leaves ``report-screenshot.png`` beside the report: look at it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedsm_core.command_line.cli import main
from fedsm_core.report.run_report import REPORT_FILE, ROUTING_TABLE_ID

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
TINY = "num-server-rounds=2 max-local-steps=2 image-size=32 data-scale=0.1 selector-width=8 eval-every=1"
SCREENSHOT = "report-screenshot.png"
SITES = [f"site-{i}" for i in range(1, 7)]
# Marks every image with whether it decoded (naturalWidth > 0) once the page has loaded; --dump-dom shows the marks.
LOAD_CHECK = ("<script>window.addEventListener('load', () => { for (const image of document.images) {"
              " image.setAttribute('data-loaded', image.complete && image.naturalWidth > 0 ? 'yes' : 'no'); }"
              " document.body.setAttribute('data-checked', 'yes'); });</script>")

pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="headless Chromium is not installed (apt-get install chromium)")


def _chromium(profile: Path, *arguments: str) -> subprocess.CompletedProcess:
    command = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--no-first-run",
               f"--user-data-dir={profile}", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """The folder of a finished two-round FedSM run (its report written by the ServerApp)."""
    base = tmp_path_factory.mktemp("browser")
    env = {**os.environ, "FLWR_HOME": str(base / "flwr-home"), "FEDSM_RUNS": str(base / "runs"),
           # ports of our own, so neither the user's SuperLink nor test_end_to_end's is touched
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "39391", "FLWR_LOCAL_CONTROL_API_PORT": "39393",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "run-simulation.sh"), TINY], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (folder,) = list((base / "runs").iterdir())
    return folder


def test_every_image_of_the_report_loads_in_chromium_and_the_routing_matrix_is_there(tiny_run, tmp_path):
    # Prepare: a copy of the page, beside it (same relative image paths), that marks each image once loaded
    page = (tiny_run / REPORT_FILE).read_text()
    checked = tiny_run / "report-check.html"
    checked.write_text(page.replace("</body>", LOAD_CHECK + "</body>"))

    # Execute
    dom = _chromium(tmp_path / "profile", "--virtual-time-budget=20000", "--dump-dom", checked.as_uri())
    shot = _chromium(tmp_path / "profile", f"--screenshot={tiny_run / SCREENSHOT}", "--window-size=1200,5200",
                     (tiny_run / REPORT_FILE).as_uri())
    checked.unlink()

    # Assert
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-checked="yes"' in dom.stdout, "the page's load event never fired"
    images = re.findall(r"<img [^>]*>", dom.stdout)
    # validation, test bars, gamma, cost, and one overlay PNG per site (simulation: in the run folder)
    assert len(images) == 4 + len(SITES), images
    assert all('data-loaded="yes"' in image for image in images), [i for i in images if 'data-loaded="yes"' not in i]
    table = re.search(rf'<table id="{ROUTING_TABLE_ID}">(.*?)</table>', dom.stdout, re.S)
    assert table is not None, "no routing matrix table"
    assert all(f"<td>{site}</td>" in table.group(1) for site in SITES)
    assert "http://" not in page and "https://" not in page  # offline: nothing is fetched
    assert shot.returncode == 0 and (tiny_run / SCREENSHOT).stat().st_size > 10_000, shot.stderr[-2000:]


def test_fedsm_report_rebuilds_the_same_page_from_the_run_folder(tiny_run, capsys):
    # Prepare
    before = sorted(re.findall(r'<img src="([^"]+)"', (tiny_run / REPORT_FILE).read_text()))
    (tiny_run / REPORT_FILE).unlink()

    # Execute
    status = main(["report", str(tiny_run)])

    # Assert
    assert status == 0 and f"report: wrote {tiny_run / REPORT_FILE}" in capsys.readouterr().out
    assert sorted(re.findall(r'<img src="([^"]+)"', (tiny_run / REPORT_FILE).read_text())) == before
