"""What a save through the contents API overwrote of recorded changes: the pure part. No I/O.

JupyterLab without real-time collaboration keeps its own copy of an open notebook; saving it (the
person's save, the autosave, the "Overwrite" of its File Changed dialog) writes that copy over the
file, and with it drops the cells an agent inserted and puts back the text an agent replaced. Such a
save is found by comparing, for each cell that recorded changes touched, the state the newest of them
left (:data:`AgentState`) with the file before the save and the notebook the save wrote: a cell is
overwritten when the file still had it as the change left it (its source; a deleted cell: absent) and
the save changed that (deleted the cell, changed its source, or brought a deleted cell back). Outputs
and metadata are not compared: JupyterLab rewrites them on every save.
"""

from __future__ import annotations

from typing import Any

from .changes import Digest, NotebookChange, diff, part_hash

# cell id -> (the id of the newest recorded change that touched it, the digest it left; None: deleted)
AgentState = dict[str, tuple[str, Digest | None]]


def agent_state(entries: list[tuple[str, list[dict[str, Any]]]]) -> AgentState:
    """The state recorded changes left each cell in, from ``entries`` newest first: (change id, the
    change's cell summaries with ``id`` and ``digest``)."""
    state: AgentState = {}
    for change_id, cells in entries:
        for cell in cells:
            cell_id = cell.get("id")
            if isinstance(cell_id, str) and cell_id not in state:
                left = cell.get("digest")
                state[cell_id] = (change_id, tuple(left) if left is not None else None)
    return state


def _sources(nb: dict[str, Any]) -> dict[str, str]:
    """Each cell's source hash by id."""
    found: dict[str, str] = {}
    for cell in nb.get("cells") or []:
        if isinstance(cell, dict) and isinstance(cell.get("id"), str):
            found[cell["id"]] = part_hash("source", {"source": cell["source"]} if "source" in cell else {})
    return found


def overwritten(
    state: AgentState, before: dict[str, Any], after: dict[str, Any]
) -> tuple[NotebookChange, list[str]] | None:
    """The change a save from ``before`` to ``after`` made to cells recorded changes left in the file
    (only those cells), and the ids of the changes it overwrote (oldest first); None when it overwrote
    nothing."""
    if not state:
        return None
    old, new = _sources(before), _sources(after)
    hit: dict[str, str] = {}  # cell id -> the change it overwrote
    for cell_id, (change_id, left) in state.items():
        if left is None:
            if cell_id not in old and cell_id in new:
                hit[cell_id] = change_id  # the change deleted it: the save brought it back
        elif old.get(cell_id) == left[0] and new.get(cell_id) != left[0]:
            hit[cell_id] = change_id  # the file had it as the change left it: the save deleted or edited it
    if not hit:
        return None
    change = diff(before, after)
    cells = [c for c in change.cells if c.id in hit and set(c.what) & {"edited", "inserted", "deleted"}]
    cells.sort(
        key=lambda c: c.index_before if c.index_before is not None else len(old) + (c.index_after or 0)
    )
    if not cells:
        return None
    # Only these cells are undone (put back as the file had them): the notebook's metadata, which a
    # JupyterLab save often rewrites, does not stop that.
    reason = change.not_undoable if change.not_undoable and "ids" in change.not_undoable else None
    ids = sorted({hit[c.id] for c in cells if c.id is not None}, key=int)
    return NotebookChange(cells, reason), ids


def summary(change: NotebookChange, overwrites: list[str]) -> str:
    """The ledger's summary of an overwrite, such as "save over change 26: cells agentcell (deleted),
    53b0 (edited)"."""
    which = f"change {overwrites[0]}" if len(overwrites) == 1 else f"changes {', '.join(overwrites)}"
    named = ", ".join(f"{c.id} ({_word(c.what)})" for c in change.cells)
    return f"save over {which}: cell{'s' if len(change.cells) != 1 else ''} {named}"


def _word(what: list[str]) -> str:
    for word in ("deleted", "inserted", "edited"):
        if word in what:
            return word
    return what[0] if what else "changed"
