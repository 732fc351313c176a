"""``report.html``: one static page per run, with its PNG figures beside it.

The page needs no server, no network and no script: open the file in any
browser. Figures come from :mod:`fedsm_core.report.report_plots`; the test
images with contours were drawn by the sites themselves
(:mod:`fedsm_core.report.overlays`).
"""

from __future__ import annotations

import html
import time
from pathlib import Path

from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.evaluation.case_scores import CASE_DICE, CASE_HD95, CASE_HD95_MM, NUM_CASES, NUM_MISSED
from fedsm_core.evaluation.super_model_evaluation import ROUTED_COUNT, ROUTED_DICE, route_label
from fedsm_core.report.overlays import DEPLOYMENT_FOLDER
from fedsm_core.report.report_plots import cost_per_round, plot_cost, plot_gamma, plot_test_bars, plot_validation
from fedsm_core.report.run_data import OVERLAY_FOLDER, POOLED, RunData, describe_settings, load_run

REPORT_FILE = "report.html"
FIGURE_FOLDER = "report"  # the figures' PNGs, beside report.html
ROUTING_TABLE_ID = "routing-matrix"
TEST_COLUMNS = ("dice-global", "dice-personal", "dice-super", "dice-knn-per", "dice-super-knn", "selector-accuracy",
                "share-global", "gamma", "knn-lambda", "knn-lambda-super")
CASE_COLUMNS = (NUM_CASES, *(prefix + model for prefix in (CASE_DICE, CASE_HD95, CASE_HD95_MM, NUM_MISSED)
                             for model in ("global", "personal", "super", "knn-per", "super-knn")))
KEY_SETTINGS = ("strategy", "dataset", "num-server-rounds", "image-size", "data-scale", "seed", "softpull-lambda",
                "gamma-selection", "selector-head", "personalization", "lr", "local-epochs", "max-local-steps",
                "aggregation", "attack", "attack-scale")
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.55em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
table.settings td, table.settings th { text-align: left; }
td.own { background: #e8f5e9; font-weight: 600; } td.empty { color: #aaa; }
img { max-width: 100%; border: 1px solid #eee; }
.overlays { display: flex; flex-wrap: wrap; gap: 0.8em; } .overlays figure { margin: 0; flex: 0 1 auto; }
figcaption { font-weight: 600; font-size: 0.9em; } .note { color: #555; font-size: 0.9em; }
"""


def _esc(value: object) -> str:
    return html.escape(str(value))


def _table(header: list[str], rows: list[list[str]], table_id: str = "", css: str = "") -> str:
    """An HTML table; cells are already escaped HTML (``<td>`` contents, or full ``<td ...>`` tags)."""
    head = "".join(f"<th>{_esc(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(cell if cell.startswith("<td") else f"<td>{cell}</td>" for cell in row) + "</tr>"
                   for row in rows)
    ident = (f' id="{table_id}"' if table_id else "") + (f' class="{css}"' if css else "")
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(path: Path | None, run: RunData, alt: str, missing: str) -> str:
    if path is None:
        return f'<p class="note">{_esc(missing)}</p>'
    return f'<p><img src="{_esc(path.relative_to(run.folder).as_posix())}" alt="{_esc(alt)}"></p>'


def settings_section(run: RunData) -> str:
    """The settings that tell runs apart, then every setting in a folded table."""
    rows = [[_esc(key), _esc(value)] for key, value in run.settings.items()]
    if not rows:
        return '<h2>Settings</h2><p class="note">No run config found (no checkpoint.pt or summary.md).</p>'
    key_rows = [[_esc(key), _esc(run.settings[key])] for key in KEY_SETTINGS if key in run.settings]
    return (f"<h2>Settings</h2>{_table(['key', 'value'], key_rows, css='settings')}<details><summary>all "
            f"{len(rows)} settings</summary>{_table(['key', 'value'], rows, css='settings')}</details>")


def test_section(run: RunData, figures: Path) -> str:
    """Per-site test Dice: bars and a table."""
    table = run.values("test")
    if not table:
        return '<h2>Test</h2><p class="note">No test evaluation yet: the run has not finished.</p>'
    columns = [name for name in TEST_COLUMNS if any(name in values for values in table.values())]
    rows = [[_esc(site), *[f"{table[site][name]:.4f}" if name in table[site] else "-" for name in columns]]
            for site in [*run.site_columns, POOLED] if site in table]
    note = '<p class="note">Slice Dice (paper): the mean over 2-D test slices (images) with foreground.</p>'
    return ("<h2>Test Dice per site</h2>" + _figure(plot_test_bars(run, figures / "test.png"), run,
                                                    "test Dice per site", "") + note
            + _table(["site", *columns], rows) + case_table(run))


def case_table(run: RunData) -> str:
    """Per-case 3-D Dice and HD95 of the test split, or nothing when the sites' images name no cases."""
    table = run.values("test")
    columns = [name for name in CASE_COLUMNS if any(name in values for values in table.values())]
    if NUM_CASES not in columns:
        return ""
    rows = [[_esc(site), *[("-" if name not in table[site] else f"{int(table[site][name])}"
                            if name.startswith("num-") else f"{table[site][name]:.4f}") for name in columns]]
            for site in [*run.site_columns, POOLED] if site in table]
    note = ('<p class="note">Per-case 3-D Dice: the slices of each test case (patient) stacked into one volume, '
            "the mean over cases with foreground. HD95: the 95th-percentile surface distance in voxels (in-plane "
            "pixels of the resized slices, one slice step across), the mean over cases where the model found "
            "foreground; missed cases are counted apart. HD95 mm: the same distance in millimetres, where every "
            "case has a voxel spacing (NIfTI headers, generated prostate cases).</p>")
    return "<h3>Per case (3-D)</h3>" + note + _table(["site", *columns], rows)


def routing_matrix(run: RunData) -> tuple[list[str], list[list[str]]] | None:
    """Header and rows of the routing matrix: true site against the model each test image went to.

    A cell holds the number of images and the mean Dice of the model that
    segmented them (over those with foreground); ``None`` when the test
    evaluation recorded no routes (a single-model strategy, or no test yet).
    """
    table = run.values("test")
    routes = ["global", *[str(index) for index in range(len(run.sites))]]
    if not any(ROUTED_COUNT + route in table.get(site, {}) for site in run.site_columns for route in routes):
        return None
    names = {route_label(-1): "global", **{str(index): site for index, site in enumerate(run.sites)}}
    rows = []
    for site in run.site_columns:
        values, cells = table.get(site, {}), [_esc(site)]
        for route in routes:
            count = int(values.get(ROUTED_COUNT + route, 0))
            dice = values.get(ROUTED_DICE + route)
            text = f"{count}" + (f" &middot; {dice:.3f}" if dice is not None else "")
            style = "own" if names[route] == site and count else "empty" if not count else ""
            cells.append(f'<td class="{style}">{text}</td>')
        rows.append(cells)
    totals = [int(sum(table.get(site, {}).get(ROUTED_COUNT + route, 0) for site in run.site_columns))
              for route in routes]
    rows.append(["<b>all sites</b>", *[str(total) for total in totals]])
    return ["true site \\ routed to", *[names[route] for route in routes]], rows


def routing_section(run: RunData) -> str:
    """The routing matrix table, or why there is none."""
    matrix = routing_matrix(run)
    if matrix is None:
        return ('<h2>Routing matrix</h2><p class="note">No routes recorded: the strategy has no selector, or '
                "the run has not reached its test evaluation.</p>")
    note = ('<p class="note">Test images: rows are the site an image comes from, columns the model the '
            "selector sent it to (Algorithm 2 at the chosen gamma). Each cell: images &middot; mean Dice of "
            "that model on those with foreground. Green: the site's own personalized model.</p>")
    return "<h2>Routing matrix</h2>" + note + _table(*matrix, table_id=ROUTING_TABLE_ID)


def cost_section(run: RunData, figures: Path) -> str:
    """Bytes and seconds per round."""
    rounds, megabytes, seconds = cost_per_round(run)
    figure = _figure(plot_cost(run, figures / "cost.png"), run, "bytes and seconds per round",
                     "No traffic.csv / timing.csv yet: they are written when the run ends.")
    if not rounds:
        return "<h2>Bytes and seconds per round</h2>" + figure
    total = sum(sum(values) for values in megabytes.values())
    return (f"<h2>Bytes and seconds per round</h2>{figure}<p class='note'>{len(rounds)} rounds: {total:.1f} MB "
            f"on the wire in all, {sum(seconds):.1f} s of round wall time.</p>")


def overlay_section(run: RunData) -> str:
    """The sites' test images with contours, and where they were drawn."""
    pictures = sorted((run.folder / OVERLAY_FOLDER).glob("*.png"))
    where = ("Each site drew these during its own test evaluation (the routed model's prediction) and, "
             "since this was a simulation, wrote them into the run folder.")
    if not pictures:
        where = (f"None in the run folder. In a deployment images never leave a site: each SuperNode writes its "
                 f"overlays to its own machine, under its node config's overlay-dir (default "
                 f"./{DEPLOYMENT_FOLDER}/run-&lt;run id&gt;/&lt;site&gt;.png). A run that has not reached its "
                 "test evaluation has none yet.")
    images = "".join(f"<figure><figcaption>{_esc(path.stem)}</figcaption>"
                     f"{_figure(path, run, f'test images of {path.stem}', '')}</figure>" for path in pictures)
    return (f"<h2>Test images: ground truth and prediction</h2><p class='note'>{where}</p>"
            f"<div class='overlays'>{images}</div>")


def render_report(run: RunData, baseline: RunData | None = None) -> str:
    """The whole page as HTML text; writes the figures into ``<run folder>/report/``."""
    figures = run.folder / FIGURE_FOLDER
    status = "finished" if run.finished else \
        f"unfinished: last evaluated round {max(run.split_rounds('val'), default=0)}"
    baseline_note = f" Dashed grey: dice-global of the baseline run {_esc(baseline.folder.name)}." if baseline else ""
    parts = [
        f"<h1>{_esc(describe_settings(run.settings))}</h1>",
        f"<p class='note'>Run folder {_esc(run.folder.name)} ({status}); report written "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}. Sites: {_esc(', '.join(run.sites))}.</p>",
        settings_section(run),
        "<h2>Validation Dice per round</h2>",
        f"<p class='note'>Pooled over all validation images, and per site.{baseline_note}</p>",
        _figure(plot_validation(run, figures / "validation.png", baseline), run, "validation Dice per round",
                "No validation round yet."),
        test_section(run, figures),
        routing_section(run),
        "<h2>Dice against gamma</h2>",
        "<p class='note'>Super model on the last validation round, pooled (black) and per site; "
        "dotted red: the gamma the run chose.</p>",
        _figure(plot_gamma(run, figures / "gamma.png", GAMMA_GRID), run, "validation Dice against gamma",
                "No gamma sweep: the strategy has no gamma, or the checkpoint.pt with the sweep is missing."),
        cost_section(run, figures),
        overlay_section(run),
    ]
    body = "\n".join(parts)
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{_esc(run.folder.name)}</title>"
            f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")


def write_report(path: str | Path, baseline: str | Path | None = None) -> Path:
    """Write ``report.html`` (and its figures) into a run folder; ``path`` may be its checkpoint.

    Raises
    ------
    FileNotFoundError
        When ``path`` (or ``baseline``) is not a run folder (:func:`load_run`).
    """
    run = load_run(path)
    page = render_report(run, load_run(baseline) if baseline is not None else None)
    target = run.folder / REPORT_FILE
    target.write_text(page, encoding="utf-8")
    return target
