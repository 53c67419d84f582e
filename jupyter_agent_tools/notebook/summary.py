"""A notebook as an agent reads it: cells with one-string sources and outputs safe for a model's context.

Text outputs lose their ANSI escapes (as eval output does) and are truncated with a note; images and other
binary outputs become ``{mime, bytes}`` placeholders unless the caller asks for their base64 data.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..text import strip_ansi
from .format import join_source

TEXT_MIME_PREFERENCE = ("text/markdown", "text/plain")


def truncate_text(text: str, limit: int) -> str:
    """Keep the first ``limit`` characters of ``text`` and say how much was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... truncated {len(text) - limit} more characters]"


def _is_textual(mime: str) -> bool:
    return (
        mime.startswith("text/")
        or mime == "application/json"
        or mime.endswith("+json")
        or mime in ("application/javascript", "image/svg+xml")
    )


def _text(value: Any) -> str | None:
    """A string or list of strings as one string; None for anything else (a malformed output)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    return None


def _binary_size(data: Any) -> int:
    raw = _text(data)
    if raw is None:
        return 0
    try:
        return len(base64.b64decode(raw, validate=False))
    except (binascii.Error, ValueError):
        return len(raw)


def _plain(value: Any) -> Any:
    return strip_ansi(value) if isinstance(value, str) else value


def summarize_output(output: dict[str, Any], max_chars: int, include_binary: bool) -> dict[str, Any]:
    """One output as an agent sees it."""
    kind = output.get("output_type")
    summary: dict[str, Any] = {"output_type": kind}
    if kind == "stream":
        summary["name"] = output.get("name")
        summary["text"] = truncate_text(strip_ansi(_text(output.get("text", "")) or ""), max_chars)
    elif kind == "error":
        summary["ename"] = _plain(output.get("ename"))
        summary["evalue"] = _plain(output.get("evalue"))
        traceback = output.get("traceback") or []
        text = "\n".join(strip_ansi(line) for line in traceback if isinstance(line, str))
        summary["traceback"] = truncate_text(text, max_chars)
    elif kind in ("execute_result", "display_data", "update_display_data"):
        if "execution_count" in output:
            summary["execution_count"] = output.get("execution_count")
        data = output.get("data")
        if not isinstance(data, dict):
            data = {}
        text = None
        for mime in TEXT_MIME_PREFERENCE:
            if mime in data:
                text = _text(data[mime])
                break
        if text is not None:
            summary["text"] = truncate_text(strip_ansi(text), max_chars)
        attachments = []
        for mime, value in sorted(data.items()):
            if mime in TEXT_MIME_PREFERENCE:
                continue
            if _is_textual(mime):
                raw = _text(value)
                size = len(raw.encode()) if raw is not None else None
                entry: dict[str, Any] = {"mime": mime, "bytes": size}
            else:
                entry = {"mime": mime, "bytes": _binary_size(value)}
                if include_binary:
                    entry["data"] = _text(value) if isinstance(value, list) else value
            attachments.append(entry)
        if attachments:
            summary["data"] = attachments
    return summary


def summarize_cell(cell: dict[str, Any], index: int, max_chars: int, include_binary: bool) -> dict[str, Any]:
    """One cell as an agent sees it: index, id, type, source as one string, count, outputs."""
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
            summarize_output(o, max_chars, include_binary) for o in outputs if isinstance(o, dict)
        ]
    return summary


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
