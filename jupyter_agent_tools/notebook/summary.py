"""A notebook as an agent reads it: cells with one-string sources and outputs safe for a model's context.

Text outputs lose their ANSI escapes (as eval output does) and are truncated with a note; images and other
binary outputs become ``{mime, bytes}`` placeholders unless the caller asks for their base64 data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..text import TEXT_MIMES, strip_ansi
from .format import join_source


def truncate_text(text: str, limit: int) -> str:
    """Keep the first ``limit`` characters of ``text`` and say how much was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... truncated {len(text) - limit} more characters]"


# MIME type (None: the whole output) -> the route that returns it in full
OutputLink = Callable[["str | None"], str]
# output index, MIME type -> the same, for a cell
Link = Callable[[int, "str | None"], str]


def is_textual(mime: str) -> bool:
    return (
        mime.startswith("text/")
        or mime == "application/json"
        or mime.endswith("+json")
        or mime in ("application/javascript", "image/svg+xml")
    )


def joined_text(value: Any) -> str | None:
    """A string or list of strings as one string; None for anything else (a malformed output)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    return None


def base64_size(data: str) -> int:
    """Bytes that base64 ``data`` decodes to, counted without decoding it (a notebook can hold megabytes)."""
    compact = len(data) - sum(data.count(c) for c in "\n\r \t")
    stripped = data.rstrip()
    return max(0, compact * 3 // 4 - (len(stripped) - len(stripped.rstrip("="))))


def data_size(mime: str, data: str) -> int:
    """Bytes an output's ``data`` for ``mime`` stands for: UTF-8 text as it is, anything else base64."""
    return len(data.encode("utf-8", "replace")) if is_textual(mime) else base64_size(data)


def _binary_size(data: Any) -> int:
    raw = joined_text(data)
    return 0 if raw is None else base64_size(raw)


def _plain(value: Any) -> Any:
    return strip_ansi(value) if isinstance(value, str) else value


def _truncated(
    text: str, max_chars: int, summary: dict[str, Any], key: str, link: OutputLink | None, mime: str
) -> None:
    """``summary[key]``: ``text`` cut at ``max_chars``; when cut, ``summary["full"]``: where all of it is."""
    summary[key] = truncate_text(text, max_chars)
    if link is not None and len(summary[key]) != len(text):
        summary["full"] = link(mime)


def summarize_output(
    output: dict[str, Any], max_chars: int, include_binary: bool, link: OutputLink | None = None
) -> dict[str, Any]:
    """One output as an agent sees it. With ``link`` (MIME type or None -> the route of this output), a cut
    text says where the whole output is (``full``) and every other MIME type where its data is (``url``)."""
    kind = output.get("output_type")
    summary: dict[str, Any] = {"output_type": kind}
    if kind == "stream":
        summary["name"] = output.get("name")
        text = strip_ansi(joined_text(output.get("text", "")) or "")
        _truncated(text, max_chars, summary, "text", link, "text/plain")
    elif kind == "error":
        summary["ename"] = _plain(output.get("ename"))
        summary["evalue"] = _plain(output.get("evalue"))
        traceback = output.get("traceback") or []
        text = "\n".join(strip_ansi(line) for line in traceback if isinstance(line, str))
        _truncated(text, max_chars, summary, "traceback", link, "text/plain")
    elif kind in ("execute_result", "display_data", "update_display_data"):
        if "execution_count" in output:
            summary["execution_count"] = output.get("execution_count")
        data = output.get("data")
        if not isinstance(data, dict):
            data = {}
        text, text_mime = None, ""
        for text_mime in TEXT_MIMES:
            if text_mime in data:
                text = joined_text(data[text_mime])
                break
        if text is not None:
            _truncated(strip_ansi(text), max_chars, summary, "text", link, text_mime)
        attachments = []
        for mime, value in sorted(data.items()):
            if mime in TEXT_MIMES:
                continue
            if is_textual(mime):
                raw = joined_text(value)
                size = len(raw.encode()) if raw is not None else None
                entry: dict[str, Any] = {"mime": mime, "bytes": size}
            else:
                entry = {"mime": mime, "bytes": _binary_size(value)}
                if include_binary:
                    entry["data"] = joined_text(value) if isinstance(value, list) else value
            if link is not None:
                entry["url"] = link(mime)
            attachments.append(entry)
        if attachments:
            summary["data"] = attachments
    return summary


def summarize_cell(
    cell: dict[str, Any], index: int, max_chars: int, include_binary: bool, link: Link | None = None
) -> dict[str, Any]:
    """One cell as an agent sees it: index, id, type, source as one string, count, outputs (see
    :func:`summarize_output` for ``link``)."""
    summary: dict[str, Any] = {
        "index": index,
        "id": cell.get("id"),
        "cell_type": cell.get("cell_type"),
        "source": join_source(cell.get("source", "")),
        "execution_count": cell.get("execution_count"),
    }
    if cell.get("cell_type") == "code":
        outputs = cell.get("outputs") or []
        summary["outputs"] = [
            summarize_output(o, max_chars, include_binary, _output_link(link, n))
            for n, o in enumerate(outputs)
            if isinstance(o, dict)
        ]
    return summary


def _output_link(link: Link | None, n: int) -> OutputLink | None:
    if link is None:
        return None
    return lambda mime: link(n, mime)


def summarize_notebook(
    nb: dict[str, Any], path: str, hash_: str, max_chars: int, include_binary: bool = False
) -> dict[str, Any]:
    """The GET answer for a notebook."""
    return {
        "path": path,
        "nbformat": nb.get("nbformat"),
        "nbformat_minor": nb.get("nbformat_minor"),
        "hash": hash_,
        "cells": [summarize_cell(cell, i, max_chars, include_binary) for i, cell in enumerate(nb["cells"])],
    }
