"""What one change did to a notebook, cell by cell: the pure part of the change ledger.

A cell is seen as four parts, each a dict of some of its keys: ``source``, ``metadata``, ``outputs``
(``outputs`` and ``execution_count``) and ``other`` (the type, attachments, anything else; never the id).
A change lists the cells it touched (by id) with what happened to each (``edited``, ``inserted``,
``deleted``, ``moved``, ``outputs``), the parts that changed before and after, and a short hash of each
part of the cell as the change left it (what an undo checks the cell against).

The cell operations keep the cells they do not touch as the very same objects, so finding what changed
costs one identity check per untouched cell; only touched cells are compared and hashed. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from ..notebook.format import join_source
from ..sequences import longest_increasing

PARTS = ("source", "metadata", "outputs", "other")
OUTPUT_KEYS = ("outputs", "execution_count")
KINDS = ("edited", "inserted", "deleted", "moved", "outputs")
# One short hash per part (8 bytes each, hex): enough to tell versions of one cell apart.
Digest = tuple[str, str, str, str]


def _hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def dumps(value: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, no spaces): equal values give equal bytes."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def cell_parts(cell: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The four parts of a cell (each a dict of the cell's keys it has)."""
    parts: dict[str, dict[str, Any]] = {name: {} for name in PARTS}
    for key, value in cell.items():
        if key == "id":
            continue
        if key == "source":
            parts["source"][key] = value
        elif key == "metadata":
            parts["metadata"][key] = value
        elif key in OUTPUT_KEYS:
            parts["outputs"][key] = value
        else:
            parts["other"][key] = value
    return parts


def part_hash(name: str, part: dict[str, Any]) -> str:
    """The hash of one part; a source is hashed as its text (a list of lines and one string are equal)."""
    if name == "source":
        if "source" not in part:
            return _hash(b"\x00")
        return _hash(join_source(part["source"]).encode("utf-8", "surrogatepass"))
    return _hash(dumps(part))


def digest(cell: dict[str, Any]) -> Digest:
    """The hash of each part of a cell, in :data:`PARTS` order."""
    parts = cell_parts(cell)
    return (
        part_hash("source", parts["source"]),
        part_hash("metadata", parts["metadata"]),
        part_hash("outputs", parts["outputs"]),
        part_hash("other", parts["other"]),
    )


def same_part(name: str, a: dict[str, Any], b: dict[str, Any]) -> bool:
    if name == "source":
        return ("source" in a) == ("source" in b) and join_source(a.get("source", "")) == join_source(
            b.get("source", "")
        )
    return a == b


def cell_from_parts(cell_id: str | None, parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A cell made of its parts (and its id)."""
    cell: dict[str, Any] = {}
    for name in PARTS:
        cell.update(parts.get(name) or {})
    if cell_id is not None:
        cell["id"] = cell_id
    return cell


@dataclass
class CellChange:
    """What one change did to one cell.

    ``before`` and ``after`` hold the parts that changed (every part of a deleted or inserted cell);
    ``prev`` is the id of the cell before it in the old notebook (where an undo puts a deleted or moved
    cell back); ``digest`` is the hash of each part of the cell as the change left it (None: deleted).
    """

    id: str | None
    what: list[str]
    index_before: int | None
    index_after: int | None
    prev: str | None = None
    before: dict[str, dict[str, Any]] = field(default_factory=dict)
    after: dict[str, dict[str, Any]] = field(default_factory=dict)
    digest: Digest | None = None

    def summary(self) -> dict[str, Any]:
        """The cell as a listing shows it (no bodies)."""
        return {
            "id": self.id,
            "what": list(self.what),
            "index_before": self.index_before,
            "index_after": self.index_after,
        }


@dataclass
class NotebookChange:
    """Every cell one change touched, in the order of the new notebook (deleted cells last), and
    whether it can be undone (``undoable`` None) or why not."""

    cells: list[CellChange]
    not_undoable: str | None = None


def _object_keys(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> tuple[dict[Any, int], list[Any]]:
    """Keys pairing cells without ids: the same object, or a copy of it (the cell operations and runs
    change a cell in a shallow copy, which keeps the very same metadata dict)."""
    old_keys: dict[Any, int] = {}
    by_metadata: dict[int, int] = {}
    for i, cell in enumerate(old):
        old_keys[("cell", id(cell))] = i
        by_metadata.setdefault(id(cell.get("metadata")), i)
    taken: set[int] = set()
    new_keys: list[Any] = []
    for j, cell in enumerate(new):
        found = old_keys.get(("cell", id(cell)))
        if (found is None or found in taken) and isinstance(cell.get("metadata"), dict):
            found = by_metadata.get(id(cell["metadata"]))
        if found is None or found in taken:
            new_keys.append(("new", j))
            continue
        taken.add(found)
        new_keys.append(("cell", id(old[found])))
    return old_keys, new_keys


def _outside_cells(nb: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in nb.items() if k != "cells"}


def _cell_id(cell: dict[str, Any]) -> str | None:
    value = cell.get("id")
    return value if isinstance(value, str) else None


def _unique_strings(ids: list[Any]) -> bool:
    return all(type(i) is str for i in ids) and len(set(ids)) == len(ids)


def _touched(
    old: list[dict[str, Any]], i: int, cell: dict[str, Any], j: int, moved: bool
) -> CellChange | None:
    """What happened to cell ``old[i]``, now ``cell`` at ``j`` (None: nothing)."""
    was = old[i]
    what: list[str] = []
    before_parts: dict[str, dict[str, Any]] = {}
    after_parts: dict[str, dict[str, Any]] = {}
    if was is not cell:
        old_parts, new_parts = cell_parts(was), cell_parts(cell)
        for name in PARTS:
            if not same_part(name, old_parts[name], new_parts[name]):
                before_parts[name], after_parts[name] = old_parts[name], new_parts[name]
        if before_parts.keys() - {"outputs"}:
            what.append("edited")
        if "outputs" in before_parts:
            what.append("outputs")
    if moved:
        what.append("moved")
    if not what:
        return None
    prev = _cell_id(old[i - 1]) if moved and i > 0 else None
    return CellChange(_cell_id(cell), what, i, j, prev, before_parts, after_parts, digest(cell))


def diff(before: dict[str, Any], after: dict[str, Any]) -> NotebookChange:
    """The cells a change touched, from the notebook before it and after it.

    Cells are paired by id (by object when the notebook has no unique ids: the cell operations keep
    untouched cells as the same objects). A notebook without unique cell ids, or a change of more than
    cells (nbformat version, notebook metadata), is recorded but cannot be undone.
    """
    old: list[dict[str, Any]] = before.get("cells") or []
    new: list[dict[str, Any]] = after.get("cells") or []
    old_ids, new_ids = [c.get("id") for c in old], [c.get("id") for c in new]
    unique = _unique_strings(old_ids) and _unique_strings(new_ids)
    not_undoable = None
    if not unique:
        not_undoable = "the notebook's cells have no ids, or share them (cell ids came with nbformat 4.5)"
    elif _outside_cells(before) != _outside_cells(after):
        not_undoable = "it changed more than cells (the nbformat version or the notebook's metadata)"
    if unique and old_ids == new_ids:
        # The same cells in the same order (an edit, a run's outputs): only a cell that is not the very
        # same object can have changed. No pairing, no move detection: O(cells) identity checks.
        same_order = [_touched(old, k, cell, k, False) for k, cell in enumerate(new) if old[k] is not cell]
        return NotebookChange([c for c in same_order if c is not None], not_undoable)

    if unique:
        old_keys: dict[Any, int] = {cell_id: i for i, cell_id in enumerate(old_ids)}
        new_keys: list[Any] = new_ids
    else:
        old_keys, new_keys = _object_keys(old, new)
    pairs: list[tuple[int, int]] = []  # (old position, new position) of cells in both
    for j, key in enumerate(new_keys):
        i = old_keys.get(key)
        if i is not None:
            pairs.append((i, j))
    order = [i for i, _ in pairs]
    if all(a < b for a, b in itertools.pairwise(order)):
        moved_old: set[int] = set()
    else:
        kept = longest_increasing(order)
        moved_old = {pairs[k][0] for k in range(len(pairs)) if k not in kept}
    matched_new = {j: i for i, j in pairs}

    changes: list[CellChange] = []
    for j, cell in enumerate(new):
        i = matched_new.get(j)
        if i is None:
            changes.append(
                CellChange(_cell_id(cell), ["inserted"], None, j, after=cell_parts(cell), digest=digest(cell))
            )
            continue
        touched = _touched(old, i, cell, j, i in moved_old)
        if touched is not None:
            changes.append(touched)
    matched_old = set(order)
    for i, cell in enumerate(old):
        if i not in matched_old:
            prev = _cell_id(old[i - 1]) if i > 0 else None
            changes.append(CellChange(_cell_id(cell), ["deleted"], i, None, prev, before=cell_parts(cell)))
    return NotebookChange(changes, not_undoable)


def merge(first: NotebookChange, later: NotebookChange) -> NotebookChange:
    """One change that did what ``first`` and then ``later`` did (the writes of one notebook run).

    Per cell and part: the value before ``first`` touched it and the value ``later`` left; a cell
    inserted and then deleted disappears; positions are those of the first and the last change.
    """
    by_key: dict[Any, CellChange] = {}
    order: list[Any] = []

    def key(change: CellChange) -> Any:
        return change.id if change.id is not None else ("index", change.index_before, change.index_after)

    for change in first.cells:
        k = key(change)
        by_key[k] = change
        order.append(k)
    for change in later.cells:
        k = key(change)
        earlier = by_key.get(k)
        if earlier is None:
            by_key[k] = change
            order.append(k)
            continue
        before = dict(earlier.before)
        for name, part in change.before.items():
            before.setdefault(name, part)
        after = dict(earlier.after)
        after.update(change.after)
        if "inserted" in earlier.what and "deleted" in change.what:
            del by_key[k]
            order.remove(k)
            continue
        what = [w for w in KINDS if w in earlier.what or w in change.what]
        if "inserted" in what:
            what = ["inserted"]
            before = {}
        elif "deleted" in what:
            what = ["deleted"]
            after = {}
        by_key[k] = CellChange(
            earlier.id,
            what,
            earlier.index_before,
            change.index_after,
            earlier.prev if earlier.index_before is not None else change.prev,
            before,
            after,
            change.digest,
        )
    return NotebookChange([by_key[k] for k in order], first.not_undoable or later.not_undoable)


def summarize(change: NotebookChange, kind: str = "edit") -> str:
    """A short summary of a change, such as "edit 2 cells, insert 1" or "run: outputs of 3 cells"."""
    counts = {w: 0 for w in KINDS}
    for cell in change.cells:
        for w in cell.what:
            counts[w] += 1
    words = {
        "edited": "edit",
        "inserted": "insert",
        "deleted": "delete",
        "moved": "move",
        "outputs": "outputs of",
    }
    pieces: list[str] = []
    for w in KINDS:
        n = counts[w]
        if n:
            pieces.append(f"{words[w]} {n} cell{'s' if n != 1 else ''}" if not pieces else f"{words[w]} {n}")
    text = ", ".join(pieces) or "no cell changed"
    return text if kind == "edit" else f"{kind}: {text}"


def encode_change(change: NotebookChange) -> bytes:
    """``change`` as JSON bytes, bodies inline (a part of an unfinished group, see the ledger)."""
    return dumps(
        {
            "not_undoable": change.not_undoable,
            "cells": [
                {
                    "id": c.id,
                    "what": c.what,
                    "index_before": c.index_before,
                    "index_after": c.index_after,
                    "prev": c.prev,
                    "before": c.before,
                    "after": c.after,
                    "digest": list(c.digest) if c.digest is not None else None,
                }
                for c in change.cells
            ],
        }
    )


def decode_change(data: bytes) -> NotebookChange:
    """The change :func:`encode_change` encoded."""
    found = json.loads(data)
    cells = [
        CellChange(
            c["id"],
            list(c["what"]),
            c["index_before"],
            c["index_after"],
            c["prev"],
            c["before"],
            c["after"],
            tuple(c["digest"]) if c["digest"] is not None else None,
        )
        for c in found["cells"]
    ]
    return NotebookChange(cells, found["not_undoable"])
