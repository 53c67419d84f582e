"""Where spilled eval outputs live: one directory per session, files named by artifact id.

An artifact holds the full sanitized output of one cell whose visible output was truncated. Artifacts
are removed with their session and, whatever happens, after ``retention`` seconds.

Session names and artifact ids come from callers. Neither becomes a path before it is checked against
:data:`SESSION_DIR_NAME` (a plain file name: no separator, never ``.``/``..``, never hidden), and nothing
is removed unless it resolves to a direct child of the store's own root.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any, BinaryIO
from uuid import uuid4

from traitlets import Float, Instance, validate

from .errors import NotFound
from .traits import Service, at_least, given

# The same rule as the API's session names (schemas.SESSION_NAME_PATTERN): a first character that is not
# a dot, so no name is ".", ".." or hidden.
SESSION_DIR_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")
ARTIFACT_ID = re.compile(r"^(?P<session>[A-Za-z0-9_-][A-Za-z0-9._-]{0,63})\.[0-9a-f]{32}$")


class ArtifactStore(Service):
    """Creates, reads and removes artifact files under one root directory.

    ``ArtifactStore(root)`` or ``ArtifactStore(parent=app, root=root, retention=...)``; the application
    builds the class named by ``AgentToolsApp.artifact_store_class``.
    """

    root = Instance(Path, help="The directory holding one subdirectory per session.")
    retention = Float(24 * 3600.0, help="Seconds an artifact is kept at most (0: until its session goes).")

    @validate("retention")
    def _valid_retention(self, proposal: Any) -> float:
        return float(at_least(proposal, 0))

    def __init__(
        self, root: str | os.PathLike[str] | None = None, retention: float | None = None, **kwargs: Any
    ):
        kwargs = given(kwargs, root=root, retention=retention)
        if "root" in kwargs:
            kwargs["root"] = Path(kwargs["root"])
        super().__init__(**kwargs)
        if self.root is None:
            raise TypeError("ArtifactStore needs a root directory")
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._real_root = self.root.resolve()

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

    def create(self, session: str) -> tuple[str, BinaryIO]:
        """A new artifact of ``session``: its id and a binary file open for writing."""
        artifact_id = f"{session}.{uuid4().hex}"
        handle = (self.session_dir(session) / f"{artifact_id}.txt").open("wb")
        return artifact_id, handle

    def path(self, artifact_id: str) -> Path:
        """The file of an artifact, or :class:`NotFound`."""
        match = ARTIFACT_ID.match(artifact_id)
        if match is None:
            raise NotFound(f"Artifact not found: {artifact_id}")
        path = self.root / match["session"] / f"{artifact_id}.txt"
        if not path.is_file() or not self._owns(path, depth=2):
            raise NotFound(f"Artifact not found: {artifact_id} (artifacts are removed with their session)")
        return path

    def read_range(self, artifact_id: str, offset: int, limit: int) -> tuple[bytes, int]:
        """Up to ``limit`` bytes of an artifact from byte ``offset``, and the artifact's size in bytes."""
        with self.path(artifact_id).open("rb") as handle:
            total = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, offset))
            return handle.read(max(0, limit)), total

    def remove_session(self, session: str) -> None:
        """Remove every artifact of a session (its directory, only if it is really ours)."""
        path = self.session_path(session)
        if path.is_symlink():
            path.unlink(missing_ok=True)  # the link itself lives in our root; never what it points to
        elif path.is_dir() and self._owns(path, depth=1):
            shutil.rmtree(path, ignore_errors=True)

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
            if directory.name not in keep:
                with contextlib.suppress(OSError):
                    directory.rmdir()  # only when empty
        return removed

    def remove_all(self) -> None:
        """Remove the whole store (at server shutdown, when the server created the root itself)."""
        shutil.rmtree(self.root, ignore_errors=True)

    def _owns(self, path: Path, depth: int) -> bool:
        """Whether ``path`` resolves to ``depth`` levels below the store's root (resolve, then check)."""
        real = path.resolve()
        return len(real.parts) == len(self._real_root.parts) + depth and real.is_relative_to(self._real_root)
