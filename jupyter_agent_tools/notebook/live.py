"""Live notebooks: the shared document of a notebook open in a collaborative room.

With jupyter-collaboration (the ``jupyter_server_ydoc`` extension) or jupyter-server-documents, a notebook
that someone has open in JupyterLab lives in a Y document in the server. Writing its file makes the room
reload from disk a moment later and drops what the person typed in between, so an edit must go into that
document instead: the room then shows it to every client at once and autosaves it to disk.

This module never imports either package (nor pycrdt or jupyter_ydoc): everything is found through the
server's web application settings, and only when a room for the notebook exists. The cell operations are
the same as for files (:func:`~.operations.apply_ops` on a notebook dict); :class:`LiveNotebook` turns the
live document into that dict (exactly as the room would save it) and translates the edited dict back into
the fewest Y operations, all in one transaction, leaving untouched cells alone.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from traitlets import Callable as CallableTrait
from traitlets import CaselessStrEnum, Float, validate

from ..compat import live_outputs_factory, room_is_settled, room_saver, room_store
from ..errors import RETRY_AFTER_MOMENT, Conflict, Unavailable
from ..sequences import longest_increasing
from ..service import Service, at_least
from .format import content_hash, join_source, serialize_notebook

RTC_MODES = ("auto", "never")
"""``auto``: edit the live document when a room is open, else the file. ``never``: always the file."""

STORE_WRITE_WAIT = 5.0
"""Seconds an edit's answer waits for the room's Y store, and for its file, to hold it (see
:meth:`LiveNotebook.persist`)."""

_KEY_YDOC = "jupyter_server_ydoc"
_KEY_YROOM_MANAGER = "yroom_manager"
_KEY_FILE_ID = "file_id_manager"


def file_form(nb: dict[str, Any]) -> dict[str, Any]:
    """``nb`` (as a shared document gives it) in the form nbformat writes to a file.

    Multi-line strings become lists of lines and transient fields (cell ``metadata.trusted``, the
    notebook's ``orig_nbformat`` and ``signature``) go, exactly as ``nbformat.writes`` does (it is what
    the room's autosave uses), so :func:`serialize_notebook` of the result is the file the room would
    write. ``nb`` is not modified.
    """
    from nbformat import from_dict
    from nbformat.v4.rwbase import split_lines, strip_transient

    node = strip_transient(split_lines(from_dict(copy.deepcopy(nb))))
    return _plain(node)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def set_text(ytext: Any, old: str, new: str) -> None:
    """Change a Y text from ``old`` to ``new`` by replacing only the span that differs.

    Text before and after the change keeps its identity, so another user's cursor or concurrent typing
    there is not disturbed. pycrdt indexes text by UTF-8 bytes.
    """
    if old == new:
        return
    limit = min(len(old), len(new))
    start = 0
    while start < limit and old[start] == new[start]:
        start += 1
    end = 0
    while end < limit - start and old[len(old) - 1 - end] == new[len(new) - 1 - end]:
        end += 1
    removed = old[start : len(old) - end]
    inserted = new[start : len(new) - end]
    offset = _utf8_len(old[:start])
    if removed:
        del ytext[offset : offset + _utf8_len(removed)]
    if inserted:
        ytext.insert(offset, inserted)


def _rejoined(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Outputs with multi-line strings joined (nbformat's ``rejoin_lines``), so forms compare equal."""
    from nbformat import from_dict
    from nbformat.v4.rwbase import rejoin_lines

    cell = {"cell_type": "code", "source": "", "metadata": {}, "outputs": copy.deepcopy(outputs)}
    return list(_plain(rejoin_lines(from_dict({"cells": [cell]})).cells[0].outputs))


class LiveNotebook:
    """One read of a live notebook, and the write-back of an edited version of it.

    ``notebook``, ``text`` and ``hash`` describe the document exactly as the room would save it.
    :meth:`apply` must follow the read without an ``await`` in between (the event loop is what applies
    other users' changes), which the store guarantees; it checks the document's state vector anyway.
    """

    def __init__(
        self,
        path: str,
        ynotebook: Any,
        log: logging.Logger,
        ystore: Any = None,
        save_file: Callable[[], Awaitable[Any] | None] | None = None,
    ):
        self.path = path
        self.ynotebook = ynotebook
        self.log = log
        self.ydoc = ynotebook.ydoc
        self._ystore = ystore
        self._save_file = save_file
        self._update: bytes | None = None
        self._state = self.ydoc.get_state()
        self.ycells = list(ynotebook.ycells)
        self.notebook = self._read()
        self.text = serialize_notebook(self.notebook)
        self.hash = content_hash(self.text.encode("utf-8"))
        cells = self.notebook["cells"]
        # Where each cell of the edited notebook came from: apply_ops keeps untouched and moved cells as
        # the same objects and builds an edited cell from a shallow copy (so it shares the metadata dict).
        self._origin_by_cell = {id(cell): i for i, cell in enumerate(cells)}
        self._origin_by_metadata = {
            id(cell["metadata"]): i for i, cell in enumerate(cells) if isinstance(cell.get("metadata"), dict)
        }

    def _read(self) -> dict[str, Any]:
        try:
            nb = self.ynotebook.get(deduplicate=False)
        except TypeError:  # jupyter_ydoc < 3.1 has no deduplicate argument
            nb = self.ynotebook.get()
        if len(nb.get("cells", [])) != len(self.ycells):
            raise Conflict(
                f"The live notebook {self.path} has duplicate cell ids; reload it in JupyterLab and retry"
            )
        return file_form(nb)

    def apply(self, new: dict[str, Any]) -> str:
        """Make the live document equal ``new`` in one transaction; return the hash of the result."""
        if self.ydoc.get_state() != self._state:
            raise Conflict(f"The live notebook {self.path} changed during the edit; read it again and retry")
        old_rest = {k: v for k, v in self.notebook.items() if k != "cells"}
        new_rest = {k: v for k, v in new.items() if k != "cells"}
        if old_rest != new_rest:  # the cell operations never change notebook metadata
            raise RuntimeError("live notebook edit changed more than cells")
        with self.ydoc.transaction():
            self._apply_cells(new["cells"])
        self._update = self.ydoc.get_update(self._state)
        after = LiveNotebook(self.path, self.ynotebook, self.log)
        expected = serialize_notebook(new)
        if after.text != expected:
            self.log.warning("Live notebook %s differs from the edited notebook after the update", self.path)
        return after.hash

    async def persist(self, to_file: bool = True) -> None:
        """Write the update of :meth:`apply` to the room's Y store, and (``to_file``) have the room save
        the file, before the edit is answered.

        The room writes its store too, but in a task that a server stop cancels; and it saves the file
        only after its autosave delay, a save that a stop cancels as well. Restarted, a room whose store
        is behind its file reloads the file as new Y items (a page that stayed open then merges its own
        copy of the cell back in: the cell twice, with one id); one whose file is behind its store takes
        the file (the answered edit is gone). Y updates are idempotent, and the room's later autosave
        finds nothing new. ``to_file=False``: outputs streamed while a cell runs, whose final write saves.
        """
        update, self._update = self._update, None
        if not update:
            return
        if self._ystore is not None:
            await self._wait_for("its room's store", self._ystore.write(update))
        saving = self._save_file() if to_file and self._save_file is not None else None
        if saving is not None:
            await self._wait_for("its file", saving)

    async def _wait_for(self, where: str, write: Awaitable[Any]) -> None:
        """Wait, bounded, for a write of the room's; shielded (a write cut short could leave a database or
        a file half written); a late failure is retrieved by the callback, the warning having said it."""
        task = asyncio.ensure_future(write)
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            await asyncio.wait_for(asyncio.shield(task), STORE_WRITE_WAIT)
        except (asyncio.TimeoutError, RuntimeError, OSError, sqlite3.Error) as e:
            # (a store not started, its file or database; a save refused): the edit is in the room
            # already, only its durability across a stop is at stake
            self.log.warning("The edit of %s is not in %s yet: %r", self.path, where, e)

    def _origin(self, cell: dict[str, Any], taken: set[int], ids: dict[str, int]) -> int | None:
        origin = self._origin_by_cell.get(id(cell))
        if origin is None and isinstance(cell.get("metadata"), dict):
            origin = self._origin_by_metadata.get(id(cell["metadata"]))
        if origin is None and isinstance(cell.get("id"), str):
            origin = ids.get(cell["id"])
        if origin is None or origin in taken:
            return None
        taken.add(origin)
        return origin

    def _apply_cells(self, new_cells: list[dict[str, Any]]) -> None:
        old_cells = self.notebook["cells"]
        ids = {c["id"]: i for i, c in enumerate(old_cells) if isinstance(c.get("id"), str)}
        taken: set[int] = set()
        origins = [self._origin(cell, taken, ids) for cell in new_cells]

        # A kept cell is updated in place when only its source changed, or (a code cell) its source,
        # outputs and execution count: clients watch those keys, and the cell keeps its identity (a
        # run's outputs do not reset a person's editor nor drop what they type meanwhile). Anything else
        # (another type, other metadata) replaces it, as JupyterLab does.
        in_place = [
            origin is not None and self._updatable(old_cells[origin], cell)
            for cell, origin in zip(new_cells, origins, strict=True)
        ]
        candidates = [pos for pos, ok in enumerate(in_place) if ok]
        lis = longest_increasing([origins[pos] for pos in candidates])  # type: ignore[misc]
        stable = {candidates[k] for k in lis}  # positions in new_cells whose ycell stays where it is
        kept = {origins[pos] for pos in stable}

        ycells = self.ynotebook.ycells
        # 1. Sources of kept cells, while indexes are still those of the read.
        for pos in sorted(stable):
            origin = origins[pos]
            assert origin is not None
            old_source = join_source(old_cells[origin].get("source", ""))
            new_source = join_source(new_cells[pos].get("source", ""))
            if old_source != new_source:
                set_text(ycells[origin]["source"], old_source, new_source)
            old_cell, new_cell = old_cells[origin], new_cells[pos]
            if old_cell.get("outputs") != new_cell.get("outputs"):
                self._set_outputs(ycells[origin], old_cell["outputs"], new_cell["outputs"])
            if old_cell.get("execution_count") != new_cell.get("execution_count"):
                ycells[origin]["execution_count"] = new_cell.get("execution_count")
        # 2. Remove deleted, moved and replaced cells (moves are delete + insert: Yjs 13 clients, i.e.
        #    JupyterLab 4, do not understand pycrdt's move).
        reused = {o for o in origins if o is not None} - kept
        raw_by_origin = {i: self.ycells[i].to_py() for i in reused}
        for i in sorted(set(range(len(old_cells))) - kept, reverse=True):
            del ycells[i]
        # 3. Insert new, moved and replaced cells at their final positions, in order.
        for pos, cell in enumerate(new_cells):
            if pos in stable:
                continue
            origin = origins[pos]
            value = (
                self._recreated(old_cells[origin], cell, raw_by_origin[origin])
                if origin is not None
                else cell
            )
            ycells.insert(pos, self.ynotebook.create_ycell(value))

    def _updatable(self, old: dict[str, Any], new: dict[str, Any]) -> bool:
        if old is new:
            return True
        if old.keys() != new.keys():
            return False
        changing = {"source"}
        # Outputs in place need the live form of outputs (jupyter_ydoc >= 3: maps, stream text as text).
        if old.get("cell_type") == "code" and live_outputs_factory(self.ynotebook) is not None:
            changing |= {"outputs", "execution_count"}
        return all(old[k] == new[k] for k in old if k not in changing)

    def _set_outputs(self, ycell: Any, old: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
        """Change a cell's outputs from ``old`` to ``new`` in place: equal leading outputs stay, a stream
        that grew gets only its new text (as a kernel's output streams into JupyterLab), the rest is
        replaced."""
        old, new = _rejoined(old), _rejoined(new)
        youtputs = ycell["outputs"]
        keep = 0
        while keep < min(len(old), len(new)) and old[keep] == new[keep]:
            keep += 1
        if keep == len(old) - 1 and keep < len(new):
            was, now = old[keep], new[keep]
            ytext = youtputs[keep].get("text") if hasattr(youtputs[keep], "get") else None
            if (
                was.get("output_type") == now.get("output_type") == "stream"
                and was.keys() == now.keys()
                and was.get("name") == now.get("name")
                and isinstance(now.get("text"), str)
                and now["text"].startswith(was.get("text", ""))
                and ytext is not None
                and hasattr(ytext, "insert")
                and str(ytext) == was.get("text", "")
            ):
                ytext += now["text"][len(was.get("text", "")) :]
                keep += 1
        if keep < len(youtputs):
            del youtputs[keep:]
        if keep < len(new):
            youtputs.extend(live_outputs_factory(self.ynotebook)(new[keep:]))

    @staticmethod
    def _recreated(old: dict[str, Any], new: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
        """The value for a re-created cell: what did not change keeps its live form (trusted flag,
        outputs as the room holds them, the cell's id in a notebook that does not save ids)."""
        value = {k: (raw[k] if k in raw and old.get(k) == v else v) for k, v in new.items()}
        if "id" not in value and isinstance(raw.get("id"), str):
            value["id"] = raw["id"]
        old_meta, raw_meta = old.get("metadata"), raw.get("metadata")
        if (
            isinstance(value.get("metadata"), dict)
            and isinstance(raw_meta, dict)
            and "trusted" in raw_meta
            and value["metadata"] is not raw_meta
            and old_meta == new.get("metadata")
        ):
            value["metadata"] = raw_meta
        return value


class LiveDocuments(Service):
    """Finds the live document of a notebook through the server's settings; imports nothing."""

    settings = CallableTrait(help="Returns the server's Tornado settings, where the rooms are found.")
    mode = CaselessStrEnum(
        RTC_MODES,
        default_value="auto",
        help="Where notebook edits go when real-time collaboration (jupyter-collaboration or "
        "jupyter-server-documents) has the notebook open in a room. 'auto': into the room's live document, "
        "so people see them at once and keep their unsaved work (the room autosaves the file); 'never': "
        "always into the file, as without collaboration.",
    ).tag(config=True)
    ready_timeout = Float(
        10.0,
        help="Seconds a notebook read or edit waits for a collaborative room that is loading or reloading "
        "the notebook from disk; past it the request answers 503 with Retry-After.",
    ).tag(config=True)

    @validate("ready_timeout")
    def _valid_ready_timeout(self, proposal: Any) -> float:
        return float(at_least(proposal, 0, strict=True))

    async def open(self, path: str) -> LiveNotebook | None:
        """A read of the notebook's live document, or ``None`` when no room has it open.

        Returns with no ``await`` between the read and the caller's next step.
        """
        if self.mode == "never":
            return None
        settings = self.settings()
        api = settings.get(_KEY_YDOC)
        file_ids = settings.get(_KEY_FILE_ID)
        if api is None or file_ids is None or not hasattr(api, "get_document"):
            return None
        file_id = file_ids.get_id(path)  # never index(): that would record every notebook we touch
        if not file_id:
            return None
        room_id = f"json:notebook:{file_id}"
        manager = settings.get(_KEY_YROOM_MANAGER)
        if manager is not None and not manager.has_room(room_id):
            return None  # jupyter-server-documents: get_document would create the room
        ynotebook = await api.get_document(room_id=room_id, copy=False)
        if ynotebook is None or not hasattr(ynotebook, "ycells"):
            return None
        if not await self._wait_until_ready(api, room_id, path):
            return None  # the room closed meanwhile: its document is no longer saved anywhere
        return LiveNotebook(path, ynotebook, self.log, room_store(api, room_id), room_saver(api, room_id))

    async def _wait_until_ready(self, api: Any, room_id: str, path: str) -> bool:
        """Wait while a jupyter-collaboration room loads or reloads its content from disk.

        Between its creation and its first load a room's document is empty, and a reload from disk
        replaces the cells in a transaction that spans awaits: an edit must not read or write meanwhile.
        Returns whether the room still exists (always ``True`` when rooms cannot be inspected, as with
        jupyter-server-documents, whose ``get_document`` returns only once the room has loaded).
        """
        server = getattr(api, "ywebsocket_server", None)
        rooms = getattr(server, "rooms", None)
        if not isinstance(rooms, Mapping):
            return True
        deadline = time.monotonic() + self.ready_timeout
        while True:
            room = rooms.get(room_id)
            if room is None:
                return False
            if room_is_settled(room):
                return True
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"The live notebook {path} is still loading in its collaborative room; retry",
                    retry_after=RETRY_AFTER_MOMENT,
                )
            await asyncio.sleep(0.02)
