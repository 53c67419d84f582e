"""Where spilled eval outputs live: one directory per session, files named by artifact id.

An artifact holds the full sanitized output of one cell whose visible output was truncated. Artifacts
are removed with their session and, whatever happens, after ``retention`` seconds.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from pathlib import Path
from typing import BinaryIO
from uuid import uuid4

from .errors import NotFound

ARTIFACT_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}\.[0-9a-f]{32}$")


class ArtifactStore:
    """Creates, reads and removes artifact files under one root directory."""

    def __init__(self, root: str | os.PathLike[str], retention: float = 24 * 3600):
        self.root = Path(root)
        self.retention = retention
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def session_path(self, session: str) -> Path:
        """Where one session's artifacts live (also exported to its kernel as ``ARTIFACTS``)."""
        return self.root / session

    def session_dir(self, session: str) -> Path:
        """:meth:`session_path`, created if missing."""
        path = self.session_path(session)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def create(self, session: str) -> tuple[str, BinaryIO]:
        """A new artifact of ``session``: its id and a binary file open for writing."""
        artifact_id = f"{session}.{uuid4().hex}"
        handle = (self.session_dir(session) / f"{artifact_id}.txt").open("wb")
        return artifact_id, handle

    def path(self, artifact_id: str) -> Path:
        """The file of an artifact, or :class:`NotFound`."""
        if not ARTIFACT_ID.match(artifact_id):
            raise NotFound(f"Artifact not found: {artifact_id}")
        session = artifact_id.rsplit(".", 1)[0]
        path = self.root / session / f"{artifact_id}.txt"
        if not path.is_file():
            raise NotFound(f"Artifact not found: {artifact_id} (artifacts are removed with their session)")
        return path

    def remove_session(self, session: str) -> None:
        """Remove every artifact of a session."""
        shutil.rmtree(self.root / session, ignore_errors=True)

    def sweep(self, now: float | None = None) -> int:
        """Remove artifacts older than the retention; return how many were removed."""
        if self.retention <= 0:
            return 0
        cutoff = (now if now is not None else time.time()) - self.retention
        removed = 0
        for path in self.root.glob("*/*.txt"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
        return removed

    def remove_all(self) -> None:
        """Remove the whole store (at server shutdown)."""
        shutil.rmtree(self.root, ignore_errors=True)
