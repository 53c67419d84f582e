"""The MCP tools: one entry per agent route, calling the very service method that route's handler calls.

An entry names the permissions of the route it wraps (asked of the server's authorizer before anything
runs), its input schema (the route's request schema, self-contained), the schema of its structured answer
(the route's answer schema) and a short description written for a model. A tool for a new route is one
more entry in ``_TOOLS`` (as ``notebook_run`` is for ``POST /api/agent/notebooks/{path}/run``).
Errors of the services (:class:`~jupyter_agent_tools.errors.AgentToolsError`) become tool errors
with the route's message. Pure: no Tornado.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..audit.context import current_user
from ..errors import AgentToolsError, BadRequest
from ..execution.dispatch import run_eval
from ..execution.request import parse_eval_request, parse_run_request
from ..files import MAX_DEPTH as MAX_FILE_DEPTH
from ..files import MAX_LIMIT as MAX_FILE_LIMIT
from ..files import list_files
from ..ledger.text import change_text, changes_text
from ..notebook.reading import INCLUDES, MAX_CELL_REFS, MAX_READ_LIMIT, output_body, read_view, render_text
from ..notebook.summary import base64_size, data_size, is_textual, joined_text
from ..runs.registry import Viewer
from ..schemas import ACTIONS, CELL_TYPES, is_create_request
from ..stream_events import Emit, StreamEvent
from ..text import human_size
from ..validation import json_type, short_repr
from .tool_schemas import component, portable, without_image_data, without_null
from .tool_schemas import field as schema_field

if TYPE_CHECKING:
    from ..approvals import ApprovalPolicy
    from ..execution.eval_service import EvalService
    from ..execution.notebook_run import NotebookRunner
    from ..focus import FocusStore
    from ..notebook.store import NotebookStore
    from ..runs import RunRegistry

# Images a model can take as image content; others (SVG, TIFF...) stay placeholders.
RASTER_IMAGES = ("image/png", "image/jpeg", "image/gif", "image/webp")
MAX_IMAGE_BYTES = 5 * 1024 * 1024  # the per-image limit of the common model APIs
ARTIFACT_PAGE, MAX_ARTIFACT_PAGE, MIN_ARTIFACT_PAGE = 64 * 1024, 1024 * 1024, 16
REQUIRED: Any = object()


class Services(Protocol):
    """What the tools call: the extension's services (``AgentToolsApp`` has them)."""

    eval_service: EvalService
    notebook_store: NotebookStore
    notebook_runner: NotebookRunner
    run_registry: RunRegistry
    approval_policy: ApprovalPolicy
    focus: FocusStore


@dataclass(frozen=True)
class Image:
    mime: str
    data: str  # base64


@dataclass
class ToolResult:
    """What a tool gives back: text for the model, the route's JSON answer, images, or an error."""

    text: str
    structured: Any = None
    images: list[Image] = field(default_factory=list)
    is_error: bool = False


@dataclass
class ToolCall:
    """One call of a tool: its arguments, the cancel signal and where running output goes."""

    services: Services
    arguments: dict[str, Any]
    cancel: asyncio.Event
    progress: Callable[[str], None]
    # The server's authorizer, for a tool that asks it more than its own permissions (the server asks
    # those, and an eval's extra ones, before the call: execution/dispatch.extra_permissions).
    authorize: Callable[[str, str], Awaitable[bool]] | None = None


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    permissions: tuple[tuple[str, str], ...]  # (action, resource) pairs: what the wrapped route asks
    input_schema: dict[str, Any]
    run: Callable[[ToolCall], Awaitable[ToolResult]]
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, bool] = field(default_factory=dict)
    task_support: str | None = None  # "optional": may run as an MCP task (protocol 2025-11-25)
    # May wait for the person (the approval gate, :mod:`.gates`): takes ``approval_wait``, and a call still
    # pending after it answers the summary of the run that goes on once approved (see ``run_status``).
    gated: bool = False


# ------------------------------------------------------------------------------------------ arguments

_KINDS = {"string": (str,), "boolean": (bool,), "integer": (int,), "array": (list,), "number": (int, float)}
_WORDS = {
    "string": "a string",
    "boolean": "a boolean",
    "integer": "an integer",
    "array": "an array",
    "number": "a number",
}


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _KINDS[kind])


def options(
    arguments: dict[str, Any], known: dict[str, tuple[str, Any]], *, rest: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tool's own arguments (type-checked, defaults applied) and the rest (a route body, if ``rest``)."""
    own: dict[str, Any] = {}
    for name, (kind, default) in known.items():
        if name not in arguments:
            if default is REQUIRED:
                raise BadRequest(f"'{name}' is required")
            own[name] = default
        elif not _is(arguments[name], kind):
            raise BadRequest(f"'{name}' must be {_WORDS[kind]}, got {json_type(arguments[name])}")
        else:
            own[name] = arguments[name]
    body = {key: value for key, value in arguments.items() if key not in known}
    if body and not rest:
        allowed = ", ".join(known) or "none"
        raise BadRequest(f"unknown argument {short_repr(next(iter(body)))} (allowed: {allowed})")
    return own, body


# -------------------------------------------------------------------------------------------- images


def _take_image(mime: str, data: str, size: int, include: bool, images: list[Image]) -> str:
    """Attach an image when asked and possible; the placeholder text that says what happened."""
    what = f"{mime} image, {human_size(size)}"
    if not include:
        return f"[{what}: not attached; images are sent only with include_images: true]"
    if mime not in RASTER_IMAGES:
        return f"[{what}: not attached (image content is {', '.join(RASTER_IMAGES)} only)]"
    if size > MAX_IMAGE_BYTES:
        return f"[{what}: not attached (larger than {human_size(MAX_IMAGE_BYTES)})]"
    images.append(Image(mime, "".join(data.split())))
    return f"[{what}: attached as image {len(images)}]"


def _ran(result: Mapping[str, Any], include: bool, label: Callable[[dict[str, Any]], str]) -> ToolResult:
    """The tool result of an eval or a notebook run: the answer's text with a line for each image (what
    :func:`_images_out` did with it), its structured form without image data, the images attached."""
    images: list[Image] = []
    notes: list[str] = []
    structured = _images_out(result, include, label, images, notes)
    text = "\n".join([str(result.get("output") or "") or "(no output)", *notes])
    return ToolResult(text, structured, images, is_error=raised(result))


def _images_out(
    result: Mapping[str, Any],
    include: bool,
    label: Callable[[dict[str, Any]], str],
    images: list[Image],
    notes: list[str],
) -> dict[str, Any]:
    """An eval's or a notebook run's answer with the base64 of each image display taken out: attached
    to ``images`` when ``include`` and possible, a placeholder line naming the cell (``label``) in
    ``notes`` either way; the display keeps its MIME type, its size and a run's url. The one image
    rewrite of the eval, notebook_run and run_status tools. A placeholder display (an eval image past
    max_display_bytes) has no data and stays as it is."""
    cells = []
    for cell in result.get("cells", []):
        displays = []
        for display in cell.get("displays", []):
            if display.get("type") == "image" and ("data" in display or "url" in display):
                display = dict(display)
                data = display.pop("data", None)
                mime = str(display.get("mime"))
                size = int(display.get("bytes") or data_size(mime, str(data or "")))
                display["bytes"] = size
                placeholder = _take_image(mime, str(data or ""), size, include and data is not None, images)
                notes.append(f"{label(cell)}: {placeholder}")
            displays.append(display)
        cells.append({**cell, "displays": displays})
    return {**result, "cells": cells}


# ---------------------------------------------------------------------------------------------- eval

INCLUDE_IMAGES = {
    "type": "boolean",
    "default": False,
    "description": "Attach images (PNG, JPEG, GIF, WebP) as image content; otherwise each is a placeholder.",
}


DETACH = {"type": "boolean", "description": "Return a run_id at once; the run goes on (see run_status)."}


def raised(result: Mapping[str, Any]) -> bool:
    """Whether a run's answer (eval's, a notebook run's) failed: a cell raised, or the call itself did. A
    model reads ``isError: false`` as success; the traceback stays in the text."""
    cells = result.get("cells") or []
    return bool(result.get("error")) or any(cell.get("status") == "error" for cell in cells)


def tool_state(result: Mapping[str, Any], cancel_requested: bool) -> str:
    """The state of a tool call run as an MCP task, from its CallToolResult."""
    if result.get("isError"):
        return "error"
    structured = result.get("structuredContent") or {}
    if cancel_requested:
        return "cancelled"
    if structured.get("timed_out"):
        return "timed_out"
    return "interrupted" if structured.get("cancelled") else "complete"


def _or_started(*schemas: dict[str, Any]) -> dict[str, Any]:
    """A run tool's answer: its result, or (detach: true; or still waiting for the person's approval) the
    started run's summary."""
    return {"type": "object", "anyOf": [*schemas, component("RunSummary")]}


APPROVAL_WAIT = {
    "type": "number",
    "minimum": 0,
    "description": "Seconds to wait for approval if asked (then a run to follow).",
}


def _gated(tool: Tool) -> Tool:
    """A gated tool as listed: ``approval_wait`` among its arguments (the gate takes it, the tool never
    sees it)."""
    if not tool.gated:
        return tool
    schema = copy.deepcopy(tool.input_schema)
    schema["properties"]["approval_wait"] = APPROVAL_WAIT
    return dataclasses.replace(tool, input_schema=schema)


def _started(run: Any) -> ToolResult:
    text = (
        f"Run {run.id} started ({run.state}); it goes on without this call. Its state and, once it ended, "
        f"its output: run_status with run_id '{run.id}' (and wait: seconds to wait for the end)."
    )
    return ToolResult(text, run.summary())


def _progress(call: ToolCall) -> Emit:
    """A call's events as the tool call's progress: its output text, and a kernel restart's notice."""

    def on_event(event: StreamEvent) -> None:
        if event["type"] == "chunk":
            call.progress(event["text"])
        elif event["type"] == "restart":
            call.progress(f"{event['message']}\n")

    return on_event


async def _eval(call: ToolCall) -> ToolResult:
    own, body = options(call.arguments, {"include_images": ("boolean", False)}, rest=True)
    if body.get("detach") is True:
        request = parse_eval_request(body, call.services.eval_service.max_cells)
        target = request.session if request.mode == "session" else None
        return _started(
            call.services.run_registry.start(
                "eval", target, functools.partial(_run_eval, call.services, body)
            )
        )

    result = await _run_eval(call.services, body, _progress(call), call.cancel)
    return _ran(result, own["include_images"], lambda cell: f"cell {cell.get('index', 0) + 1}")


# ----------------------------------------------------------------------------------------- notebooks

NOTEBOOK_PATH = {
    "type": "string",
    "description": "The notebook's path relative to the server root, ending in .ipynb (e.g. 'work/a.ipynb').",
}


FOCUS = {
    "type": "boolean",
    "description": "The notebook and cell the person shares ('this cell'); path optional.",
}
FOCUS_TOOLS = ("notebook_read", "notebook_output_read", "notebook_edit", "notebook_run")
FOCUS_PERMISSIONS = (("read", "agent_focus"),)  # what reading the shared focus asks (GET /api/agent/focus)


def focus_permissions(tool: str, arguments: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """What a call asks besides its tool's permissions for ``focus: true``."""
    return FOCUS_PERMISSIONS if tool in FOCUS_TOOLS and arguments.get("focus") is True else ()


def resolve_focus(
    tool: str, arguments: dict[str, Any], focus: FocusStore, agent: str | None
) -> dict[str, Any]:
    """A notebook tool's arguments with ``focus`` resolved (the one place for every notebook tool): with
    ``focus: true`` the path of the notebook the person shares, and the focused cell where no cell is
    named; then the call goes on as if the agent had given them (the same authorization, the same gate).
    The focus's errors (:meth:`FocusStore.focused_cell`): 403 not shared, 409 no active cell, 400 another
    path."""
    if tool not in FOCUS_TOOLS:
        return arguments
    given = {key: value for key, value in arguments.items() if key != "focus"}
    wanted = arguments.get("focus", False)
    if not isinstance(wanted, bool):
        raise BadRequest(f"'focus' must be a boolean, got {json_type(wanted)}")
    if not wanted:
        if "path" not in given:
            raise BadRequest("'path' is required (or focus: true for the notebook the person shares)")
        return given
    path = given.get("path")
    if path is not None and not isinstance(path, str):
        raise BadRequest(f"'path' must be a string, got {json_type(path)}")
    if tool == "notebook_edit" and is_create_request(given):
        raise BadRequest("focus: true names a notebook that exists; 'create' needs the new one's 'path'")
    cell = focus.focused_cell(agent, path)
    given["path"] = cell.path
    if tool == "notebook_read":
        if all(given.get(key) is None for key in ("cell_ids", "start", "limit")):
            given["cell_ids"] = [cell.ref]
    elif tool == "notebook_output_read":
        given.setdefault("cell", cell.ref)
    elif tool == "notebook_run":
        if all(key not in given for key in ("cell_ids", "cell_indices", "all", "ops")):
            if cell.id is not None:
                given["cell_ids"] = [cell.id]
            else:
                given["cell_indices"] = [cell.index]
    elif "ops" not in given and all(given.get(key) is None for key in ("cell_id", "cell_index")):
        action = given.get("action")
        if action == "insert":  # after the focused cell
            if cell.index is None:
                raise AgentToolsError("The shared focus does not give its cell's index: give cell_index", 409)
            given["cell_index"] = cell.index + 1
        elif action == "clear_outputs" and given.get("all"):
            pass  # every cell's
        elif cell.id is not None:
            given["cell_id"] = cell.id
        else:
            given["cell_index"] = cell.index
    return given


NOTEBOOK_READ_ARGUMENTS: dict[str, tuple[str, Any]] = {
    "path": ("string", REQUIRED),
    "include_images": ("boolean", False),
    "start": ("integer", None),
    "limit": ("integer", None),
    "cell_ids": ("array", None),
    "include": ("array", None),
    "since": ("string", None),
}


async def _notebook_read(call: ToolCall) -> ToolResult:
    own, _ = options(call.arguments, NOTEBOOK_READ_ARGUMENTS)
    view = read_view(
        start=own["start"],
        limit=own["limit"],
        cell_ids=_strings(own["cell_ids"], "cell_ids"),
        include=_strings(own["include"], "include"),
        include_binary=own["include_images"],
    )
    answer = await call.services.notebook_store.read(own["path"], view=view, since=own["since"])
    images: list[Image] = []
    notes: list[str] = []
    for cell in answer["cells"]:
        for n, output in enumerate(cell.get("outputs", [])):
            for entry in output.get("data", []):
                mime, size = str(entry.get("mime")), entry.get("bytes") or 0
                if mime.startswith("image/"):  # its base64 never stays in the structured answer
                    placeholder = _take_image(
                        mime, str(entry.pop("data", "")), size, own["include_images"], images
                    )
                    notes.append(f"[{cell['index']}] out[{n}]: {placeholder}")
    text = render_text(answer, output_tool="notebook_output_read")
    if notes:
        text += "\n".join(notes) + "\n"
    return ToolResult(text, answer, images)


def _notebook_read_input() -> dict[str, Any]:
    return _object(
        {
            "path": NOTEBOOK_PATH,
            "focus": FOCUS,
            "include_images": INCLUDE_IMAGES,
            "start": {"type": "integer", "minimum": 0, "description": "First cell of a page (0-based)."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_READ_LIMIT,
                "description": "Most cells in the page (default: all).",
            },
            "cell_ids": {
                "type": "array",
                "items": {"type": "string"},
                "maxItems": MAX_CELL_REFS,
                "description": "Only these cells, in this order: ids, or @index for a cell without one.",
            },
            "include": {
                "type": "array",
                "items": {"type": "string", "enum": list(INCLUDES)},
                "description": "Extra cell fields: tags, metadata, attachments (names and sizes).",
            },
            "since": {
                "type": "string",
                "description": "An earlier answer's hash: also list cells changed since, and by whom.",
            },
        },
        [],
    )


def _strings(value: list[Any] | None, name: str) -> list[str] | None:
    if value is not None and not all(isinstance(v, str) for v in value):
        raise BadRequest(f"'{name}' must be an array of strings")
    return value


async def _notebook_output_read(call: ToolCall) -> ToolResult:
    own, _ = options(
        call.arguments,
        {"path": ("string", REQUIRED), "cell": ("string", REQUIRED), "output": ("integer", REQUIRED)},
    )
    if own["output"] < 0:
        raise BadRequest("'output' must be at least 0")
    output, answer = await call.services.notebook_store.read_output(own["path"], own["cell"], own["output"])
    where = f"cell {answer['cell_id'] or '@' + str(answer['cell_index'])} output {answer['output_index']}"
    images: list[Image] = []
    lines = [f"[{where}: {output.get('output_type')}; MIME types: {', '.join(answer['mimes']) or 'none'}]"]
    data: dict[str, Any] = output["data"] if isinstance(output.get("data"), dict) else {}
    for mime in answer["mimes"]:
        if mime.startswith("image/") and mime != "image/svg+xml":
            raw = joined_text(data.get(mime)) or ""
            lines.append(_take_image(mime, raw, base64_size(raw), True, images))
            continue
        if not (is_textual(mime) or output.get("output_type") in ("stream", "error")):
            raw = joined_text(data.get(mime)) or ""
            lines.append(f"[{mime}, {human_size(base64_size(raw))}: binary, not shown]")
            continue
        try:
            body = output_body(output, mime, lambda: where[:1].upper() + where[1:])
        except BadRequest as e:  # malformed data in the file: say so, show the rest
            lines.append(f"[{mime}: {e.message}]")
            continue
        text = body.data.decode("utf-8", errors="replace")
        lines += [f"[{mime}, {human_size(len(body.data))}]", text.rstrip("\n")]
    structured = dict(answer)
    if isinstance(answer["output"].get("data"), dict):  # image base64 goes as image content only
        structured["output"] = {
            **answer["output"],
            "data": {k: v for k, v in answer["output"].get("data", {}).items() if k not in RASTER_IMAGES},
        }
    return ToolResult("\n".join(lines), structured, images)


async def _notebook_edit(call: ToolCall) -> ToolResult:
    own, body = options(call.arguments, {"path": ("string", REQUIRED)}, rest=True)
    store = call.services.notebook_store
    if is_create_request(body):
        created = await store.create(own["path"], body)
        text = render_text(created, output_tool="notebook_output_read")
        return ToolResult(f"{created['message']}\n{text}", created)
    answer = await store.edit(own["path"], body)
    messages = [result["message"] for result in answer.get("results", [])] or [answer["message"]]
    if "upgraded_from" in answer:
        messages.append(f"Upgraded the file from nbformat {answer['upgraded_from']} to 4.5.")
    messages += [f"repaired: {repair}" for repair in answer.get("repairs", [])]
    if answer.get("note"):  # cannot be undone (and how to fix that), or nothing changed
        messages.append(answer["note"])
    return ToolResult("\n".join([*messages, f"hash: {answer['hash']}"]), answer)


def _notebook_edit_input() -> dict[str, Any]:
    """One operation's fields or ``ops``, flat: several model APIs refuse a top-level ``oneOf``. The body
    (all but ``path``) is checked by the route's own validator, so the route's messages still apply."""
    schema = {
        "type": "object",
        "properties": {
            "path": NOTEBOOK_PATH,
            "focus": FOCUS,
            "action": {
                "type": "string",
                "enum": [*ACTIONS, "create"],
                "description": "One operation: edit (replace a cell's source, outputs kept), insert, delete, "
                "move, clear_outputs (one cell, or all: true), replace (old -> new in a cell), or create "
                "(a new notebook). Leave out when sending 'ops'.",
            },
            "cell_index": {
                "type": "integer",
                "description": "0-based index of the cell (insert: where it goes; default: the end).",
            },
            "cell_id": {
                "type": "string",
                "description": "Address the cell by id instead of index (insert: the new cell's id).",
            },
            "content": schema_field("EditRequest", "content"),
            "cell_type": {
                "type": "string",
                "enum": list(CELL_TYPES),
                "description": "insert: the new cell's type (default code); edit: convert the cell to it.",
            },
            "to_index": schema_field("MoveRequest", "to_index"),
            "all": {"type": "boolean", "description": "clear_outputs: every cell; replace: every match."},
            "old": {"type": "string", "description": "replace: exact text, matching once unless all."},
            "new": {"type": "string"},
            "cells": {
                "type": "array",
                "items": {"type": "object", "required": ["source"]},
                "description": "create: [{cell_type, source}].",
            },
            "kernel_name": {"type": "string", "description": "create: default the server's."},
            "parents": {"type": "boolean", "description": "create: make missing folders."},
            "ops": {
                # each op's fields are the ones above: the items are not spelled out a second time (the
                # route's validator checks each op and names what is wrong)
                "type": "array",
                "items": {"type": "object", "required": ["action"]},
                "minItems": 1,
                "description": "Several operations, applied in order, all or none (one save); each has "
                "the fields above.",
            },
            "expected_hash": schema_field("NotebookBatchRequest", "expected_hash"),
            # (the tool's description says when each is needed; the route's schema has the long story)
            "upgrade": {"type": "boolean", "description": "Write an nbformat 3 file converted to 4.5."},
            "repair": {"type": "boolean", "description": "Apply nbformat's repairs first (listed)."},
        },
        "required": [],
        "additionalProperties": False,
    }
    result: dict[str, Any] = without_null(schema)
    return result


# -------------------------------------------------------------------------- sessions, artifacts, files

SESSION_NAME = {"type": "string", "description": "The session's name (as given to eval, or listed)."}
SESSION_OWNER = {
    "type": "string",
    "description": "Whose session of that name (names are per identity); default: yours.",
}
SESSION_ARGUMENTS = {"name": ("string", REQUIRED), "owner": ("string", None)}


async def _session_list(call: ToolCall) -> ToolResult:
    options(call.arguments, {})
    service = call.services.eval_service
    answer = await service.listing_with_notebooks()
    sessions = answer["sessions"]
    lines = [
        f"- {s['name']}{' (notebook ' + s['notebook'] + ')' if s.get('notebook') else ''}: "
        f"{'busy' if s['busy'] else 'idle'}, kernel {s.get('kernel_name') or '-'} "
        f"({s['kernel_id'] or 'not started'}), {s['queue_depth']} queued, {s['restarts']} restarts, "
        f"last used {s['last_used']}"
        for s in sessions
    ]
    lines += [
        f"- notebook {k['path']}: kernel {k.get('kernel_name') or '-'} ({k['kernel_id']}), {k['state']}"
        + (", a person is connected" if k["person_connected"] else "")
        for k in answer["notebook_kernels"]
    ]
    return ToolResult("\n".join(lines) if lines else "No eval sessions.", answer)


async def _session_interrupt(call: ToolCall) -> ToolResult:
    own, _ = options(call.arguments, SESSION_ARGUMENTS)
    answer = await call.services.eval_service.interrupt_session(own["name"], own["owner"])
    if answer["interrupted"]:
        text = f"Session {own['name']!r}: its running call was cancelled (it answers cancelled: true)."
    else:
        text = f"Session {own['name']!r} was running nothing; its kernel was sent an interrupt anyway."
    return ToolResult(text, answer)


async def _session_delete(call: ToolCall) -> ToolResult:
    own, _ = options(call.arguments, SESSION_ARGUMENTS)
    await call.services.eval_service.delete_session(own["name"], own["owner"])
    return ToolResult(f"Session {own['name']!r} and its kernel were shut down; its artifacts are removed.")


async def _artifact_read(call: ToolCall) -> ToolResult:
    own, _ = options(
        call.arguments,
        {"id": ("string", REQUIRED), "offset": ("integer", 0), "limit": ("integer", ARTIFACT_PAGE)},
    )
    if own["offset"] < 0:
        raise BadRequest("'offset' must be at least 0")
    limit = min(max(own["limit"], MIN_ARTIFACT_PAGE), MAX_ARTIFACT_PAGE)
    page = call.services.eval_service.artifacts.read_text_page(own["id"], own["offset"], limit)
    offset, end, total, next_offset = page.offset, page.size, page.total, page.next_offset
    more = f"more: artifact_read with offset {next_offset}" if next_offset is not None else "end"
    answer = {
        "artifact_id": own["id"],
        "offset": offset,
        "bytes": end,
        "total_bytes": total,
        "next_offset": next_offset,
        "text": page.text,
    }
    return ToolResult(
        f"[artifact {own['id']}: bytes {offset}-{offset + end} of {total}; {more}]\n{page.text}", answer
    )


ARTIFACT_OUTPUT = {
    "type": "object",
    "properties": {
        "artifact_id": {"type": "string"},
        "offset": {"type": "integer", "description": "byte offset of 'text' in the artifact"},
        "bytes": {"type": "integer", "description": "bytes of the artifact 'text' holds"},
        "total_bytes": {"type": "integer"},
        "next_offset": {"type": ["integer", "null"], "description": "where the next page starts; null: end"},
        "text": {"type": "string"},
    },
    "required": ["artifact_id", "offset", "bytes", "total_bytes", "next_offset", "text"],
}


async def _file_list(call: ToolCall) -> ToolResult:
    own, _ = options(
        call.arguments,
        {
            "path": ("string", ""),
            "recursive": ("boolean", False),
            "limit": ("integer", 500),
            "glob": ("string", None),
            "max_depth": ("integer", None),
            "start": ("string", None),
            "ignored": ("boolean", False),
        },
    )
    manager = call.services.notebook_store.contents_manager
    answer = await list_files(manager, **own)
    lines = [f"{answer['path'] or '/'}: {len(answer['entries'])} entries"]
    for entry in answer["entries"]:
        modified = str(entry["last_modified"] or "")[:19]
        if entry["type"] == "directory":
            lines.append(f"{entry['path']}/ {modified}")
        else:
            size = f", {human_size(entry['size'])}" if entry["size"] is not None else ""
            lines.append(f"{entry['path']} ({entry['type']}{size}) {modified}")
    if answer["truncated"]:
        why = "the walk's time or entry budget ran out; " if answer["stopped"] == "budget" else ""
        lines.append(f"({why}more: call again with start={answer['next_start']!r})")
    return ToolResult("\n".join(lines), answer)


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _eval_input() -> dict[str, Any]:
    schema = component("EvalRequest")
    schema["properties"]["include_images"] = INCLUDE_IMAGES
    schema["properties"]["detach"] = DETACH
    result: dict[str, Any] = without_null(schema)
    return result


def _run_eval(
    services: Services, body: Any, emit: Emit, cancel: asyncio.Event
) -> Awaitable[Mapping[str, Any]]:
    """An eval's service call (as a detached run calls it: ``emit``, ``cancel``)."""
    return run_eval(services.eval_service, services.notebook_runner, body, emit=emit, cancel=cancel)


def _run_notebook(
    runner: NotebookRunner, path: str, body: Any, emit: Emit, cancel: asyncio.Event
) -> Awaitable[Mapping[str, Any]]:
    return runner.run(path, body, emit=emit, cancel=cancel)


def service_call(
    services: Services, tool: str, arguments: dict[str, Any], emit: Emit, cancel: asyncio.Event
) -> Awaitable[Mapping[str, Any]]:
    """The service call behind an eval or notebook_run tool call, as its detached run makes it."""
    _own, body = options(arguments, {"include_images": ("boolean", False)}, rest=True)
    if tool == "eval":
        return _run_eval(services, body, emit, cancel)
    path = str(body.pop("path"))
    return _run_notebook(services.notebook_runner, path, body, emit, cancel)


async def _notebook_run(call: ToolCall) -> ToolResult:
    own, body = options(call.arguments, {"path": ("string", REQUIRED)}, rest=True)
    if body.get("detach") is True:
        runner = call.services.notebook_runner
        parse_run_request(body)
        path, *_ = await runner.store.load(own["path"], writable=True)
        run = call.services.run_registry.start(
            "notebook_run", str(path), functools.partial(_run_notebook, runner, own["path"], body)
        )
        return _started(run)

    result = await call.services.notebook_runner.run(
        own["path"], body, emit=_progress(call), cancel=call.cancel
    )
    # a run's images carry their data only when include_images was asked (the runner's own option)
    return _ran(result, True, lambda cell: f"cell {cell.get('cell_id') or '@' + str(cell.get('index'))}")


def _notebook_run_input() -> dict[str, Any]:
    schema = component("NotebookRunRequest")
    schema.pop("oneOf", None)  # several model APIs refuse it; the route's own validator still applies
    schema["properties"] = {
        "path": NOTEBOOK_PATH,
        "focus": FOCUS,
        **schema["properties"],
        "include_images": INCLUDE_IMAGES,
    }
    schema["properties"]["detach"] = DETACH
    schema["properties"]["ops"] = {  # the route validates each op (notebook_edit's schema, not repeated)
        "type": "array",
        "items": {"type": "object"},
        "description": "notebook_edit's ops, applied first (one save); with no cells named, the code cells "
        "they insert or edit run.",
    }
    schema["required"] = []
    result: dict[str, Any] = without_null(schema)
    return result


# ------------------------------------------------------------------------------------- detached runs

MAX_RUN_WAIT = 600.0


async def _run_status(call: ToolCall) -> ToolResult:
    own, _ = options(call.arguments, {"run_id": ("string", None), "wait": ("number", 0)})
    registry = call.services.run_registry
    viewer = Viewer(current_user())  # an MCP caller sees its own runs
    if own["run_id"] is None:
        runs = registry.list(viewer)
        lines = [
            f"{r.id} {r.state} {r.kind} {r.target or '-'} cells {r.summary()['cells_done']}/{len(r.cells)}"
            for r in runs
        ]
        return ToolResult("\n".join(lines) or "No detached runs.", {"runs": [r.summary() for r in runs]})
    wait = own["wait"]
    if wait != wait or not 0 <= wait <= MAX_RUN_WAIT:
        raise BadRequest(f"'wait' must be seconds from 0 to {MAX_RUN_WAIT:g}")
    run = registry.get(own["run_id"], viewer)
    if wait and not run.finished:
        await wait_or_cancelled(registry.wait(run, wait), call.cancel)
    detail = run.detail()
    if run.result is not None:
        detail["result"] = _images_out(run.result, False, str, [], [])  # their data: only by URL
    lines = [f"Run {run.id}: {run.state}" + (f" ({run.message})" if run.message else "")]
    lines += [f"cell {c['index']}: {c['status']}" for c in detail["cells"]]
    if run.result is not None:
        lines.append(_result_text(run.kind, run.result))
    elif not run.finished:
        lines.append("Still running: call run_status again (wait: seconds to wait for the end).")
    return ToolResult("\n".join(lines), detail)


def _result_text(kind: str, result: Mapping[str, Any]) -> str:
    """A finished run's output for a model: an eval's or a notebook run's output, or the text of a tool
    call's result (a call that waited for the person's approval, a task)."""
    if kind == "mcp_tool":
        texts = [str(c.get("text")) for c in result.get("content") or [] if c.get("type") == "text"]
        return ("Error: " if result.get("isError") else "") + "\n".join(texts)
    return str(result.get("output") or "") or "(no output)"


def _run_status_output() -> dict[str, Any]:
    schema = without_image_data(component("RunDetail"))
    schema["required"] = []
    schema["properties"]["runs"] = {"type": "array", "items": component("RunSummary")}
    return schema


async def _run_cancel(call: ToolCall) -> ToolResult:
    own, _ = options(call.arguments, {"run_id": ("string", REQUIRED)})
    run = call.services.run_registry.cancel(own["run_id"], Viewer(current_user()))
    if run.finished:
        return ToolResult(f"Run {run.id} had already ended ({run.state}).", run.summary())
    return ToolResult(f"Run {run.id}: cancel requested; its kernel is being interrupted.", run.summary())


async def wait_or_cancelled(waiting: Awaitable[Any], cancel: asyncio.Event) -> None:
    """Wait, unless the MCP call is cancelled first (the run goes on either way)."""
    task = asyncio.ensure_future(waiting)
    stop = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()
        stop.cancel()


# ------------------------------------------------------------------------------------- change ledger


async def _notebook_changes(call: ToolCall) -> ToolResult:
    own, _ = options(
        call.arguments,
        {
            "path": ("string", REQUIRED),
            "change_id": ("string", None),
            "limit": ("integer", None),
            "before": ("string", None),
        },
    )
    store = call.services.notebook_store
    if own["change_id"] is not None:
        entry = await store.change_detail(own["path"], own["change_id"])
        answer = {"path": entry["path"], "changes": [entry], "next_before": None}
        return ToolResult(change_text(entry), answer)
    listing = await store.changes(own["path"], limit=own["limit"], before=own["before"])
    return ToolResult(changes_text(listing, own["path"]), listing)


async def _notebook_undo(call: ToolCall) -> ToolResult:
    own, body = options(
        call.arguments, {"path": ("string", REQUIRED), "change_id": ("string", REQUIRED)}, rest=True
    )
    answer = await call.services.notebook_store.undo(own["path"], own["change_id"], body)
    return ToolResult(f"{answer['message']}\nhash: {answer['hash']}", answer)


async def _notebook_kernel(call: ToolCall) -> ToolResult:
    own, _ = options(call.arguments, {"path": ("string", REQUIRED), "action": ("string", None)})
    runner = call.services.notebook_runner
    if own["action"] is None:
        answer = await runner.kernel(own["path"])
    else:
        answer = await runner.kernel_action(own["path"], {"action": own["action"]})
    text = answer.get("message") or (
        f"Kernel of {answer['path']}: {answer['state']}"
        + (f", {answer['kernel_name']} ({answer['kernel_id']})" if answer["kernel_id"] else "")
        + (", a person is connected" if answer["person_connected"] else "")
    )
    return ToolResult(text, answer)


READ_ONLY = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}

_TOOLS: tuple[Tool, ...] = (
    Tool(
        name="eval",
        title="Run Python",
        description="Run Python cells in a Jupyter kernel of the server and get their output. State persists "
        "between calls of the same 'session' (default 'default'); mode 'per-call' uses a fresh kernel. "
        "Cells run in order and stop at the first error. Returns the combined output (a long one keeps its "
        "tail; artifact_read has all) and per-cell results. Streams output as progress while it runs.",
        permissions=(("execute", "kernels"),),
        input_schema=_eval_input(),
        output_schema=_or_started(without_image_data(component("EvalResult"))),
        run=_eval,
        annotations={"readOnlyHint": False, "destructiveHint": True, "openWorldHint": True},
        task_support="optional",
        gated=True,
    ),
    Tool(
        name="notebook_read",
        title="Read a notebook",
        description="Read a notebook: each cell's index, id, type, source and outputs summarized (long "
        "text cut, images as placeholders unless include_images; notebook_output_read gives one output in "
        "full). A big notebook a page at a time (start, limit; see cell_count, next_start), or some cells "
        "(cell_ids). Its 'hash' is notebook_edit's expected_hash. Says when the file is nbformat 3 (edits "
        "need upgrade: true) or invalid (its 'problems'; edits need repair: true).",
        permissions=(("read", "contents"),),
        input_schema=_notebook_read_input(),
        output_schema=component("NotebookRead"),
        run=_notebook_read,
        annotations=READ_ONLY,
    ),
    Tool(
        name="notebook_output_read",
        title="Read one output in full",
        description="Read one output of a notebook cell in full: the whole text of an output notebook_read "
        "cut ('[full: ...]'), every MIME type of a result (HTML, JSON...), or an image as image content "
        "(PNG, JPEG, GIF, WebP). 'cell' is the cell's id or @index, 'output' the output's index (out[n]).",
        permissions=(("read", "contents"),),
        input_schema=_object(
            {
                "path": NOTEBOOK_PATH,
                "focus": FOCUS,
                "cell": {"type": "string", "description": "The cell's id, or @index (e.g. '@3')."},
                "output": {"type": "integer", "minimum": 0, "description": "The output's index in the cell."},
            },
            ["output"],
        ),
        output_schema=component("NotebookOutput"),
        run=_notebook_output_read,
        annotations=READ_ONLY,
    ),
    Tool(
        name="notebook_edit",
        title="Edit a notebook",
        description="Change a notebook cell by cell: edit a cell's source (outputs kept), replace text in "
        "it, insert, delete or move cells; or create a notebook. Send one operation or several as 'ops' (all "
        "applied or none). With expected_hash (from notebook_read) nothing changes if the notebook changed "
        "since. Works on the live document when the notebook is open in JupyterLab. An nbformat 3 file "
        "needs upgrade: true; a notebook invalid as found (notebook_read lists its 'problems') needs "
        "repair: true. Returns what was done and the new hash.",
        permissions=(("write", "contents"),),
        input_schema=_notebook_edit_input(),
        output_schema=_or_started(  # create answers as a read does
            component("NotebookChangeResult"), component("NotebookCreated")
        ),
        run=_notebook_edit,
        annotations={"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False},
        gated=True,
    ),
    Tool(
        name="notebook_run",
        title="Run a notebook's cells",
        description="Run cells of a notebook in the notebook's own kernel (the one a person sees in "
        "JupyterLab; state is shared with them) and write their outputs into the notebook. Name the cells "
        "with one of cell_ids, cell_indices or all: true (with ops: the cells they insert or edit); they "
        "run in notebook order and stop at the first error unless stop_on_error is false. Returns each "
        "cell's status and output text and the new hash. Streams output as progress while it runs.",
        permissions=(("write", "contents"), ("execute", "kernels")),
        input_schema=_notebook_run_input(),
        output_schema=_or_started(without_image_data(component("NotebookRunResult"))),
        run=_notebook_run,
        annotations={"readOnlyHint": False, "destructiveHint": True, "openWorldHint": True},
        task_support="optional",
        gated=True,
    ),
    Tool(
        name="notebook_kernel",
        title="A notebook's kernel",
        description="A notebook's own kernel: state, kernelspec, whether a person is connected; with "
        "'action' interrupt, restart (state is lost) or shutdown it. eval with 'notebook' runs code there.",
        permissions=(("execute", "kernels"),),
        input_schema=_object(
            {
                "path": NOTEBOOK_PATH,
                "action": {"type": "string", "enum": ["interrupt", "restart", "shutdown"]},
            },
            ["path"],
        ),
        output_schema=_or_started(component("NotebookKernel")),
        run=_notebook_kernel,
        annotations={"readOnlyHint": False, "destructiveHint": True, "openWorldHint": False},
        gated=True,
    ),
    Tool(
        name="session_list",
        title="List eval sessions",
        description="List the eval sessions (kernels) of the server: name, kernel, busy or idle, queued "
        "calls, restarts, last use.",
        permissions=(("read", "kernels"),),
        input_schema=_object({}, []),
        output_schema=component("SessionList"),
        run=_session_list,
        annotations=READ_ONLY,
    ),
    Tool(
        name="session_interrupt",
        title="Interrupt a session",
        description="Interrupt what an eval session is running (like Ctrl-C): the running eval call ends "
        "with cancelled: true. The session and its state stay.",
        permissions=(("execute", "kernels"),),
        input_schema=_object({"name": SESSION_NAME, "owner": SESSION_OWNER}, ["name"]),
        output_schema=component("InterruptResult"),
        run=_session_interrupt,
        annotations={"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True},
    ),
    Tool(
        name="session_delete",
        title="Shut a session down",
        description="Shut an eval session and its kernel down (its state and artifacts are lost); a call "
        "running in it is cancelled.",
        permissions=(("execute", "kernels"),),
        input_schema=_object({"name": SESSION_NAME, "owner": SESSION_OWNER}, ["name"]),
        run=_session_delete,
        annotations={"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False},
        gated=True,
    ),
    Tool(
        name="artifact_read",
        title="Read a full output",
        description="Read the full output of an eval cell whose output was truncated (its artifact_id, or "
        "the id in 'Full: artifact://<id>'), a page at a time: 'offset' and 'limit' in bytes (default "
        "65536, at most 1 MiB). Returns the text and next_offset (null at the end).",
        permissions=(("read", "kernels"),),
        input_schema=_object(
            {
                "id": {"type": "string", "description": "The artifact id."},
                "offset": {"type": "integer", "minimum": 0, "default": 0, "description": "Byte to start at."},
                "limit": {"type": "integer", "minimum": 1, "default": ARTIFACT_PAGE, "description": "Bytes."},
            },
            ["id"],
        ),
        output_schema=ARTIFACT_OUTPUT,
        run=_artifact_read,
        annotations=READ_ONLY,
    ),
    Tool(
        name="file_list",
        title="List files",
        description="Find notebooks and files: a folder's entries with sizes and times (hidden files as "
        "JupyterLab shows them; .gitignore'd ones with 'ignored'). 'recursive', 'glob' (e.g. '**/*.ipynb') "
        "or 'max_depth' walk subfolders. At most 'limit' entries (default 500); next_start is the next "
        "page's 'start'.",
        permissions=(("read", "contents"),),
        input_schema=_object(
            {
                "path": {"type": "string", "default": "", "description": "Folder relative to the root."},
                "recursive": {"type": "boolean", "default": False},
                "glob": {"type": "string"},
                "max_depth": {"type": "integer", "minimum": 1, "maximum": MAX_FILE_DEPTH},
                "start": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_FILE_LIMIT, "default": 500},
                "ignored": {"type": "boolean", "default": False},
            },
            [],
        ),
        output_schema=component("FileList"),
        run=_file_list,
        annotations=READ_ONLY,
    ),
    Tool(
        name="notebook_changes",
        title="A notebook's changes",
        description="A notebook's recorded changes (edits, runs, undos), newest first: who, how, which "
        "cells. With change_id: its before/after and diffs.",
        permissions=(("read", "contents"),),
        input_schema=_object(
            {
                "path": {"type": "string"},
                "change_id": {"type": "string"},
                "limit": {"type": "integer"},
                "before": {"type": "string", "description": "Older than this change_id."},
            },
            ["path"],
        ),
        output_schema=component("ChangeList"),
        run=_notebook_changes,
        annotations=READ_ONLY,
    ),
    Tool(
        name="notebook_undo",
        title="Undo a change",
        description="Undo a change (change_id from an edit's answer or notebook_changes) as one atomic "
        "edit; refused, naming the cells, if they changed since.",
        permissions=(("write", "contents"),),
        input_schema=_object(
            {
                "path": {"type": "string"},
                "change_id": {"type": "string"},
                "expected_hash": {"type": "string"},
            },
            ["path", "change_id"],
        ),
        output_schema=_or_started(component("UndoResult")),
        run=_notebook_undo,
        annotations={"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False},
        gated=True,
    ),
    Tool(
        name="run_status",
        title="A detached run",
        description="A detached run (eval or notebook_run with detach: true): its state, cells and, once "
        "ended, output. wait: seconds to wait for the end first (max 600). Without run_id: your runs.",
        permissions=(("read", "kernels"),),
        input_schema=_object(
            {"run_id": {"type": "string"}, "wait": {"type": "number", "minimum": 0, "maximum": MAX_RUN_WAIT}},
            [],
        ),
        output_schema=_run_status_output(),
        run=_run_status,
        annotations=READ_ONLY,
    ),
    Tool(
        name="run_cancel",
        title="Stop a detached run",
        description="Stop a detached run (its kernel is interrupted); it ends 'cancelled'.",
        permissions=(("execute", "kernels"),),
        input_schema=_object({"run_id": {"type": "string"}}, ["run_id"]),
        output_schema=component("RunSummary"),
        run=_run_cancel,
        annotations={"readOnlyHint": False, "destructiveHint": True, "openWorldHint": False},
    ),
)

# Answers' schemas as clients that know one type per schema can keep them (inputs are already so).
TOOLS = tuple(
    dataclasses.replace(_gated(tool), output_schema=portable(tool.output_schema)) for tool in _TOOLS
)
