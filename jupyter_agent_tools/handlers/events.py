"""``/api/events/subscribe``: jupyter_server's event websocket, filtered for agents and bounded.

The same URL and messages as jupyter_server's ``SubscribeWebsocket`` (JupyterLab's
``serviceManager.events`` and the Agents panel read it unchanged), served by a subclass of it. Two
differences (:mod:`jupyter_agent_tools.audit.feed`): an agent token receives only the events about itself
and the notebooks inside its paths; and each subscriber's events wait in a bounded queue written by one
task that awaits every write (jupyter_server writes without awaiting: a subscriber that never read kept
every event in server memory, and closing it logged one unretrieved exception per event). A subscriber
whose queue is full is closed with code 1008 and a reason saying so.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

from jupyter_server.services.events.handlers import SubscribeWebsocket
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError

from ..audit.feed import EventFeed, Subscriber
from ..auth.identity import AgentUser

EXTENSION = "jupyter_agent_tools"  # the settings key of the extension's app (ExtensionApp's own name)
TOO_SLOW = 1008  # policy violation: the subscriber did not read what it subscribed to


class EventFeedWebsocket(SubscribeWebsocket):
    """jupyter_server's event websocket, each subscriber filtered (agents) and bounded."""

    _subscriber: Subscriber | None = None
    _writer: asyncio.Task[None] | None = None
    _stopped = False

    @property
    def feed(self) -> EventFeed:
        return self.settings[EXTENSION].event_feed

    def open(self, *args: Any, **kwargs: Any) -> None:
        user = self.current_user
        if isinstance(user, AgentUser):
            root = getattr(self.contents_manager, "root_dir", None)
            self._subscriber = Subscriber(user.username, user.path_scope, root)
        self._pending: deque[str] = deque()
        self._pending_bytes = 0
        self._wake = asyncio.Event()
        self._writer = asyncio.ensure_future(self._write_pending())
        super().open()

    async def event_listener(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        if self._stopped or not self.feed.receives(self._subscriber, schema_id, data):
            return
        message = json.dumps({"schema_id": schema_id, **data})
        if self._pending_bytes + len(message) > self.feed.max_pending_bytes:
            self._too_slow()
            return
        self._pending.append(message)
        self._pending_bytes += len(message)
        self._wake.set()

    async def _write_pending(self) -> None:
        """Send the queued events one at a time, each write awaited (until it left for the socket)."""
        try:
            while not self._stopped:
                if not self._pending:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                message = self._pending.popleft()
                self._pending_bytes -= len(message)
                await self.write_message(message)
        except (WebSocketClosedError, StreamClosedError):
            self._stop()

    def _too_slow(self) -> None:
        waiting = self._pending_bytes
        self._stop()
        self.log.warning(
            "closing an event subscriber (%s) that does not read: %d bytes of events waiting "
            "(EventFeed.max_pending_bytes=%d)",
            self._subscriber.user if self._subscriber else "not an agent",
            waiting,
            self.feed.max_pending_bytes,
        )
        reason = f"events not read: {waiting} bytes waiting (EventFeed.max_pending_bytes); reconnect"
        self.close(TOO_SLOW, reason[:120])

    def _stop(self) -> None:
        """No more events for this subscriber: off the logger, queue dropped, writer ends."""
        if self._stopped:
            return
        self._stopped = True
        self.event_logger.remove_listener(listener=self.event_listener)
        self._pending.clear()
        self._pending_bytes = 0
        self._wake.set()

    def on_close(self) -> None:
        if self._writer is None:  # closed before it opened
            super().on_close()
            return
        self._stop()


HANDLERS = [(r"/api/events/subscribe", EventFeedWebsocket)]
