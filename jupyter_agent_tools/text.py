"""Text shared by notebook summaries, eval output and the CLI: ANSI escapes, carriage returns, controls,
sizes in words."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# The text mimes a reader shows an output as, best first (a notebook summary, an eval's answer).
TEXT_MIMES = ("text/markdown", "text/plain")

# ESC-introduced sequences, in 7-bit and 8-bit (C1) forms: CSI, OSC (ended by BEL or ST), DCS/SOS/PM/APC
# (ended by ST), and the short forms (ESC, optional intermediate bytes 0x20-0x2F, one final byte, e.g. ESC 7,
# ESC c, ESC ( B). A sequence cut off by the end of the text is removed too. String bodies never run past a
# newline, so an unterminated title cannot swallow the lines after it.
# Keep _INCOMPLETE_ESCAPE below in step with this pattern.
_ANSI = re.compile(
    r"""
    (?:\x1b\[|\x9b) [0-?]* [ -/]* (?:[@-~]|\Z)                  # CSI ... final byte
    | (?:\x1b\]|\x9d) [^\x07\x1b\x9c\n]* (?:\x07|\x1b\\|\x9c)?    # OSC ... BEL or ST
    | (?:\x1b[PX^_]|[\x90\x98\x9e\x9f]) [^\x1b\x9c\n]* (?:\x1b\\|\x9c)?  # DCS, SOS, PM, APC ... ST
    | \x1b [ -/]* (?:[0-~]|\Z)                                    # short forms; a lone ESC at the end
    """,
    re.VERBOSE,
)
_ESCAPE_START = re.compile(r"[\x1b\x90\x98\x9b\x9d\x9e\x9f]")
_HELD_ESCAPE = 1 << 16  # characters: the longest unfinished escape sequence held back for the next chunk

# A trailing escape sequence that is not finished yet: more text could complete it. Anchored at the end.
_INCOMPLETE_ESCAPE = re.compile(
    r"""
    (?:
      (?:\x1b\[|\x9b) [0-?]* [ -/]*
      | (?:\x1b\]|\x9d) [^\x07\x1b\x9c\n]* \x1b?
      | (?:\x1b[PX^_]|[\x90\x98\x9e\x9f]) [^\x1b\x9c\n]* \x1b?
      | \x1b [ -/]*
    )\Z
    """,
    re.VERBOSE,
)

# C0 controls except \t (0x09), \n (0x0a) and \r (0x0d, handled by resolve_carriage_returns), DEL, C1, and
# lone surrogates (JSON can carry them; they cannot be encoded as UTF-8).
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_TRAILING_CR = re.compile(r"(?<!\r)\r+(?=\n|\Z)")  # starts only at a run's start: linear
_OVERWRITTEN = re.compile(r"^[^\n]*\r", re.MULTILINE)


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (colors, cursor moves, titles, hyperlinks)."""
    if text.isascii() and "\x1b" not in text:  # fast path: only ESC can start a sequence in ASCII
        return text
    if not _ESCAPE_START.search(text):
        return text
    return _ANSI.sub("", text)


def split_incomplete_escape(text: str) -> tuple[str, str]:
    """Split ``text`` into (head, tail) where ``tail`` is an escape sequence still waiting for its end.

    Streaming code holds ``tail`` back and prepends it to the next chunk, so ``"\\x1b[3"`` + ``"1mred"``
    comes out as ``"red"``. ``tail`` is ``""`` when the text does not end inside an escape sequence.
    """
    # Escape sequences never span a newline, and one longer than _HELD_ESCAPE is not held back: it comes
    # out cut, as at the end of a stream. Only a window past the last escape start is searched: the
    # regex alone tries every position of a 100 MB line without a newline (18 s).
    window = max(len(text) - _HELD_ESCAPE, 0)
    newline = text.rfind("\n", window)
    first = _ESCAPE_START.search(text, newline + 1 if newline != -1 else window)
    if first is None:
        return text, ""
    match = _INCOMPLETE_ESCAPE.search(text, first.start())
    if match is None:
        return text, ""
    return text[: match.start()], text[match.start() :]


# What strip_controls drops from ASCII text.
ASCII_CONTROLS = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
_CHECK_BLOCK = 1 << 20  # characters checked at a time: a 100 MB print is not copied twice to find none


def strip_controls(text: str) -> str:
    """Remove control characters but ``\\t``, ``\\n``, ``\\r``: NUL, BEL, DEL, C1, lone surrogates."""
    if text.isascii():  # fast path (most output): bytes.translate is far faster than the regex
        if len(text) > _CHECK_BLOCK and not any(
            _has_ascii_controls(text[i : i + _CHECK_BLOCK]) for i in range(0, len(text), _CHECK_BLOCK)
        ):
            return text  # long clean text: checked in blocks, without two full-size copies
        data = text.encode("ascii")
        kept = data.translate(None, ASCII_CONTROLS)
        return text if len(kept) == len(data) else kept.decode("ascii")
    return _CONTROLS.sub("", text)


def _has_ascii_controls(text: str) -> bool:
    data = text.encode("ascii")
    return len(data.translate(None, ASCII_CONTROLS)) != len(data)


def resolve_carriage_returns(text: str) -> str:
    """Apply ``\\r`` at line level as progress bars mean it: keep the last thing written on each line.

    ``"10%\\r50%\\r100%\\n"`` becomes ``"100%\\n"``; ``"\\r\\n"`` is a plain newline; a line that ends in
    ``\\r`` keeps what was written before it.
    """
    if "\r" not in text:
        return text
    # Drop the \r run ending each line (so \r\n is a newline), then everything up to a line's last \r:
    # what is left is the last non-empty \r-separated segment. Two linear C-level passes.
    return _OVERWRITTEN.sub("", _TRAILING_CR.sub("", text))


def sanitize(text: str) -> str:
    """Remove ANSI and control characters, then resolve carriage returns (``\\t`` and ``\\n`` stay).

    Controls go before carriage returns are resolved, so an invisible character (a BEL after a ``\\r``)
    cannot blank the line a progress bar left behind.
    """
    return resolve_carriage_returns(strip_controls(strip_ansi(text)))


_NOT_CONTROL = bytes(range(0x20, 0x100))  # deleting these from UTF-8 leaves its C0 control bytes


def json_string_body(text: str) -> bytes | None:
    """``json.dumps(text, ensure_ascii=False)`` as UTF-8 without its quotes, for text whose only control
    characters are tab and newline (what sanitized output holds); None for any other text.

    A few C-level passes over bytes instead of json's escaping of the str: the same bytes, several times
    as fast on megabytes of log text. Without the quotes, the caller's join is the only full-size copy.
    """
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: json writes it as it is, UTF-8 cannot
        return None
    if data.translate(None, _NOT_CONTROL).translate(None, b"\t\n"):
        return None  # other controls: \r, \b, \f and \u00XX escapes are json's business
    return data.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\n", b"\\n").replace(b"\t", b"\\t")


def human_size(size: int | None) -> str:
    """``size`` bytes for a person or a model: 512 bytes, 1.5 KB, 2.0 MB."""
    if size is None:
        return "size unknown"
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / 1024 / 1024:.1f} MB"


def ndjson_line(event: Mapping[str, Any]) -> bytes:
    """One event as a line of NDJSON (UTF-8 text, not \\u escapes).

    A chunk's text, the bulk of a flood, is escaped by ``json_string_body`` and spliced in after the other
    fields: the same bytes as ``json.dumps``, without its slower escaping of the str and its re-encoding.
    """
    text = event.get("text")
    if (
        event.get("type") == "chunk"
        and isinstance(text, str)
        and len(event) > 1
        and list(event)[-1] == "text"
    ):
        body = json_string_body(text)
        if body is not None:
            head = json.dumps({k: v for k, v in event.items() if k != "text"}, ensure_ascii=False)
            return b"".join((head[:-1].encode(), b', "text": "', body, b'"}\n'))
    return (json.dumps(event, ensure_ascii=False) + "\n").encode()
