"""The results pages quote the committed studies: every table row there is a row of the committed table.

``docs/results.md`` holds the reference study (by dataset), the ladder and Table 4 (the
reference-defaults study's ``synthetic-prostate``); the README's Results quote one dataset of
the reference study and Table 4.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "experiments" / "results" / "reference" / "table.md"
REFERENCE_DEFAULTS = ROOT / "experiments" / "results" / "reference-defaults" / "table.md"
LADDER = ROOT / "experiments" / "results" / "ladder" / "table.md"
RESULTS_PAGE = ROOT / "docs" / "results.md"


def section(text: str, heading: str) -> str:
    """The ``## <heading>`` section of a markdown page, up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def table_rows_by_heading(text: str, marker: str) -> dict[str, list[str]]:
    """Markdown table rows (not separators) under each heading that starts with ``marker``; ``""`` before any."""
    rows: dict[str, list[str]] = {"": []}
    heading = ""
    for line in text.splitlines():
        if line.startswith(marker):
            heading = line[len(marker):].strip()
            rows.setdefault(heading, [])
        elif line.startswith("| ") and not line.startswith("|---"):
            rows[heading].append(line)
    return rows


def misquoted(quoting: str, *tables: str) -> list[str]:
    """Rows of ``quoting`` that are not rows of a table.md section named by their ``### <dataset>`` heading."""
    committed: dict[str, set[str]] = {}
    for table in tables:
        for name, lines in table_rows_by_heading(table, "## ").items():
            committed.setdefault(name, set()).update(lines)
    quoted = table_rows_by_heading(quoting, "### ")
    return [row for name, rows in quoted.items() for row in rows if row not in committed.get(name or "?", set())]


def test_every_table_row_of_the_readme_results_is_a_row_of_its_datasets_committed_table():
    readme = (ROOT / "README.md").read_text()
    assert misquoted(section(readme, "Results"), REFERENCE.read_text(), REFERENCE_DEFAULTS.read_text()) == []


def test_every_table_4_row_of_the_results_page_is_a_row_of_the_committed_prostate_table():
    page = section(RESULTS_PAGE.read_text(), "Table 4: synthetic-prostate in the reference study with today's defaults")
    rows = [line for line in page.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    committed = set(table_rows_by_heading(REFERENCE_DEFAULTS.read_text(), "## ")["synthetic-prostate"])
    assert rows and [row for row in rows if row not in committed] == []


def test_every_reference_row_of_the_results_page_is_a_row_of_its_datasets_committed_table():
    page = RESULTS_PAGE.read_text()
    assert misquoted(section(page, "The reference study"), REFERENCE.read_text()) == []


def test_the_results_page_quotes_the_committed_ladder_table():
    quoting = section(RESULTS_PAGE.read_text(), "Where the gap comes from: the ladder")
    committed = set(LADDER.read_text().splitlines())
    quoted = [line for line in quoting.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    assert quoted and [line for line in quoted if line not in committed] == []
