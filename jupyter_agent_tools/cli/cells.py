"""What the command line names: code cells from files (``# %%`` splitting) and notebook cells."""

from __future__ import annotations

import re
from dataclasses import dataclass

# A cell marker of the percent format (VS Code, Spyder, PyCharm, jupytext): "# %%", "#%%", "# %% title".
MARKER = re.compile(r"^#\s?%%(?!%)(.*)$")
# jupytext's "# %% [markdown]" / "# %% [md]" cells are text, not code: they are not run.
TEXT_CELL = re.compile(r"^\[(markdown|md|raw)\]", re.IGNORECASE)
ID_PREFIX = "id:"


class UsageError(Exception):
    """The command line asks for something impossible (exit code 2)."""


@dataclass(frozen=True)
class CodeCell:
    code: str
    title: str | None = None

    def as_json(self) -> dict[str, str | None]:
        return {"code": self.code, "title": self.title} if self.title else {"code": self.code}


def _trim_blank_lines(lines: list[str]) -> str:
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def split_cells(text: str) -> list[CodeCell]:
    """Split Python source into cells at ``# %%`` lines; the rest of a marker line is the cell's title.

    Code before the first marker is an untitled cell; cells with only blank lines are dropped, and so are
    ``# %% [markdown]`` cells. A file without markers is one cell.
    """
    cells: list[CodeCell] = []
    title: str | None = None
    text_cell = False
    lines: list[str] = []

    def close() -> None:
        code = _trim_blank_lines(lines)
        if code and not text_cell:
            cells.append(CodeCell(code, title))

    for line in text.splitlines():
        marker = MARKER.match(line)
        if marker is None:
            lines.append(line)
            continue
        close()
        lines = []
        title = marker.group(1).strip() or None
        text_cell = bool(title and TEXT_CELL.match(title))
    close()
    return cells


@dataclass(frozen=True)
class CellRef:
    """A notebook cell named on the command line: by index or by id."""

    index: int | None = None
    id: str | None = None

    def as_fields(self) -> dict[str, int | str]:
        return {"cell_index": self.index} if self.index is not None else {"cell_id": str(self.id)}

    def __str__(self) -> str:
        return str(self.index) if self.index is not None else f"id {self.id}"


def parse_cell_ref(value: str) -> CellRef:
    """``3`` is an index; anything else a cell id; ``id:123`` forces an id made of digits only."""
    if value.startswith(ID_PREFIX):
        ident = value[len(ID_PREFIX) :]
        if not ident:
            raise UsageError("--cell id: needs an id after 'id:'")
        return CellRef(id=ident)
    if re.fullmatch(r"[0-9]+", value):
        return CellRef(index=int(value))
    if not value:
        raise UsageError("--cell needs an index or a cell id")
    return CellRef(id=value)
