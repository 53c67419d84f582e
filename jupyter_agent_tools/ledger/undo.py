"""Undoing a recorded change: check that the cells it touched are as it left them, then put back what
they were before it. Pure: no I/O.

An undo touches only the cells of the change: a cell it inserted is removed, a deleted one is put back
after the cell that preceded it, a moved one goes back to that place, and the parts of a changed cell
(source, metadata, outputs, type) that the change changed get their old values. Cells changed since by
anyone else (a person in JupyterLab, another agent, a later change) make it a conflict, naming each cell
and what changed; nothing is written then.

One change since is not a conflict: new outputs (and execution count) of a cell, from a run, when the
change did not set the outputs itself ("edit, then run"). When the change set the cell's source or type,
those outputs came from the code being undone, so the undo clears them (a cell it inserted goes with
them); otherwise (a move, a metadata edit) it keeps them. Outputs changed since a change that set them (a
run, a clear) still conflict: the undo would put the older outputs back over them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .changes import PARTS, CellChange, cell_from_parts, cell_parts, digest

PART_WORDS = {"source": "source", "metadata": "metadata", "outputs": "outputs", "other": "cell type"}


@dataclass(frozen=True)
class CellConflict:
    """A cell an undo would touch that changed since the change: its id and what changed."""

    id: str | None
    what: str

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "what": self.what}


@dataclass(frozen=True)
class UndoCheck:
    """Whether a change can be undone on a notebook: the conflicts (none: it can), and the ids of the
    cells whose outputs changed since and will be cleared (they came from the source being undone)."""

    conflicts: list[CellConflict]
    outputs_cleared: list[str]


def check_undo(cells: list[CellChange], nb: dict[str, Any]) -> UndoCheck:
    """The cells of a change that are not, in ``nb``, as the change left them, and the ones whose only
    change since is new outputs from the code the change wrote."""
    current = {c.get("id"): c for c in nb.get("cells") or [] if isinstance(c, dict)}
    found: list[CellConflict] = []
    cleared: list[str] = []
    for change in cells:
        cell = current.get(change.id)
        if change.digest is None:  # the change deleted it
            if cell is not None:
                found.append(CellConflict(change.id, "a cell with this id was added again since"))
            continue
        if cell is None:
            found.append(CellConflict(change.id, "it was deleted since"))
            continue
        now = digest(cell)
        changed = [name for name, a, b in zip(PARTS, change.digest, now, strict=True) if a != b]
        if changed == ["outputs"] and (_wrote_code(change) or "outputs" not in change.before):
            if _wrote_code(change) and "inserted" not in change.what and change.id is not None:
                cleared.append(change.id)
            continue
        if changed:
            words = " and ".join(PART_WORDS[name] for name in changed)
            found.append(CellConflict(change.id, f"its {words} changed since"))
    return UndoCheck(found, cleared)


def conflicts(cells: list[CellChange], nb: dict[str, Any]) -> list[CellConflict]:
    """The cells of a change that are not, in ``nb``, as the change left them (see :func:`check_undo`)."""
    return check_undo(cells, nb).conflicts


def _wrote_code(change: CellChange) -> bool:
    """Whether the change inserted the cell or set its source or type: what a later run's outputs show."""
    return "inserted" in change.what or "source" in change.before or "other" in change.before


def inverse(
    cells: list[CellChange], nb: dict[str, Any], outputs_cleared: Collection[str] = ()
) -> dict[str, Any]:
    """``nb`` with ``cells`` (a change's cells, all with ids, checked by :func:`check_undo`) undone; the cells
    ``outputs_cleared`` names (from :func:`check_undo`) lose their outputs."""
    inserted = {c.id for c in cells if "inserted" in c.what}
    replaced: dict[str, CellChange] = {
        c.id: c for c in cells if c.id is not None and "inserted" not in c.what and "deleted" not in c.what
    }
    back = sorted(
        (c for c in cells if "deleted" in c.what or "moved" in c.what),
        key=lambda c: c.index_before if c.index_before is not None else 0,
    )
    going_back = {c.id for c in back}
    work: list[dict[str, Any]] = []
    taken: dict[str | None, dict[str, Any]] = {}
    for cell in nb.get("cells") or []:
        cell_id = cell.get("id")
        if cell_id in inserted:
            continue
        change = replaced.get(cell_id)
        if change is not None and change.before:
            parts = cell_parts(cell)
            parts.update(change.before)
            if cell_id in outputs_cleared:
                parts["outputs"] = _no_outputs(parts)
            cell = cell_from_parts(cell_id, parts)
        if cell_id in going_back:
            taken[cell_id] = cell
            continue
        work.append(cell)
    for change in back:
        cell = taken.get(change.id)
        if cell is None:  # deleted by the change: made again from its parts
            cell = cell_from_parts(change.id, {name: change.before.get(name, {}) for name in PARTS})
        position = _position(work, change)
        work.insert(position, cell)
    return {**nb, "cells": work}


def _position(work: list[dict[str, Any]], change: CellChange) -> int:
    """Where a deleted or moved cell goes back: after the cell that preceded it, else its old index."""
    if change.prev is None:
        return 0
    for i, cell in enumerate(work):
        if cell.get("id") == change.prev:
            return i + 1
    return min(change.index_before or 0, len(work))


def _no_outputs(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A cell's outputs part, cleared: a code cell keeps the keys (nbformat requires them), others none."""
    return {"outputs": [], "execution_count": None} if parts["other"].get("cell_type") == "code" else {}
