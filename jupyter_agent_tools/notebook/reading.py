"""Reading a notebook for a model: which cells (paging, ids), which extra fields, JSON or compact text, and
one output in full (or one MIME type of it as bytes).

Pure: no Tornado, no I/O. The store loads the notebook; the handler and the MCP tool turn what is built here
into an answer.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote

from ..errors import BadRequest, NotFound
from ..text import human_size, strip_ansi
from .summary import Link, data_size, is_textual, joined_text, summarize_cell

MAX_READ_LIMIT = 10_000  # cells in one page
MAX_CELL_REFS = 1000  # cells named in one cell_ids
INCLUDES = ("tags", "metadata", "attachments")
FORMATS = ("json", "text")
INDEX_REF = re.compile(r"@(\d{1,9})")  # a cell addressed by index: '@3' (never a valid nbformat cell id)
MIME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}")
# Types a browser renders inline without running anything; every other type is served as an attachment.
INLINE_MIMES = ("text/plain", "application/json", "image/png", "image/jpeg", "image/gif", "image/webp")
EXTENSIONS = {
    "text/plain": "txt",
    "text/html": "html",
    "text/markdown": "md",
    "text/latex": "tex",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "application/json": "json",
    "application/javascript": "js",
    "application/pdf": "pdf",
}


@dataclass(frozen=True)
class ReadView:
    """What a read returns: a page of cells or named cells, extra fields, JSON or text."""

    start: int = 0
    limit: int | None = None
    cell_refs: tuple[str, ...] | None = None
    include: frozenset[str] = field(default_factory=frozenset)
    text: bool = False
    include_binary: bool = False


def read_view(
    *,
    start: int | None = None,
    limit: int | None = None,
    cell_ids: str | Iterable[str] | None = None,
    include: str | Iterable[str] | None = None,
    format: str | None = None,
    include_binary: bool = False,
) -> ReadView:
    """A checked :class:`ReadView`; :class:`BadRequest` naming the parameter that is wrong."""
    if start is not None and not 0 <= start <= 10**9:
        raise BadRequest(f"'start' must be an integer from 0 (the first cell), got {start}")
    if limit is not None and not 1 <= limit <= MAX_READ_LIMIT:
        raise BadRequest(f"'limit' must be an integer from 1 to {MAX_READ_LIMIT}, got {limit}")
    refs: tuple[str, ...] | None = None
    if cell_ids is not None:
        refs = tuple(_items(cell_ids))
        if not refs:
            raise BadRequest("'cell_ids' names no cell: give ids (or @index) separated by commas")
        if len(refs) > MAX_CELL_REFS:
            raise BadRequest(f"'cell_ids' names {len(refs)} cells; at most {MAX_CELL_REFS} in one read")
        if start is not None or limit is not None:
            raise BadRequest("Give either 'cell_ids' or 'start'/'limit', not both")
    wanted = frozenset(_items(include)) if include is not None else frozenset()
    unknown = sorted(wanted - set(INCLUDES))
    if unknown:
        raise BadRequest(f"Unknown 'include' value {unknown[0]!r} (allowed: {', '.join(INCLUDES)})")
    if format is not None and format not in FORMATS:
        raise BadRequest(f"'format' must be one of {', '.join(FORMATS)}, got {format[:40]!r}")
    return ReadView(start or 0, limit, refs, wanted, format == "text", include_binary)


def _items(value: str | Iterable[str]) -> list[str]:
    parts = value.split(",") if isinstance(value, str) else list(value)
    return [p.strip() for p in parts if p.strip()]


def query_int(name: str, value: str | None) -> int | None:
    """A query parameter as an integer (None when absent), or a 400 naming it."""
    if value is None:
        return None
    text = value.strip()
    if not re.fullmatch(r"-?\d{1,12}", text):
        raise BadRequest(f"'{name}' must be an integer, got {value[:40]!r}")
    return int(text)


# ------------------------------------------------------------------------------------- addressing cells


def cell_ref(cells: list[dict[str, Any]], index: int, id_counts: dict[Any, int]) -> str:
    """How a cell is addressed in a route: its id when it has a unique one, else ``@index``."""
    cell_id = cells[index].get("id")
    if isinstance(cell_id, str) and cell_id and id_counts.get(cell_id) == 1 and "," not in cell_id:
        return cell_id
    return f"@{index}"


def id_counts(cells: list[dict[str, Any]]) -> dict[Any, int]:
    counts: dict[Any, int] = {}
    for cell in cells:
        key = cell.get("id")
        if isinstance(key, str):
            counts[key] = counts.get(key, 0) + 1
    return counts


def find_cell(cells: list[dict[str, Any]], ref: str) -> int:
    """The index of the cell ``ref`` names: a cell id, or ``@index``. 404 naming it when there is none;
    400 when the id is shared by several cells (address one by ``@index``)."""
    matches = [i for i, cell in enumerate(cells) if cell.get("id") == ref]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        at = ", ".join(f"@{i}" for i in matches[:10])
        raise BadRequest(f"Cell id {ref!r} is shared by {len(matches)} cells ({at}): address one by @index")
    match = INDEX_REF.fullmatch(ref)
    if match:
        index = int(match.group(1))
        if index < len(cells):
            return index
        raise NotFound(f"No cell @{index}: the notebook has {len(cells)} cells (@0 to @{len(cells) - 1})")
    raise NotFound(f"No cell with id {ref[:100]!r} (address a cell by its id, or by index as @3)")


def select(cells: list[dict[str, Any]], view: ReadView) -> list[int]:
    """Indices of the cells a read returns, in the order asked (cell_ids) or notebook order (a page)."""
    if view.cell_refs is not None:
        return [find_cell(cells, ref) for ref in view.cell_refs]
    end = len(cells) if view.limit is None else min(len(cells), view.start + view.limit)
    return list(range(min(view.start, len(cells)), end))


# -------------------------------------------------------------------------------------------- the answer


def output_url(path: str, ref: str, n: int, mime: str | None = None) -> str:
    """The route of one output (without the server's base_url)."""
    url = f"/api/agent/notebooks/{quote(path)}/cells/{quote(ref, safe='@')}/outputs/{n}"
    return f"{url}?mime={quote(mime, safe='/')}" if mime else url


def _link(path: str, ref: str) -> Link:
    def link(n: int, mime: str | None) -> str:
        return output_url(path, ref, n, mime)

    return link


def read_notebook(
    nb: dict[str, Any], path: str, hash_: str, max_chars: int, view: ReadView
) -> dict[str, Any]:
    """The JSON answer of a read: the cells ``view`` selects, summarized, with the total cell count."""
    cells: list[dict[str, Any]] = nb["cells"]
    indices = select(cells, view)
    counts = id_counts(cells)
    summaries = []
    for index in indices:
        cell = cells[index]
        ref = cell_ref(cells, index, counts)
        summary = summarize_cell(cell, index, max_chars, view.include_binary, _link(path, ref))
        if "tags" in view.include:
            tags = _metadata(cell).get("tags")
            summary["tags"] = [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []
        if "metadata" in view.include:
            summary["metadata"] = {k: v for k, v in _metadata(cell).items() if k != "trusted"}
        if "attachments" in view.include and cell.get("cell_type") in ("markdown", "raw"):
            summary["attachments"] = _attachments(cell, view.include_binary)
        summaries.append(summary)
    paged = view.cell_refs is None
    last = indices[-1] + 1 if indices else min(view.start, len(cells))
    return {
        "path": path,
        "nbformat": nb.get("nbformat"),
        "nbformat_minor": nb.get("nbformat_minor"),
        "hash": hash_,
        "cell_count": len(cells),
        "start": view.start if paged else None,
        "next_start": last if paged and last < len(cells) else None,
        "cells": summaries,
    }


def _metadata(cell: dict[str, Any]) -> dict[str, Any]:
    metadata = cell.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _attachments(cell: dict[str, Any], include_binary: bool) -> list[dict[str, Any]]:
    attachments = cell.get("attachments")
    if not isinstance(attachments, dict):
        return []
    found = []
    for name, bundle in sorted(attachments.items()):
        if not isinstance(bundle, dict):
            continue
        for mime, value in sorted(bundle.items()):
            entry: dict[str, Any] = {"name": name, "mime": mime, "bytes": _size(mime, value)}
            if include_binary:
                entry["data"] = joined_text(value)
            found.append(entry)
    return found


def _size(mime: str, value: Any) -> int | None:
    raw = joined_text(value)
    if raw is None:
        return None
    return data_size(mime, raw)


# ---------------------------------------------------------------------------------------------- as text


# How a front door reads one output: (notebook path, cell id or @index, output index, MIME type) -> the
# call to show; None for the parts a header leaves as placeholders.
OutputCall = Callable[[str, str | None, int | None, str | None], str]


def render_text(
    answer: dict[str, Any], output_tool: str | None = None, *, output_call: OutputCall | None = None
) -> str:
    """The compact plain-text rendering of a read answer, for a model's context.

    A header (path, version, hash, which cells of how many, how to read one output in full), then per
    cell a ``### [index] type id=... exec=N`` line, its source, and one ``-> out[n] ...`` block per output
    (text as summarized, other MIME types as ``[mime size]``; a cut text ends with ``[full: ...]``). One
    output is read with the output route (``[full: ?mime=...]`` is the query that returns all of a cut
    text), with ``output_tool`` when given (the MCP tool, named with its arguments), or as
    ``output_call`` says (the CLI's command).
    """
    count, cells = answer["cell_count"], answer["cells"]
    version = f"{answer['nbformat']}.{answer['nbformat_minor']}"
    head = f"# {answer['path']} nbformat {version} hash {answer['hash']}"
    if answer.get("start") is None:
        shown = f"{len(cells)} of {count} cells by id"
    elif cells:
        shown = f"cells {cells[0]['index']}-{cells[-1]['index']} of {count}"
    else:
        shown = f"no cells from {answer['start']} of {count}"
    more = f"; next page: start={answer['next_start']}" if answer["next_start"] is not None else ""
    if output_call is not None:
        how = output_call(answer["path"], None, None, None)
    elif output_tool is None:
        url = f"/api/agent/notebooks/{quote(answer['path'])}/cells/<id or @index>/outputs/<n>[?mime=<type>]"
        how = f"GET {url}"
    else:
        path = json.dumps(answer["path"], ensure_ascii=False)
        how = f'{output_tool} {{"path": {path}, "cell": "<id or @index>", "output": <n>}}'
    lines = [f"{head}\n# {shown}{more}\n# one output in full: {how}"]
    # What a read may say about the file itself (a converted nbformat 3 file, a notebook invalid as found).
    if answer.get("converted_from"):
        lines.append(
            f"# this file is nbformat {answer['converted_from']}, shown converted: an edit must send "
            "upgrade: true (the whole file is then rewritten as nbformat 4.5)"
        )
    if answer.get("problems"):
        lines.append("# invalid as found (an edit must send repair: true): " + "; ".join(answer["problems"]))
    if answer.get("changes_since"):
        lines.append(since_text(answer["changes_since"]))
    for cell in cells:
        lines.append(
            _cell_text(cell, output_tool, output_call and functools.partial(output_call, answer["path"]))
        )
    return "\n".join(lines) + "\n"


def since_text(since: dict[str, Any]) -> str:
    """One line saying what changed since the version a read asked about (``changes_since``)."""
    version = str(since.get("since", ""))[:12]
    if not since.get("since_known"):
        return f"# changes since {version}: unknown (the change ledger does not know that version)"
    cells = since.get("cells") or []
    if not cells:
        return f"# changes since {version}: none"
    parts = []
    for cell in cells:
        who = (
            f"{cell['user']} via {cell['via']}, change {cell['change_id']}" if cell.get("user") else "unknown"
        )
        name = cell["id"] if cell.get("id") else f"@{cell.get('index')}"
        parts.append(f"{name} {'+'.join(cell['what'])} ({who})")
    return f"# changes since {version}: " + "; ".join(parts)


def _cell_text(cell: dict[str, Any], output_tool: str | None, output_call: Callable[..., str] | None) -> str:
    header = f"### [{cell['index']}] {cell['cell_type']}"
    if cell.get("id") is not None:
        header += f" id={cell['id']}"
    if cell.get("execution_count") is not None:
        header += f" exec={cell['execution_count']}"
    if cell.get("tags"):
        header += f" tags={','.join(cell['tags'])}"
    lines = [header]
    if cell.get("metadata"):
        lines.append("metadata: " + json.dumps(cell["metadata"], ensure_ascii=False, separators=(",", ":")))
    for entry in cell.get("attachments", []):
        lines.append(f"attachment: {entry['name']} {entry['mime']} {human_size(entry['bytes'])}")
    if cell["source"]:
        lines.append(cell["source"])
    for n, output in enumerate(cell.get("outputs", [])):
        lines.append(_output_text(n, output, output_tool, output_call))
    return "\n".join(lines)


def _output_text(
    n: int, output: dict[str, Any], output_tool: str | None, output_call: Callable[..., str] | None
) -> str:
    kind = output.get("output_type")
    head = f"-> out[{n}] {kind}"
    body: list[str] = []
    if kind == "stream":
        head += f" {output.get('name')}"
        body.append(output.get("text", ""))
    elif kind == "error":
        head += f" {output.get('ename')}: {output.get('evalue')}"
        body.append(output.get("traceback", ""))
    else:
        if "text" in output:
            body.append(output["text"])
        for entry in output.get("data", []):
            body.append(f"[{entry['mime']} {human_size(entry['bytes'])}]")
    # the cell as the route names it: .../cells/<ref>/outputs/<n>?mime=...
    ref = unquote(output.get("full", "").rpartition("/cells/")[2].partition("/outputs/")[0])
    if "full" in output and output_call is not None:
        mime = parse_qs(output["full"].partition("?")[2]).get("mime", [None])[0]
        body.append(f"[full: {output_call(ref, n, mime)}]")
    elif "full" in output and output_tool is None:
        body.append(f"[full: ?{output['full'].partition('?')[2]}]")
    elif "full" in output:
        body.append(f"[full: {output_tool} {json.dumps({'cell': ref, 'output': n}, ensure_ascii=False)}]")
    text = "\n".join(b.rstrip("\n") for b in body if b)
    return f"{head}\n{text}" if text else head


# ------------------------------------------------------------------------------------------ one output


def full_output(output: dict[str, Any]) -> dict[str, Any]:
    """An nbformat output with every multi-line string joined (as stored otherwise)."""
    result = dict(output)
    for key in ("text",):
        if key in result and joined_text(result[key]) is not None:
            result[key] = joined_text(result[key])
    data = result.get("data")
    if isinstance(data, dict):
        result["data"] = {
            mime: (joined_text(value) if not _is_json(mime) and joined_text(value) is not None else value)
            for mime, value in data.items()
        }
    return result


def output_mimes(output: dict[str, Any]) -> list[str]:
    """The MIME types one output can be read as with ``?mime=``."""
    kind = output.get("output_type")
    if kind in ("stream", "error"):
        return ["text/plain"]
    data = output.get("data")
    return sorted(data) if isinstance(data, dict) else []


def read_output(
    nb: dict[str, Any], path: str, hash_: str, ref: str, n: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the output as stored, the JSON answer of the output route) for output ``n`` of cell ``ref``."""
    cells: list[dict[str, Any]] = nb["cells"]
    index = find_cell(cells, ref)
    cell = cells[index]
    outputs = [o for o in (cell.get("outputs") or []) if isinstance(o, dict)]
    if cell.get("cell_type") != "code":
        raise NotFound(f"Cell {ref[:100]!r} (@{index}) is a {cell.get('cell_type')} cell: it has no outputs")
    if n >= len(outputs):
        has = f"outputs 0 to {len(outputs) - 1}" if outputs else "no outputs"
        raise NotFound(f"Cell {ref[:100]!r} (@{index}) has {has}; there is no output {n}")
    output = outputs[n]
    answer = {
        "path": path,
        "hash": hash_,
        "cell_index": index,
        "cell_id": cell.get("id"),
        "output_index": n,
        "mimes": output_mimes(output),
        "output": full_output(output),
    }
    return output, answer


def _is_json(mime: str) -> bool:
    return mime == "application/json" or mime.endswith("+json")


@dataclass(frozen=True)
class OutputBody:
    """One MIME type of an output as an HTTP body: its bytes, Content-Type, and whether it may be shown
    inline by a browser (else it is served as an attachment)."""

    data: bytes
    content_type: str
    inline: bool
    filename: str


def output_body(output: dict[str, Any], mime: str, describe: Callable[[], str]) -> OutputBody:
    """One MIME type of ``output`` as bytes: base64 decoded for binary types, text as UTF-8 (ANSI escapes
    removed from text/plain), JSON serialized. 404 naming the types there are; 400 for a bad ``mime``."""
    if not MIME_PATTERN.fullmatch(mime):
        raise BadRequest(f"'mime' must be a MIME type like image/png (in a URL, + is %2B), got {mime[:60]!r}")
    kind = output.get("output_type")
    available = output_mimes(output)
    if mime not in available:
        there = ", ".join(available) or "none"
        raise NotFound(f"{describe()} has no {mime} (MIME types: {there})")
    ext = EXTENSIONS.get(mime, "bin")
    filename = f"output.{ext}"
    if kind == "stream":
        text = strip_ansi(joined_text(output.get("text", "")) or "")
        return OutputBody(text.encode(), "text/plain; charset=utf-8", True, filename)
    if kind == "error":
        traceback = output.get("traceback") or []
        text = "\n".join(strip_ansi(line) for line in traceback if isinstance(line, str))
        if not text:
            text = f"{output.get('ename')}: {output.get('evalue')}"
        return OutputBody(text.encode(), "text/plain; charset=utf-8", True, filename)
    value = output["data"][mime]
    inline = mime in INLINE_MIMES
    if _is_json(mime):
        data = json.dumps(value, ensure_ascii=False).encode()
        content_type = mime if mime == "application/json" else f"{mime}; charset=utf-8"
        return OutputBody(data, content_type, inline, filename)
    raw = joined_text(value)
    if raw is None:
        raise BadRequest(f"{describe()}: its {mime} data is not text (the notebook stores it malformed)")
    if is_textual(mime):
        if mime == "text/plain":
            raw = strip_ansi(raw)
        return OutputBody(raw.encode(), f"{mime}; charset=utf-8", inline, filename)
    try:
        data = base64.b64decode("".join(raw.split()), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{describe()}: its {mime} data is not valid base64") from None
    return OutputBody(data, mime, inline, filename)
