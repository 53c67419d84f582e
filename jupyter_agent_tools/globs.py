"""Path globs matched without backtracking: the one matcher of file search, token paths and ignore files.

A glob is split on ``/`` into segments. Within a segment ``*`` is any run of characters, ``?`` one
character, ``[abc]``, ``[a-z]`` and ``[!abc]`` (or ``[^abc]``) a class; a whole segment ``**`` is any
number of segments, none included. Pure.

Nothing backtracks, whatever the glob (a regular expression with ``[^/]*`` per ``*`` took seconds, then
forever, on a name that does not match): a run of ``*`` is one ``*``; within a segment each ``*`` but the
last takes the shortest text before the leftmost match of what follows it, in a lookahead that the regular
expression engine never re-enters (the leftmost match is always the right one, since what follows is of
fixed length), and the last ``*`` is a single greedy run; across segments, a set of states (one bit per
glob segment) steps through the path's segments at once. A match costs at most about
``len(glob) * len(path)`` steps, so both are bounded (:data:`MAX_GLOB_CHARS`, :data:`MAX_PATH_CHARS`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

MAX_GLOB_CHARS = 256
MAX_PATH_CHARS = 4096  # Linux's PATH_MAX: a longer path names no file, and matches nothing
_STAR = None  # a ``*`` among a segment's tokens (each other token is the regex of one character)


class GlobError(ValueError):
    """A glob that cannot be used (the message says why)."""


def _class(segment: str, i: int, escapes: bool) -> tuple[str, int] | None:
    """The regex of the character class whose ``[`` is just before ``segment[i]``, and the index after its
    ``]``; None when the ``[`` is a plain character. Without ``escapes``, ``]`` closes the class at once
    (the rule path globs always had); with them (ignore files), a first ``]`` and ``\\x`` are members."""
    n = len(segment)
    if not escapes:
        end = segment.find("]", i + 1 if i < n and segment[i] in "!^" else i)
        if end < 0:
            return None
        body = segment[i:end]
        negate = body[:1] in ("!", "^")
        body = body[1:] if negate else body
        if not body:
            return None
        body = body.replace("\\", "\\\\").replace("[", "\\[")
        return (f"[^/{body}]" if negate else f"[{body}]"), end + 1
    j, negate = i, False
    if j < n and segment[j] in "!^":
        negate, j = True, j + 1
    members: list[str] = []
    while j < n and (segment[j] != "]" or not members):
        c = segment[j]
        if c == "\\" and j + 1 < n:
            members.append(re.escape(segment[j + 1]))
            j += 2
        elif c == "-" and members and j + 1 < n and segment[j + 1] != "]":
            members.append("-")
            j += 1
        else:
            members.append(re.escape(c))
            j += 1
    if j >= n:
        return None
    body = "".join(members)
    return (f"[^/{body}]" if negate else f"[{body}]"), j + 1


def _tokens(segment: str, escapes: bool) -> Iterator[str | None]:
    """The tokens of one glob segment: :data:`_STAR` for a run of ``*``, else one character's regex."""
    i, n, star = 0, len(segment), False
    while i < n:
        c = segment[i]
        i += 1
        if c == "*":
            if not star:
                yield _STAR
            star = True
            continue
        star = False
        if c == "?":
            yield "[^/]"
        elif c == "[" and (found := _class(segment, i, escapes)) is not None:
            token, i = found
            yield token
        elif c == "\\" and escapes and i < n:
            yield re.escape(segment[i])
            i += 1
        else:
            yield re.escape(c)


def segment_regex(segment: str, *, escapes: bool = False, name: str = "g") -> str:
    """The regular expression (without backtracking, see the module) of one glob segment, to be
    ``fullmatch``-ed against one name; its groups are named ``name`` followed by a number."""
    chunks: list[list[str]] = [[]]
    for token in _tokens(segment, escapes):
        if token is _STAR:
            chunks.append([])
        else:
            chunks[-1].append(token)
    if len(chunks) == 1:
        return "".join(chunks[0])
    out = ["".join(chunks[0])]
    for k, chunk in enumerate(chunks[1:-1]):  # a star with more stars after it: the leftmost match
        group = f"{name}{k}"
        out.append(f"(?=(?P<{group}>[^/]*?{''.join(chunk)}))(?P={group})")
    out.append("[^/]*" + "".join(chunks[-1]))
    return "(?s:" + "".join(out) + ")"


def compile_segment(segment: str, *, escapes: bool = False) -> re.Pattern[str]:
    try:
        return re.compile(segment_regex(segment, escapes=escapes))
    except re.error as e:
        raise GlobError(f"not a usable glob segment: {segment!r} ({e})") from None


def is_literal(segment: str, *, escapes: bool = False) -> bool:
    """Whether a segment has no wildcard (it then matches only itself, :func:`literal_text`)."""
    return all(t is not _STAR and re.escape(_unescape(t)) == t for t in _tokens(segment, escapes))


def _unescape(token: str) -> str:
    return re.sub(r"\\(.)", r"\1", token, flags=re.S)


def literal_text(segment: str, *, escapes: bool = False) -> str:
    return "".join(_unescape(t) for t in _tokens(segment, escapes) if t is not _STAR)


class Glob:
    """A glob compiled once: :meth:`match` a whole path, or :meth:`step` through a walk's folders.

    A state is an int whose bit ``i`` says "the glob's first ``i`` segments are matched"; a path (or a
    folder being walked) matches when the bit of the whole glob is set.
    """

    __slots__ = ("_final", "_literals", "_patterns", "_stars", "_start", "text")

    def __init__(self, glob: str, *, escapes: bool = False):
        if len(glob) > MAX_GLOB_CHARS:
            raise GlobError(f"a glob has at most {MAX_GLOB_CHARS} characters, got {len(glob)}")
        segments: list[str] = []
        for segment in glob.split("/"):
            if segment == "**" and segments and segments[-1] == "**":
                continue  # **/** is **
            segments.append(segment)
        self.text = glob
        self._stars = 0
        self._literals: dict[str, int] = {}
        patterns: dict[str, tuple[re.Pattern[str], int]] = {}
        for i, segment in enumerate(segments):
            bit = 1 << i
            if segment == "**":
                self._stars |= bit
            elif is_literal(segment, escapes=escapes):
                text = literal_text(segment, escapes=escapes)
                self._literals[text] = self._literals.get(text, 0) | bit
            else:
                pattern, mask = patterns.get(segment) or (compile_segment(segment, escapes=escapes), 0)
                patterns[segment] = (pattern, mask | bit)
        self._patterns = list(patterns.values())
        self._final = 1 << len(segments)
        self._start = self._close(1)

    def _close(self, states: int) -> int:
        """``states`` with every ``**`` taken as no segment at all."""
        while True:
            more = states | ((states & self._stars) << 1)
            if more == states:
                return states
            states = more

    def start(self) -> int:
        """The state of the folder a walk starts from (the empty path)."""
        return self._start

    def step(self, states: int, name: str) -> int:
        """The state of the entry ``name`` inside a folder whose state is ``states``."""
        if not states:
            return 0
        matched = self._literals.get(name, 0)
        for pattern, mask in self._patterns:
            if states & mask and pattern.fullmatch(name):
                matched |= mask
        return self._close(((states & matched) << 1) | (states & self._stars))

    def accepts(self, states: int) -> bool:
        """Whether the entry of this state matches the glob."""
        return bool(states & self._final)

    def may_contain(self, states: int) -> bool:
        """Whether something below the folder of this state could match."""
        return bool(states & (self._final - 1))

    def match(self, path: str) -> bool:
        """Whether a normalized root-relative path (``""``: the root) matches; nothing longer than
        :data:`MAX_PATH_CHARS` does."""
        if len(path) > MAX_PATH_CHARS:
            return False
        states = self._start
        for name in path.split("/") if path else ():
            states = self.step(states, name)
            if not states:
                return False
        return self.accepts(states)

    def __repr__(self) -> str:
        return f"Glob({self.text!r})"
