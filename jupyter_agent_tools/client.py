"""A small typed HTTP client for the agent routes: ``AgentClient`` (sync) and ``AsyncAgentClient``.

HTTP only: it talks to a running server through its routes and never imports the server-side code. Every
failure raises :class:`AgentAPIError` with the HTTP status (``None`` when no answer came) and the route's
message::

    with AgentClient("http://127.0.0.1:8888/", token) as client:
        result = client.eval(["x = 20", "x * 2"], session="demo")
        print(result["output"])          # "[1/2]\\n(no output)\\n\\n[2/2]\\n40"

Without ``url`` the client finds the server as ``jupyter agent`` does (``JUPYTER_AGENT_URL`` /
``JUPYTER_AGENT_TOKEN``, then the running servers jupyter_server records in its runtime directory).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import httpx

__all__ = [
    "AgentAPIError",
    "AgentClient",
    "AsyncAgentClient",
    "Cell",
    "CellResult",
    "EditAnswer",
    "EvalEvent",
    "EvalResult",
    "NotebookAnswer",
]

NDJSON = "application/x-ndjson"
# Seconds for anything but a run: connecting, and waiting for a notebook or session answer.
DEFAULT_TIMEOUT = 60.0
# Added to a run's own timeout while waiting for its JSON answer: the kernel start is not counted in it.
START_ALLOWANCE = 120.0
# Longest silence tolerated on an event stream (the server sends a heartbeat every few seconds).
STREAM_READ_TIMEOUT = 120.0


class AgentAPIError(Exception):
    """A call failed: ``status`` is the HTTP status (``None`` when the server could not be reached or
    did not answer in time), ``message`` the route's message, ``reason`` its short reason if any."""

    def __init__(self, status: int | None, message: str, reason: str | None = None, url: str = ""):
        super().__init__(f"HTTP {status}: {message}" if status is not None else message)
        self.status = status
        self.message = message
        self.reason = reason
        self.url = url

    @property
    def timed_out(self) -> bool:
        """No answer came in time (``httpx`` timed out), as opposed to a refused connection."""
        return self.status is None and self.reason == "timeout"


class Cell(TypedDict, total=False):
    code: str
    title: str | None


class CellError(TypedDict):
    ename: str
    evalue: str
    traceback: list[str]


class CellResult(TypedDict):
    index: int
    title: str | None
    status: str  # complete | error | cancelled
    output: str
    exit_code: int
    error: CellError | None
    displays: list[dict[str, Any]]
    duration_ms: int
    stdin_requested: bool
    truncated: bool
    total_bytes: int
    total_lines: int
    output_bytes: int
    output_lines: int
    artifact_id: str | None


class EvalResult(TypedDict):
    session: str | None
    mode: str
    kernel_id: str | None
    cancelled: bool
    timed_out: bool
    restarted: bool
    error: str | None
    output: str
    cells: list[CellResult]


class NotebookCell(TypedDict, total=False):
    index: int
    id: str | None
    cell_type: str
    source: str
    execution_count: int | None
    outputs: list[dict[str, Any]]


class _NotebookAnswer(TypedDict):
    path: str
    nbformat: int
    nbformat_minor: int | None
    hash: str
    cell_count: int
    start: int | None
    next_start: int | None
    cells: list[NotebookCell]


class NotebookAnswer(_NotebookAnswer, total=False):
    converted_from: str  # an nbformat 3 file, shown converted
    problems: list[str]  # a notebook invalid as found


class _EditAnswer(TypedDict):
    message: str
    details: dict[str, Any]
    hash: str
    results: list[dict[str, Any]]


class EditAnswer(_EditAnswer, total=False):
    repairs: list[str]  # with repair=True
    upgraded_from: str  # with upgrade=True on an nbformat 3 file


# One NDJSON event: {"type": "cell_start" | "chunk" | "display" | "cell_end" | "heartbeat" | "restart" |
# "result" | "error", ...} (docs/api.md, "The event stream").
EvalEvent = dict[str, Any]
CellsArg = str | Sequence[str | Cell | Mapping[str, Any]]
Op = Mapping[str, Any]


@dataclass
class _Call:
    """One request, built the same way for the sync and the async client."""

    method: str
    path: str
    body: Any = None
    params: dict[str, str] = field(default_factory=dict)
    read_timeout: float | None = DEFAULT_TIMEOUT


def _quote_path(path: str) -> str:
    return "/".join(urllib.parse.quote(part, safe="") for part in path.strip("/").split("/"))


def _cells(cells: CellsArg) -> list[dict[str, Any]]:
    if isinstance(cells, str):
        return [{"code": cells}]
    return [{"code": c} if isinstance(c, str) else dict(c) for c in cells]


def _drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _eval_call(
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
) -> _Call:
    body = {"cells": _cells(cells)} | _drop_none(
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
    return _Call("POST", "api/agent/eval", body, read_timeout=(timeout or 30.0) + START_ALLOWANCE)


def _run_call(
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
) -> _Call:
    named = [x for x in (cell_ids, cell_indices) if x is not None]
    if len(named) > 1 or (named and all_cells):
        raise ValueError("give one of cell_ids, cell_indices or all_cells")
    body = _drop_none(
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
    return _Call(
        "POST",
        f"api/agent/notebooks/{_quote_path(path)}/run",
        body,
        read_timeout=(timeout or 30.0) + START_ALLOWANCE,
    )


def _read_call(
    path: str,
    *,
    include_binary: bool = False,
    start: int | None = None,
    limit: int | None = None,
    cell_ids: Sequence[str] | None = None,
    include: Sequence[str] | None = None,
    text: bool = False,
    since: str | None = None,
) -> _Call:
    call = _Call("GET", f"api/agent/notebooks/{_quote_path(path)}")
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


def _output_call(path: str, cell: str, n: int, mime: str | None) -> _Call:
    cell_part = urllib.parse.quote(cell, safe="@")
    call = _Call("GET", f"api/agent/notebooks/{_quote_path(path)}/cells/{cell_part}/outputs/{n}")
    if mime is not None:
        call.params["mime"] = mime
    return call


def _edit_call(
    path: str, ops: Op | Sequence[Op], expected_hash: str | None, upgrade: bool = False, repair: bool = False
) -> _Call:
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
    return _Call("POST", f"api/agent/notebooks/{_quote_path(path)}", body)


def _token_call(
    name: str, scopes: Sequence[str], paths: Sequence[str] | None, expires_in: float | None
) -> _Call:
    body: dict[str, Any] = {"name": name, "scopes": list(scopes)}
    if paths:
        body["paths"] = list(paths)
    if expires_in is not None:
        body["expires_in"] = expires_in
    return _Call("POST", "api/agent/tokens", body)


def _changes_call(path: str, limit: int | None, before: str | None) -> _Call:
    call = _Call("GET", f"api/agent/notebooks/{_quote_path(path)}/changes")
    call.params.update(_drop_none(limit=str(limit) if limit is not None else None, before=before))
    return call


def _change_call(path: str, change_id: str, undo: bool = False, expected_hash: str | None = None) -> _Call:
    url = f"api/agent/notebooks/{_quote_path(path)}/changes/{urllib.parse.quote(str(change_id), safe='')}"
    if not undo:
        return _Call("GET", url)
    return _Call("POST", url + "/undo", _drop_none(expected_hash=expected_hash) or None)


def _kernel_call(path: str, action: str | None) -> _Call:
    url = f"api/agent/notebooks/{_quote_path(path)}/kernel"
    if action is None:
        return _Call("GET", url)
    return _Call("POST", url, {"action": action}, read_timeout=120.0)


def _all_changes_call(since: str | None, limit: int | None) -> _Call:
    call = _Call("GET", "api/agent/changes")
    call.params.update(_drop_none(since=since, limit=str(limit) if limit is not None else None))
    return call


def _headers(token: str, client: str | None) -> dict[str, str]:
    """The headers of every request: the token, and which program is calling (``cli`` is recorded as
    such in the change ledger)."""
    headers = {"Authorization": f"token {token}"} if token else {}
    if client:
        headers["X-Agent-Client"] = client
    return headers


def _error_from(response: httpx.Response, content: bytes) -> AgentAPIError:
    message, reason = "", None
    try:
        data = json.loads(content)
        if isinstance(data, dict):
            message = str(data.get("message") or "")
            reason = data.get("reason")
    except ValueError:
        message = content.decode("utf-8", "replace").strip()[:500]
    return AgentAPIError(
        response.status_code, message or response.reason_phrase or "error", reason, str(response.url)
    )


def _transport_error(e: httpx.TransportError, url: str) -> AgentAPIError:
    if isinstance(e, httpx.TimeoutException):
        return AgentAPIError(None, f"no answer from {url} in time ({type(e).__name__})", "timeout", url)
    return AgentAPIError(None, f"cannot reach the Jupyter server at {url}: {e}", "unreachable", url)


def _decode_event(line: str) -> EvalEvent | None:
    line = line.strip()
    return json.loads(line) if line else None


def _stream_failure(event: EvalEvent, url: str) -> AgentAPIError:
    return AgentAPIError(int(event.get("status") or 500), str(event.get("message") or "error"), url=url)


def _base_url(url: str | None, token: str | None) -> tuple[str, str]:
    if url is None:
        from .cli.discovery import find_server  # lazy: only when the caller did not say where

        found = find_server(token=token)
        url, token = found.url, found.token
    return (url if url.endswith("/") else url + "/"), token or ""


class AgentClient:
    """Synchronous client. ``url`` is the server's base URL (with its ``base_url``); ``token`` its token.

    ``transport`` lets tests plug in an ``httpx`` transport (e.g. ``httpx.MockTransport``).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        client: str | None = None,
    ):
        self.url, self.token = _base_url(url, token)
        headers = _headers(self.token, client)
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- plumbing --------------------------------------------------------------------------------------

    def _timeout(self, read: float | None) -> httpx.Timeout:
        return httpx.Timeout(self._http.timeout.connect, read=read, write=read, pool=read)

    def _send(self, call: _Call) -> httpx.Response:
        try:
            response = self._http.request(
                call.method,
                call.path,
                json=call.body,
                params=call.params or None,
                timeout=self._timeout(call.read_timeout),
            )
        except httpx.TransportError as e:
            raise _transport_error(e, self.url) from e
        if response.status_code >= 400:
            raise _error_from(response, response.content)
        return response

    def _json(self, call: _Call) -> Any:
        response = self._send(call)
        return response.json() if response.content else None

    def _events(self, call: _Call, raise_on_error: bool) -> Generator[EvalEvent, None, None]:
        try:
            with self._http.stream(
                call.method,
                call.path,
                json=call.body,
                headers={"Accept": NDJSON},
                timeout=self._timeout(STREAM_READ_TIMEOUT),
            ) as response:
                if response.status_code >= 400:
                    raise _error_from(response, response.read())
                for line in response.iter_lines():
                    event = _decode_event(line)
                    if event is None:
                        continue
                    if raise_on_error and event.get("type") == "error":
                        raise _stream_failure(event, self.url)
                    yield event
        except httpx.TransportError as e:
            raise _transport_error(e, self.url) from e

    # -- routes ----------------------------------------------------------------------------------------

    def eval(
        self,
        cells: CellsArg,
        *,
        session: str | None = None,
        mode: Literal["session", "per-call"] | None = None,
        reset: bool | None = None,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        session_file: str | None = None,
        kernel_name: str | None = None,
        notebook: str | None = None,
    ) -> EvalResult:
        """Run cells (a string is one cell) and return the JSON answer of ``POST /api/agent/eval``."""
        call = _eval_call(
            cells,
            session=session,
            mode=mode,
            reset=reset,
            timeout=timeout,
            cwd=cwd,
            env=env,
            session_file=session_file,
            kernel_name=kernel_name,
            notebook=notebook,
        )
        result: EvalResult = self._json(call)
        return result

    def stream_eval(
        self,
        cells: CellsArg,
        *,
        session: str | None = None,
        mode: Literal["session", "per-call"] | None = None,
        reset: bool | None = None,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        session_file: str | None = None,
        kernel_name: str | None = None,
        notebook: str | None = None,
        raise_on_error: bool = True,
    ) -> Generator[EvalEvent, None, None]:
        """Run cells and yield the NDJSON events as they come; the last is ``result`` (or ``error``).

        An ``error`` event raises :class:`AgentAPIError` unless ``raise_on_error`` is false. Closing the
        iterator early (``.close()``, leaving a ``with contextlib.closing(...)``) closes the connection,
        which cancels the run and interrupts the kernel.
        """
        call = _eval_call(
            cells,
            session=session,
            mode=mode,
            reset=reset,
            timeout=timeout,
            cwd=cwd,
            env=env,
            session_file=session_file,
            kernel_name=kernel_name,
            notebook=notebook,
        )
        return self._events(call, raise_on_error)

    def read_notebook(
        self,
        path: str,
        *,
        start: int | None = None,
        limit: int | None = None,
        cell_ids: Sequence[str] | None = None,
        include: Sequence[str] | None = None,
        include_binary: bool = False,
        since: str | None = None,
    ) -> NotebookAnswer:
        """``GET /api/agent/notebooks/{path}``: the notebook's cells (all, a page from ``start`` of at most
        ``limit``, or the ``cell_ids``: ids or ``@index``), ``cell_count`` and its ``hash``; ``include``:
        ``tags``, ``metadata``, ``attachments``; ``since`` (an earlier answer's hash): ``changes_since``."""
        answer: NotebookAnswer = self._json(
            _read_call(
                path,
                include_binary=include_binary,
                start=start,
                limit=limit,
                cell_ids=cell_ids,
                include=include,
                since=since,
            )
        )
        return answer

    def read_notebook_text(
        self,
        path: str,
        *,
        start: int | None = None,
        limit: int | None = None,
        cell_ids: Sequence[str] | None = None,
        include: Sequence[str] | None = None,
    ) -> str:
        """The same read as compact plain text for a model's context (``format=text``)."""
        return self._send(
            _read_call(path, text=True, start=start, limit=limit, cell_ids=cell_ids, include=include)
        ).text

    def read_output(self, path: str, cell: str, n: int) -> dict[str, Any]:
        """``GET .../cells/{cell}/outputs/{n}``: output ``n`` of cell ``cell`` (id or ``@index``) in full."""
        answer: dict[str, Any] = self._json(_output_call(path, cell, n, None))
        return answer

    def read_output_data(self, path: str, cell: str, n: int, mime: str) -> bytes:
        """One MIME type of that output as bytes (``?mime=``): an image's decoded bytes, a text's UTF-8."""
        return self._send(_output_call(path, cell, n, mime)).content

    def edit_notebook(
        self,
        path: str,
        ops: Op | Sequence[Op],
        *,
        expected_hash: str | None = None,
        upgrade: bool = False,
        repair: bool = False,
    ) -> EditAnswer:
        """``POST /api/agent/notebooks/{path}``: one operation (a mapping) or a batch (a sequence).

        ``upgrade``: write an nbformat 3 file converted to nbformat 4.5; ``repair``: apply nbformat's
        repairs to a notebook that is invalid as found (the answer's ``repairs`` lists them)."""
        answer: EditAnswer = self._json(_edit_call(path, ops, expected_hash, upgrade, repair))
        return answer

    def run_notebook(
        self,
        path: str,
        *,
        cell_ids: Sequence[str] | None = None,
        cell_indices: Sequence[int] | None = None,
        all_cells: bool | None = None,
        timeout: float | None = None,
        stop_on_error: bool | None = None,
        expected_hash: str | None = None,
        include_images: bool | None = None,
        ops: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """``POST /api/agent/notebooks/{path}/run``: run the notebook's cells (all when none are named).

        Images come as ``{type, mime, bytes, url}``; ``include_images`` adds their base64 (``data``)."""
        call = _run_call(
            path,
            cell_ids=cell_ids,
            cell_indices=cell_indices,
            all_cells=all_cells,
            timeout=timeout,
            stop_on_error=stop_on_error,
            expected_hash=expected_hash,
            include_images=include_images,
            ops=ops,
        )
        return dict(self._json(call))

    def stream_run_notebook(
        self,
        path: str,
        *,
        cell_ids: Sequence[str] | None = None,
        cell_indices: Sequence[int] | None = None,
        all_cells: bool | None = None,
        timeout: float | None = None,
        stop_on_error: bool | None = None,
        expected_hash: str | None = None,
        include_images: bool | None = None,
        ops: Sequence[Mapping[str, Any]] | None = None,
        raise_on_error: bool = True,
    ) -> Generator[EvalEvent, None, None]:
        """Like :meth:`run_notebook`, as an NDJSON event stream (the events of :meth:`stream_eval`)."""
        call = _run_call(
            path,
            cell_ids=cell_ids,
            cell_indices=cell_indices,
            all_cells=all_cells,
            timeout=timeout,
            stop_on_error=stop_on_error,
            expected_hash=expected_hash,
            include_images=include_images,
            ops=ops,
        )
        return self._events(call, raise_on_error)

    def sessions(self) -> dict[str, Any]:
        """``GET /api/agent/sessions``: ``{"sessions": [...], "totals": {...}, "pool": {...}}``."""
        return dict(self._json(_Call("GET", "api/agent/sessions")))

    def interrupt(self, name: str) -> dict[str, Any]:
        """``POST /api/agent/sessions/{name}/interrupt``: cancel what the session runs."""
        return dict(self._json(_Call("POST", f"api/agent/sessions/{_quote_path(name)}/interrupt", {})))

    def delete_session(self, name: str) -> None:
        """``DELETE /api/agent/sessions/{name}``: shut the session's kernel down."""
        self._send(_Call("DELETE", f"api/agent/sessions/{_quote_path(name)}"))

    def tokens(self) -> list[dict[str, Any]]:
        """``GET /api/agent/tokens``: the agent tokens (never the tokens themselves), oldest first."""
        return list(self._json(_Call("GET", "api/agent/tokens"))["tokens"])

    def create_token(
        self,
        name: str,
        scopes: Sequence[str],
        *,
        paths: Sequence[str] | None = None,
        expires_in: float | None = None,
    ) -> dict[str, Any]:
        """``POST /api/agent/tokens``: a new agent token; its ``token`` is in this answer only."""
        return dict(self._json(_token_call(name, scopes, paths, expires_in)))

    def revoke_token(self, name: str) -> dict[str, Any]:
        """``DELETE /api/agent/tokens/{name}``: revoke it (its record stays, as revoked)."""
        return dict(self._json(_Call("DELETE", f"api/agent/tokens/{_quote_path(name)}")))

    def artifact(self, artifact_id: str) -> str:
        """``GET /api/agent/artifacts/{id}``: the full output of a truncated cell."""
        return "".join(self.stream_artifact(artifact_id))

    def stream_artifact(self, artifact_id: str) -> Generator[str, None, None]:
        """The artifact's text in pieces, without holding all of it in memory."""
        path = f"api/agent/artifacts/{_quote_path(artifact_id)}"
        try:
            with self._http.stream("GET", path) as response:
                if response.status_code >= 400:
                    raise _error_from(response, response.read())
                yield from response.iter_text()
        except httpx.TransportError as e:
            raise _transport_error(e, self.url) from e

    # -- the change ledger -----------------------------------------------------------------------------

    def notebook_changes(
        self, path: str, *, limit: int | None = None, before: str | None = None
    ) -> dict[str, Any]:
        """``GET .../changes``: the notebook's recorded changes, newest first (``before``: older than that
        change id; the answer's ``next_before`` pages on)."""
        answer: dict[str, Any] = self._json(_changes_call(path, limit, before))
        return answer

    def notebook_change(self, path: str, change_id: str) -> dict[str, Any]:
        """``GET .../changes/{id}``: one change with each cell's before and after and source diffs."""
        answer: dict[str, Any] = self._json(_change_call(path, change_id))
        return answer

    def undo_change(self, path: str, change_id: str, *, expected_hash: str | None = None) -> dict[str, Any]:
        """``POST .../changes/{id}/undo``: undo one change (409 naming the cells changed since)."""
        answer: dict[str, Any] = self._json(_change_call(path, change_id, True, expected_hash))
        return answer

    def notebook_kernel(self, path: str, action: str | None = None) -> dict[str, Any]:
        """``GET .../kernel`` (state, kernelspec, people connected), or ``POST`` with ``action``
        (``interrupt``, ``restart``, ``shutdown``)."""
        answer: dict[str, Any] = self._json(_kernel_call(path, action))
        return answer

    def changes(self, *, since: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """``GET /api/agent/changes``: every notebook's changes, newest first (``since``: an ISO time)."""
        answer: dict[str, Any] = self._json(_all_changes_call(since, limit))
        return answer


class AsyncAgentClient:
    """The asynchronous twin of :class:`AgentClient`: the same methods, awaited (streams are async
    iterators)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        client: str | None = None,
    ):
        self.url, self.token = _base_url(url, token)
        headers = _headers(self.token, client)
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncAgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _timeout(self, read: float | None) -> httpx.Timeout:
        return httpx.Timeout(self._http.timeout.connect, read=read, write=read, pool=read)

    async def _send(self, call: _Call) -> httpx.Response:
        try:
            response = await self._http.request(
                call.method,
                call.path,
                json=call.body,
                params=call.params or None,
                timeout=self._timeout(call.read_timeout),
            )
        except httpx.TransportError as e:
            raise _transport_error(e, self.url) from e
        if response.status_code >= 400:
            raise _error_from(response, response.content)
        return response

    async def _json(self, call: _Call) -> Any:
        response = await self._send(call)
        return response.json() if response.content else None

    async def _events(self, call: _Call, raise_on_error: bool) -> AsyncGenerator[EvalEvent, None]:
        try:
            async with self._http.stream(
                call.method,
                call.path,
                json=call.body,
                headers={"Accept": NDJSON},
                timeout=self._timeout(STREAM_READ_TIMEOUT),
            ) as response:
                if response.status_code >= 400:
                    raise _error_from(response, await response.aread())
                async for line in response.aiter_lines():
                    event = _decode_event(line)
                    if event is None:
                        continue
                    if raise_on_error and event.get("type") == "error":
                        raise _stream_failure(event, self.url)
                    yield event
        except httpx.TransportError as e:
            raise _transport_error(e, self.url) from e

    async def eval(
        self,
        cells: CellsArg,
        *,
        session: str | None = None,
        mode: Literal["session", "per-call"] | None = None,
        reset: bool | None = None,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        session_file: str | None = None,
        kernel_name: str | None = None,
        notebook: str | None = None,
    ) -> EvalResult:
        """See :meth:`AgentClient.eval`."""
        call = _eval_call(
            cells,
            session=session,
            mode=mode,
            reset=reset,
            timeout=timeout,
            cwd=cwd,
            env=env,
            session_file=session_file,
            kernel_name=kernel_name,
            notebook=notebook,
        )
        result: EvalResult = await self._json(call)
        return result

    def stream_eval(
        self,
        cells: CellsArg,
        *,
        session: str | None = None,
        mode: Literal["session", "per-call"] | None = None,
        reset: bool | None = None,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        session_file: str | None = None,
        kernel_name: str | None = None,
        notebook: str | None = None,
        raise_on_error: bool = True,
    ) -> AsyncGenerator[EvalEvent, None]:
        """See :meth:`AgentClient.stream_eval` (``await it.aclose()`` cancels the run)."""
        call = _eval_call(
            cells,
            session=session,
            mode=mode,
            reset=reset,
            timeout=timeout,
            cwd=cwd,
            env=env,
            session_file=session_file,
            kernel_name=kernel_name,
            notebook=notebook,
        )
        return self._events(call, raise_on_error)

    async def read_notebook(
        self,
        path: str,
        *,
        start: int | None = None,
        limit: int | None = None,
        cell_ids: Sequence[str] | None = None,
        include: Sequence[str] | None = None,
        include_binary: bool = False,
        since: str | None = None,
    ) -> NotebookAnswer:
        """See :meth:`AgentClient.read_notebook`."""
        answer: NotebookAnswer = await self._json(
            _read_call(
                path,
                include_binary=include_binary,
                start=start,
                limit=limit,
                cell_ids=cell_ids,
                include=include,
                since=since,
            )
        )
        return answer

    async def read_notebook_text(
        self,
        path: str,
        *,
        start: int | None = None,
        limit: int | None = None,
        cell_ids: Sequence[str] | None = None,
        include: Sequence[str] | None = None,
    ) -> str:
        """See :meth:`AgentClient.read_notebook_text`."""
        return (
            await self._send(
                _read_call(path, text=True, start=start, limit=limit, cell_ids=cell_ids, include=include)
            )
        ).text

    async def read_output(self, path: str, cell: str, n: int) -> dict[str, Any]:
        """See :meth:`AgentClient.read_output`."""
        answer: dict[str, Any] = await self._json(_output_call(path, cell, n, None))
        return answer

    async def read_output_data(self, path: str, cell: str, n: int, mime: str) -> bytes:
        """See :meth:`AgentClient.read_output_data`."""
        return (await self._send(_output_call(path, cell, n, mime))).content

    async def edit_notebook(
        self,
        path: str,
        ops: Op | Sequence[Op],
        *,
        expected_hash: str | None = None,
        upgrade: bool = False,
        repair: bool = False,
    ) -> EditAnswer:
        """See :meth:`AgentClient.edit_notebook`."""
        answer: EditAnswer = await self._json(_edit_call(path, ops, expected_hash, upgrade, repair))
        return answer

    async def run_notebook(
        self,
        path: str,
        *,
        cell_ids: Sequence[str] | None = None,
        cell_indices: Sequence[int] | None = None,
        all_cells: bool | None = None,
        timeout: float | None = None,
        stop_on_error: bool | None = None,
        expected_hash: str | None = None,
        include_images: bool | None = None,
        ops: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """See :meth:`AgentClient.run_notebook`."""
        call = _run_call(
            path,
            cell_ids=cell_ids,
            cell_indices=cell_indices,
            all_cells=all_cells,
            timeout=timeout,
            stop_on_error=stop_on_error,
            expected_hash=expected_hash,
            include_images=include_images,
            ops=ops,
        )
        return dict(await self._json(call))

    def stream_run_notebook(
        self,
        path: str,
        *,
        cell_ids: Sequence[str] | None = None,
        cell_indices: Sequence[int] | None = None,
        all_cells: bool | None = None,
        timeout: float | None = None,
        stop_on_error: bool | None = None,
        expected_hash: str | None = None,
        include_images: bool | None = None,
        ops: Sequence[Mapping[str, Any]] | None = None,
        raise_on_error: bool = True,
    ) -> AsyncGenerator[EvalEvent, None]:
        """See :meth:`AgentClient.stream_run_notebook`."""
        call = _run_call(
            path,
            cell_ids=cell_ids,
            cell_indices=cell_indices,
            all_cells=all_cells,
            timeout=timeout,
            stop_on_error=stop_on_error,
            expected_hash=expected_hash,
            include_images=include_images,
            ops=ops,
        )
        return self._events(call, raise_on_error)

    async def sessions(self) -> dict[str, Any]:
        """See :meth:`AgentClient.sessions`."""
        return dict(await self._json(_Call("GET", "api/agent/sessions")))

    async def interrupt(self, name: str) -> dict[str, Any]:
        """See :meth:`AgentClient.interrupt`."""
        return dict(await self._json(_Call("POST", f"api/agent/sessions/{_quote_path(name)}/interrupt", {})))

    async def delete_session(self, name: str) -> None:
        """See :meth:`AgentClient.delete_session`."""
        await self._send(_Call("DELETE", f"api/agent/sessions/{_quote_path(name)}"))

    async def tokens(self) -> list[dict[str, Any]]:
        """See :meth:`AgentClient.tokens`."""
        return list((await self._json(_Call("GET", "api/agent/tokens")))["tokens"])

    async def create_token(
        self,
        name: str,
        scopes: Sequence[str],
        *,
        paths: Sequence[str] | None = None,
        expires_in: float | None = None,
    ) -> dict[str, Any]:
        """See :meth:`AgentClient.create_token`."""
        return dict(await self._json(_token_call(name, scopes, paths, expires_in)))

    async def revoke_token(self, name: str) -> dict[str, Any]:
        """See :meth:`AgentClient.revoke_token`."""
        return dict(await self._json(_Call("DELETE", f"api/agent/tokens/{_quote_path(name)}")))

    async def artifact(self, artifact_id: str) -> str:
        """See :meth:`AgentClient.artifact`."""
        return "".join([piece async for piece in self.stream_artifact(artifact_id)])

    async def stream_artifact(self, artifact_id: str) -> AsyncGenerator[str, None]:
        """See :meth:`AgentClient.stream_artifact`."""
        path = f"api/agent/artifacts/{_quote_path(artifact_id)}"
        try:
            async with self._http.stream("GET", path) as response:
                if response.status_code >= 400:
                    raise _error_from(response, await response.aread())
                async for piece in response.aiter_text():
                    yield piece
        except httpx.TransportError as e:
            raise _transport_error(e, self.url) from e

    # -- the change ledger -----------------------------------------------------------------------------

    async def notebook_changes(
        self, path: str, *, limit: int | None = None, before: str | None = None
    ) -> dict[str, Any]:
        """See :meth:`AgentClient.notebook_changes`."""
        answer: dict[str, Any] = await self._json(_changes_call(path, limit, before))
        return answer

    async def notebook_change(self, path: str, change_id: str) -> dict[str, Any]:
        """See :meth:`AgentClient.notebook_change`."""
        answer: dict[str, Any] = await self._json(_change_call(path, change_id))
        return answer

    async def undo_change(
        self, path: str, change_id: str, *, expected_hash: str | None = None
    ) -> dict[str, Any]:
        """See :meth:`AgentClient.undo_change`."""
        answer: dict[str, Any] = await self._json(_change_call(path, change_id, True, expected_hash))
        return answer

    async def notebook_kernel(self, path: str, action: str | None = None) -> dict[str, Any]:
        """See :meth:`AgentClient.notebook_kernel`."""
        answer: dict[str, Any] = await self._json(_kernel_call(path, action))
        return answer

    async def changes(self, *, since: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """See :meth:`AgentClient.changes`."""
        answer: dict[str, Any] = await self._json(_all_changes_call(since, limit))
        return answer
