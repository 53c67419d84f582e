"""List notebooks, files and directories under a directory of the server root, through the contents manager.

The contents manager decides what exists and what may be seen: paths outside the root and hidden files or
directories (unless ``allow_hidden``) are not listed, and ``hide_globs`` apply, exactly as in
``/api/contents`` and JupyterLab's file browser. An agent token's path globs limit it further.

A walk is depth-first, each directory's entries sorted by name, so the order is that of the paths' segments
and a page can resume after the last path the previous page examined (``start`` = its ``next_start``)
without walking what came before again. Each call examines at most :data:`MAX_SCANNED` entries, lists
each directory off the event loop (jupyter_server's file contents managers) or yields between
directories, and answers what it found so far with ``next_start`` when it stops early.
"""

from __future__ import annotations

import asyncio
import bisect
import inspect
import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jupyter_core.utils import ensure_async

from .auth.context import current_paths
from .auth.paths import GlobError, clean_glob, compile_glob, normalize
from .errors import AgentToolsError, BadRequest, NotFound

MAX_LIMIT = 5000
MAX_DEPTH = 100
MAX_SCANNED = 20_000  # entries one call examines at most (a page stops early past it, with next_start)
MAX_START_CHARS = 4096


@dataclass
class _Walk:
    """The state of one listing: what to match, what was found, where it stopped."""

    top: str
    pattern: re.Pattern[str] | None
    max_depth: int
    limit: int
    root: str | None
    entries: list[dict[str, Any]]
    scanned: int = 0
    last: str | None = None  # the last path examined
    more: bool = False  # stopped before the end
    real_root: str | None = None  # the root's real path (file contents managers only)
    on_path: set[str] | None = None  # the real paths of the folders being walked, top to current


async def list_files(
    contents_manager: Any,
    path: str = "",
    *,
    recursive: bool = False,
    limit: int = 500,
    glob: str | None = None,
    max_depth: int | None = None,
    start: str | None = None,
    outside_top: bool = False,
) -> dict[str, Any]:
    """``{"path", "entries": [{"path", "type", "size", "last_modified"}], "truncated", "next_start"}``.

    ``type`` is ``notebook``, ``file`` or ``directory``. Without ``recursive``, ``glob`` or ``max_depth``,
    the directory's own entries; otherwise its subdirectories too, down to ``max_depth`` levels (1: the
    directory's own entries). ``glob`` (``*``, ``?``, ``[...]``, ``**`` for any number of folders) is
    matched against each path relative to ``path``: ``**/*.ipynb`` is every notebook below it. At most
    ``limit`` entries; ``truncated`` then says more may exist and ``next_start`` is the ``start`` of the
    next page (the last path examined).

    Under an agent token's path globs a folder outside them is a 404, unless ``outside_top`` (MCP's
    ``resources/list`` of the root): then only what lies inside them is listed.
    """
    path = path.strip("/")
    if normalize(path) != path:
        raise BadRequest(f"'path' must be a folder under the root, without '.' or '..': {path[:200]!r}")
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"'limit' must be from 1 to {MAX_LIMIT}, got {limit}")
    if max_depth is not None and not 1 <= max_depth <= MAX_DEPTH:
        raise BadRequest(f"'max_depth' must be from 1 to {MAX_DEPTH}, got {max_depth}")
    pattern = None
    if glob is not None:
        try:
            pattern = compile_glob(clean_glob(glob))
        except GlobError as e:
            raise BadRequest(f"'glob': {e}") from None
    depth = max_depth or (MAX_DEPTH if recursive or glob is not None else 1)
    if glob is not None and max_depth is None and "**" not in glob.split("/"):
        depth = len(clean_glob(glob).split("/"))  # a glob without ** names a fixed depth
    cursor: list[str] = []
    if start:
        if len(start) > MAX_START_CHARS:
            raise BadRequest(f"'start' has {len(start)} characters; at most {MAX_START_CHARS}")
        relative = _relative(start.strip("/"), path)
        if relative is None:
            raise BadRequest(f"'start' must be a path under {path or 'the root'} (a next_start): {start!r}")
        cursor = relative.split("/") if relative else []
    scope = current_paths()  # an agent token's path globs: only what lies inside them is listed
    root = getattr(contents_manager, "root_dir", None)
    if scope is not None and not outside_top and not scope.allows(path, root):
        raise NotFound(f"Directory not found: {path or '/'}")
    walk = _Walk(path, pattern, depth, limit, root, [])
    if depth > 1 and isinstance(root, str) and callable(getattr(contents_manager, "_get_os_path", None)):
        walk.real_root = os.path.realpath(root)
        top_real = _real_dir(contents_manager, path)
        walk.on_path = {top_real} if top_real else set()
    await _walk(contents_manager, walk, path, 1, cursor, top=True)
    return {
        "path": path,
        "entries": walk.entries,
        "truncated": walk.more,
        "next_start": walk.last if walk.more else None,
    }


def _relative(full: str, top: str) -> str | None:
    """``full`` relative to ``top`` (both root-relative), or None when it is not under it."""
    normal = normalize(full)
    if normal is None:
        return None
    if not top:
        return normal
    if normal == top:
        return ""
    return normal[len(top) + 1 :] if normal.startswith(top + "/") else None


async def _walk(cm: Any, walk: _Walk, directory: str, depth: int, cursor: list[str], *, top: bool) -> None:
    """List ``directory`` (at ``depth``) and, depth-first, its subdirectories; entries before ``cursor``
    (the path a previous page stopped at, as segments relative to this directory) are skipped."""
    scope = current_paths()
    names, items = await _listing(cm, directory, top=top)
    first = bisect.bisect_left(names, cursor[0]) if cursor else 0  # what a previous page went past
    for i in range(first, len(items)):
        name, item = names[i], items[i]
        after: list[str] = []
        if cursor:
            if name < cursor[0]:
                continue
            if name == cursor[0]:
                after = cursor[1:]
        if walk.scanned >= MAX_SCANNED or len(walk.entries) >= walk.limit:
            walk.more = True
            return
        item_path = _path(item)
        walk.scanned += 1
        if scope is not None and not scope.allows(item_path, walk.root):
            continue
        is_dir = item.get("type") == "directory"
        if not (cursor and name == cursor[0]):  # the cursor's own path and its folders were listed before
            walk.last = item_path
            relative = item_path[len(walk.top) + 1 :] if walk.top else item_path
            if walk.pattern is None or walk.pattern.fullmatch(relative + "/"):
                walk.entries.append(_entry(item))
        elif not after:
            walk.last = item_path
        if is_dir and depth < walk.max_depth:
            real = _enter(cm, walk, item_path)
            if real is False:
                continue  # a symlink to a folder being walked (a loop) or outside the root
            try:
                await _walk(cm, walk, item_path, depth + 1, after, top=False)
            finally:
                if isinstance(real, str) and walk.on_path is not None:
                    walk.on_path.discard(real)
            if walk.more:
                return


def _real_dir(cm: Any, path: str) -> str | None:
    try:
        return os.path.realpath(cm._get_os_path(path))
    except Exception:  # a path the manager refuses: its own listing says so
        return None


def _enter(cm: Any, walk: _Walk, path: str) -> str | bool | None:
    """Before walking into ``path``: False when its real directory is one already being walked on the
    current path (a symlink loop) or lies outside the root; else its real path (now on the path), or None
    when the contents manager has no files on disk."""
    if walk.on_path is None or walk.real_root is None:
        return None
    real = _real_dir(cm, path)
    if real is None:
        return None
    if real in walk.on_path or os.path.commonpath([real, walk.real_root]) != walk.real_root:
        return False
    walk.on_path.add(real)
    return real


async def _listing(contents_manager: Any, path: str, *, top: bool) -> tuple[list[str], list[dict[str, Any]]]:
    """The entries of a folder sorted by name, and their names."""
    try:
        return await _get_directory(contents_manager, path)
    except Exception as e:  # the contents manager's tornado HTTPError (404 hidden or missing, 400 a file)
        status = getattr(e, "status_code", None)
        if not top and status in (400, 403, 404):
            return [], []  # vanished or unreadable while walking: skip it
        if status == 404:
            raise NotFound(f"Directory not found: {path or '/'}") from None
        if status == 400:
            raise BadRequest(f"Not a directory: {path}") from None
        if isinstance(status, int) and 400 <= status < 500:
            raise AgentToolsError(getattr(e, "log_message", None) or str(e), status) from None
        raise


def _sorted_entries(model: Any) -> tuple[list[str], list[dict[str, Any]]]:
    content = model.get("content") if isinstance(model, dict) else None
    items = [item for item in content if isinstance(item, dict)] if isinstance(content, list) else []
    items.sort(key=_name)
    return [_name(item) for item in items], items


async def _get_directory(cm: Any, path: str) -> tuple[list[str], list[dict[str, Any]]]:
    """``cm.get(path)`` as a directory, its entries sorted: in a thread for jupyter_server's own
    synchronous file contents manager (a directory of many entries is a stat per entry), as it comes
    otherwise (an async manager does its own I/O off the loop), then a turn for the other requests."""
    get = cm.get
    if not inspect.iscoroutinefunction(get) and _is_file_manager(cm):

        def fetch() -> tuple[list[str], list[dict[str, Any]]]:
            return _sorted_entries(get(path, content=True, type="directory"))

        return await asyncio.to_thread(fetch)
    model = await ensure_async(get(path, content=True, type="directory"))
    await asyncio.sleep(0)
    if isinstance(model, dict) and len(model.get("content") or ()) > 10_000:
        return await asyncio.to_thread(_sorted_entries, model)
    return _sorted_entries(model)


def _is_file_manager(cm: Any) -> bool:
    return any(
        klass.__module__ == "jupyter_server.services.contents.filemanager"
        and klass.__name__ == "FileContentsManager"
        for klass in type(cm).__mro__
    )


def _name(item: dict[str, Any]) -> str:
    return str(item.get("name") or _path(item).rsplit("/", 1)[-1])


def _path(item: dict[str, Any]) -> str:
    return str(item.get("path", ""))


def _entry(item: dict[str, Any]) -> dict[str, Any]:
    modified = item.get("last_modified")
    return {
        "path": _path(item),
        "type": str(item.get("type", "file")),
        "size": item.get("size") if isinstance(item.get("size"), int) else None,
        "last_modified": modified.isoformat() if isinstance(modified, datetime) else modified,
    }
