"""Keep a notebook file's own layout when it is edited: only what changed is written anew.

nbformat writes ``indent=1``, sorted keys, no ASCII escapes; other tools write 2 or 4 spaces, tabs, one
line, ASCII escapes or keys in their own order. Serializing the edited notebook in nbformat's layout
would rewrite every line of such a file. :func:`render_edit` instead splices: every value of the new
notebook that equals the value at the same place in the file keeps its original bytes, and only what
changed is serialized, in the style :func:`detect_style` found in the file (indent, separators,
escaping, key order). Arrays are aligned element by element (unchanged, inserted, deleted and moved
elements are recognized), objects member by member. The whitespace around every kept member or element
is the file's own. The result is a pure function of the file's bytes and the new notebook, and it is
checked to parse back to exactly the new notebook (else the whole notebook is serialized in the style).

For a file in nbformat's layout the result is byte for byte what :func:`.format.serialize_notebook`
gives, so files saved by JupyterLab keep their usual diffs.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

_WS = re.compile(r"[ \t\n\r]*")
# The C scanner of the standard library: (value, end index) of the JSON value that starts at an index.
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
# A \\uXXXX escape of a character outside ASCII (not preceded by an escaping backslash).
_NON_ASCII_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u(?!00[0-7])[0-9a-fA-F]{4}")
# Arrays longer than this (old x new elements in the part that differs) are paired by position
# instead of aligned (difflib is quadratic at worst).
ALIGN_LIMIT = 1_000_000


@dataclass(frozen=True)
class Style:
    """How a file writes JSON: what new values are serialized with."""

    indent: str | None = " "  # None: all on one line
    item_separator: str = ","  # what follows a value before the next one (and the newline, if any)
    key_separator: str = ": "
    ensure_ascii: bool = False
    sort_keys: bool = True
    newline: str = "\n"

    def dumps(self, value: Any, base: str = "") -> str:
        """``value`` in this style, its lines indented by ``base`` (the indent of the line it starts on)."""
        text = json.dumps(
            value,
            indent=self.indent,
            separators=(self.item_separator, self.key_separator),
            ensure_ascii=self.ensure_ascii,
            sort_keys=self.sort_keys,
        )
        if self.indent is not None and (base or self.newline != "\n"):
            text = text.replace("\n", self.newline + base)
        return text


NBFORMAT_STYLE = Style()


@dataclass
class _Item:
    """A member of an object (``key`` set) or an element of an array, as found in the text."""

    key: str | None
    key_text: str  # the key as written, with its quotes ("" for elements)
    colon: str  # from the key's end to the value's start ("" for elements)
    value: Any
    start: int
    end: int
    before: str  # whitespace after the '{', '[' or ',' that precedes it
    after: str  # whitespace between the value and the ',' that follows it


# An item of a container being written: (the whitespace before it, its text, the whitespace between it and
# the next comma), the whitespace None where the item has none of its own (the container's default).
_Part = tuple[str | None, str, str | None]


def _ws(text: str, i: int) -> int:
    m = _WS.match(text, i)
    assert m is not None
    return m.end()


def _items(text: str, start: int) -> tuple[list[_Item], str]:
    """The members or elements of the object or array at ``start``, and the whitespace before its end."""
    is_object = text[start] == "{"
    close = "}" if is_object else "]"
    i = start + 1
    j = _ws(text, i)
    if text[j] == close:
        return [], text[i:j]
    items: list[_Item] = []
    before = text[i:j]
    i = j
    while True:
        key: str | None = None
        key_text = colon = ""
        value_start = i
        if is_object:
            key, key_end = _SCAN(text, i)
            colon_end = _ws(text, _ws(text, key_end) + 1)  # whitespace, ':', whitespace
            key_text, colon = text[i:key_end], text[key_end:colon_end]
            value_start = colon_end
        value, value_end = _SCAN(text, value_start)
        k = _ws(text, value_end)
        items.append(_Item(key, key_text, colon, value, value_start, value_end, before, text[value_end:k]))
        if text[k] == ",":
            i = _ws(text, k + 1)
            before = text[k + 1 : i]
            continue
        last = items[-1]
        closing, last.after = last.after, ""
        return items, closing


def strict_equal(a: Any, b: Any) -> bool:
    """Equal as JSON: ``True`` is not ``1`` and ``1.0`` is not ``1`` (their text differs)."""
    if a is b:
        return True
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(strict_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(strict_equal, a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and a != a:  # NaN
        return b != b
    return bool(a == b)


def _line_indent(text: str, pos: int) -> str:
    """The whitespace that starts the line ``pos`` is on."""
    line = text.rfind("\n", 0, pos) + 1
    return text[line : _ws(text, line)] if line else ""


def _tail(whitespace: str) -> str | None:
    """The indent after the last newline of ``whitespace`` (None when it has no newline)."""
    if "\n" not in whitespace:
        return None
    return whitespace.rsplit("\n", 1)[1]


def detect_style(text: str) -> Style:
    """The style of a notebook file's JSON, from its top-level object and its first cell."""
    start = _ws(text, 0)
    try:
        members, _ = _items(text, start)
    except (StopIteration, IndexError, ValueError):
        return NBFORMAT_STYLE
    if not members:
        return NBFORMAT_STYLE
    objects = [members]
    cells = next((m for m in members if m.key == "cells"), None)
    if cells is not None and text[cells.start] == "[":
        first_cell = _items(text, cells.start)[0][:1]
        if first_cell and text[first_cell[0].start] == "{":
            objects.append(_items(text, first_cell[0].start)[0])
    sort_keys = all(
        [m.key for m in obj] == sorted(m.key for m in obj if m.key is not None) for obj in objects
    )
    first = members[0]
    newline = "\r\n" if first.before.startswith("\r\n") else "\n"
    indent_at_1 = _tail(first.before)
    indent = None if indent_at_1 is None else indent_at_1
    item_separator = ","
    if len(members) > 1:
        # after the comma: the spaces before a newline (old Python wrote ", \n"), or all of it inline
        sep = members[1].before
        item_separator += sep.split("\n", 1)[0].rstrip("\r") if indent is not None else sep
    elif indent is None:
        item_separator = ", "
    key_separator = ":" + first.colon.split(":", 1)[1] if ":" in first.colon else ": "
    # no evidence either way (all ASCII, no escapes): nbformat's choice
    ensure_ascii = text.isascii() and _NON_ASCII_ESCAPE.search(text) is not None
    return Style(
        indent=indent,
        item_separator=item_separator,
        key_separator=key_separator,
        ensure_ascii=ensure_ascii,
        sort_keys=sort_keys,
        newline=newline,
    )


def _fingerprint(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


class _Splicer:
    def __init__(self, text: str, style: Style):
        self.text = text
        self.style = style

    def value(self, new: Any, old: _Item) -> str:
        """``new`` written where ``old`` was: ``old``'s text when equal, spliced when both are containers."""
        if strict_equal(new, old.value):
            return self.text[old.start : old.end]
        opener = self.text[old.start]
        if isinstance(new, dict) and opener == "{" and new:
            return self._object(new, old.start)
        if isinstance(new, list) and opener == "[" and new:
            return self._array(new, old.start)
        return self.style.dumps(new, _line_indent(self.text, old.start))

    def _defaults(self, start: int, items: list[_Item], closing: str) -> tuple[str, str, str, str]:
        """(first item's whitespace, the others', the one before the end, before a comma) for new items."""
        base = _line_indent(self.text, start)
        if items:
            opening = items[0].before
            if len(items) > 1:
                separator = items[1].before
            elif _tail(opening) is not None:
                separator = self.style.item_separator[1:] + opening
            else:
                separator = self.style.item_separator[1:]
            return opening, separator, closing, items[0].after if len(items) > 1 else ""
        if self.style.indent is None:
            return "", self.style.item_separator[1:], "", ""
        nl = self.style.newline
        inner = nl + base + self.style.indent
        return inner, self.style.item_separator[1:] + inner, nl + base, ""

    def _join(self, brackets: str, parts: list[_Part], defaults: tuple[str, ...]) -> str:
        """The container's text: its items' own whitespace where they have it, else the defaults."""
        opening, separator, closing, pre_comma = defaults
        out = [brackets[0]]
        for index, (before, body, after) in enumerate(parts):
            if index:
                out.append(",")
            if before is None:
                before = opening if index == 0 else separator
            out.append(before)
            out.append(body)
            if index < len(parts) - 1:
                out.append(after if after is not None else pre_comma)
        out.append(closing)
        out.append(brackets[1])
        return "".join(out)

    def _fresh_base(self, start: int, defaults: tuple[str, ...]) -> str:
        """The indent of a new item's line inside the container at ``start``."""
        tail = _tail(defaults[0])
        return tail if tail is not None else _line_indent(self.text, start)

    def _object(self, new: dict[str, Any], start: int) -> str:
        items, closing = _items(self.text, start)
        keys = [m.key for m in items]
        if len(set(keys)) != len(keys):  # duplicate keys: the file's text of this object cannot be kept
            return self.style.dumps(new, _line_indent(self.text, start))
        by_key = {m.key: (i, m) for i, m in enumerate(items)}
        order: list[str] = [k for k in keys if k is not None and k in new]
        added = [k for k in new if k not in by_key]
        if added and self.style.sort_keys and order == sorted(order):
            for key in sorted(added):
                bisect.insort(order, key)
        else:
            order += sorted(added) if self.style.sort_keys else added
        colon = items[0].colon if items else self.style.key_separator
        defaults = self._defaults(start, items, closing)
        base = self._fresh_base(start, defaults)
        parts: list[_Part] = []
        for position, key in enumerate(order):
            found = by_key.get(key)
            if found is None:
                key_text = json.dumps(key, ensure_ascii=self.style.ensure_ascii)
                parts.append((None, key_text + colon + self.style.dumps(new[key], base), None))
                continue
            index, member = found
            before = member.before if (index == 0) == (position == 0) else None
            body = member.key_text + member.colon + self.value(new[key], member)
            parts.append((before, body, member.after))
        return self._join("{}", parts, defaults)

    def _array(self, new: list[Any], start: int) -> str:
        items, closing = _items(self.text, start)
        old = [e.value for e in items]
        n, m = len(old), len(new)
        head = 0
        while head < min(n, m) and strict_equal(old[head], new[head]):
            head += 1
        tail = 0
        while tail < min(n, m) - head and strict_equal(old[n - 1 - tail], new[m - 1 - tail]):
            tail += 1
        # (new index, old index or None, whether equal)
        pairs: list[tuple[int, int | None, bool]] = [(j, j, True) for j in range(head)]
        old_mid, new_mid = range(head, n - tail), range(head, m - tail)
        if len(old_mid) * len(new_mid) <= ALIGN_LIMIT:
            old_prints = [_fingerprint(old[i]) for i in old_mid]
            new_prints = [_fingerprint(new[j]) for j in new_mid]
            matcher = SequenceMatcher(None, old_prints, new_prints, autojunk=False)
            unused: dict[str, list[int]] = {}
            pending: list[int] = []  # new indexes to place once all unused old elements are known
            middle: list[tuple[int, int | None, bool]] = []
            for tag, i1, i2, j1, j2 in matcher.get_opcodes():
                if tag == "equal":
                    middle += [(head + j1 + k, head + i1 + k, True) for k in range(j2 - j1)]
                    continue
                paired = min(i2 - i1, j2 - j1) if tag == "replace" else 0
                middle += [(head + j1 + k, head + i1 + k, False) for k in range(paired)]
                for i in range(i1 + paired, i2):
                    unused.setdefault(old_prints[i], []).append(head + i)
                pending += [head + j for j in range(j1 + paired, j2)]
            for j in pending:  # an element moved elsewhere keeps its text
                spare = unused.get(new_prints[j - head])
                middle.append((j, spare.pop(0), True) if spare else (j, None, False))
            pairs += sorted(middle)
        else:
            pairs += [(j, j if j < n - tail else None, False) for j in new_mid]
        pairs += [(m - tail + k, n - tail + k, True) for k in range(tail)]
        defaults = self._defaults(start, items, closing)
        base = self._fresh_base(start, defaults)
        parts: list[_Part] = []
        for position, (j, origin, equal) in enumerate(pairs):
            if origin is None:
                parts.append((None, self.style.dumps(new[j], base), None))
                continue
            element = items[origin]
            before = element.before if (origin == 0) == (position == 0) else None
            body = self.text[element.start : element.end] if equal else self.value(new[j], element)
            parts.append((before, body, element.after))
        return self._join("[]", parts, defaults)


def render_edit(text: str, new: dict[str, Any], style: Style | None = None) -> str:
    """The text of the file whose current text is ``text`` once it holds ``new``, in the file's layout.

    ``text`` must be a JSON object (a notebook); the answer always parses to exactly ``new``.
    """
    style = style or detect_style(text)
    start = _ws(text, 0)
    try:
        root, end = _SCAN(text, start)
        top = _Item(None, "", "", root, start, end, "", "")
        body = _Splicer(text, style).value(new, top)
        out = text[:start] + body + text[end:]
    except (StopIteration, IndexError, ValueError, RecursionError):
        out = ""
    if not _parses_to(out, new):
        out = style.dumps(new) + style.newline
    return out


def _parses_to(text: str, value: Any) -> bool:
    try:
        return strict_equal(json.loads(text), value)
    except (ValueError, RecursionError):
        return False


def string_sources(nb: dict[str, Any]) -> bool:
    """Whether the notebook stores multi-line sources as one string rather than nbformat's list of lines."""
    as_string = as_list = False
    for cell in nb.get("cells", []):
        source = cell.get("source") if isinstance(cell, dict) else None
        if isinstance(source, str) and "\n" in source.rstrip("\n"):
            as_string = True
        elif isinstance(source, list) and len(source) > 1:
            as_list = True
    return as_string and not as_list


def follow_source_style(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` with its new sources as one string when ``old`` stores sources that way.

    A source is new when it is not one of ``old``'s source objects (the cell operations and runs keep
    the sources they do not change): a one-line source the file stores as a list stays a list.
    """
    if not string_sources(old):
        return new
    kept = {id(cell.get("source")) for cell in old["cells"] if isinstance(cell, dict)}
    cells = []
    for cell in new["cells"]:
        source = cell.get("source")
        if isinstance(source, list) and id(source) not in kept:
            cell = {**cell, "source": "".join(source)}
        cells.append(cell)
    return {**new, "cells": cells}
