"""The open websockets of each agent token, muted and closed once the token is no longer active.

A websocket (a kernel's channels, a terminal, the event feed, a collaboration room) outlives the request
that authenticated it: revoking the token would not stop it. :class:`~.identity.AgentIdentityProvider`
adds every websocket an agent token opens here (one owner: this table) and calls :meth:`end` when the
token ends (revoked, expired: its ``token_ended`` signal). Another module that keeps its own websockets
needs nothing more: they are closed through Tornado's ``WebSocketHandler.close``, which runs their
``on_close``.

Closing is not enough: Tornado's ``close`` sends a close frame and goes on delivering what the client
sends until the client answers it (or 5 s pass), and a kernel's websocket forwards each message to the
kernel. So an ended token's websockets are *muted* first: what they receive from then on is dropped
before any handler sees it (the kernel gets nothing), whether the client reads the close frame or not.
"""

from __future__ import annotations

import logging
import weakref

from tornado.websocket import WebSocketHandler

from ..compat import mute_websocket

log = logging.getLogger(__name__)

# The close code sent to the client (RFC 6455 1008: policy violation) and why.
CLOSE_CODE = 1008


class AgentConnections:
    """Websockets by agent token (its hash)."""

    def __init__(self) -> None:
        self._open: dict[str, weakref.WeakSet[WebSocketHandler]] = {}
        # websockets of ended tokens whose handshake had not completed: closed once it has (close_late)
        self._late: weakref.WeakSet[WebSocketHandler] = weakref.WeakSet()
        self._reasons: weakref.WeakKeyDictionary[WebSocketHandler, str] = weakref.WeakKeyDictionary()

    def add(self, token_hash: str, handler: object) -> None:
        """Track ``handler`` when it is a websocket (other requests end with their answer)."""
        if isinstance(handler, WebSocketHandler):
            self._open.setdefault(token_hash, weakref.WeakSet()).add(handler)

    @property
    def has_late(self) -> bool:
        """Whether a websocket of an ended token still waits for its handshake to be closed."""
        return len(self._late) > 0

    def end(self, token_hash: str, status: str) -> int:
        """The token is ``status`` (revoked, expired): mute its websockets at once and close them (those
        still in their handshake once it completes); how many were open."""
        reason = f"the agent token was {status}"
        closed = 0
        for handler in list(self._open.pop(token_hash, ())):
            mute_websocket(handler)
            if handler.ws_connection is not None:
                closed += 1
                handler.close(CLOSE_CODE, reason)
            else:  # its handshake may still complete: close_late closes it then
                self._late.add(handler)
                self._reasons[handler] = reason
        if closed:
            log.info("closed %d websocket(s) of an agent token that was %s", closed, status)
        return closed

    def close_late(self) -> int:
        """Close the websockets of ended tokens whose handshake completed since; how many."""
        closed = 0
        for handler in list(self._late):
            if handler.ws_connection is not None:
                closed += 1
                handler.close(CLOSE_CODE, self._reasons.get(handler, "the agent token ended"))
                self._late.discard(handler)
        return closed
