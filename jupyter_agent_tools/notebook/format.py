"""Bytes <-> notebook dict, exactly as nbformat and JupyterLab write notebooks.

nbformat writes JSON with ``indent=1``, sorted keys, ``ensure_ascii=False`` and a trailing newline, with
multi-line strings split into lists of lines. A notebook saved by JupyterLab therefore round-trips through
:func:`parse_notebook` and :func:`serialize_notebook` byte for byte, and an edit of one cell changes only that
cell's lines.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import BadRequest


def split_source(content: str) -> list[str]:
    """Split text into notebook source lines.

    Every line but the last keeps its trailing ``\\n``; the last line gets no forced newline, and there is
    no empty trailing element (``"a\\nb\\n"`` -> ``["a\\n", "b\\n"]``, ``""`` -> ``[]``). Lines are split
    exactly as nbformat splits them (``str.splitlines(keepends=True)``), so the file is in the form
    JupyterLab would write too.
    """
    return content.splitlines(keepends=True)


def join_source(source: str | list[str]) -> str:
    """A cell's source (string or list of lines) as one string."""
    if isinstance(source, str):
        return source
    return "".join(source)


def content_hash(data: bytes) -> str:
    """The hash callers send back as ``expected_hash``: sha256 hex of the saved bytes."""
    return hashlib.sha256(data).hexdigest()


def source_hash(source: str) -> str:
    """A cell source's short hash (16 hex digits of its sha256), as an approval shows and checks it."""
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def cells_hash(notebook: dict[str, Any]) -> str:
    """A hash of a notebook's cells as an edit sees them (their order, ids, types and sources), not of its
    metadata or outputs: what an approved edit must still find."""
    cells = [
        (c.get("id"), c.get("cell_type"), join_source(c.get("source", "")))
        for c in notebook.get("cells") or []
    ]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()


def parse_notebook(text: str, path: str) -> dict[str, Any]:
    """Parse notebook text, checking only what the cell operations need (JSON object with a cells list)."""
    try:
        nb = json.loads(text)
    except ValueError as e:
        raise BadRequest(f"Invalid JSON in notebook: {path}: {e}") from None
    return _checked(nb, path)


def old_version(nb: Any) -> str | None:
    """``"3.0"`` for an nbformat 1-3 notebook (no cells array: worksheets), else None."""
    if not isinstance(nb, dict) or "cells" in nb:
        return None
    major = nb.get("nbformat")
    if not isinstance(major, int) or isinstance(major, bool) or not 1 <= major < 4:
        return None
    minor = nb.get("nbformat_minor", 0)
    return f"{major}.{minor if isinstance(minor, int) else 0}"


def parse_any_notebook(text: str, path: str, seed: str) -> tuple[dict[str, Any], str | None]:
    """Parse notebook text as :func:`parse_notebook` does, converting an nbformat 1-3 notebook to 4.5.

    Returns the notebook and the version it was converted from (None when it was not). The conversion is
    nbformat's (``nbformat.reads(text, as_version=4)``) in the form nbformat writes files, except that
    the new cell ids are derived from ``seed`` (the file's hash) instead of random: every read of the
    same file shows the same ids, and an edit with ``upgrade`` writes those ids.
    """
    try:
        nb = json.loads(text)
    except ValueError as e:
        raise BadRequest(f"Invalid JSON in notebook: {path}: {e}") from None
    version = old_version(nb)
    if version is None:
        return _checked(nb, path), None
    import nbformat
    from nbformat.v4.rwbase import split_lines, strip_transient

    from .validity import derive_cell_id

    try:
        converted = nbformat.reads(text, as_version=4)
    except Exception as e:
        # broad: nbformat's v3 converters raise whatever a malformed old notebook makes them (KeyError...)
        raise BadRequest(
            f"Cannot convert the nbformat {version} notebook {path} to nbformat 4: {e}"
        ) from None
    node = strip_transient(split_lines(converted))
    plain = json.loads(json.dumps(node))
    taken: set[str] = set()
    for index, cell in enumerate(plain.get("cells", [])):
        if isinstance(cell, dict) and "id" in cell:
            cell["id"] = derive_cell_id(seed, index, taken)
            taken.add(cell["id"])
    return _checked(plain, path), version


def _checked(nb: Any, path: str) -> dict[str, Any]:
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise BadRequest(f"Invalid notebook structure (missing cells array): {path}")
    if not all(isinstance(cell, dict) for cell in nb["cells"]):
        raise BadRequest(f"Invalid notebook structure (cells must be objects): {path}")
    for index, cell in enumerate(nb["cells"]):
        problem = _cell_problem(cell)
        if problem:
            raise BadRequest(f"Invalid notebook structure (cell {index}: {problem}): {path}")
    return nb


def _is_text(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def _cell_problem(cell: dict[str, Any]) -> str | None:
    """What is wrong with a cell's shape for the fields the operations and summaries read, if anything."""
    if not isinstance(cell.get("cell_type"), str):
        return "'cell_type' must be a string"
    if not _is_text(cell.get("source", "")):
        return "'source' must be a string or a list of strings"
    outputs = cell.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        return "'outputs' must be a list of objects"
    return None


def serialize_notebook(nb: dict[str, Any]) -> str:
    """Serialize as nbformat.writes does (indent 1, sorted keys, ensure_ascii False, trailing newline)."""
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
