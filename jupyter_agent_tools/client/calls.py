"""The requests of the agent routes, built from a method's arguments (no I/O), and the errors read from
their answers."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import httpx

from ..stream_events import Error
from .models import AgentAPIError, ApprovalDenied, CellsArg, EvalEvent, Op

NDJSON = "application/x-ndjson"
# Seconds for anything but a run: connecting, and waiting for a notebook or session answer.
DEFAULT_TIMEOUT = 60.0
# Added to a run's own timeout while waiting for its JSON answer: the kernel start is not counted in it.
START_ALLOWANCE = 120.0
# Longest silence tolerated on an event stream (the server sends a heartbeat every few seconds).
STREAM_READ_TIMEOUT = 120.0


@dataclass
class Call:
    """One request of a route: built from a method's arguments, sent by the client."""

    method: str
    path: str
    body: Any = None
    params: dict[str, str] = field(default_factory=dict)
    read_timeout: float | None = DEFAULT_TIMEOUT


def quote_path(path: str) -> str:
    return "/".join(urllib.parse.quote(part, safe="") for part in path.strip("/").split("/"))


def cell_bodies(cells: CellsArg) -> list[dict[str, Any]]:
    if isinstance(cells, str):
        return [{"code": cells}]
    return [{"code": c} if isinstance(c, str) else dict(c) for c in cells]


def drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def eval_call(
    cells: CellsArg,
    *,
    session: str | None,
    mode: Literal["session", "per-call"] | None,
    reset: bool | None,
    timeout: float | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    session_file: str | None,
    kernel_name: str | None,
    notebook: str | None = None,
) -> Call:
    body = {"cells": cell_bodies(cells)} | drop_none(
        session=session,
        mode=mode,
        reset=reset,
        timeout=timeout,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        session_file=session_file,
        kernel_name=kernel_name,
        notebook=notebook,
    )
    return Call("POST", "api/agent/eval", body, read_timeout=(timeout or 30.0) + START_ALLOWANCE)


def run_call(
    path: str,
    *,
    cell_ids: Sequence[str] | None,
    cell_indices: Sequence[int] | None,
    all_cells: bool | None,
    timeout: float | None,
    stop_on_error: bool | None,
    expected_hash: str | None,
    include_images: bool | None = None,
    ops: Sequence[Mapping[str, Any]] | None = None,
) -> Call:
    named = [x for x in (cell_ids, cell_indices) if x is not None]
    if len(named) > 1 or (named and all_cells):
        raise ValueError("give one of cell_ids, cell_indices or all_cells")
    body = drop_none(
        cell_ids=list(cell_ids) if cell_ids is not None else None,
        cell_indices=list(cell_indices) if cell_indices is not None else None,
        timeout=timeout,
        stop_on_error=stop_on_error,
        expected_hash=expected_hash,
        include_images=include_images,
        ops=[dict(op) for op in ops] if ops else None,
    )
    if not named and not ops:
        body["all"] = True
    return Call(
        "POST",
        f"api/agent/notebooks/{quote_path(path)}/run",
        body,
        read_timeout=(timeout or 30.0) + START_ALLOWANCE,
    )


def read_call(
    path: str,
    *,
    include_binary: bool = False,
    start: int | None = None,
    limit: int | None = None,
    cell_ids: Sequence[str] | None = None,
    include: Sequence[str] | None = None,
    text: bool = False,
    since: str | None = None,
) -> Call:
    call = Call("GET", f"api/agent/notebooks/{quote_path(path)}")
    if since is not None:
        call.params["since"] = since
    if include_binary:
        call.params["include_binary"] = "true"
    if start is not None:
        call.params["start"] = str(start)
    if limit is not None:
        call.params["limit"] = str(limit)
    if cell_ids is not None:
        call.params["cell_ids"] = ",".join(cell_ids)
    if include:
        call.params["include"] = ",".join(include)
    if text:
        call.params["format"] = "text"
    return call


def output_call(path: str, cell: str, n: int, mime: str | None) -> Call:
    cell_part = urllib.parse.quote(cell, safe="@")
    call = Call("GET", f"api/agent/notebooks/{quote_path(path)}/cells/{cell_part}/outputs/{n}")
    if mime is not None:
        call.params["mime"] = mime
    return call


def edit_call(
    path: str,
    ops: Op | Sequence[Op],
    expected_hash: str | None,
    upgrade: bool = False,
    repair: bool = False,
    approval_wait: float | None = None,
) -> Call:
    if isinstance(ops, Mapping):
        body: dict[str, Any] = dict(ops)
    else:
        body = {"ops": [dict(op) for op in ops]}
    if expected_hash is not None:
        body["expected_hash"] = expected_hash
    if upgrade:
        body["upgrade"] = True
    if repair:
        body["repair"] = True
    if approval_wait is not None:
        body["approval_wait"] = approval_wait
    return Call("POST", f"api/agent/notebooks/{quote_path(path)}", body)


def token_call(
    name: str,
    scopes: Sequence[str],
    paths: Sequence[str] | None,
    expires_in: float | None,
    ask: Sequence[str] | None = None,
) -> Call:
    body: dict[str, Any] = {"name": name, "scopes": list(scopes)}
    if paths:
        body["paths"] = list(paths)
    if ask:
        body["ask"] = list(ask)
    if expires_in is not None:
        body["expires_in"] = expires_in
    return Call("POST", "api/agent/tokens", body)


def approvals_call() -> Call:
    return Call("GET", "api/agent/approvals")


def approval_call(approval_id: int) -> Call:
    return Call("GET", f"api/agent/approvals/{int(approval_id)}")


def decide_call(approval_id: int, decision: str, for_seconds: float | None, reason: str | None) -> Call:
    body: dict[str, Any] = {"decision": decision, **drop_none(for_seconds=for_seconds, reason=reason)}
    return Call("POST", f"api/agent/approvals/{int(approval_id)}", body)


def changes_call(path: str, limit: int | None, before: str | None) -> Call:
    call = Call("GET", f"api/agent/notebooks/{quote_path(path)}/changes")
    call.params.update(drop_none(limit=str(limit) if limit is not None else None, before=before))
    return call


def change_call(
    path: str,
    change_id: str,
    undo: bool = False,
    expected_hash: str | None = None,
    approval_wait: float | None = None,
) -> Call:
    url = f"api/agent/notebooks/{quote_path(path)}/changes/{urllib.parse.quote(str(change_id), safe='')}"
    if not undo:
        return Call("GET", url)
    body = drop_none(expected_hash=expected_hash, approval_wait=approval_wait)
    return Call("POST", url + "/undo", body or None)


def create_call(
    path: str, cells: Sequence[Mapping[str, str]] | None, kernel_name: str | None, parents: bool
) -> Call:
    body: dict[str, Any] = {"action": "create"}
    if cells:
        body["cells"] = [dict(cell) for cell in cells]
    if kernel_name is not None:
        body["kernel_name"] = kernel_name
    if parents:
        body["parents"] = True
    return Call("POST", f"api/agent/notebooks/{quote_path(path)}", body)


def replace_op(cell: int | str, old: str, new: str, all: bool) -> dict[str, Any]:
    op: dict[str, Any] = {"action": "replace", "old": old, "new": new, "all": all}
    op["cell_index" if isinstance(cell, int) else "cell_id"] = cell
    return op


def files_call(
    path: str,
    glob: str | None,
    max_depth: int | None,
    recursive: bool,
    start: str | None,
    limit: int | None,
    ignored: bool = False,
) -> Call:
    call = Call("GET", "api/agent/files")
    call.params.update(
        drop_none(
            path=path or None,
            glob=glob,
            max_depth=str(max_depth) if max_depth is not None else None,
            recursive="true" if recursive else None,
            start=start,
            limit=str(limit) if limit is not None else None,
            ignored="true" if ignored else None,
        )
    )
    return call


def all_changes_call(since: str | None, limit: int | None) -> Call:
    call = Call("GET", "api/agent/changes")
    call.params.update(drop_none(since=since, limit=str(limit) if limit is not None else None))
    return call


def kernel_call(path: str, action: str | None, approval_wait: float | None = None) -> Call:
    url = f"api/agent/notebooks/{quote_path(path)}/kernel"
    if action is None:
        return Call("GET", url)
    return Call("POST", url, drop_none(action=action, approval_wait=approval_wait), read_timeout=120.0)


APPROVAL_POLL = 0.5  # seconds between two looks at a request waiting for the person


def pending_approval(answer: Any) -> int | None:
    """The approval id of an answer saying the call waits for the person (a ``202``), else None."""
    if isinstance(answer, Mapping) and answer.get("state") == "awaiting_approval":
        approval_id = answer.get("approval_id")
        return approval_id if isinstance(approval_id, int) else None
    return None


def settled(approval: Mapping[str, Any]) -> bool:
    """Whether an approval request says what came of it: denied, expired or withdrawn, or approved and
    applied (its ``outcome``; a run's approval is followed through the run instead)."""
    return approval.get("state") != "pending" and (
        approval.get("state") != "approved" or approval.get("outcome") is not None
    )


EVAL_OPTIONS = (
    "session",
    "mode",
    "reset",
    "timeout",
    "cwd",
    "env",
    "session_file",
    "kernel_name",
    "notebook",
)
RUN_OPTIONS = ("cell_ids", "cell_indices", "all_cells", "timeout", "stop_on_error", "expected_hash", "ops")
RUN_EVENTS_RETRIES = 5  # connection failures in a row before run_events gives up


def detached(call: Call) -> Call:
    """The call with ``"detach": true``: answered 202 at once with the run's summary."""
    return Call(call.method, call.path, {**call.body, "detach": True}, read_timeout=DEFAULT_TIMEOUT)


def options(names: Sequence[str], given: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(given) - set(names)
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))} (known: {', '.join(names)})")
    return {name: given.get(name) for name in names}


def run_id_path(run_id: str, tail: str = "") -> str:
    return f"api/agent/runs/{urllib.parse.quote(run_id, safe='')}{tail}"


def events_call(run_id: str, after: int) -> Call:
    return Call("GET", run_id_path(run_id, "/events"), params={"after": str(after)})


def run_state_call(run_id: str, wait: float | None) -> Call:
    params = {"wait": str(wait)} if wait else {}
    return Call("GET", run_id_path(run_id), params=params, read_timeout=(wait or 0) + DEFAULT_TIMEOUT)


def ends_run(event: EvalEvent) -> bool:
    return event["type"] in ("result", "error")


def headers(token: str, client: str | None) -> dict[str, str]:
    """The headers of every request: the token, and which program is calling (``cli`` is recorded as
    such in the change ledger)."""
    headers = {"Authorization": f"token {token}"} if token else {}
    if client:
        headers["X-Agent-Client"] = client
    return headers


def error_from(response: httpx.Response, content: bytes) -> AgentAPIError:
    message, reason, data = "", None, None
    try:
        data = json.loads(content)
        if isinstance(data, dict):
            message = str(data.get("message") or "")
            reason = data.get("reason")
    except ValueError:
        message = content.decode("utf-8", "replace").strip()[:500]
    if reason == "approval_denied" and isinstance(data, dict):
        return ApprovalDenied(response.status_code, message, str(response.url), data.get("approval_id"))
    return AgentAPIError(
        response.status_code, message or response.reason_phrase or "error", reason, str(response.url)
    )


def transport_error(e: httpx.TransportError, url: str) -> AgentAPIError:
    if isinstance(e, httpx.TimeoutException):
        return AgentAPIError(None, f"no answer from {url} in time ({type(e).__name__})", "timeout", url)
    return AgentAPIError(None, f"cannot reach the Jupyter server at {url}: {e}", "unreachable", url)


def decode_event(line: str) -> EvalEvent | None:
    line = line.strip()
    if not line:
        return None
    event = json.loads(line)
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise AgentAPIError(None, f"not an event of the stream: {line[:200]}", "bad_event")
    return cast(EvalEvent, event)  # (the server's: typed by its "type")


def stream_failure(event: Error, url: str) -> AgentAPIError:
    status, message = int(event.get("status") or 500), str(event.get("message") or "error")
    if event.get("reason") == "approval_denied":
        return ApprovalDenied(status, message, url, event.get("approval_id"))
    return AgentAPIError(status, message, url=url)


def base_url(url: str | None, token: str | None) -> tuple[str, str]:
    if url is None:
        from ..cli.discovery import find_server  # lazy: only when the caller did not say where

        found = find_server(token=token)
        url, token = found.url, found.token
    return (url if url.endswith("/") else url + "/"), token or ""
