"""Find notebooks, files and directories under a folder of the server root, a page at a time.

What is listed is what the contents manager would list, and less: paths outside the root and hidden files
or folders (unless ``allow_hidden``) are not, ``hide_globs`` apply, as in ``/api/contents`` and
JupyterLab's file browser; an agent token's path globs limit it further; and what the project's ignore
files exclude (``.gitignore``, ``.ignore``: :mod:`.ignore`) is skipped without walking into it, unless
``ignored``. On a local disk (jupyter_server's file contents managers) folders are read directly with the
rules of the manager's own listing (:class:`_Disk`: one ``lstat`` per entry examined, where the manager
builds a model and emits an event per entry); any other contents manager is asked folder by folder on the
event loop (:class:`_Manager`), and has no ignore files.

A walk is depth-first, each folder's entries sorted by name, so a page resumes after the last path the
previous page examined (``start`` = its ``next_start``) without walking what came before again. The whole
walk runs in a worker thread (at most :data:`MAX_WALKS` at once and :data:`MAX_WAITING` waiting, else
503), globs are matched without backtracking (:mod:`.globs`) and prune the folders nothing below can
match, and a call stops after :data:`MAX_SCANNED` entries or :data:`MAX_SECONDS`, answering what it found
with ``next_start`` (``stopped: "budget"``).
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import os
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from jupyter_core.paths import is_file_hidden
from jupyter_core.utils import ensure_async

from .auth.context import current_paths
from .auth.paths import PathScope, clean_glob, normalize
from .compat import ServerHTTPError, local_os_path
from .errors import RETRY_AFTER_MOMENT, AgentToolsError, BadRequest, NotFound, Unavailable
from .globs import Glob, GlobError
from .ignore import IGNORE_FILES, MAX_IGNORE_BYTES, IgnoreRules, Ignores

MAX_LIMIT = 5000
MAX_DEPTH = 100
MAX_SCANNED = 100_000  # entries one call examines at most (it stops early past it, with next_start)
MAX_SECONDS = 2.0  # time one call walks at most (likewise)
MAX_START_CHARS = 4096
MAX_WALKS = 2  # walks running at once, each in a thread of its own
MAX_WAITING = 16  # walks waiting for a thread; more answer 503
MANAGER_TIMEOUT = 60.0  # seconds a contents manager that is not a local disk may take to list a folder
_T = TypeVar("_T")


@dataclass(frozen=True)
class _Item:
    """One entry of a folder, as the listing answers it."""

    name: str
    path: str
    type: str  # notebook, file or directory
    size: int | None
    last_modified: str | None

    @property
    def is_dir(self) -> bool:
        return self.type == "directory"

    def entry(self) -> dict[str, Any]:
        return {"path": self.path, "type": self.type, "size": self.size, "last_modified": self.last_modified}


@dataclass
class _Listing:
    """A folder's entry names sorted, and each entry on demand (None: not listed)."""

    names: list[str]
    item: Callable[[int], _Item | None]


@dataclass
class _Walk:
    """The state of one listing: what to match, what was found, where it stopped."""

    top: str
    glob: Glob | None
    max_depth: int
    limit: int
    scope: PathScope | None
    root: str | None
    ignores: Ignores | None  # None: ignore files are not applied (``ignored``)
    deadline: float
    entries: list[dict[str, Any]] = field(default_factory=list)
    scanned: int = 0
    last: str | None = None  # the last path examined
    stopped: str | None = None  # "limit" (the page is full) or "budget" (entries or time ran out)
    real_root: str | None = None  # the root's real path (local disks only)
    on_path: set[str] = field(default_factory=set)  # real paths of the folders being walked, top to current


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
    ignored: bool = False,
) -> dict[str, Any]:
    """``{"path", "entries": [{"path", "type", "size", "last_modified"}], "truncated", "next_start",
    "stopped"}``.

    ``type`` is ``notebook``, ``file`` or ``directory``. Without ``recursive``, ``glob`` or ``max_depth``,
    the directory's own entries; otherwise its subdirectories too, down to ``max_depth`` levels (1: the
    directory's own entries). ``glob`` (``*``, ``?``, ``[...]``, ``**`` for any number of folders) is
    matched against each path relative to ``path``: ``**/*.ipynb`` is every notebook below it. At most
    ``limit`` entries; ``truncated`` then says more may exist and ``next_start`` is the ``start`` of the
    next page (the last path examined); ``stopped`` says why: ``limit`` or ``budget``. With ``ignored``,
    what the ignore files exclude is listed too.

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
            pattern = Glob(clean_glob(glob))
        except GlobError as e:
            raise BadRequest(f"'glob': {e}") from None
    depth = max_depth or (MAX_DEPTH if recursive or glob is not None else 1)
    if pattern is not None and max_depth is None and "**" not in pattern.text.split("/"):
        depth = len(pattern.text.split("/"))  # a glob without ** names a fixed depth
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
    await _check_folder(contents_manager, path)
    source: _Disk | _Manager
    if _is_file_manager(contents_manager) and local_os_path(contents_manager, path) is not None:
        source = _Disk(contents_manager)
    else:
        source = _Manager(contents_manager, asyncio.get_running_loop())
    walk = _Walk(
        path,
        pattern,
        depth,
        limit,
        scope,
        root if isinstance(root, str) else None,
        None if ignored else Ignores(),
        deadline=time.monotonic() + MAX_SECONDS,
    )
    await _in_thread(lambda: _walk_from_top(source, walk, cursor))
    return {
        "path": path,
        "entries": walk.entries,
        "truncated": walk.stopped is not None,
        "next_start": walk.last if walk.stopped else None,
        "stopped": walk.stopped,
    }


class _Threads:
    """The walks' worker threads, and how many walks run or wait for one."""

    executor = ThreadPoolExecutor(max_workers=MAX_WALKS, thread_name_prefix="agent-tools-files")
    busy = 0


async def _in_thread(work: Callable[[], _T]) -> _T:
    """``work()`` in a walk thread (with this context: the caller's agent token), or 503 when
    :data:`MAX_WAITING` walks already wait for one."""
    if _Threads.busy >= MAX_WALKS + MAX_WAITING:
        raise Unavailable(
            f"{_Threads.busy} file searches are running or waiting; retry in a moment",
            retry_after=RETRY_AFTER_MOMENT,
        )
    _Threads.busy += 1
    try:
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(_Threads.executor, context.run, work)
    finally:
        _Threads.busy -= 1


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


async def _check_folder(cm: Any, path: str) -> None:
    """404 unless the contents manager shows ``path`` as a folder (hidden ones too), 400 for a file."""
    try:
        await ensure_async(cm.get(path, content=False, type="directory"))
    except Exception as e:
        # broad: a contents manager of any kind (HTTPError 404/400, its own errors): the status says which
        status = getattr(e, "status_code", None)
        if status == 404:
            raise NotFound(f"Directory not found: {path or '/'}") from None
        if status == 400:
            raise BadRequest(f"Not a directory: {path}") from None
        if isinstance(status, int) and 400 <= status < 500:
            raise AgentToolsError(getattr(e, "log_message", None) or str(e), status) from None
        raise


# ------------------------------------------------------------------------------------------- the walk


def _walk_from_top(source: _Disk | _Manager, walk: _Walk, cursor: list[str]) -> None:
    """The walk (in a worker thread): the ignore files of the top's parents, then the top."""
    walk.real_root = source.real_dir("")
    top_real = source.real_dir(walk.top)
    if top_real is not None:
        walk.on_path.add(top_real)
    if walk.ignores is not None:
        parts = walk.top.split("/") if walk.top else []
        for n in range(len(parts)):
            folder = "/".join(parts[:n])
            walk.ignores.push(folder, source.ignore_rules(folder))
    _walk(source, walk, walk.top, 1, cursor, walk.glob.start() if walk.glob else 0)


def _spent(walk: _Walk) -> bool:
    if len(walk.entries) >= walk.limit:
        walk.stopped = "limit"
    elif walk.scanned >= MAX_SCANNED or (walk.scanned and time.monotonic() >= walk.deadline):
        walk.stopped = "budget"
    return walk.stopped is not None


def _walk(
    source: _Disk | _Manager, walk: _Walk, folder: str, depth: int, cursor: list[str], states: int
) -> None:
    """List ``folder`` (at ``depth``, glob state ``states``) and, depth-first, its subfolders; entries
    before ``cursor`` (the path a previous page stopped at, as segments relative to this folder) are
    skipped."""
    listing = source.listing(folder)
    ignores = walk.ignores
    pushed = ignores is not None and ignores.push(folder, source.ignore_rules(folder))
    try:
        first = bisect.bisect_left(listing.names, cursor[0]) if cursor else 0  # what a page went past
        for i in range(first, len(listing.names)):
            if _spent(walk):
                return
            name = listing.names[i]
            resumed = bool(cursor) and name == cursor[0]  # a path the previous page examined
            after = cursor[1:] if resumed else []
            item = listing.item(i)
            walk.scanned += not resumed  # each call examines one new entry at least: it goes on
            if item is None or (walk.scope is not None and not walk.scope.allows(item.path, walk.root)):
                continue
            if ignores is not None and ignores.ignored(item.path, name, item.is_dir):
                walk.last = item.path if not after else walk.last
                continue  # never walked into
            inner = walk.glob.step(states, name) if walk.glob is not None else 0
            if not resumed:
                walk.last = item.path
                if walk.glob is None or walk.glob.accepts(inner):
                    walk.entries.append(item.entry())
            elif not after:
                walk.last = item.path
            if not item.is_dir or depth >= walk.max_depth:
                continue
            if walk.glob is not None and not walk.glob.may_contain(inner):
                continue  # nothing below it can match
            real = _enter(source, walk, item.path)
            if real is False:
                continue  # a symlink to a folder being walked (a loop) or outside the root
            try:
                _walk(source, walk, item.path, depth + 1, after, inner)
            finally:
                if isinstance(real, str):
                    walk.on_path.discard(real)
            if walk.stopped:
                return
    finally:
        if pushed and ignores is not None:
            ignores.pop()


def _enter(source: _Disk | _Manager, walk: _Walk, path: str) -> str | bool | None:
    """Before walking into ``path``: False when its real folder is one already being walked on the
    current path (a symlink loop) or lies outside the root; else its real path (now on the path), or None
    when the contents manager has no files on disk."""
    if walk.real_root is None:
        return None
    real = source.real_dir(path)
    if real is None:
        return None
    if real in walk.on_path or os.path.commonpath([real, walk.real_root]) != walk.real_root:
        return False
    walk.on_path.add(real)
    return real


# ------------------------------------------------------------------------------------------ sources


class _Disk:
    """Folders of a local disk, listed by the rules of jupyter_server's file contents managers' own
    listing (``_dir_model``): regular files, folders and symlinks only, ``should_list`` (``hide_globs``),
    and unless ``allow_hidden`` not ``is_file_hidden``; entries as its models (type by ``isdir`` and the
    ``.ipynb`` suffix, size and time of ``lstat``)."""

    def __init__(self, cm: Any):
        self.cm = cm
        self.allow_hidden = bool(getattr(cm, "allow_hidden", False))

    def os_path(self, path: str) -> str | None:
        try:
            return local_os_path(self.cm, path)
        except ServerHTTPError:  # a path the manager refuses (outside the root)
            return None

    def real_dir(self, path: str) -> str | None:
        os_path = self.os_path(path)
        return os.path.realpath(os_path) if os_path is not None else None

    def listing(self, folder: str) -> _Listing:
        os_dir = self.os_path(folder)
        try:
            names = sorted(os.listdir(os_dir)) if os_dir is not None else []
        except OSError:  # vanished or unreadable while walking: nothing in it
            names = []
        return _Listing(names, lambda i: self._item(folder, os_dir or "", names[i]))

    def _item(self, folder: str, os_dir: str, name: str) -> _Item | None:
        os_path = os.path.join(os_dir, name)
        try:
            st = os.lstat(os_path)
            if not (stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                return None
            if not self.cm.should_list(name):
                return None
            if not self.allow_hidden and is_file_hidden(os_path, stat_res=st):
                return None
            is_dir = stat.S_ISDIR(st.st_mode) or (stat.S_ISLNK(st.st_mode) and os.path.isdir(os_path))
        except (OSError, ValueError):  # vanished, unreadable, a name the file system refuses
            return None
        kind = "directory" if is_dir else "notebook" if name.endswith(".ipynb") else "file"
        try:
            modified: str | None = datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat()
        except (ValueError, OverflowError, OSError):
            modified = datetime(1970, 1, 1, tzinfo=timezone.utc).isoformat()
        path = f"{folder}/{name}" if folder else name
        return _Item(name, path, kind, None if is_dir else st.st_size, modified)

    def ignore_rules(self, folder: str) -> IgnoreRules:
        """The rules of ``folder``'s ignore files (regular files only, their first bytes)."""
        os_dir = self.os_path(folder)
        texts: list[str] = []
        if os_dir is None:
            return IgnoreRules(texts)
        for name in IGNORE_FILES:
            try:  # not through a symlink (git does not follow one either)
                fd = os.open(os.path.join(os_dir, name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError:
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    texts.append(os.read(fd, MAX_IGNORE_BYTES).decode("utf-8", errors="replace"))
            except OSError:
                pass
            finally:
                os.close(fd)
        return IgnoreRules(texts)


class _Manager:
    """Folders of any other contents manager, each listed by its ``get`` on the event loop."""

    def __init__(self, cm: Any, loop: asyncio.AbstractEventLoop):
        self.cm = cm
        self.loop = loop

    def real_dir(self, path: str) -> str | None:
        return None

    def ignore_rules(self, folder: str) -> IgnoreRules:
        return IgnoreRules(())  # its hidden files are not listed, and it may have no files at all

    def listing(self, folder: str) -> _Listing:
        async def get() -> Any:
            return await ensure_async(self.cm.get(folder, content=True, type="directory"))

        try:
            model = asyncio.run_coroutine_threadsafe(get(), self.loop).result(MANAGER_TIMEOUT)
        except Exception:
            # broad: vanished, unreadable or too slow while walking (any contents manager): nothing in it
            model = None
        content = model.get("content") if isinstance(model, dict) else None
        items = [_model_item(m) for m in content if isinstance(m, dict)] if isinstance(content, list) else []
        items.sort(key=lambda item: item.name)
        return _Listing([item.name for item in items], items.__getitem__)


def _model_item(model: dict[str, Any]) -> _Item:
    path = str(model.get("path", ""))
    modified = model.get("last_modified")
    kind = str(model.get("type", "file"))
    return _Item(
        str(model.get("name") or path.rsplit("/", 1)[-1]),
        path,
        kind if kind in ("notebook", "file", "directory") else "file",
        model.get("size") if isinstance(model.get("size"), int) else None,
        modified.isoformat() if isinstance(modified, datetime) else modified,
    )


def _is_file_manager(cm: Any) -> bool:
    return any(
        klass.__module__ == "jupyter_server.services.contents.filemanager"
        and klass.__name__ in ("FileContentsManager", "AsyncFileContentsManager")
        for klass in type(cm).__mro__
    )
