"""Ignore files (``.gitignore``, ``.ignore``) read as git and ripgrep read them: what a file search skips.

The rules of gitignore(5): blank lines and lines starting with ``#`` are nothing; trailing spaces are
dropped unless escaped (``\\``); ``!`` re-includes; a trailing ``/`` matches folders only; a pattern with a
``/`` at its start or middle is relative to the folder of its file, any other matches a name at any depth
below it; ``**`` is any number of folders, and a trailing ``/**`` everything inside (not the folder
itself). The last rule that matches decides, a deeper folder's files before a shallower one's, and in one
folder ``.ignore`` before ``.gitignore`` (ripgrep's order). Patterns are matched by :mod:`.globs`, never
backtracking: an ignore file comes with the served files and anyone may have written it (pathspec's
regular expressions took 18 s for one ten-star line on a 40-character name). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .globs import MAX_GLOB_CHARS, Glob, GlobError, segment_regex

IGNORE_FILES = (".gitignore", ".ignore")  # the lower precedence first
MAX_IGNORE_BYTES = 64 * 1024  # read of one ignore file; the rest is not read
MAX_RULES = 1000  # rules of one folder's ignore files; later ones are dropped


@dataclass(frozen=True)
class _Rule:
    negate: bool
    folders_only: bool
    name_regex: str | None  # a pattern without a '/': the name at any depth
    path_glob: Glob | None  # else the path relative to the ignore file's folder


def _parse(line: str, index: int) -> _Rule | None:
    line = line.rstrip("\r")
    if not line or line.startswith("#"):
        return None
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    negate = line.startswith("!")
    line = line[1:] if negate else line
    folders_only = line.endswith("/")
    line = line.rstrip("/")
    if not line or len(line) > MAX_GLOB_CHARS:
        return None
    try:
        if "/" not in line:
            name = segment_regex(line, escapes=True, name=f"r{index}g")
            re.compile(name)
            return _Rule(negate, folders_only, name, None)
        segments = [s for s in line.split("/") if s]
        if segments[-1] == "**":
            segments[-1:] = ["*", "**"]  # everything inside, not the folder itself
        return _Rule(negate, folders_only, None, Glob("/".join(segments), escapes=True))
    except (GlobError, re.error):
        return None  # a pattern git could not use either, or longer than a glob may be: nothing


class IgnoreRules:
    """The rules of one folder's ignore files, compiled once."""

    __slots__ = ("_files", "_folders", "_negate", "_paths")

    def __init__(self, texts: Iterable[str]):
        rules: list[_Rule] = []
        for text in texts:
            for line in text.split("\n"):
                if len(rules) >= MAX_RULES:
                    break
                rule = _parse(line, len(rules))
                if rule is not None:
                    rules.append(rule)
        self._negate = [r.negate for r in rules]
        self._paths = [
            (i, r.path_glob, r.folders_only) for i, r in enumerate(rules) if r.path_glob is not None
        ]
        self._paths.reverse()
        self._folders = _names(rules, folders=True)
        self._files = _names(rules, folders=False)

    def __bool__(self) -> bool:
        return bool(self._negate)

    def decide(self, relative: str, name: str, is_dir: bool) -> bool | None:
        """For an entry at ``relative`` (to this folder): True ignored, False re-included (``!``), None
        when no rule matches."""
        best = -1
        names = self._folders if is_dir else self._files
        if names is not None and (found := names.fullmatch(name)) is not None and found.lastgroup:
            best = int(found.lastgroup[1:])
        for index, glob, folders_only in self._paths:  # the last rules first
            if index <= best:
                break
            if (is_dir or not folders_only) and glob.match(relative):
                best = index
                break
        return None if best < 0 else not self._negate[best]


def _names(rules: list[_Rule], *, folders: bool) -> re.Pattern[str] | None:
    """One expression of the name rules (for folders, or for files), the last rule first: the group of the
    alternative that matches names the rule that decides."""
    alternatives = [
        f"(?P<r{i}>{r.name_regex})"
        for i, r in reversed(list(enumerate(rules)))
        if r.name_regex is not None and (folders or not r.folders_only)
    ]
    return re.compile("|".join(alternatives)) if alternatives else None


class Ignores:
    """The ignore rules in force in a walk: a stack of (folder, rules), the top's ancestors first."""

    __slots__ = ("_stack",)

    def __init__(self) -> None:
        self._stack: list[tuple[str, IgnoreRules]] = []

    def push(self, folder: str, rules: IgnoreRules) -> bool:
        """Rules of ``folder`` in force below it (until :meth:`pop`); False when there are none."""
        if not rules:
            return False
        self._stack.append((folder, rules))
        return True

    def pop(self) -> None:
        self._stack.pop()

    def ignored(self, path: str, name: str, is_dir: bool) -> bool:
        """Whether the entry at root-relative ``path`` is ignored (a ``.git`` folder always is)."""
        if is_dir and name == ".git":
            return True
        for folder, rules in reversed(self._stack):
            decided = rules.decide(path[len(folder) + 1 :] if folder else path, name, is_dir)
            if decided is not None:
                return decided
        return False
