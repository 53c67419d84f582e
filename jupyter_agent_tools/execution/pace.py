"""A bounded wait for a stream client that fell behind, so a short lag is absorbed instead of skipped.

An NDJSON stream holds at most ``stream_backlog_bytes`` of text for its client; text past that becomes a
``gap`` event (the artifact keeps it). A client that reads as fast as it can still falls behind for a
moment now and then (the kernel, the server and the client share the CPUs). While it does, the executor
may stop taking kernel messages for up to ``stream_lag_grace`` seconds, as long as the kernel
connection's own buffer is less than half full and takes every message that comes (they wait there,
bounded as always, and the kernel is never held up): when the client catches up, nothing was skipped.
A client that stays behind costs one such wait per time it caught up, then gets ``gap`` events as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


class StreamPace:
    """The executor's view of one stream client: whether to wait for it, and the wait itself (``grace``:
    the value of ``AgentToolsApp.stream_lag_grace``)."""

    def __init__(self, lagging: Callable[[], bool], grace: float) -> None:
        self._lagging = lagging
        self.grace = grace
        self._waited = 0.0  # seconds waited since the client last caught up
        self._progress = asyncio.Event()

    def should_wait(self, messages: Any) -> bool:
        """Whether to wait before taking the next kernel message from ``messages`` (a connection's queue):
        the client lags, this lag's grace is not used up, and the queue is less than half full
        with no message waiting for room in it (the kernel is never held up by a wait)."""
        budget = int(getattr(messages, "budget", 0))  # byte-bounded (local kernels); never unbounded
        held = int(getattr(messages, "bytes", budget))
        if not budget or getattr(messages, "waiting", True) or held * 2 >= budget:
            return False
        return self._waited < self.grace and self._lagging()

    async def wait(self, timeout: float) -> None:
        """Wait until the client makes progress, at most ``timeout`` and what is left of the grace."""
        self._progress.clear()
        started = time.monotonic()
        try:
            await asyncio.wait_for(self._progress.wait(), max(0.0, min(timeout, self.grace - self._waited)))
        except asyncio.TimeoutError:
            pass
        finally:
            self._waited += time.monotonic() - started

    def progressed(self) -> None:
        """The client took text; once it no longer lags, the next lag has the whole grace again."""
        if not self._lagging():
            self._waited = 0.0
        self._progress.set()
