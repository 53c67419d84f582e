"""MCP resources: the server's notebooks and their cells' outputs, for clients that attach resources to a
conversation (``resources/list``, ``resources/read``, ``resources/templates/list`` of the MCP
specification). Pure: the same services the tools call, no Tornado.

- ``jupyter://notebooks/{+path}``: a notebook, as ``notebook_read`` renders it for a model (text/plain).
  ``resources/list`` lists the notebooks the caller may read, a page at a time (the cursor is the
  file listing's ``next_start``).
- ``jupyter://notebooks/{+path}/cells/{cell}/outputs/{n}``: one output of a cell in full, one content per
  MIME type: text types as text, others (images) as base64 ``blob``. ``cell`` is an id or ``@index``.
- ``jupyter://focus``: what the person looks at in JupyterLab when they share it with the caller (JSON, as
  ``GET /api/agent/focus`` answers it); ``resources/subscribe`` to it sends
  ``notifications/resources/updated`` when it changes (:mod:`jupyter_agent_tools.focus`).

Paths in URIs are percent-encoded per segment; every path goes through the notebook store or the file
listing, which check it (root, hidden files, an agent token's globs) as for the tools.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from typing import Any

from ..errors import BadRequest
from ..files import list_files
from ..focus import FOCUS_URI
from ..notebook.reading import ReadView, output_body, render_text
from ..notebook.summary import is_textual
from .tools import Services

SCHEME = "jupyter://notebooks/"
NOTEBOOK_TEMPLATE = SCHEME + "{+path}"
OUTPUT_TEMPLATE = SCHEME + "{+path}/cells/{cell}/outputs/{n}"
PAGE = 200  # notebooks per resources/list page
MAX_URI_CHARS = 8192
_OUTPUT = re.compile(r"(?P<path>.+\.ipynb)/cells/(?P<cell>[^/]+)/outputs/(?P<n>\d{1,9})")

TEMPLATES = [
    {
        "uriTemplate": NOTEBOOK_TEMPLATE,
        "name": "notebook",
        "title": "A notebook",
        "description": "A notebook's cells and outputs summarized, as text for a model (path: .ipynb).",
        "mimeType": "text/plain",
    },
    {
        "uriTemplate": OUTPUT_TEMPLATE,
        "name": "notebook-output",
        "title": "One output of a cell",
        "description": "One output in full: one content per MIME type, images as blobs. 'cell' is the cell's "
        "id or @index, 'n' the output's index.",
    },
    {
        "uriTemplate": FOCUS_URI,
        "name": "focus",
        "title": "What the person looks at",
        "description": "The notebook, active cell (source, outputs summarized), selected text and kernel "
        "state of the person's JupyterLab tab, when they share their focus with you (off by default: the "
        "Agents panel's 'Share my focus'). resources/subscribe to it: notifications/resources/updated on "
        "change.",
        "mimeType": "application/json",
    },
]


class ResourceNotFound(Exception):
    """A URI that names no resource this server has (JSON-RPC -32002)."""

    def __init__(self, uri: str, message: str):
        super().__init__(message)
        self.uri = uri
        self.message = message


def notebook_uri(path: str) -> str:
    return SCHEME + urllib.parse.quote(path, safe="/")


def parse_uri(uri: str) -> tuple[str, str | None, int | None]:
    """(notebook path, cell, output index) named by a resource URI; the cell and index are None for the
    notebook itself. Raises :class:`ResourceNotFound` for another URI."""
    if len(uri) > MAX_URI_CHARS or not uri.startswith(SCHEME):
        raise ResourceNotFound(uri[:200], f"Resource not found: {uri[:200]!r} (URIs start with {SCHEME!r})")
    rest = uri[len(SCHEME) :].split("?", 1)[0].split("#", 1)[0]
    match = _OUTPUT.fullmatch(rest)
    if match is not None:
        path = urllib.parse.unquote(match["path"])
        return path, urllib.parse.unquote(match["cell"]), int(match["n"])
    path = urllib.parse.unquote(rest)
    if not path.endswith(".ipynb"):
        raise ResourceNotFound(uri, f"Resource not found: {uri[:200]!r} (not a notebook or an output of one)")
    return path, None, None


async def list_resources(services: Services, cursor: str | None) -> dict[str, Any]:
    """One page of the notebooks the caller may read (``nextCursor`` when there are more)."""
    manager = services.notebook_store.contents_manager
    try:
        page = await list_files(
            manager, "", glob="**/*.ipynb", limit=PAGE, start=cursor or None, outside_top=True
        )
    except BadRequest as e:
        raise BadRequest(f"Invalid cursor: {e.message}") from None
    resources = []
    for entry in page["entries"]:
        if entry["type"] != "notebook":
            continue
        resource: dict[str, Any] = {
            "uri": notebook_uri(entry["path"]),
            "name": entry["path"],
            "title": entry["path"].rsplit("/", 1)[-1],
            "mimeType": "text/plain",
        }
        if entry["size"] is not None:
            resource["size"] = entry["size"]
        if entry["last_modified"]:
            resource["annotations"] = {"lastModified": entry["last_modified"]}
        resources.append(resource)
    result: dict[str, Any] = {"resources": resources}
    if page["next_start"] is not None:
        result["nextCursor"] = page["next_start"]
    return result


def read_focus(services: Services, agent: str | None) -> dict[str, Any]:
    """``{"contents": [...]}`` of ``jupyter://focus`` for ``agent`` (its token name; None: not an agent):
    a 403 :class:`AgentToolsError` saying how the person shares it when nothing is shared with it."""
    answer = services.focus.read(agent)
    text = json.dumps(answer, ensure_ascii=False)
    return {"contents": [{"uri": FOCUS_URI, "mimeType": "application/json", "text": text}]}


async def read_resource(services: Services, uri: str) -> dict[str, Any]:
    """``{"contents": [...]}`` of a resource URI (see the module's docstring)."""
    path, cell, n = parse_uri(uri)
    store = services.notebook_store
    if cell is None or n is None:
        answer = await store.read(path, view=ReadView())
        text = render_text(answer, output_tool="notebook_output_read")
        return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]}
    output, answer = await store.read_output(path, cell, n)
    where = f"Output {n} of cell {cell}"
    contents: list[dict[str, Any]] = []
    for mime in answer["mimes"]:
        try:
            body = output_body(output, mime, lambda: where)
        except BadRequest:
            continue  # malformed data in the file: the other types still come
        if is_textual(mime) or output.get("output_type") in ("stream", "error"):
            text = body.data.decode("utf-8", errors="replace")
            contents.append({"uri": uri, "mimeType": mime, "text": text})
        else:
            contents.append({"uri": uri, "mimeType": mime, "blob": base64.b64encode(body.data).decode()})
    return {"contents": contents}
