#!/usr/bin/env bash
# Rebuild a run's report.html and save a picture of it (the README's docs/report.png).
#
#   bash scripts/report-screenshot.sh RUN_FOLDER OUT.png [HEIGHT]
#
# Needs headless Chromium from the distribution (apt-get install chromium). The page is drawn
# 1200 px wide and HEIGHT px tall (default 2600: settings to the routing matrix and gamma plot),
# then scaled to 900 px wide with a 128-colour palette, which keeps the PNG small.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 RUN_FOLDER OUT.png [HEIGHT]" >&2
    exit 2
fi
run="$1"; out="$2"; height="${3:-2600}"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -z "$browser" ]; then
    echo "report-screenshot: no chromium on PATH; install it with: apt-get install chromium" >&2
    exit 1
fi
python -m fedsm_core.command_line.cli report "$run"
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
full="$profile/full.png"
"$browser" --headless --disable-gpu --no-sandbox --hide-scrollbars --no-first-run --user-data-dir="$profile" \
    --screenshot="$full" --window-size="1200,$height" "file://$(cd "$run" && pwd)/report.html" >/dev/null 2>&1
python - "$full" "$out" <<'PY'
import sys
from PIL import Image

picture = Image.open(sys.argv[1]).convert("RGB")
width = 900
picture = picture.resize((width, round(picture.height * width / picture.width)), Image.LANCZOS)
picture.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(sys.argv[2], optimize=True)
PY
echo "report-screenshot: wrote $out ($(du -k "$out" | cut -f1) KB)"
