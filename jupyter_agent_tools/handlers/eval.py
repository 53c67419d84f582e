"""``/api/agent/eval``: run Python cells; one JSON answer or an NDJSON stream of events."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Mapping
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from ..approvals import Approval
from ..approvals.actions import describe_eval
from ..approvals.gate import once_approved, without_gate_fields
from ..compat import response_finished
from ..errors import AgentToolsError
from ..execution.backlog import StreamBacklog
from ..execution.dispatch import extra_permissions, run_eval
from ..execution.eval_service import EvalService
from ..execution.executor import noop as _ignore
from ..execution.pace import StreamPace
from ..execution.request import parse_eval_request
from ..runs import Run, RunRegistry
from ..stream_events import Emit, StreamEvent
from ..streaming import TaskSource, pump
from ..text import ndjson_line
from .base import AgentAPIHandler

NDJSON = "application/x-ndjson"

# Characters of output text sent per write: JSON encoding and HTTP chunk framing copy each write a few
# times, so a 16 MB chunk goes out as several lines rather than one huge one.
WRITE_CHARS = 1 << 20


class EvalHandler(AgentAPIHandler):
    """POST runs cells (``execute`` on ``kernels``). A client that disconnects cancels the run."""

    route_name = "eval"

    auth_resource = "kernels"
    _cancel: asyncio.Event | None = None
    _backlog: StreamBacklog | None = None

    @property
    def service(self) -> EvalService:
        return self.app.eval_service

    def on_connection_close(self) -> None:
        self._client_gone()
        super().on_connection_close()

    def _client_gone(self) -> None:
        """Cancel the run (the kernel is interrupted) and queue nothing more for this client."""
        if self._cancel is not None:
            self._cancel.set()
        if self._backlog is not None:
            self._backlog.close()

    def _call(
        self, body: Any, emit: Emit, cancel: asyncio.Event, pace: StreamPace | None = None
    ) -> Awaitable[Mapping[str, Any]]:
        """The service call this route streams: an eval (in a notebook's kernel, with ``notebook``: its
        runner's); a notebook run in the subclass."""
        return run_eval(self.service, self.app.notebook_runner, body, emit=emit, cancel=cancel, pace=pace)

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        body = await self.json_body()
        for action, resource in extra_permissions(body):  # eval with 'notebook' reads it too
            if not await ensure_async(
                self.authorizer.is_authorized(self, self.current_user, action, resource)
            ):
                raise web.HTTPError(
                    403,
                    f"User is not authorized to {action} on resource: {resource} (eval with 'notebook' needs "
                    "it).",
                )
        await self._respond(body)

    run_kind = "eval"

    @property
    def runs(self) -> RunRegistry:
        return self.app.run_registry

    async def _check(self, body: Any) -> str | None:
        """Validate a body before it is detached (400 now, not a failed run later); the run's target."""
        request = parse_eval_request(body, self.service.max_cells)
        return request.session if request.mode == "session" else None

    # -- the approval gate (``execute``): what the person is asked, and the check once approved --

    def _gate_path(self, body: Any) -> str | None:
        """The notebook the call runs in (eval with ``notebook``), for the policy's path rules."""
        notebook = body.get("notebook") if isinstance(body, dict) else None
        return notebook if isinstance(notebook, str) else None

    def _gate_also(self, body: Any) -> tuple[str, ...]:
        """The classes of action the call is besides ``execute`` (a notebook run's ``ops``: ``edit``)."""
        return ()

    async def _describe(self, body: Any) -> tuple[str, dict[str, Any]]:
        """What the person is shown: each cell's code."""
        return await describe_eval(body)

    async def _bind(self, approval: Approval, body: Any) -> Any:
        """The body to run once ``approval`` is given: what the person saw (eval: the code is the body's)."""
        return body

    async def _after_approval(
        self, approval: Approval, body: Any, emit: Emit, cancel: asyncio.Event, pace: StreamPace | None = None
    ) -> Mapping[str, Any]:
        """The call, once the person approved it (an ``approval`` event says it is waiting meanwhile)."""

        async def start() -> Mapping[str, Any]:
            return await self._call(await self._bind(approval, body), emit, cancel, pace)

        return await once_approved(self.approval_policy, approval, emit, cancel, start)

    async def _respond(self, body: Any) -> None:
        """One JSON answer, the NDJSON stream of events when the client accepts it, or (``detach``) 202
        with the run that goes on without the client. An action the person must approve first waits for
        the decision (``approval_wait``); still undecided, it answers 202 and goes on as a detached run in
        state ``awaiting_approval``, which starts once approved."""
        gate_body = body
        body = without_gate_fields(body)
        streamed = NDJSON in self.request.headers.get("Accept", "")
        detach = isinstance(body, dict) and body.get("detach") is True

        async def describe() -> tuple[str, dict[str, Any]]:
            await self._check(body)  # a bad body is a 400 now, before anyone is asked
            return await self._describe(body)

        wait_body = {"approval_wait": 0} if streamed or detach else gate_body
        approval = await self.approval(
            "execute", self._gate_path(body), describe, wait_body, also=self._gate_also(body)
        )
        if approval is not None and approval.state == "pending":
            if streamed:
                await self._stream(body, approval)
                return
            call = functools.partial(self._after_approval, approval, body)
            run = self.runs.start(self.run_kind, await self._check(body), call, approval_id=approval.id)
            await self._answer_detached(run, approval_id=approval.id)
            return
        if approval is not None:
            body = await self._bind(approval, body)
        if detach:
            run = self.runs.start(self.run_kind, await self._check(body), functools.partial(self._call, body))
            await self._answer_detached(run)
            return
        self._cancel = cancel = asyncio.Event()
        if streamed:
            await self._stream(body)
        else:
            await self.write_json(await self._call(body, _ignore, cancel))

    async def _answer_detached(self, run: Run, **extra: Any) -> None:
        location = url_path_join(self.base_url, "api/agent/runs", run.id)
        self.set_header("Location", location)
        await self.write_json({**run.summary(), "location": location, **extra}, status=202)

    async def _stream(self, body: Any, approval: Approval | None = None) -> None:
        app = self.app
        backlog = self._backlog = StreamBacklog(int(app.stream_backlog_bytes))
        pace = StreamPace(backlog.lagging, float(app.stream_lag_grace))
        ready = asyncio.Event()

        def emit(event: StreamEvent) -> None:
            backlog.put(event)
            ready.set()

        self._cancel = cancel = self._cancel or asyncio.Event()
        call: Awaitable[Mapping[str, Any]]
        if approval is not None:  # the stream says it waits for the person, then runs once approved
            call = self._after_approval(approval, body, emit, cancel, pace)
        else:
            call = self._call(body, emit, cancel, pace)
        run = asyncio.ensure_future(call)
        started_at = time.monotonic()
        writer = NdjsonWriter(self)
        try:
            source = TaskSource(run, backlog.__bool__, ready)
            async with contextlib.aclosing(pump(source, float(app.stream_heartbeat_interval))) as beats:
                async for due in beats:
                    if due:
                        batch = backlog.take(WRITE_CHARS)
                    else:
                        elapsed = int((time.monotonic() - started_at) * 1000)
                        batch = [{"type": "heartbeat", "elapsed_ms": elapsed}]
                    await writer.send(b"".join(map(ndjson_line, batch)))
                    del batch  # a big chunk's text now lives in Tornado's buffer only, until it is sent
                    backlog.sent()
                    pace.progressed()
            run.result()  # raise the service's error, if any
        except StreamClosedError:
            self._client_gone()
            await asyncio.gather(run, return_exceptions=True)
            return
        except Exception as e:
            # broad: after the stream started any failure becomes its last event; before, it is re-raised
            if not writer.started:
                raise
            self.write(ndjson_line(error_event(e, self.log)))
        finally:
            if not run.done():
                self._client_gone()
                await asyncio.gather(run, return_exceptions=True)
        if not response_finished(self):
            self.finish()


def error_event(e: Exception, log: Any) -> dict[str, Any]:
    """The last event of a stream whose call failed after the stream started (status 200 already)."""
    if isinstance(e, (AgentToolsError, web.HTTPError)):
        status = getattr(e, "status", None) or getattr(e, "status_code", 500)
        message = getattr(e, "message", None) or getattr(e, "log_message", None) or str(e)
    else:
        log.exception("stream failed")
        status, message = 500, "Unhandled error"
    event = {"type": "error", "status": status, "message": message}
    if isinstance(e, AgentToolsError):
        event.update({k: v for k, v in e.extra.items() if k in ("reason", "approval_id", "cells")})
    return event


class NdjsonWriter:
    """Writes an NDJSON answer: the headers before the first bytes, then each write flushed."""

    def __init__(self, handler: web.RequestHandler):
        self.handler = handler
        self.started = False

    async def send(self, data: bytes) -> None:
        handler = self.handler
        if not self.started:
            self.started = True
            handler.set_status(200)
            handler.set_header("Content-Type", NDJSON)
            handler.set_header("Cache-Control", "no-cache")
            handler.set_header("X-Accel-Buffering", "no")
        handler.write(data)
        await handler.flush()
