"""The OpenAPI 3.1 document of the agent routes, built from :mod:`jupyter_agent_tools.schemas`.

Served at ``GET /api/agent/openapi.json``. Request bodies are validated against the very schemas this
document publishes (see :mod:`jupyter_agent_tools.validation`), so the document cannot drift from what
the server accepts. Pure: no I/O, no Tornado.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from . import __version__
from .files import MAX_DEPTH, MAX_SCANNED, MAX_SECONDS
from .files import MAX_LIMIT as MAX_FILE_LIMIT
from .notebook.reading import FORMATS, INCLUDES, INLINE_MIMES, MAX_CELL_REFS, MAX_READ_LIMIT
from .schemas import SCHEMAS, SESSION_NAME_PATTERN, ref

OPENAPI_VERSION = "3.1.0"
JSON = "application/json"
NDJSON = "application/x-ndjson"
TEXT = "text/plain"

DESCRIPTION = """\
Routes of the `jupyter_agent_tools` Jupyter Server extension: AI coding agents read and edit notebooks
cell by cell and run Python in kernels of the server's own kernel manager.

Every route lives under the server's `base_url`, needs the server's token (`Authorization: token <token>`)
or a logged-in browser session (then state-changing requests also need the XSRF token), and is
authorized by the server's authorizer: notebook reads `read` on `contents`, notebook changes `write` on
`contents`, eval and session changes `execute` on `kernels`, the session list and artifacts `read` on
`kernels`, agent tokens `read`/`write` on `agent_tokens`. With agent tokens enabled (docs/admin.md), an
agent token (`Authorization: token jat_...`) acts as the user `agent:NAME` and reaches only what its scopes
(`read`, `edit`, `execute`) and path globs allow, on these routes and every other route of the server;
a valid agent token refused for a scope it lacks gets 403 with `"reason": "Missing scope"` (`"Not for
agent tokens"` for what no agent token may do), a wrong, expired or revoked one 403 without either.

Request bodies are JSON (UTF-8, at most `max_body_bytes`, default 10 MiB) validated against the schemas
below: a wrong type, a missing field, an unknown action or a field the route does not take answers 400
with a message naming the field. Integers must be written as integers (`1`, not `1.0`); `NaN`,
`Infinity` and duplicate keys are refused. Unknown query parameters are ignored. Every error is JSON
`{"message": str, "reason": str|null}`, also the 404 of a path under `/api/agent/` that is none of the
routes below. Answers may gain fields in later versions: ignore the ones you do not know.
"""


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": ref("Error")}}}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _retry(description: str) -> dict[str, Any]:
    return {
        **_error(description),
        "headers": {
            "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
        },
    }


NOTEBOOK_BUSY = _retry(
    "The notebook's collaborative room is still loading it (LiveDocuments.mode auto), or another writer "
    "(the contents API, an editor) is in the middle of writing the file, which does not parse yet: retry."
)
FORBIDDEN = _error(
    "Not authenticated (no or wrong token; an expired or revoked agent token; a cookie request without its "
    "XSRF token), or not authorized by the server's authorizer (an agent token without the scope needed: "
    "the message names it)."
)
TOO_LARGE = _error("The request body is larger than max_body_bytes.")
TOKEN_FILE_UNAVAILABLE = _error(
    "The token file is locked by another process, corrupt or cannot be opened: the message names it."
)
NOT_ENABLED = _error(
    "Agent tokens are not enabled on this server (the message names the two configuration lines)."
)


def _body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"required": True, "description": description, "content": {JSON: {"schema": schema}}}


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def _session_name() -> dict[str, Any]:
    return {
        "name": "name",
        "in": "path",
        "required": True,
        "description": "The session name (names are per identity: the caller's own session of that name).",
        "schema": {"type": "string", "pattern": SESSION_NAME_PATTERN},
    }


# The 202 of a route the approval gate may make wait (the person decides in JupyterLab).
APPROVAL_PENDING = {
    "description": "Waiting for the person's approval (the approval gate): it is done once approved. The "
    "Location header is the request (GET /api/agent/approvals/{approval_id}).",
    "headers": {
        "Location": {"description": "/api/agent/approvals/{approval_id}", "schema": {"type": "string"}}
    },
    "content": {JSON: {"schema": ref("ApprovalPending")}},
}


def _session_owner() -> dict[str, Any]:
    return _query(
        "owner",
        "Whose session of that name (as the list's owner): for the server's own credentials and persons, "
        "another identity's; an agent token reaches only its own.",
        {"type": "string"},
    )


RUN_NOT_FOUND = _error(
    "No such run: never started, another agent's, or forgotten (run_retention, max_kept_runs)."
)


def _run_id() -> dict[str, Any]:
    return {
        "name": "run_id",
        "in": "path",
        "required": True,
        "description": "The run's id.",
        "schema": {"type": "string"},
    }


def _paths() -> dict[str, Any]:
    notebook_path = {
        "name": "path",
        "in": "path",
        "required": True,
        "description": "The notebook's path relative to the server root, URL-encoded ('/' may be sent as "
        "is). Must end in .ipynb. Hidden and outside-root paths answer 404 as the contents API does.",
        "schema": {"type": "string"},
    }
    return {
        "/api/agent/notebooks/{path}": {
            "parameters": [notebook_path],
            "get": {
                "operationId": "readNotebook",
                "summary": "Read a notebook for an agent",
                "description": "Cells with their source as one string and outputs summarized for a "
                "model's context (text truncated at summary_max_chars; binary outputs as {mime, bytes}); "
                "a cut text names the route with all of it ('full'), every other MIME type the route "
                "with its data ('url'). All cells by default; a page with start/limit, or the cells "
                "named by cell_ids. Every answer has the notebook's cell_count. format=text answers the "
                "same as compact plain text for a model's context.",
                "tags": ["notebooks"],
                "x-authorization": {"resource": "contents", "action": "read"},
                "parameters": [
                    _query(
                        "include_binary",
                        "1, true, yes or on: binary outputs (and attachments) carry their base64 'data'.",
                        {"type": "string"},
                    ),
                    _query(
                        "start",
                        "First cell of the page (0-based). Past the last cell: no cells, with cell_count.",
                        {"type": "integer", "minimum": 0},
                    ),
                    _query(
                        "limit",
                        f"Most cells in the page (default: all from start), 1 to {MAX_READ_LIMIT}.",
                        {"type": "integer", "minimum": 1, "maximum": MAX_READ_LIMIT},
                    ),
                    _query(
                        "cell_ids",
                        "Only these cells, in this order: cell ids or @index (e.g. 'a1b2,@7'), "
                        f"comma-separated, at most {MAX_CELL_REFS}; not with start/limit.",
                        {"type": "string"},
                    ),
                    _query(
                        "include",
                        f"Extra cell fields, comma-separated: {', '.join(INCLUDES)} (attachments: names, "
                        "types and sizes; the data only with include_binary).",
                        {"type": "string"},
                    ),
                    _query(
                        "format",
                        "json (default) or text: the same read as compact plain text (text/plain).",
                        {"type": "string", "enum": list(FORMATS)},
                    ),
                    _query(
                        "since",
                        "The 'hash' of an earlier answer: the read also has 'changes_since', the cells "
                        "edited, inserted, deleted or moved since that version and by whom (see the change "
                        "ledger).",
                        {"type": "string", "pattern": "^[0-9a-fA-F]{64}$"},
                    ),
                ],
                "responses": {
                    "200": {
                        "description": "The notebook (or the page, or the named cells).",
                        "content": {
                            JSON: {"schema": ref("NotebookRead")},
                            TEXT: {"schema": {"type": "string", "description": "format=text"}},
                        },
                    },
                    "400": _error(
                        "Not a .ipynb path, a path too long for the file system, or the file is not a "
                        "notebook (invalid JSON, no cells); a bad start, limit, cell_ids, include, "
                        "format or since; a cell id shared by several cells (name one by @index)."
                    ),
                    "403": FORBIDDEN,
                    "404": _error(
                        "No such notebook (also hidden and outside-root paths), or a cell named in "
                        "cell_ids does not exist."
                    ),
                    "409": _error("The live (collaborative) document has duplicate cell ids."),
                    "503": NOTEBOOK_BUSY,
                },
            },
            "post": {
                "operationId": "changeNotebook",
                "summary": "Edit, insert, delete, move or replace text in cells; or create the notebook",
                "description": "One operation, or a batch {ops: [...]} applied in order and atomically "
                "(all or none, one save; on a local disk a temporary file renamed over the notebook). "
                "replace changes exact text inside a cell: 'old' must match once, or every match with "
                "all: true; otherwise 400 with 'matches' (each match's line in the cell). "
                "{action: create} creates the notebook instead (201 with the read answer; 409 if the path "
                "exists; 404 for a missing folder unless parents: true): nbformat 4.5 in nbformat's "
                "layout, metadata.kernelspec from the kernelspec manager, never written over a file. "
                "Deterministic: the same file and request give the same bytes. Edits of one notebook are "
                "serialized, and the file is checked again just before it is replaced: a change by another "
                "writer since the read is a 409 with expected_hash, else the edit is applied to it.",
                "tags": ["notebooks"],
                "x-authorization": {"resource": "contents", "action": "write"},
                "requestBody": _body(ref("NotebookChangeRequest"), "One operation or a batch."),
                "responses": {
                    "200": _json("What was done, and the new hash.", ref("NotebookChangeResult")),
                    "201": _json("create: the new notebook, as a read answers it.", ref("NotebookCreated")),
                    "202": APPROVAL_PENDING,
                    "400": _error(
                        "The body is invalid, or an operation cannot apply (index out of range, unknown "
                        "cell id, a replace whose 'old' matches no time or several times without all...), "
                        "or the result would not be a valid notebook; create: an unknown kernel_name. "
                        "Nothing was changed."
                    ),
                    "403": FORBIDDEN,
                    "404": _error(
                        "No such notebook (also hidden and outside-root paths); create: its folder does not "
                        "exist (send parents: true)."
                    ),
                    "409": _error(
                        "create: the path exists. "
                        "expected_hash does not match the file, also when another writer changed it while "
                        "the edit was being saved (or the live document changed during the edit); without "
                        "expected_hash, another writer kept changing it during every attempt. Read it "
                        "again. Nothing changed."
                    ),
                    "413": TOO_LARGE,
                    "503": NOTEBOOK_BUSY,
                },
            },
        },
        "/api/agent/notebooks/{path}/cells/{cell}/outputs/{n}": {
            "parameters": [
                notebook_path,
                {
                    "name": "cell",
                    "in": "path",
                    "required": True,
                    "description": "The cell: its id, or @index (e.g. @3) for a cell without an id or "
                    "with an id other cells share.",
                    "schema": {"type": "string"},
                },
                {
                    "name": "n",
                    "in": "path",
                    "required": True,
                    "description": "The output's index in the cell (0-based).",
                    "schema": {"type": "integer", "minimum": 0},
                },
            ],
            "get": {
                "operationId": "readNotebookOutput",
                "summary": "One output of a cell in full, or one MIME type of it as its bytes",
                "description": "Without mime: the whole output as JSON. With mime: that type alone as "
                "its own content type: binary types (image/png...) base64-decoded, text types as UTF-8 "
                "(text/plain of a stream is its text, of an error its traceback; ANSI escapes removed), "
                "JSON types as JSON. Types a browser could run (HTML, SVG, JavaScript, anything but "
                f"{', '.join(INLINE_MIMES)}) come as an attachment; every answer is sandboxed by its "
                "Content-Security-Policy and sent with X-Content-Type-Options: nosniff.",
                "tags": ["notebooks"],
                "x-authorization": {"resource": "contents", "action": "read"},
                "parameters": [
                    _query(
                        "mime",
                        "One MIME type of the output (see 'mimes' of the JSON answer), e.g. image/png.",
                        {"type": "string"},
                    )
                ],
                "responses": {
                    "200": {
                        "description": "The output, or the data of one of its MIME types.",
                        "content": {
                            JSON: {
                                "schema": {
                                    "anyOf": [
                                        ref("NotebookOutput"),
                                        {"description": "With mime of a JSON type: that data as stored."},
                                    ]
                                }
                            },
                            "*/*": {"schema": {"description": "With mime: the data as that type."}},
                        },
                    },
                    "400": _error(
                        "Not a .ipynb path; n is not an integer from 0; mime is not a MIME type; the "
                        "cell id is shared by several cells (name one by @index); the stored data is "
                        "malformed (base64 that does not decode)."
                    ),
                    "403": FORBIDDEN,
                    "404": _error(
                        "No such notebook (also hidden and outside-root paths), cell or output, or the "
                        "output has no such MIME type (the message lists the ones it has)."
                    ),
                    "409": _error("The live (collaborative) document has duplicate cell ids."),
                    "503": NOTEBOOK_BUSY,
                },
            },
        },
        "/api/agent/notebooks/{path}/run": {
            "parameters": [notebook_path],
            "post": {
                "operationId": "runNotebook",
                "summary": "Run a notebook's cells in its own kernel and write their outputs back",
                "description": "The kernel of the notebook's jupyter_server session (created as JupyterLab "
                "would when there is none). Cells run in notebook order; their outputs are stored as "
                "nbformat outputs (old ones cleared when a cell starts, saved when it ends), at most "
                "NotebookRunner.max_cell_bytes_stored per cell: past it one placeholder output says what was "
                "left out and the artifact that holds it. Answers one "
                f"JSON result, or with 'Accept: {NDJSON}' the eval event stream; closing it interrupts. "
                "Images in the answer are {type, mime, bytes, url} (url: the output route); their base64 "
                "only with include_images. A kernel death ends the run (restarted: true); nothing is "
                "re-run. A cell that does not stop after the interrupt gets the kernel restarted in place "
                "(same id; the output names the cell). A notebook deleted during the run still answers 200 "
                "(outputs_error says its outputs could not be written). Kernels runs started are shut down "
                "when unused (NotebookKernels.idle_timeout, NotebookKernels.max_kernels).",
                "tags": ["notebooks"],
                "x-authorization": [
                    {"resource": "contents", "action": "write"},
                    {"resource": "kernels", "action": "execute"},
                ],
                "requestBody": _body(ref("NotebookRunRequest"), "Which cells, the time budget, errors."),
                "responses": {
                    "200": {
                        "description": "The result, or the event stream.",
                        "content": {
                            JSON: {"schema": ref("NotebookRunResult")},
                            NDJSON: {"schema": ref("NotebookRunEvent")},
                        },
                    },
                    "202": {
                        "description": "With detach: true, the run goes on without the client: its state "
                        "is at the Location header (GET /api/agent/runs/{run_id}).",
                        "headers": {
                            "Location": {
                                "description": "/api/agent/runs/{run_id}",
                                "schema": {"type": "string"},
                            }
                        },
                        "content": {JSON: {"schema": ref("RunStarted")}},
                    },
                    "400": _error(
                        "The body is invalid, a named cell does not exist (or its id is ambiguous), or the "
                        "notebook's kernelspec is not installed. Nothing ran."
                    ),
                    "403": _error(
                        "Not authenticated, or not authorized (write on contents and execute on kernels), or "
                        "the notebook is a link that resolves outside the server's root. Nothing ran."
                    ),
                    "404": _error("No such notebook (also hidden and outside-root paths)."),
                    "409": _error("expected_hash does not match the notebook. Nothing ran."),
                    "413": TOO_LARGE,
                    "503": _retry(
                        "The notebook is being written by another program, no kernel could start, or "
                        "the notebook's kernel did not answer within the call's timeout."
                    ),
                },
            },
        },
        "/api/agent/notebooks/{path}/kernel": {
            "parameters": [notebook_path],
            "get": {
                "operationId": "readNotebookKernel",
                "summary": "The notebook's own kernel: state, kernelspec, execution count, people on it",
                "tags": ["notebooks"],
                "x-authorization": {"resource": "kernels", "action": "read"},
                "responses": {
                    "200": _json("The kernel (state not_running when it has none).", ref("NotebookKernel")),
                    "400": _error("Not a .ipynb path."),
                    "403": FORBIDDEN,
                    "404": _error("No such notebook (also hidden and outside-root paths)."),
                },
            },
            "post": {
                "operationId": "controlNotebookKernel",
                "summary": "Interrupt, restart or shut down the notebook's kernel",
                "description": "interrupt: a run or eval in progress answers cancelled. restart: in place "
                "(same id), as JupyterLab's Restart Kernel; the answer says the state was lost. shutdown: "
                "the notebook's jupyter_server session and its kernel are deleted, as JupyterLab's Shut "
                "Down Kernel. A restart or shutdown cancels a call in progress first.",
                "tags": ["notebooks"],
                "x-authorization": {"resource": "kernels", "action": "execute"},
                "requestBody": _body(ref("NotebookKernelRequest"), "The action."),
                "responses": {
                    "200": _json("The kernel after the action, and what was done.", ref("NotebookKernel")),
                    "202": APPROVAL_PENDING,
                    "400": _error("The body is invalid, or not a .ipynb path."),
                    "403": FORBIDDEN,
                    "404": _error("No such notebook (also hidden and outside-root paths)."),
                    "409": _error(
                        "restart: the notebook has no running kernel (interrupt and shutdown "
                        "answer 200, nothing to do)."
                    ),
                    "413": TOO_LARGE,
                    "503": _retry("The kernel could not be restarted or did not answer."),
                },
            },
        },
        **_ledger_paths(notebook_path),
        "/api/agent/eval": {
            "post": {
                "operationId": "evaluate",
                "summary": "Run Python cells in a kernel session",
                "description": "Runs the cells in order in the session's kernel (started by the server's "
                "kernel manager, visible in /api/kernels). Answers one JSON result, or, with "
                f"'Accept: {NDJSON}', a stream of events (one JSON object per line) ending with a "
                "'result' event identical to the JSON answer. A client that disconnects cancels the run "
                "(the kernel is interrupted); with detach: true the answer is 202 at once and the run goes "
                "on without the client (/api/agent/runs).",
                "tags": ["eval"],
                "x-authorization": {"resource": "kernels", "action": "execute"},
                "requestBody": _body(ref("EvalRequest"), "The cells and where to run them."),
                "responses": {
                    "200": {
                        "description": "The result (after all cells ran, failed, timed out or were "
                        "cancelled), or the event stream.",
                        "content": {
                            JSON: {"schema": ref("EvalResult")},
                            NDJSON: {
                                "schema": {
                                    **ref("EvalEvent"),
                                    "description": "Each line is one EvalEvent; the last is 'result' or "
                                    "'error'. 'heartbeat' lines are sent while nothing else is.",
                                },
                            },
                        },
                    },
                    "202": {
                        "description": "With detach: true, the run goes on without the client: its state "
                        "is at the Location header (GET /api/agent/runs/{run_id}).",
                        "headers": {
                            "Location": {
                                "description": "/api/agent/runs/{run_id}",
                                "schema": {"type": "string"},
                            }
                        },
                        "content": {JSON: {"schema": ref("RunStarted")}},
                    },
                    "400": _error(
                        "The body is invalid, cwd is not a directory inside the root, or the "
                        "kernel spec does not exist."
                    ),
                    "403": FORBIDDEN,
                    "409": _error("kernel_name differs from the session's kernel: send reset: true."),
                    "413": TOO_LARGE,
                    "502": _error("The kernel gateway failed to create the kernel."),
                    "503": _retry(
                        "All max_sessions sessions are busy, or a kernel could not start (descriptors "
                        "exhausted, gateway unreachable): retry after Retry-After seconds."
                    ),
                },
            }
        },
        "/api/agent/sessions": {
            "get": {
                "operationId": "listSessions",
                "summary": "List eval sessions",
                "description": "An agent token sees its own sessions and the sessions and kernels of "
                "notebooks inside its paths; the server's credentials and persons see all.",
                "tags": ["sessions"],
                "x-authorization": {"resource": "kernels", "action": "read"},
                "responses": {
                    "200": _json("The sessions and counters.", ref("SessionList")),
                    "403": FORBIDDEN,
                },
            }
        },
        "/api/agent/sessions/{name}": {
            "parameters": [_session_name(), _session_owner()],
            "delete": {
                "parameters": [
                    _query(
                        "approval_wait",
                        "Seconds to wait for the person when the agent must ask first (a DELETE has no "
                        "body); "
                        "past it: 202. Default: ApprovalPolicy.wait.",
                        {"type": "number", "minimum": 0},
                    )
                ],
                "operationId": "deleteSession",
                "summary": "Shut a session and its kernel down",
                "description": "Its artifacts are removed with it; a call running in it is cancelled.",
                "tags": ["sessions"],
                "x-authorization": {"resource": "kernels", "action": "execute"},
                "responses": {
                    "204": {"description": "Shut down."},
                    "202": APPROVAL_PENDING,
                    "400": _error("approval_wait is not a number of seconds up to ApprovalPolicy.timeout."),
                    "403": FORBIDDEN,
                    "404": _error("No such session (for an agent token: none of its own)."),
                    "409": _error("Several identities have a session of that name: name its owner."),
                },
            },
        },
        "/api/agent/sessions/{name}/interrupt": {
            "parameters": [_session_name(), _session_owner()],
            "post": {
                "operationId": "interruptSession",
                "summary": "Interrupt what a session is running",
                "description": "The running call answers cancelled: true. No request body is needed "
                "(any body is ignored).",
                "tags": ["sessions"],
                "x-authorization": {"resource": "kernels", "action": "execute"},
                "responses": {
                    "200": _json("What was interrupted.", ref("InterruptResult")),
                    "403": FORBIDDEN,
                    "404": _error("No such session (for an agent token: none of its own)."),
                    "409": _error("Several identities have a session of that name: name its owner."),
                },
            },
        },
        "/api/agent/artifacts/{artifact_id}": {
            "parameters": [
                {
                    "name": "artifact_id",
                    "in": "path",
                    "required": True,
                    "description": "The artifact_id of a truncated cell result (also in its output's "
                    "'Full: artifact://<id>' notice), of an omitted display, or of cut HTML ('Full HTML: "
                    "artifact://<id>').",
                    "schema": {"type": "string"},
                }
            ],
            "get": {
                "operationId": "readArtifact",
                "summary": "The full output of a truncated cell",
                "tags": ["eval"],
                "x-authorization": {"resource": "kernels", "action": "read"},
                "parameters": [
                    {
                        "name": "Range",
                        "in": "header",
                        "required": False,
                        "description": "One byte range (bytes=START-END, bytes=START-, bytes=-LAST): "
                        "the answer is 206 with that part (a range may cut a UTF-8 character). Several "
                        "ranges or another unit are ignored (the whole text, 200).",
                        "schema": {"type": "string"},
                    }
                ],
                "responses": {
                    "200": {
                        "description": "The full sanitized output text; for an omitted display its data "
                        "as text (base64, SVG, JSON); for cut HTML the whole HTML.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "206": {
                        "description": "The byte range asked for (Content-Range: bytes START-END/TOTAL).",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "403": FORBIDDEN,
                    "404": _error(
                        "No such artifact (artifacts go with their session, expire, and the oldest go "
                        "past ArtifactStore.max_bytes); for an agent token, also one it did not spill "
                        "whose notebook is not inside its paths."
                    ),
                    "416": _error("The range starts past the artifact's end (Content-Range: bytes */TOTAL)."),
                },
            },
        },
        "/api/agent/runs": {
            "get": {
                "operationId": "listRuns",
                "summary": "List detached runs",
                "description": "The caller's runs, newest first; a caller that is not an agent token (the "
                "server's token, a login) sees every run. Finished runs are kept for run_retention seconds "
                "(default 3600), at most max_kept_runs runs in all.",
                "tags": ["runs"],
                "x-authorization": {"resource": "kernels", "action": "read"},
                "responses": {"200": _json("The runs.", ref("RunList")), "403": FORBIDDEN},
            }
        },
        "/api/agent/runs/{run_id}": {
            "parameters": [_run_id()],
            "get": {
                "operationId": "getRun",
                "summary": "A detached run's state, per-cell progress and answer",
                "description": "With ?wait=S (seconds, at most 600) the answer waits until the run ends or "
                "S seconds passed.",
                "tags": ["runs"],
                "x-authorization": {"resource": "kernels", "action": "read"},
                "parameters": [
                    _query("wait", "Seconds to wait for the run to end first (0..600).", {"type": "number"})
                ],
                "responses": {
                    "200": _json("The run.", ref("RunDetail")),
                    "400": _error("wait is not a number of seconds from 0 to 600."),
                    "403": FORBIDDEN,
                    "404": RUN_NOT_FOUND,
                },
            },
        },
        "/api/agent/runs/{run_id}/events": {
            "parameters": [_run_id()],
            "get": {
                "operationId": "getRunEvents",
                "summary": "A detached run's events: replayed from any point, then live",
                "description": "Every event after sequence number 'after' (0: all), exactly once and in "
                "order, then the live ones as they come, as NDJSON ('heartbeat' lines while nothing else "
                "is sent). Ends when the run has ended and every event was sent (the last is 'result' or "
                "'error'), or after 'timeout' seconds (reconnect with after = the last seq seen). An "
                "'after' at or beyond the last event waits for the next.",
                "tags": ["runs"],
                "x-authorization": {"resource": "kernels", "action": "read"},
                "parameters": [
                    _query(
                        "after",
                        "The last seq already seen (0: from the first).",
                        {"type": "integer", "minimum": 0},
                    ),
                    _query(
                        "timeout",
                        "Seconds the stream stays open at most (default 300, at most 3600).",
                        {"type": "number"},
                    ),
                ],
                "responses": {
                    "200": {"description": "The events.", "content": {NDJSON: {"schema": ref("RunEvent")}}},
                    "400": _error("after is not an integer from 0, or timeout not seconds from 0 to 3600."),
                    "403": FORBIDDEN,
                    "404": RUN_NOT_FOUND,
                    "410": _error("The run ran in a server process that stopped: only its record is kept."),
                },
            },
        },
        "/api/agent/runs/{run_id}/cancel": {
            "parameters": [_run_id()],
            "post": {
                "operationId": "cancelRun",
                "summary": "Stop a detached run",
                "description": "Its kernel is interrupted; the run ends 'cancelled' (a finished run is "
                "answered as it is). No request body is needed (any body is ignored).",
                "tags": ["runs"],
                "x-authorization": {"resource": "kernels", "action": "execute"},
                "responses": {
                    "200": _json("The run's state, cancel_requested: true.", ref("RunCancelled")),
                    "403": FORBIDDEN,
                    "404": RUN_NOT_FOUND,
                },
            },
        },
        "/api/agent/tokens": {
            "get": {
                "operationId": "listAgentTokens",
                "summary": "List the agent tokens (never the tokens themselves)",
                "description": "Active, expired and revoked tokens, oldest first. Needs the server's own "
                "credentials: an agent token is refused.",
                "tags": ["tokens"],
                "x-authorization": {"resource": "agent_tokens", "action": "read"},
                "responses": {
                    "200": _json("The tokens.", ref("AgentTokenList")),
                    "403": FORBIDDEN,
                    "409": NOT_ENABLED,
                    "503": TOKEN_FILE_UNAVAILABLE,
                },
            },
            "post": {
                "operationId": "createAgentToken",
                "summary": "Create an agent token (shown once)",
                "description": "The token acts as the user agent:NAME with the given scopes and path globs "
                "until it expires or is revoked. Only its SHA-256 is stored: the answer is the one time the "
                "token is shown. Needs the server's own credentials: an agent token is refused.",
                "tags": ["tokens"],
                "x-authorization": {"resource": "agent_tokens", "action": "write"},
                "requestBody": _body(ref("AgentTokenRequest"), "The name, scopes, paths and lifetime."),
                "responses": {
                    "201": _json(
                        "The new token and its record, with warnings for the person (a token that asks "
                        "before some actions but runs code unasked).",
                        ref("AgentTokenCreated"),
                    ),
                    "400": _error("The body is invalid: a bad name, scope, path glob or lifetime."),
                    "403": FORBIDDEN,
                    "409": _error(
                        "An active token already has this name (revoke it first), or agent tokens are not "
                        "enabled on this server."
                    ),
                    "413": TOO_LARGE,
                    "503": _error(
                        "The token file stayed locked by another process (AgentIdentityProvider."
                        "token_db_timeout) or cannot be used: the message names it; nothing was created."
                    ),
                },
            },
        },
        "/api/agent/tokens/{name}": {
            "parameters": [
                {
                    "name": "name",
                    "in": "path",
                    "required": True,
                    "description": "The token's name.",
                    "schema": {"type": "string"},
                }
            ],
            "delete": {
                "operationId": "revokeAgentToken",
                "summary": "Revoke an agent token",
                "description": "Every token of that name not yet revoked answers 403 'revoked' from now on "
                "and what it started ends at once: its open websockets forward nothing more and are closed, "
                "its pending approval requests are withdrawn and its grants dropped, its detached runs are "
                "cancelled (the record stays, listed as revoked). Needs the server's own credentials.",
                "tags": ["tokens"],
                "x-authorization": {"resource": "agent_tokens", "action": "write"},
                "responses": {
                    "200": _json("The revoked token's record.", ref("AgentToken")),
                    "403": FORBIDDEN,
                    "404": _error("No token of that name is left to revoke."),
                    "409": NOT_ENABLED,
                    "503": _error(
                        "The token file stayed locked by another process (AgentIdentityProvider."
                        "token_db_timeout) or cannot be used: the message names it and says the token was "
                        "NOT revoked (it still works); revoke again."
                    ),
                },
            },
        },
        "/api/agent/approvals": {
            "get": {
                "operationId": "listApprovals",
                "summary": "The requests waiting for the person, and the recent decisions",
                "description": "Pending requests (oldest first, each with a bounded preview of what it "
                "would do: 'preview' true when cut; GET the request for it in full) and the 100 most recent "
                "decided ones. An agent sees only its own requests (and its own 100 latest decisions).",
                "tags": ["approvals"],
                "x-authorization": {"resource": "agent_approvals", "action": "read"},
                "responses": {"200": _json("The requests.", ref("ApprovalList")), "403": FORBIDDEN},
            }
        },
        "/api/agent/approvals/{approval_id}": {
            "parameters": [
                {
                    "name": "approval_id",
                    "in": "path",
                    "required": True,
                    "description": "The request's id (ASCII digits).",
                    "schema": {"type": "integer"},
                }
            ],
            "get": {
                "operationId": "getApproval",
                "summary": "One approval request, with what it would do",
                "tags": ["approvals"],
                "x-authorization": {"resource": "agent_approvals", "action": "read"},
                "responses": {
                    "200": _json("The request.", ref("Approval")),
                    "400": _error("The id is not a number (ASCII digits only)."),
                    "403": FORBIDDEN,
                    "404": _error("No such request (or another agent's)."),
                },
            },
            "post": {
                "operationId": "decideApproval",
                "summary": "Approve or deny a pending request (a person only)",
                "description": "Only a person decides: the server's own credentials, a logged-in user, a hub "
                "user with access to the server. An agent token is refused whatever its scopes. The waiting "
                "agent's request wakes at once: approved, it goes on as if there were no gate; denied, it "
                "answers 403 with the reason.",
                "tags": ["approvals"],
                "x-authorization": {"resource": "agent_approvals", "action": "write"},
                "requestBody": _body(
                    ref("ApprovalDecision"), "The decision, and optionally a grant and a reason."
                ),
                "responses": {
                    "200": _json("The decided request.", ref("Approval")),
                    "400": _error("The body is invalid (decision, for_seconds or reason)."),
                    "403": _error("An agent cannot decide an approval."),
                    "404": _error("No such request."),
                    "409": _error("The request is already decided, expired or withdrawn."),
                    "413": TOO_LARGE,
                },
            },
        },
        **_files_paths(),
        **_focus_paths(),
        "/api/agent/openapi.json": {
            "get": {
                "operationId": "getOpenAPI",
                "summary": "This document",
                "tags": ["meta"],
                "responses": {
                    "200": _json("The OpenAPI document.", {"type": "object"}),
                    "403": FORBIDDEN,
                },
            }
        },
    }


def _focus_paths() -> dict[str, Any]:
    """Share my focus: the person's tabs publish what they show; agents read it and point the person."""
    tab = {
        "name": "tab",
        "in": "path",
        "required": True,
        "description": "The browser tab's id (8 to 64 letters, digits, '_' or '-'), made by the page.",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{8,64}$"},
    }
    return {
        "/api/agent/focus": {
            "get": {
                "operationId": "readFocus",
                "summary": "What the person looks at, when they share it with you",
                "description": "The notebook, active cell (source cut, outputs summarized as a notebook "
                "read summarizes them), selected text and kernel state of the most recently active "
                "JupyterLab tab that shares its focus with the caller and whose notebook is inside an agent "
                "token's paths. Off by default: the person turns it on in the Agents panel ('Share my "
                "focus') for every agent or named ones. Held in memory only. Each read by an agent is told "
                "to the person's Agents panel.",
                "tags": ["focus"],
                "x-authorization": {"resource": "agent_focus", "action": "read"},
                "responses": {
                    "200": _json("The shared focus.", ref("Focus")),
                    "403": _error(
                        "Nothing is shared with the caller (or only a notebook outside its paths): the "
                        "message says how the person shares it; or the token lacks the read scope."
                    ),
                },
            }
        },
        "/api/agent/focus/tabs/{tab}": {
            "parameters": [tab],
            "put": {
                "operationId": "publishFocus",
                "summary": "A browser tab publishes its focus (the person only)",
                "description": "Called by the Agents panel while its person shares their focus: on every "
                "change (debounced) and as a heartbeat; kept FocusStore.ttl seconds unless published "
                "again. Agent tokens are refused.",
                "tags": ["focus"],
                "x-authorization": {"resource": "agent_focus", "action": "write"},
                "requestBody": _body(ref("FocusPublish"), "What the tab shows, and who may read it."),
                "responses": {
                    "200": _json("Kept.", ref("FocusShared")),
                    "400": _error("A bad tab id, or the body is invalid (agents, path, cell, selection)."),
                    "403": _error("An agent token, or a person other than the server's (JupyterHub)."),
                    "413": _error(
                        "The body is larger than FocusStore.max_publish_bytes (or max_body_bytes)."
                    ),
                },
            },
            "delete": {
                "operationId": "stopFocus",
                "summary": "The tab stops sharing its focus (the person only): it goes at once",
                "tags": ["focus"],
                "x-authorization": {"resource": "agent_focus", "action": "write"},
                "responses": {
                    "204": {"description": "Gone (also when it was not shared)."},
                    "400": _error("A bad tab id."),
                    "403": _error("An agent token."),
                },
            },
        },
        "/api/agent/focus/actions": {
            "post": {
                "operationId": "focusAction",
                "summary": "Show the person something in JupyterLab (allow-listed UI actions)",
                "description": "open_notebook (path), reveal_cell (path and cell_id or cell_index: scrolls "
                "to the cell and marks it), show_change (path, change_id: its diff), open_approval "
                "(approval_id). Done by the tab that shares its focus with the caller; without one, every "
                "JupyterLab page of the server shows it as a notification the person clicks. Never any "
                "other command.",
                "tags": ["focus"],
                "x-authorization": {"resource": "agent_ui", "action": "write"},
                "requestBody": _body(ref("FocusAction"), "The action and what it names."),
                "responses": {
                    "200": _json("Where it went.", ref("FocusActionResult")),
                    "400": _error("Not an allowed action, or it lacks what it needs."),
                    "403": FORBIDDEN,
                    "404": _error("The notebook is outside the agent token's paths (or not a notebook)."),
                    "413": TOO_LARGE,
                },
            }
        },
    }


def _files_paths() -> dict[str, Any]:
    """Finding files: the contents manager's listing, walked and filtered, a page at a time."""
    return {
        "/api/agent/files": {
            "get": {
                "operationId": "listFiles",
                "summary": "Find notebooks and files under a folder (glob, depth, pages)",
                "description": "The entries of a folder as the contents manager lists them (hidden files "
                "only where allow_hidden, hide_globs applied, an agent token's paths only), without what "
                "the .gitignore and .ignore files exclude (unless 'ignored'), with sizes and modification "
                "times. With recursive, glob or max_depth, its subfolders too, depth-first, each folder's "
                "entries by name; an ignored folder is not walked into. A page holds at most 'limit' "
                f"matching entries and a call walks at most {MAX_SECONDS:g} s or {MAX_SCANNED} entries: "
                "'truncated' says more may exist, 'stopped' why, 'next_start' is the 'start' of the next "
                "page.",
                "tags": ["files"],
                "x-authorization": {"resource": "contents", "action": "read"},
                "parameters": [
                    _query("path", "The folder, relative to the root (default: root).", {"type": "string"}),
                    _query(
                        "glob",
                        "Only paths (relative to 'path') matching it: * ? [...] within a name, ** for any "
                        "number of folders, e.g. **/*.ipynb.",
                        {"type": "string"},
                    ),
                    _query(
                        "max_depth",
                        f"Folder levels walked, 1 (the folder's own entries) to {MAX_DEPTH}; default: 1, "
                        "or every level with recursive or a glob with **.",
                        {"type": "integer", "minimum": 1, "maximum": MAX_DEPTH},
                    ),
                    _query("recursive", "1, true, yes or on: walk every level.", {"type": "string"}),
                    _query(
                        "start",
                        "The 'next_start' of the previous page (a path): this page begins after it.",
                        {"type": "string"},
                    ),
                    _query(
                        "limit",
                        f"Most entries in the page (default 500), 1 to {MAX_FILE_LIMIT}.",
                        {"type": "integer", "minimum": 1, "maximum": MAX_FILE_LIMIT},
                    ),
                    _query(
                        "ignored",
                        "1, true, yes or on: also what .gitignore and .ignore files exclude (and .git).",
                        {"type": "string"},
                    ),
                ],
                "responses": {
                    "200": _json("The entries of the page.", ref("FileList")),
                    "400": _error(
                        "A bad glob (at most 256 characters), max_depth, limit or start, 'path' with '.' or "
                        "'..', or 'path' is a file."
                    ),
                    "403": FORBIDDEN,
                    "404": _error("No such folder (also hidden ones, and outside an agent token's paths)."),
                    "503": _retry("Too many file searches run or wait: retry after Retry-After seconds."),
                },
            }
        }
    }


def _change_id() -> dict[str, Any]:
    return {
        "name": "change_id",
        "in": "path",
        "required": True,
        "description": "A change's id, as a listing gives it (digits).",
        "schema": {"type": "string"},
    }


LEDGER_UNAVAILABLE = _retry("The change ledger's database cannot be read right now (locked, corrupt).")


def _ledger_paths(notebook_path: dict[str, Any]) -> dict[str, Any]:
    """The change ledger's routes: list, show and undo the changes the extension made."""
    limit = _query(
        "limit",
        "Most changes in the answer (default 50), 1 to 1000.",
        {"type": "integer", "minimum": 1, "maximum": 1000},
    )
    return {
        "/api/agent/notebooks/{path}/changes": {
            "parameters": [notebook_path],
            "get": {
                "operationId": "listNotebookChanges",
                "summary": "The changes the extension made to a notebook, newest first",
                "description": "Every edit batch, notebook run (one entry per run), clear_outputs, upgrade, "
                "repair and undo, with who asked (user, via), a short summary and the cells it touched "
                "(without their bodies); and every save through /api/contents that dropped cells or text "
                "those changes put there (kind overwrite, via contents, overwrites: the change ids; its "
                "undo puts the agent's version back). Kept up to Ledger.max_changes_per_notebook per "
                "notebook.",
                "tags": ["changes"],
                "x-authorization": {"resource": "contents", "action": "read"},
                "parameters": [
                    limit,
                    _query(
                        "before",
                        "Only changes older than this change id (the answer's next_before: the next page).",
                        {"type": "string"},
                    ),
                ],
                "responses": {
                    "200": _json("The changes, newest first.", ref("ChangeList")),
                    "400": _error("Not a .ipynb path, or a bad limit or before."),
                    "403": FORBIDDEN,
                    "404": _error("A hidden or outside-root path."),
                    "503": LEDGER_UNAVAILABLE,
                },
            },
        },
        "/api/agent/notebooks/{path}/changes/{change_id}": {
            "parameters": [notebook_path, _change_id()],
            "get": {
                "operationId": "readNotebookChange",
                "summary": "One change with each cell's before and after, and a diff of each source",
                "tags": ["changes"],
                "x-authorization": {"resource": "contents", "action": "read"},
                "responses": {
                    "200": _json("The change.", ref("ChangeEntry")),
                    "400": _error("Not a .ipynb path, or the change id is not a positive integer."),
                    "403": FORBIDDEN,
                    "404": _error("No such change of this notebook (unknown, pruned, or of another one)."),
                    "503": LEDGER_UNAVAILABLE,
                },
            },
        },
        "/api/agent/notebooks/{path}/changes/{change_id}/undo": {
            "parameters": [notebook_path, _change_id()],
            "post": {
                "operationId": "undoNotebookChange",
                "summary": "Undo one change, as one atomic write (itself a change that can be undone)",
                "description": "Puts back what the change changed, in the cells it touched only: removes "
                "the cells it inserted, puts deleted and moved cells back where they were, restores "
                "sources, metadata and outputs (the undo of a run restores the outputs the cells had). "
                "Works on the live document of a notebook open in a collaborative room. Recorded with "
                "'undoes' (undoing an undo is a redo). The body is optional.",
                "tags": ["changes"],
                "x-authorization": {"resource": "contents", "action": "write"},
                "requestBody": {
                    "required": False,
                    "description": "Optional: expected_hash, as for edits.",
                    "content": {JSON: {"schema": ref("UndoRequest")}},
                },
                "responses": {
                    "200": _json(
                        "What was undone, the new hash, and the cells whose outputs it cleared.",
                        ref("UndoResult"),
                    ),
                    "202": APPROVAL_PENDING,
                    "400": _error(
                        "The body is invalid, the change id is not a positive integer, or the change "
                        "cannot be undone (cells without ids, an upgrade, a change of notebook metadata)."
                    ),
                    "403": FORBIDDEN,
                    "404": _error("No such change of this notebook, or no such notebook."),
                    "409": _error(
                        "A cell the undo would touch changed since the change (a person, another agent, a "
                        "later change): 'conflicts' names each cell and what changed; or expected_hash "
                        "does not match. Nothing was written. New outputs since (a run) conflict only with "
                        "a change that set outputs itself (a run, a clear); when the change set the cell's "
                        "source or type, the undo clears them ('outputs_cleared')."
                    ),
                    "413": TOO_LARGE,
                    "503": _retry(
                        "The change ledger cannot be read, the notebook is being written by another "
                        "program, or its collaborative room is loading."
                    ),
                },
            },
        },
        "/api/agent/changes": {
            "get": {
                "operationId": "listChanges",
                "summary": "The changes the extension made to every notebook, newest first",
                "description": "What a review panel or an admin reads: the entries of every notebook (as "
                "in the per-notebook listing), optionally only from a time on.",
                "tags": ["changes"],
                "x-authorization": {"resource": "contents", "action": "read"},
                "parameters": [
                    _query(
                        "since",
                        "Only changes recorded at or after this ISO 8601 time (UTC when it has no zone), "
                        "e.g. 2026-01-31T12:00:00Z.",
                        {"type": "string"},
                    ),
                    limit,
                ],
                "responses": {
                    "200": _json("The changes, newest first.", ref("ChangeList")),
                    "400": _error("A bad since (not an ISO 8601 time) or limit."),
                    "403": FORBIDDEN,
                    "503": LEDGER_UNAVAILABLE,
                },
            }
        },
    }


@functools.cache
def _document() -> dict[str, Any]:
    return {
        "openapi": OPENAPI_VERSION,
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": {
            "title": "jupyter-agent-tools",
            "version": __version__,
            "description": DESCRIPTION,
            "license": {"name": "BSD-3-Clause", "identifier": "BSD-3-Clause"},
        },
        "servers": [{"url": "/", "description": "The Jupyter server's base_url"}],
        "security": [{"token": []}],
        "tags": [
            {"name": "notebooks", "description": "Read and change notebooks cell by cell."},
            {"name": "eval", "description": "Run Python in kernel sessions."},
            {"name": "sessions", "description": "Eval sessions and their kernels."},
            {
                "name": "runs",
                "description": "Detached runs: evals and notebook runs that outlive the client.",
            },
            {"name": "tokens", "description": "Agent tokens: scoped, revocable identities for agents."},
            {
                "name": "approvals",
                "description": "The approval gate: what agents asked the person to decide.",
            },
            {"name": "changes", "description": "The change ledger: review and undo what was changed."},
            {"name": "files", "description": "Find notebooks and files."},
            {
                "name": "focus",
                "description": "What the person looks at, when they share it; UI actions for the person.",
            },
            {"name": "meta", "description": "The API contract."},
        ],
        "paths": _paths(),
        "components": {
            "schemas": copy.deepcopy(SCHEMAS),
            "securitySchemes": {
                "token": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "Authorization",
                    "description": "'token <the server's token>', or 'token <an agent token>' (jat_...) "
                    "where agent tokens are enabled (or a logged-in browser session cookie plus the XSRF "
                    "token on state-changing requests).",
                }
            },
        },
    }


def openapi_document(base_url: str = "/") -> dict[str, Any]:
    """A fresh copy of the document; ``servers`` names the server's ``base_url``."""
    doc = copy.deepcopy(_document())
    doc["servers"][0]["url"] = base_url or "/"
    return doc


def operations(doc: dict[str, Any] | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """Every (METHOD, path, operation) of the document, in order."""
    doc = doc or _document()
    methods = ("get", "post", "put", "patch", "delete")
    return [
        (method.upper(), path, item[method])
        for path, item in doc["paths"].items()
        for method in methods
        if method in item
    ]
