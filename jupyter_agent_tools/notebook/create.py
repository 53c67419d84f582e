"""A new notebook, as JupyterLab makes one: pure (no I/O).

nbformat 4.5 in nbformat's own layout, the kernelspec in its metadata (name, display name, language, as
the kernelspec manager describes it), and cells whose ids are derived from the path, so the same request
gives the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BadRequest
from ..validation import check
from .format import content_hash, split_source
from .validity import derive_cell_id


@dataclass(frozen=True)
class CreateRequest:
    """A parsed ``{"action": "create", ...}`` body."""

    cells: list[tuple[str, str]]  # (cell_type, source)
    kernel_name: str | None = None
    parents: bool = False


def parse_create_request(body: Any, max_cells: int = 1000) -> CreateRequest:
    """Validate a create body against ``NotebookCreateRequest`` (the published schema)."""
    cells = body.get("cells") if isinstance(body, dict) else None
    if isinstance(cells, list) and len(cells) > max_cells:  # counted before the schema check
        raise BadRequest(f"'cells' has {len(cells)} cells; at most {max_cells} are allowed")
    check("NotebookCreateRequest", body)
    return CreateRequest(
        cells=[(c.get("cell_type", "code"), c["source"]) for c in body.get("cells", [])],
        kernel_name=body.get("kernel_name"),
        parents=bool(body.get("parents", False)),
    )


def new_notebook(path: str, cells: list[tuple[str, str]], kernelspec: dict[str, str]) -> dict[str, Any]:
    """The notebook dict: ``kernelspec`` is ``{name, display_name, language}``."""
    seed = content_hash(f"create\0{path}".encode())
    ids: set[str] = set()
    out: list[dict[str, Any]] = []
    for position, (cell_type, source) in enumerate(cells):
        cell_id = derive_cell_id(seed, position, ids)
        ids.add(cell_id)
        cell: dict[str, Any] = {"cell_type": cell_type, "id": cell_id, "metadata": {}}
        cell["source"] = split_source(source)
        if cell_type == "code":
            cell["execution_count"] = None
            cell["outputs"] = []
        out.append(cell)
    metadata: dict[str, Any] = {"kernelspec": dict(kernelspec)}
    if kernelspec.get("language"):
        metadata["language_info"] = {"name": kernelspec["language"]}
    return {"cells": out, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}
