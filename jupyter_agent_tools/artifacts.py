"""Where spilled eval outputs live: one directory per session, files named by artifact id.

An artifact holds the full sanitized output of one cell whose visible output was truncated. Artifacts
are removed with their session and, whatever happens, after ``retention`` seconds. Each records its owner
(who ran the code) and notebook (if any): an agent reads only its own and those of notebooks inside its
paths; to anyone else it does not exist (:func:`~.auth.context.may_see`). An artifact found on disk at
start (a configured ``root_dir``) has no recorded owner: only the server's credentials and a person read it.

All artifacts together hold at most ``max_bytes``. The store keeps a running total of what it wrote (one
walk of the root at start, none after): a write that would pass the cap first removes the oldest
artifacts (never one still being written, nor one written by a call that still runs: ``running_calls``
tells which calls run); what still does not fit is cut, and the write raises :class:`ArtifactFull`.

Session names and artifact ids come from callers. Neither becomes a path before it is checked against
:data:`SESSION_DIR_NAME` (a plain file name: no separator, never ``.``/``..``, never hidden), and nothing
is removed unless it resolves to a direct child of the store's own root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol
from uuid import uuid4

from traitlets import Callable as CallableTrait
from traitlets import Float, Instance, Int, Unicode, default, validate

from .auth.context import may_see
from .errors import NotFound
from .service import Service, at_least

# The same rule as the API's session names (schemas.SESSION_NAME_PATTERN): a first character that is not
# a dot, so no name is ".", ".." or hidden.
SESSION_DIR_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")
ARTIFACT_ID = re.compile(r"^(?P<session>[A-Za-z0-9_-][A-Za-z0-9._-]{0,63})\.[0-9a-f]{32}$")


@dataclass(frozen=True)
class TextPage:
    """A page of an artifact's text: ``size`` bytes from byte ``offset`` of ``total``; ``next_offset`` is
    where the next page starts (None at the end)."""

    offset: int
    size: int
    total: int
    next_offset: int | None
    text: str


def utf8_boundary(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a character's first byte
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


class ArtifactFile(Protocol):
    """What a spill writes to: an :class:`ArtifactWriter` (or any binary file)."""

    def write(self, data: bytes | bytearray, /) -> int: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, kind: Any, value: Any, tb: Any, /) -> Any: ...


ArtifactOpener = Callable[[], tuple[str, ArtifactFile]]  # a new artifact: its id and its file


class ArtifactFull(OSError):
    """A write reached the store's cap (``max_bytes``): the artifact keeps the first ``kept`` bytes.

    ``discard()`` removes the cut artifact, for a caller that saves all or nothing.
    """

    def __init__(self, artifact_id: str, kept: int, cap: int, discard: Callable[[], None]):
        super().__init__(errno.ENOSPC, f"artifact {artifact_id} cut at {kept} bytes (artifacts' cap: {cap})")
        self.artifact_id = artifact_id
        self.kept = kept
        self.cap = cap
        self._discard = discard

    def discard(self) -> None:
        self._discard()


@dataclass
class _Entry:
    """One artifact the store counts: its session, file and bytes, and whether it is being written."""

    session: str
    path: Path
    size: int = 0
    writing: bool = False
    call: object = None  # the call of its session that created it (see ArtifactStore.running_calls)
    owner: str | None = None  # who created it (None: unknown, e.g. found on disk at start)
    notebook: str | None = None  # the notebook whose cell spilled it


class ArtifactWriter:
    """A new artifact's file open for writing (binary); each write is counted against the cap first."""

    def __init__(self, store: ArtifactStore, artifact_id: str, path: Path):
        self.artifact_id = artifact_id
        self._store = store
        self._handle = path.open("wb")
        self.written = 0
        self.cut = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` whole, or what fits under the cap and raise :class:`ArtifactFull`."""
        size = len(data)
        granted = 0 if self.cut else self._store._reserve(self.artifact_id, size)
        if granted < size:  # cut on a character boundary: artifacts are UTF-8 text
            whole = granted
            while whole and data[whole] & 0xC0 == 0x80:
                whole -= 1
            self._store._unreserve(self.artifact_id, granted - whole)
            granted = whole
        if granted:
            try:
                self._handle.write(data if granted == size else memoryview(data)[:granted])
            except OSError:
                self._store._unreserve(self.artifact_id, granted)
                raise
            self.written += granted
        if granted < size:
            self.cut = True
            raise ArtifactFull(self.artifact_id, self.written, self._store.max_bytes, self.discard)
        return size

    def restart(self) -> None:
        """Empty the artifact to be written again (what it held was cleared); its bytes are no longer
        counted against the cap."""
        self._handle.seek(0)
        self._handle.truncate()
        self._store._unreserve(self.artifact_id, self.written)
        self.written, self.cut = 0, False

    def flush(self) -> None:
        """Hand what was written to the file system, so that a reader of the file sees it."""
        if not self._handle.closed:
            self._handle.flush()

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()
            self._store._written(self.artifact_id)

    def discard(self) -> None:
        """Close and remove this artifact."""
        self.close()
        self._store._remove(self.artifact_id)

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ArtifactStore(Service):
    """Creates, reads and removes artifact files under one root directory.

    ``ArtifactStore(root=path)``, or ``ArtifactStore(parent=app)`` for the directory configured as
    ``c.ArtifactStore.root_dir``; the application builds the class named by
    ``AgentToolsApp.artifact_store_class``. Thread-safe: a
    spill may be written from a worker thread.
    """

    root_dir = Unicode(
        "",
        help="Directory for spilled outputs (artifacts). Empty: a private temporary directory removed "
        "when the server stops.",
    ).tag(config=True)
    root = Instance(Path, help="The directory holding one subdirectory per session (default: root_dir).")
    retention = Float(
        24 * 3600.0, help="Seconds an artifact is kept at most (it also goes with its session; 0: forever)."
    ).tag(config=True)
    max_bytes = Int(
        1024**3,
        help="Bytes all artifacts hold at most. A spill that would pass it first removes the oldest "
        "artifacts of idle sessions (never those of a running call); what still does not fit is cut, and "
        "the cell's notice says its artifact is incomplete. 0: no cap.",
    ).tag(config=True)
    running_calls = CallableTrait(
        None,
        allow_none=True,
        help="Returns {session name: a token of its running call} (any object, the same for the whole "
        "call); the cap never removes what a running call wrote. Called from any thread; the session "
        "manager sets it.",
    )
    session_owner = CallableTrait(
        None,
        allow_none=True,
        help="Returns (owner, notebook path or None) of a session by name, or None for one it does not "
        "know: the owner and notebook an artifact of that session records. The session manager sets it.",
    )

    owns_root = False  # True: a private temporary directory, removed by remove_all at server stop

    @default("root")
    def _default_root(self) -> Path:
        if self.root_dir:
            return Path(self.root_dir)
        self.owns_root = True
        return Path(tempfile.mkdtemp(prefix="jupyter-agent-artifacts-"))

    @validate("retention")
    def _valid_retention(self, proposal: Any) -> float:
        return float(at_least(proposal, 0))

    @validate("max_bytes")
    def _valid_max_bytes(self, proposal: Any) -> int:
        return int(at_least(proposal, 0))

    def __init__(self, **kwargs: Any):
        if kwargs.get("root") is not None:
            kwargs["root"] = Path(kwargs["root"])
        super().__init__(**kwargs)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._real_root = self.root.resolve()
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}  # by artifact id, oldest first
        self._total = 0
        self.removed_for_cap = 0  # artifacts removed to stay under max_bytes
        self._index_existing()

    @property
    def total_bytes(self) -> int:
        """Bytes the store's artifacts hold (its running total)."""
        return self._total

    def session_path(self, session: str) -> Path:
        """Where one session's artifacts live (also exported to its kernel as ``ARTIFACTS``)."""
        if not SESSION_DIR_NAME.match(session):
            raise ValueError(f"not a session name that can name a directory: {session!r}")
        return self.root / session

    def session_dir(self, session: str) -> Path:
        """:meth:`session_path`, created if missing."""
        path = self.session_path(session)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self._owns(path, depth=1):
            raise OSError(f"artifact directory {path} does not resolve inside {self.root}")
        return path

    def create(self, session: str, owner: str | None = None) -> tuple[str, ArtifactWriter]:
        """A new artifact of ``session``: its id and its file open for writing. It records ``owner`` (by
        default the session's, see ``session_owner``) and the session's notebook."""
        artifact_id = f"{session}.{uuid4().hex}"
        path = self.session_dir(session) / f"{artifact_id}.txt"
        call = self.running_calls().get(session) if self.running_calls is not None else None
        known = self.session_owner(session) if self.session_owner is not None else None
        notebook = known[1] if known else None
        if owner is None and known:
            owner = known[0]
        entry = _Entry(session, path, writing=True, call=call, owner=owner, notebook=notebook)
        with self._lock:
            self._entries[artifact_id] = entry
        try:
            return artifact_id, ArtifactWriter(self, artifact_id, path)
        except OSError:
            self._remove(artifact_id)
            raise

    def path(self, artifact_id: str) -> Path:
        """The file of an artifact, or :class:`NotFound`."""
        match = ARTIFACT_ID.match(artifact_id)
        if match is None:
            raise NotFound(f"Artifact not found: {artifact_id}")
        path = self.root / match["session"] / f"{artifact_id}.txt"
        if not path.is_file() or not self._owns(path, depth=2):
            raise NotFound(
                f"Artifact not found: {artifact_id} (artifacts are removed with their session, after "
                "ArtifactStore.retention, and oldest first past ArtifactStore.max_bytes)"
            )
        return path

    def readable_path(self, artifact_id: str) -> Path:
        """:meth:`path` of an artifact the request being served may read (an agent: its own, or of a
        notebook inside its paths), else :class:`NotFound` as for a missing one."""
        with self._lock:
            entry = self._entries.get(artifact_id)
        owner, notebook = (entry.owner, entry.notebook) if entry is not None else (None, None)
        if not may_see(owner, notebook):
            raise NotFound(f"Artifact not found: {artifact_id}")
        return self.path(artifact_id)

    def size(self, artifact_id: str) -> int:
        """A readable artifact's size in bytes, or :class:`NotFound`."""
        return self.readable_path(artifact_id).stat().st_size

    def read_range(self, artifact_id: str, offset: int, limit: int) -> tuple[bytes, int]:
        """Up to ``limit`` bytes of a readable artifact from byte ``offset``, and its size in bytes."""
        with self.readable_path(artifact_id).open("rb") as handle:
            total = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, offset))
            return handle.read(max(0, limit)), total

    def read_text_page(self, artifact_id: str, offset: int, limit: int) -> TextPage:
        """Up to ``limit`` bytes of an artifact as text from about byte ``offset``, never cutting a UTF-8
        character: a page that starts inside one begins at the next, one that would end inside one ends
        before it (``next_offset`` continues exactly there)."""
        data, total = self.read_range(artifact_id, offset, limit)
        start = 0
        while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:
            start += 1  # an offset inside a character: begin at the next one
        begin = min(max(0, offset), total) + start
        data = data[start:]
        end = len(data) if begin + len(data) >= total else utf8_boundary(data)
        return TextPage(
            offset=begin,
            size=end,
            total=total,
            next_offset=begin + end if begin + end < total else None,
            text=data[:end].decode("utf-8", errors="replace"),
        )

    def remove_session(self, session: str) -> None:
        """Remove every artifact of a session (its directory, only if it is really ours)."""
        path = self.session_path(session)
        if path.is_symlink():
            path.unlink(missing_ok=True)  # the link itself lives in our root; never what it points to
        elif path.is_dir() and self._owns(path, depth=1):
            shutil.rmtree(path, ignore_errors=True)
        with self._lock:
            for artifact_id in [i for i, e in self._entries.items() if e.session == session]:
                self._total -= self._entries.pop(artifact_id).size

    def discard_if_empty(self, session: str) -> None:
        """Remove a session's directory when it holds no artifact (per-call runs that spilled nothing)."""
        with contextlib.suppress(OSError, ValueError):
            self.session_path(session).rmdir()

    def sweep(self, now: float | None = None, keep: Collection[str] = ()) -> int:
        """Remove artifacts older than the retention, and emptied directories of sessions not in
        ``keep``; return how many artifacts were removed."""
        if self.retention <= 0:
            return 0
        cutoff = (now if now is not None else time.time()) - self.retention
        removed = 0
        for directory in self.root.iterdir():
            if directory.is_symlink() or not directory.is_dir() or not SESSION_DIR_NAME.match(directory.name):
                continue
            for path in directory.glob("*.txt"):
                with contextlib.suppress(OSError):
                    if not path.is_symlink() and path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
                        self._forget(path.stem)
            if directory.name not in keep:
                with contextlib.suppress(OSError):
                    directory.rmdir()  # only when empty
        return removed

    def remove_all(self) -> None:
        """Remove the whole store (at server shutdown, when the server created the root itself)."""
        shutil.rmtree(self.root, ignore_errors=True)
        with self._lock:
            self._entries.clear()
            self._total = 0

    # -- the cap -----------------------------------------------------------------------------------

    def _index_existing(self) -> None:
        """Count the artifacts already in the root (a server restarted on the same directory), oldest
        first, and apply the cap to them."""
        found: list[tuple[float, str, _Entry]] = []
        for directory in self.root.iterdir():
            if directory.is_symlink() or not directory.is_dir() or not SESSION_DIR_NAME.match(directory.name):
                continue
            for path in directory.glob("*.txt"):
                match = ARTIFACT_ID.match(path.stem)
                if match is None or match["session"] != directory.name:
                    continue
                with contextlib.suppress(OSError):
                    info = path.lstat()
                    if stat.S_ISREG(info.st_mode):  # not a link
                        found.append((info.st_mtime, path.stem, _Entry(directory.name, path, info.st_size)))
        found.sort(key=lambda item: item[0])
        with self._lock:
            for _, artifact_id, entry in found:
                self._entries[artifact_id] = entry
                self._total += entry.size
            if self.max_bytes and self._total > self.max_bytes:
                self._make_room(self._total - self.max_bytes)

    def _reserve(self, artifact_id: str, size: int) -> int:
        """Count ``size`` more bytes for an artifact being written, making room if needed; how many of
        them fit under the cap."""
        with self._lock:
            entry = self._entries.get(artifact_id)
            if entry is None:  # its session was removed meanwhile: the file is gone, nothing to count
                return size
            if self.max_bytes:
                over = self._total + size - self.max_bytes
                if over > 0:
                    self._make_room(over)
                size = max(0, min(size, self.max_bytes - self._total))
            entry.size += size
            self._total += size
            return size

    def _unreserve(self, artifact_id: str, size: int) -> None:
        with self._lock:
            entry = self._entries.get(artifact_id)
            if entry is not None:
                entry.size -= size
                self._total -= size

    def _written(self, artifact_id: str) -> None:
        with self._lock:
            entry = self._entries.get(artifact_id)
            if entry is not None:
                entry.writing = False

    def _remove(self, artifact_id: str) -> None:
        with self._lock:
            entry = self._entries.pop(artifact_id, None)
            if entry is not None:
                self._total -= entry.size
                self._unlink(entry.path)

    def _forget(self, artifact_id: str) -> None:
        with self._lock:
            entry = self._entries.pop(artifact_id, None)
            if entry is not None:
                self._total -= entry.size

    def _make_room(self, needed: int) -> None:
        """Remove the oldest artifacts but those of running calls until ``needed`` bytes are free (or
        nothing is left to remove). Called with the lock held."""
        running = dict(self.running_calls()) if self.running_calls is not None else {}
        victims: list[str] = []
        freed = 0
        for artifact_id, entry in self._entries.items():
            if freed >= needed:
                break
            if entry.writing or (entry.call is not None and running.get(entry.session) is entry.call):
                continue
            victims.append(artifact_id)
            freed += entry.size
        for artifact_id in victims:
            entry = self._entries.pop(artifact_id)
            self._total -= entry.size
            self._unlink(entry.path)
        if victims:
            self.removed_for_cap += len(victims)
            self.log.info(
                "removed %d artifact(s) (%d bytes, oldest first) to stay under max_bytes=%d",
                len(victims),
                freed,
                self.max_bytes,
            )

    def _unlink(self, path: Path) -> None:
        """Remove an artifact file, only if it is really ours (never through a linked directory)."""
        with contextlib.suppress(OSError):
            if not path.is_symlink() and self._owns(path, depth=2):
                path.unlink()

    def _owns(self, path: Path, depth: int) -> bool:
        """Whether ``path`` resolves to ``depth`` levels below the store's root (resolve, then check)."""
        real = path.resolve()
        return len(real.parts) == len(self._real_root.parts) + depth and real.is_relative_to(self._real_root)
