"""The one implementation of the client's calls, on ``httpx.AsyncClient``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Literal, cast

import httpx

from . import calls
from .calls import Call
from .models import AgentAPIError, CellsArg, EditAnswer, EvalEvent, EvalResult, NotebookAnswer, Op


class AsyncAgentClient:
    """The client. ``url`` is the server's base URL (with its ``base_url``); ``token`` its token; ``client``
    names the calling program (sent as ``X-Agent-Client``; ``cli`` is recorded as such in the change
    ledger). Every method is awaited; streams are async iterators. :class:`AgentClient` is the same client
    for code that does not run an event loop.

    ``transport`` lets tests plug in an ``httpx`` transport (e.g. ``httpx.MockTransport``).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = calls.DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        client: str | None = None,
    ):
        self.url, self.token = calls.base_url(url, token)
        headers = calls.headers(self.token, client)
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

    async def _send(self, call: Call) -> httpx.Response:
        try:
            response = await self._http.request(
                call.method,
                call.path,
                json=call.body,
                params=call.params or None,
                timeout=self._timeout(call.read_timeout),
            )
        except httpx.TransportError as e:
            raise calls.transport_error(e, self.url) from e
        if response.status_code >= 400:
            raise calls.error_from(response, response.content)
        return response

    async def _json(self, call: Call) -> Any:
        response = await self._send(call)
        return response.json() if response.content else None

    async def _events(self, call: Call, raise_on_error: bool) -> AsyncGenerator[EvalEvent, None]:
        try:
            async with self._http.stream(
                call.method,
                call.path,
                json=call.body,
                params=call.params or None,
                headers={"Accept": calls.NDJSON},
                timeout=self._timeout(calls.STREAM_READ_TIMEOUT),
            ) as response:
                if response.status_code >= 400:
                    raise calls.error_from(response, await response.aread())
                async for line in response.aiter_lines():
                    event = calls.decode_event(line)
                    if event is None:
                        continue
                    if raise_on_error and event["type"] == "error":
                        raise calls.stream_failure(event, self.url)
                    yield event
        except httpx.TransportError as e:
            raise calls.transport_error(e, self.url) from e

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
        """Run cells (a string is one cell) and return the JSON answer of ``POST /api/agent/eval``."""
        call = calls.eval_call(
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
        """Run cells and yield the NDJSON events as they come; the last is ``result`` (or ``error``).

        An ``error`` event raises :class:`AgentAPIError` unless ``raise_on_error`` is false. Closing the
        iterator early (``await it.aclose()``; with :class:`AgentClient`, ``.close()`` or leaving a
        ``with contextlib.closing(...)``) closes the connection, which cancels the run and interrupts the
        kernel.
        """
        call = calls.eval_call(
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
        """``GET /api/agent/notebooks/{path}``: the notebook's cells (all, a page from ``start`` of at most
        ``limit``, or the ``cell_ids``: ids or ``@index``), ``cell_count`` and its ``hash``; ``include``:
        ``tags``, ``metadata``, ``attachments``; ``since`` (an earlier answer's hash): ``changes_since``."""
        answer: NotebookAnswer = await self._json(
            calls.read_call(
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
        """The same read as compact plain text for a model's context (``format=text``)."""
        return (
            await self._send(
                calls.read_call(path, text=True, start=start, limit=limit, cell_ids=cell_ids, include=include)
            )
        ).text

    async def read_output(self, path: str, cell: str, n: int) -> dict[str, Any]:
        """``GET .../cells/{cell}/outputs/{n}``: output ``n`` of cell ``cell`` (id or ``@index``) in full."""
        answer: dict[str, Any] = await self._json(calls.output_call(path, cell, n, None))
        return answer

    async def read_output_data(self, path: str, cell: str, n: int, mime: str) -> bytes:
        """One MIME type of that output as bytes (``?mime=``): an image's decoded bytes, a text's UTF-8."""
        return (await self._send(calls.output_call(path, cell, n, mime))).content

    async def edit_notebook(
        self,
        path: str,
        ops: Op | Sequence[Op],
        *,
        expected_hash: str | None = None,
        upgrade: bool = False,
        repair: bool = False,
        approval_wait: float | None = None,
    ) -> EditAnswer:
        """``POST /api/agent/notebooks/{path}``: one operation (a mapping) or a batch (a sequence).

        ``upgrade``: write an nbformat 3 file converted to nbformat 4.5; ``repair``: apply nbformat's
        repairs to a notebook that is invalid as found (the answer's ``repairs`` lists them).
        ``approval_wait``: seconds to wait for the person when the edit needs their approval; past it the
        answer is the pending request (``approval_id``, ``state: awaiting_approval``: see
        :meth:`wait_approval`)."""
        call = calls.edit_call(path, ops, expected_hash, upgrade, repair, approval_wait)
        answer: EditAnswer = await self._json(call)
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
        """``POST /api/agent/notebooks/{path}/run``: run the notebook's cells (all when none are named).

        Images come as ``{type, mime, bytes, url}``; ``include_images`` adds their base64 (``data``)."""
        call = calls.run_call(
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
        """Like :meth:`run_notebook`, as an NDJSON event stream (the events of :meth:`stream_eval`)."""
        call = calls.run_call(
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

    # -- detached runs ---------------------------------------------------------------------------------

    async def detach_eval(self, cells: CellsArg, **options: Any) -> dict[str, Any]:
        """``POST /api/agent/eval`` with ``"detach": true`` (the options of :meth:`eval`): the run goes on
        without this client; the answer is its summary (``run_id``, ``state``, ``location``)."""
        call = calls.eval_call(cells, **calls.options(calls.EVAL_OPTIONS, options))
        return dict(await self._json(calls.detached(call)))

    async def detach_run_notebook(self, path: str, **options: Any) -> dict[str, Any]:
        """:meth:`run_notebook` with ``"detach": true``: the run's summary at once."""
        call = calls.run_call(path, **calls.options(calls.RUN_OPTIONS, options))
        return dict(await self._json(calls.detached(call)))

    async def runs(self) -> list[dict[str, Any]]:
        """``GET /api/agent/runs``: the detached runs this token may see, newest first."""
        return list((await self._json(Call("GET", "api/agent/runs")))["runs"])

    async def run(self, run_id: str, *, wait: float | None = None) -> dict[str, Any]:
        """``GET /api/agent/runs/{id}``: state, per-cell progress, the answer once it ended; ``wait``
        seconds (at most 600) for it to end first."""
        return dict(await self._json(calls.run_state_call(run_id, wait)))

    async def cancel_run(self, run_id: str) -> dict[str, Any]:
        """``POST /api/agent/runs/{id}/cancel``: interrupt it (it ends ``cancelled``)."""
        return dict(await self._json(Call("POST", calls.run_id_path(run_id, "/cancel"), {})))

    async def run_events(
        self, run_id: str, *, after: int = 0, raise_on_error: bool = True
    ) -> AsyncGenerator[EvalEvent, None]:
        """The run's events after sequence number ``after`` (each with its ``seq``), then the live ones,
        until its last (``result`` or ``error``). A dropped connection is reopened from the last ``seq``
        seen: every event comes once, in order. Leaving early does not stop the run."""
        failures = 0
        while True:
            try:
                async for event in self._events(calls.events_call(run_id, after), raise_on_error):
                    failures = 0
                    seq = cast(Mapping[str, object], event).get("seq")  # (the route's, on every event)
                    if isinstance(seq, int):
                        after = seq
                    yield event
                    if calls.ends_run(event):
                        return
            except AgentAPIError as e:
                if e.status is not None or failures >= calls.RUN_EVENTS_RETRIES:
                    raise
                failures += 1
                await asyncio.sleep(min(5.0, 0.5 * failures))

    async def notebook_kernel(
        self, path: str, action: str | None = None, *, approval_wait: float | None = None
    ) -> dict[str, Any]:
        """``GET .../kernel`` (state, kernelspec, people connected), or ``POST`` with ``action``
        (``interrupt``, ``restart``, ``shutdown``; ``approval_wait`` as for :meth:`edit_notebook`)."""
        answer: dict[str, Any] = await self._json(calls.kernel_call(path, action, approval_wait))
        return answer

    async def sessions(self) -> dict[str, Any]:
        """``GET /api/agent/sessions``: ``{"sessions": [...], "totals": {...}, "pool": {...}}``."""
        return dict(await self._json(Call("GET", "api/agent/sessions")))

    async def interrupt(self, name: str, owner: str | None = None) -> dict[str, Any]:
        """``POST /api/agent/sessions/{name}/interrupt``: cancel what the session runs (your own session
        of that name; ``owner``: another identity's, for the server's token or a person)."""
        path = f"api/agent/sessions/{calls.quote_path(name)}/interrupt"
        return dict(await self._json(Call("POST", path, {}, _owner(owner))))

    async def delete_session(
        self, name: str, owner: str | None = None, approval_wait: float | None = None
    ) -> dict[str, Any] | None:
        """``DELETE /api/agent/sessions/{name}``: shut the session's kernel down (whose: as
        :meth:`interrupt`). None once done; the pending request when the person must approve it and has not
        within ``approval_wait`` seconds (the server's default wait when None; see :meth:`wait_approval`)."""
        query = _owner(owner)
        if approval_wait is not None:
            query["approval_wait"] = f"{approval_wait:g}"
        response = await self._send(
            Call("DELETE", f"api/agent/sessions/{calls.quote_path(name)}", None, query)
        )
        return dict(response.json()) if response.status_code == 202 and response.content else None

    async def tokens(self) -> list[dict[str, Any]]:
        """``GET /api/agent/tokens``: the agent tokens (never the tokens themselves), oldest first."""
        return list((await self._json(Call("GET", "api/agent/tokens")))["tokens"])

    async def create_token(
        self,
        name: str,
        scopes: Sequence[str],
        *,
        paths: Sequence[str] | None = None,
        expires_in: float | None = None,
        ask: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """``POST /api/agent/tokens``: a new agent token (``ask``: the actions it must ask the person for
        first); its ``token`` is in this answer only."""
        return dict(await self._json(calls.token_call(name, scopes, paths, expires_in, ask)))

    async def revoke_token(self, name: str) -> dict[str, Any]:
        """``DELETE /api/agent/tokens/{name}``: revoke it (its record stays, as revoked)."""
        return dict(await self._json(Call("DELETE", f"api/agent/tokens/{calls.quote_path(name)}")))

    async def approvals(self) -> dict[str, Any]:
        """``GET /api/agent/approvals``: the requests waiting for the person, and the recent decisions."""
        return dict(await self._json(calls.approvals_call()))

    async def approval(self, approval_id: int) -> dict[str, Any]:
        """``GET /api/agent/approvals/{id}``: one request, with what it would do."""
        return dict(await self._json(calls.approval_call(approval_id)))

    async def wait_approval(self, approval_id: int, timeout: float | None = None) -> dict[str, Any]:
        """The approval request once it says what came of it (denied, expired, withdrawn, or approved and
        applied: its ``outcome``), or as it is after ``timeout`` seconds (None: until then; the server
        expires a request nobody decides)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            approval = await self.approval(approval_id)
            if calls.settled(approval) or (deadline is not None and loop.time() >= deadline):
                return approval
            pause = calls.APPROVAL_POLL
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - loop.time()))
            await asyncio.sleep(pause)

    async def decide_approval(
        self,
        approval_id: int,
        decision: str,
        *,
        for_seconds: float | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """``POST /api/agent/approvals/{id}``: ``approve`` or ``deny`` (a person's credentials only)."""
        return dict(await self._json(calls.decide_call(approval_id, decision, for_seconds, reason)))

    async def artifact(self, artifact_id: str) -> str:
        """``GET /api/agent/artifacts/{id}``: the full output of a truncated cell."""
        return "".join([piece async for piece in self.stream_artifact(artifact_id)])

    async def stream_artifact(self, artifact_id: str) -> AsyncGenerator[str, None]:
        """The artifact's text in pieces, without holding all of it in memory."""
        path = f"api/agent/artifacts/{calls.quote_path(artifact_id)}"
        try:
            async with self._http.stream("GET", path) as response:
                if response.status_code >= 400:
                    raise calls.error_from(response, await response.aread())
                async for piece in response.aiter_text():
                    yield piece
        except httpx.TransportError as e:
            raise calls.transport_error(e, self.url) from e

    # -- the change ledger -----------------------------------------------------------------------------

    async def notebook_changes(
        self, path: str, *, limit: int | None = None, before: str | None = None
    ) -> dict[str, Any]:
        """``GET .../changes``: the notebook's recorded changes, newest first (``before``: older than that
        change id; the answer's ``next_before`` pages on)."""
        answer: dict[str, Any] = await self._json(calls.changes_call(path, limit, before))
        return answer

    async def notebook_change(self, path: str, change_id: str) -> dict[str, Any]:
        """``GET .../changes/{id}``: one change with each cell's before and after and source diffs."""
        answer: dict[str, Any] = await self._json(calls.change_call(path, change_id))
        return answer

    async def undo_change(
        self,
        path: str,
        change_id: str,
        *,
        expected_hash: str | None = None,
        approval_wait: float | None = None,
    ) -> dict[str, Any]:
        """``POST .../changes/{id}/undo``: undo one change (409 naming the cells changed since;
        ``approval_wait`` as for :meth:`edit_notebook`)."""
        call = calls.change_call(path, change_id, True, expected_hash, approval_wait)
        answer: dict[str, Any] = await self._json(call)
        return answer

    async def changes(self, *, since: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """``GET /api/agent/changes``: every notebook's changes, newest first (``since``: an ISO time)."""
        answer: dict[str, Any] = await self._json(calls.all_changes_call(since, limit))
        return answer

    # -- creating notebooks, finding files ---------------------------------------------------------------

    async def create_notebook(
        self,
        path: str,
        cells: Sequence[Mapping[str, str]] | None = None,
        *,
        kernel_name: str | None = None,
        parents: bool = False,
    ) -> dict[str, Any]:
        """``POST /api/agent/notebooks/{path}`` with ``{"action": "create"}``: a new notebook (409 if the
        path exists; ``parents``: make missing folders). ``cells``: ``[{"cell_type", "source"}]``.
        Returns the notebook as a read answers it, with ``message`` and ``change_id``."""
        answer: dict[str, Any] = await self._json(calls.create_call(path, cells, kernel_name, parents))
        return answer

    async def replace_in_cell(
        self,
        path: str,
        cell: int | str,
        old: str,
        new: str,
        *,
        all: bool = False,
        expected_hash: str | None = None,
    ) -> EditAnswer:
        """The ``replace`` edit: ``old`` -> ``new`` in one cell (an index or an id); ``old`` must match
        once, or every match is replaced with ``all`` (else 400 listing the matches' lines)."""
        return await self.edit_notebook(
            path, calls.replace_op(cell, old, new, all), expected_hash=expected_hash
        )

    async def list_files(
        self,
        path: str = "",
        *,
        glob: str | None = None,
        max_depth: int | None = None,
        recursive: bool = False,
        start: str | None = None,
        limit: int | None = None,
        ignored: bool = False,
    ) -> dict[str, Any]:
        """``GET /api/agent/files``: a page of a folder's entries (``next_start``: the next page's start;
        ``ignored``: also what the ignore files exclude)."""
        call = calls.files_call(path, glob, max_depth, recursive, start, limit, ignored)
        answer: dict[str, Any] = await self._json(call)
        return answer


def _owner(owner: str | None) -> dict[str, str]:
    """The query naming whose session (names are per identity); none for the caller's own."""
    return {"owner": owner} if owner is not None else {}
