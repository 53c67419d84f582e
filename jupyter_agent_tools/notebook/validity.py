"""What makes a notebook invalid as found, and nbformat's own repairs of it (pure: no I/O).

Real notebooks are often invalid before anyone edits them: nbformat 4.4 files whose cells carry an
``id`` (copied from 4.5 notebooks), 4.5 files with duplicate or missing ids, a missing ``nbformat_minor``,
metadata that the schema does not allow. Reads show them as they are; an edit refuses to write them
unless asked to repair, and then says what it repaired. Every repair is deterministic (a new id is
derived from the file's hash and the cell's position), so the same file and the same request always
give the same bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from nbformat.validator import ValidationError, better_validation_error, get_validator, normalize

from ..validation import short_repr

# Cell indexes named in one problem; the rest are counted.
SHOWN_INDEXES = 10
# Schema problems listed for one notebook.
SHOWN_PROBLEMS = 10


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def derive_cell_id(seed: str, position: int, taken: set[str]) -> str:
    """A cell id derived from ``seed`` (a notebook's hash) and ``position``, not in ``taken``."""
    attempt = 0
    while True:
        digest = hashlib.sha256(f"{seed}\0{position}\0{attempt}".encode()).hexdigest()[:8]
        if digest not in taken:
            return digest
        attempt += 1


def indexes(values: Iterable[int]) -> str:
    """``[1, 4, 9]`` -> ``"1, 4 and 9"`` (long lists cut)."""
    shown = [str(v) for v in values]
    more = len(shown) - SHOWN_INDEXES
    if more > 0:
        shown = [*shown[:SHOWN_INDEXES], f"{more} more"]
    if len(shown) == 1:
        return shown[0]
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def duplicate_ids(nb: dict[str, Any]) -> dict[str, list[int]]:
    """Cell ids that more than one cell carries, with those cells' indexes."""
    seen: dict[str, list[int]] = {}
    for index, cell in enumerate(nb.get("cells", [])):
        cell_id = cell.get("id") if isinstance(cell, dict) else None
        if isinstance(cell_id, str):
            seen.setdefault(cell_id, []).append(index)
    return {cell_id: where for cell_id, where in seen.items() if len(where) > 1}


def _id_problems(nb: dict[str, Any], minor: int) -> list[str]:
    cells = [c for c in nb.get("cells", []) if isinstance(c, dict)]
    if minor < 5:
        stray = [i for i, c in enumerate(cells) if "id" in c]
        if stray:
            return [
                f"{_cells(stray)} an 'id', which nbformat 4.{minor} does not allow (cell ids exist from 4.5)"
            ]
        return []
    problems = []
    missing = [i for i, c in enumerate(cells) if "id" not in c]
    if missing:
        problems.append(f"{_cells(missing)} no 'id' (nbformat 4.{minor} requires one)")
    for cell_id, where in duplicate_ids(nb).items():
        problems.append(f"cells {indexes(where)} share the id {short_repr(cell_id)}")
    return problems


def _cells(where: list[int]) -> str:
    return f"cell {where[0]} has" if len(where) == 1 else f"cells {indexes(where)} have"


def _where(path: Iterable[Any]) -> str:
    parts = list(path)
    if len(parts) >= 2 and parts[0] == "cells" and _int(parts[1]):
        place, rest = f"cell {parts[1]}", parts[2:]
    else:
        place, rest = "notebook", parts
    if rest:
        place += " " + "/".join(repr(p) if isinstance(p, str) else str(p) for p in rest)
    return place


def schema_problems(nb: dict[str, Any], minor: int, limit: int = SHOWN_PROBLEMS) -> list[str]:
    """What the nbformat 4.``minor`` schema finds wrong, each naming the cell and key (at most ``limit``).

    The fast validator decides; only an invalid notebook is walked again with jsonschema for messages.
    """
    fast = get_validator(version=4, version_minor=minor)
    if fast is None:
        return [f"nbformat 4.{minor} is not a version this server knows"]
    try:
        fast.validate(nb)
        return []
    except ValidationError:  # fastjsonschema and jsonschema raise different ValidationErrors
        pass
    detailed = get_validator(version=4, version_minor=minor, name="jsonschema")
    problems: list[str] = []
    for error in detailed.iter_errors(nb) if detailed is not None else []:
        better = better_validation_error(error, 4, minor)
        problems.append(f"{_where(better.absolute_path)}: {better.message}")
        if len(problems) >= limit:
            break
    return problems or ["the notebook does not match the nbformat schema"]


def notebook_problems(nb: dict[str, Any]) -> list[str]:
    """Everything that makes an nbformat 4 notebook invalid (nbformat's schema and its unique-id rule)."""
    minor = nb.get("nbformat_minor")
    if not isinstance(minor, int) or isinstance(minor, bool):
        return [
            "'nbformat_minor' is missing (an nbformat 4 notebook must name its minor version)"
            if minor is None
            else f"'nbformat_minor' must be an integer, got {short_repr(minor)}"
        ]
    problems = _id_problems(nb, minor)
    if problems:  # the schema would report the same problem again, less clearly
        return problems
    return schema_problems(nb, minor)


def repair_notebook(nb: dict[str, Any], seed: str) -> tuple[dict[str, Any], list[str]]:
    """``nb`` with nbformat's repairs applied, and one line per repair (``nb`` itself is not changed).

    - a missing ``nbformat_minor`` becomes 5 when every cell has an id, else 4;
    - in nbformat < 4.5, ids are removed from the cells that carry one;
    - in nbformat >= 4.5, a cell without an id, or with the id of an earlier cell, gets a new id derived
      from ``seed`` (the first cell with an id keeps it);
    - then ``nbformat.validator.normalize(..., strip_invalid_metadata=True)`` removes metadata keys that
      the schema does not allow.
    """
    repairs: list[str] = []
    new = dict(nb)
    cells = list(nb.get("cells", []))
    new["cells"] = cells
    minor = new.get("nbformat_minor")
    if not isinstance(minor, int) or isinstance(minor, bool):
        minor = 5 if cells and all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cells) else 4
        repairs.append(f"set 'nbformat_minor' to {minor} (it was {short_repr(nb.get('nbformat_minor'))})")
        new["nbformat_minor"] = minor
    if minor < 5:
        for index, cell in enumerate(cells):
            if isinstance(cell, dict) and "id" in cell:
                cells[index] = {k: v for k, v in cell.items() if k != "id"}
                removed = short_repr(cell["id"])
                repairs.append(f"cell {index}: removed 'id' {removed} (not allowed in 4.{minor})")
    else:
        taken = {c["id"] for c in cells if isinstance(c, dict) and isinstance(c.get("id"), str)}
        seen: dict[str, int] = {}
        for index, cell in enumerate(cells):
            if not isinstance(cell, dict):
                continue
            cell_id = cell.get("id")
            if isinstance(cell_id, str) and cell_id not in seen:
                seen[cell_id] = index
                continue
            fresh = derive_cell_id(seed, index, taken)
            taken.add(fresh)
            cells[index] = {**cell, "id": fresh}
            if isinstance(cell_id, str):
                why = f"its id {short_repr(cell_id)} was also cell {seen[cell_id]}'s"
            else:
                why = "it had none"
            repairs.append(f"cell {index}: new id {short_repr(fresh)} ({why})")
    if schema_problems(new, minor, limit=1):
        repairs += _normalize(new, minor)
    return new, repairs


def _normalize(nb: dict[str, Any], minor: int) -> list[str]:
    """nbformat's metadata normalization, in place on copies of what it changes; what it removed."""
    _, work = normalize(nb, 4, minor, strip_invalid_metadata=True)  # works on a copy
    repairs = []
    removed = sorted(set(nb.get("metadata") or {}) - set(work.get("metadata") or {}))
    if removed:
        nb["metadata"] = work["metadata"]
        repairs.append(f"notebook: removed metadata {', '.join(map(repr, removed))} (not allowed there)")
    for index, (cell, fixed) in enumerate(zip(nb["cells"], work["cells"], strict=True)):
        if not isinstance(cell, dict) or cell == fixed:
            continue
        removed = sorted(set(cell.get("metadata") or {}) - set(fixed.get("metadata") or {}))
        nb["cells"][index] = fixed
        repairs.append(f"cell {index}: removed metadata {', '.join(map(repr, removed))} (not allowed there)")
    return repairs
