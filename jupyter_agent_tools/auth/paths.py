"""The path globs of an agent token: which files and directories under the server root it reaches.

A glob is matched against a root-relative POSIX path, segment by segment: ``*`` and ``?`` stay within one
segment, ``[abc]``/``[!abc]`` are character classes, and a ``**`` segment matches any number of segments,
none included (``reports/**`` reaches the directory ``reports`` and everything under it; ``**/*.ipynb``
every notebook), by :mod:`jupyter_agent_tools.globs` (file search's matcher too, in linear time). A
request path is normalized first (empty and ``.`` segments dropped, ``..`` applied; a path that climbs
above the root reaches nothing), and with a local root the path a symlink leads to must match as well.

:func:`place` is the one path resolution of the agent limits (token paths and the approval rules alike):
where a request path is, the way the contents manager opens it (joined to the root, links followed), or
None when it cannot be placed, which every caller treats as "denied" (fail closed).
Pure except :func:`place`, which asks the file system where symlinks lead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..globs import MAX_GLOB_CHARS, Glob, GlobError

__all__ = [
    "MAX_GLOBS",
    "MAX_GLOB_CHARS",
    "GlobError",
    "PathScope",
    "clean_glob",
    "normalize",
    "place",
]

MAX_GLOBS = 32


def normalize(path: str) -> str | None:
    """``path`` as a root-relative POSIX path (``""`` is the root), or None when it climbs above the root
    or holds a NUL."""
    if "\x00" in path:
        return None
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def clean_glob(glob: str) -> str:
    """``glob`` as stored: leading ``/`` and ``./`` and empty segments dropped. Raises :class:`GlobError`
    for an empty glob, a NUL, a ``..`` segment, or one longer than :data:`MAX_GLOB_CHARS`."""
    if not isinstance(glob, str) or not glob.strip():
        raise GlobError("a path glob must be a non-empty string, e.g. 'reports/**'")
    if len(glob) > MAX_GLOB_CHARS:
        raise GlobError(f"a path glob has at most {MAX_GLOB_CHARS} characters, got {len(glob)}")
    if "\x00" in glob:
        raise GlobError("a path glob cannot contain NUL")
    segments = [s for s in glob.strip().split("/") if s not in ("", ".")]
    if ".." in segments:
        raise GlobError(f"a path glob cannot contain '..': {glob!r}")
    if not segments:
        raise GlobError(f"a path glob must name something under the root, got {glob!r} (use '**' for all)")
    return "/".join(segments)


class PathScope:
    """The globs of one token, compiled once, less the paths hidden from its agent (``hidden``: the
    globs of the ``deny read`` rules that apply to it, see :meth:`hiding`)."""

    __slots__ = ("_patterns", "globs", "hidden")

    def __init__(self, globs: Iterable[str]):
        self.globs: tuple[str, ...] = tuple(clean_glob(g) for g in globs)
        if not self.globs:
            raise GlobError("a path scope needs at least one glob")
        if len(self.globs) > MAX_GLOBS:
            raise GlobError(f"at most {MAX_GLOBS} path globs, got {len(self.globs)}")
        self._patterns = [Glob(g) for g in self.globs]
        self.hidden: tuple[PathScope, ...] = ()

    def hiding(self, hidden: Iterable[PathScope]) -> PathScope:
        """This scope less everything ``hidden`` matches (a copy: the compiled globs are shared)."""
        copy = PathScope.__new__(PathScope)
        copy.globs, copy._patterns = self.globs, self._patterns
        copy.hidden = self.hidden + tuple(hidden)
        return copy

    def matches(self, normalized: str) -> bool:
        """Whether a normalized path (from :func:`normalize`) is inside one of the globs (and not
        hidden)."""
        return any(p.match(normalized) for p in self._patterns) and not any(
            h.matches(normalized) for h in self.hidden
        )

    def allows(self, path: str, root_dir: str | None = None) -> bool:
        """Whether the request path ``path`` is inside the globs, as written (normalized; a path that
        climbs above the root never is) and, with a local ``root_dir``, where it leads (:func:`place`, the
        rules' resolution too); a hidden path is refused wherever it is named from."""
        where = place(path, root_dir)
        return where is not None and normalize(path) is not None and all(self.matches(p) for p in where)


def place(path: str, root_dir: str | None = None) -> tuple[str, ...] | None:
    """The root-relative paths a request path names, as limits match it: as written (normalized) and, with
    a local ``root_dir``, where the file system leads it (joined to the root as the contents manager joins
    it, symlinks followed). None when it cannot be placed: a NUL, a path that leaves the root (the file
    system's answer wins: ``../<root name>/x`` is ``x``), or one that climbs above a root that is not local.
    """
    if not isinstance(path, str) or "\x00" in path:
        return None
    normal = normalize(path)
    if root_dir is None:
        return None if normal is None else (normal,)
    root = os.path.realpath(root_dir)
    parts = [p for p in path.replace(os.sep, "/").split("/") if p not in ("", ".")]
    real = os.path.realpath(os.path.join(root, *parts))
    if real == root:
        where = ""
    elif real.startswith(root.rstrip(os.sep) + os.sep):
        where = os.path.relpath(real, root).replace(os.sep, "/")
    else:
        return None
    if normal is None or normal == where:
        return (where,)
    return (normal, where)
