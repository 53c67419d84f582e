"""What changed in a notebook since an earlier version of it: the per-cell hashes the ledger remembers for
every hash the extension answered with, compared with the notebook now. Pure: no I/O.

A snapshot is not a copy: per cell its id and two short hashes (its content: source, metadata, type;
its outputs), about 30 bytes a cell. A new version's snapshot reuses the hashes of the cells it shares
(by object) with the version it was made from, so only changed cells are hashed again.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..sequences import longest_increasing
from .changes import Digest, _hash, digest

HASH_BYTES = 8


def combined(d: Digest) -> tuple[str, str]:
    """(content hash, outputs hash) of a cell from the hash of each of its parts."""
    return _hash((d[0] + d[1] + d[3]).encode()), d[2]


@dataclass(frozen=True)
class Snapshot:
    """A notebook version as the ledger remembers it: each cell's id, content hash and outputs hash."""

    ids: tuple[str | None, ...]
    content: tuple[str, ...]
    outputs: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.ids)

    def encode(self) -> bytes:
        ids = zlib.compress(json.dumps(self.ids, separators=(",", ":")).encode(), 1)
        hashes = bytes.fromhex("".join(self.content)) + bytes.fromhex("".join(self.outputs))
        return struct.pack("<I", len(ids)) + ids + hashes

    @classmethod
    def decode(cls, data: bytes) -> Snapshot:
        (size,) = struct.unpack_from("<I", data)
        ids = tuple(json.loads(zlib.decompress(data[4 : 4 + size])))
        hashes = data[4 + size :].hex()
        n, width = len(ids), HASH_BYTES * 2
        content = tuple(hashes[i * width : (i + 1) * width] for i in range(n))
        outputs = tuple(hashes[(n + i) * width : (n + i + 1) * width] for i in range(n))
        return cls(ids, content, outputs)


def snapshot_of(nb: dict[str, Any], base: tuple[dict[str, Any], Snapshot] | None = None) -> Snapshot:
    """The snapshot of ``nb``; with ``base`` (an earlier notebook and its snapshot), the cells ``nb``
    shares with it (the same objects) are not hashed again."""
    cells = nb.get("cells") or []
    old_cells = base[0].get("cells") or [] if base is not None else []
    snap = base[1] if base is not None and len(old_cells) == len(base[1]) else None
    same_place = snap is not None and len(old_cells) == len(cells)
    known: dict[int, int] | None = None
    ids: list[str | None] = []
    content: list[str] = []
    outputs: list[str] = []
    for position, cell in enumerate(cells):
        cell_id = cell.get("id")
        ids.append(cell_id if isinstance(cell_id, str) else None)
        k: int | None = None
        if snap is not None:
            if same_place and old_cells[position] is cell:  # the usual case: an edit in place
                k = position
            else:
                if known is None:
                    known = {id(c): i for i, c in enumerate(old_cells)}
                k = known.get(id(cell))
        if k is not None and snap is not None:
            content.append(snap.content[k])
            outputs.append(snap.outputs[k])
            continue
        c, o = combined(digest(cell))
        content.append(c)
        outputs.append(o)
    return Snapshot(tuple(ids), tuple(content), tuple(outputs))


@dataclass
class SinceCell:
    """A cell that changed since an earlier version: its id, where it is now, what happened."""

    id: str | None
    index: int | None
    what: list[str]
    content: str | None = None  # its hashes now (None: deleted)
    outputs: str | None = None


def _unique(ids: Iterable[str | None]) -> bool:
    seen: set[str] = set()
    for i in ids:
        if i is None or i in seen:
            return False
        seen.add(i)
    return True


def compare(old: Snapshot, new: Snapshot) -> list[SinceCell]:
    """The cells edited, inserted, deleted, moved or given new outputs from ``old`` to ``new`` (by id;
    by position when a version has cells without unique ids)."""
    found: list[SinceCell] = []
    if not (_unique(old.ids) and _unique(new.ids)):
        for k in range(max(len(old), len(new))):
            if k >= len(old):
                found.append(SinceCell(new.ids[k], k, ["inserted"], new.content[k], new.outputs[k]))
            elif k >= len(new):
                found.append(SinceCell(old.ids[k], None, ["deleted"]))
            else:
                what = _what(old, k, new, k)
                if what:
                    found.append(SinceCell(new.ids[k], k, what, new.content[k], new.outputs[k]))
        return found
    if old.ids == new.ids:  # the same cells in the same order: compare the hashes in place
        return [
            SinceCell(new.ids[k], k, _what(old, k, new, k), new.content[k], new.outputs[k])
            for k in range(len(new))
            if old.content[k] != new.content[k] or old.outputs[k] != new.outputs[k]
        ]
    old_at = {cell_id: k for k, cell_id in enumerate(old.ids)}
    pairs = [(old_at[cell_id], j) for j, cell_id in enumerate(new.ids) if cell_id in old_at]
    kept = longest_increasing([i for i, _ in pairs])
    moved = {pairs[k][1] for k in range(len(pairs)) if k not in kept}
    matched = {j: i for i, j in pairs}
    for j, cell_id in enumerate(new.ids):
        i = matched.get(j)
        if i is None:
            found.append(SinceCell(cell_id, j, ["inserted"], new.content[j], new.outputs[j]))
            continue
        what = _what(old, i, new, j)
        if j in moved:
            what.append("moved")
        if what:
            found.append(SinceCell(cell_id, j, what, new.content[j], new.outputs[j]))
    new_ids = set(new.ids)
    for cell_id in old.ids:
        if cell_id not in new_ids:
            found.append(SinceCell(cell_id, None, ["deleted"]))
    return found


def _what(old: Snapshot, i: int, new: Snapshot, j: int) -> list[str]:
    what = []
    if old.content[i] != new.content[j]:
        what.append("edited")
    if old.outputs[i] != new.outputs[j]:
        what.append("outputs")
    return what


def attribute(cells: list[SinceCell], entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each changed cell with who changed it, when a recorded change explains its state now.

    ``entries`` are recorded changes of the notebook, newest first, each with ``cells`` (id, what,
    digest). A cell is credited to the newest change that touched it and left it as it is now (deleted,
    or with the same hashes); otherwise nothing recorded explains it (a person's edit through the
    contents API or a live room): ``user`` and ``change_id`` are then null.
    """
    answer = []
    for cell in cells:
        credited: dict[str, Any] | None = None
        if cell.id is not None:
            for entry in entries:
                touched = entry["by_id"].get(cell.id)
                if touched is None:
                    continue
                left = touched.get("digest")
                if cell.content is None:
                    explains = left is None
                else:
                    explains = left is not None and combined(tuple(left)) == (cell.content, cell.outputs)
                if explains:
                    credited = entry
                break
        answer.append(
            {
                "id": cell.id,
                "index": cell.index,
                "what": cell.what,
                "user": credited["user"] if credited else None,
                "via": credited["via"] if credited else None,
                "change_id": credited["id"] if credited else None,
            }
        )
    return answer
