"""The open websockets of each agent token, closed once the token is no longer active.

A websocket (a kernel's channels, a terminal, the event feed, a collaboration room) outlives the request
that authenticated it: revoking the token would not stop it. :class:`~.identity.AgentIdentityProvider`
adds every websocket an agent token opens here (one owner: this table); a revocation closes the token's
websockets at once, and a sweep while any is open closes those of tokens that expired or were revoked by
another process sharing the token database. Another module that keeps its own websockets needs nothing
more: they are closed through Tornado's ``WebSocketHandler.close``, which runs their ``on_close``.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

from tornado.ioloop import PeriodicCallback
from tornado.websocket import WebSocketHandler

log = logging.getLogger(__name__)

# The close code sent to the client (RFC 6455 1008: policy violation) and why.
CLOSE_CODE = 1008


class AgentConnections:
    """Websockets by agent token (its hash). ``status(token_hash)`` says whether a token is still
    ``"active"`` (anything else closes its websockets); ``interval`` is the sweep's period in seconds."""

    def __init__(self, status: Callable[[str], str], interval: float):
        self._status = status
        self._interval = interval
        self._open: dict[str, weakref.WeakSet[WebSocketHandler]] = {}
        self._sweep: PeriodicCallback | None = None

    def add(self, token_hash: str, handler: object) -> None:
        """Track ``handler`` when it is a websocket (other requests end with their answer)."""
        if not isinstance(handler, WebSocketHandler):
            return
        self._open.setdefault(token_hash, weakref.WeakSet()).add(handler)
        if self._sweep is None:
            self._sweep = PeriodicCallback(self._check, self._interval * 1000)
            self._sweep.start()

    def open_count(self, token_hash: str) -> int:
        """How many of the token's websockets are open now."""
        return sum(1 for h in self._open.get(token_hash, ()) if h.ws_connection is not None)

    def _check(self) -> None:
        self.close_inactive()

    def close_inactive(self) -> int:
        """Close the websockets of every token that is no longer active; how many were open."""
        closed = 0
        for token_hash in list(self._open):
            try:
                status = self._status(token_hash)
            except Exception as e:  # the token database cannot be read now: the next sweep tries again
                log.warning("agent tokens' websockets not checked: %s", e)
                return closed
            if status == "active":
                continue
            waiting: weakref.WeakSet[WebSocketHandler] = weakref.WeakSet()
            for handler in list(self._open[token_hash]):
                if handler.ws_connection is not None:
                    closed += 1
                    handler.close(CLOSE_CODE, f"the agent token was {status}")
                else:  # its handshake may still complete: the next sweep closes it then
                    waiting.add(handler)
            self._open[token_hash] = waiting
        self._open = {h: s for h, s in self._open.items() if len(s)}
        if not self._open and self._sweep is not None:
            self._sweep.stop()
            self._sweep = None
        if closed:
            log.info("closed %d websocket(s) of agent tokens no longer active", closed)
        return closed
