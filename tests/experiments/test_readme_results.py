"""The README's Results quote the committed study: every table row there is a row of its dataset's table.md section."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "experiments" / "results" / "reference" / "table.md"


def results_section(readme: str) -> str:
    """The README's ``## Results`` section, up to the next ``## `` heading."""
    start = readme.index("\n## Results\n")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end != -1 else None]


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


def misquoted(readme: str, table: str) -> list[str]:
    """README Results rows that are not rows of the table.md section named by their ``### <dataset>`` heading."""
    committed = {name: set(lines) for name, lines in table_rows_by_heading(table, "## ").items()}
    quoted = table_rows_by_heading(results_section(readme), "### ")
    return [row for name, rows in quoted.items() for row in rows if row not in committed.get(name or "?", set())]


def test_every_table_row_of_the_readme_results_is_a_row_of_its_datasets_committed_table():
    assert misquoted((ROOT / "README.md").read_text(), TABLE.read_text()) == []


def test_a_changed_row_or_a_row_under_another_dataset_is_found():
    # The check above is not vacuous: a row with one digit changed is reported, and so is a true row of one
    # dataset quoted under another dataset's heading (FedSM has a row in every dataset's table).
    table = TABLE.read_text()
    sections = table_rows_by_heading(table, "## ")
    names = [name for name, rows in sections.items() if any(r.startswith("| FedAvg") for r in rows)]
    assert len(names) >= 2, "the committed table should hold at least two datasets"
    first, second = (next(r for r in sections[n] if r.startswith("| FedAvg")) for n in names[:2])
    changed = first.replace("0.", "1.", 1)
    readme = (f"intro\n## Results\n\n### {names[0]}\n\n{first}\n{changed}\n\n"
              f"### {names[1]}\n\n{first}\n{second}\n\n## Next\n")
    assert misquoted(readme, table) == [changed, first]
    assert misquoted(f"intro\n## Results\n\n{second}\n", table) == [second]  # a row under no dataset heading
