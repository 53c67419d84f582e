"""Pure cell operations on a notebook dict: parse a request, apply edit/insert/delete/move.

Nothing here does I/O or knows about Tornado or jupyter_server. Operations never mutate the notebook they
are given: :func:`apply_ops` returns a new notebook whose untouched cells are the very same objects, so a
batch that fails half-way leaves nothing changed, and untouched cells serialize to the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import BadRequest
from ..schemas import notebook_request_schema
from ..validation import check, short_repr
from .format import join_source, split_source
from .validity import derive_cell_id, indexes

# Matches a failed replace lists (the message and the error's ``matches``).
MAX_LISTED_MATCHES = 20


@dataclass(frozen=True)
class CellOp:
    """One operation on one cell, as the caller sent it (validated for types, not against a notebook)."""

    action: str
    cell_index: int | None = None
    cell_id: str | None = None
    content: str | None = None
    cell_type: str | None = None
    to_index: int | None = None
    all: bool = False
    old: str | None = None  # replace: the exact text to find
    new: str | None = None  # replace: what it becomes


@dataclass(frozen=True)
class EditRequest:
    """A parsed POST body: one or more operations applied atomically, optionally guarded by a hash."""

    ops: list[CellOp]
    expected_hash: str | None = None
    batch: bool = False
    upgrade: bool = False  # write an nbformat 3 (or older) notebook converted to nbformat 4
    repair: bool = False  # apply nbformat's repairs to a notebook that is invalid as found


@dataclass
class OpOutcome:
    """What one operation did: a one-line message and the structured details."""

    message: str
    details: dict[str, Any]


@dataclass
class EditOutcome:
    """The edited notebook and what each operation did."""

    notebook: dict[str, Any]
    outcomes: list[OpOutcome] = field(default_factory=list)

    @property
    def message(self) -> str:
        if len(self.outcomes) == 1:
            return self.outcomes[0].message
        total = len(self.notebook["cells"])
        return f"Applied {len(self.outcomes)} operations. Notebook now has {_cells(total)}."


def _cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def _op_from(raw: dict[str, Any]) -> CellOp:
    return CellOp(
        action=raw["action"],
        cell_index=raw.get("cell_index"),
        cell_id=raw.get("cell_id"),
        content=raw.get("content"),
        cell_type=raw.get("cell_type"),
        to_index=raw.get("to_index"),
        all=bool(raw.get("all", False)),
        old=raw.get("old"),
        new=raw.get("new"),
    )


def parse_edit_request(body: Any, max_ops: int = 1000) -> EditRequest:
    """Validate a POST body (one operation, or ``{"ops": [...]}``) and return the operations.

    The body's shape is checked against the published schema (``NotebookChangeRequest`` of the OpenAPI
    document: one source of truth), which also says which fields each action takes and needs; what
    depends on the server's configuration (``max_ops``) is checked here, first.
    """
    # Counted before the schema check: validating each of 200,000 operations takes tens of seconds.
    raw_ops = body.get("ops") if isinstance(body, dict) else None
    if isinstance(raw_ops, list) and len(raw_ops) > max_ops:
        raise BadRequest(f"'ops' has {len(raw_ops)} operations; at most {max_ops} are allowed")
    check(notebook_request_schema(body), body)
    flags = {
        "expected_hash": body.get("expected_hash"),
        "upgrade": bool(body.get("upgrade", False)),
        "repair": bool(body.get("repair", False)),
    }
    if "ops" in body:
        return EditRequest(ops=[_op_from(raw) for raw in body["ops"]], batch=True, **flags)
    return EditRequest(ops=[_op_from(body)], batch=False, **flags)


def has_cell_ids(nb: dict[str, Any]) -> bool:
    """Whether this notebook's format carries cell ids (nbformat >= 4.5)."""
    minor = nb.get("nbformat_minor")
    return nb.get("nbformat") == 4 and isinstance(minor, int) and not isinstance(minor, bool) and minor >= 5


def check_supported(nb: dict[str, Any], path: str) -> None:
    """Refuse notebooks whose format the cell operations do not understand."""
    if nb.get("nbformat") != 4:
        raise BadRequest(
            f"Unsupported notebook format in {path}: nbformat {nb.get('nbformat')!r} "
            "(only nbformat 4 is supported; open and save it in JupyterLab to upgrade it)"
        )


def _new_cell(cell_type: str, content: str, cell_id: str | None) -> dict[str, Any]:
    cell: dict[str, Any] = {"cell_type": cell_type, "metadata": {}, "source": split_source(content)}
    if cell_type == "code":
        cell["execution_count"] = None
        cell["outputs"] = []
    if cell_id is not None:
        cell["id"] = cell_id
    return cell


def _convert(cell: dict[str, Any], cell_type: str) -> dict[str, Any]:
    """A copy of ``cell`` as ``cell_type``: code cells gain outputs, others lose them."""
    new = dict(cell)
    new["cell_type"] = cell_type
    if cell_type == "code":
        new.pop("attachments", None)
        new.setdefault("execution_count", None)
        new.setdefault("outputs", [])
        if cell.get("cell_type") != "code":
            new["execution_count"] = None
            new["outputs"] = []
    else:
        new.pop("outputs", None)
        new.pop("execution_count", None)
    return new


class _Editor:
    """Applies operations one after another to a copy-on-write list of cells."""

    def __init__(self, nb: dict[str, Any], id_seed: str):
        self.nb = dict(nb)
        self.cells: list[dict[str, Any]] = list(nb["cells"])
        self.nb["cells"] = self.cells
        self.with_ids = has_cell_ids(nb)
        self.id_seed = id_seed
        self.ids: set[str] = {c["id"] for c in self.cells if isinstance(c.get("id"), str)}

    def _locate(self, op: CellOp) -> int:
        n = len(self.cells)
        if op.cell_id is not None:
            if not self.with_ids:
                raise BadRequest(
                    "This notebook has no cell ids (nbformat "
                    f"{self.nb.get('nbformat')}.{self.nb.get('nbformat_minor')} < 4.5); "
                    "address cells by 'cell_index'"
                )
            found = [i for i, cell in enumerate(self.cells) if cell.get("id") == op.cell_id]
            if not found:
                raise BadRequest(f"Cell id {short_repr(op.cell_id)} not found in notebook")
            if len(found) > 1:
                raise BadRequest(
                    f"Cell id {short_repr(op.cell_id)} is ambiguous: cells {indexes(found)} share it. "
                    "Address the cell by 'cell_index', or send the edit with \"repair\": true to give "
                    f"cells {indexes(found[1:])} new ids (cell {found[0]} keeps {short_repr(op.cell_id)})"
                )
            i = found[0]
            if op.cell_index is not None and op.cell_index != i:
                raise BadRequest(
                    f"'cell_index' {short_repr(op.cell_index)} and 'cell_id' "
                    f"{short_repr(op.cell_id)} name different cells (that id is at index {i}); "
                    "send one of them"
                )
            return i
        assert op.cell_index is not None
        index = op.cell_index
        if n == 0:
            raise BadRequest(
                f"Cell index {short_repr(index)} is out of range: the notebook has no cells "
                "(insert at index 0)"
            )
        if not 0 <= index < n:
            raise BadRequest(
                f"Cell index {short_repr(index)} is out of range for {op.action} (valid range: 0..{n - 1}, "
                f"notebook has {_cells(n)})"
            )
        return index

    def _details(self, op: CellOp, index: int, cell: dict[str, Any], **extra: Any) -> dict[str, Any]:
        details = {
            "action": op.action,
            "cellIndex": index,
            "cellId": cell.get("id"),
            "cellType": cell.get("cell_type"),
            "totalCells": len(self.cells),
            "cellSource": join_source(cell.get("source", "")),
        }
        details.update(extra)
        return details

    def apply(self, op: CellOp, position: int) -> OpOutcome:
        return _APPLY[op.action](self, op, position)

    def _edit(self, op: CellOp, position: int) -> OpOutcome:
        index = self._locate(op)
        old = self.cells[index]
        old_type = old.get("cell_type")
        assert op.content is not None
        cell = _convert(old, op.cell_type) if op.cell_type and op.cell_type != old_type else dict(old)
        cell["source"] = split_source(op.content)
        self.cells[index] = cell
        n = _cells(len(self.cells))
        if cell["cell_type"] != old_type:
            message = (
                f"Edited cell at index {index} and converted it from {old_type} to "
                f"{cell['cell_type']}. Notebook has {n}."
            )
            return OpOutcome(message, self._details(op, index, cell, previousCellType=old_type))
        message = f"Edited {old_type} cell at index {index}. Notebook has {n}."
        return OpOutcome(message, self._details(op, index, cell))

    def _insert(self, op: CellOp, position: int) -> OpOutcome:
        n = len(self.cells)
        index = n if op.cell_index is None else op.cell_index
        if not 0 <= index <= n:
            raise BadRequest(
                f"Cell index {short_repr(index)} is out of range for insert (valid range: 0..{n}, "
                f"notebook has {_cells(n)})"
            )
        cell_id = None
        if op.cell_id is not None:
            if not self.with_ids:
                raise BadRequest(
                    "This notebook has no cell ids (nbformat < 4.5); omit 'cell_id' when inserting"
                )
            if op.cell_id in self.ids:
                raise BadRequest(f"Cell id {short_repr(op.cell_id)} already exists in notebook")
            cell_id = op.cell_id
        elif self.with_ids:
            cell_id = derive_cell_id(self.id_seed, position, self.ids)
        if cell_id is not None:
            self.ids.add(cell_id)
        assert op.content is not None
        cell = _new_cell(op.cell_type or "code", op.content, cell_id)
        self.cells.insert(index, cell)
        message = (
            f"Inserted {cell['cell_type']} cell at index {index}. Notebook now has {_cells(len(self.cells))}."
        )
        return OpOutcome(message, self._details(op, index, cell))

    def _delete(self, op: CellOp, position: int) -> OpOutcome:
        index = self._locate(op)
        cell = self.cells.pop(index)
        if isinstance(cell.get("id"), str):
            self.ids.discard(cell["id"])
        message = (
            f"Deleted {cell.get('cell_type')} cell at index {index}. "
            f"Notebook now has {_cells(len(self.cells))}."
        )
        return OpOutcome(message, self._details(op, index, cell))

    def _move(self, op: CellOp, position: int) -> OpOutcome:
        index = self._locate(op)
        n = len(self.cells)
        assert op.to_index is not None
        if not 0 <= op.to_index < n:
            raise BadRequest(
                f"to_index {short_repr(op.to_index)} is out of range for move (valid range: 0..{n - 1}, "
                f"notebook has {_cells(n)})"
            )
        cell = self.cells.pop(index)
        self.cells.insert(op.to_index, cell)
        message = (
            f"Moved {cell.get('cell_type')} cell from index {index} to index {op.to_index}. "
            f"Notebook has {_cells(n)}."
        )
        return OpOutcome(message, self._details(op, op.to_index, cell, fromIndex=index))

    def _replace(self, op: CellOp, position: int) -> OpOutcome:
        index = self._locate(op)
        cell = self.cells[index]
        assert op.old is not None and op.new is not None
        source = join_source(cell.get("source", ""))
        found = find_matches(source, op.old)
        if not found or (len(found) > 1 and not op.all):
            raise _replace_error(index, source, op.old, found)
        cell = dict(cell)
        cell["source"] = split_source(source.replace(op.old, op.new))
        self.cells[index] = cell
        n = len(found)
        lines = ", ".join(str(line) for line in sorted({line for line, _ in found}))
        message = (
            f"Replaced {n} match{'es' if n > 1 else ''} in {cell.get('cell_type')} cell at index {index} "
            f"(line{'s' if ',' in lines else ''} {lines}). Notebook has {_cells(len(self.cells))}."
        )
        return OpOutcome(message, self._details(op, index, cell, replacements=n))

    def _clear_outputs(self, op: CellOp, position: int) -> OpOutcome:
        if op.all:
            cleared = 0
            for i, cell in enumerate(self.cells):
                if cell.get("cell_type") == "code" and (cell.get("outputs") or cell.get("execution_count")):
                    self.cells[i] = {**cell, "outputs": [], "execution_count": None}
                    cleared += 1
            message = f"Cleared the outputs of {_cells(cleared)}. Notebook has {_cells(len(self.cells))}."
            details = {"action": op.action, "clearedCells": cleared, "totalCells": len(self.cells)}
            return OpOutcome(message, details)
        index = self._locate(op)
        cell = self.cells[index]
        if cell.get("cell_type") != "code":
            raise BadRequest(f"Cell {index} is a {cell.get('cell_type')} cell: only code cells have outputs")
        cell = {**cell, "outputs": [], "execution_count": None}
        self.cells[index] = cell
        total = _cells(len(self.cells))
        message = f"Cleared the outputs of code cell at index {index}. Notebook has {total}."
        return OpOutcome(message, self._details(op, index, cell))


# The method of each action (the schema's ACTIONS, which the request was validated against: a test holds
# the two equal).
_APPLY: dict[str, Callable[[_Editor, CellOp, int], OpOutcome]] = {
    "edit": _Editor._edit,
    "insert": _Editor._insert,
    "delete": _Editor._delete,
    "move": _Editor._move,
    "replace": _Editor._replace,
    "clear_outputs": _Editor._clear_outputs,
}


def find_matches(source: str, old: str) -> list[tuple[int, str]]:
    """Where ``old`` occurs in ``source`` (non-overlapping, as ``str.replace`` replaces): each match's
    1-based line and that line's text."""
    found: list[tuple[int, str]] = []
    lines = source.split("\n")
    at = source.find(old)
    while at >= 0:
        line = source.count("\n", 0, at)
        found.append((line + 1, lines[line]))
        at = source.find(old, at + len(old))
    return found


def _replace_error(index: int, source: str, old: str, found: list[tuple[int, str]]) -> BadRequest:
    """The 400 of a replace whose ``old`` matches no time, or several times without ``all``."""
    if not found:
        lines = source.count("\n") + 1 if source else 0
        return BadRequest(
            f"No match for 'old' {short_repr(old)} in cell {index} ({lines} lines; the text must match "
            "exactly, whitespace and newlines included): nothing was replaced. Read the cell again",
            extra={"matches": []},
        )
    listed = found[:MAX_LISTED_MATCHES]
    where = "; ".join(f"line {line}: {short_repr(text)}" for line, text in listed)
    more = f" (and {len(found) - len(listed)} more)" if len(found) > len(listed) else ""
    return BadRequest(
        f"'old' {short_repr(old)} matches {len(found)} times in cell {index}, at {where}{more}: nothing was "
        "replaced. Make 'old' longer so that it matches once, or send \"all\": true to replace every match",
        extra={"matches": [{"line": line, "text": text} for line, text in listed]},
    )


def apply_ops(nb: dict[str, Any], ops: list[CellOp], id_seed: str, *, batch: bool = False) -> EditOutcome:
    """Apply ``ops`` in order to a copy of ``nb`` and return it with what each operation did.

    ``id_seed`` (the hash of the notebook's bytes) makes derived cell ids deterministic: the same
    notebook and the same operations always produce the same ids. Raises :class:`BadRequest` naming
    the failing operation; ``nb`` itself is never modified.
    """
    editor = _Editor(nb, id_seed)
    outcomes = []
    for position, op in enumerate(ops):
        try:
            outcomes.append(editor.apply(op, position))
        except BadRequest as e:
            if batch or len(ops) > 1:
                raise BadRequest(
                    f"ops[{position}]: {e.message} (no operation was applied)", extra=e.extra
                ) from None
            raise
    return EditOutcome(notebook=editor.nb, outcomes=outcomes)
