"""Text cleaning shared by notebook summaries and eval output: ANSI escapes, carriage returns, controls."""

from __future__ import annotations

import re

# ESC-introduced sequences: CSI, OSC (ended by BEL or ST), DCS/SOS/PM/APC (ended by ST), and the
# two-character short forms (ESC followed by one byte in 0x40-0x5F or a few others, e.g. ESC 7 / ESC 8).
_ANSI = re.compile(
    r"""
    \x1b\[[0-?]*[ -/]*[@-~]              # CSI ... final byte
    | \x9b[0-?]*[ -/]*[@-~]              # 8-bit CSI
    | \x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?  # OSC ... BEL or ST
    | \x9d[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?
    | \x1b[PX^_][^\x1b]*(?:\x1b\\)?      # DCS, SOS, PM, APC ... ST
    | \x1b[ -/]*[0-~]                    # short forms (ESC c, ESC 7, ESC ( B, ...)
    | \x1b$                              # a lone ESC at the end
    """,
    re.VERBOSE,
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (colors, cursor moves, titles, hyperlinks)."""
    if "\x1b" not in text and "\x9b" not in text and "\x9d" not in text:
        return text
    return _ANSI.sub("", text)


def resolve_carriage_returns(text: str) -> str:
    """Apply ``\\r`` at line level as progress bars mean it: keep the last thing written on each line.

    ``"10%\\r50%\\r100%\\n"`` becomes ``"100%\\n"``; ``"\\r\\n"`` is a plain newline; a line that ends in
    ``\\r`` keeps what was written before it.
    """
    if "\r" not in text:
        return text
    lines = text.replace("\r\n", "\n").split("\n")
    for i, line in enumerate(lines):
        if "\r" in line:
            segments = [s for s in line.split("\r") if s]
            lines[i] = segments[-1] if segments else ""
    return "\n".join(lines)


def sanitize(text: str) -> str:
    """Remove ANSI, resolve carriage returns, drop control characters (``\\t`` and ``\\n`` stay)."""
    text = strip_ansi(text)
    text = resolve_carriage_returns(text)
    return _CONTROLS.sub("", text)
