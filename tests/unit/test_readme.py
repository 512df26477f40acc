"""The README's and docs' markdown tables render as tables: a header row, a separator row
(`|---|`), then rows of the header's width, with no blank line inside. A blank line ends a
table, and the rows after it render as a paragraph of pipes, which a reader of the source
does not see. Code fences are skipped, and so is a paragraph's line that starts with a
pipe (`|d|^2`). The pages under docs/results/ that `asgd bench` and `asgd report` write
are checked too.
"""
from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
SEPARATOR_CELL = re.compile(r"\s*:?-+:?\s*")


def cells(line: str) -> list[str]:
    """A row's cells: split on the pipes that are not escaped, the outer ones dropped."""
    inner = line.strip().removeprefix("|")
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return re.split(r"(?<!\\)\|", inner)


def blocks(text: str) -> list[tuple[int, list[str], str]]:
    """(first line number, lines, the line before) of each run of consecutive `|` lines
    outside code fences."""
    found, fenced = [], False
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|"):
            if found and found[-1][0] + len(found[-1][1]) == number:
                found[-1][1].append(line)
            else:
                found.append((number, [line], lines[number - 2] if number > 1 else ""))
    return found


def problems(text: str) -> list[str]:
    """One line per broken table: `line N: what`."""
    out, end = [], None  # end: the line after the last table
    for start, rows, before in blocks(text):
        headed = len(rows) > 1 and all(SEPARATOR_CELL.fullmatch(c) for c in cells(rows[1]))
        if not headed and not before.strip() and end == start - 1:
            out.append(f"line {start}: a row after a blank line: the blank line at line {start - 1} "
                       "ends the table above, and these rows render as text")
        elif before.strip() and not headed:
            continue  # a paragraph's line that starts with a pipe (|x|^2), not a table
        elif not headed:
            out.append(f"line {start}: rows without a header row and a separator row (|---|) under it")
        else:
            width = len(cells(rows[0]))
            out += [f"line {start + i}: {len(cells(row))} cells, the header has {width}"
                    for i, row in enumerate(rows) if len(cells(row)) != width]
        end = start + len(rows)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_tables_render(page):
    found = problems(page.read_text(encoding="utf-8"))
    assert not found, "\n" + "\n".join(f"{page.relative_to(ROOT)}: {p}" for p in found)


def test_the_checker_finds_each_break():
    text = "\n".join([
        "| a | b |", "|---|:-:|", "| 1 | 2 |", "| 1 | 2 | 3 |", "",   # lines 1-5: a row too wide
        "| 4 | 5 |", "",                                               # 6: after a blank line
        "```", "| not | a table |", "```", "",                         # 8-11: a fence, skipped
        "| x | y |", "| z | w |", "",                                  # 12: no separator
        "text", "", "| c | `d\\|e` |", "| - | --- |", "| 1 | 2 |",     # 17: a table, an escaped pipe
        "", "a paragraph", "|x|^2 in its text", "",                    # 21-23: not a table
        "| e |", "|---|", "| 3 |",                                     # 25: a second table, its own header
    ])
    assert problems(text) == [
        "line 4: 3 cells, the header has 2",
        "line 6: a row after a blank line: the blank line at line 5 ends the table above, "
        "and these rows render as text",
        "line 12: rows without a header row and a separator row (|---|) under it",
    ]


DATED = re.compile(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]|that (morning|evening)|an hour befor[e]")  # not matching itself


def test_the_readme_is_a_front_door():
    """At most 200 lines, the user's own model within the first 60, and no dated
    measurement in it or in any module: figures live in docs/ pages."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    assert any(line.startswith("## Your model") for line in lines[:60])
    modules = [p for top in ("rundir", "paramserver", "clients", "experiments", "plots", "scripts", "examples", "tests")
               for p in (ROOT / top).rglob("*.py")]
    dated = [f"{path.relative_to(ROOT)}:{number}" for path in [ROOT / "README.md", *modules]
             for number, line in enumerate(path.read_text().splitlines(), 1) if DATED.search(line)]
    assert dated == []
