"""List notebooks, files and directories under a directory of the server root, through the contents manager.

The contents manager decides what exists and what may be seen: paths outside the root and hidden files or
directories (unless ``allow_hidden``) are not listed, and ``hide_globs`` apply, exactly as in
``/api/contents`` and JupyterLab's file browser.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime
from typing import Any

from jupyter_core.utils import ensure_async

from .auth.context import current_paths
from .errors import AgentToolsError, BadRequest, NotFound

MAX_LIMIT = 5000


async def list_files(
    contents_manager: Any, path: str = "", *, recursive: bool = False, limit: int = 500
) -> dict[str, Any]:
    """``{"path", "entries": [{"path", "type", "size", "last_modified"}], "truncated"}``, sorted by path.

    ``type`` is ``notebook``, ``file`` or ``directory``. With ``recursive``, subdirectories are walked
    breadth-first until ``limit`` entries are listed (``truncated`` then says more exist).
    """
    path = path.strip("/")
    limit = max(1, min(limit, MAX_LIMIT))
    scope = current_paths()  # an agent token's path globs: only what lies inside them is listed
    root = getattr(contents_manager, "root_dir", None)
    if scope is not None and not scope.allows(path, root):
        raise NotFound(f"Directory not found: {path or '/'}")
    entries: list[dict[str, Any]] = []
    pending = deque([path])
    truncated = False
    while pending:
        directory = pending.popleft()
        for item in sorted(await _listing(contents_manager, directory, top=directory == path), key=_path):
            if scope is not None and not scope.allows(_path(item), root):
                continue
            if len(entries) >= limit:
                truncated = True
                break
            entries.append(_entry(item))
            if recursive and item.get("type") == "directory":
                pending.append(str(item.get("path", "")))
        if truncated:
            break
    return {"path": path, "entries": entries, "truncated": truncated}


async def _listing(contents_manager: Any, path: str, *, top: bool) -> list[dict[str, Any]]:
    try:
        model = await ensure_async(contents_manager.get(path, content=True, type="directory"))
    except Exception as e:  # the contents manager's tornado HTTPError (404 hidden or missing, 400 a file)
        status = getattr(e, "status_code", None)
        if not top and status in (400, 403, 404):
            return []  # vanished or unreadable while walking: skip it
        if status == 404:
            raise NotFound(f"Directory not found: {path or '/'}") from None
        if status == 400:
            raise BadRequest(f"Not a directory: {path}") from None
        if isinstance(status, int) and 400 <= status < 500:
            raise AgentToolsError(getattr(e, "log_message", None) or str(e), status) from None
        raise
    content = model.get("content")
    return [item for item in content if isinstance(item, dict)] if isinstance(content, list) else []


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
