"""One wait-for-output / heartbeat loop for every stream the extension sends (pure: no Tornado).

An attached eval or notebook run streamed as NDJSON, an MCP tool call streamed as SSE, and the events
of a detached run (``GET /api/agent/runs/{id}/events``) all do the same thing: send what is ready as
soon as it is ready, a heartbeat after each silent ``heartbeat_interval``, and stop when the source is
finished and drained. :func:`pump` is that loop; each front door takes what is ready in its own form
(a backlog's events, coalesced progress text, lines of a run's event log) and writes it its own way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol


class Source(Protocol):
    """What a stream sends from."""

    def ready(self) -> bool:
        """Whether something can be taken now."""
        ...

    def finished(self) -> bool:
        """Whether nothing more will come once what is ready was taken."""
        ...

    async def wait(self, timeout: float) -> None:
        """Return when something is ready or the source is finished, or after ``timeout`` seconds."""
        ...


async def pump(
    source: Source, heartbeat_interval: float, *, deadline: float | None = None
) -> AsyncGenerator[bool, None]:
    """Yield True when the consumer should take what is ready, False when a heartbeat is due.

    Ends when the source is finished and nothing is ready, or at ``deadline`` (``time.monotonic()``).
    Everything the consumer does between two items (taking, writing, flushing) counts as sending: the
    heartbeat interval starts again after it.
    """
    interval = max(0.05, heartbeat_interval)
    last = time.monotonic()
    while True:
        if source.ready():
            yield True
            last = time.monotonic()
            continue
        if source.finished():
            return
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return
        wait = interval - (now - last)
        if wait <= 0:
            yield False
            last = time.monotonic()
            continue
        if deadline is not None:
            wait = min(wait, deadline - now)
        await source.wait(wait)


class TaskSource:
    """A running call (``task``) whose output gathers somewhere (``pending`` says whether any waits);
    whoever adds output sets ``signal``."""

    def __init__(self, task: asyncio.Future[Any], pending: Callable[[], bool], signal: asyncio.Event):
        self.task = task
        self._pending = pending
        self.signal = signal

    def ready(self) -> bool:
        return self._pending()

    def finished(self) -> bool:
        return self.task.done()

    async def wait(self, timeout: float) -> None:
        self.signal.clear()
        if self._pending() or self.task.done():
            return
        waiter = asyncio.ensure_future(self.signal.wait())
        try:
            await asyncio.wait({waiter, self.task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
