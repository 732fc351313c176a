"""The README's Results quote the committed study: every table row there is a row of its table.md."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "experiments" / "results" / "reference" / "table.md"


def results_section(readme: str) -> str:
    """The README's ``## Results`` section, up to the next ``## `` heading."""
    start = readme.index("\n## Results\n")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end != -1 else None]


def test_every_table_row_of_the_readme_results_is_a_row_of_the_committed_table():
    quoted = [line for line in results_section((ROOT / "README.md").read_text()).splitlines()
              if line.startswith("| ") and not line.startswith("|---")]
    committed = set(TABLE.read_text().splitlines())
    assert [line for line in quoted if line not in committed] == []


def test_a_row_that_differs_from_the_table_is_found():
    # The check above is not vacuous: a row with one digit changed is reported.
    row = next(line for line in TABLE.read_text().splitlines() if line.startswith("| FedAvg"))
    changed = row.replace("0.", "1.", 1)
    readme = f"intro\n## Results\n\n{row}\n{changed}\n\n## Next\n"
    quoted = [line for line in results_section(readme).splitlines() if line.startswith("| ")]
    assert [line for line in quoted if line not in set(TABLE.read_text().splitlines())] == [changed]
