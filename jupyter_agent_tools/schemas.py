"""JSON Schemas (2020-12) of every request and answer of the agent routes: the one source of truth.

The OpenAPI document (:mod:`jupyter_agent_tools.api_document`) publishes these dicts as its
``components/schemas``, and request bodies are validated against the very same dicts
(:mod:`jupyter_agent_tools.validation`). Nothing here does I/O or imports Tornado.

Request schemas are closed (``additionalProperties: false``): a field a route does not take is refused.
Answer schemas are open: clients must ignore fields they do not know, so the server may add some.

``x-errors`` (an OpenAPI extension, ignored by validators) holds the message a caller gets when the
schema keyword of the same name fails there, e.g. ``{"pattern": "'session' must be ..."}``; templates may
use ``{name}`` (the field), ``{value}``, ``{got}`` (the JSON type sent), ``{action}``.
"""

from __future__ import annotations

import copy
from typing import Any

from .wire import TOKEN_MAX_EXPIRES_IN, TOKEN_MIN_EXPIRES_IN

REF = "#/components/schemas/"
ACTIONS = ("edit", "insert", "delete", "move", "clear_outputs", "replace")
CELL_TYPES = ("code", "markdown", "raw")
EVAL_MODES = ("session", "per-call")
CELL_STATUSES = ("complete", "error", "cancelled")
SESSION_NAME_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$"  # never ".", ".." or hidden
CELL_ID_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
NO_NUL_PATTERN = r"^[^\x00]*$"
KERNEL_NAME_PATTERN = r"^[A-Za-z0-9._-]*$"
# The kernel passes os.environ to every process it starts; Linux refuses to start one whose environment
# and arguments exceed ARG_MAX (2 MiB by default), so an eval's env stays well below it.
MAX_ENV_VARS = 1000
MAX_ENV_BYTES = 1024 * 1024


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF + name}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` that also accepts ``null`` (meaning: not given)."""
    out = dict(schema)
    out["type"] = [schema["type"], "null"]
    return out


# ------------------------------------------------------------------------------ notebook edit requests

_CELL_INDEX = {"type": "integer", "description": "0-based index of the cell."}
_CELL_ID = {"type": "string", "description": "Address the cell by its id (nbformat >= 4.5) instead of index."}
_CONTENT = {
    "type": "string",
    "description": "The new source. Stored as a list of lines: every line but the last keeps its '\\n'.",
    "x-errors": {"required": "Content is required for {action} action"},
}
_CELL_TYPE = {"type": "string", "enum": list(CELL_TYPES)}
_EXPECTED_HASH = {
    "type": "string",
    "description": "The 'hash' of an earlier answer: if the file changed since, 409 and nothing is applied.",
    "x-errors": {"type": "'expected_hash' must be a string (the 'hash' of an earlier answer), got {got}"},
}
_UPGRADE = {
    "type": "boolean",
    "description": "For an nbformat 3 (or older) file, which reads show converted: write it converted to "
    "nbformat 4.5 (the whole file is rewritten in nbformat's layout). Without it, an edit of such a file "
    "answers 400. No effect on nbformat 4 files.",
}
_REPAIR = {
    "type": "boolean",
    "description": "For a notebook that is invalid as found (4.4 cells with ids, duplicate or missing ids, "
    "missing nbformat_minor, metadata the schema refuses): apply nbformat's repairs before the "
    "operations and list them in the answer's 'repairs'. Without it, an edit of such a notebook answers "
    "400 naming the problem. No effect on a valid notebook.",
}
_ADDRESS = {
    "anyOf": [{"required": ["cell_index"]}, {"required": ["cell_id"]}],
}
_REPLACE_FIELDS: dict[str, Any] = {
    "old": {
        "type": "string",
        "minLength": 1,
        "description": "The exact text to find in the cell's source (whitespace and newlines included).",
        "x-errors": {"minLength": "'old' must not be empty (the exact text to replace)"},
    },
    "new": {"type": "string", "description": "The text that replaces it."},
    "all": {
        "type": "boolean",
        "description": "Replace every match; without it 'old' must match exactly once.",
    },
}


def _op(action: str, description: str, with_hash: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {"action": {"const": action}}
    required = ["action"]
    if action == "insert":
        properties["cell_index"] = {
            **_CELL_INDEX,
            "description": "Where the new cell goes (0..N); default: at the end.",
        }
        properties["cell_id"] = {
            "type": "string",
            "pattern": CELL_ID_PATTERN,
            "description": "The id of the new cell (nbformat >= 4.5); default: derived deterministically.",
            "x-errors": {
                "pattern": "'cell_id' for a new cell must be 1-64 characters of letters, digits, '-' or '_'"
            },
        }
    else:
        properties["cell_index"] = dict(_CELL_INDEX)
        properties["cell_id"] = dict(_CELL_ID)
    if action in ("edit", "insert"):
        properties["content"] = dict(_CONTENT)
        required.append("content")
        properties["cell_type"] = {
            **_CELL_TYPE,
            "description": "insert: the new cell's type (default code); edit: convert the cell to it.",
        }
    if action == "move":
        properties["to_index"] = {"type": "integer", "description": "The index the cell ends up at."}
        required.append("to_index")
    if action == "clear_outputs":
        properties["all"] = {"const": True, "description": "Clear every code cell's outputs."}
    if action == "replace":
        properties.update(_REPLACE_FIELDS)
        required += ["old", "new"]
    if with_hash:
        properties["expected_hash"] = dict(_EXPECTED_HASH)
        properties["upgrade"] = dict(_UPGRADE)
        properties["repair"] = dict(_REPAIR)
    schema: dict[str, Any] = {
        "type": "object",
        "description": description,
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    if action == "clear_outputs":
        schema["anyOf"] = [*copy.deepcopy(_ADDRESS["anyOf"]), {"required": ["all"]}]
    elif action != "insert":
        schema.update(copy.deepcopy(_ADDRESS))
    return schema


_OP_DESCRIPTIONS = {
    "edit": "Replace a cell's source (outputs kept); with 'cell_type', convert the cell.",
    "insert": "Insert a new cell.",
    "delete": "Delete a cell; the answer's details.cellSource is the removed source.",
    "move": "Move a cell so that it ends up at 'to_index'.",
    "clear_outputs": "Clear a code cell's outputs and execution count (or every code cell's, with 'all').",
    "replace": "Replace exact text inside a cell's source (outputs kept): 'old' must match once, or "
    "every match with 'all'; otherwise 400 listing the matches and their lines.",
}


def _camel(action: str) -> str:
    """``clear_outputs`` -> ``ClearOutputs`` (schema names)."""
    return "".join(part.capitalize() for part in action.split("_"))


def _discriminated(prefix: str, suffix: str, x_type: str) -> dict[str, Any]:
    return {
        "description": "One cell operation, chosen by 'action'.",
        "oneOf": [ref(f"{prefix}{_camel(a)}{suffix}") for a in ACTIONS],
        "discriminator": {
            "propertyName": "action",
            "mapping": {a: REF + f"{prefix}{_camel(a)}{suffix}" for a in ACTIONS},
        },
        "x-errors": {"type": x_type},
    }


NOTEBOOK_SCHEMAS: dict[str, Any] = {}
for _action in ACTIONS:
    # inside a batch (no expected_hash) and as the whole body (with expected_hash)
    NOTEBOOK_SCHEMAS[f"{_camel(_action)}Op"] = _op(_action, _OP_DESCRIPTIONS[_action], False)
    NOTEBOOK_SCHEMAS[f"{_camel(_action)}Request"] = _op(_action, _OP_DESCRIPTIONS[_action], True)
NOTEBOOK_SCHEMAS["CellOp"] = _discriminated("", "Op", "must be a JSON object with an 'action' field")
NOTEBOOK_SCHEMAS["NotebookOpRequest"] = _discriminated(
    "", "Request", 'Request body must be a JSON object: one operation or {"ops": [...]}'
)
NOTEBOOK_SCHEMAS["NotebookBatchRequest"] = {
    "type": "object",
    "description": "Several operations applied in order, atomically (all or none, one save).",
    "properties": {
        "ops": {
            "type": "array",
            "items": ref("CellOp"),
            "minItems": 1,
            "description": "1..NotebookStore.max_ops (default 1000) operations.",
            "x-errors": {
                "type": "'ops' must be a non-empty array of operations",
                "minItems": "'ops' must be a non-empty array of operations",
            },
        },
        "expected_hash": dict(_EXPECTED_HASH),
        "upgrade": dict(_UPGRADE),
        "repair": dict(_REPAIR),
    },
    "required": ["ops"],
    "additionalProperties": False,
    "x-errors": {
        "additionalProperties": "unknown field {name!r} next to 'ops' (a batch takes only 'ops', "
        "'expected_hash', 'upgrade' and 'repair'; put operation fields inside each op)"
    },
}
NOTEBOOK_SCHEMAS["NotebookCreateRequest"] = {
    "type": "object",
    "description": "Create the notebook (nbformat 4.5, the kernelspec set): 409 if the path exists.",
    "properties": {
        "action": {"const": "create"},
        "cells": {
            "type": "array",
            "description": "The first cells (default: none), with ids derived deterministically.",
            "items": {
                "type": "object",
                "properties": {
                    "cell_type": {**_CELL_TYPE, "description": "Default code."},
                    "source": {"type": "string", "description": "The cell's source."},
                },
                "required": ["source"],
                "additionalProperties": False,
                "x-errors": {"type": 'must be an object like {"cell_type": "code", "source": "1+1"}'},
            },
        },
        "kernel_name": {
            "type": "string",
            "minLength": 1,
            "pattern": KERNEL_NAME_PATTERN,
            "description": "The kernelspec (default: the server's default kernel); its display name and "
            "language come from the kernelspec manager.",
        },
        "parents": {"type": "boolean", "description": "Create missing folders (else 404)."},
    },
    "required": ["action"],
    "additionalProperties": False,
}
NOTEBOOK_SCHEMAS["NotebookChangeRequest"] = {
    "description": "One operation, a batch ``{\"ops\": [...]}`` (a body with 'ops' is a batch), or "
    '``{"action": "create"}``.',
    "oneOf": [ref("NotebookOpRequest"), ref("NotebookBatchRequest"), ref("NotebookCreateRequest")],
}


def is_create_request(body: Any) -> bool:
    """Whether a notebook POST body asks to create the notebook (``{"action": "create", ...}``)."""
    return isinstance(body, dict) and body.get("action") == "create" and "ops" not in body


def notebook_request_schema(body: Any) -> str:
    """Which branch of ``NotebookChangeRequest`` a body is meant as: a batch when it has ``ops``."""
    if is_create_request(body):
        return "NotebookCreateRequest"
    return "NotebookBatchRequest" if isinstance(body, dict) and "ops" in body else "NotebookOpRequest"


# ---------------------------------------------------------------------------------------- eval request

EVAL_SCHEMAS: dict[str, Any] = {
    "EvalCell": {
        "type": "object",
        "description": "One piece of Python code to run, with an optional title for the combined output.",
        "properties": {
            "code": {"type": "string"},
            "title": _nullable({"type": "string", "description": "Heads the cell's block: [i/n] title."}),
        },
        "required": ["code"],
        "additionalProperties": False,
        "x-errors": {"type": 'must be an object like {"code": "1+1"}'},
    },
    "EvalRequest": {
        "type": "object",
        "description": "Run cells in a kernel session (or a kernel of its own, mode per-call).",
        "properties": {
            "cells": {
                "type": "array",
                "items": ref("EvalCell"),
                "minItems": 1,
                "description": "1..EvalService.max_cells (default 100) cells, run in order; a failed cell "
                "stops the call.",
                "x-errors": {
                    "required": '\'cells\' is required: a non-empty array of {"code": str, "title"?: str}',
                    "type": '\'cells\' must be a non-empty array of {"code": str, "title"?: str}',
                    "minItems": '\'cells\' must be a non-empty array of {"code": str, "title"?: str}',
                },
            },
            "detach": {
                "type": "boolean",
                "default": False,
                "description": "Answer 202 at once with the run_id (Location: /api/agent/runs/{id}); "
                "the work goes on when the client goes.",
            },
            "notebook": {
                "type": "string",
                "minLength": 1,
                "description": "Run in this notebook's own kernel, sharing its variables (the file is "
                "not written); the session options do not apply.",
            },
            "session": {
                "type": "string",
                "pattern": SESSION_NAME_PATTERN,
                "default": "default",
                "description": "The session (kernel) to run in.",
                "x-errors": {
                    "pattern": "'session' must be 1-64 characters of letters, digits, '.', '_' or '-', "
                    "not starting with '.'"
                },
            },
            "mode": {
                "type": "string",
                "enum": list(EVAL_MODES),
                "default": "session",
                "description": "session: the named session's kernel; per-call: a fresh kernel, shut down "
                "after.",
            },
            "reset": {
                "type": "boolean",
                "default": False,
                "description": "Replace the session's kernel with a fresh one before the first cell.",
            },
            "timeout": {
                "type": "number",
                "default": 30,
                "description": "Seconds for the whole call, clamped to 1..600; on expiry the kernel is "
                "interrupted and the answer has timed_out: true. Detached: none unless given.",
                "x-errors": {"type": "'timeout' must be a number of seconds, got {got}"},
            },
            "cwd": _nullable(
                {
                    "type": "string",
                    "pattern": NO_NUL_PATTERN,
                    "default": "",
                    "description": "Working directory of the kernel: an existing directory, relative to the "
                    "server root (not hidden). null or '': the root.",
                    "x-errors": {
                        "type": "'cwd' must be a path relative to the server root, got {got}",
                        "pattern": "'cwd' must not contain NUL characters",
                    },
                }
            ),
            "env": _nullable(
                {
                    "type": "object",
                    "description": "Environment variables set in the kernel (os.environ) at its start: at "
                    f"most {MAX_ENV_VARS} variables of at most {MAX_ENV_BYTES} bytes (UTF-8) of names and "
                    "values in total.",
                    "maxProperties": MAX_ENV_VARS,
                    "propertyNames": {
                        "pattern": ENV_NAME_PATTERN,
                        "x-errors": {"pattern": "env: {value!r} is not a valid environment variable name"},
                    },
                    "additionalProperties": {
                        "type": "string",
                        "pattern": NO_NUL_PATTERN,
                        "x-errors": {"pattern": "'{name}' must not contain NUL characters"},
                    },
                    "x-errors": {
                        "type": "'env' must be an object of string keys to string values, got {got}",
                        "maxProperties": f"'env' has too many variables; at most {MAX_ENV_VARS} are allowed",
                    },
                }
            ),
            "session_file": _nullable(
                {
                    "type": "string",
                    "pattern": NO_NUL_PATTERN,
                    "description": "Exported to the kernel as PI_SESSION_FILE.",
                    "x-errors": {"pattern": "'session_file' must not contain NUL characters"},
                }
            ),
            "kernel_name": _nullable(
                {
                    "type": "string",
                    "pattern": KERNEL_NAME_PATTERN,
                    "description": "Kernel spec to start (default: the server's default kernel).",
                    "x-errors": {
                        "pattern": "'kernel_name' must be a kernel spec name (letters, digits, '.', '_' "
                        "or '-')"
                    },
                }
            ),
        },
        "required": ["cells"],
        "additionalProperties": False,
        "x-errors": {"type": 'Request body must be a JSON object like {"cells": [{"code": "1+1"}]}'},
    },
}

# -------------------------------------------------------------------------------------------- answers

_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_STR_OR_NULL = {"type": ["string", "null"]}
_INT_OR_NULL = {"type": ["integer", "null"]}
# Any JSON value, said with a keyword: a schema without one constrains nothing (the MCP Inspector warns)
_ANY_JSON = {
    "description": "any JSON value",
    "anyOf": [{"type": kind} for kind in ("object", "array", "string", "number", "boolean", "null")],
}


def _obj(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
    }
    schema.update(extra)
    return schema


# The fields of a display too large for the answer (max_display_bytes), in place of its "data".
_OMITTED: dict[str, Any] = {
    "bytes": {"type": "integer", "description": "UTF-8 bytes of the data (as text: base64, SVG, JSON)"},
    "omitted": {"const": True},
    "artifact_id": {
        **_STR_OR_NULL,
        "description": "GET /api/agent/artifacts/{id}: the data as text (null: it could not be saved)",
    },
}

ANSWER_SCHEMAS: dict[str, Any] = {
    "Error": _obj(
        {
            "message": {"type": "string", "description": "What went wrong and what to fix."},
            "reason": {"type": ["string", "null"], "description": "A short HTTP reason, often null."},
            "traceback": {"type": "string", "description": "Only on a 500 (always empty)."},
        },
        required=["message", "reason"],
        description="Every error answer.",
    ),
    # -- notebooks
    "OutputSummary": _obj(
        {
            "output_type": {"type": "string"},
            "name": {"type": "string", "description": "stream: stdout or stderr"},
            "text": {
                "type": "string",
                "description": "stream text, or the bundle's markdown/plain text; "
                "ANSI removed, truncated at summary_max_chars with a note",
            },
            "ename": {"type": "string"},
            "evalue": {"type": "string"},
            "traceback": {"type": "string", "description": "error: the traceback lines joined, ANSI removed"},
            "execution_count": _INT_OR_NULL,
            "data": {
                "type": "array",
                "description": "Other MIME types of a display/result, sorted: placeholders, and base64 "
                "'data' of binary types when include_binary is set.",
                "items": _obj(
                    {
                        "mime": _STR,
                        "bytes": _INT_OR_NULL,
                        "data": _STR,
                        "url": {
                            "type": "string",
                            "description": "GET this (under the server's base_url): the data as its own "
                            "content type, e.g. the PNG bytes of an image",
                        },
                    },
                    required=["mime", "bytes"],
                ),
            },
            "full": {
                "type": "string",
                "description": "Only when 'text' or 'traceback' was cut: GET this (under the server's "
                "base_url) for all of it",
            },
        },
        required=["output_type"],
        description="One output as an agent reads it (fields by output_type).",
    ),
    "NotebookCell": _obj(
        {
            "index": _INT,
            "id": {**_STR_OR_NULL, "description": "null before nbformat 4.5"},
            "cell_type": {"type": "string", "enum": list(CELL_TYPES)},
            "source": {"type": "string", "description": "The source as one string."},
            "execution_count": _INT_OR_NULL,
            "outputs": {"type": "array", "items": ref("OutputSummary"), "description": "code cells only"},
            "tags": {
                "type": "array",
                "items": _STR,
                "description": "include=tags: metadata.tags (strings only; [] when none)",
            },
            "metadata": {"type": "object", "description": "include=metadata: the cell's whole metadata"},
            "attachments": {
                "type": "array",
                "description": "include=attachments, markdown and raw cells: one entry per attached file "
                "and MIME type; base64 'data' only with include_binary",
                "items": _obj(
                    {"name": _STR, "mime": _STR, "bytes": _INT_OR_NULL, "data": _STR_OR_NULL},
                    required=["name", "mime", "bytes"],
                ),
            },
        },
        required=["index", "id", "cell_type", "source", "execution_count"],
    ),
    "NotebookRead": _obj(
        {
            "path": _STR,
            "nbformat": {**_INT, "description": "4 (also for a file converted from nbformat 3)"},
            "nbformat_minor": {**_INT_OR_NULL, "description": "null when the file has none (see problems)"},
            "hash": {"type": "string", "description": "sha256 hex of the file's bytes: the expected_hash"},
            "cell_count": {"type": "integer", "description": "Cells in the whole notebook"},
            "start": {
                **_INT_OR_NULL,
                "description": "The 'start' of this page (0 by default); null: cells named by cell_ids",
            },
            "next_start": {
                **_INT_OR_NULL,
                "description": "The 'start' of the next page; null when this page reaches the last cell",
            },
            "cells": {
                "type": "array",
                "items": ref("NotebookCell"),
                "description": "The cells of the page (notebook order) or the named cells (order asked)",
            },
            "converted_from": {
                "type": "string",
                "description": "Only for a file older than nbformat 4: its version (e.g. '3.0'). The cells "
                "are shown converted to nbformat 4.5 (ids derived from the file's hash, the same on every "
                "read); an edit must send upgrade: true, which rewrites the whole file as nbformat 4.5.",
            },
            "problems": {
                "type": "array",
                "items": _STR,
                "description": "Only for a notebook invalid as found: what nbformat finds wrong (which cell, "
                "which key). Reads work; an edit must send repair: true.",
            },
        },
        required=["path", "nbformat", "nbformat_minor", "hash", "cell_count", "start", "next_start", "cells"],
        description="A notebook as an agent reads it (values of a file that is not a valid notebook are "
        "copied as stored).",
    ),
    "NotebookOutput": _obj(
        {
            "path": _STR,
            "hash": {"type": "string", "description": "sha256 hex of the file's bytes"},
            "cell_index": _INT,
            "cell_id": _STR_OR_NULL,
            "output_index": _INT,
            "mimes": {
                "type": "array",
                "items": _STR,
                "description": "What ?mime= can ask for: text/plain for a stream or error, else the types "
                "of the output's data",
            },
            "output": {
                "type": "object",
                "properties": {"output_type": _STR},
                "required": ["output_type"],
                "description": "The nbformat output as stored, in full, multi-line strings joined",
            },
        },
        description="One output of a cell in full.",
    ),
    "OpDetails": _obj(
        {
            "action": {"type": "string", "enum": list(ACTIONS)},
            "cellIndex": _INT,
            "cellId": _STR_OR_NULL,
            "cellType": {"type": "string", "enum": list(CELL_TYPES)},
            "totalCells": _INT,
            "cellSource": {"type": "string", "description": "delete: the removed source"},
            "previousCellType": {"type": "string", "description": "only for an edit that converted the cell"},
            "fromIndex": {"type": "integer", "description": "only for move"},
            "clearedCells": {"type": "integer", "description": "only for clear_outputs with all: true"},
            "replacements": {"type": "integer", "description": "only for replace: how many matches"},
        },
        required=["action", "totalCells"],
        description="What one operation did. Every action but clear_outputs with all: true also has "
        "cellIndex, cellId, cellType and cellSource (the cell it worked on); that one has clearedCells.",
        anyOf=[
            {"required": ["cellIndex", "cellId", "cellType", "cellSource"]},
            {"required": ["clearedCells"], "properties": {"action": {"const": "clear_outputs"}}},
        ],
    ),
    "NotebookChangeResult": _obj(
        {
            "message": {"type": "string", "description": "One line: what was done, and the cell count."},
            "details": ref("OpDetails"),
            "hash": {"type": "string", "description": "sha256 hex of the saved bytes: next expected_hash"},
            "results": {
                "type": "array",
                "items": _obj({"message": _STR, "details": ref("OpDetails")}),
                "description": "Every operation's message and details, in order.",
            },
            "repairs": {
                "type": "array",
                "items": _STR,
                "description": "Only with repair: true: each repair made before the operations (empty when "
                "the notebook was valid).",
            },
            "upgraded_from": {
                "type": "string",
                "description": "Only with upgrade: true on an nbformat 3 (or older) file: its old version.",
            },
        },
        required=["message", "details", "hash", "results"],
    ),
    # -- eval
    "Display": {
        "description": "A structured output: a JSON value, an image (base64; SVG as text), or a status. "
        "JSON and image data past max_display_bytes (per cell) is a placeholder, saved as an artifact.",
        "oneOf": [ref("JsonDisplay"), ref("ImageDisplay"), ref("StatusDisplay")],
        "discriminator": {
            "propertyName": "type",
            "mapping": {
                "json": REF + "JsonDisplay",
                "image": REF + "ImageDisplay",
                "status": REF + "StatusDisplay",
            },
        },
    },
    "JsonDisplay": _obj(
        {"type": {"const": "json"}, "data": _ANY_JSON, **_OMITTED},
        required=["type"],
        oneOf=[{"required": ["data"]}, {"required": list(_OMITTED)}],
        description="A JSON value, or past max_display_bytes a placeholder (omitted: true) whose artifact "
        "holds the value as JSON text.",
    ),
    "ImageDisplay": _obj(
        {"type": {"const": "image"}, "mime": _STR, "data": _STR, **_OMITTED},
        required=["type", "mime"],
        oneOf=[{"required": ["data"]}, {"required": list(_OMITTED)}],
        description="An image (base64; SVG as text), or past max_display_bytes a placeholder "
        "(omitted: true) whose artifact holds that text.",
    ),
    "StatusDisplay": _obj({"type": {"const": "status"}, "event": _ANY_JSON}),
    "EvalError": _obj(
        {
            "ename": _STR,
            "evalue": _STR,
            "traceback": {"type": "array", "items": _STR, "description": "ANSI escapes removed"},
        }
    ),
    "EvalCellResult": _obj(
        {
            "index": _INT,
            "title": _STR_OR_NULL,
            "status": {"type": "string", "enum": list(CELL_STATUSES)},
            "output": {"type": "string", "description": "Visible text (tail kept past max_output_bytes)."},
            "exit_code": {"type": "integer", "description": "0 complete, 1 error, 130 cancelled"},
            "error": {"oneOf": [ref("EvalError"), {"type": "null"}]},
            "displays": {"type": "array", "items": ref("Display")},
            "duration_ms": _INT,
            "stdin_requested": _BOOL,
            "truncated": _BOOL,
            "total_bytes": _INT,
            "total_lines": _INT,
            "output_bytes": _INT,
            "output_lines": _INT,
            "artifact_id": {**_STR_OR_NULL, "description": "GET /api/agent/artifacts/{id}: the full output"},
        }
    ),
    "SessionLost": _obj(
        {
            "reason": {"type": "string", "enum": ["evicted", "idle", "dead", "deleted", "released"]},
            "at": {"type": "string", "description": "When it went (UTC, ISO 8601)"},
            "message": {"type": "string", "description": "What happened, in words"},
        }
    ),
    "EvalResult": _obj(
        {
            "session": {**_STR_OR_NULL, "description": "null in per-call and notebook mode"},
            "mode": {"type": "string", "enum": [*EVAL_MODES, "notebook"]},
            "notebook": {"type": "string", "description": "Only with 'notebook': its path"},
            "kernel_id": _STR_OR_NULL,
            "cancelled": _BOOL,
            "timed_out": _BOOL,
            "restarted": _BOOL,
            "session_lost": {
                "oneOf": [ref("SessionLost"), {"type": "null"}],
                "description": "The named session existed and went (evicted, culled, deleted) before this "
                "call, which then ran in a new kernel; null otherwise",
            },
            "error": {**_STR_OR_NULL, "description": "A call-level failure (e.g. restart limit), else null"},
            "output": {"type": "string", "description": "The combined text for a model."},
            "cells": {"type": "array", "items": ref("EvalCellResult"), "description": "The cells that ran."},
            "kernel_start_seconds": {
                "type": "number",
                "description": "Only when the call started a kernel (a new session, a per-call kernel, a "
                "restart): how long that took. Not counted in the call's timeout; 5 s or more is also said "
                "in the output.",
            },
        }
    ),
    "EvalEvent": {
        "description": "One line of the application/x-ndjson stream; the last is 'result' (or 'error').",
        "oneOf": [
            ref(name)
            for name in (
                "CellStartEvent",
                "ChunkEvent",
                "GapEvent",
                "DisplayEvent",
                "CellEndEvent",
                "HeartbeatEvent",
                "RestartEvent",
                "ResultEvent",
                "ErrorEvent",
            )
        ],
        "discriminator": {
            "propertyName": "type",
            "mapping": {
                "cell_start": REF + "CellStartEvent",
                "chunk": REF + "ChunkEvent",
                "gap": REF + "GapEvent",
                "display": REF + "DisplayEvent",
                "cell_end": REF + "CellEndEvent",
                "heartbeat": REF + "HeartbeatEvent",
                "restart": REF + "RestartEvent",
                "result": REF + "ResultEvent",
                "error": REF + "ErrorEvent",
            },
        },
    },
    "CellStartEvent": _obj({"type": {"const": "cell_start"}, "index": _INT, "title": _STR_OR_NULL}),
    "ChunkEvent": _obj(
        {
            "type": {"const": "chunk"},
            "index": _INT,
            "name": {"type": "string", "description": "stdout, stderr, result, display or error"},
            "text": {"type": "string", "description": "sanitized text, as it arrives"},
        }
    ),
    "GapEvent": _obj(
        {
            "type": {"const": "gap"},
            "index": _INT,
            "name": {"type": "string", "description": "the stream of the skipped text, as in 'chunk'"},
            "bytes": {"type": "integer", "description": "UTF-8 bytes of sanitized text not sent here"},
        },
        description="The client read slower than the kernel printed: this much of the cell's output text "
        "was not sent in the stream (at most stream_backlog_bytes wait for a client). Nothing is lost: "
        "the 'result' has the cell's output (its tail past max_output_bytes, with artifact_id for all).",
    ),
    "DisplayEvent": _obj({"type": {"const": "display"}, "index": _INT, "display": ref("Display")}),
    "CellEndEvent": _obj(
        {
            "type": {"const": "cell_end"},
            "index": _INT,
            "status": {"type": "string", "enum": list(CELL_STATUSES)},
            "exit_code": _INT,
            "duration_ms": _INT,
        }
    ),
    "HeartbeatEvent": _obj(
        {"type": {"const": "heartbeat"}, "elapsed_ms": _INT},
        description="Sent after stream_heartbeat_interval seconds of silence.",
    ),
    "RestartEvent": _obj(
        {"type": {"const": "restart"}, "session": _STR, "message": _STR},
        description="The kernel died during the call; it was restarted and the call runs again.",
    ),
    "ResultEvent": _obj(
        {"type": {"const": "result"}, "result": ref("EvalResult")},
        description="Last event: the same object as the application/json answer.",
    ),
    "ErrorEvent": _obj(
        {"type": {"const": "error"}, "status": _INT, "message": _STR},
        description="Last event when the call failed after the stream started (the HTTP status is "
        "already 200): the status and message the JSON answer would have had.",
    ),
    # -- sessions and artifacts
    "SessionInfo": _obj(
        {
            "name": _STR,
            "kernel_id": _STR_OR_NULL,
            "kernel_name": _STR_OR_NULL,
            "mode": {
                "type": "string",
                "enum": [*EVAL_MODES, "notebook"],
                "description": "notebook: the connection notebook runs use to the notebook's own kernel",
            },
            "notebook": {**_STR_OR_NULL, "description": "The notebook a 'notebook' session runs"},
            "state": {
                "type": "string",
                "enum": ["new", "starting", "ready", "dead", "closed"],
                "description": "Where the session's kernel is in its life (see docs/architecture.md)",
            },
            "created": {"type": "string", "format": "date-time"},
            "last_used": {"type": "string", "format": "date-time"},
            "busy": _BOOL,
            "busy_since": {
                "anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}],
                "description": "When the running call took its turn; null when the session is not busy",
            },
            "running_cell": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {
                            "index": _INT,
                            "cell_id": _STR_OR_NULL,
                            "of": {"type": ["integer", "null"]},
                        },
                    },
                    {"type": "null"},
                ],
                "description": "The cell the running call runs: its index in the eval request (of: the "
                "request's cell count) or in the notebook (cell_id: the notebook cell's id); null when idle",
            },
            "queue_depth": {"type": "integer", "description": "calls waiting for their turn"},
            "restarts": _INT,
            "executions": _INT,
            "recoveries": {"type": "object", "additionalProperties": _INT},
            "owner": {
                **_STR_OR_NULL,
                "description": "The username (as jupyter_server resolved it) of the request that created "
                "the session; null if unknown",
            },
            "cwd": {
                **_STR_OR_NULL,
                "description": "Working directory of the session's last call, relative to the server root "
                "('' is the root); null before its first call",
            },
            "last_output_at": {
                "anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}],
                "description": "When a call of the session last produced output (stream text or a "
                "display); null if never",
            },
        },
        required=["name", "kernel_id", "mode", "created", "last_used", "busy", "queue_depth", "restarts"],
    ),
    "SessionList": _obj(
        {
            "sessions": {"type": "array", "items": ref("SessionInfo")},
            "totals": {
                "type": "object",
                "additionalProperties": _INT,
                "description": "Counters since the server started (evictions, restarts, idle_shutdowns...).",
            },
            "pool": ref("PoolInfo"),
            "notebook_kernels": {
                "type": "array",
                "items": ref("NotebookKernelEntry"),
                "description": "Every notebook that has a kernel (JupyterLab's too), by path",
            },
        },
        required=["sessions", "totals", "pool", "notebook_kernels"],
    ),
    "NotebookKernelEntry": _obj(
        {
            "path": _STR,
            "kernel_id": _STR,
            "kernel_name": _STR_OR_NULL,
            "state": {"type": "string", "description": "the kernel's execution_state"},
            "connections": {"type": "integer", "description": "websocket clients (people) on the kernel"},
            "person_connected": _BOOL,
            "started_by_run": {"type": "boolean", "description": "a run started it (shut down when unused)"},
            "attached": {"type": "boolean", "description": "a run or eval of this server is connected to it"},
        },
        description="A notebook's own kernel (its jupyter_server session's).",
    ),
    "PoolInfo": _obj(
        {
            "size": {"type": "integer", "description": "KernelPool.size: kernels kept ready (0: none)"},
            "ready": {"type": "integer", "description": "started kernels waiting to be taken"},
            "starting": {"type": "integer", "description": "kernels being started into the pool"},
            "kernel_name": {**_STR_OR_NULL, "description": "the kernel spec pooled (the default one)"},
            "taken": {"type": "integer", "description": "pooled kernels handed out since server start"},
        },
        required=["size", "ready", "starting", "kernel_name", "taken"],
        description="Warm kernels for per-call evals and new sessions (not sessions themselves).",
    ),
    "InterruptResult": _obj(
        {
            "session": _STR,
            "kernel_id": _STR_OR_NULL,
            "interrupted": {
                "type": "boolean",
                "description": "true: a running call was cancelled (it answers cancelled: true); false: "
                "nothing was running (the kernel was sent an interrupt anyway, if it has one).",
            },
        }
    ),
}

# ------------------------------------------------------------------------------------------ notebook run

RUN_STATUSES = (*CELL_STATUSES, "skipped", "not_run")
MAX_RUN_CELLS = 10_000  # more than any real notebook; counted before the elements are validated
RUN_SCHEMAS: dict[str, Any] = {
    "NotebookRunRequest": {
        "type": "object",
        "description": "Run cells of the notebook in its own kernel and write their outputs into it. "
        "Exactly one of cell_ids, cell_indices or all.",
        "properties": {
            "cell_ids": {
                "type": "array",
                "items": {"type": "string", "pattern": CELL_ID_PATTERN},
                "minItems": 1,
                "maxItems": MAX_RUN_CELLS,
                "description": "The cells to run, by id (they run in notebook order).",
            },
            "cell_indices": {
                "type": "array",
                "items": {"type": "integer"},
                "minItems": 1,
                "maxItems": MAX_RUN_CELLS,
                "description": "The cells to run, by 0-based index (they run in notebook order).",
            },
            "all": {"const": True, "description": "Run every code cell."},
            "timeout": {
                "type": "number",
                "default": 30,
                "description": "Seconds for the whole call, clamped to 1..3600; on expiry the running cell "
                "is interrupted and later cells are not run. Detached: none unless given.",
                "x-errors": {"type": "'timeout' must be a number of seconds, got {got}"},
            },
            "detach": {
                "type": "boolean",
                "default": False,
                "description": "Answer 202 at once with the run_id (Location: /api/agent/runs/{id}); "
                "the work goes on when the client goes.",
            },
            "stop_on_error": {
                "type": "boolean",
                "default": True,
                "description": "After a failed cell, later cells are not run (status not_run).",
            },
            "expected_hash": dict(_EXPECTED_HASH),
            "include_images": {
                "type": "boolean",
                "default": False,
                "description": "Give each image's base64 (SVG: its text) in its display's 'data'; without "
                "it an image is {type, mime, bytes, url}, url being the output route that serves it.",
            },
            "ops": {
                "type": "array",
                "items": ref("CellOp"),
                "minItems": 1,
                "description": "An edit batch (as the edit route's 'ops') applied first, in the same save "
                "and under the same expected_hash; then the cells named run (ids the ops gave included), "
                "or without cell_ids/cell_indices/all the code cells the ops inserted or edited.",
                "x-errors": {
                    "type": "'ops' must be a non-empty array of operations",
                    "minItems": "'ops' must be a non-empty array of operations",
                },
            },
        },
        "additionalProperties": False,
        "oneOf": [
            {"required": ["cell_ids"]},
            {"required": ["cell_indices"]},
            {"required": ["all"]},
            {
                "required": ["ops"],
                "not": {
                    "anyOf": [
                        {"required": ["cell_ids"]},
                        {"required": ["cell_indices"]},
                        {"required": ["all"]},
                    ]
                },
            },
        ],
        "x-errors": {
            "oneOf": "send exactly one of 'cell_ids', 'cell_indices' or \"all\": true (or 'ops' alone: "
            "the cells it inserts or edits run)",
            "type": 'Request body must be a JSON object like {"all": true}',
        },
    },
}
ANSWER_SCHEMAS["RunImageDisplay"] = _obj(
    {
        "type": {"const": "image"},
        "mime": _STR,
        "bytes": {"type": "integer", "description": "size of the image (decoded)"},
        "url": {
            **_STR_OR_NULL,
            "description": "The output route that serves the image as stored (without the server's "
            "base_url); null when the outputs were not written",
        },
        "data": {"type": "string", "description": "Only with include_images: base64 (SVG: its text)"},
    },
    required=["type", "mime", "bytes", "url"],
    description="An image the cell stored in the notebook.",
)
ANSWER_SCHEMAS["RunDisplay"] = {
    "description": "A structured output: a JSON value or a status as eval gives them, or an image the "
    "cell stored (its size and URL; its data only with include_images).",
    "oneOf": [ref("JsonDisplay"), ref("RunImageDisplay"), ref("StatusDisplay")],
    "discriminator": {
        "propertyName": "type",
        "mapping": {
            "json": REF + "JsonDisplay",
            "image": REF + "RunImageDisplay",
            "status": REF + "StatusDisplay",
        },
    },
}
ANSWER_SCHEMAS["NotebookRunCellResult"] = {
    **ANSWER_SCHEMAS["EvalCellResult"],
    "properties": {
        **ANSWER_SCHEMAS["EvalCellResult"]["properties"],
        "cell_id": {**_STR_OR_NULL, "description": "null before nbformat 4.5"},
        "execution_count": _INT_OR_NULL,
        "status": {"type": "string", "enum": list(RUN_STATUSES)},
        "index": {**_INT, "description": "The cell's index in the notebook when the run started."},
        "displays": {"type": "array", "items": ref("RunDisplay")},
        "outputs_written": {
            **_BOOL,
            "description": "False: the cell was deleted meanwhile, or the notebook could not be written "
            "(the result's outputs_error says why); the outputs are only in this answer",
        },
        "outputs_omitted": {
            "oneOf": [
                _obj(
                    {
                        "outputs": {**_INT, "description": "outputs left out"},
                        "updates": {**_INT, "description": "display updates left out"},
                        "bytes": {**_INT, "description": "their bytes"},
                        "artifact_id": {
                            **_STR_OR_NULL,
                            "description": "GET /api/agent/artifacts/{id}: all of them, one JSON output per "
                            "line (null: they could not be saved)",
                        },
                    }
                ),
                {"type": "null"},
            ],
            "description": "What the notebook does not store because the cell's outputs reached "
            "NotebookRunner.max_cell_bytes_stored (a placeholder output there says the same); null when all "
            "is stored",
        },
    },
    "required": [
        *ANSWER_SCHEMAS["EvalCellResult"]["required"],
        "cell_id",
        "execution_count",
        "outputs_written",
        "outputs_omitted",
    ],
}
ANSWER_SCHEMAS["NotebookRunResult"] = _obj(
    {
        "path": _STR,
        "kernel_id": _STR_OR_NULL,
        "hash": {**_STR_OR_NULL, "description": "The notebook's hash after the outputs were written"},
        "cancelled": _BOOL,
        "timed_out": _BOOL,
        "restarted": {**_BOOL, "description": "The kernel died or was restarted; nothing was re-run"},
        "error": _STR_OR_NULL,
        "output": {"type": "string", "description": "The combined text for a model: [i/n] <cell id> blocks"},
        "outputs_error": {
            **_STR_OR_NULL,
            "description": "Why outputs could not be written into the notebook (e.g. it was deleted during "
            "the run): the cells ran and their outputs are only in this answer; null when all were written",
        },
        "cells": {"type": "array", "items": ref("NotebookRunCellResult")},
        "edit": _obj(
            {
                "message": _STR,
                "hash": _STR,
                "results": {"type": "array", "items": _obj({"message": _STR, "details": ref("OpDetails")})},
            },
            description="With 'ops': what the edit did (as the edit route answers it), before the run",
        ),
    },
    required=[
        "path",
        "kernel_id",
        "hash",
        "cancelled",
        "timed_out",
        "restarted",
        "error",
        "output",
        "outputs_error",
        "cells",
    ],
)

ANSWER_SCHEMAS["NotebookRunDisplayEvent"] = _obj(
    {"type": {"const": "display"}, "index": _INT, "display": ref("RunDisplay")},
    description="A JSON or status display as it arrives; the cell's images when it ends, as its result "
    "has them.",
)
ANSWER_SCHEMAS["NotebookRunResultEvent"] = _obj(
    {"type": {"const": "result"}, "result": ref("NotebookRunResult")},
    description="Last event: the same object as the application/json answer.",
)
_RUN_EVENTS = {
    "cell_start": "CellStartEvent",
    "chunk": "ChunkEvent",
    "gap": "GapEvent",
    "display": "NotebookRunDisplayEvent",
    "cell_end": "CellEndEvent",
    "heartbeat": "HeartbeatEvent",
    "restart": "RestartEvent",
    "result": "NotebookRunResultEvent",
    "error": "ErrorEvent",
}
ANSWER_SCHEMAS["NotebookRunEvent"] = {
    "description": "One line of a notebook run's application/x-ndjson stream: eval's events (cell_start and "
    "cell_end also carry cell_id, cell_end the execution_count); the last is 'result' (or 'error').",
    "oneOf": [ref(name) for name in _RUN_EVENTS.values()],
    "discriminator": {"propertyName": "type", "mapping": {k: REF + v for k, v in _RUN_EVENTS.items()}},
}


# ------------------------------------------------------------------------------------------ agent tokens

TOKEN_SCOPES = ("read", "edit", "execute")
# The classes of action of the approval gate (approvals/policy.py), which a token may ask the person for.
APPROVAL_ACTIONS = ("read", "edit", "execute", "kernel")
# The actions that can wait for the person: a read is answered at once (a rule allows or denies it).
ASKABLE_ACTIONS = ("edit", "execute", "kernel")
TOKEN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_TIME_OR_NULL = {"type": ["string", "null"], "description": "ISO 8601 UTC time, or null"}
TOKEN_SCHEMAS: dict[str, Any] = {
    "AgentTokenRequest": {
        "type": "object",
        "description": "A new agent token: its name, scopes, optional path globs and lifetime.",
        "properties": {
            "name": {
                "type": "string",
                "pattern": TOKEN_NAME_PATTERN,
                "description": "The agent's name: it acts as the user 'agent:NAME'. Unique among active "
                "tokens.",
                "x-errors": {
                    "pattern": "'name' is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter "
                    "or digit; got {value}"
                },
            },
            "scopes": {
                "type": "array",
                "items": {"type": "string", "enum": list(TOKEN_SCOPES)},
                "minItems": 1,
                "maxItems": len(TOKEN_SCOPES),
                "uniqueItems": True,
                "description": "read: read notebooks and files, list sessions; edit: read plus notebook "
                "edits and file writes; execute: eval, notebook runs, kernels, terminals.",
            },
            "paths": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 256, "pattern": NO_NUL_PATTERN},
                "maxItems": 32,
                "description": "Globs of the files the token reaches (e.g. 'reports/**'); none: every file. "
                "Outside them files answer 404.",
            },
            "ask": {
                "type": "array",
                "items": {
                    "type": "string",
                    "enum": list(ASKABLE_ACTIONS),
                    "x-errors": {
                        "enum": "'ask' takes edit, execute or kernel, got {value} (a read cannot wait for a "
                        "person: limit reads with 'paths' or a deny rule)"
                    },
                },
                "maxItems": len(ASKABLE_ACTIONS),
                "uniqueItems": True,
                "description": "The actions this agent must ask the person for first (the approval gate): "
                "edit, execute, kernel (a read cannot wait for a person: limit reads with 'paths' or a "
                "deny rule). Absent: only what the server's approval rules say.",
            },
            "expires_in": {
                "type": "number",
                "minimum": TOKEN_MIN_EXPIRES_IN,
                "maximum": TOKEN_MAX_EXPIRES_IN,
                "description": "Seconds until the token expires (60 to 366 days); absent: never.",
                "x-errors": {"type": "'expires_in' must be a number of seconds, got {got}"},
            },
        },
        "required": ["name", "scopes"],
        "additionalProperties": False,
        "x-errors": {"type": 'Request body must be a JSON object like {"name": "bot", "scopes": ["read"]}'},
    },
}
ANSWER_SCHEMAS["AgentToken"] = _obj(
    {
        "name": _STR,
        "scopes": {"type": "array", "items": {"type": "string", "enum": list(TOKEN_SCOPES)}},
        "paths": {"type": "array", "items": _STR},
        "status": {"type": "string", "enum": ["active", "expired", "revoked"]},
        "created": _STR,
        "expires": _TIME_OR_NULL,
        "last_used": {**_TIME_OR_NULL, "description": "ISO 8601 UTC time (kept to the minute), or null"},
        "revoked": _TIME_OR_NULL,
        "ask": {
            "type": "array",
            "items": {"type": "string", "enum": list(APPROVAL_ACTIONS)},
            "description": "The actions it asks the person for first (the approval gate)",
        },
    }
)
ANSWER_SCHEMAS["AgentTokenCreated"] = {
    **ANSWER_SCHEMAS["AgentToken"],
    "properties": {
        **ANSWER_SCHEMAS["AgentToken"]["properties"],
        "token": {"type": "string", "description": "The token: shown this once, never stored."},
        "user": {"type": "string", "description": "The user it acts as: agent:NAME."},
        "warnings": {
            "type": "array",
            "items": {"type": "string"},
            "description": "What the person creating it must know, e.g. that it asks before some actions "
            "but runs code unasked, so its asks do not bind it (docs/approvals.md).",
        },
    },
    "required": [*ANSWER_SCHEMAS["AgentToken"]["required"], "token", "user", "warnings"],
}
ANSWER_SCHEMAS["AgentTokenList"] = _obj(
    {
        "tokens": {"type": "array", "items": ref("AgentToken"), "description": "Oldest first."},
        "max_lifetime": {
            "type": ["number", "null"],
            "description": "The admin's cap on a new token's expires_in, in seconds "
            "(AgentIdentityProvider.max_token_lifetime); null: none.",
        },
    }
)


# ------------------------------------------------------------------------------------------ approval gate

APPROVAL_STATES = ("pending", "approved", "denied", "expired", "withdrawn")
APPROVAL_SCHEMAS: dict[str, Any] = {
    "ApprovalDecision": {
        "type": "object",
        "description": "The person's decision on a pending approval request.",
        "properties": {
            "decision": {
                "type": "string",
                "enum": ["approve", "deny"],
                "x-errors": {"enum": "'decision' must be 'approve' or 'deny', got {value}"},
            },
            "for_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "description": "With approve: also approve this agent's same action on the same notebook for "
                "this many seconds (each request still recorded); at most ApprovalPolicy.max_for_seconds.",
            },
            "reason": {
                "type": "string",
                "maxLength": 1000,
                "description": "Why (the agent is told it with a denial).",
            },
        },
        "required": ["decision"],
        "additionalProperties": False,
        "x-errors": {"type": 'Request body must be a JSON object like {"decision": "approve"}'},
    },
}
ANSWER_SCHEMAS["Approval"] = _obj(
    {
        "id": {"type": "integer"},
        "agent": {"type": "string", "description": "Who asked: agent:NAME."},
        "door": {"type": "string", "description": "http, mcp or cli."},
        "action": {"type": "string", "enum": list(APPROVAL_ACTIONS)},
        "path": {"type": ["string", "null"], "description": "The notebook, or null (eval in a session)."},
        "summary": {"type": "string", "description": "What it would do, in a line."},
        "state": {"type": "string", "enum": list(APPROVAL_STATES)},
        "created": _STR,
        "expires": _STR,
        "decided_by": {"type": ["string", "null"]},
        "decided": _TIME_OR_NULL,
        "reason": {"type": ["string", "null"]},
        "for_seconds": {"type": ["number", "null"]},
        "details": {
            "type": "object",
            "description": "What exactly would happen: the code of each cell and where and how it runs "
            "(eval), the cells with their source and source hash (notebook runs), the diff (edits; a run's "
            "ops: 'edit'). 'actions': every action the request covers when it is more than one (a run with "
            "ops: execute and edit). At most ApprovalPolicy.max_detail_bytes: beyond it the longest texts "
            "are cut, each ending with '[truncated: N bytes not shown]'. In the list: a preview (see "
            "'preview').",
        },
        "truncated": {
            **_INT,
            "description": "Bytes of what it would do that are not shown (cut to max_detail_bytes); 0: all.",
        },
        "preview": {
            **_BOOL,
            "description": "Only in the list's pending requests: true when 'details' is a preview (texts cut "
            "short, or empty); GET /api/agent/approvals/{id} has them in full.",
        },
    },
    required=["id", "agent", "door", "action", "path", "summary", "state", "created", "expires"],
)
ANSWER_SCHEMAS["ApprovalList"] = _obj(
    {
        "pending": {
            "type": "array",
            "items": ref("Approval"),
            "description": "Oldest first, each with a bounded preview of its details.",
        },
        "recent": {"type": "array", "items": ref("Approval"), "description": "Decided, newest first."},
    }
)

ANSWER_SCHEMAS["ApprovalPending"] = _obj(
    {
        "approval_id": {**_INT, "description": "The request waiting for the person"},
        "state": {"type": "string", "enum": ["awaiting_approval"]},
        "location": {**_STR, "description": "GET it for the request's state and, once done, its outcome"},
        "message": {**_STR, "description": "What waits, and where the person decides"},
    },
    additionalProperties=True,
    description="202: the action waits for the person's approval (past the call's approval_wait); it is "
    "done as shown once approved, not again by calling again.",
)

CHANGE_KINDS = ("edit", "run", "undo", "clear_outputs", "upgrade", "repair", "create", "overwrite")
CELL_CHANGES = ("edited", "inserted", "deleted", "moved", "outputs")
VIAS = ("http", "mcp", "cli", "contents")
_RECORDED = {
    "change_id": {
        **_STR_OR_NULL,
        "description": "The change-ledger entry of this change (GET .../changes/{id}; undo it with POST "
        ".../changes/{id}/undo); null when it was not recorded",
    },
    "recorded": {
        **_BOOL,
        "description": "false: the change was made but the ledger could not record it (its database is "
        "locked, full or corrupt; the server log says why), or nothing changed ('note' says so)",
    },
    "undoable": {
        **_BOOL,
        "description": "Only for a recorded change: whether its undo can work; false for a notebook whose "
        "cells have no ids (nbformat 4.4: 'note' says how to give them ids), an upgrade, a creation",
    },
    "note": {
        "type": "string",
        "description": "Only when the change cannot be undone (why, and what to do) or when nothing changed "
        "and so nothing was recorded",
    },
}
LEDGER_SCHEMAS: dict[str, Any] = {
    "UndoRequest": {
        "type": "object",
        "description": "An undo takes no body, or only expected_hash.",
        "properties": {"expected_hash": dict(_EXPECTED_HASH)},
        "additionalProperties": False,
        "x-errors": {
            "type": 'Request body must be a JSON object like {"expected_hash": "..."} (or no body)',
            "additionalProperties": "unknown field {name!r} (an undo takes only 'expected_hash')",
        },
    },
    "ChangeCell": _obj(
        {
            "id": {**_STR_OR_NULL, "description": "The cell's id (null before nbformat 4.5)"},
            "what": {
                "type": "array",
                "items": {"type": "string", "enum": list(CELL_CHANGES)},
                "description": "What happened to the cell (edited: source, metadata or type; outputs: "
                "outputs or execution count)",
            },
            "index_before": {**_INT_OR_NULL, "description": "Its index before (null: inserted)"},
            "index_after": {**_INT_OR_NULL, "description": "Its index after (null: deleted)"},
            "before": {
                "type": ["object", "null"],
                "description": "Only in GET .../changes/{id}: the cell's fields the change changed, as they "
                "were (source as one string; outputs larger than 4 KB as {$ref, bytes}); null: inserted",
            },
            "after": {
                "type": ["object", "null"],
                "description": "Only in GET .../changes/{id}: the same fields as the change left them; "
                "null: deleted",
            },
            "diff": {
                "type": "string",
                "description": "Only in GET .../changes/{id}, for a changed source: a unified diff",
            },
        },
        required=["id", "what", "index_before", "index_after"],
    ),
    "ChangeEntry": _obj(
        {
            "id": {"type": "string", "description": "The change's id (digits; newer changes: larger ids)"},
            "time": {"type": "string", "format": "date-time", "description": "When it was recorded (UTC)"},
            "path": _STR,
            "user": {**_STR_OR_NULL, "description": "Who asked for it (the request's identity)"},
            "via": {
                "type": ["string", "null"],
                "enum": [*VIAS, None],
                "description": "The front door: http, mcp, or cli (the CLI says so); contents: a save "
                "through /api/contents (kind overwrite)",
            },
            "kind": {"type": "string", "enum": list(CHANGE_KINDS)},
            "action": {"type": "string", "description": "A short summary, e.g. 'edit 2 cells, insert 1'"},
            "hash_before": _STR,
            "hash_after": _STR,
            "undoes": {**_STR_OR_NULL, "description": "For an undo: the id of the change it undid"},
            "undoable": {
                **_BOOL,
                "description": "false: the change cannot be undone (cells without ids, an upgrade from "
                "nbformat 3, a change of notebook metadata)",
            },
            "cells": {"type": "array", "items": ref("ChangeCell"), "description": "The cells it touched"},
            "overwrites": {
                "type": ["array", "null"],
                "items": {"type": "string"},
                "description": "For an overwrite (a save through /api/contents that dropped cells or text "
                "recorded changes put there): the ids of those changes; its cells are only the cells it "
                "overwrote, and its undo puts back their version. null otherwise",
            },
            "approved_by": {
                **_STR_OR_NULL,
                "description": "Who approved it before it was made (the approval gate), or null when "
                "nobody had to",
            },
        },
        description="One recorded change of a notebook.",
    ),
    "ChangeList": _obj(
        {
            "path": {"type": "string", "description": "Only for one notebook's changes"},
            "changes": {"type": "array", "items": ref("ChangeEntry"), "description": "Newest first"},
            "next_before": {
                **_STR_OR_NULL,
                "description": "Only for one notebook's changes: pass as 'before' for the next (older) page; "
                "null at the end",
            },
        },
        required=["changes"],
    ),
    "UndoResult": _obj(
        {
            "message": _STR,
            "hash": {"type": "string", "description": "The notebook's hash after the undo"},
            "undoes": {"type": "string", "description": "The id of the change undone"},
            "cells": {"type": "array", "items": ref("ChangeCell"), "description": "The cells it put back"},
            "outputs_cleared": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Cells run since the change (only their outputs changed) whose source or type "
                "the undo put back: their outputs came from the code undone, so they were cleared",
            },
            **_RECORDED,
        },
        required=["message", "hash", "undoes", "cells", "outputs_cleared"],
    ),
    "ChangesSince": _obj(
        {
            "since": {"type": "string", "description": "The hash asked about"},
            "since_known": {
                **_BOOL,
                "description": "false: the ledger does not know that version (never answered by this "
                "server, or pruned): nothing is guessed, 'cells' is empty",
            },
            "cells": {
                "type": "array",
                "items": _obj(
                    {
                        "id": _STR_OR_NULL,
                        "index": {**_INT_OR_NULL, "description": "Where the cell is now (null: deleted)"},
                        "what": {"type": "array", "items": {"type": "string", "enum": list(CELL_CHANGES)}},
                        "user": {
                            **_STR_OR_NULL,
                            "description": "Who changed it, when a recorded change explains its state; null: "
                            "unknown (a person's edit through JupyterLab or the contents API)",
                        },
                        "via": {"type": ["string", "null"], "enum": [*VIAS, None]},
                        "change_id": _STR_OR_NULL,
                    }
                ),
                "description": "The cells edited, inserted, deleted, moved or given new outputs since",
            },
        },
        description="What changed since an earlier version (a read with ?since=<hash>).",
    ),
}
ANSWER_SCHEMAS["NotebookChangeResult"]["properties"].update(_RECORDED)
ANSWER_SCHEMAS["NotebookRunResult"]["properties"].update(_RECORDED)
ANSWER_SCHEMAS["EvalResult"]["required"].remove("notebook")  # only eval with 'notebook' has it
ANSWER_SCHEMAS["EvalResult"]["required"].remove("kernel_start_seconds")  # only a call that started one
ANSWER_SCHEMAS["NotebookRead"]["properties"]["changes_since"] = {
    **ref("ChangesSince"),
    "description": "Only with ?since=<hash>: which cells changed since that version, and by whom",
}
ANSWER_SCHEMAS["Error"]["properties"]["conflicts"] = {
    "type": "array",
    "items": _obj({"id": _STR_OR_NULL, "what": _STR}),
    "description": "Only on the 409 of an undo: each cell changed since the change, and what changed",
}

# ------------------------------------------------------------------------------------- detached runs

RUN_STATES = (
    "queued",
    "awaiting_approval",
    "running",
    "complete",
    "error",
    "cancelled",
    "interrupted",
    "timed_out",
    "lost",
)
_RUN_SUMMARY = {
    "run_id": _STR,
    "kind": {
        "type": "string",
        "enum": ["eval", "notebook_run", "mcp_tool"],
        "description": "mcp_tool: an MCP tools/call run as a task (its target is the tool's name)",
    },
    "target": {**_STR_OR_NULL, "description": "The session (eval; null per-call) or the notebook's path"},
    "owner": {**_STR_OR_NULL, "description": "The user that started it"},
    "state": {
        "type": "string",
        "enum": list(RUN_STATES),
        "description": "queued (waiting for its session or kernel), awaiting_approval (waiting for the "
        "person's decision: the approval gate), running, then complete | error (a cell "
        "or the call failed) | cancelled (the cancel route) | timed_out (its timeout; a detached call "
        "has none unless it gives one) | interrupted (a session interrupt or delete, or the kernel's "
        "interrupt from outside the call: a person's stop button) | lost (the server stopped or "
        "restarted while it ran)",
    },
    "created": {"type": "string", "description": "ISO 8601 UTC"},
    "started": _TIME_OR_NULL,
    "ended": _TIME_OR_NULL,
    "message": {**_STR_OR_NULL, "description": "Why it ended so, when the result does not say"},
    "events": {**_INT, "description": "Sequence number of its last event so far"},
    "cells_started": _INT,
    "cells_done": _INT,
    "approval_id": {
        "type": ["integer", "null"],
        "description": "The approval the run waited for (GET /api/agent/approvals/{id}), or null",
    },
}
DETACHED_SCHEMAS: dict[str, Any] = {
    "RunSummary": _obj(_RUN_SUMMARY),
    "RunStarted": _obj({**_RUN_SUMMARY, "location": {**_STR, "description": "Where its state is read"}}),
    "RunCancelled": _obj({**_RUN_SUMMARY, "cancel_requested": _BOOL}),
    "RunCell": _obj(
        {
            "index": _INT,
            "cell_id": _STR_OR_NULL,
            "title": _STR_OR_NULL,
            "status": {"type": "string", "enum": ["running", *RUN_STATUSES]},
            "started": {
                "type": "string",
                "description": "ISO 8601 UTC: when the cell began (how long a watcher shows it running)",
            },
            "exit_code": _INT,
            "duration_ms": _INT,
        },
        required=["index", "status"],
    ),
    "RunList": _obj({"runs": {"type": "array", "items": ref("RunSummary")}}),
    "LostEvent": _obj(
        {
            "type": {"const": "lost"},
            "from_seq": _INT,
            "to_seq": _INT,
            "message": _STR,
        },
        description="Events from_seq..to_seq of a run were not kept (the artifacts' cap, or a disk error); "
        "the run's answer still has its output. This line has no seq.",
    ),
}
DETACHED_SCHEMAS["RunDetail"] = _obj(
    {
        **_RUN_SUMMARY,
        "cells": {"type": "array", "items": ref("RunCell"), "description": "Per-cell progress"},
        "result": {
            "anyOf": [ref("EvalResult"), ref("NotebookRunResult"), {"type": "object"}, {"type": "null"}],
            "description": "The answer an attached call gives, once the run ended (null before, and for "
            "a run that failed or was lost); for kind mcp_tool, the tool call's MCP result",
        },
    }
)
DETACHED_SCHEMAS["RunEvent"] = {
    "description": "One line of GET /api/agent/runs/{id}/events: an event of the run's eval or notebook run "
    "stream with its sequence number 'seq' (1, 2, ...); 'heartbeat' and 'lost' lines have none.",
    "allOf": [
        {"type": "object", "properties": {"seq": {"type": "integer", "minimum": 1}}},
        {"anyOf": [ref("EvalEvent"), ref("NotebookRunEvent"), ref("LostEvent")]},
    ],
}

# -------------------------------------------------------------------------------------- notebook kernel

KERNEL_ACTIONS = ("interrupt", "restart", "shutdown")
KERNEL_SCHEMAS: dict[str, Any] = {
    "NotebookKernelRequest": {
        "type": "object",
        "description": "What to do with the notebook's kernel.",
        "properties": {
            "action": {
                "type": "string",
                "enum": list(KERNEL_ACTIONS),
                "description": "interrupt (a running call answers cancelled); restart (in place, as "
                "JupyterLab's Restart Kernel: its state is lost); shutdown (the notebook's session and "
                "kernel are deleted, as JupyterLab's Shut Down Kernel).",
                "x-errors": {"enum": "'action' must be one of interrupt, restart, shutdown, got {got}"},
            },
        },
        "required": ["action"],
        "additionalProperties": False,
        "x-errors": {
            "required": "'action' is required: interrupt, restart or shutdown",
            "type": 'Request body must be a JSON object like {"action": "interrupt"}',
        },
    },
    "NotebookKernel": _obj(
        {
            "path": _STR,
            "kernel_id": _STR_OR_NULL,
            "kernel_name": _STR_OR_NULL,
            "state": {
                "type": "string",
                "description": "The kernel's execution_state (idle, busy, starting, ...); not_running "
                "when the notebook has no kernel",
            },
            "execution_count": {
                "type": ["integer", "null"],
                "description": "The kernel's execution count as of the last cell run through this server",
            },
            "connections": {"type": "integer", "description": "Websocket clients (people) on the kernel"},
            "person_connected": _BOOL,
            "started_by_run": {"type": "boolean", "description": "A run started it (shut down when unused)"},
            "busy": {"type": "boolean", "description": "A run or eval of this server holds the notebook"},
            "action": {"type": "string", "enum": list(KERNEL_ACTIONS), "description": "Only after POST"},
            "interrupted_call": {"type": "boolean", "description": "Only after POST: a running call was"},
            "state_lost": {
                "type": "boolean",
                "description": "Only after POST: variables and imports are gone",
            },
            "message": {"type": "string", "description": "Only after POST: what was done"},
        },
        required=[
            "path",
            "kernel_id",
            "kernel_name",
            "state",
            "execution_count",
            "connections",
            "person_connected",
            "started_by_run",
            "busy",
        ],
        description="The notebook's own kernel (its jupyter_server session's).",
    ),
}

# ------------------------------------------------------------------------------------------ shared focus

FOCUS_UI_ACTIONS = ("open_notebook", "reveal_cell", "show_change", "open_approval")
_POSITION = _obj(
    {"line": {"type": "integer", "minimum": 0}, "column": {"type": "integer", "minimum": 0}},
    additionalProperties=False,
)
FOCUS_SCHEMAS: dict[str, Any] = {
    "FocusPublish": {
        "type": "object",
        "description": "What a browser tab shows, published while its person shares their focus.",
        "properties": {
            "agents": {
                "description": "Who may read it: 'all' (every agent) or agent token names.",
                "oneOf": [
                    {"const": "all"},
                    {
                        "type": "array",
                        "items": {"type": "string", "pattern": TOKEN_NAME_PATTERN},
                        "maxItems": 100,
                    },
                ],
            },
            "path": {
                "type": ["string", "null"],
                "maxLength": 4096,
                "pattern": NO_NUL_PATTERN,
                "description": "The notebook the tab shows (root-relative), or null (none).",
            },
            "cell": {
                "type": ["object", "null"],
                "description": "The active cell; the server cuts its source and summarizes its outputs.",
                "properties": {
                    "id": {"type": ["string", "null"], "maxLength": 256},
                    "index": {"type": "integer", "minimum": 0, "maximum": 10_000_000},
                    "cell_type": {"type": "string", "enum": list(CELL_TYPES)},
                    "source": {"type": "string"},
                    "execution_count": {"type": ["integer", "null"]},
                    "outputs": {"type": "array", "items": {"type": "object"}, "maxItems": 10_000},
                },
                "required": ["index"],
                "additionalProperties": False,
            },
            "selection": {
                "type": ["object", "null"],
                "description": "The text selected in the active cell (cut by the server).",
                "properties": {"text": {"type": "string"}, "start": _POSITION, "end": _POSITION},
                "required": ["text"],
                "additionalProperties": False,
            },
            "kernel": {
                "type": ["object", "null"],
                "description": "The notebook's kernel as the page sees it.",
                "properties": {
                    "name": {"type": ["string", "null"], "maxLength": 256},
                    "status": {"type": ["string", "null"], "maxLength": 64},
                    "execution_count": {"type": ["integer", "null"]},
                },
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
        "x-errors": {"type": 'Request body must be a JSON object like {"agents": "all", "path": "a.ipynb"}'},
    },
    "FocusAction": {
        "type": "object",
        "description": "An allow-listed UI action an agent asks JupyterLab to do for the person.",
        "properties": {
            "action": {
                "type": "string",
                "enum": list(FOCUS_UI_ACTIONS),
                "x-errors": {"enum": f"'action' must be one of {', '.join(FOCUS_UI_ACTIONS)}; got {{value}}"},
            },
            "path": {"type": "string", "maxLength": 4096, "pattern": NO_NUL_PATTERN},
            "cell_id": {"type": "string", "maxLength": 256},
            "cell_index": {"type": "integer", "minimum": 0, "maximum": 10_000_000},
            "change_id": {"type": "string", "maxLength": 128},
            "approval_id": {"type": "integer", "minimum": 0},
            "message": {"type": "string", "maxLength": 500, "description": "Shown to the person with it."},
        },
        "required": ["action"],
        "additionalProperties": False,
        "x-errors": {"type": 'Request body must be a JSON object like {"action": "reveal_cell", ...}'},
    },
}
ANSWER_SCHEMAS["Focus"] = _obj(
    {
        "tab": {"type": "string", "description": "The browser tab's id."},
        "path": {**_STR_OR_NULL, "description": "The notebook the person looks at (null: none)."},
        "cell": {
            "type": ["object", "null"],
            "description": "The active cell: id, index, cell_type, source (cut), execution_count, outputs "
            "(summarized as a notebook read summarizes them), outputs_omitted.",
        },
        "selection": {"type": ["object", "null"], "description": "The selected text (cut), start, end."},
        "kernel": {"type": ["object", "null"], "description": "name, status, execution_count."},
        "updated": {"type": "string", "description": "When it last changed (ISO 8601, UTC)."},
        "shared_with": {
            "description": "'all' or the agent token names it is shared with.",
            "anyOf": [{"const": "all"}, {"type": "array", "items": _STR}],
        },
    },
    description="What the person looks at in a JupyterLab tab that shares it.",
)
ANSWER_SCHEMAS["FocusShared"] = _obj(
    {
        "tab": _STR,
        "updated": _STR,
        "ttl": {"type": "number", "description": "Seconds it is kept unless published again."},
    },
    description="The tab's focus as kept.",
)
ANSWER_SCHEMAS["FocusActionResult"] = _obj(
    {
        "delivered": {
            "type": "string",
            "enum": ["tab", "notification", "none"],
            "description": "tab: to the tab sharing its focus with you; notification: to every page, as a "
            "notification; none: no page is open.",
        },
        "action": _STR,
        "message": _STR,
    },
    description="Where the UI action went.",
)

SCHEMAS: dict[str, Any] = {
    **KERNEL_SCHEMAS,
    **NOTEBOOK_SCHEMAS,
    **EVAL_SCHEMAS,
    **RUN_SCHEMAS,
    **TOKEN_SCHEMAS,
    **APPROVAL_SCHEMAS,
    **FOCUS_SCHEMAS,
    **ANSWER_SCHEMAS,
    **LEDGER_SCHEMAS,
    **DETACHED_SCHEMAS,
}

# -- notebook create, replace in a cell, file listing (issue 29)
ANSWER_SCHEMAS["Error"]["properties"]["matches"] = {
    "type": "array",
    "items": _obj({"line": {"type": "integer", "description": "1-based line in the cell"}, "text": _STR}),
    "description": "Only on the 400 of a replace whose 'old' matches several times without 'all': each "
    "match's line in the cell and that line's text",
}
ANSWER_SCHEMAS["NotebookCreated"] = {
    "description": "A created notebook: the read answer, with what was done and its change-ledger entry.",
    "allOf": [
        ref("NotebookRead"),
        _obj({"message": {"type": "string"}, **_RECORDED}, required=["message"]),
    ],
}
SCHEMAS["NotebookCreated"] = ANSWER_SCHEMAS["NotebookCreated"]
ANSWER_SCHEMAS["FileList"] = _obj(
    {
        "path": {"type": "string", "description": "The folder listed"},
        "entries": {
            "type": "array",
            "items": _obj(
                {
                    "path": _STR,
                    "type": {"type": "string", "enum": ["notebook", "file", "directory"]},
                    "size": {**_INT_OR_NULL, "description": "Bytes (null for a folder)"},
                    "last_modified": {**_STR_OR_NULL, "description": "ISO 8601"},
                }
            ),
        },
        "truncated": {"type": "boolean", "description": "More entries may exist: see next_start"},
        "next_start": {**_STR_OR_NULL, "description": "The 'start' of the next page; null at the end"},
        "stopped": {
            "type": ["string", "null"],
            "enum": ["limit", "budget", None],
            "description": "Why the page ended early: 'limit' (it is full) or 'budget' (the walk's time or "
            "entries ran out); null at the end",
        },
    },
    description="A page of a folder's entries.",
)
SCHEMAS["FileList"] = ANSWER_SCHEMAS["FileList"]
