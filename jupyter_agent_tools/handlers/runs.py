"""``/api/agent/runs``: detached runs (``"detach": true`` on eval or a notebook run): list, state,
events as NDJSON (replayed from any sequence number, then live), cancel."""

from __future__ import annotations

import asyncio
import contextlib
import time

from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.iostream import StreamClosedError

from ..auth.identity import AgentUser
from ..compat import response_finished
from ..errors import AgentToolsError, BadRequest
from ..runs import Run, RunRegistry, Viewer
from ..runs.log import RunLog
from ..streaming import pump
from ..text import ndjson_line
from .base import AgentAPIHandler, acting_username
from .eval import WRITE_CHARS, NdjsonWriter

DEFAULT_EVENTS_TIMEOUT = 300.0  # seconds an events stream stays open at most (the client reconnects)
MAX_EVENTS_TIMEOUT = 3600.0
MAX_STATUS_WAIT = 600.0


class _RunRoute(AgentAPIHandler):
    auth_resource = "kernels"

    @property
    def runs(self) -> RunRegistry:
        return self.app.run_registry

    @property
    def viewer(self) -> Viewer:
        """The caller: an agent token sees its own runs, everyone else (the server's token, a login) all."""
        return Viewer(acting_username(self), admin=not isinstance(self.current_user, AgentUser))

    def _seconds(self, name: str, default: float, maximum: float) -> float:
        raw = self.get_query_argument(name, None)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise BadRequest(f"'{name}' must be a number of seconds, got {raw[:40]!r}") from None
        if not 0 <= value <= maximum:  # also NaN
            raise BadRequest(f"'{name}' must be between 0 and {maximum:g} seconds, got {raw[:40]!r}")
        return value


class RunListHandler(_RunRoute):
    """GET: the caller's runs (an admin's: everyone's), newest first."""

    route_name = "runs"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        await self.write_json({"runs": [run.summary() for run in self.runs.list(self.viewer)]})


class RunHandler(_RunRoute):
    """GET: one run's state, per-cell progress and, once it ended, its answer; ``?wait=S`` waits up to S
    seconds for it to end first."""

    route_name = "run"

    @web.authenticated
    @authorized("read")
    async def get(self, run_id: str) -> None:
        run = self.runs.get(run_id, self.viewer)
        wait = self._seconds("wait", 0.0, MAX_STATUS_WAIT)
        if wait and not run.finished:
            await self.runs.wait(run, wait)
        await self.write_json(run.detail())


class RunCancelHandler(_RunRoute):
    """POST: stop the run (its kernel is interrupted); the answer is its state (``cancel_requested``)."""

    route_name = "run_cancel"

    @web.authenticated
    @authorized("execute")
    async def post(self, run_id: str) -> None:
        run = self.runs.cancel(run_id, self.viewer)
        await self.write_json({**run.summary(), "cancel_requested": run.cancel_requested})


class _Cursor:
    """A reader's place in a run's event log: a sequence number, nothing else (the streamer's source)."""

    def __init__(self, log: RunLog, after: int):
        self.log = log
        self.after = after

    def ready(self) -> bool:
        return self.log.has_after(self.after)

    def finished(self) -> bool:
        return self.log.finished

    async def wait(self, timeout: float) -> None:
        changed = self.log.changed()
        if self.ready() or self.finished():
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout)

    def take(self, max_bytes: int) -> list[bytes]:
        lines, self.after = self.log.read(self.after, max_bytes)
        return lines


class RunEventsHandler(_RunRoute):
    """GET: the run's events after ``after`` (a sequence number; 0: all), exactly once and in order,
    then the live ones, as NDJSON; ends when the run has ended and everything was sent, or after
    ``timeout`` seconds (default 300; reconnect with the last ``seq`` seen)."""

    route_name = "run_events"

    @web.authenticated
    @authorized("read")
    async def get(self, run_id: str) -> None:
        raw = self.get_query_argument("after", "0")
        try:
            after = int(raw)
        except ValueError:
            raise BadRequest(
                f"'after' must be an event's sequence number (an integer from 0), got {raw[:40]!r}"
            ) from None
        if after < 0:
            raise BadRequest(f"'after' must be an event's sequence number (an integer from 0), got {after}")
        timeout = self._seconds("timeout", DEFAULT_EVENTS_TIMEOUT, MAX_EVENTS_TIMEOUT)
        run = self.runs.get(run_id, self.viewer)
        if run.log is None:
            raise AgentToolsError(
                f"The events of run {run.id} are gone: it ran in a server process that stopped (state "
                f"{run.state!r}); only its record was kept",
                410,
            )
        await self._stream(run, _Cursor(run.log, after), timeout)

    async def _stream(self, run: Run, cursor: _Cursor, timeout: float) -> None:
        app = self.app
        writer = NdjsonWriter(self)
        started = time.monotonic()
        try:
            await writer.send(b"")  # the headers now: a reader sees the stream open at once
            beats = pump(cursor, float(app.stream_heartbeat_interval), deadline=started + timeout)
            async with contextlib.aclosing(beats):
                async for due in beats:
                    if due:
                        data = b"".join(cursor.take(WRITE_CHARS))
                    else:
                        elapsed = int((time.monotonic() - started) * 1000)
                        data = ndjson_line({"type": "heartbeat", "elapsed_ms": elapsed})
                    await writer.send(data)  # waits while the client reads slowly: nothing piles up here
                    del data
        except StreamClosedError:
            return
        if not response_finished(self):
            self.finish()
