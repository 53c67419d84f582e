"""``/api/agent/eval``: run Python cells; one JSON answer or an NDJSON stream of events."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.iostream import StreamClosedError

from ..errors import AgentToolsError
from ..eval.backlog import StreamBacklog
from ..eval.executor import Emit
from ..eval.executor import noop as _ignore
from ..eval.pace import STREAM_PACE, StreamPace
from ..eval.service import EvalService
from ..text import json_string_body
from .base import AgentAPIHandler

NDJSON = "application/x-ndjson"

# Characters of output text sent per write: JSON encoding and HTTP chunk framing copy each write a few
# times, so a 16 MB chunk goes out as several lines rather than one huge one.
WRITE_CHARS = 1 << 20


def ndjson_line(event: dict[str, Any]) -> bytes:
    """One event as a line of NDJSON (UTF-8 text, not \\u escapes).

    A chunk's text, the bulk of a flood, is escaped by ``json_string_body`` and spliced in after the other
    fields: the same bytes as ``json.dumps``, without its slower escaping of the str and its re-encoding.
    """
    text = event.get("text")
    if (
        event.get("type") == "chunk"
        and isinstance(text, str)
        and len(event) > 1
        and next(reversed(event)) == "text"
    ):
        body = json_string_body(text)
        if body is not None:
            head = json.dumps({k: v for k, v in event.items() if k != "text"}, ensure_ascii=False)
            return b"".join((head[:-1].encode(), b', "text": "', body, b'"}\n'))
    return (json.dumps(event, ensure_ascii=False) + "\n").encode()


class EvalHandler(AgentAPIHandler):
    """POST runs cells (``execute`` on ``kernels``). A client that disconnects cancels the run."""

    route_name = "eval"

    auth_resource = "kernels"
    _cancel: asyncio.Event | None = None
    _backlog: StreamBacklog | None = None

    @property
    def service(self) -> EvalService:
        return self.extensionapp.eval_service  # type: ignore[attr-defined]

    def on_connection_close(self) -> None:
        self._client_gone()
        super().on_connection_close()

    def _client_gone(self) -> None:
        """Cancel the run (the kernel is interrupted) and queue nothing more for this client."""
        if self._cancel is not None:
            self._cancel.set()
        if self._backlog is not None:
            self._backlog.close()

    def _call(self, body: Any, emit: Emit, cancel: asyncio.Event) -> Awaitable[dict[str, Any]]:
        """The service call this route streams (an eval; a notebook run in the subclass)."""
        return self.service.run(body, emit=emit, cancel=cancel)

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        body = await self.json_body()
        if isinstance(body, dict) and "notebook" in body:  # runs in a notebook's kernel: reads it too
            allowed = self.authorizer.is_authorized(self, self.current_user, "read", "contents")
            if not await ensure_async(allowed):
                raise web.HTTPError(
                    403,
                    "User is not authorized to read on resource: contents (eval with 'notebook' needs it).",
                )
        await self._respond(body)

    async def _respond(self, body: Any) -> None:
        """One JSON answer, or the NDJSON stream of events when the client accepts it."""
        self._cancel = cancel = asyncio.Event()
        if NDJSON in self.request.headers.get("Accept", ""):
            await self._stream(body)
        else:
            self.write_json(await self._call(body, _ignore, cancel))

    async def _stream(self, body: Any) -> None:
        app: Any = self.extensionapp
        backlog = self._backlog = StreamBacklog(int(app.stream_backlog_bytes))
        pace = StreamPace(backlog.lagging, float(app.stream_lag_grace))
        ready = asyncio.Event()

        def emit(event: dict[str, Any]) -> None:
            backlog.put(event)
            ready.set()

        token = STREAM_PACE.set(pace)  # the run's task (and what it starts) sees this client's pace
        try:
            run = asyncio.ensure_future(self._call(body, emit, self._cancel or asyncio.Event()))
        finally:
            STREAM_PACE.reset(token)
        interval = float(app.stream_heartbeat_interval)
        started_at = last_sent = time.monotonic()
        streaming = False
        try:
            while not (run.done() and not backlog):
                if not backlog:
                    waiter = asyncio.ensure_future(ready.wait())
                    await asyncio.wait(
                        {waiter, run},
                        timeout=max(0.05, interval - (time.monotonic() - last_sent)),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    waiter.cancel()
                ready.clear()
                batch = backlog.take(WRITE_CHARS)
                if not batch:
                    if run.done() or time.monotonic() - last_sent < interval:
                        continue
                    batch = [{"type": "heartbeat", "elapsed_ms": int((time.monotonic() - started_at) * 1000)}]
                if not streaming:
                    streaming = True
                    self.set_status(200)
                    self.set_header("Content-Type", NDJSON)
                    self.set_header("Cache-Control", "no-cache")
                    self.set_header("X-Accel-Buffering", "no")
                self.write(b"".join(map(ndjson_line, batch)))
                del batch  # a big chunk's text now lives in Tornado's buffer only, until it is sent
                await self.flush()
                backlog.sent()
                pace.progressed()
                last_sent = time.monotonic()
            run.result()  # raise the service's error, if any
        except StreamClosedError:
            self._client_gone()
            await asyncio.gather(run, return_exceptions=True)
            return
        except Exception as e:
            if not streaming:
                raise
            if isinstance(e, (AgentToolsError, web.HTTPError)):
                status = getattr(e, "status", None) or getattr(e, "status_code", 500)
                message = getattr(e, "message", None) or getattr(e, "log_message", None) or str(e)
            else:
                self.log.exception("eval stream failed")
                status, message = 500, "Unhandled error"
            self.write(ndjson_line({"type": "error", "status": status, "message": message}))
        finally:
            if not run.done():
                self._client_gone()
                await asyncio.gather(run, return_exceptions=True)
        if not self._finished:
            self.finish()
