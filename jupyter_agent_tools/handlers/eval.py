"""``/api/agent/eval``: run Python cells; one JSON answer or an NDJSON stream of events."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.iostream import StreamClosedError

from ..errors import AgentToolsError
from ..eval.service import EvalService
from .base import AgentAPIHandler

NDJSON = "application/x-ndjson"
Emit = Callable[[dict[str, Any]], None]


def _ignore(_: dict[str, Any]) -> None:
    return None


def coalesce(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge consecutive ``chunk`` events of the same cell and stream into one (fewer, larger lines when
    the client reads slower than the kernel prints; the text is unchanged)."""
    merged: list[dict[str, Any]] = []
    for event in events:
        last = merged[-1] if merged else None
        if (
            last is not None
            and event.get("type") == "chunk"
            and last.get("type") == "chunk"
            and last.get("index") == event.get("index")
            and last.get("name") == event.get("name")
        ):
            merged[-1] = {**last, "text": last["text"] + event["text"]}
        else:
            merged.append(event)
    return merged


class EvalHandler(AgentAPIHandler):
    """POST runs cells (``execute`` on ``kernels``). A client that disconnects cancels the run."""

    auth_resource = "kernels"
    _cancel: asyncio.Event | None = None

    @property
    def service(self) -> EvalService:
        return self.extensionapp.eval_service  # type: ignore[attr-defined]

    def on_connection_close(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
        super().on_connection_close()

    def _call(self, body: Any, emit: Emit, cancel: asyncio.Event) -> Awaitable[dict[str, Any]]:
        """The service call this route streams (an eval; a notebook run in the subclass)."""
        return self.service.run(body, emit=emit, cancel=cancel)

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        await self._respond(await self.json_body())

    async def _respond(self, body: Any) -> None:
        """One JSON answer, or the NDJSON stream of events when the client accepts it."""
        self._cancel = cancel = asyncio.Event()
        if NDJSON in self.request.headers.get("Accept", ""):
            await self._stream(body)
        else:
            self.write_json(await self._call(body, _ignore, cancel))

    async def _stream(self, body: Any) -> None:
        events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        run = asyncio.ensure_future(self._call(body, events.put_nowait, self._cancel or asyncio.Event()))
        interval = float(self.extensionapp.stream_heartbeat_interval)  # type: ignore[attr-defined]
        started_at = last_sent = time.monotonic()
        streaming = False
        try:
            while not (run.done() and events.empty()):
                getter = asyncio.ensure_future(events.get())
                done, _ = await asyncio.wait(
                    {getter, run},
                    timeout=max(0.05, interval - (time.monotonic() - last_sent)),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                batch: list[dict[str, Any]] = []
                if getter in done:
                    batch.append(getter.result())
                else:
                    getter.cancel()
                while not events.empty():
                    batch.append(events.get_nowait())
                if not batch:
                    if run.done():
                        continue
                    if time.monotonic() - last_sent < interval:
                        continue
                    batch = [{"type": "heartbeat", "elapsed_ms": int((time.monotonic() - started_at) * 1000)}]
                if not streaming:
                    streaming = True
                    self.set_status(200)
                    self.set_header("Content-Type", NDJSON)
                    self.set_header("Cache-Control", "no-cache")
                    self.set_header("X-Accel-Buffering", "no")
                self.write("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in coalesce(batch)))
                await self.flush()
                last_sent = time.monotonic()
            run.result()  # raise the service's error, if any
        except StreamClosedError:
            if self._cancel is not None:
                self._cancel.set()
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
            self.write(json.dumps({"type": "error", "status": status, "message": message}) + "\n")
        finally:
            if not run.done():
                if self._cancel is not None:
                    self._cancel.set()
                await asyncio.gather(run, return_exceptions=True)
        if not self._finished:
            self.finish()
