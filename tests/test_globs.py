"""The one glob matcher (jupyter_agent_tools/globs.py) of file search, agent token paths and ignore files:
the same answers as the regular expressions it replaced on benign globs, and bounded time on hostile ones
(those took seconds, then forever: issue 35, H3). No server."""

from __future__ import annotations

import gc
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_agent_tools.auth.paths import PathScope
from jupyter_agent_tools.globs import MAX_PATH_CHARS, Glob, GlobError


def _old_segment(segment: str) -> str:
    """The regex of one glob segment as auth/paths.py built it until v0.3 (a ``[^/]*`` per ``*``)."""
    out, i, n = [], 0, len(segment)
    while i < n:
        c = segment[i]
        i += 1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = segment.find("]", i + 1 if i < n and segment[i] in "!^" else i)
            if end < 0:
                out.append(re.escape(c))
                continue
            body = segment[i:end]
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            if not body:
                out.append(re.escape(c))
                continue
            i = end + 1
            body = body.replace("\\", "\\\\").replace("[", "\\[")
            out.append(f"[^/{body}]" if negate else f"[{body}]")
        else:
            out.append(re.escape(c))
    return "".join(out)


def old_match(glob: str, path: str) -> bool:
    pieces = ["(?:[^/]+/)*" if s == "**" else _old_segment(s) + "/" for s in glob.split("/")]
    return re.fullmatch("".join(pieces), path + "/" if path else "") is not None


SEGMENTS = st.one_of(
    st.just("**"),
    st.lists(
        st.sampled_from(["a", "b", ".", "*", "?", "[ab]", "[!a]", "[a-c]", "[", "]", "\\", "+"]), max_size=6
    )
    .map("".join)
    .filter(bool),
)
GLOBS = st.lists(SEGMENTS, min_size=1, max_size=5).map("/".join).filter(lambda g: g.count("*") <= 6)
PATHS = st.lists(st.text(alphabet="ab.c[]\\+", min_size=1, max_size=6), max_size=6).map("/".join)


@settings(max_examples=1000, deadline=None)
@given(GLOBS, PATHS)
def test_the_matcher_answers_as_the_old_regular_expressions_on_benign_globs(glob: str, path: str) -> None:
    assert Glob(glob).match(path) == old_match(glob, path), (glob, path)


@settings(max_examples=500, deadline=None)
@given(GLOBS, st.lists(st.text(alphabet="ab.c", min_size=1, max_size=4), max_size=5))
def test_a_walk_stepping_folder_by_folder_answers_as_a_whole_match(glob: str, names: list[str]) -> None:
    g = Glob(glob)
    states = g.start()
    for depth, name in enumerate(names, 1):
        before = states
        states = g.step(states, name)
        assert g.accepts(states) == old_match(glob, "/".join(names[:depth])), (glob, names[:depth])
        if not g.may_contain(before):
            assert not g.accepts(states)  # a folder it said nothing below could match: nothing did


@pytest.mark.parametrize(
    ("glob", "path"),
    [
        ("*" * 8 + "b", "a" * 64),  # 5.6 s per request, 27 s with a 64-character name
        ("*" * 250 + "b", "a" * 255),  # hung the server until SIGKILL
        ("*a" * 127 + "b", "a" * 255),
        ("[ab]*" * 50 + "c", "ab" * 120),
        ("**/" * 60 + "x", "/".join(["a"] * 2000)),
        ("/".join(["**", "*a*a*a*a*b"] * 20), "/".join(["a" * 100] * 40)),
        (
            "/".join(f"**/{c}*" for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")[:256],
            "a/" * 2047,
        ),
    ],
)
def test_hostile_globs_take_bounded_time(glob: str, path: str) -> None:
    glob = glob[:256]
    # This thread's CPU time, the collector held off: a loaded machine's scheduling does not count, and
    # neither does a full collection of the worker's heap inside the measure (CI: 0.68 s on a 5 ms case).
    gc.collect()
    gc.disable()
    try:
        began = time.thread_time()
        assert not Glob(glob).match(path)
        assert not PathScope([glob]).matches(path)  # a token's paths go through the same matcher
        spent = time.thread_time() - began
    finally:
        gc.enable()
    assert spent < 0.5  # under 6 ms here; the old regexes: seconds to forever


def test_stars_collapse_and_globs_and_paths_are_bounded() -> None:
    assert Glob("a***b/**/**/c").match("axb/c") and Glob("a**b").match("ab")
    assert not Glob("a**b").match("a/b")  # ** inside a name is a *: it stays in the segment
    with pytest.raises(GlobError, match="at most 256 characters"):
        Glob("*" * 257)
    assert Glob("**").match("a/" * 100 + "b")
    assert not Glob("**").match("a/" * (MAX_PATH_CHARS // 2) + "b")  # no file has such a path


def test_ignore_file_escapes_and_classes() -> None:
    assert Glob(r"\*.txt", escapes=True).match("*.txt") and not Glob(r"\*.txt", escapes=True).match("a.txt")
    assert Glob("[]a]", escapes=True).match("]") and Glob(r"[\]]x", escapes=True).match("]x")
    assert Glob("[!a-c]", escapes=True).match("d") and not Glob("[!a-c]", escapes=True).match("b")
    assert Glob("[a-]", escapes=True).match("-") and Glob(r"\#x", escapes=True).match("#x")
