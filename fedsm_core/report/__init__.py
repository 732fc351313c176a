"""The HTML run report: one static page per run folder, with matplotlib PNGs beside it.

:mod:`~fedsm_core.report.run_data` reads a run folder (or the checkpoint of an
unfinished run), :mod:`~fedsm_core.report.report_plots` draws the figures,
:mod:`~fedsm_core.report.overlays` draws a site's test images with contours
(at the site, during its own evaluation) and
:mod:`~fedsm_core.report.run_report` writes ``report.html``.
"""
