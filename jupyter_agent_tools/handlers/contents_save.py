"""Saves through jupyter_server's contents API (``PUT /api/contents/...``), told to the notebook store;
notebooks it deletes or renames, told to the change ledger.

JupyterLab (its save, its autosave, the Overwrite of its File Changed dialog) and any other client save a
notebook there, through the contents manager's ``save``. The extension wraps that one method of the
server's contents manager: a save made while jupyter_server's ``ContentsHandler`` serves a PUT of an
existing ``.ipynb`` goes through :meth:`NotebookStore.contents_save` (which records it when it
overwrote an agent's change), as the acting user of that request; every other call of ``save`` (the
manager's own ``new``, copies, real-time collaboration's room saves, this extension's writes) is passed
on untouched. A contents manager whose ``save`` is synchronous keeps it synchronous for those calls.

A notebook deleted, renamed or copied over through the contents manager (its ``contents_service``
events) is another file from then on at that path: the ledger then refuses to undo its older changes
(cell ids derived from a path repeat in a new file made there).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Any

from jupyter_server import CallContext
from jupyter_server.services.contents.handlers import ContentsHandler

from ..audit import set_user
from ..audit.context import set_via
from ..compat import wrap_once
from ..ledger.service import Ledger
from ..notebook.store import NotebookStore
from .base import acting_username

VIA = "contents"  # the ledger's door for these saves
CONTENTS_EVENTS = "https://events.jupyter.org/jupyter_server/contents_service/v1"
MARK = "contents saves"  # the key of its wrap (compat.wrap_once)


def _put_handler(model: Any, path: str) -> ContentsHandler | None:
    """The contents handler serving a PUT that saves the notebook ``path`` whole, or None."""
    handler = CallContext.get(CallContext.JUPYTER_HANDLER)
    if not isinstance(handler, ContentsHandler) or handler.request.method != "PUT":
        return None
    if not isinstance(model, dict) or model.get("chunk") is not None:
        return None  # a chunked upload's pieces are not a notebook
    if model.get("type") not in ("notebook", "file") or not str(path).endswith(".ipynb"):
        return None
    return handler


async def _save_as(handler: ContentsHandler, store: NotebookStore, path: str, save: Any) -> Any:
    """The save, made through the store as the request's acting user, through the door "contents"."""
    tokens = (set_user(acting_username(handler)), set_via(VIA))
    try:
        return await store.contents_save(path, save)
    finally:
        for token in reversed(tokens):
            token.var.reset(token)


def watch_contents_saves(contents_manager: Any, store: NotebookStore) -> None:
    """Wrap ``contents_manager.save`` (once) so that saves through the contents API reach ``store``."""
    wrap_once(
        contents_manager, "save", MARK, lambda original: _watched_save(contents_manager, original, store)
    )


def _watched_save(contents_manager: Any, original: Any, store: NotebookStore) -> Any:
    """``original`` (the contents manager's ``save``), with whole notebook saves of a PUT made through
    ``store``."""
    if inspect.iscoroutinefunction(original):

        async def save(model: Any, path: str = "") -> Any:
            handler = _put_handler(model, path)
            if handler is None:
                return await original(model, path)
            return await _save_as(handler, store, path, lambda: original(model, path))

        return save

    def sync_save(model: Any, path: str = "") -> Any:
        handler = _put_handler(model, path)
        if handler is None or not contents_manager.file_exists(path):
            return original(model, path)  # (the manager's new() calls save for a new file)

        async def call() -> Any:
            return original(model, path)

        coroutine: Awaitable[Any] = _save_as(handler, store, path, call)
        return coroutine  # the handler awaits it (ensure_async)

    return sync_save


def watch_contents_removals(event_logger: Any, ledger: Ledger) -> None:
    """Tell ``ledger`` of each notebook the contents manager deletes, renames away or writes a copy to."""

    async def listener(logger: Any, schema_id: str, data: dict[str, Any]) -> None:  # (jupyter_events' names)
        action, path, source = data.get("action"), data.get("path"), data.get("source_path")
        gone = {"delete": [path], "rename": [source, path], "copy": [path]}.get(str(action), [])
        for name in gone:
            if isinstance(name, str) and name.endswith(".ipynb"):
                await ledger.file_removed(name.strip("/"))  # (never raises: it would fail the contents call)

    if event_logger is not None:
        event_logger.add_listener(schema_id=CONTENTS_EVENTS, listener=listener)
