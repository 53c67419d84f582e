"""Reads notebooks and applies cell operations: to the file, or to the live document of an open room.

The contents manager confines paths to the server root, writes atomically, keeps checkpoints and may not
be a local disk at all: the store never opens a file itself. Edits of one notebook are serialized by a
per-path lock so that concurrent requests never lose each other's changes.

When the notebook is open in a collaborative room (see :mod:`.live`), reads and edits go to the room's
live document instead of the file, through the same pipeline: read -> check ``expected_hash`` ->
:func:`apply_ops` -> validate -> write back (one Y transaction instead of one save).
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from dataclasses import dataclass
from typing import Any

from jupyter_core.utils import ensure_async
from nbformat.validator import get_validator
from tornado.web import HTTPError

from ..errors import AgentToolsError, BadRequest, Conflict, NotFound
from .format import content_hash, parse_notebook, serialize_notebook
from .live import LiveDocuments, LiveNotebook
from .operations import apply_ops, check_supported, parse_edit_request
from .summary import summarize_notebook


@dataclass
class LoadedNotebook:
    """A notebook as read from the store: its parsed dict, its text and the hash of its bytes."""

    path: str
    notebook: dict[str, Any]
    text: str
    hash: str


def validate_notebook(nb: dict[str, Any], path: str) -> None:
    """Raise :class:`BadRequest` unless ``nb`` is valid against its nbformat schema."""
    minor = nb.get("nbformat_minor")
    validator = get_validator(version=4, version_minor=minor if isinstance(minor, int) else None)
    if validator is None:
        raise BadRequest(f"Unsupported notebook format in {path}: nbformat 4.{minor}")
    try:
        validator.validate(nb)
    except Exception as e:  # fastjsonschema and jsonschema raise different ValidationErrors
        message = getattr(e, "message", None) or str(e)
        raise BadRequest(
            f"Notebook would not be a valid nbformat 4.{minor} notebook: {path}: {message}"
        ) from None


class NotebookStore:
    """Reads and edits notebooks through a jupyter_server contents manager."""

    def __init__(
        self,
        contents_manager: Any,
        *,
        log: logging.Logger | None = None,
        summary_max_chars: int = 2000,
        max_ops: int = 1000,
        live: LiveDocuments | None = None,
    ):
        self.contents_manager = contents_manager
        self.live = live
        self.log = log or logging.getLogger(__name__)
        self.summary_max_chars = summary_max_chars
        self.max_ops = max_ops
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def _lock(self, path: str) -> asyncio.Lock:
        lock = self._locks.get(path)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[path] = lock
        return lock

    async def _check_path(self, path: str) -> str:
        path = path.strip("/")
        if not path.endswith(".ipynb"):
            raise BadRequest(f"Not a notebook (expected a path ending in .ipynb): {path}")
        cm = self.contents_manager
        try:
            hidden = await ensure_async(cm.is_hidden(path))
        except HTTPError as e:
            raise NotFound(f"Notebook not found: {path}") from e
        if hidden and not cm.allow_hidden:
            # The contents API answers 404 for hidden files too: do not reveal that they exist.
            raise NotFound(f"Notebook not found: {path}")
        return path

    async def _load(self, path: str) -> LoadedNotebook:
        """Read a notebook's text through the contents manager and parse it (``path`` already checked)."""
        text = await self._read_text(path)
        try:
            nb = parse_notebook(text, path)
        except BadRequest:
            recovered = await self._recover_interrupted_save(path)
            if recovered is None:
                raise
            text, nb = recovered, parse_notebook(recovered, path)
        return LoadedNotebook(path, nb, text, content_hash(text.encode("utf-8")))

    async def _read_text(self, path: str) -> str:
        cm = self.contents_manager
        try:
            if not await ensure_async(cm.file_exists(path)):
                raise NotFound(f"Notebook not found: {path}")
            model = await ensure_async(cm.get(path, content=True, type="file", format="text"))
        except HTTPError as e:
            if e.status_code == 404:
                raise NotFound(f"Notebook not found: {path}") from e
            if e.status_code == 400:
                raise BadRequest(f"Invalid JSON in notebook: {path}: {e.log_message}") from e
            raise
        text = model["content"]
        if not isinstance(text, str):
            raise BadRequest(f"Invalid JSON in notebook: {path}: not UTF-8 text")
        return text

    async def _recover_interrupted_save(self, path: str) -> str | None:
        """The notebook's text after the contents manager's own recovery of an interrupted save.

        A save killed half-way leaves the file truncated and the previous content in ``.~<name>``; the
        contents manager restores it when it reads the file *as a notebook* (reading as a file, as this
        store does for exact bytes, skips that). None when there was nothing to recover.
        """
        try:
            await ensure_async(self.contents_manager.get(path, content=True, type="notebook"))
        except Exception:
            return None
        self.log.warning("notebook %s was restored from an interrupted save", path)
        return await self._read_text(path)

    def _escapes_root(self, path: str) -> bool:
        """Whether the file behind ``path`` really lies outside the server root (through a symlink)."""
        cm = self.contents_manager
        get_os_path, root = getattr(cm, "_get_os_path", None), getattr(cm, "root_dir", None)
        if not callable(get_os_path) or not isinstance(root, str) or not root:
            return False  # not a local-disk contents manager: it confines its own storage
        try:
            real = os.path.realpath(get_os_path(path))
        except Exception:
            return False
        real_root = os.path.realpath(root)
        return os.path.commonpath([real, real_root]) != real_root

    async def _open(self, path: str) -> LoadedNotebook | LiveNotebook:
        """The notebook's live document when a collaborative room has it open, else its file.

        ``path`` is one :meth:`_check_path` returned. For a live document there is no ``await`` between
        the read and the return, so a caller that goes on without awaiting sees and edits exactly what
        it read.
        """
        if self.live is not None:
            doc = await self.live.open(path)
            if doc is not None:
                return doc
        return await self._load(path)

    async def read(self, path: str, *, include_binary: bool = False) -> dict[str, Any]:
        """The notebook as an agent reads it (see :func:`summarize_notebook`)."""
        path = await self._check_path(path)
        async with self._lock(path):  # never read a file while this store is writing it
            loaded = await self._open(path)
        return summarize_notebook(
            loaded.notebook, loaded.path, loaded.hash, self.summary_max_chars, include_binary
        )

    async def edit(self, path: str, body: Any) -> dict[str, Any]:
        """Apply one operation or a batch atomically and save once; return the answer for the caller."""
        request = parse_edit_request(body, self.max_ops)
        path = await self._check_path(path)
        if self._escapes_root(path):
            raise AgentToolsError(
                f"Refusing to write {path}: it is a link to a file outside the server root", 403
            )
        async with self._lock(path):
            loaded = await self._open(path)
            # No await from here to the write-back of a live document (see _open()).
            if request.expected_hash is not None and request.expected_hash != loaded.hash:
                raise Conflict(
                    f"Notebook changed since it was read: {path} (expected_hash "
                    f"{request.expected_hash}, current hash {loaded.hash}); read it again and retry"
                )
            check_supported(loaded.notebook, path)
            outcome = apply_ops(loaded.notebook, request.ops, id_seed=loaded.hash, batch=request.batch)
            validate_notebook(outcome.notebook, path)
            if isinstance(loaded, LiveNotebook):
                new_hash = loaded.apply(outcome.notebook)
            else:
                text = serialize_notebook(outcome.notebook)
                await self._save(path, text)
                new_hash = content_hash(text.encode("utf-8"))
        return {
            "message": outcome.message,
            "details": outcome.outcomes[-1].details,
            "hash": new_hash,
            "results": [{"message": o.message, "details": o.details} for o in outcome.outcomes],
        }

    async def _save(self, path: str, text: str) -> None:
        cm = self.contents_manager
        try:
            # Like the contents API does for notebooks, keep one checkpoint: the state before the
            # first edit stays recoverable with "Revert to checkpoint".
            if not await ensure_async(cm.list_checkpoints(path)):
                await ensure_async(cm.create_checkpoint(path))
            await ensure_async(cm.save({"type": "file", "format": "text", "content": text}, path))
        except HTTPError as e:
            if e.status_code < 500:
                raise AgentToolsError(e.log_message or f"Cannot save {path}", e.status_code) from e
            raise
